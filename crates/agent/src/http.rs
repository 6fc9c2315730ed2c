//! HTTP on an established TLS connection: the built-in responder for benchmarks, and the
//! dispatch to the reverse proxy.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::body::{text, Body, BoxError};
use crate::conn_info::ConnInfo;
use crate::metrics::Metrics;
use crate::proxy::Proxy;

/// Shared by every connection: what to answer and where to count it.
#[derive(Debug)]
pub struct HttpService {
    pub metrics: Arc<Metrics>,
    pub proxy: Option<Proxy>,
    /// `GET /` body, built once and shared (cloning `Bytes` is a reference count).
    pub root_body: Bytes,
    pub max_bytes: u64,
    pub draining: tokio_util::sync::CancellationToken,
    /// `--access-log`: each connection takes its part (`ConnInfo::log`) at its handshake's end.
    pub access_log: Option<crate::access_log::AccessLog>,
    /// `--drain-timeout`: how long a WebSocket lasts once the agent drains.
    pub drain_timeout: std::time::Duration,
}

/// RFC 8470 section 5.1: set on requests received in early data.
pub const EARLY_DATA: header::HeaderName = header::HeaderName::from_static("early-data");

/// Generated bodies are slices of this one buffer.
const CHUNK: usize = 64 * 1024;

fn pattern() -> Bytes {
    static PATTERN: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    PATTERN
        .get_or_init(|| {
            // Printable and not all one byte, so a body is easy to eyeball and to check.
            Bytes::from_iter((0..CHUNK).map(|i| b"abcdefghijklmnopqrstuvwxyz0123456789\n"[i % 37]))
        })
        .clone()
}

/// A body of `n` bytes for `GET /` (built once at start).
pub fn fixed_body(n: usize) -> Bytes {
    let p = pattern();
    if n <= p.len() {
        p.slice(..n)
    } else {
        Bytes::from_iter((0..n).map(|i| p[i % p.len()]))
    }
}

impl HttpService {
    pub async fn handle(
        self: Arc<Self>,
        conn: Arc<ConnInfo>,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        // Logged: the request's line is queued when its response body is done.
        let response = match &conn.log {
            None => self.dispatch(req, &conn).await,
            Some(log) => {
                let (pending, req) = crate::access_log::Pending::start(log, req);
                let unanswered = crate::access_log::Unanswered::new(&pending);
                let response = self.dispatch(req, &conn).await;
                unanswered.answered();
                crate::access_log::finish(pending, response)
            }
        };
        self.metrics.request(response.status().as_u16());
        Ok(response)
    }

