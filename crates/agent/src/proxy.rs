//! The SSL reverse proxy role: every request goes, by its route (`routing.rs`), to a pool of
//! upstreams (`pool.rs`), with the client's address and certificate subject added as headers.
//! With several upstreams in a pool the agent is the paper's single TLS proxy (Pound) in front
//! of a farm: requests go round robin, or by client address so a client keeps its upstream
//! (Pound-IP). Which upstream, and which are passed over as down, is decided in `upstream.rs`;
//! this file does the I/O.
//!
//! The agent is the TLS edge, so it is the first hop that knows the client: it *replaces*
//! `X-Client-Cert-Subject`, and the forwarding headers unless the client is a trusted proxy
//! (`forwarded`), rather than appending to what the client sent, which would let any client
//! claim any address or identity.

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Empty, Limited};

use crate::body::{text, Body, BoxError};
use crate::conn_info::ConnInfo;
use crate::forwarded::{Forwarding, Hop};
use crate::pool::Pool;
use crate::route_config::{RouteConfig, Routing};
use crate::routing::{choose, normalize_host, Choice, Matcher};
use crate::served::Served;
use crate::upstream::{Backends, Outcome};

pub const CLIENT_SUBJECT: HeaderName = HeaderName::from_static("x-client-cert-subject");

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
    pools: Vec<Arc<Pool>>,
    routes: Vec<RouteConfig>,
    /// The routes' matches, in the same order (what `routing::choose` takes).
    matchers: Vec<Matcher>,
    unknown_host_status: StatusCode,
    no_route_status: StatusCode,
    /// The forwarding headers added to each request.
    forwarding: Forwarding,
}

