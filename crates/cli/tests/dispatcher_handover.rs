//! The dispatcher hands over to a successor (issue 18): a new `baton dispatch` process takes
//! the listening sockets and every live client connection, and the old one exits at once.
//! Clients keep their TCP connection, their TLS session and their agent. Real processes:
//! two agents with links, a dispatcher started from a copy of the binary (so a test can
//! replace it, as an upgrade does), rustls keep-alive clients (TLS 1.2 and 1.3, a KeyUpdate
//! after the handover), curl.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const KEY: &str = "00000011 1111111111111111111111111111111111111111111111111111111111111111";

struct Cluster {
    agents: Vec<Agent>,
    dir: TempDir,
    pki: Pki,
    key: String,
    /// The binary the dispatcher runs (a copy: a test may replace it).
    bin: String,
}

fn cluster() -> Cluster {
    cluster_with(&[])
}

/// Two agents with links (and `extra` flags), and a copy of the binary for the dispatcher.
fn cluster_with(extra: &[&str]) -> Cluster {
    let pki = Pki::new();
    let dir = TempDir::new("dispatcher-handover");
    let key = cluster_key_file(&dir, "cluster.key", &[KEY]);
    let agents = (0..2)
        .map(|i| {
            let id = i.to_string();
            let mut args = vec![
                "--agent-id",
                &id,
                "--handoff",
                "true",
                "--link-listen",
                "127.0.0.1:0",
                "--cluster-key-file",
                &key,
            ];
            args.extend_from_slice(extra);
            Agent::serving(&pki, &args)
        })
        .collect();
    let bin = dir.arg("baton");
    std::fs::copy(BATON, &bin).unwrap();
    // A child another test thread forks while the copy is open for writing holds that file
    // descriptor until it execs: executing the copy fails with ETXTBSY until then.
    for _ in 0..100 {
        match Command::new(&bin).arg("--version").output() {
            Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(Duration::from_millis(20)),
            _ => break,
        }
    }
    Cluster {
        agents,
        dir,
        pki,
        key,
        bin,
    }
}

/// A dispatcher process that may hand over: follows its successors by pid, and kills
/// whichever is the current one at the end.
struct Dispatch {
    pid: u32,
    addr: SocketAddr,
    metrics: SocketAddr,
    admin: SocketAddr,
    /// The first process's handle (reaped when it exits).
    first: std::process::Child,
}

impl Dispatch {
    fn start(c: &Cluster) -> Dispatch {
        Dispatch::start_with(c, &["--policy", "round-robin"])
    }

    fn start_with(c: &Cluster, extra: &[&str]) -> Dispatch {
        Dispatch::start_env(c, extra, &[])
    }

