//! Counting a request's bytes both ways: the request body as the service reads it, the
//! response body as hyper takes it. The response body's end (or its drop: an aborted or
//! HEAD response) writes the request's line.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response, Version};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;

use super::ConnLog;
use crate::body::{Body, BoxError};
use crate::served::Served;

/// One request on its way: what its line says, filled as it goes.
///
/// The target and host are copies: hyper's `Uri` and header values are slices of its read
/// buffer, and a line that held them would keep that buffer (kilobytes) alive until the writer
/// got to it, on the writer's thread, so every connection would read into fresh, cache-cold
/// memory instead of the buffer the one before it just gave back.
#[derive(Debug)]
pub struct Pending {
    pub conn: Arc<ConnLog>,
    pub started: Instant,
    pub method: Method,
    /// `:authority` (HTTP/2) or `Host`, as the client sent it.
    pub host: Option<Box<[u8]>>,
    /// The path and query (`/` if the request had none).
    pub target: Box<str>,
    pub version: Version,
    pub bytes_in: AtomicU64,
    pub end: OnceLock<End>,
}

/// How the request ended.
#[derive(Debug)]
pub struct End {
    pub at: SystemTime,
    pub status: u16,
    pub bytes_out: u64,
    pub request_time: Duration,
    pub served: Option<Served>,
}

impl Pending {
    /// A request's line begun, with its body counted from here on.
    pub fn start<B>(conn: &Arc<ConnLog>, req: Request<B>) -> (Arc<Pending>, Request<CountIn<B>>) {
        conn.requests.fetch_add(1, Ordering::Relaxed);
        let host = match req.uri().authority() {
            Some(a) => Some(Box::from(a.as_str().as_bytes())),
            None => req
                .headers()
                .get(http::header::HOST)
                .map(|h| Box::from(h.as_bytes())),
        };
        let target = req.uri().path_and_query().map_or("/", |t| t.as_str());
        let pending = Arc::new(Pending {
            conn: conn.clone(),
            started: Instant::now(),
            method: req.method().clone(),
            host,
            target: Box::from(target),
            version: req.version(),
            bytes_in: AtomicU64::new(0),
            end: OnceLock::new(),
        });
        let counted = pending.clone();
        let req = req.map(|inner| CountIn {
            inner,
            pending: counted,
        });
        (pending, req)
    }
}

/// A request body that counts its bytes.
pub struct CountIn<B> {
    inner: B,
    pending: Arc<Pending>,
}

impl<B> http_body::Body for CountIn<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r {
            if let Some(d) = f.data_ref() {
                self.pending
                    .bytes_in
                    .fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The status logged for a request whose client left before its answer (nginx's choice).
pub const CLIENT_GONE: u16 = 499;

/// Held while a request is being answered: if it is dropped armed (hyper gave up on the
/// request: the client closed, a deadline cut it), the request's line says [`CLIENT_GONE`].
pub struct Unanswered(Option<Arc<Pending>>);

impl Unanswered {
    pub fn new(pending: &Arc<Pending>) -> Self {
        Unanswered(Some(pending.clone()))
    }

    pub fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(pending) = self.0.take() {
            queue(pending, CLIENT_GONE, 0, None);
        }
    }
}

/// Ends a request's line and queues it.
fn queue(pending: Arc<Pending>, status: u16, bytes_out: u64, served: Option<Served>) {
    let _ = pending.end.set(End {
        at: SystemTime::now(),
        status,
        bytes_out,
        request_time: pending.started.elapsed(),
        served,
    });
    pending.conn.log.request_done(&pending);
}

/// The response to a logged request: its body counted, its line queued when the body is done.
pub fn finish(pending: Arc<Pending>, mut response: Response<Body>) -> Response<Body> {
    let served = response.extensions_mut().remove::<Served>();
    let status = response.status().as_u16();
    response.map(|body| {
        Logged {
            body,
            pending: Some(pending),
            status,
            served,
            bytes_out: 0,
        }
        .boxed()
    })
}

struct Logged {
    body: Body,
    pending: Option<Arc<Pending>>,
    status: u16,
    served: Option<Served>,
    bytes_out: u64,
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let r = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r {
            if let Some(d) = f.data_ref() {
                self.bytes_out += d.len() as u64;
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// hyper drops a body once it has sent it all, or given up on it: the request is over.
impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            queue(pending, self.status, self.bytes_out, self.served.take());
        }
    }
}
