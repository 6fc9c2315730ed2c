//! `baton lab` quick runs of the CSSL paper's scenarios, end to end: real `baton` agents and
//! dispatchers, real nginx and HAProxy baselines, each server in its own CPU cap. The
//! assertions are about counts the servers kept themselves (handshakes per server, connections
//! per HAProxy backend, processes seen in each cap), never about speed.

mod common;

use std::path::Path;
use std::process::Command;

use common::{require_or_skip, TempDir};
use serde_json::Value;

/// Runs `baton lab EXPERIMENT --quick --json FILE --report FILE.html` and returns the
/// experiment's rows (at least one), after checking that the report's chart plots them:
/// `None` when the baselines are not installed (skipped).
fn lab(experiment: &str, chart: Beside, dir: &TempDir) -> Option<Vec<Value>> {
    for server in ["nginx", "haproxy"] {
        if !Path::new("/usr/sbin").join(server).exists() {
            require_or_skip(server, "the scenarios' baselines");
            return None;
        }
    }
    let json = dir.path("lab.json");
    let html = dir.path("lab.html");
    let out = Command::new(lab_binary())
        .args(["lab", experiment, "--quick", "--json"])
        .arg(&json)
        .arg("--report")
        .arg(&html)
        .arg("--dir")
        .arg(dir.path("work"))
        .output()
        .expect("running baton lab");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "baton lab {experiment} failed:\n{stdout}\n{stderr}"
    );
    println!("{stdout}");
    // the report is one self-contained page: tables and inline SVG, nothing fetched
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(&format!("<h2>{experiment}</h2>")), "{page}");
    assert!(page.contains("<svg") && page.contains("<table>"), "{page}");
    for external in ["<script", "<link", "src=", "@import", "url("] {
        assert!(
            !page.contains(external),
            "report refers to something outside: {external}"
        );
    }
    // ours beside the paper's figure in one chart, a colour per system and a legend
    assert!(
        page.contains(">this machine</text>") && page.contains(">paper</text>"),
        "no grouped chart with the paper beside ours: {page}"
    );
    if let Some(chromium) = common::chromium() {
        let png = dir.path("lab.png");
        common::screenshot(chromium, &html, &png, 900, 1600);
        let (_, _, colours) = common::png_colours(&png);
        assert!(colours > 20, "{colours} distinct colours: blank?");
    }
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let exp = &v["experiments"][0];
    assert_eq!(exp["experiment"], experiment);
    let rows = exp["rows"].as_array().unwrap().clone();
    assert!(!rows.is_empty(), "no rows: {exp:#}");
    check_chart(&page, &rows, chart);
    Some(rows)
}

/// A report chart of ours beside the paper's figure: the row keys of the two figures.
#[derive(Clone, Copy)]
struct Beside {
    ours: &'static str,
    paper: &'static str,
}

/// One bar of a chart: its colour, length and the value written at its end.
#[derive(Debug)]
struct Bar {
    fill: String,
    width: f64,
    label: f64,
}

