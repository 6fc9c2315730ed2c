//! The small answers of the operators' endpoints (the dispatcher's `--admin`, `baton up
//! --admin`): JSON or plain text with a status, as hyper responses.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;

/// `value` as pretty JSON, newline-terminated.
pub fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    let mut body = serde_json::to_vec_pretty(value).unwrap_or_default();
    body.push(b'\n');
    respond(status, body, "application/json")
}

/// `body` as UTF-8 plain text.
pub fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    respond(
        status,
        body.as_bytes().to_vec(),
        "text/plain; charset=utf-8",
    )
}

fn respond(status: StatusCode, body: Vec<u8>, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

/// The answer to a request the admin guard refused ([`crate::guard::check`]).
pub fn refused(why: crate::guard::Refusal) -> Response<Full<Bytes>> {
    let mut r = text(why.status(), why.message());
    if why == crate::guard::Refusal::Unauthorized {
        r.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
    }
    r
}
