//! Who may use an admin endpoint: whoever shows the admin token, from a client that is not a
//! web page.
//!
//! The token is a random secret in a file only its owner can read (`--admin-token-file`,
//! created when missing), sent as `Authorization: Bearer TOKEN` and compared in constant time.
//! Browsers are shut out whatever they carry: a request with an `Origin` header (every
//! cross-origin `fetch`, even `no-cors`) is refused, and so is a `Host` that is not this
//! endpoint's own address or `localhost` (DNS rebinding: a page whose name resolves to
//! 127.0.0.1). A body must be `application/json`, which no page can send without a preflight.

use std::fmt;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::{bail, Context};
use http::{header, request::Parts, StatusCode};
use zeroize::Zeroizing;

/// Bytes of randomness in a new token (written as hex).
const TOKEN_BYTES: usize = 32;
/// The shortest token accepted from a file an operator wrote.
const MIN_TOKEN_CHARS: usize = 32;

/// The admin token, zeroized when dropped, never printed.
pub struct Token(Zeroizing<String>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// Reads the token from `path`, or makes a new one there (mode 0600) if there is no file.
    pub fn load_or_create(path: &Path) -> anyhow::Result<Self> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => Self::load(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::create(path),
            Err(e) => Err(e).with_context(|| format!("admin token file {}", path.display())),
        }
    }

    /// Reads the token from `path`: a file that only its owner may read or write.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let what = || format!("admin token file {}", path.display());
        let meta = std::fs::metadata(path).with_context(what)?;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            bail!(
                "{}: mode {:o} lets others read or change it; run `chmod 600 {}`",
                what(),
                mode & 0o777,
                path.display()
            );
        }
        let text = Zeroizing::new(std::fs::read_to_string(path).with_context(what)?);
        let token = text.trim();
        if token.len() < MIN_TOKEN_CHARS || token.chars().any(|c| c.is_whitespace()) {
            bail!(
                "{}: a token is one word of at least {MIN_TOKEN_CHARS} characters \
                 (delete the file and a new one is made)",
                what()
            );
        }
        Ok(Self(Zeroizing::new(token.to_owned())))
    }

    /// Makes a new random token in `path` (which must not exist), readable by its owner only.
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let mut raw = Zeroizing::new([0u8; TOKEN_BYTES]);
        aws_lc_rs::rand::fill(raw.as_mut()).map_err(|_| anyhow::anyhow!("no randomness"))?;
        let mut hex = Zeroizing::new(String::with_capacity(2 * TOKEN_BYTES + 1));
        for b in raw.iter() {
            hex.push_str(&format!("{b:02x}"));
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("creating admin token file {}", path.display()))?;
        file.write_all(hex.as_bytes())?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        Ok(Self(hex))
    }

    /// The token's text, for a client's `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn matches(&self, offered: &[u8]) -> bool {
        aws_lc_rs::constant_time::verify_slices_are_equal(self.0.as_bytes(), offered).is_ok()
    }
}

/// The bounds of an admin endpoint: `lifetime` is a connection's whole life (an operation that
/// answers when it is done needs long). A peer that showed the token is never pushed out for a
/// newcomer; up to `CONNECTIONS` strangers are, the oldest first.
pub fn admin_limits(lifetime: std::time::Duration) -> crate::control::Limits {
    const CONNECTIONS: usize = 16;
    const PROVEN: usize = 8;
    crate::control::Limits {
        slots: crate::slots::Slots::new(crate::slots::Table::new(CONNECTIONS, CONNECTIONS, PROVEN)),
        header_timeout: std::time::Duration::from_secs(10),
        write_timeout: std::time::Duration::from_secs(10),
        lifetime,
        requests: 100,
    }
}

/// Serves an admin endpoint on `listener` until `stop`: every request `handle` sees has passed
/// [`check`] with `token` (a refused one is answered, counted in `counters.denied` and logged,
/// and its connection closed), and its connection is never pushed out for a newcomer from then
/// on.
pub async fn serve_admin<H, F>(
    listener: tokio::net::TcpListener,
    stop: tokio_util::sync::CancellationToken,
    token: std::sync::Arc<Token>,
    lifetime: std::time::Duration,
    counters: std::sync::Arc<crate::control::Counters>,
    handle: H,
) where
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = http::Response<http_body_util::Full<bytes::Bytes>>>
        + Send
        + 'static,
{
    let Ok(local) = listener.local_addr() else {
        return;
    };
    let limits = admin_limits(lifetime);
    crate::control::serve(
        listener,
        stop,
        limits,
        counters.clone(),
        move |req, slot| {
            let (token, counters, handle) = (token.clone(), counters.clone(), handle.clone());
            async move {
                let (parts, body) = req.into_parts();
                if let Err(why) = check(&parts, &token, local) {
                    counters
                        .denied
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(reason = ?why, path = parts.uri.path(), "admin call refused");
                    // and the connection ends: one that asked wrongly keeps no slot
                    let mut refused = crate::reply::refused(why);
                    refused.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                    return refused;
                }
                slot.prove();
                handle(http::Request::from_parts(parts, body)).await
            }
        },
    )
    .await
}

/// Why a request was refused, with the status to answer it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// An `Origin` header: a web page sent it.
    CrossOrigin,
    /// A `Host` other than this endpoint's address or `localhost`.
    ForeignHost,
    /// No token, or the wrong one.
    Unauthorized,
    /// A body that is not `application/json`.
    NotJson,
}

