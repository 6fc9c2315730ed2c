//! Seed 000 Table 2 (Scenario A): services that need client affinity. Three client hosts, only
//! full handshakes, a 5,120-byte response, two servers. The L4 balancer hashing client
//! addresses (LB-IP) puts two hosts on one server; the single TLS proxy (Pound) does all TLS
//! alone; CSSL-SF spreads full handshakes by load and migrates each session to the client's home
//! agent. Paper (requests/s): LB-IP 179.5, Pound-IP 108.2, CSSL-SF disabled 184.7, enabled 223.4,
//! one Apache/mod_ssl server 100.5.

use baton_bench::BenchArgs;

use super::policies::{self, Config};
use crate::cluster::Store;
use crate::pki::KeyKind;
use crate::rig::{Backend, Lab, Sut};
use crate::table::Table;

const PAPER_SINGLE: f64 = 100.5;
/// The paper used 1,024-bit RSA; rustls will not sign with it, so both servers get RSA 2048.
const KEY: KeyKind = KeyKind::Rsa(2048);
const BODY: usize = 5120;

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let www = lab.dir.join("www");
    crate::rig::nginx::write_bodies(&www, &[BODY])?;
    let (n, per_host) = if lab.quick { (450, 10) } else { (2100, 10) };
    // with RTT every connection waits on the wire: more clients keep the servers busy
    let per_host = if lab.rtt.is_some() {
        per_host * 3
    } else {
        per_host
    };
    let w = www.clone();
    let w2 = www.clone();
    let w3 = www.clone();
    let w4 = www.clone();
    let configs = vec![
        Config {
            name: "LB-IP",
            server: "nginx",
            paper_tps: Some(179.5),
            single: false,
            build: Box::new(move |l| {
                Sut::haproxy(l, "lb-ip-nginx", "source", 2, Backend::Nginx, KEY, &w)
            }),
        },
        Config {
            name: "LB-IP",
            server: "baton",
            paper_tps: Some(179.5),
            single: false,
            build: Box::new(move |l| {
                Sut::haproxy(l, "lb-ip-baton", "source", 2, Backend::Baton, KEY, &w2)
            }),
        },
        Config {
            name: "TLS proxy (IP hash)",
            server: "nginx",
            paper_tps: Some(108.2),
            single: false,
            build: Box::new(move |l| Sut::nginx_tls_proxy(l, "tls-proxy-ip", 2, true, KEY, &w3)),
        },
        Config {
            name: "CSSL-SF disabled (client-ip)",
            server: "baton",
            paper_tps: Some(184.7),
            single: false,
            build: Box::new(|l| {
                Sut::baton_cluster(l, "cssl-sf-off", 2, "client-ip", Store::Memory, KEY, &[])
            }),
        },
        Config {
            name: "CSSL-SF enabled (handoff)",
            server: "baton",
            paper_tps: Some(223.4),
            single: false,
            build: Box::new(|l| {
                Sut::baton_cluster(l, "cssl-sf-on", 2, "handoff", Store::Memory, KEY, &[])
            }),
        },
        Config {
            name: "1 server",
            server: "nginx",
            paper_tps: Some(PAPER_SINGLE),
            single: true,
            build: Box::new(move |l| {
                Sut::nginx_servers(l, "single-nginx", 1, KEY, &w4, None, None)
            }),
        },
        Config {
            name: "1 server",
            server: "baton",
            paper_tps: Some(PAPER_SINGLE),
            single: true,
            build: Box::new(|l| Sut::baton_single(l, "single-baton", KEY, &[])),
        },
    ];
    let mut t = Table::new(
        "scenario-a",
        format!("seed 000 Table 2: 3 client hosts, {n} full handshakes, {BODY}-byte response, 2 servers ({})", KEY.name()),
    )
    .column("config", "config")
    .column("server", "server")
    .column("tps", "TPS")
    .column("failed", "failed")
    .column("per_server_handshakes", "full per server")
    .column("spread_percent", "spread %")
    .column("server_cpu_ms_per_tx", "srv CPU ms/tx")
    .column("ratio_to_single", "x single")
    .column("paper_tps", "paper")
    .column("paper_ratio", "paper x single");
    t.chart = Some("tps".into());
    let bench = || BenchArgs {
        url: Some(format!("https://{{addr}}/bytes/{BODY}")),
        connections: Some(n),
        clients: Some(per_host * 3),
        resume: Some("none".into()),
        source_ip: super::hosts(3),
        timeout: Some("10s".into()),
        ..Default::default()
    };
    let runs = policies::compare(lab, &mut t, configs, &bench)?;
    for (c, r, ev) in &runs {
        let single = policies::single_tps(&runs, c.server);
        t.push(policies::row(c, r, ev, single, PAPER_SINGLE));
    }
    let named: Vec<(String, &crate::rig::Run)> = runs
        .iter()
        .map(|(c, r, _)| (format!("{} ({})", c.name, c.server), r))
        .collect();
    let refs: Vec<(&str, &crate::rig::Run)> = named.iter().map(|(n, r)| (n.as_str(), *r)).collect();
    super::run_notes(&mut t, lab, &refs);
    t.note("HAProxy and the Baton dispatcher are not capped (the paper's balancers were their own machines); the TLS proxy is capped like one server and its plain backends like the others");
    t.note("full per server: full handshakes each TLS server counted itself (agents' metrics, nginx access logs); for CSSL-SF enabled, handshakes are spread by load and sessions migrate to the client's home agent");
    Ok(t)
}
