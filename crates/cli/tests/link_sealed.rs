//! The agent link is sealed: a relay between a real dispatcher and a real agent sees only
//! ciphertext, a byte it changes tears the link down (and the dispatcher makes a new one), and
//! a link session it recorded and replays to the agent is refused.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;

/// One agent with a link, and a dispatcher that reaches it through a relay.
struct Rig {
    agent: Agent,
    relay: LinkRelay,
    dispatcher: Dispatcher,
    pki: Pki,
    _dir: TempDir,
}

const KEY: &str = "00000011 1111111111111111111111111111111111111111111111111111111111111111";
/// The dispatcher's link connections to the agent (its default).
const LINKS: f64 = 2.0;

fn rig() -> Rig {
    let pki = Pki::new();
    let dir = TempDir::new("link-sealed");
    let key = cluster_key_file(&dir, "k", &[KEY]);
    let mut args = pki.server_args();
    args.extend(
        [
            "--agent-id",
            "0",
            "--link-listen",
            "127.0.0.1:0",
            "--cluster-key-file",
            &key,
        ]
        .map(String::from),
    );
    let agent = Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let relay = LinkRelay::new(agent.link.unwrap());
    let (agent_addr, relay_addr) = (agent.addr.to_string(), relay.addr.to_string());
    let (child, addrs) = spawn_ready(
        "dispatch",
        &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
        &[
            "--agent",
            &agent_addr,
            "--agent-link",
            &relay_addr,
            "--cluster-key-file",
            &key,
        ],
    );
    let dispatcher = Dispatcher {
        child,
        addr: addrs["dispatch"],
        metrics: addrs["metrics"],
    };
    let rig = Rig {
        agent,
        relay,
        dispatcher,
        pki,
        _dir: dir,
    };
    rig.wait_links();
    rig
}

impl Rig {
    /// Waits (10 s at most) until all the dispatcher's links are up at the agent.
    fn wait_links(&self) {
        wait_for("the links up", || {
            self.agent.metric("baton_link_connections_active") >= LINKS
        });
    }

    /// `GET /tls` from `src` through the dispatcher: the body on success.
    fn get(&self, src: IpAddr) -> Option<String> {
        let resolve = format!("localhost:{}:127.0.0.1", self.dispatcher.addr.port());
        let url = format!("https://localhost:{}/tls", self.dispatcher.addr.port());
        let out = curl(&[
            "--interface",
            &src.to_string(),
            "--cacert",
            &self.pki.arg("ca.pem"),
            "--resolve",
            &resolve,
            &url,
        ]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// [`Self::get`] that must succeed and be served for the client's own address (what the
    /// agent read from the stream's `baton-source`).
    fn get_ok(&self, src: IpAddr) {
        let body = self.get(src).expect("served");
        assert!(body.contains(&format!("peer: {src}:")), "{body}");
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many times `needle` occurs in `hay`.
fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[test]
fn a_relay_on_the_link_sees_only_ciphertext() {
    let r = rig();
    let src = IpAddr::from([127, 0, 0, 37]);
    for _ in 0..2 {
        r.get_ok(src);
    }
    assert_eq!(r.agent.metric("baton_link_streams_total"), 2.0);
    let sessions = r.relay.sessions();
    assert_eq!(
        sessions.len(),
        LINKS as usize,
        "the links went through the relay"
    );
    let mut all = Vec::new();
    for s in &sessions {
        // the handshake's clear header starts each direction, and appears nowhere else
        for dir in [&s.to_agent, &s.to_dispatcher] {
            assert!(
                dir.starts_with(&baton_link::auth::HEADER),
                "{:?}",
                &dir[..dir.len().min(8)]
            );
            assert_eq!(count(dir, b"BTLK"), 1);
            all.extend_from_slice(dir);
        }
    }
    // the client streams' bytes, sealed and more
    assert!(all.len() > 4000, "{} bytes relayed", all.len());
    let src_text = src.to_string();
    for (what, needle) in [
        ("the client's SNI", b"localhost".to_vec()),
        ("a stream's metadata header", b"baton-source".to_vec()),
        ("the client's address", src_text.as_bytes().to_vec()),
        (
            "the client's address as stream metadata",
            vec![4, 127, 0, 0, 37],
        ),
        ("an agent hello in clear (version 2)", b"BTLK\x02".to_vec()),
    ] {
        assert!(!contains(&all, &needle), "the relay saw {what}");
    }
}

#[test]
fn a_flipped_byte_tears_the_link_down_and_a_new_link_serves() {
    let r = rig();
    let src = IpAddr::from([127, 0, 0, 38]);
    r.get_ok(src);
    let mut served = 1.0;
    // let the first stream's end reach the agent before the relay turns on the link
    std::thread::sleep(Duration::from_millis(300));
    r.relay.arm_flip();
    // the next bytes to the agent (this client's stream) arrive changed: in flight, it may fail
    if r.get(src).is_some() {
        served += 1.0;
    }
    assert_eq!(r.relay.flipped(), 1);
    wait_for("the integrity failure", || {
        r.agent.metric("baton_link_integrity_failures_total") >= 1.0
    });
    // the dispatcher made a new link through the relay
    wait_for("a new link", || r.relay.sessions().len() > LINKS as usize);
    r.wait_links();
    // a stream that failed on the torn link took the agent out until its next health check
    wait_for("the agent back in", || {
        r.dispatcher.metric("baton_dispatch_agent_up{agent=\"0\"}") == 1.0
    });
    for _ in 0..3 {
        r.get_ok(src);
        served += 1.0;
    }
    // nothing of the changed message reached the agent: no stream from it
    assert_eq!(r.agent.metric("baton_link_streams_total"), served);
    assert_eq!(r.agent.metric("baton_link_integrity_failures_total"), 1.0);
}

#[test]
fn a_replayed_link_session_is_refused() {
    let r = rig();
    let src = IpAddr::from([127, 0, 0, 39]);
    for _ in 0..2 {
        r.get_ok(src);
    }
    let streams = r.agent.metric("baton_link_streams_total");
    assert_eq!(streams, 2.0);
    let recorded = r.relay.sessions();
    for (i, s) in recorded.iter().enumerate() {
        // what the dispatcher sent on that link, replayed to the agent from the start
        let mut c = TcpStream::connect(r.agent.link.unwrap()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        c.write_all(&s.to_agent).unwrap();
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer);
        // a handshake reply (the first message opens: the agent cannot tell a replay), but a
        // fresh one, that only the dispatcher of the recording could have used
        let head = 7 + 32 + 18 + 16;
        assert!(answer.len() >= head, "{}", answer.len());
        assert_ne!(answer[..head], s.to_dispatcher[..head]);
        // and the recorded stream's first message after the handshake tore it down
        wait_for("the integrity failure", || {
            r.agent.metric("baton_link_integrity_failures_total") >= (i + 1) as f64
        });
    }
    assert_eq!(
        r.agent.metric("baton_link_streams_total"),
        streams,
        "a replayed stream was served"
    );
    // the dispatcher's own links are untouched
    r.get_ok(src);
    assert_eq!(r.agent.metric("baton_link_streams_total"), streams + 1.0);
}
