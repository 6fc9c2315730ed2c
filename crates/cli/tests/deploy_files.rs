//! What operators load next to the metrics (deploy/): the Prometheus alert rules pass
//! `promtool check rules` and their unit tests, and every metric and label the rules and the
//! Grafana dashboard name exists on running processes (an agent with a key signer, upstreams,
//! an agent link and handoff, and a dispatcher). A renamed metric fails here, not on a
//! dashboard that silently goes blank.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path)
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy("prometheus"))
        .output()
        .expect("promtool (Debian package prometheus; scripts/test installs it)");
    assert!(out.status.success(), "promtool {args:?}: {}", text_of(&out));
}

#[test]
fn alert_rules_are_valid_and_fire_on_what_they_are_for() {
    promtool(&["check", "rules", "baton-alerts.yml"]);
    promtool(&["test", "rules", "baton-alerts.test.yml"]);
}

/// Series names (and their label names) exposed by a metrics page.
fn exposed(text: &str, into: &mut BTreeMap<String, BTreeSet<String>>) {
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = into.entry(line[..name_end].to_string()).or_default();
        if let Some(rest) = line[name_end..].strip_prefix('{') {
            let body = &rest[..rest.find('}').unwrap_or(rest.len())];
            for pair in body.split(',').filter(|p| !p.is_empty()) {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.trim().to_string());
                }
            }
        }
    }
}

/// Every `baton_*` / `process_*` series named in a PromQL expression, with the label names its
/// selector uses (`{a="x", b=~"y"}`).
fn named(expr: &str, into: &mut BTreeMap<String, BTreeSet<String>>) {
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
        if is_word(bytes[i]) && (i == 0 || !is_word(bytes[i - 1])) {
            let start = i;
            while i < bytes.len() && is_word(bytes[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            if word.starts_with("baton_") || word.starts_with("process_") {
                let labels = into.entry(word.to_string()).or_default();
                if expr[i..].starts_with('{') {
                    let body = &expr[i + 1..i + expr[i..].find('}').unwrap_or(1)];
                    for pair in body.split(',') {
                        let key = pair.split(['=', '!']).next().unwrap_or("").trim();
                        if !key.is_empty() {
                            labels.insert(key.to_string());
                        }
                    }
                }
            }
        } else {
            i += 1;
        }
    }
}

fn expressions_of(json: &serde_json::Value, out: &mut Vec<String>) {
    match json {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => expressions_of(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| expressions_of(v, out)),
        _ => {}
    }
}

#[test]
fn every_metric_the_rules_and_the_dashboard_name_exists() {
    // the rules file is YAML; its expressions are the `expr:` values, some in block scalars
    let rules = std::fs::read_to_string(deploy("prometheus/baton-alerts.yml")).unwrap();
    let mut exprs: Vec<String> = Vec::new();
    let mut block: Option<(usize, String)> = None;
    for line in rules.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some((at, text)) = &mut block {
            if line.trim().is_empty() || indent > *at {
                text.push_str(line.trim());
                text.push(' ');
                continue;
            }
            exprs.push(std::mem::take(text));
            block = None;
        }
        if let Some(v) = line.trim().strip_prefix("expr:") {
            match v.trim() {
                "|" | ">" => block = Some((indent, String::new())),
                v => exprs.push(v.to_string()),
            }
        }
    }
    assert!(exprs.len() >= 20, "{} rule expressions", exprs.len());
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy("grafana/baton-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 15);
    let mut dash_exprs = Vec::new();
    expressions_of(&dashboard, &mut dash_exprs);
    assert!(dash_exprs.len() >= panels.len());

    let mut wanted = BTreeMap::new();
    for e in exprs.iter().chain(&dash_exprs) {
        named(e, &mut wanted);
    }

    // Processes that expose every family: an agent with a key signer (down: its fallback
    // signs), an upstream, an agent link and handoff; a dispatcher on that link.
    let pki = Pki::new();
    let dir = TempDir::new("deploy-files");
    let cluster_key = key_file(&dir, "cluster");
    let auth = key_file(&dir, "signer-auth");
    let socket = dir.arg("no-signer.sock");
    let agent = Agent::start(&[
        "--cert",
        &pki.arg("ecdsa.pem"),
        "--key",
        &pki.arg("ecdsa.key"),
        "--key-signer",
        &format!("unix:{socket}"),
        "--key-signer-auth-key-file",
        &auth,
        "--key-signer-fallback",
        "local",
        "--upstream",
        "http://127.0.0.1:9",
        "--link-listen",
        "127.0.0.1:0",
        "--cluster-key-file",
        &cluster_key,
        "--handoff",
        "true",
    ]);
    let dispatcher = Dispatcher::start(
        &[&agent],
        &["--cluster-key-file", &cluster_key, "--policy", "handoff"],
    );
    let mut have = BTreeMap::new();
    exposed(&agent.metrics_text(), &mut have);
    exposed(&plain_get(dispatcher.metrics, "/metrics").1, &mut have);

    // Families with a series per ACME name only: an agent without ACME names has none.
    let acme_only = [
        "baton_certificate_renewals_total",
        "baton_certificate_renewal_failing_since_timestamp_seconds",
        // read by the ACME test against Pebble
        "baton_certificate_renewal_scheduled_timestamp_seconds",
    ];
    let mut missing = Vec::new();
    for (name, labels) in &wanted {
        if acme_only.contains(&name.as_str()) {
            continue;
        }
        match have.get(name) {
            None => missing.push(format!("{name} (no such series)")),
            Some(exposed) => {
                for l in labels {
                    // job and instance are the scrape's, le the histogram's
                    if !["job", "instance"].contains(&l.as_str()) && !exposed.contains(l) {
                        missing.push(format!("{name}: no label {l}"));
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named in deploy/ but not exposed: {missing:#?}"
    );
    // and the files cover the families operators need most
    for family in [
        "baton_handshakes_total",
        "baton_handshake_failures_total",
        "baton_dispatch_agent_up",
        "baton_key_signer_requests_total",
        "baton_session_store_events_total",
        "baton_dispatch_migrations_total",
    ] {
        assert!(wanted.contains_key(family), "{family} is in neither file");
    }
}
