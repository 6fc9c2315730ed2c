//! The agent's access log (`--access-log`), read back by the test: one line per request and
//! one per connection that carried none, their fields against what the clients did (curl and
//! a rustls client), in JSON and text; and a logrotate-style rotation (rename, then SIGUSR1)
//! under a stream of requests that loses no line.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// The file's complete lines, once it has at least `n` (waits up to 10 s).
fn lines_of(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| l.trim_end().to_string())
            .collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn json_lines(path: &Path, n: usize) -> Vec<Value> {
    lines_of(path, n)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The one line whose `path` is `path`.
fn by_path<'a>(lines: &'a [Value], path: &str) -> &'a Value {
    let found: Vec<_> = lines.iter().filter(|l| l["path"] == path).collect();
    assert_eq!(found.len(), 1, "one line for {path} in {lines:#?}");
    found[0]
}

fn curl_to(agent: &Agent, pki: &Pki, extra: &[&str], path: &str) -> String {
    let port = agent.port();
    let resolve = format!("localhost:{port}:127.0.0.1");
    let url = format!("https://localhost:{port}{path}");
    let ca = pki.arg("ca.pem");
    let mut args = vec!["--cacert", ca.as_str(), "--resolve", &resolve];
    args.extend_from_slice(extra);
    args.extend(["-o", "/dev/null", "-w", "%{http_code}", url.as_str()]);
    let out = curl(&args);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn json_lines_say_what_each_client_did() {
    let pki = Pki::new();
    let dir = TempDir::new("access-json");
    let log = dir.path("access.log");
    let agent = Agent::serving(
        &pki,
        &[
            "--access-log",
            path_str(&log),
            "--access-log-format",
            "json",
            "--agent-id",
            "7",
        ],
    );
    // TLS 1.3 over HTTP/1.1, TLS 1.2, HTTP/2 with a request body
    assert_eq!(
        curl_to(&agent, &pki, &["--http1.1"], "/bytes/1234?x=1"),
        "200"
    );
    assert_eq!(
        curl_to(
            &agent,
            &pki,
            &["--http1.1", "--tls-max", "1.2"],
            "/bytes/10"
        ),
        "200"
    );
    assert_eq!(
        curl_to(
            &agent,
            &pki,
            &["--http2", "--data-binary", "0123456789abcdef"],
            "/post"
        ),
        "200"
    );
    assert_eq!(curl_to(&agent, &pki, &["--http1.1"], "/missing"), "404");
    // a rustls client resuming: the second connection is resumed
    let config = Arc::new(pki.client(&[&rustls::version::TLS13], None));
    let first = fetch(&agent, &config, "/bytes/3").unwrap();
    let second = fetch(&agent, &config, "/bytes/4").unwrap();
    assert_eq!(first.kind, rustls::HandshakeKind::Full);
    assert_eq!(second.kind, rustls::HandshakeKind::Resumed);
    // a handshake and no request
    {
        let tcp = std::net::TcpStream::connect(agent.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let conn =
            rustls::ClientConnection::new(config.clone(), "localhost".try_into().unwrap()).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).unwrap();
        }
    }

    let lines = json_lines(&log, 7);
    assert_eq!(lines.len(), 7, "{lines:#?}");
    let l = by_path(&lines, "/bytes/1234?x=1");
    assert_eq!(l["kind"], "request");
    assert_eq!(l["method"], "GET");
    assert_eq!(l["status"], 200);
    assert_eq!(l["bytes_out"], 1234);
    assert_eq!(l["bytes_in"], 0);
    assert_eq!(l["sni"], "localhost");
    assert_eq!(l["host"], format!("localhost:{}", agent.port()));
    assert_eq!(l["tls_version"], "TLSv1.3");
    assert_eq!(l["http_version"], "HTTP/1.1");
    assert_eq!(l["handshake"], "full");
    assert_eq!(l["migrated"], false);
    assert_eq!(l["agent_id"], 7);
    assert_eq!(l["client_ip"], "127.0.0.1");
    assert!(l["cipher_suite"].as_str().unwrap().starts_with("TLS13_"));
    assert!(l["request_time"].as_f64().unwrap() >= 0.0);
    assert!(l["upstream"].is_null() && l["route"].is_null());
    assert!(l["time"].as_str().unwrap().ends_with('Z'));

    let l = by_path(&lines, "/bytes/10");
    assert_eq!(l["tls_version"], "TLSv1.2");
    assert!(l["cipher_suite"]
        .as_str()
        .unwrap()
        .starts_with("TLS_ECDHE_"));
    assert_eq!(l["bytes_out"], 10);

    let l = by_path(&lines, "/post");
    assert_eq!(
        (l["method"].as_str(), l["status"].as_u64()),
        (Some("POST"), Some(200))
    );
    assert_eq!(l["http_version"], "HTTP/2");
    assert_eq!(l["alpn"], "h2");
    assert_eq!(l["bytes_in"], 16);
    assert_eq!(l["bytes_out"], 1024);

    assert_eq!(by_path(&lines, "/missing")["status"], 404);
    assert_eq!(by_path(&lines, "/bytes/3")["handshake"], "full");
    assert_eq!(by_path(&lines, "/bytes/4")["handshake"], "resumed");

    let conns: Vec<_> = lines.iter().filter(|l| l["kind"] == "connection").collect();
    assert_eq!(conns.len(), 1, "{lines:#?}");
    let c = conns[0];
    assert!(c["path"].is_null() && c["status"].is_null(), "{c}");
    assert_eq!(c["sni"], "localhost");
    assert_eq!(c["handshake"], "resumed");
    assert!(c["connection_time"].as_f64().unwrap() >= 0.0);

    assert_eq!(agent.metric("baton_access_log_lines_total"), 7.0);
    assert_eq!(agent.metric("baton_access_log_dropped_total"), 0.0);
}

