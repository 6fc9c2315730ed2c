//! The forwarding headers the proxy adds for its backend: `X-Forwarded-For`, `-Proto`, `-Host`,
//! RFC 7239 `Forwarded` and, when asked, `Via` (RFC 9110 section 7.6.3).
//!
//! The agent is usually the first hop that knows the client, so what a client sends in these
//! headers is thrown away and replaced: anyone could claim any address. A client whose address
//! is in the trusted networks (`--proxy-protocol-from`, given explicitly) is a proxy in front of
//! the agent: its headers are kept and this hop is appended to them. `Via` is appended to
//! whatever came (it names hops, not clients).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::Version;

use baton_ops::cidr::Cidr;

pub const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub const FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const FORWARDED: HeaderName = http::header::FORWARDED;

/// The via pseudonym: the agent's name, never its address or version.
const VIA_NAME: &str = "baton";

/// Which clients' forwarding headers are kept, and whether `Via` is added.
#[derive(Debug, Clone, Default)]
pub struct Forwarding {
    /// Clients whose forwarding headers are believed (empty: nobody's).
    pub trusted: Vec<Cidr>,
    /// Add `Via: 1.1 baton` (or `2 baton`) to requests.
    pub via: bool,
}

/// What the proxy knows about one request's hop: the client, the host it asked for and the
/// HTTP version it spoke.
#[derive(Debug, Clone, Copy)]
pub struct Hop<'a> {
    pub client: SocketAddr,
    pub host: Option<&'a str>,
    pub version: Version,
}

impl Forwarding {
    /// Sets this hop's forwarding headers on a request for a backend.
    pub fn apply(&self, h: &mut HeaderMap, hop: Hop<'_>) {
        let trusted = Cidr::any_contains(&self.trusted, hop.client.ip());
        let ip = hop.client.ip();
        // X-Forwarded-For: the chain of clients, this one last.
        let mut xff = String::new();
        if trusted {
            xff = joined(h, &FORWARDED_FOR);
            if !xff.is_empty() {
                xff.push_str(", ");
            }
        }
        let _ = write!(xff, "{ip}");
        set(h, FORWARDED_FOR, &xff);
        // X-Forwarded-Proto and -Host: the first hop's; a trusted proxy's stay.
        if !(trusted && h.contains_key(&FORWARDED_PROTO)) {
            h.insert(FORWARDED_PROTO, HeaderValue::from_static("https"));
        }
        if !(trusted && h.contains_key(&FORWARDED_HOST)) {
            h.remove(&FORWARDED_HOST);
            if let Some(host) = hop.host {
                set(h, FORWARDED_HOST, host);
            }
        }
        // Forwarded: one element per hop, this one last.
        let mut fwd = String::new();
        if trusted {
            fwd = joined(h, &FORWARDED);
            if !fwd.is_empty() {
                fwd.push_str(", ");
            }
        }
        element(&mut fwd, ip, hop.host);
        set(h, FORWARDED, &fwd);
        if self.via {
            let mut via = joined(h, &http::header::VIA);
            if !via.is_empty() {
                via.push_str(", ");
            }
            let version = match hop.version {
                Version::HTTP_2 => "2",
                Version::HTTP_10 => "1.0",
                _ => "1.1",
            };
            let _ = write!(via, "{version} {VIA_NAME}");
            set(h, http::header::VIA, &via);
        }
    }
}

/// Every value of `name`, comma-joined (a header may come in several lines); values that are
/// not text are dropped.
fn joined(h: &HeaderMap, name: &HeaderName) -> String {
    let mut out = String::new();
    for v in h.get_all(name).iter().filter_map(|v| v.to_str().ok()) {
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(v.trim());
    }
    out
}

/// Replaces every value of `name` with `value` (dropped if it cannot be a header value).
fn set(h: &mut HeaderMap, name: HeaderName, value: &str) {
    match HeaderValue::from_str(value) {
        Ok(v) => {
            h.insert(name, v);
        }
        Err(_) => {
            h.remove(name);
        }
    }
}

