//! The two headers of an HTTP/1.1 WebSocket upgrade, which the proxy looks at and keeps across
//! its hop (hop-by-hop headers are otherwise dropped); the tunnel itself is `websocket.rs`.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Version;

pub const WEBSOCKET: &str = "websocket";

/// Whether a request head asks to switch to WebSocket over HTTP/1.1 (`Connection: upgrade`
/// and `Upgrade: websocket`).
pub fn wants_upgrade(headers: &HeaderMap, version: Version) -> bool {
    let has = |name: HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    version == Version::HTTP_11
        && has(header::CONNECTION, "upgrade")
        && has(header::UPGRADE, WEBSOCKET)
}

/// Puts back the two headers a WebSocket upgrade needs on the next hop, after the hop-by-hop
/// ones were dropped (request and 101 response alike).
pub fn keep_upgrade(h: &mut HeaderMap) {
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static(WEBSOCKET));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forwarded::tests::headers;

    #[test]
    fn an_upgrade_needs_both_headers_and_http_1_1() {
        let both = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "WebSocket"),
        ]);
        assert!(wants_upgrade(&both, Version::HTTP_11));
        assert!(!wants_upgrade(&both, Version::HTTP_10));
        assert!(!wants_upgrade(
            &headers(&[("upgrade", "websocket")]),
            Version::HTTP_11
        ));
        assert!(!wants_upgrade(
            &headers(&[("connection", "upgrade"), ("upgrade", "h2c")]),
            Version::HTTP_11
        ));
    }
}
