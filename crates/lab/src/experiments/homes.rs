//! Consistent homes: how many clients change home agent when one agent of N joins or
//! leaves, and how evenly the homes spread, with the rendezvous hashing the dispatcher uses
//! (`baton_ops::affinity`, keyed by agent id) beside the `hash % N` it replaced. The same pure
//! function every dispatcher runs, over a population of client addresses: no processes.

use std::net::IpAddr;

use crate::rig::Lab;
use crate::row;
use crate::table::{Chart, Table};

/// Homes of `clients` among agents `ids` (rendezvous) or `n` positions (modulo).
fn homes(clients: &[IpAddr], ids: &[u64]) -> Vec<u64> {
    clients
        .iter()
        .map(|c| {
            let at = baton_ops::affinity::best(*c, ids.iter().map(|id| (*id, true)));
            at.map_or(u64::MAX, |i| ids[i])
        })
        .collect()
}

/// What the dispatcher did before rendezvous hashing: the client's hash modulo N.
fn modulo_homes(clients: &[IpAddr], n: u64) -> Vec<u64> {
    clients
        .iter()
        .map(|c| baton_ops::affinity::client_hash(*c) % n)
        .collect()
}

fn moved(a: &[u64], b: &[u64]) -> f64 {
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count();
    100.0 * n as f64 / a.len() as f64
}

/// Largest and smallest agent load, percent of an even share.
fn spread(homes: &[u64], ids: &[u64]) -> (f64, f64) {
    let even = homes.len() as f64 / ids.len() as f64;
    let loads: Vec<f64> = ids
        .iter()
        .map(|id| homes.iter().filter(|h| *h == id).count() as f64 / even * 100.0)
        .collect();
    let max = loads.iter().copied().fold(f64::MIN, f64::max);
    let min = loads.iter().copied().fold(f64::MAX, f64::min);
    (max, min)
}

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let population: u32 = if lab.quick { 20_000 } else { 200_000 };
    // clients spread over 10.0.0.0/8, neighbours included (what real address blocks look like)
    let clients: Vec<IpAddr> = (0..population)
        .map(|i| IpAddr::from((0x0a00_0000u32 | i.wrapping_mul(2_654_435_761) >> 8).to_be_bytes()))
        .collect();
    let mut t = Table::new(
        "homes",
        format!("consistent homes: clients ({population} addresses) whose home changes when one agent of N joins or leaves, and the spread of homes"),
    )
    .column("agents", "N")
    .column("event", "event")
    .column("moved_percent", "moved %")
    .column("ideal_percent", "ideal %")
    .column("modulo_moved_percent", "hash % N moved %")
    .column("max_load_percent", "max load % of even")
    .column("min_load_percent", "min load % of even");
    t.chart = Some(Chart::lines("agents", "moved_percent", &["event"], false));
    for n in [3u64, 5, 8] {
        // ids as an operator might give them: not 0..N, and the newcomer's not next in line
        let ids: Vec<u64> = (0..n).map(|i| 10 + 7 * i).collect();
        let before = homes(&clients, &ids);
        let (max, min) = spread(&before, &ids);
        let mut joined = ids.clone();
        joined.push(1000);
        let after_join = homes(&clients, &joined);
        t.push(row![
            ("agents", n),
            ("event", "join"),
            ("moved_percent", moved(&before, &after_join)),
            ("ideal_percent", 100.0 / (n + 1) as f64),
            (
                "modulo_moved_percent",
                moved(&modulo_homes(&clients, n), &modulo_homes(&clients, n + 1))
            ),
            ("max_load_percent", max),
            ("min_load_percent", min),
        ]);
        let mut left = ids.clone();
        left.remove(1);
        let after_leave = homes(&clients, &left);
        t.push(row![
            ("agents", n),
            ("event", "leave"),
            ("moved_percent", moved(&before, &after_leave)),
            ("ideal_percent", 100.0 / n as f64),
            (
                "modulo_moved_percent",
                moved(&modulo_homes(&clients, n), &modulo_homes(&clients, n - 1))
            ),
        ]);
        let ideal_join = 100.0 / (n + 1) as f64;
        let got = moved(&before, &after_join);
        if (got - ideal_join).abs() > ideal_join * 0.1 {
            t.failed.push(format!(
                "{n} agents, join: {got:.1}% moved, ideal {ideal_join:.1}%"
            ));
        }
        if max > 105.0 || min < 95.0 {
            t.failed
                .push(format!("{n} agents: loads {min:.1}-{max:.1}% of even"));
        }
    }
    t.note("moved: clients whose home agent differs after the change; ideal: 1/(N+1) for a join (the newcomer's share), 1/N for a leave (the leaver's clients)");
    t.note("rendezvous hashing (baton_ops::affinity) keyed by agent id, as the dispatcher routes; hash % N: FNV-1a modulo the agent count, as it routed before");
    Ok(t)
}
