//! The attacker: misbehaving clients against every listener, bounded in count and in time, and
//! only ever against loopback (127.0.0.0/8).
//!
//! Per target, [`PER_TARGET`] connections at a time for the attack's length, each replaced
//! (after a short pause) when the server closes it:
//! - `idle-hello`: a real ClientHello (made by rustls), then silence;
//! - `slowloris`: the same ClientHello one byte a second;
//! - `garbage`: 2 KiB of random bytes, then silence;
//! - `half-open`: connect and shut down the write half at once.
//!
//! It records, per target, what the server did: connections refused, closed by the server (and
//! the longest it held one), and still open when the attack ended.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::schedule::{Attack, Rng};

/// Connections per target at a time.
pub const PER_TARGET: usize = 1;
/// Targets at most (so at most `PER_TARGET * MAX_TARGETS` attack connections at once).
pub const MAX_TARGETS: usize = 20;

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub opened: u64,
    pub refused: u64,
    pub closed_by_server: u64,
    pub open_at_end: u64,
    /// The longest a connection lasted before the server closed it, ms.
    pub longest_closed_ms: u64,
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

/// Runs `kind` against every `(name, addr)` for `len`; stats per target name.
pub async fn attack(
    kind: Attack,
    targets: Vec<(String, SocketAddr)>,
    len: Duration,
    seed: u64,
) -> BTreeMap<String, Stats> {
    assert!(targets.len() <= MAX_TARGETS, "too many attack targets");
    let hello = Arc::new(client_hello());
    let deadline = Instant::now() + len;
    let stats: Arc<Mutex<BTreeMap<String, Stats>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (name, addr)) in targets.into_iter().enumerate() {
        if !addr.ip().is_loopback() {
            // never anything but this machine
            tracing::warn!(%addr, "soak attacker: not a loopback address, skipped");
            continue;
        }
        for j in 0..PER_TARGET {
            let (name, hello, stats) = (name.clone(), hello.clone(), stats.clone());
            let seed = seed ^ (((i * PER_TARGET + j) as u64) << 32);
            tasks.spawn(async move {
                let mut rng = Rng::new(seed);
                while Instant::now() < deadline {
                    let r = one(kind, addr, &hello, deadline, &mut rng).await;
                    {
                        let mut s = stats.lock().unwrap();
                        let s = s.entry(name.clone()).or_default();
                        match r {
                            Conn::Refused => s.refused += 1,
                            Conn::Closed(held) => {
                                s.opened += 1;
                                s.closed_by_server += 1;
                                s.longest_closed_ms =
                                    s.longest_closed_ms.max(held.as_millis() as u64);
                            }
                            Conn::Held => {
                                s.opened += 1;
                                s.open_at_end += 1;
                            }
                        }
                    }
                    // at most a few new connections a second per slot
                    tokio::time::sleep(Duration::from_millis(250)).await;
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

async fn one(
    kind: Attack,
    addr: SocketAddr,
    hello: &[u8],
    deadline: Instant,
    rng: &mut Rng,
) -> Conn {
    let t0 = Instant::now();
    let connect =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr));
    let Ok(Ok(mut s)) = connect.await else {
        return Conn::Refused;
    };
    let until = tokio::time::Instant::from_std(deadline);
    // what we send; then we only read, until the server closes or the attack ends
    let sent = async {
        match kind {
            Attack::IdleHello => {
                let _ = s.write_all(hello).await;
            }
            Attack::Garbage => {
                let junk: Vec<u8> = (0..2048).map(|_| rng.next_u64() as u8).collect();
                let _ = s.write_all(&junk).await;
            }
            Attack::HalfOpen => {
                let _ = s.shutdown().await;
            }
            Attack::Slowloris => {}
        }
    };
    sent.await;
    let mut buf = [0u8; 4096];
    let mut next_byte = 0;
    loop {
        let drip = tokio::time::sleep(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return Conn::Held,
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return Conn::Closed(t0.elapsed()),
                Ok(_) => {}
            },
            _ = drip, if kind == Attack::Slowloris => {
                if next_byte < hello.len() {
                    if s.write_all(&hello[next_byte..next_byte + 1]).await.is_err() {
                        return Conn::Closed(t0.elapsed());
                    }
                    next_byte += 1;
                }
            }
        }
    }
}
