//! The plain-HTTP listener (`--http-listen`): every request is sent to https with a 308
//! (method and body kept), same host and path, on the port of the agent's first TLS listener
//! (left out when it is 443); ACME HTTP-01 challenges are answered here instead, from the
//! key authorizations an order has set (`challenges`), 404 for any other token.
//!
//! It is bounded like the other plain-HTTP endpoints (`baton_ops::control`): a deadline on
//! each request head and on stalled writes, a lifetime per connection, and a connection cap
//! where a newcomer pushes out the oldest connection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use baton_ops::control::{self, Counters, Limits};
use baton_ops::slots::{Slots, Table};

use crate::challenges::Challenges;

const ACME_PREFIX: &str = "/.well-known/acme-challenge/";
/// Connections held at once on all the plain-HTTP listeners, and from one address.
const CONNECTIONS: usize = 1024;
const PER_SOURCE: usize = 64;

/// Where redirects go, and the challenges answered instead.
#[derive(Debug, Clone)]
pub struct Redirect {
    /// The TLS port redirected to.
    pub tls_port: u16,
    pub challenges: Arc<Challenges>,
}

/// The listener's bounds: `header_timeout` for each request head.
pub fn limits(header_timeout: Duration) -> Limits {
    Limits {
        slots: Slots::new(Table::new(CONNECTIONS, PER_SOURCE, 0)),
        header_timeout,
        write_timeout: Duration::from_secs(10),
        lifetime: Duration::from_secs(60),
        requests: 100,
    }
}

/// Serves one listener until `stop` (the agent's drain).
pub async fn serve(
    listener: TcpListener,
    redirect: Redirect,
    limits: Limits,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    control::serve(listener, stop, limits, counters, move |req, _slot| {
        let answer = redirect.answer(&req);
        async move { answer }
    })
    .await
}

impl Redirect {
    pub fn answer<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        if let Some(token) = req.uri().path().strip_prefix(ACME_PREFIX) {
            return self.challenge(req.method(), token);
        }
        // absolute-form targets carry the host; otherwise the Host header does
        let host = req.uri().authority().cloned().or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| Authority::try_from(h.as_bytes()).ok())
        });
        let Some(host) = host.filter(|a| !a.host().is_empty() && a.as_str().find('@').is_none())
        else {
            return reply(StatusCode::BAD_REQUEST, "a Host header is needed\n");
        };
        let location = match self.tls_port {
            443 => format!("https://{}{path}", host.host()),
            port => format!("https://{}:{port}{path}", host.host()),
        };
        match HeaderValue::try_from(location) {
            Ok(v) => {
                let mut r = reply(StatusCode::PERMANENT_REDIRECT, "use https\n");
                r.headers_mut().insert(header::LOCATION, v);
                r
            }
            Err(_) => reply(StatusCode::BAD_REQUEST, "bad request target\n"),
        }
    }

    /// `GET /.well-known/acme-challenge/TOKEN`: the key authorization, if an order set one.
    fn challenge(&self, method: &Method, token: &str) -> Response<Full<Bytes>> {
        // RFC 8555 section 8.3: a token is base64url, nothing else
        let valid = !token.is_empty()
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if method != Method::GET && method != Method::HEAD {
            return reply(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
        }
        match valid.then(|| self.challenges.http01(token)).flatten() {
            Some(key_authorization) => {
                let mut r = Response::new(Full::new(Bytes::from(key_authorization)));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                );
                r
            }
            None => reply(StatusCode::NOT_FOUND, "no such challenge\n"),
        }
    }
}

fn reply(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    baton_ops::reply::text(status, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirect(port: u16) -> Redirect {
        let challenges = Arc::new(Challenges::default());
        challenges.set_http01("tok_en-1".into(), "tok_en-1.thumb".into());
        Redirect {
            tls_port: port,
            challenges,
        }
    }

    fn get(r: &Redirect, target: &str, host: Option<&str>) -> Response<Full<Bytes>> {
        let mut req = Request::get(target);
        if let Some(h) = host {
            req = req.header(header::HOST, h);
        }
        r.answer(&req.body(()).unwrap())
    }

    fn location(r: &Response<Full<Bytes>>) -> &str {
        r.headers()[header::LOCATION].to_str().unwrap()
    }

    #[test]
    fn redirects_keep_host_and_path_and_name_the_tls_port() {
        let r = get(&redirect(8443), "/a/b?c=1", Some("example.com:8080"));
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(location(&r), "https://example.com:8443/a/b?c=1");
        let r = get(&redirect(443), "/", Some("[::1]:80"));
        assert_eq!(location(&r), "https://[::1]/");
        let r = get(&redirect(443), "http://other.example/x", None);
        assert_eq!(location(&r), "https://other.example/x");
    }

    #[test]
    fn no_or_bad_host_is_a_bad_request() {
        assert_eq!(
            get(&redirect(443), "/", None).status(),
            StatusCode::BAD_REQUEST
        );
        for bad in ["a b", "user@evil.example", ""] {
            let r = get(&redirect(443), "/", Some(bad));
            assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn acme_challenges_are_answered_not_redirected() {
        let r = redirect(443);
        let ok = get(
            &r,
            "/.well-known/acme-challenge/tok_en-1",
            Some("a.example"),
        );
        assert_eq!(ok.status(), StatusCode::OK);
        for missing in ["other", "", "tok_en-1/..", "tok%2e"] {
            let target = format!("/.well-known/acme-challenge/{missing}");
            let r = get(&r, &target, Some("a.example"));
            assert_eq!(r.status(), StatusCode::NOT_FOUND, "{missing}");
        }
    }
}
