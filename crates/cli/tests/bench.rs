//! `baton bench` against real servers on 127.0.0.1: `baton agent` and `openssl s_server` (a
//! server nobody here wrote).

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

fn bench(args: &[&str], dir: &TempDir) -> (Output, Value) {
    let json = dir.arg(&format!("out-{}.json", rand_suffix()));
    let out = Command::new(BATON)
        .arg("bench")
        .args(args)
        .args(["--json", &json, "--quiet"])
        .output()
        .expect("run baton bench");
    let value = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    if !value.is_null() {
        // every run's JSON, whatever the test looks at next
        consistent(&value);
    }
    (out, value)
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn n(v: &Value, path: &str) -> u64 {
    path.split('.')
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

/// The JSON contract's fields exist and agree with each other.
fn consistent(v: &Value) {
    let attempted = n(v, "connections");
    let h = n(v, "handshakes.full") + n(v, "handshakes.resumed") + n(v, "handshakes.failed");
    let connect_errors = v["errors"]["connect"].as_u64().unwrap_or(0);
    assert_eq!(
        h + connect_errors,
        attempted,
        "every connection is counted once: {v}"
    );
    assert!(n(v, "handshakes.resume_refused") <= n(v, "handshakes.full"));
    // every request is answered well, answered badly, unanswered, or not sent because the
    // server closed the keep-alive connection first: never lost
    let k = n(v, "config.requests_per_conn");
    assert_eq!(
        n(v, "requests.ok") + n(v, "requests.failed") + n(v, "requests.unsent"),
        attempted * k,
        "every request is counted once: {v}"
    );
    let by_status: u64 = v["requests"]["by_status"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_u64().unwrap())
        .sum();
    assert!(by_status >= n(v, "requests.ok"));
    assert!(by_status <= attempted * k);
    // a transaction that failed has exactly one error class; one that completed has none
    let errors: u64 = v["errors"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_u64().unwrap())
        .sum();
    let completed = n(v, "latency_ms.total.count");
    assert_eq!(errors + completed, attempted, "{v}");
    // what was negotiated is known for every counted handshake, and only for those
    let negotiated: u64 = v["negotiated"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_u64().unwrap())
        .sum();
    assert_eq!(
        negotiated,
        n(v, "handshakes.full") + n(v, "handshakes.resumed"),
        "{v}"
    );
    for phase in ["connect", "handshake", "ttfb", "total"] {
        for k in ["p50", "p90", "p99", "p999", "max", "mean"] {
            assert!(
                v["latency_ms"][phase][k].is_number(),
                "latency_ms.{phase}.{k}"
            );
        }
        let counts = v["histograms"][phase]["counts"].as_array().unwrap();
        let total: u64 = counts.iter().map(|p| p[1].as_u64().unwrap()).sum();
        assert_eq!(total, n(v, &format!("latency_ms.{phase}.count")));
    }
    for k in ["tps", "rps", "bytes", "duration_s", "client_cpu_s"] {
        assert!(v[k].is_number(), "{k}");
    }
    assert!(v["config"]["clients"].is_number());
}

#[test]
fn exact_mix_against_baton_agent_agrees_with_the_servers_count() {
    let pki = Pki::new();
    let dir = TempDir::new("bench");
    let mut args = pki.server_args();
    args.extend(["--tickets".into(), "true".into()]);
    let agent = Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let metrics = format!("http://{}/metrics", agent.metrics);
    for v in ["1.2", "1.3"] {
        let (out, j) = bench(
            &[
                &agent.url("/"),
                "--ca",
                &pki.arg("ca.pem"),
                "--sni",
                "localhost",
                "--connections",
                "300",
                "-c",
                "10",
                "--requests-per-conn",
                "1",
                "--full-every",
                "3",
                "--tls-version",
                v,
                "--server-metrics",
                &metrics,
            ],
            &dir,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            (
                n(&j, "handshakes.full"),
                n(&j, "handshakes.resumed"),
                n(&j, "handshakes.resume_refused")
            ),
            (100, 200, 0),
            "TLS {v}"
        );
        assert_eq!(n(&j, "requests.ok"), 300);
        let server = &j["server"][&metrics];
        assert_eq!(
            server[format!("baton_handshakes_total{{version=\"{v}\",kind=\"full\"}}")].as_f64(),
            Some(100.0)
        );
        assert_eq!(
            server[format!("baton_handshakes_total{{version=\"{v}\",kind=\"resumed\"}}")].as_f64(),
            Some(200.0)
        );
    }
    // keep-alive: 3 requests per connection
    let (_, j) = bench(
        &[
            &agent.url("/bytes/100"),
            "--ca",
            &pki.arg("ca.pem"),
            "--sni",
            "localhost",
            "--connections",
            "20",
            "-c",
            "2",
            "--requests-per-conn",
            "3",
        ],
        &dir,
    );
    assert_eq!(n(&j, "requests.ok"), 60);
    assert!(n(&j, "bytes") >= 60 * 100);
    // HTTP/2
    let (_, j) = bench(
        &[
            &agent.url("/"),
            "--ca",
            &pki.arg("ca.pem"),
            "--sni",
            "localhost",
            "--connections",
            "20",
            "-c",
            "2",
            "--requests-per-conn",
            "2",
            "--alpn",
            "h2",
        ],
        &dir,
    );
    assert_eq!(n(&j, "requests.ok"), 40, "{j}");
    // --resume none: all full
    let (_, j) = bench(
        &[
            &agent.url("/"),
            "--insecure",
            "-n",
            "60",
            "-c",
            "6",
            "--resume",
            "none",
        ],
        &dir,
    );
    assert_eq!(
        (n(&j, "handshakes.full"), n(&j, "handshakes.resumed")),
        (60, 0)
    );
    // TLS 1.2 session ids only
    let (_, j) = bench(
        &[
            &agent.url("/"),
            "--insecure",
            "-n",
            "30",
            "-c",
            "3",
            "--tls-version",
            "1.2",
            "--resume",
            "id",
        ],
        &dir,
    );
    assert_eq!(
        (n(&j, "handshakes.full"), n(&j, "handshakes.resumed")),
        (10, 20)
    );
}

#[test]
fn resumption_refused_by_the_server_is_full_and_flagged() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-refused");
    let mut args = pki.server_args();
    args.extend(["--tickets", "false", "--session-cache-size", "0"].map(String::from));
    let agent = Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    for v in ["1.2", "1.3"] {
        let (_, j) = bench(
            &[
                &agent.url("/"),
                "--insecure",
                "-n",
                "30",
                "-c",
                "3",
                "--tls-version",
                v,
            ],
            &dir,
        );
        // TLS 1.2 clients offer nothing without a ticket or an id; TLS 1.3 gets no tickets
        assert_eq!(n(&j, "handshakes.full"), 30, "{v}");
        assert_eq!(n(&j, "handshakes.resumed"), 0, "{v}");
    }
    // a server that issues tickets it cannot open: every resumption attempt is refused
    let mut args = pki.server_args();
    args.extend(["--tickets", "true", "--session-cache-size", "0"].map(String::from));
    let a = Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let b = Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // a TCP relay alternating between a and b: tickets from one are refused by the other
    let relay = alternate(&[a.addr, b.addr]);
    let url = format!("https://127.0.0.1:{}/", relay.port());
    let (_, j) = bench(
        &[
            &url,
            "--insecure",
            "-n",
            "30",
            "-c",
            "1",
            "--full-every",
            "3",
            "--tls-version",
            "1.3",
        ],
        &dir,
    );
    assert_eq!(n(&j, "handshakes.full"), 30, "{j}");
    assert_eq!(n(&j, "handshakes.resume_refused"), 20, "{j}");
}

/// A minimal TCP relay sending each new connection to the next backend in turn.
fn alternate(backends: &[std::net::SocketAddr]) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let backends = backends.to_vec();
    std::thread::spawn(move || {
        for (i, conn) in listener.incoming().enumerate() {
            let Ok(client) = conn else { continue };
            let Ok(server) = std::net::TcpStream::connect(backends[i % backends.len()]) else {
                continue;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    addr
}

struct SServer(Child, u16);

impl Drop for SServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn s_server(pki: &Pki, extra: &[&str]) -> SServer {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("openssl")
        .args([
            "s_server",
            "-accept",
            &format!("127.0.0.1:{port}"),
            "-cert",
            &pki.arg("ecdsa.pem"),
            "-key",
            &pki.arg("ecdsa.key"),
            "-quiet",
        ])
        // a status page for every GET, unless the test asks for another mode
        .args((!extra.contains(&"-rev")).then_some("-www"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_server");
    wait_for_port(port);
    SServer(child, port)
}

#[test]
fn exact_mix_against_openssl_s_server() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-ossl");
    for v in ["1.2", "1.3"] {
        let server = s_server(&pki, &[]);
        let url = format!("https://127.0.0.1:{}/", server.1);
        let (out, j) = bench(
            &[
                &url,
                "--ca",
                &pki.arg("ca.pem"),
                "--sni",
                "localhost",
                "--connections",
                "300",
                "-c",
                "10",
                "--requests-per-conn",
                "1",
                "--full-every",
                "3",
                "--tls-version",
                v,
            ],
            &dir,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            (
                n(&j, "handshakes.full"),
                n(&j, "handshakes.resumed"),
                n(&j, "requests.ok")
            ),
            (100, 200, 300),
            "TLS {v}: {j}"
        );
        let version = format!("TLSv1_{}", &v[2..]);
        assert!(
            j["negotiated"]
                .as_object()
                .unwrap()
                .keys()
                .all(|k| k.starts_with(&version)),
            "TLS {v}: {j}"
        );
    }
    // resumption disabled on the server: every attempt is refused, and says so
    let server = s_server(&pki, &["-no_ticket", "-no_cache", "-num_tickets", "0"]);
    let url = format!("https://127.0.0.1:{}/", server.1);
    let (_, j) = bench(
        &[
            &url,
            "--insecure",
            "-n",
            "30",
            "-c",
            "3",
            "--tls-version",
            "1.2",
        ],
        &dir,
    );
    assert_eq!(n(&j, "handshakes.resumed"), 0, "{j}");
    assert_eq!(n(&j, "handshakes.full"), 30);
    drop(server);
    // two servers behind a relay that alternates between them: each refuses the other's
    // sessions (ids and tickets), so every resumption attempt is refused, and says so
    for v in ["1.2", "1.3"] {
        let a = s_server(&pki, &[]);
        let b = s_server(&pki, &[]);
        let relay = alternate(&[
            format!("127.0.0.1:{}", a.1).parse().unwrap(),
            format!("127.0.0.1:{}", b.1).parse().unwrap(),
        ]);
        let (_, j) = bench(
            &[
                &format!("https://127.0.0.1:{}/", relay.port()),
                "--insecure",
                "-n",
                "30",
                "-c",
                "1",
                "--full-every",
                "3",
                "--tls-version",
                v,
            ],
            &dir,
        );
        assert_eq!(
            (
                n(&j, "handshakes.full"),
                n(&j, "handshakes.resumed"),
                n(&j, "handshakes.resume_refused"),
                n(&j, "requests.ok")
            ),
            (30, 0, 20, 30),
            "TLS {v}: {j}"
        );
    }
}

#[test]
fn mutual_tls_against_openssl_s_server() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-ossl-mtls");
    for v in ["1.2", "1.3"] {
        let server = s_server(
            &pki,
            &["-Verify", "1", "-CAfile", &pki.arg("client-ca.pem")],
        );
        let url = format!("https://127.0.0.1:{}/", server.1);
        let (out, j) = bench(
            &[
                &url,
                "--ca",
                &pki.arg("ca.pem"),
                "--sni",
                "localhost",
                "-n",
                "9",
                "-c",
                "3",
                "--tls-version",
                v,
                "--cert",
                &pki.arg("client.pem"),
                "--key",
                &pki.arg("client.key"),
            ],
            &dir,
        );
        assert!(out.status.success(), "TLS {v}: {j}");
        assert_eq!(
            (
                n(&j, "requests.ok"),
                n(&j, "handshakes.full"),
                n(&j, "handshakes.resumed")
            ),
            (9, 3, 6),
            "TLS {v}: {j}"
        );
        // no certificate: refused by the server, a TLS error, no success
        let (out, j) = bench(
            &[&url, "--insecure", "-n", "4", "-c", "1", "--tls-version", v],
            &dir,
        );
        assert_eq!(out.status.code(), Some(1), "TLS {v}: {j}");
        assert_eq!(j["errors"]["tls"].as_u64(), Some(4), "TLS {v}: {j}");
        assert_eq!(n(&j, "handshakes.failed"), 4, "TLS {v}: {j}");
    }
}

#[test]
fn mutual_tls_and_failures_are_classified_never_counted_as_success() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-mtls");
    let mut args = pki.server_args();
    args.extend([
        "--client-ca".into(),
        pki.arg("client-ca.pem"),
        "--client-auth".into(),
        "required".into(),
    ]);
    let agent = Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let (out, j) = bench(
        &[
            &agent.url("/tls"),
            "--ca",
            &pki.arg("ca.pem"),
            "--sni",
            "localhost",
            "-n",
            "12",
            "-c",
            "3",
            "--cert",
            &pki.arg("client.pem"),
            "--key",
            &pki.arg("client.key"),
        ],
        &dir,
    );
    assert!(out.status.success());
    assert_eq!(n(&j, "requests.ok"), 12);
    // without a client certificate: TLS 1.3 clients learn of the refusal after the handshake,
    // TLS 1.2 ones during it; either way no request succeeds and the failures are classified
    for v in ["1.2", "1.3"] {
        let (out, j) = bench(
            &[
                &agent.url("/"),
                "--insecure",
                "-n",
                "6",
                "-c",
                "2",
                "--tls-version",
                v,
            ],
            &dir,
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "TLS {v}: a run with no success exits 1"
        );
        assert_eq!(n(&j, "requests.ok"), 0, "{j}");
        let errors: u64 = j["errors"]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_u64().unwrap())
            .sum();
        assert_eq!(errors, 6, "TLS {v}: {j}");
        // TLS 1.3 included: the server's alert after the client's Finished is a TLS failure
        // and the handshake is not counted as done
        assert_eq!(j["errors"]["tls"].as_u64(), Some(6), "TLS {v}: {j}");
        assert_eq!(
            (n(&j, "handshakes.failed"), n(&j, "handshakes.full")),
            (6, 0),
            "TLS {v}: {j}"
        );
        assert_eq!(n(&j, "requests.failed"), 6);
    }
    // nobody listening: connect errors
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (out, j) = bench(
        &[
            &format!("https://127.0.0.1:{port}/"),
            "--insecure",
            "-n",
            "5",
            "-c",
            "1",
        ],
        &dir,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(j["errors"]["connect"].as_u64(), Some(5));
    assert!(
        j["error_examples"]["connect"]
            .as_str()
            .is_some_and(|e| e.contains("refused")),
        "{j}"
    );
    // a source address this host does not have: the bind fails, a connect error
    let (out, j) = bench(
        &[
            &agent.url("/"),
            "--insecure",
            "-n",
            "3",
            "-c",
            "1",
            "--source-ip",
            "192.0.2.1",
        ],
        &dir,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(j["errors"]["connect"].as_u64(), Some(3), "{j}");
    // an untrusted server certificate is a TLS error, not a success
    let (_, j) = bench(
        &[
            &agent.url("/"),
            "--ca",
            &pki.arg("client-ca.pem"),
            "--sni",
            "localhost",
            "-n",
            "3",
            "-c",
            "1",
        ],
        &dir,
    );
    assert_eq!(j["errors"]["tls"].as_u64(), Some(3), "{j}");
    assert_eq!(n(&j, "handshakes.failed"), 3);
    // bad flags: a clear error, exit 2
    let out = Command::new(BATON)
        .args(["bench", "https://x/", "--resume", "maybe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--resume `maybe`"));
}

#[test]
fn open_loop_rate_and_source_ips() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-rate");
    let agent = Agent::serving(&pki, &[]);
    let (_, j) = bench(
        &[
            &agent.url("/tls"),
            "--insecure",
            "-d",
            "1s",
            "--rate",
            "100",
            "-c",
            "4",
            "--source-ip",
            "127.0.0.2",
            "--source-ip",
            "127.0.0.3",
        ],
        &dir,
    );
    let done = n(&j, "requests.ok");
    assert!(
        (80..=101).contains(&done),
        "about 100 transactions in 1 s at 100/s: {done}"
    );
    assert_eq!(j["config"]["rate"].as_f64(), Some(100.0));
    // a rate one client cannot keep up with: each transaction's latency counts from when it
    // was due, so the last ones carry the whole backlog (coordinated omission corrected),
    // while each phase still shows only its own time
    let (_, j) = bench(
        &[
            &agent.url("/"),
            "--insecure",
            "--resume",
            "none",
            "-n",
            "300",
            "--rate",
            "5000",
            "-c",
            "1",
        ],
        &dir,
    );
    let took_ms = j["duration_s"].as_f64().unwrap() * 1000.0;
    let scheduled_ms = 300.0 / 5000.0 * 1000.0;
    let max = |phase: &str| j["latency_ms"][phase]["max"].as_f64().unwrap();
    assert!(
        took_ms > 2.0 * scheduled_ms,
        "one client kept up with 5000/s? {j}"
    );
    assert!(
        max("total") > 0.8 * (took_ms - scheduled_ms),
        "the backlog is in the total latency: {j}"
    );
    let p50 = |phase: &str| j["latency_ms"][phase]["p50"].as_f64().unwrap();
    assert!(p50("handshake") < max("total") / 4.0, "{j}");
    // a TOML config with flags overriding it
    let file = dir.path("bench.toml");
    std::fs::write(
        &file,
        format!(
            "url = \"{}\"\ninsecure = true\nconnections = 9\nclients = 3\n",
            agent.url("/")
        ),
    )
    .unwrap();
    let (_, j) = bench(&["--config", file.to_str().unwrap(), "-n", "12"], &dir);
    assert_eq!(n(&j, "connections"), 12);
}

#[test]
fn a_tls_server_that_does_not_speak_http_is_an_http_error() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-rev");
    // `-rev` answers each line with the line reversed: TLS is fine, HTTP is not
    let server = s_server(&pki, &["-rev"]);
    let (out, j) = bench(
        &[
            &format!("https://127.0.0.1:{}/", server.1),
            "--insecure",
            "-n",
            "6",
            "-c",
            "2",
            "--timeout",
            "2s",
        ],
        &dir,
    );
    assert_eq!(out.status.code(), Some(1), "{j}");
    assert_eq!(j["errors"]["http"].as_u64(), Some(6), "{j}");
    // the handshakes happened and count as such
    assert_eq!(
        (n(&j, "handshakes.full"), n(&j, "handshakes.resumed")),
        (2, 4),
        "{j}"
    );
    assert_eq!(n(&j, "requests.failed"), 6);
}

/// A TCP server on 127.0.0.1 that treats every connection with `behave`.
fn misbehaving(behave: fn(std::net::TcpStream)) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || behave(conn));
        }
    });
    format!("https://127.0.0.1:{port}/")
}

