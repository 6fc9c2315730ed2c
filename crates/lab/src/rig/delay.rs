//! A user-space delay proxy: adds round-trip time between the clients and the system under test
//! (the CSSL paper measured across 30 ms; this kernel has no netem).
//!
//! Every chunk read from one side is written to the other side `rtt / 2` later, in order, for
//! both directions, so a handshake's flights each pay the delay as they would on a WAN link.
//! The outgoing connection is bound to the client's own source address (any 127.0.0.0/8 address
//! is local), so policies that hash the client address (`client-ip`, HAProxy `balance source`)
//! still see three "hosts" through the proxy. Memory is bounded per direction (a bounded queue:
//! a slow reader stops the writer's reads, which is TCP backpressure).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Chunks in flight per direction (each at most `CHUNK` bytes): bounds memory per connection.
const QUEUE: usize = 64;
const CHUNK: usize = 16 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A running delay proxy; stops when dropped.
pub struct DelayProxy {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl DelayProxy {
    /// Listens on 127.0.0.1 (an ephemeral port) and forwards to `upstream` with `rtt` added.
    pub fn start(upstream: SocketAddr, rtt: Duration) -> anyhow::Result<DelayProxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("delay-proxy")
            .enable_all()
            .build()?;
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .context("delay proxy: binding 127.0.0.1")?;
        let addr = listener.local_addr()?;
        let one_way = rtt / 2;
        runtime.spawn(async move {
            loop {
                let Ok((client, peer)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    if let Err(e) = relay(client, peer, upstream, one_way).await {
                        tracing::debug!("delay proxy {peer}: {e:#}");
                    }
                });
            }
        });
        Ok(DelayProxy {
            addr,
            runtime: Some(runtime),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn relay(
    client: TcpStream,
    peer: SocketAddr,
    upstream: SocketAddr,
    one_way: Duration,
) -> anyhow::Result<()> {
    let socket = if upstream.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Keep the client's "host" visible upstream; loopback accepts any 127.x source.
    if peer.ip().is_loopback() && peer.is_ipv4() == upstream.is_ipv4() {
        socket.bind(SocketAddr::new(peer.ip(), 0))?;
    }
    let server = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(upstream))
        .await
        .context("connect timed out")??;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = tokio::spawn(direction(cr, sw, one_way));
    let down = tokio::spawn(direction(sr, cw, one_way));
    let _ = tokio::join!(up, down);
    Ok(())
}

/// One direction: read, stamp with the time it may leave, queue; a second task writes each chunk
/// when its time comes. EOF travels the same way (as a shutdown after the delay).
async fn direction(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    one_way: Duration,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            // an error ends the direction like EOF does
            let n = from.read(&mut buf).await.unwrap_or_default();
            let due = Instant::now() + one_way;
            if tx.send((due, buf[..n].to_vec())).await.is_err() || n == 0 {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if chunk.is_empty() {
                let _ = to.shutdown().await;
                break;
            }
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn bytes_arrive_in_order_one_rtt_later_from_the_clients_address() {
        let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = echo.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, peer) = echo.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got).unwrap();
            (peer, got)
        });
        let proxy = DelayProxy::start(upstream, Duration::from_millis(40)).unwrap();
        let local = std::net::SocketAddr::from(([127, 0, 0, 7], 0));
        let mut c = connect_from(local, proxy.addr());
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let t0 = std::time::Instant::now();
        c.write_all(&sent).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        let (peer, got) = server.join().unwrap();
        assert_eq!(got, sent);
        assert_eq!(back, sent);
        assert_eq!(peer.ip(), local.ip(), "upstream sees the client's address");
        // A lower bound is a correctness property (the delay happened), not a timing assertion.
        assert!(t0.elapsed() >= Duration::from_millis(40));
    }

    /// A blocking std socket connected to `to` from the loopback address `from`.
    fn connect_from(from: std::net::SocketAddr, to: std::net::SocketAddr) -> std::net::TcpStream {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let s = rt.block_on(async {
            let s = TcpSocket::new_v4().unwrap();
            s.bind(from).unwrap();
            s.connect(to).await.unwrap().into_std().unwrap()
        });
        s.set_nonblocking(false).unwrap();
        s
    }
}
