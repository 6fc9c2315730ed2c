//! WebSockets through the agent as a reverse proxy, between real peers: Python's `websockets`
//! echo server as the upstream, and as clients `websockets` over HTTP/1.1 (Upgrade) and an
//! RFC 8441 extended CONNECT over HTTP/2 (the `h2` package, with WebSocket frames written by
//! `websocket_peer.py`, since `websockets` itself speaks only HTTP/1.1). And an upgraded
//! connection, which can neither park nor move, is closed by a drain at --drain-timeout.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/websocket_peer.py");

/// Whether python3 has `websockets` and `h2` (`scripts/test` installs them); without them the
/// test skips, unless BATON_REQUIRE_SERVERS says it must not.
fn have_python_websockets() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import websockets, h2"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        require_or_skip(
            "python3 websockets and h2 packages",
            "the WebSocket server and clients",
        );
    }
    ok
}

/// The echo server, killed on drop.
struct EchoServer {
    child: Child,
    port: u16,
}

impl EchoServer {
    fn start() -> EchoServer {
        let mut child = Command::new("python3")
            .args([PEER, "server"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("echo server's port: {line:?}"));
        EchoServer { child, port }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a client mode of `websocket_peer.py` (at most 30 s); its output lines.
fn client(args: &[&str]) -> Vec<String> {
    let out = Command::new("timeout")
        .args(["30", "python3", PEER])
        .args(args)
        .output()
        .expect("timeout python3");
    let text = text_of(&out);
    assert!(out.status.success(), "websocket_peer.py {args:?}:\n{text}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

fn agent_in_front(pki: &Pki, echo: &EchoServer, extra: &[&str]) -> Agent {
    let upstream = format!("http://127.0.0.1:{}", echo.port);
    let mut args = vec!["--upstream", &upstream];
    args.extend_from_slice(extra);
    Agent::serving(pki, &args)
}

#[test]
fn websocket_over_http1_upgrade() {
    if !have_python_websockets() {
        return;
    }
    let pki = Pki::new();
    let echo = EchoServer::start();
    let dir = TempDir::new("websocket");
    let log = dir.path("access.log");
    let agent = agent_in_front(
        &pki,
        &echo,
        &[
            "--access-log",
            path_str(&log),
            "--access-log-format",
            "json",
        ],
    );
    let url = format!("wss://localhost:{}/echo", agent.port());
    let got = client(&["h1", &url, &pki.arg("ca.pem"), "hello", "headers?", "world"]);
    // the upstream saw the agent's forwarding headers in the handshake
    assert_eq!(got, ["hello", "127.0.0.1", "world"]);
    // the upgrade is logged as its 101
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut text = String::new();
    while !text.contains("\"status\":101") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        text = std::fs::read_to_string(&log).unwrap_or_default();
    }
    assert!(text.contains("\"path\":\"/echo\""), "{text}");
    assert!(text.contains("\"status\":101"), "{text}");
}

#[test]
fn websocket_over_http2_extended_connect() {
    if !have_python_websockets() {
        return;
    }
    let pki = Pki::new();
    let echo = EchoServer::start();
    let agent = agent_in_front(&pki, &echo, &[]);
    let got = client(&[
        "h2",
        &agent.port().to_string(),
        &pki.arg("ca.pem"),
        "/echo",
        "hello over h2",
        "headers?",
    ]);
    assert_eq!(got, ["status 200", "hello over h2", "127.0.0.1"]);
}

/// A drain cannot move an upgraded connection: the agent keeps it until --drain-timeout,
/// then closes it and exits.
#[test]
fn a_drain_closes_a_websocket_at_the_drain_timeout() {
    if !have_python_websockets() {
        return;
    }
    let pki = Pki::new();
    let echo = EchoServer::start();
    let mut agent = agent_in_front(&pki, &echo, &["--drain-timeout", "2s"]);
    // a client that sends one message and then waits for the agent to close
    let url = format!("wss://localhost:{}/echo", agent.port());
    let mut held = Command::new("timeout")
        .args(["30", "python3", "-c"])
        .arg(
            "import asyncio, ssl, sys\n\
             from websockets.asyncio.client import connect\n\
             async def main():\n\
             \x20   ctx = ssl.create_default_context(cafile=sys.argv[2])\n\
             \x20   async with connect(sys.argv[1], ssl=ctx) as ws:\n\
             \x20       await ws.send('hi'); print(await ws.recv(), flush=True)\n\
             \x20       try:\n\
             \x20           await ws.recv()\n\
             \x20       except Exception as e:\n\
             \x20           print('closed', flush=True)\n\
             asyncio.run(main())\n",
        )
        .args([&url, &pki.arg("ca.pem")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(held.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "hi");
    agent.signal("TERM");
    // the drain waits for it, then closes it: the client hears the close
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "closed");
    assert!(held.wait().unwrap().success());
    assert!(agent.wait_exit(Duration::from_secs(20)).is_some());
}