    fn start_env(c: &Cluster, extra: &[&str], env: &[(&str, &str)]) -> Dispatch {
        let mut args: Vec<String> = Vec::new();
        for a in &c.agents {
            args.extend([
                "--agent".into(),
                a.addr.to_string(),
                "--agent-link".into(),
                a.link.unwrap().to_string(),
            ]);
        }
        args.extend(
            [
                "--listen",
                "127.0.0.1:0",
                "--metrics",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--admin-token-file",
                admin_token_file(),
                "--cluster-key-file",
                &c.key,
                "--handover-timeout",
                "10",
            ]
            .map(String::from),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (child, addrs) = spawn_ready_env(&c.bin, "dispatch", &[], &args, env);
        let d = Dispatch {
            pid: child.id(),
            addr: addrs["dispatch"],
            metrics: addrs["metrics"],
            admin: addrs["admin"],
            first: child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while c
            .agents
            .iter()
            .any(|a| a.metric("baton_link_connections_active") < 1.0)
        {
            assert!(Instant::now() < deadline, "links did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn metric(&self, prefix: &str, filter: &str) -> f64 {
        series_sum(&metrics_page(self.metrics), prefix, filter)
    }

    fn usr2(&self) {
        signal(self.pid, "-USR2");
    }

    /// Waits for the current process to exit and for its successor (same command line) to
    /// serve; follows it.
    fn follow_successor(&mut self) {
        let old = self.pid;
        let cmdline = std::fs::read(format!("/proc/{old}/cmdline")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut successor = None;
        while Instant::now() < deadline {
            if successor.is_none() {
                successor = same_command(&cmdline, old);
            }
            if successor.is_some() && !alive(old) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(old), "the old dispatcher {old} is still running");
        self.pid = successor.expect("no successor process");
        let _ = self.first.try_wait();
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        // a successor a failed test did not follow is not left behind
        // (empty for a process that has exited: `same_command` refuses that)
        if let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", self.first.id())) {
            for _ in 0..10 {
                let Some(pid) = same_command(&cmdline, self.first.id()) else {
                    break;
                };
                signal(pid, "-KILL");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        signal(self.pid, "-KILL");
        let _ = self.first.kill();
        let _ = self.first.wait();
    }
}

fn signal(pid: u32, sig: &str) {
    Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z ") && !s.contains(") X "))
        .unwrap_or(false)
}

/// Another live process with exactly this command line.
fn same_command(cmdline: &[u8], not: u32) -> Option<u32> {
    if cmdline.is_empty() {
        return None;
    }
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        (pid != not && alive(pid) && std::fs::read(format!("/proc/{pid}/cmdline")).ok()? == cmdline)
            .then_some(pid)
    })
}

fn reattached(c: &Cluster) -> f64 {
    c.agents
        .iter()
        .map(|a| {
            series_sum(
                &a.metrics_text(),
                "baton_link_streams_reattached_total",
                "outcome=\"reattached\"",
            )
        })
        .sum()
}

#[test]
fn a_successor_takes_every_live_connection_and_the_old_dispatcher_exits() {
    let c = cluster();
    let mut d = Dispatch::start(&c);
    let v12 = Arc::new(c.pki.client(&[&rustls::version::TLS12], None));
    let v13 = Arc::new(c.pki.client(&[&rustls::version::TLS13], None));
    let mut clients: Vec<(bool, KeepAlive)> = (0..8)
        .map(|i| {
            let tls13 = i % 2 == 1;
            (
                tls13,
                KeepAlive::open(d.addr, if tls13 { &v13 } else { &v12 }),
            )
        })
        .collect();
    for (_, k) in clients.iter_mut() {
        // a body larger than one record, so positions inside records are exercised later
        let r = k.get("/bytes/40000");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
    let ports: Vec<SocketAddr> = clients.iter().map(|(_, k)| k.local()).collect();
    let full_before: f64 = c
        .agents
        .iter()
        .map(|a| series_sum(&a.metrics_text(), "baton_handshakes_total", "kind=\"full\""))
        .sum();
    let old = d.pid;
    d.usr2();
    d.follow_successor();
    assert_ne!(d.pid, old);
    for (i, (tls13, k)) in clients.iter_mut().enumerate() {
        let r = k.get("/bytes/100");
        assert!(r.starts_with("HTTP/1.1 200"), "client {i}: {r}");
        if *tls13 {
            k.tls.conn.refresh_traffic_keys().unwrap();
        }
        let r = k.get("/bytes/40000");
        assert!(r.starts_with("HTTP/1.1 200"), "client {i} after: {r}");
        assert_eq!(
            k.tls.conn.handshake_kind(),
            Some(rustls::HandshakeKind::Full),
            "the same session, never a second handshake"
        );
        assert_eq!(k.local(), ports[i], "the same TCP connection");
    }
    let full_after: f64 = c
        .agents
        .iter()
        .map(|a| series_sum(&a.metrics_text(), "baton_handshakes_total", "kind=\"full\""))
        .sum();
    assert_eq!(full_after, full_before, "no handshake was needed");
    // the successor's own counters, on the metrics socket it inherited
    assert_eq!(
        d.metric(
            "baton_dispatch_restart_connections_total",
            "outcome=\"taken\""
        ),
        8.0
    );
    assert_eq!(
        d.metric(
            "baton_dispatch_restart_connections_total",
            "outcome=\"lost\""
        ),
        0.0
    );
    assert_eq!(reattached(&c), 8.0);
    // new clients are served by the successor on the same address, with curl too
    let out = curl(&[
        "-s",
        "--cacert",
        &c.pki.arg("ca.pem"),
        "--resolve",
        &format!("localhost:{}:127.0.0.1", d.addr.port()),
        &format!("https://localhost:{}/bytes/10", d.addr.port()),
    ]);
    assert!(out.status.success(), "{}", text_of(&out));
    // and it can hand over again, through the admin endpoint this time (by its new name;
    // the other calls here use the old one)
    let (status, _) = admin_request(d.admin, "POST", "/restart", None);
    assert_eq!(status, 202);
    d.follow_successor();
    for (i, (_, k)) in clients.iter_mut().enumerate() {
        let r = k.get("/bytes/100");
        assert!(
            r.starts_with("HTTP/1.1 200"),
            "client {i} after the second: {r}"
        );
    }
    assert_eq!(reattached(&c), 16.0);
    drop(c.dir);
}

#[test]
fn a_handover_under_load_loses_no_request() {
    let c = cluster();
    let mut d = Dispatch::start(&c);
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let config = Arc::new(c.pki.client(
                &[if i % 2 == 0 {
                    &rustls::version::TLS12
                } else {
                    &rustls::version::TLS13
                }],
                None,
            ));
            let (addr, stop, ok, failed) = (d.addr, stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut k = KeepAlive::open(addr, &config);
                // bounded: at most 1,500 requests, 20 ms apart, per client
                for _ in 0..1500 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        k.get("/bytes/3000")
                    }));
                    match r {
                        Ok(r) if r.starts_with("HTTP/1.1 200") => {
                            ok.fetch_add(1, Ordering::Relaxed)
                        }
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            k = KeepAlive::open(addr, &config);
                            0
                        }
                    };
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(600));
    d.usr2();
    d.follow_successor();
    std::thread::sleep(Duration::from_millis(600));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let ok = ok.load(Ordering::Relaxed);
    assert_eq!(failed.load(Ordering::Relaxed), 0, "{ok} requests answered");
    assert!(ok > 60, "only {ok} requests");
    assert_eq!(reattached(&c), 6.0);
}

