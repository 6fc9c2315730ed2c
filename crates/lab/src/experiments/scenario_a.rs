//! The CSSL paper, Table 2 (Scenario A): services that need client affinity. Three client hosts, only
//! full handshakes, a 5,120-byte response, two servers. The L4 balancer hashing client
//! addresses (LB-IP) puts two hosts on one server; the single TLS proxy (Pound) does all TLS
//! alone; CSSL-SF spreads full handshakes by load and migrates each session to the client's home
//! agent. Paper (requests/s): LB-IP 179.5, Pound-IP 108.2, CSSL-SF disabled 184.7, enabled 223.4,
//! one Apache/mod_ssl server 100.5.

use baton_bench::BenchArgs;

use super::policies::{self, Lineup};
use crate::rig::Lab;
use crate::table::{Chart, Table};
use baton_cluster::cluster::Store;
use baton_cluster::pki::KeyKind;

const PAPER_SINGLE: f64 = 100.5;
/// The paper used 1,024-bit RSA; rustls will not sign with it, so both servers get RSA 2048
/// (`--key` picks another).
const KEY: KeyKind = KeyKind::Rsa(2048);
const BODY: usize = 5120;

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let key = lab.key.unwrap_or(KEY);
    let www = lab.dir.join("www");
    crate::rig::nginx::write_bodies(&www, &[BODY])?;
    // quick: 900, not fewer. At 450 (about 2 s a run, 20 throttling periods of a capped
    // agent) the handoff agents' shares had not settled: 0-12% apart over 11 runs here, 10.7%
    // once in CI; at 900 they were 0-2% apart over 6.
    let n = if lab.quick { 900 } else { 2100 };
    // with RTT every connection waits on the wire: more clients keep the servers busy
    let per_host = if lab.rtt.is_some() { 30 } else { 10 };
    let lineup = Lineup {
        slug: "a",
        balance: ("source", "LB-IP"),
        proxy: ("TLS proxy (IP hash)", true),
        off: ("CSSL-SF disabled (client-ip)", "client-ip", Store::Memory),
        on: ("CSSL-SF enabled (handoff)", "handoff", Store::Memory),
        paper: [179.5, 108.2, 184.7, 223.4, PAPER_SINGLE],
        key,
        www,
    };
    let configs = if lab.hosts {
        lineup.across_hosts(3)
    } else {
        lineup.configs()
    };
    let mut t = policies::table(
        "scenario-a",
        format!(
            "the CSSL paper, Table 2: 3 client hosts, {n} full handshakes, {BODY}-byte response, 2 servers ({})",
            key.name()
        ) + if lab.hosts { ", across hosts (network namespaces on a bridge) beside loopback" } else { "" },
    )
    .column("per_server_handshakes", "full per server")
    .column("spread_percent", "spread %")
    .column("migrated", "migrated")
    .column("handoff_failures", "handoff failed")
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
    t.chart = Some(Chart::beside("ratio_to_single", Some("paper_ratio")));
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
    if lab.hosts {
        policies::hosts_notes(&mut t, &runs);
    }
    policies::finish(&mut t, lab, &runs, PAPER_SINGLE, |_, _| Default::default());
    t.note("HAProxy and the Baton dispatcher are not capped (the paper's balancers were their own machines); LB CPU ms/tx is what each used, not charged to the servers; the TLS proxy is capped like one server and its plain backends like the others");
    t.note("full per server: full handshakes each TLS server counted itself (agents' metrics, nginx access logs); for CSSL-SF enabled, handshakes are spread by load and sessions migrate to the client's home agent");
    t.note("migrated / handoff failed: sessions the agents handed off and migrations that failed or fell back, from the agents' own counters; the CSSL-SF enabled row fails when nothing migrated or anything fell back");
    policies::check_handoff(&mut t, &runs);
    Ok(t)
}
