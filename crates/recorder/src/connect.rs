//! The proxy's first request on a connection, sans-IO: `CONNECT host:port` opens a tunnel the
//! recorder intercepts; anything else (a plain `http://` request) is refused, since only what
//! `baton bench` replays — HTTPS — is recorded.

/// Bytes a request head may take before the connection is refused.
pub const MAX_HEAD: usize = 8 * 1024;

#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// `CONNECT host:port`; `len` is the head's length (bytes after it belong to the tunnel).
    Connect { host: String, port: u16, len: usize },
    /// Another method: refused with this status and reason.
    Refuse { status: u16, reason: String },
}

/// Parses the start of a proxy connection: `Ok(None)` while the head is incomplete.
pub fn parse(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(format!("request head over {MAX_HEAD} bytes"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("not an HTTP request: {e}")),
    };
    let (method, target) = (req.method.unwrap_or(""), req.path.unwrap_or(""));
    if method != "CONNECT" {
        let reason = if target.starts_with("http://") {
            "baton record records HTTPS only: load https:// URLs through it".to_string()
        } else {
            format!("baton record is an HTTPS proxy: {method} is not CONNECT")
        };
        return Ok(Some(Head::Refuse {
            status: 400,
            reason,
        }));
    }
    match authority(target) {
        Some((host, port)) => Ok(Some(Head::Connect { host, port, len })),
        None => Ok(Some(Head::Refuse {
            status: 400,
            reason: format!("CONNECT `{target}`: not host:port"),
        })),
    }
}

/// `host:port` or `[v6]:port` -> (host without brackets, lowercase; port).
fn authority(target: &str) -> Option<(String, u16)> {
    let (host, port) = target.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')?
            .parse::<std::net::Ipv6Addr>()
            .ok()?
            .to_string(),
        None => host.to_string(),
    };
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b));
    ok.then(|| (host.to_ascii_lowercase(), port))
}

/// `host:port` as a URL authority: IPv6 in brackets, the default https port left out.
pub fn url_authority(host: &str, port: u16) -> String {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    if port == 443 {
        host
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn connect_heads() {
        let h = b"CONNECT Shop.Example:443 HTTP/1.1\r\nHost: shop.example:443\r\n\r\n";
        assert_eq!(
            parse(h).unwrap(),
            Some(Head::Connect {
                host: "shop.example".into(),
                port: 443,
                len: h.len()
            })
        );
        assert_eq!(parse(&h[..20]).unwrap(), None);
        let v6 = parse(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").unwrap();
        assert!(matches!(v6, Some(Head::Connect { ref host, port: 8443, .. }) if host == "::1"));
        assert_eq!(url_authority("::1", 8443), "[::1]:8443");
        assert_eq!(url_authority("a.test", 443), "a.test");
    }

    #[test]
    fn refusals() {
        let plain = parse(b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n").unwrap();
        assert!(
            matches!(plain, Some(Head::Refuse { status: 400, ref reason }) if reason.contains("HTTPS only"))
        );
        for bad in [
            &b"CONNECT a.test HTTP/1.1\r\n\r\n"[..],
            b"CONNECT a.test:0 HTTP/1.1\r\n\r\n",
            b"CONNECT a/b:443 HTTP/1.1\r\n\r\n",
            b"CONNECT [zz]:443 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(parse(bad).unwrap(), Some(Head::Refuse { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(parse(b"\x16\x03\x01\x00\x05hello\r\n\r\n").is_err());
        let long = format!("CONNECT a.test:443 HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD));
        assert!(parse(long.as_bytes()).unwrap_err().contains("over"));
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse(&bytes);
        }
    }
}