/// The report's chart (its inline SVG, parsed) plots the JSON rows' figures: one group per row
/// that has either figure, labelled `config / server`, in the rows' order; in each, a bar in
/// the "this machine" colour for ours and one in the "paper" colour for the paper's, each as
/// long as its figure on one scale (the longest the full width) and labelled with it.
fn check_chart(page: &str, rows: &[Value], chart: Beside) {
    let start = page.find("<svg").expect("no chart in the report");
    let end = start + page[start..].find("</svg>").expect("unclosed <svg>") + "</svg>".len();
    let svg = roxmltree::Document::parse(&page[start..end])
        .unwrap_or_else(|e| panic!("the chart is not well-formed SVG: {e}"));
    let elements: Vec<roxmltree::Node> = svg
        .root_element()
        .children()
        .filter(|n| n.is_element())
        .collect();
    let attr = |n: &roxmltree::Node, a: &str| -> String {
        n.attribute(a)
            .unwrap_or_else(|| panic!("no {a} in {n:?}"))
            .to_string()
    };
    let num = |n: &roxmltree::Node, a: &str| -> f64 {
        attr(n, a)
            .parse()
            .unwrap_or_else(|e| panic!("{a} of {n:?}: {e}"))
    };
    // the legend: a swatch, then its system's name
    let swatch = |name: &str| -> String {
        let i = elements
            .iter()
            .position(|n| n.has_tag_name("text") && n.text() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in the legend"));
        assert!(i > 0 && elements[i - 1].has_tag_name("rect"), "{name}");
        attr(&elements[i - 1], "fill")
    };
    let (ours_fill, paper_fill) = (swatch("this machine"), swatch("paper"));
    assert_ne!(ours_fill, paper_fill, "one colour for both systems");
    let legend_end = elements
        .iter()
        .position(|n| n.text() == Some("paper"))
        .unwrap();
    // after the legend: per group a label, then (bar, value) pairs
    let mut groups: Vec<(String, Vec<Bar>)> = Vec::new();
    let mut rest = elements[legend_end + 1..].iter();
    while let Some(n) = rest.next() {
        if n.has_tag_name("text") {
            groups.push((n.text().unwrap_or("").to_string(), Vec::new()));
            continue;
        }
        assert!(n.has_tag_name("rect"), "{n:?}");
        let value = rest.next().expect("a bar without its value");
        let group = groups.last_mut().expect("a bar before any label");
        group.1.push(Bar {
            fill: attr(n, "fill"),
            width: num(n, "width"),
            label: value
                .text()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("bar value {value:?}")),
        });
    }
    let figure = |r: &Value, k: &str| r.get(k).and_then(Value::as_f64);
    let plotted: Vec<&Value> = rows
        .iter()
        .filter(|r| figure(r, chart.ours).is_some() || figure(r, chart.paper).is_some())
        .collect();
    assert!(!plotted.is_empty(), "no figure to plot in {rows:#?}");
    let labels: Vec<String> = plotted
        .iter()
        .map(|r| {
            format!(
                "{} / {}",
                r["config"].as_str().unwrap(),
                r["server"].as_str().unwrap()
            )
        })
        .collect();
    let drawn: Vec<&str> = groups.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(drawn, labels, "the chart's groups are not the rows");
    let max = plotted
        .iter()
        .flat_map(|r| [figure(r, chart.ours), figure(r, chart.paper)])
        .flatten()
        .fold(0.0f64, f64::max);
    let longest = groups
        .iter()
        .flat_map(|(_, bars)| bars.iter().map(|b| b.width))
        .fold(0.0f64, f64::max);
    assert!(max > 0.0 && longest > 0.0, "{groups:?}");
    for ((label, bars), r) in groups.iter().zip(&plotted) {
        let expected: Vec<(&str, f64)> = [
            (ours_fill.as_str(), figure(r, chart.ours)),
            (paper_fill.as_str(), figure(r, chart.paper)),
        ]
        .into_iter()
        .filter_map(|(fill, v)| Some((fill, v?)))
        .collect();
        assert_eq!(bars.len(), expected.len(), "{label}: {bars:?} for {r}");
        for (bar, (fill, v)) in bars.iter().zip(expected) {
            assert_eq!(bar.fill, fill, "{label}: {bar:?} for {v}");
            // the value as the report prints it: two decimals under 10, else whole
            let printed = if v.abs() < 10.0 { 0.005 } else { 0.5 };
            assert!(
                (bar.label - v).abs() <= printed + 1e-9,
                "{label}: bar labelled {} for {v}",
                bar.label
            );
            // one scale for every bar: the longest figure's bar is the longest
            let length = longest * v / max;
            assert!(
                (bar.width - length).abs() <= 0.1,
                "{label}: bar {} long for {v}, {length:.1} on the chart's scale",
                bar.width
            );
        }
    }
}

/// The optimised build when `BATON_LAB_BIN` names it (`scripts/test` builds it), else this
/// test build. How evenly load-based routing spreads handshakes depends on how fast the agents
/// and dispatcher turn them around, so the spread is asserted only for the optimised build.
fn lab_binary() -> std::path::PathBuf {
    std::env::var_os("BATON_LAB_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_baton").into())
}

fn optimised() -> bool {
    std::env::var_os("BATON_LAB_BIN").is_some()
}

fn find<'a>(rows: &'a [Value], config: &str, server: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["config"] == config && r["server"] == server)
        .unwrap_or_else(|| panic!("no row {config} / {server} in {rows:#?}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn per_server(r: &Value) -> Vec<u64> {
    r["per_server_handshakes"]
        .as_array()
        .unwrap()
        .iter()
        .map(u)
        .collect()
}

fn has_process(r: &Value, name: &str) -> bool {
    r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p.as_str().unwrap().starts_with(&format!("{name}:")))
}

