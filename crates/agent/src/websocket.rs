//! WebSockets through the reverse proxy: an HTTP/1.1 `Upgrade: websocket` request goes to the
//! upstream with its upgrade headers kept (everything else hop-by-hop is still dropped); when
//! the upstream answers 101, the client gets the 101 and then the bytes of both connections
//! are copied both ways until either side closes. An HTTP/2 client asks with an extended
//! CONNECT (RFC 8441, `:protocol websocket`): it is sent to the upstream as the HTTP/1.1
//! upgrade it stands for, and the stream carries the WebSocket once the upstream agrees.
//!
//! An upgraded connection is no longer HTTP: it never waits for a request, so it is never
//! parked nor moved to another agent. It lasts while bytes flow in either direction within
//! `--idle-timeout`; when the agent drains it is left open until `--drain-timeout`, then
//! closed.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::body::{text, Body, BoxError};
use crate::conn_info::ConnInfo;
use crate::proxy::Proxy;

use crate::upgrade::{keep_upgrade, WEBSOCKET};
const SEC_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
const SEC_VERSION: HeaderName = HeaderName::from_static("sec-websocket-version");
const SEC_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

/// Whether a request is an HTTP/2 extended CONNECT for a WebSocket (RFC 8441).
pub fn is_extended_connect<B>(req: &Request<B>) -> bool {
    req.method() == Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case(WEBSOCKET))
}

/// The upstream's side of a switched connection, taken from its 101 response (for the
/// connection path, which holds the client's side).
pub fn upstream_of(response: &mut Response<Body>) -> Option<OnUpgrade> {
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return None;
    }
    response.extensions_mut().remove::<OnUpgrade>()
}

/// An HTTP/2 extended CONNECT: sent upstream as an HTTP/1.1 upgrade; on its 101 the client's
/// stream gets a 200 and is joined to the upstream connection (in a task of its own, as the
/// stream outlives this request's service call). Any other answer is passed on as it is.
pub async fn over_h2<B>(
    proxy: &Proxy,
    mut req: Request<B>,
    conn: &ConnInfo,
    drain: Drain,
) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let client = hyper::upgrade::on(&mut req);
    let (mut head, body) = req.into_parts();
    head.method = Method::GET;
    head.version = Version::HTTP_11;
    head.extensions.remove::<hyper::ext::Protocol>();
    let h = &mut head.headers;
    keep_upgrade(h);
    // RFC 8441 section 5: the key and its check belong to HTTP/1.1 alone; this hop makes one.
    h.insert(SEC_KEY, new_key());
    if !h.contains_key(SEC_VERSION) {
        h.insert(SEC_VERSION, HeaderValue::from_static("13"));
    }
    let mut response = proxy.forward(Request::from_parts(head, body), conn).await;
    let Some(upstream) = upstream_of(&mut response) else {
        return response;
    };
    tokio::spawn(async move {
        if let Ok(client) = client.await {
            tunnel(TokioIo::new(client), upstream, drain).await;
        }
    });
    // the upstream's answer, without what only HTTP/1.1 has (and no body: the stream is the
    // WebSocket's now)
    let mut ok = Response::new(Empty::new().map_err(|e| match e {}).boxed());
    for (name, value) in response.headers() {
        let h1_only = [header::CONNECTION, header::UPGRADE, SEC_ACCEPT];
        if !h1_only.contains(name) && name != header::CONTENT_LENGTH {
            ok.headers_mut().append(name, value.clone());
        }
    }
    ok
}

/// What ends a tunnel besides its peers: the agent's drain, after the drain's time.
#[derive(Debug, Clone)]
pub struct Drain {
    pub draining: CancellationToken,
    pub within: Duration,
}

/// Copies bytes both ways between the client's side and the upstream's until either ends, or
/// the drain's time is up.
pub async fn tunnel<C>(mut client: C, upstream: OnUpgrade, drain: Drain)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let mut upstream = match upstream.await {
        Ok(up) => TokioIo::new(up),
        Err(e) => {
            tracing::debug!(error = %e, "the upstream's side of a WebSocket never came");
            return;
        }
    };
    let drained = async {
        drain.draining.cancelled().await;
        tokio::time::sleep(drain.within).await;
    };
    tokio::select! {
        r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "WebSocket ended with an error");
            }
        }
        () = drained => tracing::debug!("WebSocket closed: drain timeout"),
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), client.shutdown()).await;
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64 (RFC 6455 section 4.1).
fn new_key() -> HeaderValue {
    use base64::Engine as _;
    let mut bytes = [0u8; 16];
    // The key is a nonce the upstream proves it read, not a secret: std's per-process random
    // hasher keys, drawn twice, are random enough.
    for (i, half) in bytes.chunks_mut(8).enumerate() {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    let key = base64::engine::general_purpose::STANDARD.encode(bytes);
    HeaderValue::from_str(&key).expect("base64 is a header value")
}

/// Extended CONNECT without an upstream: the built-in responder has no WebSocket to offer.
pub fn not_here() -> Response<Body> {
    text(
        StatusCode::NOT_IMPLEMENTED,
        "WebSockets need --upstream (the built-in responder has none)\n",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_16_bytes_and_differ() {
        use base64::Engine as _;
        let (a, b) = (new_key(), new_key());
        assert_ne!(a, b);
        let raw = base64::engine::general_purpose::STANDARD
            .decode(a.as_bytes())
            .unwrap();
        assert_eq!(raw.len(), 16);
    }
}
