//! The agent's crypto accounting (`baton_crypto_seconds_total{op}`) is believable: every op is
//! counted, counters only grow, and crypto's share of the agent's CPU agrees with what an
//! independent profiler (`perf`, sampling the agent by its leaf symbols) sees in the same run.

mod common;

use std::process::Command;

use baton_lab::profile::{self, Attribution, Comparison};
use common::*;

/// `baton` as built for this test, or the one in `BATON_BIN` (to measure a release build:
/// `BATON_BIN=target/release/baton BATON_ACCOUNTING_MATRIX=1 cargo test -p baton-cli --test
/// crypto_accounting -- --nocapture`).
fn baton() -> String {
    std::env::var("BATON_BIN").unwrap_or_else(|_| BATON.to_string())
}

fn bench(agent: &Agent, pki: &Pki, args: &[&str]) {
    let out = Command::new(baton())
        .arg("bench")
        .arg(agent.url("/bytes/51200"))
        .args(["--ca", &pki.arg("ca.pem"), "--quiet"])
        .args(args)
        .output()
        .expect("run baton bench");
    assert!(
        out.status.success(),
        "bench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every op's seconds and operations, in `CryptoOp::ALL` order as rendered.
fn counters(agent: &Agent) -> Vec<(String, f64, f64)> {
    let text = agent.metrics_text();
    let seconds = profile::crypto_seconds(&text);
    seconds
        .into_iter()
        .map(|(op, s)| {
            let calls = agent.metric(&format!("baton_crypto_operations_total{{op=\"{op}\"}}"));
            (op, s, calls)
        })
        .collect()
}

#[test]
fn crypto_seconds_are_monotonic_and_non_zero_after_handshakes() {
    let pki = Pki::new();
    let mut args = pki.server_args();
    // optional client certificates, so that verification is exercised too
    args.extend(["--client-ca".into(), pki.arg("client-ca.pem")]);
    args.extend(["--client-auth".into(), "optional".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start(&args);
    let client = [
        "--cert",
        &pki.arg("client.pem"),
        "--key",
        &pki.arg("client.key"),
    ];

    // ECDSA over TLS 1.3, one full handshake for two resumed ones (tickets)
    let run1 = [
        &client[..],
        &["--tls-version", "1.3", "-n", "30", "-c", "3"],
    ]
    .concat();
    bench(&agent, &pki, &run1);
    let first = counters(&agent);
    let ops: Vec<&str> = first.iter().map(|(op, _, _)| op.as_str()).collect();
    for op in [
        "sign",
        "kx",
        "bulk_encrypt",
        "bulk_decrypt",
        "verify",
        "hash",
        "ticket",
    ] {
        assert!(ops.contains(&op), "op {op} not rendered: {ops:?}");
    }
    for (op, seconds, calls) in &first {
        assert!(
            *seconds > 0.0 && *calls > 0.0,
            "{op}: {seconds}s {calls} ops"
        );
    }

    // RSA over TLS 1.2 with session tickets: every op is used again, so every op grows
    let run2 = [
        &client[..],
        &[
            "--tls-version",
            "1.2",
            "--suite",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "--resume",
            "ticket",
            "-n",
            "30",
            "-c",
            "3",
        ],
    ]
    .concat();
    bench(&agent, &pki, &run2);
    let second = counters(&agent);
    assert_eq!(first.len(), second.len());
    for ((op, s1, c1), (op2, s2, c2)) in first.iter().zip(&second) {
        assert_eq!(op, op2);
        assert!(s2 > s1, "{op}: seconds {s1} -> {s2}");
        assert!(c2 > c1, "{op}: operations {c1} -> {c2}");
    }
    // handshakes were counted too, so the crypto is theirs: a full handshake signs once
    let full = agent.handshakes("1.3", "full") + agent.handshakes("1.2", "full");
    let signs = second.iter().find(|(op, _, _)| op == "sign").unwrap().2;
    assert_eq!(signs as u64, full, "one signature per full handshake");
}

/// perf here, or why not.
fn perf_or_skip(dir: &TempDir) -> bool {
    match profile::check_perf(&dir.0) {
        Ok(()) => true,
        Err(e) => {
            require_or_skip("usable perf", &format!("the perf comparison: {e:#}"));
            false
        }
    }
}

/// One load run against `agent`, sampled by perf, both accounts compared.
fn compare(agent: &Agent, pki: &Pki, dir: &TempDir, tag: &str, args: &[&str]) -> Comparison {
    let pid = agent.child.id();
    let rec = profile::Recording::start(pid, 999, &dir.path(&format!("{tag}.data")))
        .unwrap_or_else(|e| panic!("perf record -p {pid}: {e:#}"));
    let before = profile::snapshot(pid, agent.metrics).unwrap();
    bench(agent, pki, args);
    let after = profile::snapshot(pid, agent.metrics).unwrap();
    let profile = rec.stop().unwrap_or_else(|e| panic!("perf: {e:#}"));
    // the metrics scrape itself is a little agent CPU outside the load; negligible
    let c = Comparison::new(&before, &after, profile, Attribution { p256_kx: false });
    eprintln!("{tag} {args:?}\n{}", c.table());
    c
}

/// The margin ([`Comparison::margin_points`]) is a bound on accounting error, not on speed. On
/// the project's 2-core VM under a load average of 10 (other builds), over 14 runs (ECDSA
/// P-256 and RSA 2048, TLS 1.2 and 1.3, full and resumed, 50 KB bodies; debug and release
/// agents), the metered share came out 1.4 to 5.0 points below perf's share of samples inside
/// metered calls (perf's own stack copying is agent CPU it does not sample; the clock reads
/// are inside the calls perf sees), each op within 3.1 points. The margin is those 5 points
/// plus three standard errors of the sampled share (~6.6 points at the 500 samples required,
/// ~3.3 at 2,000). A wrong
/// accounting shows as more: dropping the hash metering moves TLS 1.3's share by 10 to 17
/// points, wall-clock timing on this loaded machine overstated it by 12 to 17.
#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn metered_crypto_share_agrees_with_perf() {
    let dir = TempDir::new("crypto-accounting");
    if !perf_or_skip(&dir) {
        return;
    }
    let pki = Pki::new();
    let args = pki.server_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start(&args);
    let runs: &[(&str, &[&str])] = if std::env::var_os("BATON_ACCOUNTING_MATRIX").is_some() {
        &[
            (
                "ecdsa-1.2-full",
                &[
                    "--suite",
                    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                    "--resume",
                    "none",
                ],
            ),
            (
                "ecdsa-1.2-resumed",
                &[
                    "--suite",
                    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                    "--resume",
                    "ticket",
                    "--full-every",
                    "1000",
                ],
            ),
            (
                "rsa-1.2-full",
                &[
                    "--suite",
                    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                    "--resume",
                    "none",
                ],
            ),
            (
                "rsa-1.2-resumed",
                &[
                    "--suite",
                    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                    "--resume",
                    "ticket",
                    "--full-every",
                    "1000",
                ],
            ),
            (
                "ecdsa-1.3-full",
                &["--tls-version", "1.3", "--resume", "none"],
            ),
            (
                "ecdsa-1.3-resumed",
                &["--tls-version", "1.3", "--full-every", "1000"],
            ),
            (
                "rsa-1.3-full",
                &[
                    "--tls-version",
                    "1.3",
                    "--sigalg",
                    "rsa_pss_rsae_sha256",
                    "--resume",
                    "none",
                ],
            ),
        ]
    } else {
        &[
            (
                "ecdsa-1.3-full",
                &["--tls-version", "1.3", "--resume", "none"],
            ),
            (
                "rsa-1.2-full",
                &[
                    "--suite",
                    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                    "--resume",
                    "none",
                ],
            ),
        ]
    };
    let mut worst: f64 = 0.0;
    for (tag, run) in runs {
        let args = [*run, &["-d", "5s", "-c", "4"]].concat();
        let c = compare(&agent, &pki, &dir, tag, &args);
        // enough samples for the margin to mean something (not a speed check: at 999 Hz the
        // agent gave 1,000 to 3,000 in 4 s on the loaded VM; at 500 one standard error of
        // the sampled share is ~2 points)
        assert!(
            c.profile.total() >= 500,
            "{tag}: only {} perf samples of the agent",
            c.profile.total()
        );
        assert!(c.cpu_seconds > 0.5, "{tag}: agent used {}s", c.cpu_seconds);
        // both saw crypto at all
        assert!(
            c.metered_share() > 0.05 && c.perf_share() > 0.05,
            "{tag}\n{}",
            c.table()
        );
        worst = worst.max(c.difference_points().abs());
        for op in c.metered.keys() {
            if profile::compare::WAITING_OPS.contains(&op.as_str()) {
                continue;
            }
            let d = 100.0 * (c.metered_op_share(op) - c.perf_op_share(op));
            assert!(
                d.abs() <= c.margin_points(),
                "{tag}: {op} metered and sampled differ by {d:.1} points\n{}",
                c.table()
            );
        }
        assert!(
            c.difference_points().abs() <= c.margin_points(),
            "{tag}: metered and sampled crypto shares differ by more than {:.1} points\n{}",
            c.margin_points(),
            c.table()
        );
    }
    eprintln!("largest difference: {worst:.1} points");
}

/// `baton lab crypto-share --quick`: every configuration ran, the metering's split is where
/// each handshake kind puts it, the key left the agent with the signer, and perf agrees.
#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn lab_crypto_share_quick() {
    let dir = TempDir::new("crypto-share");
    let json = dir.path("lab.json");
    let out = Command::new(baton())
        .args(["lab", "crypto-share", "--quick", "--json"])
        .arg(&json)
        .arg("--dir")
        .arg(dir.path("work"))
        .output()
        .expect("running baton lab");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "baton lab crypto-share failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["experiments"][0]["rows"].as_array().unwrap();
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64();
    let find = |suite: &str, hs: &str, key: &str| {
        rows.iter()
            .find(|r| r["suite"] == suite && r["handshakes"] == hs && r["key"] == key)
            .unwrap_or_else(|| panic!("no row {suite} {hs} {key}"))
    };
    let signer = rows.iter().any(|r| r["key"] == "signer");
    for suite in ["ECDHE-ECDSA P-256", "ECDHE-RSA 2048", "TLS 1.3 ECDSA P-256"] {
        let full = find(suite, "full", "in-process");
        let resumed = find(suite, "resumed", "in-process");
        for r in [full, resumed] {
            assert!(f(r, "tps").unwrap() > 0.0, "{r}");
            assert!(f(r, "cpu_ms_per_tx").unwrap() > 0.0, "{r}");
            let crypto = f(r, "crypto").unwrap();
            assert!(crypto > 0.0 && crypto < 100.0, "{r}");
            if let Some(perf) = f(r, "perf_in_calls") {
                let margin = f(r, "perf_margin").expect("perf_margin beside perf_in_calls");
                assert!((crypto - perf).abs() <= margin, "{r}");
            }
        }
        // a full handshake signs; a resumed one does not (only each client's first connection)
        assert!(f(full, "sign").unwrap() > 0.0, "{full}");
        assert!(
            f(resumed, "sign").unwrap() < f(full, "sign").unwrap(),
            "{resumed}"
        );
        if signer {
            // with the signer the agent holds no signing work at all
            let remote = find(suite, "full", "signer");
            assert_eq!(f(remote, "sign"), Some(0.0), "{remote}");
            assert!(f(remote, "vs_in_process").is_some(), "{remote}");
            // the offload's whole cost: the signer worked, and agent + signer is at least the
            // agent's share alone
            let signer_ms = f(remote, "signer_ms_per_tx").expect("signer CPU measured");
            // (/proc counts in 10 ms ticks: an RSA run's signatures are always more than that)
            assert!(signer_ms > 0.0 || !suite.contains("RSA"), "{remote}");
            let system = f(remote, "system_vs_in_process").expect("agent+signer ratio");
            assert!(system >= f(remote, "vs_in_process").unwrap(), "{remote}");
        }
    }
}
