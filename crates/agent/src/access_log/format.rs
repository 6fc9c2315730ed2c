//! A line, as text or JSON, into a reused buffer.
//!
//! Text is combined-like, then `key=value` fields (`-` for none):
//!
//! ```text
//! 127.0.0.1 - - [2026-11-28T22:40:01.123Z] "GET /a?b=1 HTTP/1.1" 200 1024 host="example.com" sni=example.com tls=TLSv1.3 suite=TLS13_AES_128_GCM_SHA256 handshake=full migrated=- agent=0 in=0 rt=0.000412 ut=0.000301 upstream=127.0.0.1:8080 route=- client=127.0.0.1:50412 alpn=http/1.1
//! ```
//!
//! A connection that carried no request has `"-"` for its request, `-` for status and sizes,
//! and `ct=` (how long it lasted) in place of `rt=`. JSON has the same fields under
//! snake_case keys (`kind` is `request` or `connection`; absent values are null).

use std::io::Write as _;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::counted::{End, Pending};
use super::record::{ConnFields, ConnLine, Migrated};
use super::Format;

/// One line's facts, borrowed from a record.
pub struct Line<'a> {
    pub at: SystemTime,
    pub conn: &'a ConnFields,
    pub request: Option<(&'a Pending, &'a End)>,
    /// A connection line's lifetime.
    pub lasted: Option<Duration>,
}

