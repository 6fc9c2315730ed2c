//! One client connection on the link, as a tokio byte stream over a link stream (`mux.rs`).
//!
//! Reads take what the link connection's task delivered and give its window back as they do,
//! so the stream window (not a buffer of ours) bounds what an unread stream holds. Writes send
//! no more than the windows grant. Shutdown ends the send side (END, a clean end at the
//! peer); dropping a stream ends it and, if the peer had not ended its side, resets it.
//!
//! A dispatcher handover: the old dispatcher ends its side with END carrying a token
//! ([`LinkStream::hand_over`]). The agent's link task registers the token with its listener
//! ([`crate::rejoin`]) and acknowledges (END with `ack`, after all the stream sent); the
//! agent's stream then reads what came before the handover and holds its reads and writes
//! (pending) until the successor's stream with `reattach: TOKEN` arrives, then goes on there:
//! the same object, the same bytes in order, a new link id.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::driver::Shared;
use crate::frame::{End, Reason};
use crate::meta::StreamMeta;
use crate::mux::{drain_into, Reset};
use crate::rejoin::{Found, Registry, Wait};

/// A stream of a link connection, owned: dropping it lets the stream go (ended, or reset).
pub(crate) struct At {
    pub(crate) link: Arc<Shared>,
    pub(crate) id: u32,
}

impl Drop for At {
    fn drop(&mut self) {
        let gone = self.link.lock().drop_stream(self.id);
        drop(gone);
    }
}

pub struct LinkStream {
    /// `None` at an agent waiting for a handover's successor.
    at: Option<At>,
    meta: StreamMeta,
    link_id: [u8; 16],
    /// Dispatcher side: the read side ended, and with the agent's acknowledgement of a
    /// handover.
    eof: bool,
    acked: bool,
    /// Agent side: what a handover needs.
    registry: Option<Arc<Registry>>,
    wait: Option<Box<Wait>>,
    /// Agent side, after a handover: what the dispatcher sent before it, read first.
    carry: VecDeque<Bytes>,
}

impl LinkStream {
    pub(crate) fn server(
        at: At,
        meta: StreamMeta,
        link_id: [u8; 16],
        registry: Arc<Registry>,
    ) -> Self {
        let mut s = Self::client(at, meta);
        s.link_id = link_id;
        s.registry = Some(registry);
        s
    }

    pub(crate) fn client(at: At, meta: StreamMeta) -> Self {
        let link_id = at.link.link_id;
        Self {
            at: Some(at),
            meta,
            link_id,
            eof: false,
            acked: false,
            registry: None,
            wait: None,
            carry: VecDeque::new(),
        }
    }

    pub fn meta(&self) -> &StreamMeta {
        &self.meta
    }

    /// The id of the link connection this stream rides on (at the agent, after a handover,
    /// the successor's link).
    pub fn link_id(&self) -> [u8; 16] {
        self.link_id
    }

    fn at(&self) -> io::Result<&At> {
        self.at
            .as_ref()
            .ok_or_else(|| io::ErrorKind::BrokenPipe.into())
    }

