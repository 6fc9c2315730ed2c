//! A stream with bytes already read from it in front, handed to hyper: what the previous
//! hyper connection read ahead comes first, and a gate stops reads once a response is whole.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::pace::RequestState;

/// A hyper connection's turn from one request to the next, shared by the response's body,
/// the stream and the connection's loop (`one_request`): the body says when the response is
/// whole (reads stop there), and the loop is told, at once or, for a kept hyper connection,
/// once the stream has flushed it (sent).
#[derive(Debug)]
pub(crate) struct Turn {
    kept: bool,
    /// Reads stay pending.
    gate: AtomicBool,
    /// Kept: the response is whole and not yet flushed.
    sending: AtomicBool,
    /// Kept: responses sent (several may be between two looks of the loop: pipelined).
    sent: AtomicU64,
    told: Notify,
}

impl Turn {
    pub(crate) fn new(kept: bool) -> Self {
        Turn {
            kept,
            gate: AtomicBool::new(false),
            sending: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            told: Notify::new(),
        }
    }

    /// The response has been handed to hyper whole.
    pub(crate) fn whole(&self) {
        self.gate.store(true, Ordering::Relaxed);
        match self.kept {
            true => self.sending.store(true, Ordering::Relaxed),
            false => self.told.notify_one(),
        }
    }

    /// The stream flushed: a whole response is sent.
    fn flushed(&self) {
        if self.sending.swap(false, Ordering::Relaxed) {
            self.sent.fetch_add(1, Ordering::Relaxed);
            self.told.notify_one();
        }
    }

    /// Kept: how many responses are sent.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// A response is whole (or, kept, sent).
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.told.notified()
    }

    /// hyper may read the next request.
    pub(crate) fn open(&self) {
        self.gate.store(false, Ordering::Relaxed);
    }

    /// hyper reads no more.
    pub(crate) fn close(&self) {
        self.gate.store(true, Ordering::Relaxed);
    }

    pub(crate) fn closed(&self) -> bool {
        self.gate.load(Ordering::Relaxed)
    }
}

/// A stream with bytes already read from it in front.
pub(crate) struct Prefixed<S> {
    pub(crate) ahead: bytes::Bytes,
    pub(crate) inner: S,
    /// When set and closed, reads stay pending (see `one_request`): whoever closed it opens it
    /// again, or shuts the hyper connection down, which needs no read, and takes the stream
    /// back. Told of flushes.
    pub(crate) turn: Option<Arc<Turn>>,
    /// The request being read, told how many bytes it got (for `--min-header-rate`).
    pub(crate) state: Option<Arc<RequestState>>,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // (no waker kept: the connection's loop that opens the gate polls hyper next)
        if self.turn.as_ref().is_some_and(|t| t.closed()) {
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let r = if !self.ahead.is_empty() {
            let n = self.ahead.len().min(buf.remaining());
            let chunk = self.ahead.split_to(n);
            buf.put_slice(&chunk);
            std::task::Poll::Ready(Ok(()))
        } else {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        };
        if let Some(state) = &self.state {
            state.read(buf.filled().len() - before);
        }
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if let (Poll::Ready(Ok(())), Some(turn)) = (&r, &self.turn) {
            turn.flushed();
        }
        r
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
