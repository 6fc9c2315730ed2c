//! Live membership of `baton dispatch` (real processes): agents named by id in an agents file
//! that is watched and re-read on SIGHUP, and an admin endpoint that lists, adds, drains,
//! disables and removes them while clients are served.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustls::version::TLS13;

/// Agents with ids `ids`, each with its own ticket keys (so the handshakes counted at each
/// show where every connection went).
fn agents(pki: &Pki, ids: &[u16]) -> Vec<Agent> {
    ids.iter()
        .map(|id| Agent::serving(pki, &["--agent-id", &id.to_string()]))
        .collect()
}

fn handshakes(a: &Agent) -> u64 {
    a.handshakes("1.3", "full") + a.handshakes("1.3", "resumed")
}

fn entry(id: u16, a: &Agent, state: &str) -> String {
    format!(
        "[[agent]]\nid = {id}\naddr = \"{}\"\nstate = \"{state}\"\n\n",
        a.addr
    )
}

/// `n` agents with ids 0..n serving on links authenticated with `cluster_key`, plus `extra`.
fn linked_agents(pki: &Pki, n: u16, cluster_key: &str, extra: &[&str]) -> Vec<Agent> {
    (0..n)
        .map(|id| {
            let id = id.to_string();
            let mut args = vec![
                "--agent-id",
                &id,
                "--link-listen",
                "127.0.0.1:0",
                "--cluster-key-file",
                cluster_key,
            ];
            args.extend_from_slice(extra);
            Agent::serving(pki, &args)
        })
        .collect()
}