impl<'a> Line<'a> {
    pub fn of_request(p: &'a Pending) -> Option<Line<'a>> {
        let end = p.end.get()?;
        Some(Line {
            at: end.at,
            conn: &p.conn.fields,
            request: Some((p, end)),
            lasted: None,
        })
    }

    pub fn of_connection(c: &'a ConnLine) -> Line<'a> {
        Line {
            at: c.at,
            conn: &c.fields,
            request: None,
            lasted: Some(c.lasted),
        }
    }
}

/// Appends `line` and a newline to `out`.
pub fn write(out: &mut Vec<u8>, format: Format, line: &Line<'_>) {
    match format {
        Format::Text => text(out, line),
        Format::Json => json(out, line),
    }
    out.push(b'\n');
}

fn text(out: &mut Vec<u8>, l: &Line<'_>) {
    let c = l.conn;
    let at = humantime::format_rfc3339_micros(l.at);
    let _ = write!(out, "{} - - [{at}] ", c.peer.ip());
    match l.request {
        Some((p, end)) => {
            out.push(b'"');
            escaped(out, p.method.as_str().as_bytes());
            out.push(b' ');
            escaped(out, p.target.as_bytes());
            let v = version(p.version);
            let _ = write!(out, " {v}\" {} {} host=\"", end.status, end.bytes_out);
            escaped(out, p.host.as_deref().unwrap_or(b"-"));
            out.push(b'"');
        }
        None => out.extend_from_slice(b"\"-\" - - host=-"),
    }
    out.extend_from_slice(b" sni=");
    escaped(out, c.sni.as_deref().unwrap_or("-").as_bytes());
    let _ = write!(
        out,
        " tls={} suite={} handshake={} migrated=",
        c.version,
        c.suite,
        c.handshake.label()
    );
    match c.migrated {
        Migrated::No => out.push(b'-'),
        Migrated::From(id) => {
            let _ = write!(out, "{id}");
        }
        Migrated::Unknown => out.extend_from_slice(b"unknown"),
    }
    let _ = write!(out, " agent={}", c.agent_id);
    match l.request {
        Some((p, end)) => {
            let served = end.served.as_ref();
            let _ = write!(
                out,
                " in={} rt={:.6} ut=",
                p.bytes_in.load(std::sync::atomic::Ordering::Relaxed),
                end.request_time.as_secs_f64()
            );
            match served.and_then(|s| s.upstream_time) {
                Some(t) => {
                    let _ = write!(out, "{:.6}", t.as_secs_f64());
                }
                None => out.push(b'-'),
            }
            out.extend_from_slice(b" upstream=");
            escaped(
                out,
                served
                    .and_then(|s| s.upstream.as_deref())
                    .unwrap_or("-")
                    .as_bytes(),
            );
            out.extend_from_slice(b" route=");
            escaped(
                out,
                served
                    .and_then(|s| s.route.as_deref())
                    .unwrap_or("-")
                    .as_bytes(),
            );
        }
        None => {
            let lasted = l.lasted.unwrap_or_default().as_secs_f64();
            let _ = write!(out, " in=- ct={lasted:.6} ut=- upstream=- route=-");
        }
    }
    let _ = write!(out, " client={} alpn=", c.peer);
    escaped(out, c.alpn.as_deref().unwrap_or("-").as_bytes());
}

/// Bytes as they are if printable and not a quote or backslash; `\xHH` otherwise (a client
/// chooses its path and Host: it must not be able to forge a line or a field).
fn escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        if b.is_ascii_graphic() && b != b'"' && b != b'\\' {
            out.push(b);
        } else {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
}

/// A JSON line's fields, borrowed.
#[derive(Serialize)]
struct Json<'a> {
    time: String,
    kind: &'static str,
    client: String,
    client_ip: String,
    sni: Option<&'a str>,
    tls_version: &'a str,
    cipher_suite: &'a str,
    alpn: Option<&'a str>,
    handshake: &'static str,
    migrated: bool,
    migrated_from: Option<u16>,
    agent_id: u16,
    method: Option<&'a str>,
    host: Option<std::borrow::Cow<'a, str>>,
    path: Option<&'a str>,
    http_version: Option<&'static str>,
    status: Option<u16>,
    bytes_in: Option<u64>,
    bytes_out: Option<u64>,
    request_time: Option<f64>,
    connection_time: Option<f64>,
    upstream_time: Option<f64>,
    upstream: Option<&'a str>,
    route: Option<&'a str>,
}

fn json(out: &mut Vec<u8>, l: &Line<'_>) {
    let c = l.conn;
    let req = l.request;
    let served = req.and_then(|(_, e)| e.served.as_ref());
    let line = Json {
        time: humantime::format_rfc3339_micros(l.at).to_string(),
        kind: if req.is_some() {
            "request"
        } else {
            "connection"
        },
        client: c.peer.to_string(),
        client_ip: c.peer.ip().to_string(),
        sni: c.sni.as_deref(),
        tls_version: c.version,
        cipher_suite: &c.suite,
        alpn: c.alpn.as_deref(),
        handshake: c.handshake.label(),
        migrated: c.migrated != Migrated::No,
        migrated_from: match c.migrated {
            Migrated::No | Migrated::Unknown => None,
            Migrated::From(id) => Some(id),
        },
        agent_id: c.agent_id,
        method: req.map(|(p, _)| p.method.as_str()),
        host: req
            .and_then(|(p, _)| p.host.as_ref())
            .map(|h| String::from_utf8_lossy(h)),
        path: req.map(|(p, _)| &*p.target),
        http_version: req.map(|(p, _)| version(p.version)),
        status: req.map(|(_, e)| e.status),
        bytes_in: req.map(|(p, _)| p.bytes_in.load(std::sync::atomic::Ordering::Relaxed)),
        bytes_out: req.map(|(_, e)| e.bytes_out),
        request_time: req.map(|(_, e)| e.request_time.as_secs_f64()),
        connection_time: l.lasted.map(|d| d.as_secs_f64()),
        upstream_time: served
            .and_then(|s| s.upstream_time)
            .map(|d| d.as_secs_f64()),
        upstream: served.and_then(|s| s.upstream.as_deref()),
        route: served.and_then(|s| s.route.as_deref()),
    };
    // Writing to a Vec cannot fail, and every field serializes.
    let _ = serde_json::to_writer(&mut *out, &line);
}

fn version(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_backslashes_and_control_bytes_are_escaped() {
        let mut out = Vec::new();
        escaped(&mut out, b"/a\"b\\c\nd e\xff");
        assert_eq!(out, b"/a\\x22b\\x5cc\\x0ad\\x20e\\xff");
    }
}