#[test]
fn a_successor_that_fails_to_start_leaves_the_old_dispatcher_serving() {
    let c = cluster();
    let mut d = Dispatch::start(&c);
    let config = Arc::new(c.pki.client(&[&rustls::version::TLS13], None));
    let mut k = KeepAlive::open(d.addr, &config);
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    // a broken upgrade: the binary at the dispatcher's path now fails at once
    let real = c.dir.arg("baton.real");
    std::fs::rename(&c.bin, &real).unwrap();
    std::fs::write(&c.bin, "#!/bin/sh\necho broken >&2\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&c.bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (status, _) = admin_request(d.admin, "POST", "/handover", None);
    assert_eq!(status, 202);
    // the old process serves on: the same connection, new connections, its admin endpoint
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(d.pid));
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    let mut fresh = KeepAlive::open(d.addr, &config);
    assert!(fresh.get("/bytes/10").starts_with("HTTP/1.1 200"));
    assert_eq!(reattached(&c), 0.0);
    // the binary mended, the next handover goes through
    std::fs::rename(&real, &c.bin).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = admin_request(d.admin, "POST", "/handover", None);
        if status == 202 {
            break;
        }
        // 409 while the failed attempt is still being cleaned up
        assert!(Instant::now() < deadline, "handover refused: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    d.follow_successor();
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    assert!(fresh.get("/bytes/10").starts_with("HTTP/1.1 200"));
    assert_eq!(reattached(&c), 2.0);
}

/// A client that does not read a large response does not hold the old dispatcher: what the
/// agent and the old process had for it travels to the successor, which delivers it.
#[test]
fn a_client_that_does_not_read_does_not_hold_the_old_dispatcher() {
    let c = cluster();
    let mut d = Dispatch::start(&c);
    let config = Arc::new(c.pki.client(&[&rustls::version::TLS13], None));
    let mut k = KeepAlive::open(d.addr, &config);
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    // 4 MB the client leaves unread: its socket, the dispatcher's and the link stream fill
    write!(
        k.tls,
        "GET /bytes/4000000 HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    .unwrap();
    k.tls.flush().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let (status, _) = admin_request(d.admin, "POST", "/handover", None);
    assert_eq!(status, 202);
    d.follow_successor();
    // the old process did not wait for the client (its handover deadline is 10 s)
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the old dispatcher took {took:?}"
    );
    // every byte arrives, in order (rustls authenticates each record: a lost or repeated
    // byte is an error), then the connection serves on
    let r = read_http_response(&mut k.tls);
    assert!(r.starts_with("HTTP/1.1 200"), "{}", &r[..r.len().min(200)]);
    assert!(r.len() > 4_000_000);
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    assert_eq!(
        d.metric(
            "baton_dispatch_restart_connections_total",
            "outcome=\"taken\""
        ),
        1.0
    );
}

/// A successor that dies once it is ready: the connections it took die with it, and the old
/// process, which a client stalled in its handshake still kept (a connection is handed over
/// once it is served), accepts again and serves that client to the end.
#[test]
fn a_successor_that_dies_once_ready_leaves_the_old_dispatcher_serving_again() {
    let c = cluster();
    let d = Dispatch::start_with(&c, &["--policy", "handoff", "--hello-timeout", "8"]);
    let config = Arc::new(c.pki.client(&[&rustls::version::TLS13], None));
    let mut idle: Vec<KeepAlive> = (0..4).map(|_| KeepAlive::open(d.addr, &config)).collect();
    for k in idle.iter_mut() {
        assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    }
    // a client that sends its ClientHello and waits before it reads the answer
    let mut tcp = TcpStream::connect(d.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stalled =
        rustls::ClientConnection::new(config.clone(), "localhost".try_into().unwrap()).unwrap();
    stalled.write_tls(&mut tcp).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let old = d.pid;
    let cmdline = std::fs::read(format!("/proc/{old}/cmdline")).unwrap();
    let (status, _) = admin_request(d.admin, "POST", "/handover", None);
    assert_eq!(status, 202);
    // the successor takes the 4 idle connections (its metrics: the socket is its now)
    let deadline = Instant::now() + Duration::from_secs(5);
    let successor = loop {
        if let Some(pid) = same_command(&cmdline, old) {
            let page = std::panic::catch_unwind(|| metrics_page(d.metrics)).unwrap_or_default();
            let taken = series_sum(
                &page,
                "baton_dispatch_restart_connections_total",
                "outcome=\"taken\"",
            );
            if taken == 4.0 {
                break pid;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the successor did not take the 4 idle connections"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    signal(successor, "-KILL");
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(old), "the old dispatcher exited");
    // the stalled client finishes its handshake and is served by the old process
    while stalled.is_handshaking() {
        stalled.complete_io(&mut tcp).unwrap();
    }
    let mut k = KeepAlive {
        tls: rustls::StreamOwned::new(stalled, tcp),
    };
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    // it accepts again: new clients, its metrics and its admin endpoint
    let mut fresh = KeepAlive::open(d.addr, &config);
    assert!(fresh.get("/bytes/10").starts_with("HTTP/1.1 200"));
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    assert_eq!(
        d.metric(
            "baton_dispatch_restart_connections_total",
            "outcome=\"passed\""
        ),
        4.0
    );
    let (status, body) = admin_request(d.admin, "GET", "/agents", None);
    assert_eq!(status, 200, "{body}");
    // and a later handover can be asked for again
    let (status, _) = admin_request(d.admin, "POST", "/handover", None);
    assert_eq!(status, 202);
}

/// Silent connections to every agent's link port, opened again when closed: more than the
/// link listener lets authenticate at once.
fn link_flood(c: &Cluster) -> Vec<Flood> {
    c.agents
        .iter()
        .map(|a| Flood::start(a.link.unwrap(), 70, b"", false))
        .collect()
}

#[test]
fn silent_link_connections_keep_no_successor_from_its_agents() {
    let c = cluster();
    let mut d = Dispatch::start(&c);
    let config = Arc::new(c.pki.client(&[&rustls::version::TLS13], None));
    let mut clients: Vec<KeepAlive> = (0..6).map(|_| KeepAlive::open(d.addr, &config)).collect();
    for k in clients.iter_mut() {
        let r = k.get("/bytes/100");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
    let flood = link_flood(&c);
    std::thread::sleep(Duration::from_secs(1));
    d.usr2();
    d.follow_successor();
    for (i, k) in clients.iter_mut().enumerate() {
        let r = k.get("/bytes/100");
        assert!(
            r.starts_with("HTTP/1.1 200"),
            "client {i} after the handover: {r}"
        );
    }
    assert_eq!(
        d.metric(
            "baton_dispatch_restart_connections_total",
            "outcome=\"lost\""
        ),
        0.0
    );
    assert_eq!(reattached(&c), 6.0);
    let opened: u64 = flood.into_iter().map(Flood::stop).sum();
    assert!(opened > 140, "the flood ran: {opened}");
    let evicted: f64 = c
        .agents
        .iter()
        .map(|a| {
            series_sum(
                &a.metrics_text(),
                "baton_link_connections_shut_out_total",
                "reason=\"evicted\"",
            )
        })
        .sum();
    assert!(evicted > 0.0, "nobody was pushed out");
}

#[test]
fn silent_link_connections_keep_no_restarted_agent_from_its_dispatcher() {
    let mut c = cluster();
    let d = Dispatch::start(&c);
    let config = Arc::new(c.pki.client(&[&rustls::version::TLS13], None));
    // agent 0 goes away; a flood waits at its link port for it to come back
    let old = c.agents.remove(0);
    let (tls, link) = (old.addr, old.link.unwrap());
    drop(old);
    let flood = Flood::start(link, 70, b"", false);
    std::thread::sleep(Duration::from_millis(500));
    let (child, addrs) = spawn_ready(
        "agent",
        &[],
        &[
            c.pki
                .server_args()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            vec![
                "--listen",
                &tls.to_string(),
                "--metrics",
                "127.0.0.1:0",
                "--agent-id",
                "0",
                "--handoff",
                "true",
                "--link-listen",
                &link.to_string(),
                "--cluster-key-file",
                &c.key,
            ],
        ]
        .concat(),
    );
    let started = Instant::now();
    let agent = Agent {
        child,
        addr: addrs["tls"],
        metrics: addrs["metrics"],
        link: addrs.get("link").copied(),
    };
    // the dispatcher's link is up again (its reconnect backoff is at most 2 s; the bound is
    // wide for a loaded machine: before, the flood kept it out for as long as it lasted)
    while agent.metric("baton_link_connections_active") < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the dispatcher's link did not come up through the flood"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "link up {} ms after the agent's start",
        started.elapsed().as_millis()
    );
    // with the other agent disabled, every client reaches the restarted one
    let (status, body) = admin_request(d.admin, "POST", "/agents/1/disable", None);
    assert_eq!(status, 200, "{body}");
    for i in 0..20 {
        let r = fetch_addr(d.addr, &config, "/").unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(r.status, 200);
    }
    assert!(flood.stop() > 70, "the flood ran");
    assert!(
        series_sum(
            &agent.metrics_text(),
            "baton_link_connections_shut_out_total",
            "reason=\"evicted\""
        ) > 0.0
    );
}

#[test]
fn link_connections_from_outside_link_allow_are_closed_unread() {
    let pki = Pki::new();
    let dir = TempDir::new("link-allow");
    let key = cluster_key_file(&dir, "cluster.key", &[KEY]);
    let agent = Agent::serving(
        &pki,
        &[
            "--link-listen",
            "127.0.0.1:0",
            "--link-allow",
            "10.0.0.0/8",
            "--cluster-key-file",
            &key,
        ],
    );
    let mut s = TcpStream::connect(agent.link.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 32];
    let n = std::io::Read::read(&mut s, &mut b).unwrap_or(0);
    assert_eq!(n, 0, "a stranger got the agent's hello");
    assert_eq!(
        series_sum(
            &agent.metrics_text(),
            "baton_link_connections_shut_out_total",
            "reason=\"disallowed\""
        ),
        1.0
    );
}

/// The service manager's end of `sd_notify(3)`: a unix datagram socket that learns each
/// message's sender from the kernel (SO_PASSCRED), as systemd's does.
struct NotifySocket {
    sock: std::os::unix::net::UnixDatagram,
    path: String,
}

impl NotifySocket {
    fn bind(dir: &TempDir) -> NotifySocket {
        let path = dir.arg("notify.sock");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        rustix::net::sockopt::set_socket_passcred(&sock, true).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        NotifySocket { sock, path }
    }

    /// The next message, as its sender's pid and its lines; `None` after `within`.
    fn next(&self, within: Duration) -> Option<(u32, Vec<String>)> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        use std::mem::MaybeUninit;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let mut buf = [0u8; 4096];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let got = rustix::net::recvmsg(
                &self.sock,
                &mut [std::io::IoSliceMut::new(&mut buf)],
                &mut control,
                RecvFlags::empty(),
            );
            let got = match got {
                Ok(got) => got,
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => continue,
                Err(e) => panic!("notify socket: {e}"),
            };
            let pid = control
                .drain()
                .find_map(|m| match m {
                    RecvAncillaryMessage::ScmCredentials(c) => Some(c.pid.as_raw_nonzero().get()),
                    _ => None,
                })
                .expect("a message without its sender's credentials");
            let text = String::from_utf8_lossy(&buf[..got.bytes]);
            return Some((pid as u32, text.lines().map(String::from).collect()));
        }
        None
    }
}

/// Under systemd (`Type=notify`, `NotifyAccess=all`): the first process says `READY=1` once
/// it serves; in a handover the successor says `MAINPID=` itself and `READY=1` while the old
/// process still runs (else systemd takes the old one's exit for the service's end and kills
/// the successor with the unit), and the old process says nothing after that.
#[test]
fn under_systemd_the_successor_becomes_the_main_process_before_the_old_one_exits() {
    let c = cluster();
    let notify = NotifySocket::bind(&c.dir);
    let mut d = Dispatch::start_env(
        &c,
        &["--policy", "round-robin"],
        &[("NOTIFY_SOCKET", &notify.path)],
    );
    let first = d.pid;
    let (pid, lines) = notify
        .next(Duration::from_secs(10))
        .expect("no notification from the dispatcher");
    assert_eq!(pid, first, "{lines:?}");
    assert!(lines.iter().any(|l| l == "READY=1"), "{lines:?}");
    let config = Arc::new(c.pki.client(&[&rustls::version::TLS13], None));
    let mut k = KeepAlive::open(d.addr, &config);
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    // a client that sent the start of a ClientHello only: the old process keeps it (until
    // its hello timeout) and so stays up after its successor is ready
    let mut stalled = TcpStream::connect(d.addr).unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    d.usr2();
    let mut from_old = Vec::new();
    let (successor, lines) = loop {
        let (pid, lines) = notify
            .next(Duration::from_secs(30))
            .expect("no notification from a successor");
        if pid == first {
            from_old.push(lines);
            continue;
        }
        break (pid, lines);
    };
    assert!(
        alive(first),
        "the old dispatcher exited before its successor told systemd"
    );
    assert!(
        lines.contains(&format!("MAINPID={successor}")) && lines.contains(&"READY=1".to_string()),
        "{lines:?}"
    );
    assert!(
        from_old.iter().flatten().any(|l| l == "RELOADING=1"),
        "{from_old:?}"
    );
    drop(stalled);
    d.follow_successor();
    assert_eq!(d.pid, successor, "MAINPID is the process that serves");
    // the old process exited without a word more (a STOPPING=1 would stop the unit)
    while let Some((pid, lines)) = notify.next(Duration::from_millis(300)) {
        assert_ne!(
            pid, first,
            "the old dispatcher said {lines:?} after the handover"
        );
    }
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
    let mut fresh = KeepAlive::open(d.addr, &config);
    assert!(fresh.get("/bytes/10").starts_with("HTTP/1.1 200"));
    // and the successor, now the main process, says when it stops
    signal(successor, "-TERM");
    let (pid, lines) = notify.next(Duration::from_secs(10)).expect("no STOPPING=1");
    assert_eq!(pid, successor);
    assert!(lines.iter().any(|l| l == "STOPPING=1"), "{lines:?}");
}

/// Under systemd, a handover whose successor fails leaves the old process the main one: after
/// its `RELOADING=1` it says `MAINPID=` itself and `READY=1` again (else the unit would stay
/// "reloading"), and serves on.
#[test]
fn under_systemd_a_failed_handover_leaves_the_old_dispatcher_the_main_process() {
    let c = cluster();
    let notify = NotifySocket::bind(&c.dir);
    let d = Dispatch::start_env(
        &c,
        &["--policy", "round-robin"],
        &[("NOTIFY_SOCKET", &notify.path)],
    );
    let (pid, lines) = notify
        .next(Duration::from_secs(10))
        .expect("no notification from the dispatcher");
    assert_eq!((pid, lines), (d.pid, vec!["READY=1".to_string()]));
    // a broken upgrade: the binary at the dispatcher's path now fails at once
    let real = c.dir.arg("baton.real");
    std::fs::rename(&c.bin, &real).unwrap();
    std::fs::write(&c.bin, "#!/bin/sh\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&c.bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.usr2();
    let mut said = Vec::new();
    while !said.contains(&"READY=1".to_string()) {
        let (pid, lines) = notify
            .next(Duration::from_secs(15))
            .unwrap_or_else(|| panic!("no READY=1 after the failed handover: {said:?}"));
        assert_eq!(pid, d.pid, "{lines:?}");
        said.extend(lines);
    }
    let at = |l: &str| {
        said.iter()
            .position(|s| s == l)
            .unwrap_or_else(|| panic!("no {l}: {said:?}"))
    };
    assert!(at("RELOADING=1") < at("READY=1"), "{said:?}");
    at(&format!("MAINPID={}", d.pid));
    let config = Arc::new(c.pki.client(&[&rustls::version::TLS13], None));
    let mut k = KeepAlive::open(d.addr, &config);
    assert!(k.get("/bytes/10").starts_with("HTTP/1.1 200"));
}
