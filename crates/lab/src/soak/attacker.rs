//! The attacker: a flood of misbehaving clients against every listener, bounded in count and
//! in time, and only ever against loopback (127.0.0.0/8).
//!
//! Per target, [`flood`] connections at a time (more than the listener has slots for strangers:
//! the control endpoints' and the link's pushing out of the oldest silent one is what is under
//! test) for the attack's length, each replaced (after a short pause) when the server closes
//! it. They come from a few loopback sources of their own ([`SOURCES`]), so a per-source share
//! does not stop them alone. What a connection does depends on the attack and on what the
//! listener speaks:
//!
//! | attack     | TLS and binary listeners            | HTTP control listeners (metrics, admin) |
//! |------------|-------------------------------------|-----------------------------------------|
//! | idle-hello | a real ClientHello, then silence    | silent: connect, send nothing           |
//! | slowloris  | the same ClientHello a byte a second| a request head a byte a second, never done |
//! | garbage    | 2 KiB of random bytes, then silence | the same                                |
//! | half-open  | shut down the write half at once    | pipelined requests, answers never read (a small receive buffer: the server's writes stall) |
//!
//! It records, per target, what the server did: connections refused, closed by the server (and
//! the longest it held one), still open when the attack ended, and the most held at once.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::schedule::{Attack, Rng};

/// Connections per target at a time: above the admin endpoint's 16 and the link listener's 64
/// slots for peers that have not authenticated.
pub const FLOOD: usize = 80;
/// Connections per metrics endpoint at a time: above its 256 slots.
pub const METRICS_FLOOD: usize = 264;
/// Targets at most (so a bounded number of attack connections at once).
pub const MAX_TARGETS: usize = 32;
/// The attacker's own source addresses.
pub const SOURCES: [Ipv4Addr; 4] = [
    Ipv4Addr::new(127, 0, 5, 1),
    Ipv4Addr::new(127, 0, 5, 2),
    Ipv4Addr::new(127, 0, 5, 3),
    Ipv4Addr::new(127, 0, 5, 4),
];
/// Pause before a closed connection is replaced (plus up to half as much again, at random):
/// what bounds the connections a target sees a second, when the server closes them at once.
const PAUSE: Duration = Duration::from_secs(1);

/// What a listener speaks, for what to send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// TLS (the dispatcher, agents, HAProxy in front of agents).
    Tls,
    /// A binary protocol of its own (the agent link, replication).
    Binary,
    /// Plain HTTP/1.1 (metrics, the dispatcher's admin endpoint).
    Http,
}

/// One listener under attack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Listener kind, then whose: `metrics A0`, `link B2`, `admin`.
    pub name: String,
    pub addr: SocketAddr,
    pub proto: Proto,
}

/// Connections held at once against `t`.
pub fn flood(t: &Target) -> usize {
    if t.name.starts_with("metrics") {
        METRICS_FLOOD
    } else {
        FLOOD
    }
}

/// What one attack connection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    IdleHello,
    Slowloris,
    Garbage,
    HalfOpen,
    Silent,
    PartialHead,
    Pipelined,
}

impl Behaviour {
    pub fn name(self) -> &'static str {
        match self {
            Behaviour::IdleHello => "idle-hello",
            Behaviour::Slowloris => "slowloris",
            Behaviour::Garbage => "garbage",
            Behaviour::HalfOpen => "half-open",
            Behaviour::Silent => "silent",
            Behaviour::PartialHead => "partial-head",
            Behaviour::Pipelined => "pipelined-unread",
        }
    }
}

