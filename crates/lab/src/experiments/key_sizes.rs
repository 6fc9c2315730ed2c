//! The 2048-bit migration report: SSL TPS (TCP connect, handshake, request, response, close) as the server key
//! grows — RSA 1024 (nginx/OpenSSL only: rustls refuses it), 2048, 3072, 4096, ECDSA P-256 and
//! P-384 — for responses of 128 B to 32 KB. The report's appliance kept 3,000 TPS at RSA 1024
//! and 2048 up to 1 KB (an SSL chip); a general-purpose CPU does not, and this shows by how much.

use serde_json::json;

use super::ssl_tps;
use crate::rig::{Lab, Run};
use crate::row;
use crate::table::{ratio, Chart, Table};
use baton_cluster::pki::KeyKind;

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let (keys, bodies, n): (&[KeyKind], &[usize], u64) = if lab.quick {
        (
            &[KeyKind::EcdsaP256, KeyKind::Rsa(2048)],
            &[128, 32768],
            150,
        )
    } else {
        (
            &[
                KeyKind::Rsa(1024),
                KeyKind::Rsa(2048),
                KeyKind::Rsa(3072),
                KeyKind::Rsa(4096),
                KeyKind::EcdsaP256,
                KeyKind::EcdsaP384,
            ],
            &[128, 1024, 4096, 8192, 16384, 32768],
            600,
        )
    };
    let www = lab.dir.join("www");
    crate::rig::nginx::write_bodies(&www, bodies)?;
    let mut t = Table::new(
        "key-sizes",
        "the 2048-bit migration report: SSL TPS by server key and response size (TLS 1.2, new connections only, one capped server)",
    )
    .column("server", "server")
    .column("key", "key")
    .column("body", "body B")
    .column("tps", "TPS")
    .column("failed", "failed")
    .column("per_cpu_second", "tx per srv CPU-s")
    .column("vs_rsa2048", "x RSA 2048")
    .column("paper_vs_rsa1024", "paper x RSA 1024");
    t.chart = Some(Chart::lines("body", "tps", &["server", "key"], true));
    let mut runs: Vec<(String, Run)> = Vec::new();
    let mut rsa2048: std::collections::HashMap<(String, usize), f64> = Default::default();
    let mut rows = Vec::new();
    for server in ["nginx", "baton"] {
        if server == "nginx" && !ssl_tps::nginx_ok() {
            t.note("nginx rows skipped: nginx is not installed");
            continue;
        }
        for &key in keys {
            if key == KeyKind::Rsa(1024) && server == "baton" {
                continue; // rustls (and aws-lc-rs) refuse 1024-bit RSA keys
            }
            println!("   {server} {}", key.name());
            // Debian's OpenSSL refuses 1024-bit keys at its default security level 2.
            let weak = key == KeyKind::Rsa(1024);
            let ciphers = weak.then(|| "DEFAULT:@SECLEVEL=0".to_string());
            let name = format!("{server}-{}", key.name());
            let sut = ssl_tps::single(lab, server, &name, key, &www, ciphers)?;
            for &body in bodies {
                let mut args = ssl_tps::new_connections(body, n, "1.2");
                if weak {
                    // rustls will not verify a 1024-bit RSA signature: the OpenSSL engine will
                    args.engine = Some("openssl".into());
                    args.suite = vec!["ECDHE-RSA-AES128-GCM-SHA256:@SECLEVEL=0".into()];
                }
                let run = lab.run(&sut, args)?;
                let per = ssl_tps::per_cpu_second(&run);
                if key == KeyKind::Rsa(2048) {
                    if let Some(p) = per {
                        rsa2048.insert((server.to_string(), body), p);
                    }
                }
                rows.push((server, key, body, run.report.tps, run.failed(), per));
                runs.push((format!("{name} {body}"), run));
            }
        }
    }
    for (server, key, body, tps, failed, per) in rows {
        let mut r = row![
            ("server", server),
            ("key", key.name()),
            ("body", body),
            ("tps", tps),
            ("failed", failed),
            ("per_cpu_second", per),
        ];
        let base = rsa2048.get(&(server.to_string(), body)).copied();
        r.insert(
            "vs_rsa2048".into(),
            json!(per.zip(base).and_then(|(p, b)| ratio(p, b))),
        );
        // The appliance: 3,000 TPS at both 1024 and 2048 bits up to 1 KB.
        if matches!(key, KeyKind::Rsa(1024 | 2048)) && body <= 1024 {
            r.insert("paper_vs_rsa1024".into(), json!(1.0));
        }
        t.push(r);
    }
    super::run_notes(&mut t, lab, runs.iter().map(|(n, r)| (n, r)));
    t.note("tx per srv CPU-s: transactions per CPU-second of the server (cgroup cpuacct), the figure to compare on a shared machine; TPS is capped by the server's CPU quota");
    t.note("RSA 1024 runs only on nginx, driven by the OpenSSL engine at @SECLEVEL=0 (rustls refuses 1024-bit RSA)");
    Ok(t)
}
