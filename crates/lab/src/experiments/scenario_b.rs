//! The CSSL paper, Table 3 (Scenario B): no affinity needed. Two client hosts, 3,000 connections of
//! which 1,000 full and 2,000 resumption attempts (each client reconnects: 1 full : 2 resumed),
//! a 1,024-byte response, two servers. Round robin without shared sessions (LB-RR) turns many
//! resumptions into full handshakes; CSSL-SL shares sessions and ticket keys between agents so
//! any agent resumes any client. Paper (requests/s): LB-RR 441.2, Pound-RR 142.3, CSSL-SL
//! disabled 389.6, enabled 638.3, one server 319.1; full handshakes of 3,000: LB-RR 1,893,
//! CSSL-SL enabled 1,124, disabled 2,883.

use baton_bench::BenchArgs;
use serde_json::json;

use super::policies::{self, Lineup};
use crate::rig::Lab;
use crate::table::{Chart, Table};
use baton_cluster::cluster::Store;
use baton_cluster::pki::KeyKind;

const PAPER_SINGLE: f64 = 319.1;
const KEY: KeyKind = KeyKind::Rsa(2048);
const BODY: usize = 1024;

/// The paper's full-handshake counts (of 3,000 connections) per configuration.
fn paper_full(name: &str) -> Option<f64> {
    match name {
        "LB-RR" => Some(1893.0),
        "CSSL-SL disabled (memory)" => Some(2883.0),
        "CSSL-SL enabled (peers)" => Some(1124.0),
        _ => None,
    }
}

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let key = lab.key.unwrap_or(KEY);
    let www = lab.dir.join("www");
    crate::rig::nginx::write_bodies(&www, &[BODY])?;
    let n = if lab.quick { 600 } else { 3000 };
    let per_host = if lab.rtt.is_some() { 30 } else { 10 };
    let lineup = Lineup {
        slug: "b",
        balance: ("roundrobin", "LB-RR"),
        proxy: ("TLS proxy (RR)", false),
        off: ("CSSL-SL disabled (memory)", "round-robin", Store::Memory),
        on: ("CSSL-SL enabled (peers)", "round-robin", Store::Peers),
        paper: [441.2, 142.3, 389.6, 638.3, PAPER_SINGLE],
        key,
        www,
    };
    let configs = if lab.hosts {
        lineup.across_hosts(2)
    } else {
        lineup.configs()
    };
    let mut t = policies::table(
        "scenario-b",
        format!(
            "the CSSL paper, Table 3: 2 client hosts, {n} connections (1 full : 2 resumed per client), {BODY}-byte response, 2 servers ({})",
            key.name()
        ) + if lab.hosts { ", across hosts (network namespaces on a bridge) beside loopback" } else { "" },
    )
    .column("full_handshakes", "full (servers)")
    .column("full_of_3000", "full per 3000")
    .column("paper_full", "paper full")
    .column("server_cpu_ms_per_tx", "srv CPU ms/tx")
    .column("balancer_cpu_ms_per_tx", "LB CPU ms/tx")
    .column("ratio_to_single", "x single")
    .column("paper_tps", "paper")
    .column("paper_ratio", "paper x single");
    if lab.hosts {
        t = t
            .column("net", "net")
            .column("dispatcher_cpu_us_per_conn", "disp CPU us/conn");
    }
    t.chart = Some(Chart::beside("full_of_3000", Some("paper_full")));
    let bench = || BenchArgs {
        url: Some(format!("https://{{addr}}/bytes/{BODY}")),
        connections: Some(n),
        clients: Some(per_host * 2),
        full_every: Some(3),
        source_ip: super::hosts(2),
        timeout: Some("10s".into()),
        ..Default::default()
    };
    let runs = policies::compare(lab, &mut t, configs, &bench)?;
    if lab.hosts {
        policies::hosts_notes(&mut t, &runs);
    }
    policies::finish(&mut t, lab, &runs, PAPER_SINGLE, |c, r| {
        let full = r.server_full();
        let mut m = serde_json::Map::new();
        m.insert("full_handshakes".into(), json!(full));
        m.insert(
            "full_of_3000".into(),
            json!(full as f64 * 3000.0 / n as f64),
        );
        m.insert("paper_full".into(), json!(paper_full(c.name)));
        m
    });
    t.note(format!("ideal: {} full handshakes (each client's first connection of three); full (servers) is what the TLS servers counted", n / 3));
    t.note("TLS proxy rows: the proxy is the only TLS server, so its count is the system's");
    t.note("HAProxy and the Baton dispatcher are not capped (the paper's balancers were their own machines); LB CPU ms/tx is what each used, not charged to the servers");
    Ok(t)
}
