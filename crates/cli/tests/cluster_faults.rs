//! The cluster behind a real HAProxy (`mode tcp`, `balance roundrobin`), and under faults: an
//! agent killed mid-run, Redis stopped mid-run. Load from `baton bench`.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bench(url: &str, ca: &str, args: &[&str]) -> Child {
    Command::new(BATON)
        .args(["bench", url, "--ca", ca, "--sni", "localhost", "--quiet"])
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn finish(mut child: Child, json: &str) -> Value {
    let _ = child.wait();
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}

#[test]
fn behind_haproxy_round_robin_shared_sessions_need_only_the_clients_full_handshakes() {
    if !have_haproxy() {
        return;
    }
    // agents alone (no baton dispatcher), sharing sessions between peers
    let pki = Pki::new();
    let dir = TempDir::new("haproxy");
    let key = dir.arg("cluster.key");
    let tickets = dir.arg("ticket.key");
    for k in [&key, &tickets] {
        assert!(Command::new(BATON)
            .args(["ticket-key", "--out", k])
            .status()
            .unwrap()
            .success());
    }
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            let mut args = pki.server_args();
            args.extend([
                "--agent-id".into(),
                i.to_string(),
                "--store".into(),
                "peers".into(),
            ]);
            args.extend([
                "--cluster-key-file".into(),
                key.clone(),
                "--ticket-key-file".into(),
                tickets.clone(),
            ]);
            args.extend(["--peer-listen".into(), format!("127.0.0.1:{}", ports[i])]);
            for (j, p) in ports.iter().enumerate() {
                if j != i {
                    args.extend(["--peer".into(), format!("127.0.0.1:{p}")]);
                }
            }
            Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .collect();
    let front = free_port();
    let servers: String = agents
        .iter()
        .enumerate()
        .map(|(i, a)| format!("    server a{i} {}\n", a.addr))
        .collect();
    let cfg = format!(
        "global\n    maxconn 4096\ndefaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\
         frontend tls\n    bind 127.0.0.1:{front}\n    default_backend agents\nbackend agents\n    balance roundrobin\n{servers}"
    );
    std::fs::write(dir.path("haproxy.cfg"), cfg).unwrap();
    let _haproxy = Killed(
        Command::new("haproxy")
            .args(["-f", &dir.arg("haproxy.cfg"), "-db"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", front)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    std::thread::sleep(Duration::from_millis(300)); // peers connect
    for v in ["1.2", "1.3"] {
        let json = dir.arg(&format!("{v}.json"));
        let b = bench(
            &format!("https://127.0.0.1:{front}/"),
            &pki.arg("ca.pem"),
            &[
                "--connections",
                "3000",
                "-c",
                "30",
                "--requests-per-conn",
                "1",
                "--full-every",
                "3",
                "--tls-version",
                v,
                "--json",
                &json,
            ],
        );
        let j = finish(b, &json);
        assert_eq!(
            j["handshakes"]["full"].as_u64(),
            Some(1000),
            "TLS {v}: {}",
            j["handshakes"]
        );
        assert_eq!(j["requests"]["failed"].as_u64(), Some(0), "TLS {v}");
        let server_full: u64 = agents.iter().map(|a| a.handshakes(v, "full")).sum();
        assert_eq!(server_full, 1000, "TLS {v}: the agents agree");
    }
}

#[test]
fn killing_an_agent_mid_run_fails_only_its_open_connections() {
    let c = Up::start(&[
        "--agents",
        "3",
        "--policy",
        "round-robin",
        "--store",
        "peers",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let dir = TempDir::new("kill");
    let json = dir.arg("out.json");
    let url = format!("https://{}/", c.state["dispatcher"].as_str().unwrap());
    let b = bench(
        &url,
        c.state["ca"].as_str().unwrap(),
        &["-d", "3s", "-c", "10", "--rate", "400", "--json", &json],
    );
    std::thread::sleep(Duration::from_millis(1200));
    let victim = c.agent_pid(1);
    assert!(Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap()
        .success());
    let j = finish(b, &json);
    let ok = j["requests"]["ok"].as_u64().unwrap();
    let failed = j["requests"]["failed"].as_u64().unwrap();
    // at most the connections open on the victim when it died (one per client), plus those
    // routed to it in the instant before the dispatcher noticed
    assert!(ok > 1000, "the others kept serving: {}", j["requests"]);
    assert!(
        failed <= 20,
        "only in-flight connections fail: {} ({})",
        failed,
        j["errors"]
    );
}

#[test]
fn stopping_redis_mid_run_fails_nothing_and_counts_fallbacks() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let store = format!("redis={}", redis.url());
    // tickets are what TLS 1.3 resumes with; to exercise the store, sessions must be stateful
    let c = Up::start(&[
        "--agents",
        "3",
        "--policy",
        "round-robin",
        "--store",
        &store,
        "--agent-arg=--tickets=false",
    ]);
    let dir = TempDir::new("redis-stop");
    let json = dir.arg("out.json");
    let url = format!("https://{}/", c.state["dispatcher"].as_str().unwrap());
    let b = bench(
        &url,
        c.state["ca"].as_str().unwrap(),
        &[
            "-d",
            "3s",
            "-c",
            "10",
            "--rate",
            "300",
            "--tls-version",
            "1.2",
            "--json",
            &json,
        ],
    );
    std::thread::sleep(Duration::from_millis(1000));
    redis.stop();
    let j = finish(b, &json);
    assert_eq!(j["requests"]["failed"].as_u64(), Some(0), "{}", j["errors"]);
    assert!(j["requests"]["ok"].as_u64().unwrap() > 500);
    assert!(c.agents_sum("baton_session_store_events_total{event=\"fallback\"}", "") > 0.0);
    // before the outage sessions resumed across agents through Redis
    assert!(j["handshakes"]["resumed"].as_u64().unwrap() > 0);
}