/// The baselines really ran: nginx processes in the nginx servers' caps, HAProxy in the path
/// with every connection logged and counted per backend, and the servers' own counts adding up
/// to what the client sent.
fn check_baselines(rows: &[Value], connections: u64) {
    for r in rows {
        assert_eq!(u(&r["failed"]), 0, "failures in {r:#}");
        if r["server"] == "nginx" {
            assert!(has_process(r, "nginx"), "no nginx process seen: {r:#}");
        } else {
            assert!(has_process(r, "baton"), "no baton process seen: {r:#}");
        }
        let config = r["config"].as_str().unwrap();
        if config.starts_with("LB-") {
            assert!(has_process(r, "haproxy"), "no haproxy process seen: {r:#}");
            assert_eq!(u(&r["balancer_logged"]), connections, "{r:#}");
            let per: u64 = r["balancer_per_server"]
                .as_array()
                .unwrap()
                .iter()
                .map(u)
                .sum();
            assert_eq!(per, connections, "HAProxy's per-server counts: {r:#}");
        }
        let client = u(&r["client_full"]) + u(&r["client_resumed"]);
        assert_eq!(client, connections, "{r:#}");
        // one request per connection, counted by the TLS servers themselves
        assert_eq!(u(&r["server_requests"]), connections, "{r:#}");
        // The balancer's CPU is measured wherever one stands in front: HAProxy, or the
        // dispatcher (which relays every byte, so it always used some).
        let balancer = &r["balancer_cpu_ms_per_tx"];
        if config.starts_with("LB-") {
            assert!(balancer.as_f64().is_some(), "{r:#}");
        } else if config.starts_with("CSSL") {
            assert!(balancer.as_f64().is_some_and(|ms| ms > 0.0), "{r:#}");
        } else {
            assert!(balancer.is_null(), "no balancer in {config}: {r:#}");
        }
    }
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn scenario_b_quick_shared_sessions_need_fewer_full_handshakes_than_round_robin() {
    let dir = TempDir::new("lab-b");
    let chart = Beside {
        ours: "full_of_3000",
        paper: "paper_full",
    };
    let Some(rows) = lab("scenario-b", chart, &dir) else {
        return;
    };
    check_baselines(&rows, 600);
    let full = |c: &str, s: &str| u(&find(&rows, c, s)["full_handshakes"]);
    let shared = full("CSSL-SL enabled (peers)", "baton");
    // each client's first connection of three is full: 200 of 600
    assert_eq!(
        shared, 200,
        "CSSL-SL: only the clients' own full handshakes"
    );
    assert!(shared < full("LB-RR", "baton"), "{rows:#?}");
    assert!(shared < full("LB-RR", "nginx"), "{rows:#?}");
    assert!(
        shared < full("CSSL-SL disabled (memory)", "baton"),
        "{rows:#?}"
    );
    // a single server resumes everything it issued
    assert_eq!(full("1 server", "nginx"), 200);
    assert_eq!(full("1 server", "baton"), 200);
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn scenario_a_quick_handoff_spreads_full_handshakes_evenly() {
    let dir = TempDir::new("lab-a");
    let chart = Beside {
        ours: "ratio_to_single",
        paper: "paper_ratio",
    };
    let Some(rows) = lab("scenario-a", chart, &dir) else {
        return;
    };
    check_baselines(&rows, 900);
    let on = per_server(find(&rows, "CSSL-SF enabled (handoff)", "baton"));
    assert_eq!(on.len(), 2);
    assert_eq!(on.iter().sum::<u64>(), 900);
    let (max, min) = (*on.iter().max().unwrap(), *on.iter().min().unwrap());
    let apart = (max - min) as f64 / ((max + min) as f64 / 2.0);
    if optimised() {
        assert!(
            apart <= 0.10,
            "CSSL-SF full handshakes per agent more than 10% apart: {on:?}"
        );
    } else {
        // a dev build turns handshakes around slower; 12-25% apart seen here (0-2% optimised)
        eprintln!(
            "dev build: CSSL-SF handshakes {on:?}, {:.0}% apart (bound checked with BATON_LAB_BIN)",
            apart * 100.0
        );
        assert!(
            apart <= 0.5,
            "CSSL-SF handshakes far apart even for a dev build: {on:?}"
        );
    }
    // client-ip affinity puts the three hosts 2:1 on the two agents
    let off = per_server(find(&rows, "CSSL-SF disabled (client-ip)", "baton"));
    let mut off_sorted = off.clone();
    off_sorted.sort();
    assert_eq!(off_sorted, vec![300, 600], "client-ip: {off:?}");
}

#[test]
fn homes_move_about_one_in_n_when_an_agent_joins_or_leaves() {
    let dir = TempDir::new("lab-homes");
    let json = dir.path("homes.json");
    let out = Command::new(lab_binary())
        .args(["lab", "homes", "--quick", "--quota", "0", "--json"])
        .arg(&json)
        .arg("--dir")
        .arg(dir.path("work"))
        .output()
        .expect("running baton lab homes");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["experiments"][0]["rows"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 6, "3, 5 and 8 agents, join and leave");
    for r in &rows {
        let (moved, ideal) = (f(r, "moved_percent"), f(r, "ideal_percent"));
        assert!((moved - ideal).abs() < ideal * 0.15, "{r}");
        // what hash % N did: most clients move
        assert!(f(r, "modulo_moved_percent") > 60.0, "{r}");
    }
}

fn f(row: &Value, key: &str) -> f64 {
    row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no {key} in {row}"))
}
