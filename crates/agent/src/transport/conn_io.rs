//! The TCP stream as the agent sees it: bytes counted for metrics, and an idle timeout.
//!
//! The idle timeout lives in the stream rather than in each protocol (TLS handshake, HTTP/1.1
//! keep-alive, HTTP/2) so that every phase where a peer can stall is covered by one mechanism:
//! a connection that neither sends nor accepts a byte for `idle` gets `TimedOut` from its next
//! read or write and is closed. The timer is not moved on every byte, nor on every operation
//! that would block: it stays at the deadline it was armed for and, when that passes, is armed
//! again for the deadline activity has moved it to (if any). Moving a timer takes a lock of the
//! runtime's timer wheel, and a deadline earlier than the one the runtime sleeps towards wakes
//! it (an eventfd write and one more `epoll_wait`); a short connection used to do that several
//! times, and now arms one timer.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use baton_migrate::{MigrationError, Splitter};

use super::agent_io::AgentIo;
use crate::metrics::Metrics;

pub struct ConnIo<T> {
    inner: T,
    metrics: Arc<Metrics>,
    idle: Duration,
    last_activity: Instant,
    timer: Pin<Box<Sleep>>,
    /// For a connection that may migrate: where the client's records stand in what was read
    /// (`Err` once something other than a record came). See [`ConnIo::track_records`].
    records: Option<Result<Splitter, MigrationError>>,
    /// Bytes read since records were first followed, and where in them the last whole record
    /// ends: the handshake agent's cut ([`ConnIo::record_boundary`]).
    followed: u64,
    boundary: u64,
}

impl<T> ConnIo<T> {
    pub fn new(inner: T, metrics: Arc<Metrics>, idle: Duration) -> Self {
        let now = Instant::now();
        Self {
            inner,
            metrics,
            idle,
            last_activity: now,
            timer: Box::pin(tokio::time::sleep_until(now + idle)),
            records: None,
            followed: 0,
            boundary: 0,
        }
    }

    /// Follows the record boundaries of everything read from here on. rustls reads in chunks,
    /// so a handshake can end with part of a record inside rustls and the rest on the stream;
    /// the handshake agent's side of a migration must know that to read on.
    pub fn track_records(&mut self) {
        self.records = Some(Ok(Splitter::new()));
        self.followed = 0;
        self.boundary = 0;
    }

    /// How many bytes from where [`ConnIo::track_records`] started (a link stream's first
    /// byte after the Offer) end with the last whole record read: what a handshake agent has
    /// consumed when it cuts (part of a record read after it is not).
    pub fn record_boundary(&self) -> u64 {
        self.boundary
    }

    /// Stops following records and says where they stood; `None` if they were not followed,
    /// or the stream held something other than TLS records.
    pub fn take_records(&mut self) -> Option<Splitter> {
        self.records.take().and_then(Result::ok)
    }

    /// Follows records again from where `records` stood (what [`ConnIo::take_records`] gave,
    /// with nothing read since).
    pub fn continue_records(&mut self, records: Splitter) {
        self.records = Some(Ok(records));
    }

    /// Whether everything read so far ends at a record boundary (no record is half read);
    /// `None` if records are not followed, or something other than records came.
    pub fn records_at_boundary(&self) -> Option<bool> {
        match &self.records {
            Some(Ok(records)) => Some(records.at_boundary()),
            _ => None,
        }
    }

    /// Follows the records in bytes just read, if asked to.
    fn follow(&mut self, read: &[u8]) {
        if let Some(Ok(records)) = &mut self.records {
            match records.follow(read) {
                Ok(Some(end)) => self.boundary = self.followed + end as u64,
                Ok(None) => {}
                Err(e) => self.records = Some(Err(e)),
            }
            self.followed += read.len() as u64;
        }
    }

    fn active(&mut self) {
        self.last_activity = Instant::now();
    }

    /// Called when an operation would block: times out, or arranges to be woken at the
    /// deadline.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        idle_clock(&mut self.timer, self.last_activity + self.idle, cx)
    }

    /// Counts what a write moved; a write that would block waits on the idle clock.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                self.metrics.bytes_out(n);
                self.active();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.poll_idle(cx).map(Err),
        }
    }
}

impl ConnIo<AgentIo> {
    /// See [`AgentIo::coalesce_writes`].
    pub fn coalesce_writes(&mut self) {
        self.inner.coalesce_writes();
    }

    /// See [`AgentIo::hold_until_request`].
    pub fn hold_until_request(&mut self) {
        self.inner.hold_until_request();
    }

    /// See [`AgentIo::hold_writes`].
    pub fn hold_writes(&mut self) {
        self.inner.hold_writes();
    }

    /// See [`AgentIo::stop_coalescing`].
    pub fn stop_coalescing(&mut self) {
        self.inner.stop_coalescing();
    }

    /// Waits until the socket has bytes to read (or the idle timeout passes), reading none.
    /// On the connection's own idle timer (no timer armed per wait).
    pub async fn readable(&mut self) -> io::Result<()> {
        let deadline = self.last_activity + self.idle;
        let timer = &mut self.timer;
        let ready = self.inner.readable();
        tokio::pin!(ready);
        std::future::poll_fn(|cx| match ready.as_mut().poll(cx) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending => idle_clock(timer, deadline, cx).map(Err),
        })
        .await
    }

    /// Reads what the socket holds without waiting (`WouldBlock` if nothing).
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.try_read(buf)?;
        self.follow(&buf[..n]);
        self.metrics.bytes_in(n);
        self.active();
        Ok(n)
    }
}

use std::future::Future as _;

/// Polls the idle timer towards `deadline`. The timer fires at the deadline it was armed for,
/// which activity since can only have moved later: then it is armed again for the new one.
fn idle_clock(
    timer: &mut Pin<Box<Sleep>>,
    deadline: Instant,
    cx: &mut Context<'_>,
) -> Poll<io::Error> {
    loop {
        match timer.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(()) if deadline <= Instant::now() => {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle for longer than --idle-timeout",
                ))
            }
            Poll::Ready(()) => timer.as_mut().reset(deadline),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ConnIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                this.follow(&buf.filled()[before..]);
                this.metrics.bytes_in(n);
                this.active();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ConnIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Pending => this.poll_idle(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Pending => this.poll_idle(cx).map(Err),
            ready => ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn idle_reader_times_out_and_activity_postpones_it() {
        let (client, server) = tokio::io::duplex(64);
        let metrics = Arc::new(Metrics::default());
        let mut io = ConnIo::new(server, metrics.clone(), Duration::from_secs(5));
        let mut client = client;
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            client.write_all(b"hi").await.unwrap();
            // then stays silent, holding the stream open
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(client);
        });
        let mut buf = [0u8; 2];
        io.read_exact(&mut buf).await.unwrap();
        let started = Instant::now();
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let m = metrics.clone();
        assert!(crate::metrics::tests::encoded(move |e| m.encode(e))
            .contains("baton_bytes_total{direction=\"in\"} 2"));
        writer.abort();
    }
}