#[test]
fn misbehaving_servers_are_classified_not_counted() {
    use std::io::{Read, Write};
    let dir = TempDir::new("bench-bad");
    let run = |url: &str| {
        let (out, j) = bench(
            &[
                url,
                "--insecure",
                "-n",
                "4",
                "-c",
                "2",
                "--timeout",
                "300ms",
            ],
            &dir,
        );
        assert_eq!(out.status.code(), Some(1), "{j}");
        assert_eq!(n(&j, "requests.ok"), 0, "{j}");
        assert_eq!(n(&j, "handshakes.failed"), 4, "{j}");
        j
    };
    // not TLS at all
    let j = run(&misbehaving(|mut s| {
        let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
        std::thread::sleep(Duration::from_millis(500));
    }));
    assert_eq!(j["errors"]["tls"].as_u64(), Some(4), "{j}");
    // hangs up on the ClientHello
    let j = run(&misbehaving(|mut s| {
        let _ = s.read(&mut [0u8; 512]);
    }));
    assert_eq!(j["errors"]["tls"].as_u64(), Some(4), "{j}");
    // accepts and says nothing
    let j = run(&misbehaving(|s| {
        std::thread::sleep(Duration::from_secs(2));
        drop(s);
    }));
    assert_eq!(j["errors"]["timeout"].as_u64(), Some(4), "{j}");
}

