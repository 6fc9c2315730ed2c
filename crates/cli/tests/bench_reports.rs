//! `baton bench` reports, against a real `baton agent` on 127.0.0.1: `merge` of runs from
//! several "machines", the HTML report (rendered by headless Chromium), `find-max`, sweeps.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Output};

use common::*;
use serde_json::Value;

fn baton(args: &[&str]) -> Output {
    Command::new(BATON).args(args).output().expect("run baton")
}

fn ok(out: &Output) {
    assert!(out.status.success(), "{}", text_of(out));
}

fn json(path: &str) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn n(v: &Value, path: &str) -> u64 {
    path.split('.')
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

/// An agent with both certificates and tickets, and the flags to trust it.
fn agent(pki: &Pki, extra: &[&str]) -> (Agent, Vec<String>) {
    let mut args = pki.server_args();
    args.extend(["--tickets".into(), "true".into()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let agent = Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let trust = vec![
        "--ca".to_string(),
        pki.arg("ca.pem"),
        "--sni".into(),
        "localhost".into(),
    ];
    (agent, trust)
}

/// `value_at_quantile` of HdrHistogram over `[value, count]` pairs (values are bucket tops).
fn quantile_ms(pairs: &BTreeMap<u64, u64>, q: f64) -> f64 {
    let total: u64 = pairs.values().sum();
    let rank = ((q * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (v, c) in pairs {
        seen += c;
        if seen >= rank {
            return *v as f64 / 1000.0;
        }
    }
    unreachable!()
}

fn pairs(v: &Value, phase: &str) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    for p in v["histograms"][phase]["counts"].as_array().unwrap() {
        *m.entry(p[0].as_u64().unwrap()).or_default() += p[1].as_u64().unwrap();
    }
    m
}

#[test]
fn merge_of_two_runs_is_their_exact_sum() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-reports-merge");
    let (agent, trust) = agent(&pki, &[]);
    let url = agent.url("/");
    let trust: Vec<&str> = trust.iter().map(String::as_str).collect();
    // two "load machines": different sizes, versions and mixes
    let runs = [
        (
            "a.json",
            vec!["-n", "240", "-c", "4", "--tls-version", "1.3"],
        ),
        (
            "b.json",
            vec![
                "-n",
                "150",
                "-c",
                "3",
                "--tls-version",
                "1.2",
                "--full-every",
                "1",
            ],
        ),
    ];
    for (file, args) in &runs {
        let mut a = vec!["bench", &url, "--quiet", "--json"];
        let path = dir.arg(file);
        a.push(&path);
        a.extend(&trust);
        a.extend(args);
        ok(&baton(&a));
    }
    let (a, b) = (json(&dir.arg("a.json")), json(&dir.arg("b.json")));
    let out = baton(&[
        "bench",
        "merge",
        &dir.arg("a.json"),
        &dir.arg("b.json"),
        "--out",
        &dir.arg("m.json"),
    ]);
    ok(&out);
    assert!(text_of(&out).contains("merge: 2 runs"), "{}", text_of(&out));
    let m = json(&dir.arg("m.json"));
    for k in [
        "connections",
        "bytes",
        "handshakes.full",
        "handshakes.resumed",
        "handshakes.resume_refused",
        "handshakes.failed",
        "requests.ok",
        "requests.failed",
        "config.clients",
    ] {
        assert_eq!(n(&m, k), n(&a, k) + n(&b, k), "{k}");
    }
    assert_eq!(n(&m, "connections"), 390);
    assert_eq!((n(&m, "handshakes.full"), n(&m, "requests.ok")), (230, 390));
    assert_eq!(n(&m, "merged.runs"), 2);
    let negotiated: u64 = m["negotiated"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(negotiated, 390);
    let tps = m["tps"].as_f64().unwrap();
    assert!((tps - a["tps"].as_f64().unwrap() - b["tps"].as_f64().unwrap()).abs() < 1e-6);
    let timeline: u64 = m["timeline"]["completed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(timeline, 390);
    // percentiles are those of the union of both runs' histograms, not averages
    for phase in ["connect", "handshake", "ttfb", "total"] {
        let mut union = pairs(&a, phase);
        for (v, c) in pairs(&b, phase) {
            *union.entry(v).or_default() += c;
        }
        assert_eq!(pairs(&m, phase), union, "{phase}");
        let s = &m["latency_ms"][phase];
        assert_eq!(s["count"].as_u64(), Some(union.values().sum()));
        for (k, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)] {
            assert_eq!(
                s[k].as_f64().unwrap(),
                quantile_ms(&union, q),
                "{phase} {k}"
            );
        }
        assert_eq!(s["max"].as_f64().unwrap(), quantile_ms(&union, 1.0));
    }
    // a merge of a merge counts all its runs; bad input is refused with exit status 2
    ok(&baton(&[
        "bench",
        "merge",
        &dir.arg("m.json"),
        &dir.arg("a.json"),
        "--out",
        &dir.arg("mm.json"),
        "--quiet",
    ]));
    let mm = json(&dir.arg("mm.json"));
    assert_eq!(n(&mm, "merged.runs"), 3);
    assert_eq!(n(&mm, "connections"), 630);
    std::fs::write(dir.path("bad.json"), "{}").unwrap();
    let out = baton(&["bench", "merge", &dir.arg("a.json"), &dir.arg("bad.json")]);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn html_report_is_self_contained_and_renders() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-reports-report");
    let (agent, trust) = agent(&pki, &[]);
    let url = agent.url("/bytes/512");
    let html = dir.arg("report.html");
    let mut args = vec![
        "bench", &url, "--quiet", "-d", "1500ms", "-c", "4", "--report", &html,
    ];
    args.extend(trust.iter().map(String::as_str));
    ok(&baton(&args));
    let text = std::fs::read_to_string(&html).unwrap();
    // the tested URL is the only address in it, as text; nothing is fetched
    let rest = text.replace(&url, "");
    for banned in [
        "http://", "https://", "<script", "<link", "<img", "<iframe", "src=", "href=", "@import",
        "url(",
    ] {
        assert!(!rest.contains(banned), "`{banned}` in the report");
    }
    for part in [
        "Summary",
        "Throughput over time",
        "Latency per phase",
        "Handshakes",
        "Errors",
        "<svg",
        "handshake",
        "ttfb",
    ] {
        assert!(text.contains(part), "{part}");
    }
    // merge writes one too
    let j = dir.arg("run.json");
    let mut args = vec!["bench", &url, "--quiet", "-n", "50", "--json", &j];
    args.extend(trust.iter().map(String::as_str));
    ok(&baton(&args));
    let merged_html = dir.arg("merged.html");
    ok(&baton(&[
        "bench",
        "merge",
        &j,
        &j,
        "--quiet",
        "--report",
        &merged_html,
    ]));
    assert!(std::fs::read_to_string(&merged_html)
        .unwrap()
        .contains("2 runs merged"));

    let Some(chromium) = chromium() else { return };
    let png = dir.path("report.png");
    screenshot(chromium, &dir.path("report.html"), &png, 800, 2400);
    let (w, h, colours) = png_colours(&png);
    assert_eq!((w, h), (800, 2400));
    // text, axes, lines and bars in several colours: far from a blank page
    assert!(colours > 50, "{colours} distinct colours: blank?");
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn find_max_converges_under_a_cpu_cap() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-reports-findmax");
    let (agent, trust) = agent(&pki, &[]);
    // 10 % of one core: the agent, not the client, is what saturates (when cgroups allow)
    let cap = CpuCap::apply(agent.child.id(), 10);
    if cap.is_none() {
        // the search still runs, uncapped; what the cap shows is skipped
        require_or_skip(
            "cgroup cpu controller to write",
            "capping the agent; running uncapped",
        );
    }
    let out_json = dir.arg("find-max.json");
    let url = agent.url("/");
    let mut args = vec![
        "bench",
        "find-max",
        &url,
        "--resume",
        "none",
        "--steady",
        "1s",
        "--repeat",
        "2",
        "--start-rate",
        "50",
        "--max-rate",
        "3200",
        "--precision",
        "20",
        "-c",
        "50",
        "--json",
        &out_json,
    ];
    args.extend(trust.iter().map(String::as_str));
    let out = baton(&args);
    ok(&out);
    let text = text_of(&out);
    assert!(text.contains("max SSL TPS"), "{text}");
    assert!(
        text.contains("repeat 2/2"),
        "progress shows each step: {text}"
    );
    let j = json(&out_json);
    let r = &j["result"];
    assert_eq!(r["converged"], true, "{j}");
    let rate = r["rate"].as_f64().expect("a rate passed");
    let tps: Vec<f64> = r["tps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(tps.len(), 2);
    let (lo, hi) = (
        tps.iter().copied().fold(f64::MAX, f64::min),
        tps.iter().copied().fold(0.0, f64::max),
    );
    let mean = tps.iter().sum::<f64>() / 2.0;
    let spread = r["spread_pct"].as_f64().unwrap();
    assert!((spread - (hi - lo) / mean * 100.0).abs() < 1e-6);
    // (at most one transaction more than the rate in a one-second step)
    assert!(
        tps.iter().all(|t| *t >= 0.95 * rate && *t <= rate + 1.0),
        "{tps:?} at {rate}"
    );
    let steps = j["steps"].as_array().unwrap();
    // The answer is bracketed: unless the search ran into --max-rate, some step failed above
    // the rate found and within --precision (20 %) of it, so the server really could not take
    // much more. A search that stopped early, or reported a rate it never saw fail above,
    // fails here.
    if r["capped"] != true {
        let lowest_failure = steps
            .iter()
            .filter(|s| s["verdict"] != "pass")
            .filter_map(|s| s["rate"].as_f64())
            .filter(|f| *f > rate)
            .fold(f64::MAX, f64::min);
        assert!(
            lowest_failure <= rate * 1.2 + 1.0,
            "no failed step within 20 % above {rate}: {steps:?}"
        );
    }
    let max_steps = j["limits"]["max_steps"].as_u64().unwrap();
    assert!(steps.len() as u64 <= max_steps);
    assert_eq!(steps[0]["rate"].as_f64(), Some(50.0));
    for s in steps {
        let r = s["rate"].as_f64().unwrap();
        assert!((1.0..=3200.0).contains(&r));
        if s["verdict"] == "pass" {
            assert!(s["failed"].as_u64().unwrap() * 100_000 <= s["requests"].as_u64().unwrap());
        }
    }
    // the last `repeat` steps held the result's rate and passed
    for s in &steps[steps.len() - 2..] {
        assert_eq!(s["rate"].as_f64(), Some(rate));
        assert_eq!(s["verdict"], "pass");
    }
    if cap.is_some() {
        // under the cap the server gave way somewhere below the ceiling, above the result
        assert_eq!(r["capped"], false, "{j}");
        assert!(steps
            .iter()
            .any(|s| s["verdict"] != "pass" && s["rate"].as_f64().unwrap() > rate));
    }
    drop(cap);
}

#[test]
fn sweeps_run_a_matrix_into_one_table() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-reports-sweep");
    let (agent, trust) = agent(&pki, &[]);
    let config = dir.path("sweep.toml");
    std::fs::write(
        &config,
        format!(
            "url = \"{}\"\nconnections = 12\nclients = 2\n[sweep]\ntls-version = [\"1.2\", \"1.3\"]\n",
            agent.url("/bytes/{size}")
        ),
    )
    .unwrap();
    let out_json = dir.arg("sweep.json");
    let config_arg = config.to_str().unwrap().to_string();
    let mut args = vec![
        "bench",
        "--config",
        &config_arg,
        "--body-size",
        "128,1k,4k",
        "--json",
        &out_json,
    ];
    args.extend(trust.iter().map(String::as_str));
    let out = baton(&args);
    ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let table: Vec<&str> = stdout.lines().collect();
    assert!(
        table[0].contains("tls-version") && table[0].contains("body-size"),
        "{stdout}"
    );
    assert_eq!(table.len(), 7, "{stdout}");
    let runs = json(&out_json)["runs"].as_array().unwrap().clone();
    assert_eq!(runs.len(), 6);
    for run in &runs {
        let size: u64 = match run["sweep"]["body-size"].as_str().unwrap() {
            "128" => 128,
            "1k" => 1024,
            "4k" => 4096,
            other => panic!("{other}"),
        };
        let r = &run["report"];
        assert_eq!(n(r, "requests.ok"), 12, "{run}");
        assert!(n(r, "bytes") >= 12 * size && n(r, "bytes") < 12 * (size + 1024));
        let v = run["sweep"]["tls-version"].as_str().unwrap();
        assert_eq!(r["config"]["tls_version"].as_str(), Some(v));
        let negotiated = r["negotiated"].as_object().unwrap();
        let want = if v == "1.3" { "TLSv1_3" } else { "TLSv1_2" };
        assert!(
            negotiated.keys().all(|k| k.starts_with(want)),
            "{negotiated:?}"
        );
    }
    // a size sweep on a URL without {size} is refused before anything runs
    let url = agent.url("/");
    let out = baton(&["bench", &url, "--body-size", "1k", "--insecure"]);
    assert_eq!(out.status.code(), Some(2));
    // find-max measures one setting
    let out = baton(&["bench", "find-max", &url, "--body-size", "1k", "--insecure"]);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
}
