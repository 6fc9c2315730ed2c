//! The SSL benchmark tool paper, experiment B: what session resumption saves. 1,800 to 4,200 connections fetching a
//! 5 KB page from one server, with 2/3 of them resumed vs none. Paper: at 4,200 connections
//! resumption saved more than 15 s on one server.

use baton_bench::BenchArgs;
use serde_json::json;

use crate::rig::{Lab, Run, Sut};
use crate::row;
use crate::table::{Chart, Table};
use baton_cluster::pki::KeyKind;

const KEY: KeyKind = KeyKind::Rsa(2048);
const BODY: usize = 5120;

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let counts: &[u64] = if lab.quick {
        &[300, 600]
    } else {
        &[1800, 3000, 4200]
    };
    let www = lab.dir.join("www");
    crate::rig::nginx::write_bodies(&www, &[BODY])?;
    let mut t = Table::new(
        "resumption",
        format!(
            "the SSL benchmark tool paper, experiment B: 2/3 resumed vs none, {BODY}-byte page, one server ({})",
            KEY.name()
        ),
    )
    .column("server", "server")
    .column("connections", "connections")
    .column("resumed", "resumption")
    .column("seconds", "seconds")
    .column("tps", "TPS")
    .column("failed", "failed")
    .column("server_full", "full (server)")
    .column("server_resumed", "resumed (server)")
    .column("server_cpu_ms_per_tx", "srv CPU ms/tx")
    .column("saved_percent", "time saved %");
    t.chart = Some(Chart::lines(
        "connections",
        "seconds",
        &["server", "resumed"],
        false,
    ));
    let mut runs: Vec<(String, Run)> = Vec::new();
    for server in ["baton", "nginx"] {
        if server == "nginx"
            && !crate::rig::nginx::available()
            && std::env::var_os("BATON_REQUIRE_SERVERS").is_none()
        {
            t.note("nginx rows skipped: nginx is not installed");
            continue;
        }
        println!("   {server}");
        let sut = match server {
            "baton" => Sut::baton_single(lab, "resumption-baton", KEY, &[])?,
            _ => Sut::nginx_servers(lab, "resumption-nginx", 1, KEY, &www, None, None)?,
        };
        for &n in counts {
            let mut none_seconds = None;
            for resumed in [false, true] {
                let run = lab.run(
                    &sut,
                    BenchArgs {
                        url: Some(format!("https://{{addr}}/bytes/{BODY}")),
                        connections: Some(n),
                        clients: Some(30),
                        resume: (!resumed).then(|| "none".into()),
                        full_every: resumed.then_some(3),
                        timeout: Some("10s".into()),
                        ..Default::default()
                    },
                )?;
                let seconds = run.report.duration_s;
                let mut r = row![
                    ("server", server),
                    ("connections", n),
                    ("resumed", if resumed { "2/3" } else { "none" }),
                    ("seconds", seconds),
                    ("tps", run.report.tps),
                    ("failed", run.failed()),
                    ("server_full", run.server_full()),
                    ("server_resumed", run.server_resumed()),
                    ("server_cpu_ms_per_tx", run.server_cpu_per_tx_ms()),
                ];
                match none_seconds {
                    None => none_seconds = Some(seconds),
                    Some(base) => {
                        r.insert(
                            "saved_percent".into(),
                            json!((1.0 - seconds / base) * 100.0),
                        );
                    }
                }
                t.push(r);
                runs.push((format!("{server} {n} {resumed}"), run));
            }
        }
    }
    super::run_notes(&mut t, lab, runs.iter().map(|(n, r)| (n, r)));
    t.note("full/resumed (server): what the server counted itself; with 2/3 resumed the ideal is one full handshake in three connections");
    Ok(t)
}
