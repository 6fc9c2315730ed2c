//! Response bodies, shared by the responder (`http`) and the reverse proxy (`proxy`): the
//! boxed body type, plain-text answers, and a body that tells when hyper holds all of it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Response bodies: a static buffer, a generated stream, or an upstream's body.
pub type Body = BoxBody<Bytes, BoxError>;

pub fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::copy_from_slice(body.as_bytes()))
            .map_err(|e| match e {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Wraps a body so that `done` runs once it has handed out its end (including a body that is
/// empty from the start): the moment hyper holds the whole response.
pub fn on_end(body: Body, done: impl FnOnce() + Send + Sync + 'static) -> Body {
    let left = body.size_hint().exact();
    OnEnd {
        body,
        done: std::sync::Mutex::new(Some(Box::new(done))),
        left,
    }
    .boxed()
}

type Done = Box<dyn FnOnce() + Send + Sync>;

struct OnEnd {
    body: Body,
    done: std::sync::Mutex<Option<Done>>,
    /// Bytes still to come when the body's length is known (Content-Length).
    left: Option<u64>,
}

impl OnEnd {
    fn fire(&self) {
        if let Some(f) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() {
            f();
        }
    }
}

/// A body hyper drops without reading its end (an error, a HEAD) is finished with too.
impl Drop for OnEnd {
    fn drop(&mut self) {
        self.fire();
    }
}

impl http_body::Body for OnEnd {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let r = Pin::new(&mut self.body).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(f))), Some(left)) = (&r, self.left) {
            if let Some(d) = f.data_ref() {
                self.left = Some(left.saturating_sub(d.len() as u64));
            }
        }
        // The end is the last byte of a known length, as it is handed out: a proxied body may
        // report its end only later (when the upstream connection says so), by which time
        // the client, whose response is complete, may have sent its next request and hyper
        // would serve it in this hyper connection, which is about to be dissolved.
        if matches!(r, Poll::Ready(None)) || self.left == Some(0) || self.body.is_end_stream() {
            self.fire();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        let end = self.body.is_end_stream();
        if end {
            self.fire();
        }
        end
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