impl Refusal {
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::CrossOrigin | Refusal::ForeignHost => StatusCode::FORBIDDEN,
            Refusal::Unauthorized => StatusCode::UNAUTHORIZED,
            Refusal::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::CrossOrigin => "requests from web pages (an Origin header) are refused\n",
            Refusal::ForeignHost => "Host must be this endpoint's address or localhost\n",
            Refusal::Unauthorized => {
                "send the admin token: Authorization: Bearer $(cat ADMIN_TOKEN_FILE)\n"
            }
            Refusal::NotJson => "a request body must be Content-Type: application/json\n",
        }
    }
}

/// Whether the request with these `parts`, received on `local`, may be served.
pub fn check(parts: &Parts, token: &Token, local: SocketAddr) -> Result<(), Refusal> {
    if parts.headers.contains_key(header::ORIGIN) {
        return Err(Refusal::CrossOrigin);
    }
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| parts.uri.authority().map(|a| a.as_str()));
    if !host.is_some_and(|h| own_host(h, local)) {
        return Err(Refusal::ForeignHost);
    }
    let offered = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if !offered.is_some_and(|t| token.matches(t)) {
        return Err(Refusal::Unauthorized);
    }
    if has_body(parts) && !is_json(parts) {
        return Err(Refusal::NotJson);
    }
    Ok(())
}

/// `host[:port]` names this endpoint: `localhost` or its own address (a loopback one for
/// any loopback listener), with its port if one is given.
fn own_host(value: &str, local: SocketAddr) -> bool {
    let Ok(authority) = value.parse::<http::uri::Authority>() else {
        return false;
    };
    if authority.port_u16().is_some_and(|p| p != local.port()) {
        return false;
    }
    let name = authority.host();
    if name.eq_ignore_ascii_case("localhost") {
        return local.ip().is_loopback();
    }
    let name = name.trim_start_matches('[').trim_end_matches(']');
    match name.parse::<IpAddr>() {
        Ok(ip) => ip == local.ip() || (ip.is_loopback() && local.ip().is_loopback()),
        Err(_) => false,
    }
}

fn has_body(parts: &Parts) -> bool {
    parts.headers.contains_key(header::TRANSFER_ENCODING)
        || parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| n.trim() != "0")
}

fn is_json(parts: &Parts) -> bool {
    parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token(Zeroizing::new("a".repeat(64)))
    }

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder()
            .method("POST")
            .uri("/agents/0/disable");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    const LOCAL: &str = "127.0.0.1:9000";

    fn ok_headers() -> Vec<(&'static str, String)> {
        vec![
            ("host", LOCAL.to_string()),
            ("authorization", format!("Bearer {}", "a".repeat(64))),
        ]
    }

    fn checked(extra: &[(&str, &str)], drop: &str) -> Result<(), Refusal> {
        let base = ok_headers();
        let mut h: Vec<(&str, &str)> = base
            .iter()
            .filter(|(k, _)| *k != drop)
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        h.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
        h.extend_from_slice(extra);
        check(&parts(&h), &token(), LOCAL.parse().unwrap())
    }

    #[test]
    fn the_token_from_this_host_passes() {
        assert_eq!(checked(&[], ""), Ok(()));
        assert_eq!(checked(&[("host", "localhost:9000")], ""), Ok(()));
        assert_eq!(checked(&[("host", "127.0.0.1")], ""), Ok(()));
    }

    #[test]
    fn pages_and_rebinding_are_refused() {
        assert_eq!(
            checked(&[("origin", "http://evil.example")], ""),
            Err(Refusal::CrossOrigin)
        );
        assert_eq!(
            checked(&[("origin", "null")], ""),
            Err(Refusal::CrossOrigin)
        );
        for host in [
            "evil.example:9000",
            "evil.example",
            "127.0.0.1:9001",
            "10.0.0.1:9000",
            "",
        ] {
            assert_eq!(
                checked(&[("host", host)], ""),
                Err(Refusal::ForeignHost),
                "{host}"
            );
        }
        assert_eq!(checked(&[], "host"), Err(Refusal::ForeignHost));
    }

    #[test]
    fn a_missing_or_wrong_token_is_refused() {
        assert_eq!(checked(&[], "authorization"), Err(Refusal::Unauthorized));
        let wrong = format!("Bearer {}", "b".repeat(64));
        assert_eq!(
            checked(&[("authorization", &wrong)], ""),
            Err(Refusal::Unauthorized)
        );
        let short = format!("Bearer {}", "a".repeat(63));
        assert_eq!(
            checked(&[("authorization", &short)], ""),
            Err(Refusal::Unauthorized)
        );
        let basic = format!("Basic {}", "a".repeat(64));
        assert_eq!(
            checked(&[("authorization", &basic)], ""),
            Err(Refusal::Unauthorized)
        );
    }

    #[test]
    fn bodies_must_be_json() {
        assert_eq!(
            checked(
                &[("content-length", "7"), ("content-type", "text/plain")],
                ""
            ),
            Err(Refusal::NotJson)
        );
        assert_eq!(
            checked(&[("content-length", "7")], ""),
            Err(Refusal::NotJson)
        );
        assert_eq!(
            checked(
                &[
                    ("content-length", "7"),
                    ("content-type", "application/json; charset=utf-8")
                ],
                ""
            ),
            Ok(())
        );
        assert_eq!(checked(&[("content-length", "0")], ""), Ok(()));
    }

    #[test]
    fn token_files_are_made_private_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let made = Token::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(made.expose().len(), 2 * TOKEN_BYTES);
        let read = Token::load_or_create(&path).unwrap();
        assert_eq!(read.expose(), made.expose());
        assert_eq!(format!("{read:?}"), "Token(..)", "never printed");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Token::load(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");

        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Token::load(&short).is_err());
    }
}
