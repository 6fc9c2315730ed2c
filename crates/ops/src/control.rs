//! The one server loop of the plain-HTTP control endpoints (metrics, the dispatcher's admin,
//! `baton up`'s admin): a peer gets a slot that a newcomer may push it out of until it proves
//! itself ([`crate::slots`]), and every phase it could stall has a deadline: each request head,
//! each write that makes no progress, the connection's whole life, and a cap on the requests
//! one connection may send.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

use crate::accept::{Acceptor, Admitted};
use crate::slots::{Slot, Slots};

/// The bounds of one control endpoint.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Who holds a connection, and who is pushed out for a newcomer.
    pub slots: Arc<Slots>,
    /// Time for each request head to arrive, from the first byte of it or the end of the
    /// previous answer.
    pub header_timeout: Duration,
    /// A write that moves no byte for this long ends the connection (a peer that sends
    /// requests and never reads the answers).
    pub write_timeout: Duration,
    /// A connection's whole life.
    pub lifetime: Duration,
    /// Requests one connection may send; the last is answered with `Connection: close`.
    pub requests: usize,
}

/// What a control endpoint counts about its peers.
#[derive(Debug, Default)]
pub struct Counters {
    /// The endpoint's name in the metrics' `endpoint` label: `metrics` or `admin`.
    pub endpoint: &'static str,
    /// Connections pushed out for a newcomer.
    pub evicted: AtomicU64,
    /// Connections refused because every slot was held by a proven peer.
    pub refused: AtomicU64,
    /// Connections ended by a deadline (head, write or lifetime).
    pub timed_out: AtomicU64,
    /// Calls the admin guard refused ([`crate::guard::check`]).
    pub denied: AtomicU64,
}

impl Counters {
    pub fn new(endpoint: &'static str) -> Arc<Self> {
        Arc::new(Self {
            endpoint,
            ..Default::default()
        })
    }
}

/// Control endpoints' counters as metrics (`baton_control_*_total{endpoint}`).
#[derive(Debug)]
pub struct Collected(pub Vec<Arc<Counters>>);

impl prometheus_client::collector::Collector for Collected {
    fn encode(
        &self,
        mut e: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let family = |pick: fn(&Counters) -> &AtomicU64| {
            self.0
                .iter()
                .map(move |c| ([("endpoint", c.endpoint)], pick(c).load(Ordering::Relaxed)))
                .collect::<Vec<_>>()
        };
        crate::metrics::counters(
            &mut e,
            "baton_control_evicted",
            "Control-endpoint connections pushed out to make room for a newcomer.",
            family(|c| &c.evicted),
        )?;
        crate::metrics::counters(
            &mut e,
            "baton_control_refused",
            "Control-endpoint connections refused: every slot held by an authenticated peer.",
            family(|c| &c.refused),
        )?;
        crate::metrics::counters(
            &mut e,
            "baton_control_timed_out",
            "Control-endpoint connections ended by a deadline (request head, stalled write, \
             lifetime).",
            family(|c| &c.timed_out),
        )?;
        crate::metrics::counters(
            &mut e,
            "baton_control_denied",
            "Admin calls refused: no or a wrong token, a web page's Origin, a foreign Host, or \
             a body that is not JSON.",
            family(|c| &c.denied),
        )
    }
}

/// Serves HTTP/1.1 on `listener` until `stop`, each request answered by `handle`, which gets
/// the connection's slot to [`prove`](Slot::prove) once the peer has authenticated.
pub async fn serve<H, F>(
    listener: TcpListener,
    stop: CancellationToken,
    limits: Limits,
    counters: Arc<Counters>,
    handle: H,
) where
    H: Fn(Request<Incoming>, Arc<Slot>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let acceptor = Acceptor::new(listener, stop.clone());
    while let Some(Admitted { tcp, peer, .. }) = acceptor.next().await {
        let Some((slot, evicted)) = limits.slots.admit(peer.ip()) else {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        counters
            .evicted
            .fetch_add(evicted as u64, Ordering::Relaxed);
        let (limits, counters, handle, stop) = (
            limits.clone(),
            counters.clone(),
            handle.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let slot = Arc::new(slot);
            let served = Arc::new(AtomicUsize::new(0));
            let service = {
                let slot = slot.clone();
                let cap = limits.requests.max(1);
                service_fn(move |req| {
                    slot.heard();
                    let n = served.fetch_add(1, Ordering::Relaxed) + 1;
                    let answer = handle(req, slot.clone());
                    async move {
                        let mut r = answer.await;
                        if n >= cap {
                            r.headers_mut().insert(
                                http::header::CONNECTION,
                                http::HeaderValue::from_static("close"),
                            );
                        }
                        Ok::<_, std::convert::Infallible>(r)
                    }
                })
            };
            let io = WriteDeadline::new(tcp, limits.write_timeout);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder.serve_connection(TokioIo::new(io), service);
            let timed_out = tokio::select! {
                r = tokio::time::timeout(limits.lifetime, conn) => match r {
                    Ok(Ok(())) => false,
                    Ok(Err(e)) => e.is_timeout() || is_timed_out(&e),
                    Err(_) => true,
                },
                _ = slot.evicted() => false,
                _ = stop.cancelled() => false,
            };
            if timed_out {
                counters.timed_out.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

fn is_timed_out(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            return io.kind() == io::ErrorKind::TimedOut;
        }
        source = s.source();
    }
    false
}

/// A stream whose writes fail with `TimedOut` once one has made no progress for `limit`.
/// Reads pass through (the request head has hyper's own deadline).
pub struct WriteDeadline<T> {
    inner: T,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// `Pending` from the stream: waits on, unless it has been waiting for `limit`.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer stopped reading",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<R>(&mut self, r: Poll<io::Result<R>>, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        match r {
            Poll::Pending => self.pending(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progress(r, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_never_reads_times_out() {
        let (a, _b) = tokio::io::duplex(64);
        let mut w = WriteDeadline::new(a, Duration::from_secs(5));
        w.write_all(&[0; 64]).await.unwrap();
        let e = w.write_all(&[0; 1]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_up_is_not_cut() {
        use tokio::io::AsyncReadExt;
        let (a, mut b) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut total = 0;
            while total < 640 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                total += b.read(&mut buf).await.unwrap();
            }
        });
        let mut w = WriteDeadline::new(a, Duration::from_secs(5));
        w.write_all(&[0; 640]).await.unwrap();
        reader.await.unwrap();
    }
}