/// The agents the admin endpoint lists: (id, state, up).
fn listed(addr: SocketAddr) -> Vec<(u64, String, bool)> {
    let (status, body) = admin_request(addr, "GET", "/agents", None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["id"].as_u64().unwrap(),
                a["state"].as_str().unwrap().to_string(),
                a["up"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Sends `n` fresh connections through the dispatcher; each must be served.
fn serve(d: &Dispatcher, config: &Arc<rustls::ClientConfig>, n: usize) {
    for i in 0..n {
        let r = fetch(d, config, "/").unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(r.status, 200);
    }
}

/// Polls `check` for up to `limit`.
fn within(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    check()
}

/// A keep-alive TLS connection through the dispatcher: one request at a time.
struct KeepAlive(rustls::StreamOwned<rustls::ClientConnection, TcpStream>);

impl KeepAlive {
    fn open(d: &Dispatcher, config: &Arc<rustls::ClientConfig>) -> KeepAlive {
        let tcp = TcpStream::connect(d.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let conn =
            rustls::ClientConnection::new(config.clone(), "localhost".try_into().unwrap()).unwrap();
        KeepAlive(rustls::StreamOwned::new(conn, tcp))
    }

    fn get(&mut self) -> u16 {
        self.0
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        read_http_response(&mut self.0)[9..12].parse().unwrap()
    }
}

#[test]
fn the_admin_endpoint_adds_drains_and_removes_agents_under_traffic() {
    let pki = Pki::new();
    let a = agents(&pki, &[0, 7]);
    let dir = TempDir::new("membership-admin");
    std::fs::write(dir.path("agents.toml"), entry(0, &a[0], "active")).unwrap();
    let (d, admin_addr) =
        Dispatcher::with_admin(&dir.arg("agents.toml"), &["--policy", "round-robin"]);
    let config = Arc::new(pki.client(&[&TLS13], None));

    serve(&d, &config, 4);
    assert_eq!((handshakes(&a[0]), handshakes(&a[1])), (4, 0));
    assert_eq!(listed(admin_addr), vec![(0, "active".into(), true)]);

    // agent 7 joins through the admin endpoint and takes new handshakes at once
    let body = format!("{{\"id\": 7, \"addr\": \"{}\"}}", a[1].addr);
    let (status, text) = admin_request(admin_addr, "POST", "/agents", Some(&body));
    assert_eq!(status, 201, "{text}");
    let joined = Instant::now();
    serve(&d, &config, 4);
    assert!(handshakes(&a[1]) >= 1, "agent 7 took no handshake");
    assert!(joined.elapsed() < Duration::from_secs(5));
    assert_eq!(
        d.metric("baton_dispatch_agent_up{agent=\"7\"}"),
        1.0,
        "series are labelled by id"
    );
    // the same id twice, an unknown agent, a bad body: refused, roster unchanged
    assert_eq!(
        admin_request(admin_addr, "POST", "/agents", Some(&body)).0,
        409
    );
    assert_eq!(
        admin_request(admin_addr, "POST", "/agents/3/drain", None).0,
        404
    );
    assert_eq!(
        admin_request(admin_addr, "POST", "/agents", Some("{\"id\": 1}")).0,
        400
    );
    assert_eq!(listed(admin_addr).len(), 2);

    // drain agent 0 with a keep-alive client on it: no new clients there, and the
    // established one is served to the end
    let mut kept = None;
    for _ in 0..4 {
        let before = handshakes(&a[0]);
        let mut k = KeepAlive::open(&d, &config);
        assert_eq!(k.get(), 200);
        if handshakes(&a[0]) > before {
            kept = Some(k);
            break;
        }
    }
    let mut kept = kept.expect("round robin put a client on agent 0");
    assert_eq!(
        admin_request(admin_addr, "POST", "/agents/0/drain", None).0,
        200
    );
    let on_zero = handshakes(&a[0]);
    serve(&d, &config, 6);
    assert_eq!(
        handshakes(&a[0]),
        on_zero,
        "a draining agent got new clients"
    );
    for _ in 0..3 {
        assert_eq!(
            kept.get(),
            200,
            "an established stream on the draining agent"
        );
    }
    let (_, text) = admin_request(admin_addr, "GET", "/agents", None);
    assert!(text.contains("\"state\": \"draining\""), "{text}");
    assert!(text.contains("\"drained\": false"), "{text}");
    drop(kept);
    assert!(
        within(Duration::from_secs(5), || {
            admin_request(admin_addr, "GET", "/agents", None)
                .1
                .contains("\"drained\": true")
        }),
        "agent 0 never reported drained"
    );

    // removed: gone from the listing and the metrics; enabling it is an error now
    assert_eq!(
        admin_request(admin_addr, "DELETE", "/agents/0", None).0,
        200
    );
    assert_eq!(listed(admin_addr), vec![(7, "active".into(), true)]);
    assert_eq!(
        admin_request(admin_addr, "POST", "/agents/0/enable", None).0,
        404
    );
    serve(&d, &config, 3);
    assert_eq!(handshakes(&a[0]), on_zero);
}

#[test]
fn the_agents_file_is_followed_when_it_changes_and_on_sighup() {
    let pki = Pki::new();
    let a = agents(&pki, &[1, 2]);
    let dir = TempDir::new("membership-file");
    let file = dir.path("agents.toml");
    std::fs::write(&file, entry(1, &a[0], "active")).unwrap();
    let (d, admin_addr) =
        Dispatcher::with_admin(&dir.arg("agents.toml"), &["--policy", "least-conn"]);
    let config = Arc::new(pki.client(&[&TLS13], None));
    serve(&d, &config, 2);
    assert_eq!(handshakes(&a[1]), 0);

    // agent 2 added in the file: picked up without a signal
    std::fs::write(
        &file,
        entry(1, &a[0], "disabled") + &entry(2, &a[1], "active"),
    )
    .unwrap();
    assert!(
        within(Duration::from_secs(5), || listed(admin_addr).len() == 2),
        "the file change was not picked up"
    );
    let before = handshakes(&a[0]);
    serve(&d, &config, 4);
    assert_eq!(handshakes(&a[0]), before, "a disabled agent got clients");
    assert_eq!(handshakes(&a[1]), 4);

    // a file that does not parse is refused and the roster kept
    std::fs::write(&file, "[[agent]]\nid = 1\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(listed(admin_addr).len(), 2);

    // an admin change lasts until SIGHUP re-reads the file
    std::fs::write(
        &file,
        entry(1, &a[0], "active") + &entry(2, &a[1], "active"),
    )
    .unwrap();
    assert!(within(Duration::from_secs(5), || {
        listed(admin_addr).iter().all(|l| l.1 == "active")
    }));
    assert_eq!(
        admin_request(admin_addr, "POST", "/agents/2/disable", None).0,
        200
    );
    assert!(listed(admin_addr).contains(&(2, "disabled".into(), true)));
    let pid = d.child.id().to_string();
    let hup = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(hup.success());
    assert!(
        within(Duration::from_secs(5), || {
            listed(admin_addr).contains(&(2, "active".into(), true))
        }),
        "SIGHUP did not re-read the file"
    );
    // and the dispatcher is still serving (SIGHUP's default action would have killed it)
    serve(&d, &config, 2);
}

#[test]
fn the_admin_endpoint_is_loopback_only_and_the_roster_must_be_servable() {
    let out = Command::new(BATON)
        .args(["dispatch", "--agent", "127.0.0.1:1", "--admin", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));

    let dir = TempDir::new("membership-bad");
    std::fs::write(
        dir.path("agents.toml"),
        "[[agent]]\nid = 1\naddr = \"127.0.0.1:1\"\n[[agent]]\nid = 1\naddr = \"127.0.0.1:2\"\n",
    )
    .unwrap();
    let out = Command::new(BATON)
        .args(["dispatch", "--agents-file", &dir.arg("agents.toml")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("appears twice"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One HTTPS request from source address `src` (its own TLS session cache in `config`):
/// whether the handshake was a resumption, or the error.
fn fetch_from(
    src: std::net::IpAddr,
    to: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> Result<rustls::HandshakeKind, String> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(|e| e.to_string())?;
    socket
        .bind(&SocketAddr::new(src, 0).into())
        .map_err(|e| e.to_string())?;
    socket
        .connect_timeout(&to.into(), Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    let tcp: TcpStream = socket.into();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), "localhost".try_into().unwrap())
        .map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut response = Vec::new();
    match tls.read_to_end(&mut response) {
        Ok(_) => {}
        // a peer that closes without close_notify after a complete response
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        Err(e) => return Err(format!("read: {e}")),
    }
    if !response.starts_with(b"HTTP/1.1 200") {
        return Err(String::from_utf8_lossy(&response).into());
    }
    tls.conn
        .handshake_kind()
        .ok_or_else(|| "no handshake".into())
}

#[test]
fn two_dispatchers_behind_haproxy_agree_on_homes_and_one_can_die() {
    if !have_haproxy() {
        return;
    }
    let pki = Pki::new();
    let dir = TempDir::new("two-dispatchers");
    let cluster_key = key_file(&dir, "cluster.key");
    let tickets = key_file(&dir, "tickets.key");
    let agents = linked_agents(
        &pki,
        2,
        &cluster_key,
        &["--handoff", "true", "--ticket-key-file", &tickets],
    );
    std::fs::write(dir.path("agents.toml"), linked_roster(&agents)).unwrap();
    let mut dispatchers: Vec<Option<(Dispatcher, SocketAddr)>> = (0..2)
        .map(|_| {
            Some(Dispatcher::with_admin(
                &dir.arg("agents.toml"),
                &[
                    "--policy",
                    "handoff",
                    "--cluster-key-file",
                    &cluster_key,
                    "--accept-proxy-protocol",
                    "true",
                ],
            ))
        })
        .collect();
    assert!(
        within(Duration::from_secs(10), || agents
            .iter()
            .all(|a| a.metric("baton_link_connections_active") >= 4.0)),
        "links from both dispatchers did not come up"
    );
    // HAProxy in front, as an L4 balancer would be: round robin, PROXY v2 to the dispatchers
    // (so they route on the client's address), fast checks and redispatch on a dead one.
    let front = free_port();
    let servers: String = dispatchers
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let addr = d.as_ref().unwrap().0.addr;
            format!("    server d{i} {addr} send-proxy-v2 check inter 200 fall 1 rise 1\n")
        })
        .collect();
    std::fs::write(
        dir.path("haproxy.cfg"),
        format!(
            "global\n    maxconn 4096\ndefaults\n    mode tcp\n    timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n    retries 3\n    option redispatch\n\
             frontend tls\n    bind 127.0.0.1:{front}\n    default_backend dispatchers\nbackend dispatchers\n    balance roundrobin\n{servers}"
        ),
    )
    .unwrap();
    let mut haproxy = Command::new("haproxy")
        .args(["-f", &dir.arg("haproxy.cfg"), "-db"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for_port(front), "haproxy did not listen");
    let front = SocketAddr::from(([127, 0, 0, 1], front));

    // six client hosts, each with its own session cache
    let clients: Vec<(std::net::IpAddr, Arc<rustls::ClientConfig>)> = (10..16u8)
        .map(|i| {
            (
                std::net::IpAddr::from([127, 0, 0, i]),
                Arc::new(pki.client(&[&TLS13], None)),
            )
        })
        .collect();
    let resumed_at = |a: &Agent| a.handshakes("1.3", "resumed");
    // Each client's resumptions go to its home, through either dispatcher: the home seen
    // must be the same every time (the dispatchers agree), before and after one dies.
    let mut homes: Vec<Option<usize>> = vec![None; clients.len()];
    let round = |label: &str, homes: &mut Vec<Option<usize>>| {
        for (i, (src, config)) in clients.iter().enumerate() {
            let before: Vec<u64> = agents.iter().map(resumed_at).collect();
            let kind = fetch_from(*src, front, config)
                .unwrap_or_else(|e| panic!("{label}: client {src}: {e}"));
            if kind != rustls::HandshakeKind::Resumed {
                continue; // a first (full) handshake: its session moves home
            }
            let at: Vec<usize> = (0..agents.len())
                .filter(|a| resumed_at(&agents[*a]) > before[*a])
                .collect();
            assert_eq!(at.len(), 1, "{label}: {src} resumed at {at:?}");
            match homes[i] {
                None => homes[i] = Some(at[0]),
                Some(h) => assert_eq!(h, at[0], "{label}: {src} changed home"),
            }
        }
    };
    for _ in 0..4 {
        round("both dispatchers", &mut homes);
    }
    assert!(homes.iter().all(Option::is_some), "{homes:?}");
    let both_used = |d: &Option<(Dispatcher, SocketAddr)>| {
        d.as_ref()
            .unwrap()
            .0
            .metric("baton_dispatch_hellos_total{outcome=\"parsed\"}")
    };
    assert!(both_used(&dispatchers[0]) > 0.0 && both_used(&dispatchers[1]) > 0.0);

    // one dispatcher dies: the other carries every client, sessions resume, homes stay
    let (mut dead, _) = dispatchers[0].take().unwrap();
    let _ = dead.child.kill();
    let _ = dead.child.wait();
    for _ in 0..4 {
        round("one dispatcher left", &mut homes);
    }
    let _ = haproxy.kill();
    let _ = haproxy.wait();
}

#[test]
fn an_agent_told_to_stop_tells_the_dispatcher_and_no_client_is_lost() {
    let pki = Pki::new();
    let dir = TempDir::new("self-drain");
    let cluster_key = key_file(&dir, "cluster.key");
    let mut agents = linked_agents(&pki, 2, &cluster_key, &[]);
    std::fs::write(dir.path("agents.toml"), linked_roster(&agents)).unwrap();
    let (d, admin_addr) = Dispatcher::with_admin(
        &dir.arg("agents.toml"),
        &[
            "--policy",
            "round-robin",
            "--cluster-key-file",
            &cluster_key,
            // only the agent's own word takes it out, not a health check
            "--health-interval",
            "60",
        ],
    );
    let config = Arc::new(pki.client(&[&TLS13], None));
    let d = Arc::new(d);
    // four clients in a loop, new connections each time, while agent 0 is stopped
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (d, config, stop) = (d.clone(), config.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut ok, mut failed) = (0u32, Vec::new());
                for _ in 0..400 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    match fetch(&*d, &config, "/") {
                        Ok(r) if r.status == 200 => ok += 1,
                        Ok(r) => failed.push(format!("status {}", r.status)),
                        Err(e) => failed.push(e),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    assert!(within(Duration::from_secs(20), || handshakes(&agents[0]) >= 20));
    agents[0].signal("TERM");
    let exited = agents[0].wait_exit(Duration::from_secs(20));
    assert!(exited.is_some(), "agent 0 did not finish draining");
    let after = handshakes(&agents[1]);
    assert!(within(Duration::from_secs(20), || handshakes(&agents[1])
        >= after + 40));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for c in clients {
        let (o, f) = c.join().unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        ok as usize + failed.len()
    );
    // the dispatcher took agent 0 out on its word
    assert!(listed(admin_addr).contains(&(0, "active".into(), false)));
}
