//! What the relay floors share (`relay_floor.rs`, `tokio_relay_floor.rs`, `h2_relay_floor.rs`).

#![allow(dead_code)] // each floor uses what it needs

pub mod frames;

use std::io::Write;
use std::net::SocketAddr;

/// A non-blocking listener on 127.0.0.1 whose accepted sockets inherit TCP_NODELAY, so that
/// no floor pays a system call per connection for it.
pub fn listener() -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    socket2::SockRef::from(&listener).set_tcp_nodelay(true)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Tells whoever started the floor where it listens (`listening ADDR`, then `ready`).
pub fn announce(addr: SocketAddr) -> std::io::Result<()> {
    println!("listening {addr}");
    println!("ready");
    std::io::stdout().flush()
}

/// The PROXY v2 header that tells the agent who the client is (`source`) and what it
/// connected to (`destination`): a stream's metadata on the floors' links.
pub fn proxy_header(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    use baton_wire::proxy_v2::{self, ProxyHeader};
    let mut header = Vec::with_capacity(28);
    proxy_v2::encode(
        &ProxyHeader::Proxy {
            source,
            destination,
        },
        &mut header,
    );
    header
}

/// The demux addresses a front was given.
pub fn addrs(args: &[String]) -> anyhow::Result<Vec<SocketAddr>> {
    anyhow::ensure!(!args.is_empty(), "no DEMUX_ADDR given");
    Ok(args.iter().map(|a| a.parse()).collect::<Result<_, _>>()?)
}