/// What `attack` does against a listener speaking `proto` (the module's table).
pub fn behaviour(attack: Attack, proto: Proto) -> Behaviour {
    match (attack, proto) {
        (Attack::IdleHello, Proto::Http) => Behaviour::Silent,
        (Attack::IdleHello, _) => Behaviour::IdleHello,
        (Attack::Slowloris, Proto::Http) => Behaviour::PartialHead,
        (Attack::Slowloris, _) => Behaviour::Slowloris,
        (Attack::Garbage, _) => Behaviour::Garbage,
        (Attack::HalfOpen, Proto::Http) => Behaviour::Pipelined,
        (Attack::HalfOpen, _) => Behaviour::HalfOpen,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub opened: u64,
    pub refused: u64,
    pub closed_by_server: u64,
    pub open_at_end: u64,
    /// The longest a connection lasted before the server closed it, ms.
    pub longest_closed_ms: u64,
    /// The most connections open at once.
    pub peak_open: u64,
    #[serde(skip)]
    open: u64,
}

impl Stats {
    /// Adds `o`'s counts (peaks: the larger).
    pub fn add(&mut self, o: &Stats) {
        self.opened += o.opened;
        self.refused += o.refused;
        self.closed_by_server += o.closed_by_server;
        self.open_at_end += o.open_at_end;
        self.longest_closed_ms = self.longest_closed_ms.max(o.longest_closed_ms);
        self.peak_open = self.peak_open.max(o.peak_open);
    }
}

/// A real ClientHello for `localhost`, as the first flight of a rustls client.
pub fn client_hello() -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("default versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("a valid name");
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).expect("a client");
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).expect("writing to a Vec");
    }
    out
}

