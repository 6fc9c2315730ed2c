//! The SSL reverse proxy role: every request goes to a plain-HTTP backend, with the client's
//! address and certificate subject added as headers. With several backends the agent is the
//! paper's single TLS proxy (Pound) in front of a farm: requests go round robin, or by client
//! address so a client keeps its backend (Pound-IP). Which backend, and which are passed over
//! after refusing connections, is decided in `upstream.rs`; this file does the I/O.
//!
//! The agent is the TLS edge, so it is the first hop that knows the client: it *replaces*
//! `X-Client-Cert-Subject`, and the forwarding headers unless the client is a trusted proxy
//! (`forwarded`), rather than appending to what the client sent, which would let any client
//! claim any address or identity.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderName, HeaderValue};
use http::uri::Scheme;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::body::{text, Body, BoxError};
use crate::config::UpstreamBalance;
use crate::conn_info::ConnInfo;
use crate::forwarded::{Forwarding, Hop};
use crate::served::Served;
use crate::upstream::{Backends, Outcome};

pub const CLIENT_SUBJECT: HeaderName = HeaderName::from_static("x-client-cert-subject");
/// Longest wait for a backend's connection: a backend that does not answer a SYN in this
/// time counts as down, and a request without a body goes to the next one.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

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
    backends: Arc<Backends>,
    client: Client<HttpConnector, Body>,
    /// Longest wait for the backend's response head.
    timeout: Duration,
    /// The forwarding headers added to each request.
    forwarding: Forwarding,
}

impl Proxy {
    pub fn new(
        urls: &[String],
        balance: UpstreamBalance,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let backends = Arc::new(Backends::new(urls, balance)?);
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT.min(timeout)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            backends,
            client,
            timeout,
            forwarding: Forwarding::default(),
        })
    }

    /// Whose forwarding headers are kept, and whether `Via` is added.
    pub fn with_forwarding(mut self, forwarding: Forwarding) -> Self {
        self.forwarding = forwarding;
        self
    }

    /// The backends and their health, for the metrics endpoint.
    pub fn backends(&self) -> Arc<Backends> {
        self.backends.clone()
    }

    pub async fn forward<B>(&self, req: Request<B>, conn: &ConnInfo) -> Response<Body>
    where
        B: hyper::body::Body<Data = bytes::Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        // A request without a body can be sent again as it is: if its backend refuses the
        // connection (which never saw the request, so even a POST is safe), the next one
        // gets it. One with a body has only the one try: its body is consumed on the way.
        let resendable = req.body().is_end_stream();
        let (mut head, body) = req.into_parts();
        let path = match rewrite(&mut head, conn, &self.forwarding) {
            Ok(p) => p,
            Err(msg) => return text(StatusCode::BAD_REQUEST, msg),
        };
        let mut body = (!resendable).then(|| body.map_err(Into::into).boxed());
        for backend in self.backends.order(conn.peer.ip(), Instant::now()) {
            let body = match body.take() {
                Some(b) => b,
                None if resendable => Empty::new().map_err(|e| match e {}).boxed(),
                None => break,
            };
            let upstream = self.backends.authority(backend);
            let mut head = head.clone();
            head.uri = match Uri::builder()
                .scheme(Scheme::HTTP)
                .authority(upstream.clone())
                .path_and_query(path.as_str())
                .build()
            {
                Ok(u) => u,
                Err(_) => return text(StatusCode::BAD_REQUEST, "bad request target\n"),
            };
            let started = Instant::now();
            let sent = self.client.request(Request::from_parts(head, body));
            let (outcome, mut response) = match tokio::time::timeout(self.timeout, sent).await {
                Ok(Ok(mut resp)) => {
                    let switched = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
                    strip_hop_by_hop(resp.headers_mut());
                    if switched {
                        // a WebSocket: the connection path joins both sides (`websocket`)
                        crate::websocket::keep_upgrade(resp.headers_mut());
                    }
                    let resp = resp.map(|b| b.map_err(Into::into).boxed());
                    (Outcome::Answered, resp)
                }
                Ok(Err(e)) if e.is_connect() => {
                    tracing::warn!(%upstream, error = %e, "upstream refused: passed over for a while");
                    self.backends
                        .report(backend, Outcome::Connect, Instant::now());
                    continue;
                }
                Ok(Err(e)) => {
                    tracing::warn!(%upstream, error = %e, "upstream request failed");
                    let resp = text(StatusCode::BAD_GATEWAY, "upstream unavailable\n");
                    (Outcome::Broken, resp)
                }
                Err(_) => {
                    let resp = text(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n");
                    (Outcome::Timeout, resp)
                }
            };
            self.backends.report(backend, outcome, Instant::now());
            response.extensions_mut().insert(Served {
                route: None,
                upstream: Some(upstream.as_str().into()),
                upstream_time: Some(started.elapsed()),
            });
            return response;
        }
        text(StatusCode::BAD_GATEWAY, "upstream unavailable\n")
    }
}

/// Rewrites a client's request head for a backend, and returns the path and query to ask it
/// for (the backend's address goes into the URI per attempt).
fn rewrite(
    head: &mut http::request::Parts,
    conn: &ConnInfo,
    forwarding: &Forwarding,
) -> Result<String, &'static str> {
    // HTTP/2 carries the host in :authority; the backend speaks HTTP/1.1 and wants Host.
    let host = head
        .uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| {
            head.headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(String::from)
        });
    let path = head
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let upgrade = crate::websocket::wants_upgrade(&head.headers, head.version);
    let version = std::mem::replace(&mut head.version, Version::HTTP_11);
    let h = &mut head.headers;
    strip_hop_by_hop(h);
    if upgrade {
        crate::websocket::keep_upgrade(h);
    }
    let host = host.filter(|s| HeaderValue::from_str(s).is_ok());
    if let Some(v) = host.as_deref().and_then(|s| HeaderValue::from_str(s).ok()) {
        h.insert(header::HOST, v);
    }
    let hop = Hop {
        client: conn.peer,
        host: host.as_deref(),
        version,
    };
    forwarding.apply(h, hop);
    h.remove(&CLIENT_SUBJECT);
    if let Some(subject) = &conn.client_subject {
        // A subject with bytes not allowed in a header is sent escaped rather than dropped.
        let v = HeaderValue::from_str(subject)
            .or_else(|_| HeaderValue::from_str(&subject.escape_default().to_string()))
            .map_err(|_| "bad client subject\n")?;
        h.insert(CLIENT_SUBJECT, v);
    }
    Ok(path)
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