/// One RFC 7239 element: `for=...;proto=https;host=...`. IPv6 addresses and hosts with a port
/// are quoted strings, as the RFC's grammar needs.
fn element(out: &mut String, ip: IpAddr, host: Option<&str>) {
    match ip {
        IpAddr::V4(v4) => {
            let _ = write!(out, "for={v4}");
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "for=\"[{v6}]\"");
        }
    }
    out.push_str(";proto=https");
    if let Some(host) = host.filter(|h| h.bytes().all(is_host_byte)) {
        if host.bytes().all(is_token_byte) {
            let _ = write!(out, ";host={host}");
        } else {
            let _ = write!(out, ";host=\"{host}\"");
        }
    }
}

/// Bytes a host (with port, or an IPv6 literal) may have: nothing a quoted string must escape.
fn is_host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~:[]!$&'()*+,;=%".contains(&b)
}

/// RFC 9110 tchar: a value of only these needs no quotes.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn hop(client: &str, host: Option<&'static str>) -> Hop<'static> {
        Hop {
            client: client.parse().unwrap(),
            host,
            version: Version::HTTP_11,
        }
    }

    /// A header map of `pairs`, in order (names may repeat).
    pub(crate) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn get<'a>(h: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    const SPOOFED: [(&str, &str); 4] = [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-proto", "http"),
        ("x-forwarded-host", "evil.example"),
        ("forwarded", "for=6.6.6.6"),
    ];

    #[test]
    fn an_untrusted_clients_headers_are_replaced() {
        let mut h = headers(&SPOOFED);
        Forwarding::default().apply(&mut h, hop("192.0.2.7:5000", Some("example.com")));
        assert_eq!(get(&h, "x-forwarded-for"), ["192.0.2.7"]);
        assert_eq!(get(&h, "x-forwarded-proto"), ["https"]);
        assert_eq!(get(&h, "x-forwarded-host"), ["example.com"]);
        assert_eq!(
            get(&h, "forwarded"),
            ["for=192.0.2.7;proto=https;host=example.com"]
        );
        assert!(h.get("via").is_none());
    }

    #[test]
    fn a_trusted_proxys_headers_are_appended_to() {
        let mut h = headers(&SPOOFED);
        h.append("x-forwarded-for", "10.1.1.1".parse().unwrap());
        let f = Forwarding {
            trusted: vec!["192.0.2.0/24".parse().unwrap()],
            via: true,
        };
        f.apply(&mut h, hop("192.0.2.7:5000", Some("example.com:8443")));
        assert_eq!(get(&h, "x-forwarded-for"), ["6.6.6.6, 10.1.1.1, 192.0.2.7"]);
        assert_eq!(get(&h, "x-forwarded-proto"), ["http"]);
        assert_eq!(get(&h, "x-forwarded-host"), ["evil.example"]);
        assert_eq!(
            get(&h, "forwarded"),
            ["for=6.6.6.6, for=192.0.2.7;proto=https;host=\"example.com:8443\""]
        );
        assert_eq!(get(&h, "via"), ["1.1 baton"]);
    }

    #[test]
    fn ipv6_clients_are_quoted_and_via_names_the_version() {
        let mut h = headers(&[("via", "1.1 cdn")]);
        let f = Forwarding {
            trusted: vec![],
            via: true,
        };
        let mut hop = hop("[2001:db8::1]:443", None);
        hop.version = Version::HTTP_2;
        f.apply(&mut h, hop);
        assert_eq!(get(&h, "forwarded"), ["for=\"[2001:db8::1]\";proto=https"]);
        assert_eq!(get(&h, "x-forwarded-for"), ["2001:db8::1"]);
        assert!(h.get("x-forwarded-host").is_none());
        assert_eq!(get(&h, "via"), ["1.1 cdn, 2 baton"]);
    }

    #[test]
    fn a_host_with_quotes_is_left_out_of_forwarded() {
        let mut h = HeaderMap::new();
        Forwarding::default().apply(&mut h, hop("192.0.2.7:1", Some("a\"b")));
        assert_eq!(get(&h, "forwarded"), ["for=192.0.2.7;proto=https"]);
    }
}
