//! A stream with bytes already read from it in front, handed to hyper: what the previous
//! hyper connection read ahead comes first, and a gate stops reads once a response is whole.

use std::pin::Pin;
use std::sync::Arc;

use super::pace::RequestState;

/// A stream with bytes already read from it in front.
pub(crate) struct Prefixed<S> {
    pub(crate) ahead: bytes::Bytes,
    pub(crate) inner: S,
    /// When set and true, reads stay pending (see `serve_http1`); whoever set it shuts the
    /// hyper connection down, which needs no read, and takes the stream back.
    pub(crate) gate: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The request being read, told how many bytes it got (for `--min-header-rate`).
    pub(crate) state: Option<Arc<RequestState>>,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self
            .gate
            .as_ref()
            .is_some_and(|g| g.load(std::sync::atomic::Ordering::Relaxed))
        {
            return std::task::Poll::Pending;
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
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