#[test]
fn text_lines_are_combined_like() {
    let pki = Pki::new();
    let dir = TempDir::new("access-text");
    let log = dir.path("access.log");
    let agent = Agent::serving(&pki, &["--access-log", path_str(&log)]);
    assert_eq!(
        curl_to(&agent, &pki, &["--http1.1"], "/bytes/99?q=x"),
        "200"
    );
    let lines = lines_of(&log, 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let l = &lines[0];
    // client, then the time in brackets, the request, status and body size
    assert!(l.starts_with("127.0.0.1 - - ["), "{l}");
    assert!(
        l.contains("] \"GET /bytes/99?q=x HTTP/1.1\" 200 99 "),
        "{l}"
    );
    let fields: BTreeMap<&str, &str> = l.split(' ').filter_map(|f| f.split_once('=')).collect();
    assert_eq!(fields["sni"], "localhost", "{l}");
    assert_eq!(fields["tls"], "TLSv1.3", "{l}");
    assert_eq!(fields["handshake"], "full", "{l}");
    assert_eq!(fields["migrated"], "-", "{l}");
    assert_eq!(fields["agent"], "0", "{l}");
    assert_eq!(fields["in"], "0", "{l}");
    assert_eq!(fields["upstream"], "-", "{l}");
    assert!(fields["rt"].parse::<f64>().is_ok(), "{l}");
}

/// Session migration (`baton up --policy handoff`): a connection whose session moved to its
/// home agent is logged there with the agent it came from; the agent that ran its handshake
/// and served nothing logs the connection alone.
#[test]
fn a_migrated_session_says_which_agent_it_came_from() {
    let dir = TempDir::new("access-migrated");
    let log = dir.path("access.log");
    let log_arg = format!("--agent-arg=--access-log={}", path_str(&log));
    let up = Up::handoff(&[&log_arg, "--agent-arg=--access-log-format=json"]);
    let port = up.addr().port();
    let resolve = format!("localhost:{port}:127.0.0.1");
    let mut requests = 0;
    // consecutive full handshakes alternate between the agents: some move home
    for i in 0..6 {
        let url = format!("https://localhost:{port}/bytes/5?c={i}");
        let out = curl(&[
            "--cacert",
            up.ca(),
            "--resolve",
            &resolve,
            "-o",
            "/dev/null",
            &url,
        ]);
        assert!(out.status.success(), "{}", text_of(&out));
        requests += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut lines = json_lines(&log, requests);
    let done = |lines: &[Value]| lines.iter().filter(|l| l["kind"] == "request").count();
    let moved_count = |lines: &[Value]| {
        lines
            .iter()
            .filter(|l| l["kind"] == "request" && l["migrated"] == true)
            .count()
    };
    let handed_on_count = |lines: &[Value]| {
        lines
            .iter()
            .filter(|l| l["kind"] == "connection" && l["migrated"] == false)
            .count()
    };
    // the handshake agent writes its connection's line when that connection ends, which can
    // be after the home agent has answered: wait for both
    while (done(&lines) < requests || handed_on_count(&lines) < moved_count(&lines))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
        lines = json_lines(&log, 0);
    }
    assert_eq!(done(&lines), requests, "{lines:#?}");
    let moved: Vec<_> = lines
        .iter()
        .filter(|l| l["kind"] == "request" && l["migrated"] == true)
        .collect();
    assert!(
        !moved.is_empty(),
        "no request on a migrated session: {lines:#?}"
    );
    for l in &moved {
        let (from, here) = (l["migrated_from"].as_u64(), l["agent_id"].as_u64());
        assert!(from.is_some() && from != here, "{l}");
        assert_eq!(l["sni"], "localhost", "{l}");
        assert_eq!(l["status"], 200, "{l}");
    }
    // each moved session's handshake agent logged the connection it handed on
    let handed_on = lines
        .iter()
        .filter(|l| l["kind"] == "connection" && l["migrated"] == false)
        .count();
    assert!(handed_on >= moved.len(), "{lines:#?}");
}

/// A client that leaves before its answer still gets its line, with nginx's 499.
#[test]
fn a_request_whose_client_left_is_logged_499() {
    // a backend that takes the request and never answers
    let stall = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("http://{}", stall.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        let (s, _) = stall.accept().unwrap();
        std::thread::sleep(Duration::from_secs(5));
        drop(s);
    });
    let pki = Pki::new();
    let dir = TempDir::new("access-gone");
    let log = dir.path("access.log");
    let agent = Agent::serving(
        &pki,
        &[
            "--upstream",
            &upstream,
            "--access-log",
            path_str(&log),
            "--access-log-format",
            "json",
        ],
    );
    assert_eq!(
        curl_to(&agent, &pki, &["--http1.1", "--max-time", "1"], "/slow"),
        "000"
    );
    let lines = json_lines(&log, 1);
    let l = by_path(&lines, "/slow");
    assert_eq!(l["status"], 499, "{l}");
    assert_eq!(l["bytes_out"], 0, "{l}");
    held.join().unwrap();
}