/// Runs `kind` against every target for `len`; stats per target name.
pub async fn attack(
    kind: Attack,
    targets: Vec<Target>,
    len: Duration,
    seed: u64,
) -> BTreeMap<String, Stats> {
    assert!(targets.len() <= MAX_TARGETS, "too many attack targets");
    let hello = Arc::new(client_hello());
    let deadline = Instant::now() + len;
    let stats: Arc<Mutex<BTreeMap<String, Stats>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, t) in targets.into_iter().enumerate() {
        if !t.addr.ip().is_loopback() {
            // never anything but this machine
            tracing::warn!(addr = %t.addr, "soak attacker: not a loopback address, skipped");
            continue;
        }
        let how = behaviour(kind, t.proto);
        stats
            .lock()
            .unwrap()
            .insert(t.name.clone(), Stats::default());
        for j in 0..flood(&t) {
            let (name, addr, hello, stats) = (t.name.clone(), t.addr, hello.clone(), stats.clone());
            let src = IpAddr::V4(SOURCES[j % SOURCES.len()]);
            let seed = seed ^ (((i * METRICS_FLOOD + j) as u64) << 24);
            tasks.spawn(async move {
                let mut rng = Rng::new(seed);
                // spread the first connects over the first second
                tokio::time::sleep(Duration::from_millis(rng.below(1000))).await;
                while Instant::now() < deadline {
                    let opened = |open: bool| {
                        let mut s = stats.lock().unwrap();
                        let s = s.entry(name.clone()).or_default();
                        if open {
                            s.opened += 1;
                            s.open += 1;
                            s.peak_open = s.peak_open.max(s.open);
                        } else {
                            s.refused += 1;
                        }
                    };
                    let r = one(how, src, addr, &hello, deadline, &mut rng, opened).await;
                    {
                        let mut s = stats.lock().unwrap();
                        let s = s.entry(name.clone()).or_default();
                        match r {
                            Conn::Refused => {}
                            Conn::Closed(held) => {
                                s.open -= 1;
                                s.closed_by_server += 1;
                                s.longest_closed_ms =
                                    s.longest_closed_ms.max(held.as_millis() as u64);
                            }
                            Conn::Held => {
                                s.open -= 1;
                                s.open_at_end += 1;
                            }
                        }
                    }
                    let jitter = Duration::from_millis(rng.below(PAUSE.as_millis() as u64 / 2));
                    tokio::time::sleep(PAUSE + jitter).await;
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    let out = std::mem::take(&mut *stats.lock().unwrap());
    out
}

enum Conn {
    Refused,
    /// The server closed it after this long.
    Closed(Duration),
    /// Still open at the attack's end (we closed it).
    Held,
}

/// A request head that never ends: its first bytes, then padding for as long as it takes.
const PARTIAL_HEAD: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ";
/// A request sent [`PIPELINED_COUNT`] times at once on a connection whose answers are never
/// read.
const PIPELINED: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
/// Few: on loopback a server's send buffer grows to about a megabyte, so each answer the
/// server writes stays in kernel memory until the connection closes. 32 of them on each of
/// 264 connections per metrics endpoint put the machine's TCP memory under pressure (tcp_mem)
/// and stalled every loopback connection for seconds: a flood of the host, not of the
/// listener.
const PIPELINED_COUNT: usize = 4;
/// The receive buffer of a connection that never reads: the server's writes stall after a few
/// KiB, as behind a slow or hostile reader, instead of filling an auto-tuned buffer of
/// megabytes with pages it is asked for again and again.
const UNREAD_BUFFER: u32 = 4096;

async fn connect(src: IpAddr, addr: SocketAddr, how: Behaviour) -> Option<tokio::net::TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4().ok()?;
    if how == Behaviour::Pipelined {
        let _ = sock.set_recv_buffer_size(UNREAD_BUFFER);
    }
    // the attacker's own sources; the default one if the kernel will not have it
    let _ = sock.bind(SocketAddr::new(src, 0));
    tokio::time::timeout(Duration::from_secs(2), sock.connect(addr))
        .await
        .ok()?
        .ok()
}

async fn one(
    how: Behaviour,
    src: IpAddr,
    addr: SocketAddr,
    hello: &[u8],
    deadline: Instant,
    rng: &mut Rng,
    opened: impl FnOnce(bool),
) -> Conn {
    let t0 = Instant::now();
    let Some(mut s) = connect(src, addr, how).await else {
        opened(false);
        return Conn::Refused;
    };
    opened(true);
    let until = tokio::time::Instant::from_std(deadline);
    match how {
        Behaviour::IdleHello => {
            let _ = s.write_all(hello).await;
        }
        Behaviour::Garbage => {
            let junk: Vec<u8> = (0..2048).map(|_| rng.next_u64() as u8).collect();
            let _ = s.write_all(&junk).await;
        }
        Behaviour::HalfOpen => {
            let _ = s.shutdown().await;
        }
        Behaviour::Pipelined => {
            // the requests, then never a read: a byte a second more (the start of one more
            // request head) tells when the server has closed
            let burst = PIPELINED.repeat(PIPELINED_COUNT);
            let wrote = async {
                s.write_all(&burst).await?;
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    s.write_all(b"G").await?;
                }
            };
            return tokio::select! {
                _ = tokio::time::sleep_until(until) => Conn::Held,
                r = wrote => {
                    let _: std::io::Result<()> = r;
                    Conn::Closed(t0.elapsed())
                }
            };
        }
        Behaviour::Slowloris | Behaviour::Silent | Behaviour::PartialHead => {}
    }
    // then only read (and drip), until the server closes or the attack ends
    let drip: &[u8] = match how {
        Behaviour::Slowloris => hello,
        Behaviour::PartialHead => PARTIAL_HEAD,
        _ => &[],
    };
    let mut buf = [0u8; 4096];
    let mut next_byte = 0;
    loop {
        let tick = tokio::time::sleep(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return Conn::Held,
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return Conn::Closed(t0.elapsed()),
                Ok(_) => {}
            },
            _ = tick, if !drip.is_empty() => {
                // past the head's start, padding: the head never ends
                let byte = drip.get(next_byte).copied().unwrap_or(b'a');
                if how == Behaviour::Slowloris && next_byte >= drip.len() {
                    continue;
                }
                if s.write_all(&[byte]).await.is_err() {
                    return Conn::Closed(t0.elapsed());
                }
                next_byte += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_listeners_get_http_attacks_and_the_rest_tls_ones() {
        let http: Vec<&str> = Attack::ALL
            .iter()
            .map(|a| behaviour(*a, Proto::Http).name())
            .collect();
        assert_eq!(
            http,
            ["silent", "partial-head", "garbage", "pipelined-unread"]
        );
        for a in Attack::ALL {
            assert_eq!(behaviour(a, Proto::Tls).name(), a.name());
            assert_eq!(behaviour(a, Proto::Tls), behaviour(a, Proto::Binary));
        }
        let metrics = Target {
            name: "metrics A0".into(),
            addr: "127.0.0.1:1".parse().unwrap(),
            proto: Proto::Http,
        };
        let admin = Target {
            name: "admin".into(),
            ..metrics.clone()
        };
        assert!(flood(&metrics) > 256 && flood(&admin) > 64);
    }
}
