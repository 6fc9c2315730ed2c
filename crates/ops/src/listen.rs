//! Listening sockets and the start-up lines every Baton server prints on stdout
//! (`listening KIND ADDR` for each socket, then `ready`), which scripts, tests and `baton up`
//! wait for; port 0 therefore works everywhere.

use std::io::Write as _;
use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::{TcpListener, TcpSocket};

/// Binds with SO_REUSEADDR and a deep backlog, which absorbs benchmarks' connection bursts
/// (the kernel caps it at somaxconn).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

/// Sets TCP_NODELAY on a listening socket, for the sockets it accepts: Linux copies it onto
/// each of them, which saves a server that wants it on every connection one system call per
/// connection. Returns whether accepted sockets get it that way (on Linux only; elsewhere
/// the caller sets it on each connection).
pub fn nodelay_on_accept(listener: &TcpListener) -> bool {
    cfg!(target_os = "linux")
        && socket2::SockRef::from(listener)
            .set_tcp_nodelay(true)
            .is_ok()
}

/// Sets TCP keepalive on a listening socket for the sockets it accepts, as
/// [`nodelay_on_accept`] does TCP_NODELAY; returns whether they get it that way.
pub fn keepalive_on_accept(listener: &TcpListener, keepalive: &socket2::TcpKeepalive) -> bool {
    cfg!(target_os = "linux")
        && socket2::SockRef::from(listener)
            .set_tcp_keepalive(keepalive)
            .is_ok()
}

/// Prints `listening KIND ADDR` for each listener, then `ready`, and flushes.
pub fn announce<'a>(
    listeners: impl IntoIterator<Item = (&'a str, &'a TcpListener)>,
) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for (kind, l) in listeners {
        writeln!(out, "listening {kind} {}", l.local_addr()?)?;
    }
    writeln!(out, "ready")?;
    out.flush()
}

/// A server's sockets: its service listeners (announced as `kind`) and an optional metrics
/// listener, all bound before anything is announced, then announced with `ready`.
pub fn open(
    kind: &str,
    listen: &[SocketAddr],
    metrics: Option<SocketAddr>,
) -> anyhow::Result<(Vec<TcpListener>, Option<TcpListener>)> {
    let (listeners, _, metrics) = open_with(kind, listen, None, metrics)?;
    Ok((listeners, metrics))
}

/// [`open`] with one more listener of its own kind (the agent's link), announced before
/// `ready` like the others.
#[allow(clippy::type_complexity)]
pub fn open_with(
    kind: &str,
    listen: &[SocketAddr],
    extra: Option<(&str, SocketAddr)>,
    metrics: Option<SocketAddr>,
) -> anyhow::Result<(Vec<TcpListener>, Option<TcpListener>, Option<TcpListener>)> {
    let mut listeners = Vec::new();
    for addr in listen {
        listeners.push(bind(*addr).with_context(|| format!("listening on {addr}"))?);
    }
    let extra = match extra {
        Some((k, addr)) => Some((k, bind(addr).with_context(|| format!("{k} on {addr}"))?)),
        None => None,
    };
    let metrics = match metrics {
        Some(addr) => Some(bind(addr).with_context(|| format!("metrics on {addr}"))?),
        None => None,
    };
    announce(
        listeners
            .iter()
            .map(|l| (kind, l))
            .chain(extra.iter().map(|(k, l)| (*k, l)))
            .chain(metrics.iter().map(|l| ("metrics", l))),
    )?;
    Ok((listeners, extra.map(|(_, l)| l), metrics))
}

/// Groups of listeners, each announced as its kind (`tls`, `http`, ...), then the metrics
/// listener: all bound before anything is announced, then `ready`.
pub fn open_groups(
    groups: &[(&str, &[SocketAddr])],
    metrics: Option<SocketAddr>,
) -> anyhow::Result<(Vec<Vec<TcpListener>>, Option<TcpListener>)> {
    let mut bound = Vec::new();
    for (kind, addrs) in groups {
        let mut listeners = Vec::new();
        for addr in *addrs {
            listeners.push(bind(*addr).with_context(|| format!("{kind} on {addr}"))?);
        }
        bound.push(listeners);
    }
    let metrics = match metrics {
        Some(addr) => Some(bind(addr).with_context(|| format!("metrics on {addr}"))?),
        None => None,
    };
    announce(
        groups
            .iter()
            .zip(&bound)
            .flat_map(|((kind, _), ls)| ls.iter().map(move |l| (*kind, l)))
            .chain(metrics.iter().map(|l| ("metrics", l))),
    )?;
    Ok((bound, metrics))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`nodelay_on_accept`] relies on: the kernel copies the option onto accepted sockets.
    #[tokio::test]
    async fn accepted_sockets_inherit_nodelay() {
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let inherited = nodelay_on_accept(&l);
        let addr = l.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = l.accept().await.unwrap();
        assert_eq!(accepted.nodelay().unwrap(), inherited);
        if cfg!(target_os = "linux") {
            assert!(inherited);
        }
    }
}
