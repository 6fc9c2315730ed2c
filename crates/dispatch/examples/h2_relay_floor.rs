//! The tokio + h2 relay floor (`scripts/bench-dispatch`): `relay_floor.rs` again, on the stack
//! the dispatcher is built on, so the two floors side by side say what the runtime and the
//! multiplexer cost before the dispatcher adds anything of its own.
//!
//! `front`: a current-thread tokio runtime, one h2 client connection per `demux`, and per
//! client one task and one h2 stream (round robin over the links), the client's address as a
//! request header; both directions copied in that one task. h2's own flow control and
//! buffering, nothing else: no TLS peeking, routing, deadlines, metrics, link authentication
//! or write combining. `demux`: the agents' end (an h2 server), a TCP connection to AGENT per
//! stream with a PROXY v2 header first; its CPU is not the front's.
//!
//! A measuring instrument, not a server: no limits or deadlines, run only by the benchmark on
//! 127.0.0.1.
//!
//! `FLOOR_MOVES=1` (front, two demuxes): every connection also sends a migration's messages
//! once the agent's first bytes arrive, as the dispatcher's link does: a new stream to the
//! other demux carrying a 512-byte object (Import), its response headers (Ready), then a
//! last DATA frame (Commit); the bytes keep flowing on the first stream.
//!
//! Usage: h2_relay_floor front DEMUX_ADDR [DEMUX_ADDR ...] | h2_relay_floor demux AGENT_ADDR
//! Prints `listening ADDR` and `ready`, then relays until killed.

#[path = "floor/mod.rs"]
mod floor;

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match (args.get(1).map(String::as_str), args.len()) {
        (Some("front"), 3..) => runtime.block_on(front(floor::addrs(&args[2..])?)),
        (Some("demux"), 3) => runtime.block_on(demux(args[2].parse()?)),
        _ => anyhow::bail!(
            "usage: h2_relay_floor front DEMUX_ADDR... | h2_relay_floor demux AGENT_ADDR"
        ),
    }
}

async fn listen() -> anyhow::Result<TcpListener> {
    let listener = TcpListener::from_std(floor::listener()?)?;
    floor::announce(listener.local_addr()?)?;
    Ok(listener)
}

async fn front(demuxes: Vec<SocketAddr>) -> anyhow::Result<()> {
    let mut links = Vec::new();
    for addr in demuxes {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(256 << 10)
            .initial_connection_window_size(32 << 20)
            .handshake::<_, Bytes>(tcp)
            .await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                eprintln!("link: {e}");
                std::process::exit(1);
            }
        });
        links.push(send);
    }
    let moves = std::env::var_os("FLOOR_MOVES").is_some();
    anyhow::ensure!(!moves || links.len() == 2, "FLOOR_MOVES wants two demuxes");
    let listener = listen().await?;
    let local = listener.local_addr()?;
    let mut turn = 0usize;
    loop {
        let (client, from) = listener.accept().await?;
        let link = links[turn % links.len()].clone();
        let home = moves.then(|| links[(turn + 1) % links.len()].clone());
        turn += 1;
        tokio::spawn(async move {
            let request = http::Request::post("/")
                .header("baton-source", from.to_string())
                .header("baton-destination", local.to_string())
                .body(())
                .expect("a valid request");
            let Ok(mut link) = link.ready().await else {
                return;
            };
            let Ok((response, send)) = link.send_request(request, false) else {
                return;
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (first, first_seen) = tokio::sync::oneshot::channel();
            let up = copy_up(&mut from_client, send);
            let down = async {
                if let Ok(response) = response.await {
                    copy_down(response.into_body(), &mut to_client, Some(first)).await;
                }
            };
            let migrate = async {
                if let Some(home) = home {
                    if first_seen.await.is_ok() {
                        migrate(home).await;
                    }
                }
            };
            tokio::join!(up, down, migrate);
        });
    }
}

/// A socket's bytes into a stream, its EOF as the stream's end.
async fn copy_up(from: &mut (impl AsyncRead + Unpin), mut to: SendStream<Bytes>) {
    let mut buf = BytesMut::with_capacity(16 << 10);
    loop {
        buf.reserve(16 << 10);
        match from.read_buf(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.send_data(Bytes::new(), true);
                return;
            }
            Ok(_) => {
                if to.send_data(buf.split().freeze(), false).is_err() {
                    return;
                }
            }
        }
    }
}

/// A migration's messages to the home agent's link (`FLOOR_MOVES`).
async fn migrate(home: h2::client::SendRequest<Bytes>) {
    let Ok(mut home) = home.ready().await else {
        return;
    };
    let request = http::Request::post("/")
        .header("floor-import", "1")
        .body(())
        .expect("a valid request");
    let Ok((ready, mut send)) = home.send_request(request, false) else {
        return;
    };
    static SEALED: [u8; 512] = [0; 512];
    if send.send_data(Bytes::from_static(&SEALED), false).is_err() || ready.await.is_err() {
        return;
    }
    let _ = send.send_data(Bytes::from_static(b"commit"), true);
}

/// A stream's data onto a socket, its end as the socket's FIN; `first` told when data comes.
async fn copy_down(
    mut from: RecvStream,
    to: &mut (impl AsyncWrite + Unpin),
    mut first: Option<tokio::sync::oneshot::Sender<()>>,
) {
    while let Some(Ok(data)) = from.data().await {
        if let Some(first) = first.take() {
            let _ = first.send(());
        }
        let _ = from.flow_control().release_capacity(data.len());
        if to.write_all(&data).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

async fn demux(agent: SocketAddr) -> anyhow::Result<()> {
    let listener = listen().await?;
    let (tcp, _) = listener.accept().await?;
    let mut link = h2::server::Builder::new()
        .initial_window_size(256 << 10)
        .initial_connection_window_size(32 << 20)
        .max_concurrent_streams(100_000)
        .handshake::<_, Bytes>(tcp)
        .await?;
    while let Some(accepted) = link.accept().await {
        let (request, mut respond) = accepted?;
        if request.headers().contains_key("floor-import") {
            // the home agent's side of a move: the object, Ready at once, then the Commit
            tokio::spawn(async move {
                let mut body = request.into_body();
                let Some(Ok(object)) = body.data().await else {
                    return;
                };
                let _ = body.flow_control().release_capacity(object.len());
                if respond
                    .send_response(http::Response::new(()), true)
                    .is_err()
                {
                    return;
                }
                while let Some(Ok(data)) = body.data().await {
                    let _ = body.flow_control().release_capacity(data.len());
                }
            });
            continue;
        }
        tokio::spawn(async move {
            let source = request.headers().get("baton-source");
            let destination = request.headers().get("baton-destination");
            let parse = |v: Option<&http::HeaderValue>| v?.to_str().ok()?.parse().ok();
            let (Some(source), Some(destination)) = (parse(source), parse(destination)) else {
                return;
            };
            let Ok(mut upstream) = TcpStream::connect(agent).await else {
                return;
            };
            let _ = upstream.set_nodelay(true);
            let header = floor::proxy_header(source, destination);
            if upstream.write_all(&header).await.is_err() {
                return;
            }
            let Ok(send) = respond.send_response(http::Response::new(()), false) else {
                return;
            };
            let (mut from_agent, mut to_agent) = upstream.into_split();
            tokio::join!(
                copy_down(request.into_body(), &mut to_agent, None),
                copy_up(&mut from_agent, send)
            );
        });
    }
    Ok(())
}
