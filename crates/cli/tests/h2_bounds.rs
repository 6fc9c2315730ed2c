//! HTTP/2 slowloris and rapid reset against a real agent, from a real HTTP/2 client library
//! (Python's `h2`, driven by `h2_abuse.py` next to this file): a request head trickled after
//! the first request is cut at --header-timeout, a client that opens and cancels streams in a
//! loop is cut past --h2-max-resets; both are counted, and meanwhile a normal HTTP/2 client
//! (curl) gets every answer. And the keep-alive PINGs that bound a silent peer do not keep an
//! idle connection: it still gets its GOAWAY after --idle-timeout.
//!
//! Every wait is bounded well below the old behaviour it tells apart from the new (a trickled
//! head held for the 60 s idle timeout, restarted by each byte; resets never cut).

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use common::*;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h2_abuse.py");

/// Whether python3 with the `h2` package is there (`scripts/test` installs it); without it
/// the test skips, unless BATON_REQUIRE_SERVERS says it must not.
fn have_python_h2() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import h2"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("BATON_REQUIRE_SERVERS").is_none(),
            "python3 with the h2 package required (pip install h2)"
        );
        eprintln!("python3 h2 package not installed: skipping");
    }
    ok
}

/// Runs `h2_abuse.py MODE` against `agent`; its JSON report.
fn abuse(agent: &Agent, pki: &Pki, mode: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new("python3")
        .arg(SCRIPT)
        .args([
            mode,
            "127.0.0.1",
            &agent.port().to_string(),
            &pki.arg("ca.pem"),
        ])
        .args(args)
        .output()
        .expect("python3");
    let text = text_of(&out);
    assert!(out.status.success(), "h2_abuse.py {mode} failed:\n{text}");
    let line = String::from_utf8_lossy(&out.stdout);
    eprintln!("h2_abuse.py {mode}: {}", line.trim());
    serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// A normal HTTP/2 client in a loop until `stop`: curl, five requests per connection. Returns
/// how many requests it made and the failures (anything but a 200 over HTTP/2), with why.
fn normal_client(
    agent: &Agent,
    pki: &Pki,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<(u32, Vec<String>)> {
    let url = agent.url("/");
    let ca = pki.arg("ca.pem");
    thread::spawn(move || {
        let (mut made, mut failed) = (0, Vec::new());
        // bounded in count too, should `stop` never come
        for _ in 0..200 {
            if stop.load(Ordering::Relaxed) && made > 0 {
                break;
            }
            let urls = [url.as_str(); 5];
            let mut args = vec!["--http2", "--cacert", &ca];
            args.extend(["-w", "%{http_code} %{http_version}\\n"]);
            for u in &urls {
                args.extend(["-o", "/dev/null", u]);
            }
            let out = curl(&args);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let lines: Vec<&str> = text.lines().collect();
            made += urls.len() as u32;
            if !out.status.success()
                || lines.len() != urls.len()
                || lines.iter().any(|l| *l != "200 2")
            {
                failed.push(format!(
                    "{:?}: {text}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        (made, failed)
    })
}

fn cut(agent: &Agent, reason: &str) -> f64 {
    agent.metric(&format!(
        "baton_h2_connections_cut_total{{reason=\"{reason}\"}}"
    ))
}

/// A second request's HEADERS frame sent one byte a second used to hold the connection as
/// long as the bytes came (each restarted the idle timer): it is cut at --header-timeout now,
/// with a GOAWAY, and counted. Other clients are served meanwhile.
#[test]
fn a_trickled_h2_head_is_cut_at_the_header_timeout() {
    if !have_python_h2() {
        return;
    }
    let pki = Pki::new();
    let agent = Agent::serving(
        &pki,
        &[
            "--header-timeout",
            "3s",
            "--min-header-rate",
            "0",
            "--idle-timeout",
            "60s",
        ],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let normal = normal_client(&agent, &pki, stop.clone());
    // one byte a second for at most 20 s: the head (about 30 bytes) would complete after that
    let report = abuse(&agent, &pki, "trickle", &["1", "20"]);
    stop.store(true, Ordering::Relaxed);
    let (made, failed) = normal.join().unwrap();
    assert_eq!(report["status"], 200, "{report}");
    assert_eq!(
        report["closed"], true,
        "a trickled head kept its connection: {report}"
    );
    assert_eq!(report["goaway"], true, "closed without a GOAWAY: {report}");
    assert!(
        report["sent"].as_u64().unwrap() < report["head"].as_u64().unwrap(),
        "the whole head went out before the cut: {report}"
    );
    assert_eq!(cut(&agent, "header_timeout"), 1.0);
    assert_eq!(cut(&agent, "resets"), 0.0);
    assert!(
        failed.is_empty(),
        "{} of {made} normal requests failed: {failed:?}",
        failed.len()
    );
}

/// Streams opened and cancelled at once, a few per write (never enough at a time for hyper's
/// own cap on streams reset before they are accepted): the connection is cut once more than
/// --h2-max-resets were cancelled, with a GOAWAY, and counted. Other clients are served.
#[test]
fn rapid_reset_is_cut_past_the_budget() {
    if !have_python_h2() {
        return;
    }
    let pki = Pki::new();
    // the default budget (200 in 10 s): what ships is what is tested
    let agent = Agent::serving(&pki, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let normal = normal_client(&agent, &pki, stop.clone());
    let report = abuse(&agent, &pki, "reset", &["2000"]);
    stop.store(true, Ordering::Relaxed);
    let (made, failed) = normal.join().unwrap();
    assert_eq!(report["status"], 200, "{report}");
    assert_eq!(
        report["goaway"], true,
        "no GOAWAY for a rapid reset: {report}"
    );
    assert_eq!(
        report["closed"], true,
        "a rapid reset kept its connection: {report}"
    );
    assert!(
        report["opened"].as_u64().unwrap() < 2000,
        "all the streams went through before the cut: {report}"
    );
    assert_eq!(cut(&agent, "resets"), 1.0);
    assert!(
        failed.is_empty(),
        "{} of {made} normal requests failed: {failed:?}",
        failed.len()
    );
}

/// Keep-alive PINGs keep the bytes flowing both ways, which used to be all the idle timeout
/// looked at: a connection with no stream open still gets a GOAWAY after --idle-timeout, and
/// closes.
#[test]
fn keepalive_pings_do_not_keep_an_idle_h2_connection() {
    if !have_python_h2() {
        return;
    }
    let pki = Pki::new();
    let agent = Agent::serving(&pki, &["--idle-timeout", "3s", "--h2-keepalive", "1s"]);
    let report = abuse(&agent, &pki, "idle", &["20"]);
    assert_eq!(report["status"], 200, "{report}");
    assert!(
        report["pings"].as_u64().unwrap() >= 1,
        "no keep-alive PING: {report}"
    );
    assert_eq!(
        report["goaway"], true,
        "no GOAWAY for an idle connection: {report}"
    );
    assert_eq!(
        report["closed"], true,
        "an idle connection was kept: {report}"
    );
    // idle is not abuse
    assert_eq!(cut(&agent, "header_timeout") + cut(&agent, "resets"), 0.0);
}