impl Proxy {
    pub fn new(routing: &Routing) -> anyhow::Result<Self> {
        let pools = routing
            .pools
            .iter()
            .map(|p| Pool::new(p.clone()).map(Arc::new))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            pools,
            matchers: routing.routes.iter().map(|r| r.matcher.clone()).collect(),
            routes: routing.routes.clone(),
            unknown_host_status: routing.unknown_host_status,
            no_route_status: routing.no_route_status,
            forwarding: Forwarding::default(),
        })
    }

    /// Whose forwarding headers are kept, and whether `Via` is added.
    pub fn with_forwarding(mut self, forwarding: Forwarding) -> Self {
        self.forwarding = forwarding;
        self
    }

    /// Every pool's upstreams and their health, for the metrics endpoint.
    pub fn backends(&self) -> Vec<Arc<Backends>> {
        self.pools.iter().map(|p| p.backends.clone()).collect()
    }

    /// Starts the pools' health checkers (those with `health` settings), until `stop`.
    pub fn start_checks(&self, stop: &tokio_util::sync::CancellationToken) {
        for p in &self.pools {
            p.start_checks(stop.clone());
        }
    }

    pub async fn forward<B>(&self, req: Request<B>, conn: &ConnInfo) -> Response<Body>
    where
        B: hyper::body::Body<Data = bytes::Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        let host = request_host(&req)
            .or(conn.sni.as_deref())
            .map(normalize_host);
        let route = match choose(&self.matchers, host.as_deref(), req.uri().path()) {
            Choice::Route(i) => &self.routes[i],
            Choice::UnknownHost => {
                return text(self.unknown_host_status, "no route for this host\n");
            }
            Choice::NoRoute => return text(self.no_route_status, "no route for this path\n"),
        };
        let mut response = self.to_pool(req, conn, route).await;
        // (only the access log reads it)
        if conn.log.is_some() {
            let served = response
                .extensions_mut()
                .get_or_insert_with(Served::default);
            served.route = route.name.clone();
        }
        response
    }

    async fn to_pool<B>(
        &self,
        req: Request<B>,
        conn: &ConnInfo,
        route: &RouteConfig,
    ) -> Response<Body>
    where
        B: hyper::body::Body<Data = bytes::Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        let pool = &self.pools[route.pool];
        if let Some(limit) = route.max_body_bytes {
            let declared = req
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit) {
                return too_large();
            }
        }
        // A request without a body can be sent again as it is: if its upstream refuses the
        // connection (which never saw the request, so even a POST is safe), the next one
        // gets it. One with a body has only the one try: its body is consumed on the way.
        let resendable = req.body().is_end_stream();
        // gRPC needs `te: trailers` (the one TE an HTTP/2 request may carry): kept, all else
        // of TE goes as hop-by-hop
        let te_trailers = req
            .headers()
            .get_all(header::TE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
        let (mut head, body) = req.into_parts();
        let path = match rewrite(&mut head, conn, &self.forwarding) {
            Ok(p) => p,
            Err(msg) => return text(StatusCode::BAD_REQUEST, msg),
        };
        route.request_headers.apply(&mut head.headers);
        // the host goes in the URI: hyper sends it as `Host` over HTTP/1.1 and as
        // `:authority` over HTTP/2 (each upstream's client connects to its own address)
        let host: Option<Authority> = match head.headers.remove(header::HOST) {
            Some(h) => match h.to_str().ok().and_then(|h| h.parse().ok()) {
                Some(a) => Some(a),
                None => return text(StatusCode::BAD_REQUEST, "bad host\n"),
            },
            None => None,
        };
        if te_trailers {
            head.headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
        let mut body = (!resendable).then(|| match route.max_body_bytes {
            Some(limit) => Limited::new(body, limit as usize).boxed(),
            None => body.map_err(Into::into).boxed(),
        });
        let order = pool.backends.order(conn.peer.ip(), Instant::now());
        if order.is_empty() {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "no upstream up (health checks)\n",
            );
        }
        // the head for the next attempt, copied only while there may be one
        let mut spare = Some(head);
        let attempts = order.len();
        for (attempt, backend) in order.into_iter().enumerate() {
            let body = match body.take() {
                Some(b) => b,
                None if resendable => Empty::new().map_err(|e| match e {}).boxed(),
                None => break,
            };
            let Some(mut head) = spare.take() else { break };
            if resendable && attempt + 1 < attempts {
                spare = Some(head.clone());
            }
            let upstream = pool.backends.authority(backend);
            head.uri = match Uri::builder()
                .scheme(pool.config.scheme.clone())
                .authority(host.clone().unwrap_or_else(|| upstream.clone()))
                .path_and_query(path.clone())
                .build()
            {
                Ok(u) => u,
                Err(_) => return text(StatusCode::BAD_REQUEST, "bad request target\n"),
            };
            let started = Instant::now();
            let sent = pool
                .client(backend)
                .request(Request::from_parts(head, body));
            let timeout = route.first_byte_timeout;
            let (outcome, mut response) = match tokio::time::timeout(timeout, sent).await {
                Ok(Ok(mut resp)) => {
                    let switched = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
                    strip_hop_by_hop(resp.headers_mut());
                    if switched {
                        // a WebSocket: the connection path joins both sides (`websocket`)
                        crate::upgrade::keep_upgrade(resp.headers_mut());
                    }
                    route.response_headers.apply(resp.headers_mut());
                    let idle = route.idle_timeout;
                    let resp = resp.map(|b| {
                        crate::idle_body::with_idle_timeout(b.map_err(Into::into).boxed(), idle)
                    });
                    (Outcome::Answered, resp)
                }
                Ok(Err(e)) if body_too_large(&e) => return too_large(),
                Ok(Err(e)) if e.is_connect() => {
                    tracing::warn!(pool = &*pool.config.name, %upstream, error = %error_chain(&e), "upstream refused: passed over for a while");
                    pool.backends
                        .report(backend, Outcome::Connect, Instant::now());
                    continue;
                }
                Ok(Err(e)) => {
                    tracing::warn!(pool = &*pool.config.name, %upstream, error = %error_chain(&e), "upstream request failed");
                    let resp = text(StatusCode::BAD_GATEWAY, "upstream unavailable\n");
                    (Outcome::Broken, resp)
                }
                Err(_) => {
                    let resp = text(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n");
                    (Outcome::Timeout, resp)
                }
            };
            pool.backends.report(backend, outcome, Instant::now());
            if conn.log.is_some() {
                response.extensions_mut().insert(Served {
                    route: None,
                    upstream: Some(upstream.as_str().into()),
                    upstream_time: Some(started.elapsed()),
                });
            }
            return response;
        }
        text(StatusCode::BAD_GATEWAY, "upstream unavailable\n")
    }
}

/// The request's host: `:authority` (HTTP/2, or an absolute-form target), else `Host`.
fn request_host<B>(req: &Request<B>) -> Option<&str> {
    req.uri().authority().map(|a| a.as_str()).or_else(|| {
        req.headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
    })
}

fn too_large() -> Response<Body> {
    text(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request body larger than this route takes\n",
    )
}

/// Whether a failed upstream request failed because the client's body went over the route's
/// limit (`Limited` says so deep in hyper's error).
fn body_too_large(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// An error with its causes (hyper's own message is often just "client error (Connect)").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Rewrites a client's request head for a backend, and returns the path and query to ask it
/// for (the backend's address goes into the URI per attempt).
fn rewrite(
    head: &mut http::request::Parts,
    conn: &ConnInfo,
    forwarding: &Forwarding,
) -> Result<PathAndQuery, &'static str> {
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
    // (a PathAndQuery shares the request's bytes: no copy)
    let path = head
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let upgrade = crate::upgrade::wants_upgrade(&head.headers, head.version);
    let version = std::mem::replace(&mut head.version, Version::HTTP_11);
    let h = &mut head.headers;
    strip_hop_by_hop(h);
    if upgrade {
        crate::upgrade::keep_upgrade(h);
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
