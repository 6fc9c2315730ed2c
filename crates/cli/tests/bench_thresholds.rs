//! `baton bench` in CI, against a real `baton agent`: `--threshold` verdicts and exit codes,
//! `-n` counting requests as h2load's does, `-m` HTTP/2 streams in flight, and `--metrics`
//! scraped during a run.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// `baton bench ARGS --json FILE` (with the summary on stdout): its output and JSON.
fn bench(args: &[&str], dir: &TempDir, name: &str) -> (Output, Value) {
    let json = dir.arg(name);
    let out = Command::new(BATON)
        .arg("bench")
        .args(args)
        .args(["--json", &json])
        .output()
        .expect("run baton bench");
    let value = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    (out, value)
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn thresholds_that_pass_exit_0_and_one_crossed_exits_1_naming_it() {
    let pki = Pki::new();
    let dir = TempDir::new("thresholds");
    let agent = Agent::serving(&pki, &[]);
    let url = agent.url("/");
    let base = [url.as_str(), "--insecure", "-n", "40", "-c", "2"];
    let (out, j) = bench(
        &[
            &base[..],
            &[
                "--threshold",
                "p99<60s",
                "--threshold",
                "handshake.p50 <= 30s",
                "--threshold",
                "failed<1%",
                "--threshold",
                "handshakes_per_sec>0",
            ],
        ]
        .concat(),
        &dir,
        "pass.json",
    );
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let verdicts = j["thresholds"].as_array().expect("thresholds in the JSON");
    assert_eq!(verdicts.len(), 4, "{j}");
    for v in verdicts {
        assert_eq!(v["passed"], Value::Bool(true), "{v}");
        assert!(v["measured"].is_number(), "{v}");
    }
    assert_eq!(verdicts[0]["threshold"], "request.p99<60000ms");
    assert_eq!(verdicts[2]["measured"].as_f64(), Some(0.0));
    assert!(
        stdout(&out).contains("passed   failed<1%"),
        "{}",
        stdout(&out)
    );

    // a request never takes under a microsecond: crossed, whatever the machine's speed
    let (out, j) = bench(
        &[
            &base[..],
            &["--threshold", "failed<1%", "--threshold", "p99<1us"],
        ]
        .concat(),
        &dir,
        "crossed.json",
    );
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("CROSSED  request.p99<0.001ms"), "{text}");
    assert!(text.contains("passed   failed<1%"), "{text}");
    assert_eq!(j["thresholds"][1]["passed"], Value::Bool(false), "{j}");
    assert!(j["thresholds"][1]["measured"].as_f64().unwrap() > 0.001);
    // the run itself was fine: only the threshold failed it
    assert_eq!(n(&j, "requests.ok"), 40);

    // a merge of runs is judged the same way
    let merged = Command::new(BATON)
        .args([
            "bench",
            "merge",
            &dir.arg("pass.json"),
            &dir.arg("crossed.json"),
        ])
        .args(["--threshold", "failed<=0", "--threshold", "tps>1e12"])
        .output()
        .unwrap();
    assert_eq!(code(&merged), 1, "{}", stderr(&merged));
    assert!(stdout(&merged).contains("CROSSED  tps>1000000000000/s"));
}

#[test]
fn a_bad_threshold_is_a_usage_error_naming_its_bad_part() {
    let dir = TempDir::new("thresholds-bad");
    // nothing listens there: the expression is refused before any connection
    for (expr, says) in [
        ("p99<200", "`200` is not a latency"),
        ("latency<1ms", "unknown metric `latency`"),
        ("p99=1ms", "no comparator"),
        ("failed<150%", "more than 100%"),
    ] {
        let out = Command::new(BATON)
            .args([
                "bench",
                "https://127.0.0.1:9/",
                "--insecure",
                "--threshold",
                expr,
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 2, "{expr}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(says) && err.contains("--threshold"),
            "{expr}: {err}"
        );
    }
    // the same in a config file
    let file = dir.path("bench.toml");
    std::fs::write(
        &file,
        "url = \"https://127.0.0.1:9/\"\ninsecure = true\nthreshold = [\"p99<fast\"]\n",
    )
    .unwrap();
    let out = Command::new(BATON)
        .args(["bench", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("`fast`"), "{}", stderr(&out));
}

#[test]
fn n_counts_requests_as_h2load_does() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-n");
    let agent = Agent::serving(&pki, &[]);
    let url = agent.url("/");
    let before = agent.metric("baton_connections_total");
    let (out, j) = bench(
        &[
            &url,
            "--insecure",
            "-n",
            "40",
            "-c",
            "2",
            "--requests-per-conn",
            "4",
        ],
        &dir,
        "n.json",
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(n(&j, "requests.ok"), 40, "{j}");
    assert_eq!(n(&j, "connections"), 10, "{j}");
    assert_eq!(agent.metric("baton_connections_total") - before, 10.0);
    // what -n meant before, where it differs, is said
    assert!(
        stderr(&out).contains("-n 40 counts requests"),
        "{}",
        stderr(&out)
    );
    // not a whole number of connections: refused, not rounded
    let (out, _) = bench(
        &[&url, "--insecure", "-n", "10", "--requests-per-conn", "4"],
        &dir,
        "bad.json",
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("multiple of 4"), "{}", stderr(&out));
}

/// A plain HTTP/1.1 upstream that counts the requests it holds at once and holds each one
/// until `want` are in at the same time (then never again), or for `hold` at most: a client
/// that sends its requests one after the other shows a peak of 1.
struct Gate {
    addr: SocketAddr,
    peak: Arc<AtomicUsize>,
}

impl Gate {
    fn start(want: usize, hold: Duration) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peak = Arc::new(AtomicUsize::new(0));
        let now = Arc::new(AtomicUsize::new(0));
        let p = peak.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (p, now) = (p.clone(), now.clone());
                std::thread::spawn(move || serve_gated(conn, &now, &p, want, hold));
            }
        });
        Gate { addr, peak }
    }

    fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

