//! The admin endpoints' client: one plain HTTP/1.1 exchange with a bearer token, for the
//! rollout (a dispatcher's `GET /agents`), `baton rollout` and the tests.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{anyhow, Context};
use baton_ops::guard::Token;

/// One plain HTTP/1.1 exchange on loopback (`Connection: close`), bounded by `limit` per read
/// and write: the admin endpoints' client, for the rollout and `baton rollout`.
pub fn http(
    addr: SocketAddr,
    token: &Token,
    method: &str,
    path: &str,
    body: &str,
    limit: Duration,
) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(limit))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        token.expose(),
        body.len()
    )?;
    let mut raw = Vec::new();
    // an admin answer is a few KiB: a bound keeps a confused peer from filling memory
    s.take(4 << 20)
        .read_to_end(&mut raw)
        .with_context(|| format!("reading the answer of {addr}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("{addr}: no HTTP response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("{addr}: bad status line {:?}", head.lines().next()))?;
    Ok((status, rest.to_string()))
}