    /// Dispatcher side: hands the stream over to a successor dispatcher. Ends the send side
    /// with the token (after every byte already written); writes fail with `BrokenPipe` from
    /// now on, reads go on until the agent ends its side, with the acknowledgement if it waits
    /// for the successor ([`handed_over`](Self::handed_over)). The successor continues the
    /// stream with `StreamMeta::reattach = Some(token)`.
    pub fn hand_over(&mut self, token: [u8; 16]) -> io::Result<()> {
        if self.registry.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "only the dispatcher hands a stream over",
            ));
        }
        let at = self.at()?;
        let mut conn = at.link.lock();
        if conn.sent_end(at.id) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        conn.end(at.id, End::Handover(token))
    }

    /// Dispatcher side: whether the read side ended with the agent's acknowledgement of a
    /// [`hand_over`](Self::hand_over): the agent waits for the successor. False before the end
    /// (`Ok(0)`) and for an agent that simply closed.
    pub fn handed_over(&self) -> bool {
        self.eof && self.acked
    }

    /// Dispatcher side: waits for the agent's answer without reading any data; an error if
    /// the agent reset or refused the stream ([`is_refused`]). At once on a stream already
    /// answered, and on an agent's stream.
    pub async fn answered(&mut self) -> io::Result<()> {
        if self.registry.is_some() {
            return Ok(());
        }
        std::future::poll_fn(|cx| {
            let at = self.at()?;
            at.link.lock().poll_answered(at.id, cx)
        })
        .await
    }

    /// Agent side: Ready(Ok) when the stream can be used (not waiting for a handover's
    /// successor, or a reader with bytes from before the handover still to read); once the
    /// successor's stream has come, continues on it. An error once the deadline has passed.
    /// Without `cx` (a read that does not wait) a wait is Pending with nothing registered.
    fn poll_rejoined(&mut self, cx: Option<&Context<'_>>, reader: bool) -> Poll<io::Result<()>> {
        let Some(registry) = &self.registry else {
            return Poll::Ready(Ok(()));
        };
        if self.wait.is_none() {
            let Some(at) = &self.at else {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            };
            let taken = at.link.lock().take_handover(at.id);
            let Some((wait, unread)) = taken else {
                return Poll::Ready(Ok(()));
            };
            self.carry.extend(unread);
            self.wait = Some(wait);
            // the old stream ended both ways and is gone from its link
            self.at = None;
        }
        if reader && !self.carry.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let Some(wait) = &self.wait else {
            return Poll::Ready(Ok(()));
        };
        let noop = std::task::Waker::noop();
        let waker = cx.map_or(noop, |cx| cx.waker());
        let arrival = match wait.slot.take(waker, reader) {
            Found::Nothing => return Poll::Pending,
            Found::Expired => {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the dispatcher handed the stream over and no successor took it in time",
                )))
            }
            Found::Arrived(a) => a,
        };
        registry.stats().reattached.fetch_add(1, Ordering::Relaxed);
        self.wait = None;
        self.at = Some(arrival.at);
        self.link_id = arrival.link_id;
        // The other side may be waiting in the slot: the slot woke both when the stream came,
        // so it finds the new stream on its next poll.
        Poll::Ready(Ok(()))
    }

    /// Reads into `buf` (or, without it, only looks): Ready when there was something to read
    /// or the stream ended (`buf` unfilled).
    fn poll_read_into(
        &mut self,
        cx: Option<&Context<'_>>,
        buf: Option<&mut ReadBuf<'_>>,
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_rejoined(cx, true))?;
        if !self.carry.is_empty() {
            if let Some(buf) = buf {
                drain_into(&mut self.carry, buf);
            }
            return Poll::Ready(Ok(()));
        }
        if self.eof {
            return Poll::Ready(Ok(()));
        }
        let dispatcher = self.registry.is_none();
        let at = self.at()?;
        let mut conn = at.link.lock();
        let before = buf.as_ref().map(|b| b.filled().len());
        let after = |b: &Option<&mut ReadBuf<'_>>| b.as_ref().map(|b| b.filled().len());
        let mut buf = buf;
        let r = conn.poll_read(at.id, cx, buf.as_deref_mut());
        let mut ended = None;
        if dispatcher
            && matches!(r, Poll::Ready(Ok(())))
            && (before.is_none() || before == after(&buf))
        {
            ended = conn.ended(at.id);
        }
        drop(conn);
        if let Some(ack) = ended {
            self.eof = true;
            self.acked = ack;
        }
        r
    }

    /// Waits until bytes can be read or the stream has ended, reading none.
    pub async fn readable(&mut self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_read_into(Some(cx), None)).await
    }

    /// Reads what has arrived without waiting: `WouldBlock` if nothing, `Ok(0)` at the end.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rb = ReadBuf::new(buf);
        match self.poll_read_into(None, Some(&mut rb)) {
            Poll::Ready(Ok(())) => Ok(rb.filled().len()),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn poll_write_vec(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_rejoined(Some(cx), false))?;
        let at = self.at()?;
        let r = at.link.lock().poll_write(at.id, cx, bufs);
        r
    }
}

impl AsyncRead for LinkStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().poll_read_into(Some(cx), Some(buf))
    }
}

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_vec(cx, &[io::IoSlice::new(buf)])
    }

    /// A TLS flight handed over as several records goes out as one DATA frame.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_write_vec(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The link connection's task writes what streams send.
        Poll::Ready(Ok(()))
    }

    /// At an agent waiting for a dispatcher's successor, waits for it and ends the new
    /// stream.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_rejoined(Some(cx), false))?;
        let at = this.at()?;
        let r = at.link.lock().end(at.id, End::Plain);
        Poll::Ready(r)
    }
}

fn reset_of(e: &io::Error) -> Option<Reset> {
    if e.kind() != io::ErrorKind::ConnectionReset {
        return None;
    }
    e.get_ref()?.downcast_ref::<Reset>().copied()
}

/// Whether a read error is the peer's [`LinkStream::release`]: a verdict, not a failure.
pub fn is_release(e: &io::Error) -> bool {
    reset_of(e).is_some_and(|r| r.remote && r.reason == Reason::Release)
}

/// Whether an error says the agent never took the stream: refused (going away, too many
/// streams, or a GOAWAY that did not cover it): safe to retry elsewhere.
pub fn is_refused(e: &io::Error) -> bool {
    reset_of(e).is_some_and(|r| r.reason == Reason::Refused)
}

impl LinkStream {
    fn reset(mut self, reason: Reason, later: bool) {
        if let Some(at) = self.at.take() {
            let gone = at.link.lock().reset(at.id, reason, later);
            drop(gone);
        }
    }

    /// Ends the stream both ways at once with a reset the peer can tell from a failure
    /// ([`is_release`] on its next read): one frame, and the peer owes no answer. The
    /// dispatcher tells a handshake agent "Done" this way once its session has moved (what was
    /// written before still arrives first).
    pub fn release(self) {
        self.reset(Reason::Release, false);
    }

    /// [`release`](Self::release), but the reset waits (at most
    /// [`RELEASE_DELAY`](crate::RELEASE_DELAY)) for the next frame this side writes on the
    /// link connection, to leave in the same write. For a release nobody waits on: the
    /// dispatcher's Done. At once on an agent's stream.
    pub fn release_later(self) {
        let later = self.registry.is_none();
        self.reset(Reason::Release, later);
    }

    /// Resets the stream: the peer's reads fail.
    pub fn abort(self) {
        self.reset(Reason::Cancel, false);
    }
}