fn serve_gated(
    mut c: TcpStream,
    now: &AtomicUsize,
    peak: &AtomicUsize,
    want: usize,
    hold: Duration,
) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // requests without bodies (GET): a head ends each
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match c.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        buf.drain(..end);
        let in_now = now.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(in_now, Ordering::SeqCst);
        let until = Instant::now() + hold;
        while peak.load(Ordering::SeqCst) < want && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        now.fetch_sub(1, Ordering::SeqCst);
        if c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}

#[test]
fn m_sends_a_connections_requests_as_concurrent_http2_streams() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-m");
    let gate = Gate::start(4, Duration::from_secs(2));
    let upstream = format!("--upstream=http://{}", gate.addr);
    let agent = Agent::serving(&pki, &[&upstream]);
    let url = agent.url("/");
    let connections = agent.metric("baton_connections_total");
    let requests = agent.metric("baton_http_requests_total{code=\"2xx\"}");
    let (out, j) = bench(
        &[
            &url,
            "--insecure",
            "--alpn",
            "h2",
            "-m",
            "4",
            "-c",
            "1",
            "-n",
            "16",
            "--requests-per-conn",
            "8",
        ],
        &dir,
        "m.json",
    );
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert_eq!(n(&j, "requests.ok"), 16, "{j}");
    assert_eq!(n(&j, "config.streams"), 4, "{j}");
    // two connections carried sixteen streams, four of them at once
    assert_eq!(agent.metric("baton_connections_total") - connections, 2.0);
    assert_eq!(
        agent.metric("baton_http_requests_total{code=\"2xx\"}") - requests,
        16.0
    );
    assert_eq!(
        gate.peak(),
        4,
        "streams in flight at once, as the upstream saw them"
    );
    // -m is HTTP/2's
    let (out, _) = bench(&[&url, "--insecure", "-m", "4"], &dir, "h1.json");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--alpn h2"), "{}", stderr(&out));
}

#[test]
fn metrics_scraped_during_a_run_show_rising_counters() {
    let pki = Pki::new();
    let agent = Agent::serving(&pki, &[]);
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut child = Command::new(BATON)
        .args([
            "bench",
            &agent.url("/"),
            "--insecure",
            "-d",
            "6s",
            "-c",
            "2",
            "--quiet",
        ])
        .args(["--metrics", &addr.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ok = |page: &str| series_value(page, "baton_bench_requests_total{result=\"ok\"}");
    let started = Instant::now();
    let first = loop {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no live metrics with requests at {addr}"
        );
        if let Ok(page) = baton_bench::scrape::page_blocking(addr) {
            if ok(&page) > 0.0 {
                break page;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let later = loop {
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "the counters did not rise during the run"
        );
        std::thread::sleep(Duration::from_millis(100));
        let page = metrics_page(addr);
        if ok(&page) > ok(&first) {
            break page;
        }
    };
    for series in [
        "baton_bench_handshakes_total{kind=\"full\"}",
        "baton_bench_transactions_total",
        "baton_bench_request_duration_seconds_count",
    ] {
        assert!(series_value(&later, series) > 0.0, "{series} in\n{later}");
    }
    assert!(series_value(&later, "baton_bench_handshakes_total{kind=\"failed\"}") == 0.0);
    // each virtual client holds at most one connection
    assert!(
        series_value(&later, "baton_bench_connections_open") <= 2.0,
        "{later}"
    );
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");
}