/// logrotate without copytruncate: the file is renamed, then the agent told (SIGUSR1). Lines
/// written between the two go to the renamed file; none may be lost or doubled.
#[test]
fn rename_and_sigusr1_lose_no_line() {
    const REQUESTS: usize = 300;
    let pki = Pki::new();
    let dir = TempDir::new("access-rotate");
    let log = dir.path("access.log");
    let rotated = dir.path("access.log.1");
    let agent = Agent::serving(
        &pki,
        &[
            "--access-log",
            path_str(&log),
            "--access-log-format",
            "json",
        ],
    );
    let config = Arc::new(pki.client(&[&rustls::version::TLS13], None));
    let addr = agent.addr;
    let client = std::thread::spawn(move || {
        let mut conn = KeepAlive::open(addr, &config);
        for i in 0..REQUESTS {
            let r = conn.get(&format!("/bytes/1?i={i}"));
            assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        }
    });
    // rotate while the requests flow (bounded wait for some lines first)
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines_of_now(&log) < REQUESTS / 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::rename(&log, &rotated).unwrap();
    agent.signal("USR1");
    client.join().unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let (mut old, mut new) = (0, 0);
    while Instant::now() < deadline {
        old = lines_of_now(&rotated);
        new = lines_of_now(&log);
        if old + new >= REQUESTS {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for file in [&rotated, &log] {
        for l in json_lines(file, 0) {
            *seen
                .entry(l["path"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
    }
    assert_eq!(seen.len(), REQUESTS, "every request logged");
    assert!(seen.values().all(|&n| n == 1), "no line twice");
    assert!(old > 0 && new > 0, "both files written: {old} then {new}");
    assert_eq!(agent.metric("baton_access_log_reopens_total"), 1.0);
    assert_eq!(agent.metric("baton_access_log_dropped_total"), 0.0);
}

/// Complete lines in the file now.
fn lines_of_now(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .matches('\n')
        .count()
}