#[test]
fn tls_knobs_are_what_gets_negotiated() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-knobs");
    let server = s_server(&pki, &[]);
    let url = format!("https://127.0.0.1:{}/", server.1);
    let negotiated = |extra: &[&str]| {
        let mut args = vec![url.as_str(), "--insecure", "-n", "3", "-c", "1"];
        args.extend(extra);
        let (out, j) = bench(&args, &dir);
        assert!(out.status.success(), "{extra:?}: {j}");
        let map = j["negotiated"].as_object().unwrap().clone();
        map.keys().cloned().collect::<Vec<_>>()
    };
    // resumed TLS 1.3 handshakes still exchange keys (psk_dhe_ke): one combination
    assert_eq!(
        negotiated(&[
            "--tls-version",
            "1.3",
            "--suite",
            "TLS_CHACHA20_POLY1305_SHA256",
            "--group",
            "secp256r1"
        ]),
        ["TLSv1_3 TLS13_CHACHA20_POLY1305_SHA256 secp256r1"]
    );
    // TLS 1.2: the resumptions have no key exchange. (OpenSSL also wants the curve of its
    // ECDSA certificate among the client's groups in TLS 1.2, hence secp256r1 as well.)
    assert_eq!(
        negotiated(&[
            "--tls-version",
            "1.2",
            "--suite",
            "ECDHE-ECDSA-AES128-GCM-SHA256",
            "--group",
            "x25519",
            "--group",
            "secp256r1"
        ]),
        [
            "TLSv1_2 TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 -",
            "TLSv1_2 TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 X25519"
        ]
    );
    // only RSA signatures accepted from an ECDSA server: no handshake succeeds
    let (_, j) = bench(
        &[
            &url,
            "--insecure",
            "-n",
            "2",
            "-c",
            "1",
            "--sigalg",
            "rsa_pss_rsae_sha256",
        ],
        &dir,
    );
    assert_eq!(j["errors"]["tls"].as_u64(), Some(2), "{j}");
    // and the run says why
    assert!(
        j["error_examples"]["tls"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{j}"
    );
    // and a suite the engine does not speak is a clear error before anything runs
    let out = Command::new(BATON)
        .args(["bench", &url, "--insecure", "--suite", "RC4-MD5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--suite `RC4-MD5`"));
}
