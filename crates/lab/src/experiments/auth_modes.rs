//! The SSL benchmark tool paper, experiment A: server authentication vs mutual (client certificate) authentication,
//! new connections only, 1 vs 2 servers, time to complete N connections fetching a 5 KB page.
//! Paper, 5,000 connections (RSA 1024, 3DES/RC4): one server 31 s (server auth) vs 46 s
//! (mutual); two servers 16 s vs 29 s.

use baton_bench::BenchArgs;
use serde_json::json;

use crate::rig::{Lab, Run, Sut};
use crate::row;
use crate::table::{ratio, Chart, Table};
use baton_cluster::cluster::Store;
use baton_cluster::pki::{self, KeyKind};

const KEY: KeyKind = KeyKind::Rsa(2048);
const BODY: usize = 5120;

/// The paper's seconds for 5,000 connections: (servers, mutual) -> s.
fn paper_seconds(servers: usize, mutual: bool) -> f64 {
    match (servers, mutual) {
        (1, false) => 31.0,
        (1, true) => 46.0,
        (_, false) => 16.0,
        (_, true) => 29.0,
    }
}

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let counts: &[u64] = if lab.quick {
        &[200, 400]
    } else {
        &[1000, 2000, 3000, 4000, 5000]
    };
    let client = pki::generate_client(&lab.dir.join("client-pki"))?;
    let mut t = Table::new(
        "auth-modes",
        format!("the SSL benchmark tool paper, experiment A: server vs mutual authentication, new connections, {BODY}-byte page, baton agents ({}), 2 servers behind baton dispatch round-robin", KEY.name()),
    )
    .column("servers", "servers")
    .column("auth", "auth")
    .column("connections", "connections")
    .column("seconds", "seconds")
    .column("tps", "TPS")
    .column("failed", "failed")
    .column("server_cpu_ms_per_tx", "srv CPU ms/tx")
    .column("mutual_over_server", "mutual / server")
    .column("paper_seconds_5000", "paper s @5000")
    .column("paper_mutual_over_server", "paper mutual / server");
    t.chart = Some(Chart::lines(
        "connections",
        "seconds",
        &["servers", "auth"],
        false,
    ));
    let mut runs: Vec<(String, Run)> = Vec::new();
    for servers in [1usize, 2] {
        let mut server_auth_seconds = Vec::new();
        for mutual in [false, true] {
            let extra: Vec<String> = if mutual {
                vec!["--client-ca".into(), client.ca.display().to_string()]
            } else {
                Vec::new()
            };
            let auth = if mutual { "mutual" } else { "server" };
            let name = format!("{servers}-server-{auth}");
            println!("   {servers} server(s), {auth} authentication");
            let sut = if servers == 1 {
                Sut::baton_single(lab, &name, KEY, &extra)?
            } else {
                Sut::baton_cluster(
                    lab,
                    &name,
                    servers,
                    "round-robin",
                    Store::Memory,
                    KEY,
                    &extra,
                )?
            };
            for (i, &n) in counts.iter().enumerate() {
                let run = lab.run(
                    &sut,
                    BenchArgs {
                        url: Some(format!("https://{{addr}}/bytes/{BODY}")),
                        connections: Some(n),
                        clients: Some(30),
                        resume: Some("none".into()),
                        cert: mutual.then(|| client.cert.clone()),
                        key: mutual.then(|| client.key.clone()),
                        timeout: Some("10s".into()),
                        ..Default::default()
                    },
                )?;
                let seconds = run.report.duration_s;
                let mut r = row![
                    ("servers", servers),
                    ("auth", auth),
                    ("connections", n),
                    ("seconds", seconds),
                    ("tps", run.report.tps),
                    ("failed", run.failed()),
                    ("server_cpu_ms_per_tx", run.server_cpu_per_tx_ms()),
                ];
                if mutual {
                    let base: Option<f64> = server_auth_seconds.get(i).copied();
                    r.insert(
                        "mutual_over_server".into(),
                        json!(base.and_then(|b| ratio(seconds, b))),
                    );
                    r.insert(
                        "paper_mutual_over_server".into(),
                        json!(paper_seconds(servers, true) / paper_seconds(servers, false)),
                    );
                } else {
                    server_auth_seconds.push(seconds);
                }
                if n == 5000 {
                    r.insert(
                        "paper_seconds_5000".into(),
                        json!(paper_seconds(servers, mutual)),
                    );
                }
                t.push(r);
                runs.push((format!("{name} {n}"), run));
            }
        }
    }
    super::run_notes(&mut t, lab, runs.iter().map(|(n, r)| (n, r)));
    t.note("mutual / server: time with client certificates over time without, same servers and count (paper: 1.48 with one server, 1.81 with two)");
    Ok(t)
}
