//! `baton demo`: the README's main job. On embedded defaults (generated certificates, no
//! external server) it runs the CSSL paper's Scenario B on this machine — many clients, each
//! reconnecting with 1 full : 2 resumed handshakes, through a dispatcher in front of N agents —
//! for round robin without shared sessions (LB-RR), round robin with sessions shared between
//! agents (CSSL-SL) and session affinity, and prints the table side by side.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use baton_bench::BenchArgs;

use baton_cluster::cluster::{Cluster, ClusterSpec, Store};

/// `baton demo`: local clusters, each loaded by `baton bench`, compared in one table.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Agents per cluster.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub agents: usize,
    /// Connections per run.
    #[arg(short = 'n', long, default_value_t = 3000, value_name = "N")]
    pub connections: u64,
    /// Virtual clients per run.
    #[arg(short = 'c', long, default_value_t = 30, value_name = "C")]
    pub clients: usize,
    /// TLS version: 1.2 or 1.3.
    #[arg(long, default_value = "1.3", value_name = "V")]
    pub tls_version: String,
}

struct Row {
    name: &'static str,
    policy: &'static str,
    store: &'static str,
    full: u64,
    resumed: u64,
    failed: u64,
    tps: f64,
    p50: f64,
    p99: f64,
}

pub fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let baton = std::env::current_exe().context("locating the baton binary")?;
    let base = std::env::temp_dir().join(format!("baton-demo-{}", std::process::id()));
    let runs: [(&'static str, &'static str, Store, &'static str); 3] = [
        ("LB-RR (no sharing)", "round-robin", Store::Memory, "memory"),
        ("CSSL-SL (shared)", "round-robin", Store::Peers, "peers"),
        ("session affinity", "session", Store::Memory, "memory"),
    ];
    println!(
        "baton demo: {} agents behind a dispatcher; {} connections from {} clients, 1 full : 2 resumed, TLS {}",
        args.agents, args.connections, args.clients, args.tls_version
    );
    let mut rows = Vec::new();
    for (i, (name, policy, store, store_name)) in runs.into_iter().enumerate() {
        let cluster = Cluster::start(&ClusterSpec {
            baton: baton.clone(),
            dir: base.join(format!("run-{i}")),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            agents: args.agents,
            policy: policy.into(),
            store,
            key: baton_cluster::pki::KeyKind::EcdsaP256,
            agent_args: Vec::new(),
            dispatcher_args: Vec::new(),
            agent_caps: Vec::new(),
            topology: Default::default(),
        })?;
        // peers connect to each other right after start
        std::thread::sleep(Duration::from_millis(300));
        let cfg = BenchArgs {
            url: Some(format!("https://{}/", cluster.addr())),
            ca: Some(cluster.pki.ca.clone()),
            sni: Some("localhost".into()),
            connections: Some(args.connections),
            clients: Some(args.clients),
            full_every: Some(3),
            tls_version: Some(args.tls_version.clone()),
            quiet: true,
            ..Default::default()
        }
        .resolve()?;
        let report = baton_bench::execute(Arc::new(cfg))?;
        let total = &report.latency_ms["total"];
        rows.push(Row {
            name,
            policy,
            store: store_name,
            full: report.handshakes.full,
            resumed: report.handshakes.resumed,
            failed: report.handshakes.failed + report.requests.failed,
            tps: report.tps,
            p50: total.p50,
            p99: total.p99,
        });
        drop(cluster);
    }
    let _ = std::fs::remove_dir_all(&base);
    println!(
        "\n  {:<20} {:<12} {:<7} {:>6} {:>8} {:>7} {:>9} {:>9} {:>9}",
        "scenario", "policy", "store", "full", "resumed", "failed", "TPS", "p50 ms", "p99 ms"
    );
    for r in &rows {
        println!(
            "  {:<20} {:<12} {:<7} {:>6} {:>8} {:>7} {:>9.0} {:>9.2} {:>9.2}",
            r.name, r.policy, r.store, r.full, r.resumed, r.failed, r.tps, r.p50, r.p99
        );
    }
    let ideal = args.connections.div_ceil(3);
    println!(
        "\n  ideal: {ideal} full handshakes (each client's own); the CSSL paper's Scenario B measured LB-RR 1,893 and CSSL-SL 1,124 of 3,000."
    );
    Ok(())
}
