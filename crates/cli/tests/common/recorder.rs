//! `baton record` as the recorder tests drive it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{text_of, Agent, TempDir, BATON};

/// A running `baton record`: its proxy address, its CA certificate's path, what it printed on
/// stdout up to `ready`, and its stderr as it comes (the summary is printed there).
pub struct Recorder {
    pub child: Child,
    pub addr: SocketAddr,
    pub ca: PathBuf,
    pub stdout: String,
    pub stderr: Arc<Mutex<String>>,
}

impl Recorder {
    /// `baton record --listen 127.0.0.1:0 --out OUT --ca-dir CA_DIR ARGS`, once it is `ready`.
    pub fn start(ca_dir: &Path, out: &str, args: &[&str]) -> Recorder {
        let mut child = Command::new(BATON)
            .args([
                "record",
                "--listen",
                "127.0.0.1:0",
                "--out",
                out,
                "--ca-dir",
            ])
            .arg(ca_dir)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn baton record");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while err.read_line(&mut line).is_ok_and(|n| n > 0) {
                eprint!("record: {line}");
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut addr, mut ca, mut stdout) = (None, None, String::new());
        for line in lines.by_ref() {
            let line = line.unwrap();
            stdout.push_str(&line);
            stdout.push('\n');
            if let Some(rest) = line.strip_prefix("ca certificate ") {
                ca = rest.split_whitespace().next().map(PathBuf::from);
            } else if let Some(a) = line.strip_prefix("listening proxy ") {
                addr = Some(a.parse().unwrap());
            } else if line == "ready" {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Recorder {
            addr: addr.unwrap_or_else(|| panic!("no proxy address: {stdout}")),
            ca: ca.expect("the CA certificate's path is printed"),
            stdout,
            child,
            stderr,
        }
    }

    /// The proxy as curl and browsers take it.
    pub fn proxy(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits for the recording to end on its own (`--duration`, `--max-requests`).
    pub fn wait(&mut self, limit: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // the stderr reader finishes with the process
                std::thread::sleep(Duration::from_millis(100));
                return (s, self.stderr.lock().unwrap().clone());
            }
            assert!(Instant::now() < deadline, "baton record did not end");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ends the recording with SIGINT, as Ctrl-C does.
    pub fn interrupt(&mut self) -> (ExitStatus, String) {
        let ok = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        self.wait(Duration::from_secs(20))
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `baton bench` of a recorded `scenario` against `agent` (`conns` connections, one at a time,
/// no think time, `extra` flags), then its JSON result and what the agent served for it.
pub fn replay(
    agent: &Agent,
    ca: &str,
    scenario: &str,
    conns: u64,
    extra: &[&str],
    dir: &TempDir,
) -> (serde_json::Value, u64) {
    let before = agent.served();
    let json = dir.arg("replay.json");
    let url = format!("https://localhost:{}/", agent.port());
    let conns = conns.to_string();
    let out = Command::new(BATON)
        .args([
            "bench",
            &url,
            "--ca",
            ca,
            "--connections",
            &conns,
            "-c",
            "1",
        ])
        .args(["--scenario", scenario, "--think", "none"])
        .args(extra)
        .args(["--json", &json, "--quiet"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text_of(&out));
    let v = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (v, agent.served() - before)
}
