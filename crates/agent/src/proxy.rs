//! The SSL reverse proxy role: every request goes to a plain-HTTP backend, with the client's
//! address and certificate subject added as headers. With several backends the agent is the
//! paper's single TLS proxy (Pound) in front of a farm: requests go round robin, or by client
//! address so a client keeps its backend (Pound-IP).
//!
//! The agent is the TLS edge, so it is the first hop that knows the client: it *replaces*
//! `X-Forwarded-For`, `X-Forwarded-Proto` and `X-Client-Cert-Subject` rather than appending to
//! what the client sent, which would let any client claim any address or identity.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail};
use http::header::{self, HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::config::UpstreamBalance;
use crate::http::{text, Body, ConnInfo};

pub const CLIENT_SUBJECT: HeaderName = HeaderName::from_static("x-client-cert-subject");
const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Hop-by-hop headers (RFC 9110 section 7.6.1) never forwarded in either direction.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

#[derive(Debug)]
pub struct Proxy {
    backends: Backends,
    client: Client<HttpConnector, Incoming>,
    /// Longest wait for the backend's response head.
    timeout: Duration,
}

/// Checks `http://HOST:PORT` (no path, no TLS: the backend is plain HTTP).
pub fn parse_upstream(url: &str) -> anyhow::Result<Authority> {
    let uri: Uri = url
        .parse()
        .map_err(|e| anyhow!("--upstream `{url}`: {e}"))?;
    if uri.scheme() != Some(&Scheme::HTTP) {
        bail!("--upstream `{url}`: must be http://HOST:PORT (the backend speaks plain HTTP)");
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        bail!("--upstream `{url}`: no path allowed");
    }
    uri.authority()
        .cloned()
        .ok_or_else(|| anyhow!("--upstream `{url}`: missing host"))
}

/// The backends and the choice among them (no I/O).
#[derive(Debug)]
pub struct Backends {
    authorities: Vec<Authority>,
    balance: UpstreamBalance,
    next: AtomicUsize,
}

impl Backends {
    pub fn new(urls: &[String], balance: UpstreamBalance) -> anyhow::Result<Self> {
        if urls.is_empty() {
            bail!("no --upstream given");
        }
        Ok(Self {
            authorities: urls
                .iter()
                .map(|u| parse_upstream(u))
                .collect::<anyhow::Result<_>>()?,
            balance,
            next: AtomicUsize::new(0),
        })
    }

    /// The backend for one request from `client`.
    pub fn pick(&self, client: IpAddr) -> &Authority {
        let n = self.authorities.len();
        let i = match self.balance {
            UpstreamBalance::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n,
            UpstreamBalance::ClientIp => baton_ops::affinity::slot(client, n).unwrap_or(0),
        };
        &self.authorities[i]
    }
}

impl Proxy {
    pub fn new(
        urls: &[String],
        balance: UpstreamBalance,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let backends = Backends::new(urls, balance)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            backends,
            client,
            timeout,
        })
    }

    pub async fn forward(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<Body> {
        let upstream = self.backends.pick(conn.peer.ip());
        let req = match self.rewrite(req, conn, upstream) {
            Ok(r) => r,
            Err(msg) => return text(StatusCode::BAD_REQUEST, msg),
        };
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(mut resp)) => {
                strip_hop_by_hop(resp.headers_mut());
                resp.map(|b| b.map_err(Into::into).boxed())
            }
            Ok(Err(e)) => {
                tracing::warn!(%upstream, error = %e, "upstream request failed");
                text(StatusCode::BAD_GATEWAY, "upstream unavailable\n")
            }
            Err(_) => text(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n"),
        }
    }

    fn rewrite(
        &self,
        req: Request<Incoming>,
        conn: &ConnInfo,
        upstream: &Authority,
    ) -> Result<Request<Incoming>, &'static str> {
        let (mut parts, body) = req.into_parts();
        // HTTP/2 carries the host in :authority; the backend speaks HTTP/1.1 and wants Host.
        let host = parts
            .uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| {
                parts
                    .headers
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(String::from)
            });
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        parts.uri = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(upstream.clone())
            .path_and_query(path)
            .build()
            .map_err(|_| "bad request target\n")?;
        parts.version = Version::HTTP_11;
        let h = &mut parts.headers;
        strip_hop_by_hop(h);
        if let Some(host) = host.and_then(|s| HeaderValue::from_str(&s).ok()) {
            h.insert(header::HOST, host);
        }
        h.insert(
            FORWARDED_FOR,
            HeaderValue::from_str(&conn.peer.ip().to_string()).map_err(|_| "bad peer\n")?,
        );
        h.insert(FORWARDED_PROTO, HeaderValue::from_static("https"));
        h.remove(&CLIENT_SUBJECT);
        if let Some(subject) = &conn.client_subject {
            // A subject with bytes not allowed in a header is sent escaped rather than dropped.
            let v = HeaderValue::from_str(subject)
                .or_else(|_| HeaderValue::from_str(&subject.escape_default().to_string()))
                .map_err(|_| "bad client subject\n")?;
            h.insert(CLIENT_SUBJECT, v);
        }
        Ok(Request::from_parts(parts, body))
    }
}

fn strip_hop_by_hop(h: &mut http::HeaderMap) {
    // Headers named in Connection are hop-by-hop too.
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in HOP_BY_HOP.iter().chain(named.iter()) {
        h.remove(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        assert_eq!(
            parse_upstream("http://127.0.0.1:8080").unwrap().as_str(),
            "127.0.0.1:8080"
        );
        assert!(parse_upstream("https://127.0.0.1:8080").is_err());
        assert!(parse_upstream("http://127.0.0.1:8080/app").is_err());
        assert!(parse_upstream("127.0.0.1:8080").is_err());
    }

    #[test]
    fn backends_round_robin_or_by_client_address() {
        let urls = [
            "http://127.0.0.1:81",
            "http://127.0.0.1:82",
            "http://127.0.0.1:83",
        ]
        .map(String::from);
        let rr = Backends::new(&urls, UpstreamBalance::RoundRobin).unwrap();
        let client: IpAddr = "127.0.0.9".parse().unwrap();
        let picked: Vec<u16> = (0..6)
            .map(|_| rr.pick(client).port_u16().unwrap())
            .collect();
        assert_eq!(picked, [81, 82, 83, 81, 82, 83]);

        let by_ip = Backends::new(&urls, UpstreamBalance::ClientIp).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for host in 1..=40u8 {
            let ip = IpAddr::from([127, 0, 0, host]);
            let first = by_ip.pick(ip).clone();
            assert!(
                (0..5).all(|_| by_ip.pick(ip) == &first),
                "client {ip} moved"
            );
            seen.insert(first.port_u16().unwrap());
        }
        assert_eq!(seen.len(), 3, "40 clients all landed on {seen:?}");
        assert!(Backends::new(&[], UpstreamBalance::RoundRobin).is_err());
        assert!(Backends::new(&["https://x:1".into()], UpstreamBalance::RoundRobin).is_err());
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut h = http::HeaderMap::new();
        h.insert(header::CONNECTION, "close, x-secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }
}