    /// The answer: from the upstream or the built-in responder.
    async fn dispatch<B>(&self, mut req: Request<B>, conn: &ConnInfo) -> Response<Body>
    where
        B: http_body::Body<Data = Bytes> + Send + Sync + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        if let Some(early) = conn.early.as_ref().filter(|e| e.handshaking()) {
            // RFC 8470: unsafe methods wait for the handshake (425: the client sends them
            // again after it); the rest go on marked, so an upstream can decide for itself.
            let too_early = crate::early::too_early(req.method(), true, early.allowed_methods());
            self.metrics.early_request(too_early);
            if too_early {
                let status = StatusCode::from_u16(425).expect("425 is a status code");
                return text(
                    status,
                    "too early: send the request again after the handshake\n",
                );
            }
            req.headers_mut()
                .insert(EARLY_DATA, header::HeaderValue::from_static("1"));
        }
        if crate::websocket::is_extended_connect(&req) {
            let Some(proxy) = &self.proxy else {
                return crate::websocket::not_here();
            };
            let drain = crate::websocket::Drain {
                draining: self.draining.clone(),
                within: self.drain_timeout,
            };
            return Box::pin(crate::websocket::over_h2(proxy, req, conn, drain)).await;
        }
        // hyper keeps the box holding this future for the connection's life, so it must stay
        // small: the proxy's (large) future gets a box of its own, freed with the request.
        match &self.proxy {
            Some(proxy) => Box::pin(proxy.forward(req, conn)).await,
            None => Box::pin(self.respond(req, conn)).await,
        }
    }

    async fn respond<B>(&self, req: Request<B>, conn: &ConnInfo) -> Response<Body>
    where
        B: http_body::Body<Data = Bytes> + Unpin,
    {
        let head_only = req.method() == Method::HEAD;
        match *req.method() {
            Method::GET | Method::HEAD => {}
            Method::POST | Method::PUT => {
                // Benchmarks may send bodies; read and discard them without buffering.
                let mut body = req.into_body();
                while let Some(frame) = body.frame().await {
                    if frame.is_err() {
                        return text(StatusCode::BAD_REQUEST, "request body error\n");
                    }
                }
                return self.root();
            }
            _ => {
                let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
                r.headers_mut().insert(
                    header::ALLOW,
                    "GET, HEAD, POST, PUT".parse().expect("static"),
                );
                return r;
            }
        }
        let path = req.uri().path();
        let mut response = match path {
            "/" => self.root(),
            "/healthz" if self.draining.is_cancelled() => {
                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
            }
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/tls" => text(StatusCode::OK, &describe(conn)),
            _ => match path.strip_prefix("/bytes/") {
                Some(n) => match n.parse::<u64>() {
                    Ok(n) if n <= self.max_bytes => sized(n),
                    Ok(_) => text(
                        StatusCode::BAD_REQUEST,
                        &format!("at most {} bytes (--max-bytes)\n", self.max_bytes),
                    ),
                    Err(_) => text(StatusCode::BAD_REQUEST, "/bytes/N takes a byte count\n"),
                },
                None => text(StatusCode::NOT_FOUND, "not found\n"),
            },
        };
        if head_only {
            // Keep the headers (content-length included), drop the body.
            let len = response.body().size_hint().exact();
            *response.body_mut() = Full::new(Bytes::new()).map_err(|e| match e {}).boxed();
            if let Some(len) = len {
                response
                    .headers_mut()
                    .insert(header::CONTENT_LENGTH, len.into());
            }
        }
        response
    }

    fn root(&self) -> Response<Body> {
        let mut r = Response::new(
            Full::new(self.root_body.clone())
                .map_err(|e| match e {})
                .boxed(),
        );
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/octet-stream"),
        );
        r
    }
}

/// HTTP/1.1 keeps the connection unless the request says `Connection: close`; 1.0 only with
/// `Connection: keep-alive`.
pub(crate) fn wants_keep_alive<B>(req: &http::Request<B>) -> bool {
    // the tokens compared in place: no allocation per request
    let has = |token: &str| {
        req.headers()
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    match req.version() {
        http::Version::HTTP_11 => !has("close"),
        http::Version::HTTP_10 => has("keep-alive"),
        _ => false,
    }
}

/// `key: value` lines describing the connection (`GET /tls`), for humans and tests.
fn describe(c: &ConnInfo) -> String {
    format!(
        "version: {}\nsuite: {}\nalpn: {}\nsni: {}\nresumed: {}\nclient: {}\npeer: {}\n",
        c.version,
        c.suite,
        c.alpn.as_deref().unwrap_or("-"),
        c.sni.as_deref().unwrap_or("-"),
        c.resumed,
        c.client_subject.as_deref().unwrap_or("-"),
        c.peer,
    )
}

fn sized(n: u64) -> Response<Body> {
    let mut r = Response::new(
        RepeatBody {
            remaining: n,
            chunk: pattern(),
        }
        .boxed(),
    );
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    r
}

/// `n` bytes streamed as slices of one shared buffer: any size costs one chunk of memory.
struct RepeatBody {
    remaining: u64,
    chunk: Bytes,
}

impl http_body::Body for RepeatBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(self.chunk.len() as u64) as usize;
        self.remaining -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn repeat_body_has_exact_length() {
        for n in [
            0u64,
            1,
            CHUNK as u64,
            CHUNK as u64 + 1,
            3 * CHUNK as u64 + 17,
        ] {
            let body = RepeatBody {
                remaining: n,
                chunk: pattern(),
            };
            assert_eq!(body.size_hint().exact(), Some(n));
            let bytes = body.collect().await.unwrap().to_bytes();
            assert_eq!(bytes.len() as u64, n);
        }
    }

    #[test]
    fn fixed_body_sizes() {
        assert_eq!(fixed_body(0).len(), 0);
        assert_eq!(fixed_body(1024).len(), 1024);
        assert_eq!(fixed_body(CHUNK * 2 + 5).len(), CHUNK * 2 + 5);
    }
}
