//! `baton scenario import-har` and `baton bench --scenario` against a real `baton agent`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// Two requests to shop.example 300 ms apart, and one to another host in between.
const HAR: &str = r#"{"log": {"version": "1.2", "creator": {"name": "test", "version": "1"},
  "entries": [
    {"startedDateTime": "2024-05-01T10:00:00.000Z", "time": 12,
     "request": {"method": "GET", "url": "https://shop.example/bytes/100", "httpVersion": "h2",
       "headers": [{"name": ":authority", "value": "shop.example"},
                   {"name": "accept", "value": "text/html"},
                   {"name": "user-agent", "value": "Mozilla/5.0 (test)"}]}},
    {"startedDateTime": "2024-05-01T10:00:00.050Z", "time": 5,
     "request": {"method": "GET", "url": "https://cdn.example/app.js", "headers": []}},
    {"startedDateTime": "2024-05-01T10:00:00.300Z", "time": 8,
     "request": {"method": "POST", "url": "https://shop.example/?q=1",
       "headers": [{"name": "Content-Type", "value": "text/plain"},
                   {"name": "Content-Length", "value": "5"}],
       "postData": {"mimeType": "text/plain", "text": "hello"}}}
  ]}}"#;

fn bench(args: &[&str], json: &str) -> (std::process::Output, Value) {
    let out = Command::new(BATON)
        .arg("bench")
        .args(args)
        .args(["--json", json, "--quiet"])
        .output()
        .expect("run baton bench");
    let v = std::fs::read(json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    (out, v)
}

#[test]
fn har_import_then_replay_against_baton_agent() {
    let pki = Pki::new();
    let dir = TempDir::new("scenario");
    let har = dir.path("shop.har");
    std::fs::write(&har, HAR).unwrap();
    let toml = dir.arg("shop.toml");
    let out = Command::new(BATON)
        .args(["scenario", "import-har", path_str(&har), "--out", &toml])
        .output()
        .unwrap();
    let said = text_of(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("2 requests to shop.example"), "{said}");
    assert!(
        said.contains("dropped 1 request(s) to cdn.example"),
        "{said}"
    );
    let text = std::fs::read_to_string(&toml).unwrap();
    assert!(text.contains("think-ms = 300"), "{text}");
    assert!(
        text.contains("path = \"/?q=1\"") && text.contains("body = \"xxxxx\""),
        "the body, masked to its length by default: {text}"
    );
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&toml).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "a scenario file may hold credentials");
    }
    assert!(
        !text.to_ascii_lowercase().contains("content-length"),
        "{text}"
    );

    let agent = Agent::serving(&pki, &[]);
    let before = agent.served();
    let json = dir.arg("run.json");
    let started = Instant::now();
    let (out, v) = bench(
        &[
            &agent.url("/ignored"),
            "--ca",
            &pki.arg("ca.pem"),
            "--connections",
            "20",
            "-c",
            "2",
            "--scenario",
            &toml,
        ],
        &json,
    );
    let took = started.elapsed();
    assert!(out.status.success(), "{}\n{v}", text_of(&out));
    assert_eq!(n(&v, "connections"), 20, "{v}");
    assert_eq!(n(&v, "config.requests_per_conn"), 2, "{v}");
    assert_eq!(n(&v, "requests.ok"), 40, "{v}");
    assert_eq!(n(&v, "requests.failed"), 0, "{v}");
    assert_eq!(n(&v, "requests.expected"), 40, "{v}");
    assert_eq!(
        n(&v, "requests.ok") + n(&v, "requests.failed"),
        n(&v, "connections") * n(&v, "config.requests_per_conn")
    );
    assert_eq!(v["config"]["scenarios"][0]["requests"], 2, "{v}");
    // the server's own count: exactly the 40 requests, nothing more
    assert_eq!(agent.served() - before, 40);
    // each client made 10 connections one after the other, each thinking 300 ms
    let floor = Duration::from_millis(10 * 300);
    assert!(took >= floor, "{took:?}");
    assert!(
        v["duration_s"].as_f64().unwrap() >= floor.as_secs_f64(),
        "{v}"
    );

    // no think time, two files by weight (the second one twice as often): still exact
    let second = dir.arg("second.toml");
    std::fs::write(
        &second,
        "[[request]]\npath = \"/healthz\"\n\n[[request]]\nthink-ms = 5000\nmethod = \"HEAD\"\npath = \"/\"\n",
    )
    .unwrap();
    let before = agent.served();
    let (out, v) = bench(
        &[
            &agent.url("/"),
            "--ca",
            &pki.arg("ca.pem"),
            "--connections",
            "6",
            "-c",
            "3",
            "--scenario",
            &toml,
            "--scenario",
            &format!("{second}:2"),
            "--think",
            "none",
        ],
        &json,
    );
    assert!(out.status.success(), "{}\n{v}", text_of(&out));
    assert_eq!(
        (n(&v, "requests.ok"), n(&v, "requests.failed")),
        (12, 0),
        "{v}"
    );
    assert_eq!(agent.served() - before, 12);
    assert_eq!(v["config"]["think"], "none", "{v}");
    assert_eq!(v["config"]["scenarios"][1]["weight"], 2, "{v}");

    // the same over HTTP/2 (one stream per request, in order, on one connection)
    let before = agent.served();
    let (out, v) = bench(
        &[
            &agent.url("/"),
            "--ca",
            &pki.arg("ca.pem"),
            "--connections",
            "4",
            "-c",
            "2",
            "--alpn",
            "h2",
            "--scenario",
            &toml,
            "--think",
            "0.1",
        ],
        &json,
    );
    assert!(out.status.success(), "{}\n{v}", text_of(&out));
    assert_eq!(
        (n(&v, "requests.ok"), n(&v, "requests.failed")),
        (8, 0),
        "{v}"
    );
    assert_eq!(agent.served() - before, 8);

    // scenarios of different lengths in one run: each connection counted against its own
    // (connections alternate 2, 3, 2, 3, ...: 3 x 2 + 3 x 3 requests), exactly, by the agent too
    let three = dir.arg("three.toml");
    std::fs::write(&three, "[[request]]\npath = \"/\"\n".repeat(3)).unwrap();
    let before = agent.served();
    let (out, v) = bench(
        &[
            &agent.url("/"),
            "--ca",
            &pki.arg("ca.pem"),
            "--connections",
            "6",
            "-c",
            "2",
            "--think",
            "none",
            "--scenario",
            &toml,
            "--scenario",
            &three,
        ],
        &json,
    );
    assert!(out.status.success(), "{}\n{v}", text_of(&out));
    assert_eq!(n(&v, "config.requests_per_conn"), 0, "{v}");
    assert_eq!(
        (
            n(&v, "requests.ok"),
            n(&v, "requests.failed"),
            n(&v, "requests.expected")
        ),
        (15, 0, 15),
        "{v}"
    );
    assert_eq!(agent.served() - before, 15);

    // a broken scenario file names the request, its line and the field
    let bad = dir.arg("bad.toml");
    std::fs::write(
        &bad,
        "[[request]]\npath = \"/\"\nheaders = [\"Host: evil\"]\n",
    )
    .unwrap();
    let (out, _) = bench(&[&agent.url("/"), "--insecure", "--scenario", &bad], &json);
    assert_eq!(out.status.code(), Some(2));
    let e = text_of(&out);
    assert!(
        e.contains("request 1 (line 1)") && e.contains("Host"),
        "{e}"
    );
}
