//! Seed 000 Table 3 (Scenario B): no affinity needed. Two client hosts, 3,000 connections of
//! which 1,000 full and 2,000 resumption attempts (each client reconnects: 1 full : 2 resumed),
//! a 1,024-byte response, two servers. Round robin without shared sessions (LB-RR) turns many
//! resumptions into full handshakes; CSSL-SL shares sessions and ticket keys between agents so
//! any agent resumes any client. Paper (requests/s): LB-RR 441.2, Pound-RR 142.3, CSSL-SL
//! disabled 389.6, enabled 638.3, one server 319.1; full handshakes of 3,000: LB-RR 1,893,
//! CSSL-SL enabled 1,124, disabled 2,883.

use baton_bench::BenchArgs;
use serde_json::json;

use super::policies::{self, Config};
use crate::cluster::Store;
use crate::pki::KeyKind;
use crate::rig::{Backend, Lab, Sut};
use crate::table::Table;

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
    let www = lab.dir.join("www");
    crate::rig::nginx::write_bodies(&www, &[BODY])?;
    let (n, per_host) = if lab.quick { (600, 10) } else { (3000, 10) };
    let per_host = if lab.rtt.is_some() {
        per_host * 3
    } else {
        per_host
    };
    let (w, w2, w3) = (www.clone(), www.clone(), www.clone());
    let configs = vec![
        Config {
            name: "LB-RR",
            server: "nginx",
            paper_tps: Some(441.2),
            single: false,
            build: Box::new(move |l| {
                Sut::haproxy(l, "lb-rr-nginx", "roundrobin", 2, Backend::Nginx, KEY, &w)
            }),
        },
        Config {
            name: "LB-RR",
            server: "baton",
            paper_tps: Some(441.2),
            single: false,
            build: Box::new(move |l| {
                Sut::haproxy(l, "lb-rr-baton", "roundrobin", 2, Backend::Baton, KEY, &w2)
            }),
        },
        Config {
            name: "TLS proxy (RR)",
            server: "nginx",
            paper_tps: Some(142.3),
            single: false,
            build: Box::new(move |l| Sut::nginx_tls_proxy(l, "tls-proxy-rr", 2, false, KEY, &w3)),
        },
        Config {
            name: "CSSL-SL disabled (memory)",
            server: "baton",
            paper_tps: Some(389.6),
            single: false,
            build: Box::new(|l| {
                Sut::baton_cluster(l, "cssl-sl-off", 2, "round-robin", Store::Memory, KEY, &[])
            }),
        },
        Config {
            name: "CSSL-SL enabled (peers)",
            server: "baton",
            paper_tps: Some(638.3),
            single: false,
            build: Box::new(|l| {
                Sut::baton_cluster(l, "cssl-sl-on", 2, "round-robin", Store::Peers, KEY, &[])
            }),
        },
        Config {
            name: "1 server",
            server: "nginx",
            paper_tps: Some(PAPER_SINGLE),
            single: true,
            build: Box::new(move |l| {
                Sut::nginx_servers(l, "single-nginx-b", 1, KEY, &www, None, None)
            }),
        },
        Config {
            name: "1 server",
            server: "baton",
            paper_tps: Some(PAPER_SINGLE),
            single: true,
            build: Box::new(|l| Sut::baton_single(l, "single-baton-b", KEY, &[])),
        },
    ];
    let mut t = Table::new(
        "scenario-b",
        format!("seed 000 Table 3: 2 client hosts, {n} connections (1 full : 2 resumed per client), {BODY}-byte response, 2 servers ({})", KEY.name()),
    )
    .column("config", "config")
    .column("server", "server")
    .column("tps", "TPS")
    .column("failed", "failed")
    .column("full_handshakes", "full (servers)")
    .column("full_of_3000", "full per 3000")
    .column("paper_full", "paper full")
    .column("server_cpu_ms_per_tx", "srv CPU ms/tx")
    .column("ratio_to_single", "x single")
    .column("paper_tps", "paper")
    .column("paper_ratio", "paper x single");
    t.chart = Some("full_handshakes".into());
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
    for (c, r, ev) in &runs {
        let single = policies::single_tps(&runs, c.server);
        let mut row = policies::row(c, r, ev, single, PAPER_SINGLE);
        let full = r.server_full();
        row.insert("full_handshakes".into(), json!(full));
        row.insert(
            "full_of_3000".into(),
            json!(full as f64 * 3000.0 / n as f64),
        );
        row.insert("paper_full".into(), json!(paper_full(c.name)));
        t.push(row);
    }
    let named: Vec<(String, &crate::rig::Run)> = runs
        .iter()
        .map(|(c, r, _)| (format!("{} ({})", c.name, c.server), r))
        .collect();
    let refs: Vec<(&str, &crate::rig::Run)> = named.iter().map(|(n, r)| (n.as_str(), *r)).collect();
    super::run_notes(&mut t, lab, &refs);
    t.note(format!("ideal: {} full handshakes (each client's first connection of three); full (servers) is what the TLS servers counted", n / 3));
    t.note("TLS proxy rows: the proxy is the only TLS server, so its count is the system's");
    Ok(t)
}
