//! One client connection on the link, as a tokio byte stream over an h2 stream.
//!
//! Reads hand out DATA frames and give their flow-control capacity back only as the consumer
//! takes the bytes, so the stream window (not a buffer of ours) bounds what an unread stream
//! holds. Writes send no more than the capacity h2 grants, so h2 never buffers without bound
//! either. Shutdown ends the send side (END_STREAM, a clean EOF at the peer); dropping a stream
//! that has not ended both ways resets it (the peer sees an error, never a clean EOF).
//!
//! A dispatcher handover: the old dispatcher ends its side with the trailers
//! `baton-handover: TOKEN` ([`LinkStream::hand_over`]). The agent's stream does not report that
//! end: it acknowledges (its own side ends with `baton-handover: ack` after all it sent),
//! registers TOKEN with its listener ([`crate::rejoin`]) and holds its reads and writes
//! (pending) until the successor's stream with `baton-reattach: TOKEN` arrives, then goes on
//! there: the same object, the same bytes in order, a new link id. A reader notices the
//! trailers when it reaches them; a writer looks at the read side before each write, so an
//! agent that only writes notices too (unless bytes the dispatcher sent before the handover
//! are still unread: they come first).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Buf, Bytes};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::later::Later;
use crate::meta::{self, StreamMeta};
use crate::rejoin::{Found, Registry, Slot};

/// Largest DATA frame payload we send at once.
const MAX_WRITE: usize = 16 * 1024;

enum Recv {
    /// Dispatcher side: the agent's response headers have not come yet.
    Waiting(h2::client::ResponseFuture),
    Open(RecvStream),
}

/// The sending half.
enum Send {
    /// Agent side before its first byte: the response headers wait to go out with it (one
    /// frame burst, one write, instead of a lone HEADERS frame at accept).
    Unanswered(SendResponse<Bytes>),
    Open(SendStream<Bytes>),
    /// Unanswered and then ended or reset: nothing more can be sent.
    Gone,
}

pub struct LinkStream {
    send: Send,
    recv: Recv,
    chunk: Bytes,
    eof: bool,
    sent_end: bool,
    /// Dispatcher side: the agent's end carried `baton-handover: ack`.
    acked: bool,
    meta: StreamMeta,
    link_id: [u8; 16],
    /// Agent side: what a handover needs.
    rejoin: Option<Rejoin>,
    /// Dispatcher side: its link connection's queue of releases ([`LinkStream::release_later`]).
    later: Option<Arc<Later>>,
}

/// An agent stream's part in a handover.
struct Rejoin {
    registry: Arc<Registry>,
    /// The tasks last left pending in a read and in a write: the side that notices a
    /// handover wakes the other (a writer waiting for capacity of the old stream would not
    /// learn of it otherwise).
    reader: Option<Waker>,
    writer: Option<Waker>,
    /// Set while waiting for the successor (and after the deadline passed: then every read
    /// and write fails).
    wait: Option<Box<Wait>>,
}

struct Wait {
    token: [u8; 16],
    slot: Arc<Slot>,
    timer: tokio::task::AbortHandle,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Read,
    Write,
}

fn remember(w: &mut Option<Waker>, cx: &Context<'_>) {
    match w {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *w = Some(cx.waker().clone()),
    }
}

fn h2_error(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::ErrorKind::BrokenPipe.into());
    }
    let kind = if e.is_reset() || e.is_go_away() {
        io::ErrorKind::ConnectionReset
    } else {
        io::ErrorKind::InvalidData
    };
    io::Error::new(kind, e)
}

impl LinkStream {
    pub(crate) fn server(
        respond: SendResponse<Bytes>,
        recv: RecvStream,
        meta: StreamMeta,
        link_id: [u8; 16],
        registry: Arc<Registry>,
    ) -> Self {
        let mut s = Self::new(Send::Unanswered(respond), Recv::Open(recv), meta, link_id);
        s.rejoin = Some(Rejoin {
            registry,
            reader: None,
            writer: None,
            wait: None,
        });
        s
    }

    pub(crate) fn client(
        send: SendStream<Bytes>,
        response: h2::client::ResponseFuture,
        meta: StreamMeta,
        link_id: [u8; 16],
        later: Arc<Later>,
    ) -> Self {
        let mut s = Self::new(Send::Open(send), Recv::Waiting(response), meta, link_id);
        s.later = Some(later);
        s
    }

    fn new(send: Send, recv: Recv, meta: StreamMeta, link_id: [u8; 16]) -> Self {
        Self {
            send,
            recv,
            chunk: Bytes::new(),
            eof: false,
            sent_end: false,
            acked: false,
            meta,
            link_id,
            rejoin: None,
            later: None,
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

    /// Dispatcher side: hands the stream over to a successor dispatcher. Ends the send side
    /// with the trailers `baton-handover: TOKEN` (after every byte already written); writes
    /// fail with `BrokenPipe` from now on, reads go on until the agent ends its side, with the
    /// acknowledgement if it waits for the successor ([`handed_over`](Self::handed_over)).
    /// The successor continues the stream with `StreamMeta::reattach = Some(token)`.
    pub fn hand_over(&mut self, token: [u8; 16]) -> io::Result<()> {
        if self.rejoin.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "only the dispatcher hands a stream over",
            ));
        }
        if self.sent_end {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let sent = self
            .sender()?
            .send_trailers(meta::handover_trailers(&token))
            .map_err(h2_error);
        self.sent_end = true;
        sent
    }

    /// Dispatcher side: whether the read side ended with the agent's acknowledgement of a
    /// [`hand_over`](Self::hand_over) (`baton-handover: ack`): the agent waits for the
    /// successor. False before the end (`Ok(0)`) and for an agent that simply closed.
    pub fn handed_over(&self) -> bool {
        self.eof && self.acked
    }

    /// Dispatcher side: waits for the agent's answer (its response headers) without reading
    /// any data; an error if the agent reset or refused the stream ([`is_refused`]). At once
    /// on a stream already answered, and on an agent's stream.
    pub async fn answered(&mut self) -> io::Result<()> {
        std::future::poll_fn(|cx| match &mut self.recv {
            Recv::Waiting(response) => {
                let resp = ready!(Pin::new(response).poll(cx)).map_err(h2_error)?;
                self.recv = Recv::Open(resp.into_body());
                Poll::Ready(Ok(()))
            }
            Recv::Open(_) => Poll::Ready(Ok(())),
        })
        .await
    }

    /// Fetches the next DATA frame into `chunk` (or notes the end). Ready(Ok) when there is
    /// something to read or the stream ended.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.chunk.is_empty() && !self.eof {
            if self.waiting() {
                ready!(self.poll_rejoined(cx, Side::Read))?;
                continue;
            }
            let recv = match &mut self.recv {
                Recv::Waiting(response) => {
                    let resp = ready!(Pin::new(response).poll(cx)).map_err(h2_error)?;
                    self.recv = Recv::Open(resp.into_body());
                    continue;
                }
                Recv::Open(r) => r,
            };
            match recv.poll_data(cx) {
                Poll::Ready(Some(Ok(b))) => self.chunk = b,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(h2_error(e))),
                Poll::Ready(None) => {
                    let end = self.poll_end(cx);
                    if end.is_pending() {
                        self.note(Side::Read, cx);
                    }
                    ready!(end)?;
                }
                Poll::Pending => {
                    self.note(Side::Read, cx);
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    /// The read side has no more DATA: reads its trailers. A dispatcher's stream notes an
    /// agent's acknowledgement; an agent's stream begins waiting for a successor if the
    /// trailers hand it over. Anything else is a plain end (`eof`).
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Recv::Open(recv) = &mut self.recv else {
            return Poll::Ready(Ok(()));
        };
        let trailers = match ready!(recv.poll_trailers(cx)) {
            Ok(t) => t,
            Err(e) => return Poll::Ready(Err(h2_error(e))),
        };
        if self.rejoin.is_none() {
            self.acked = trailers.as_ref().is_some_and(meta::is_handover_ack);
            self.eof = true;
            return Poll::Ready(Ok(()));
        }
        match trailers.as_ref().and_then(meta::handover_token) {
            // An agent that has ended its side has nothing to continue: a plain end.
            Some(token) if !self.sent_end => Poll::Ready(self.begin_handover(token)),
            _ => {
                self.eof = true;
                Poll::Ready(Ok(()))
            }
        }
    }

    /// Agent side, the dispatcher handed the stream over: registers `token` for the
    /// successor, then acknowledges (in this order: the dispatcher lets the successor come
    /// only after the acknowledgement), and from now on reads and writes wait.
    fn begin_handover(&mut self, token: [u8; 16]) -> io::Result<()> {
        let Some(registry) = self.rejoin.as_ref().map(|r| r.registry.clone()) else {
            self.eof = true;
            return Ok(());
        };
        let Some((slot, timer)) = registry.enter(token) else {
            // The token waits already, or too many do: not acknowledged, so the dispatcher
            // sees a plain end and closes the client; so does the agent.
            tracing::debug!("a handover could not wait for its successor");
            registry
                .stats()
                .reattach_failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.eof = true;
            return Ok(());
        };
        let acked = self
            .sender()
            .and_then(|s| s.send_trailers(meta::ack_trailers()).map_err(h2_error));
        self.sent_end = true;
        if let Err(e) = acked {
            timer.abort();
            registry.leave(token, &slot);
            registry
                .stats()
                .reattach_failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.eof = true;
            return Err(e);
        }
        if let Some(r) = &mut self.rejoin {
            r.wait = Some(Box::new(Wait { token, slot, timer }));
            // The other side learns of it now: a writer may be waiting for capacity of the
            // old stream, which will never come.
            for w in [r.reader.take(), r.writer.take()].into_iter().flatten() {
                w.wake();
            }
        }
        Ok(())
    }

    fn waiting(&self) -> bool {
        self.rejoin.as_ref().is_some_and(|r| r.wait.is_some())
    }

    /// Remembers the task left pending on `side`, so that a handover noticed by the other
    /// side wakes it (agent side only: a dispatcher's stream has no handover to notice).
    fn note(&mut self, side: Side, cx: &Context<'_>) {
        if let Some(r) = &mut self.rejoin {
            remember(
                if side == Side::Read {
                    &mut r.reader
                } else {
                    &mut r.writer
                },
                cx,
            );
        }
    }

    /// Agent side: Ready(Ok) unless waiting for a successor; once its stream has come,
    /// continues on it. An error once the deadline has passed.
    fn poll_rejoined(&mut self, cx: &mut Context<'_>, side: Side) -> Poll<io::Result<()>> {
        let Some(r) = &mut self.rejoin else {
            return Poll::Ready(Ok(()));
        };
        let Some(wait) = &r.wait else {
            return Poll::Ready(Ok(()));
        };
        let arrival = match wait.slot.take(cx.waker(), side == Side::Read) {
            Found::Nothing => return Poll::Pending,
            Found::Expired => {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the dispatcher handed the stream over and no successor took it in time",
                )))
            }
            Found::Arrived(a) => a,
        };
        if let Some(w) = r.wait.take() {
            w.timer.abort();
        }
        r.registry
            .stats()
            .reattached
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The old stream has ended both ways: dropping its halves resets nothing.
        self.send = Send::Open(arrival.send);
        self.recv = Recv::Open(arrival.recv);
        self.link_id = arrival.link_id;
        self.chunk = Bytes::new();
        self.eof = false;
        self.sent_end = false;
        // The other side may be waiting in the slot: the slot woke both when the stream
        // came, so it finds the new stream on its next poll.
        Poll::Ready(Ok(()))
    }

    /// Agent side, before a write: looks at the read side, so that an agent that only
    /// writes notices a handover too. Polls with the reader's waker (or none), never the
    /// writer's: h2 keeps one waker per stream's read side, which stays the reader's. What
    /// it takes (one DATA frame at most, while `chunk` is empty) waits in `chunk`.
    fn peek(&mut self) -> io::Result<()> {
        if !self.chunk.is_empty() || self.eof || self.sent_end {
            return Ok(());
        }
        let Some(r) = &self.rejoin else {
            return Ok(());
        };
        let reader = r.reader.clone();
        let waker = reader.clone().unwrap_or_else(|| Waker::noop().clone());
        let mut cx = Context::from_waker(&waker);
        let Recv::Open(recv) = &mut self.recv else {
            return Ok(());
        };
        let result = match recv.poll_data(&mut cx) {
            Poll::Pending => return Ok(()),
            Poll::Ready(Some(Ok(b))) => {
                self.chunk = b;
                Ok(())
            }
            // The reader meets the error itself (h2 reports it again).
            Poll::Ready(Some(Err(_))) => Ok(()),
            Poll::Ready(None) => match self.poll_end(&mut cx) {
                Poll::Pending => return Ok(()),
                Poll::Ready(r) => r,
            },
        };
        // Something the reader would have been woken for: wake it (a handover woke it
        // already).
        if let Some(w) = reader {
            w.wake();
        }
        result
    }

    /// Agent side, before a write: notices a handover and waits for the successor.
    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.rejoin.is_none() {
            return Poll::Ready(Ok(()));
        }
        if !self.waiting() {
            self.peek()?;
        }
        self.poll_rejoined(cx, Side::Write)
    }

    /// The send stream, answering the request first if that is still to do.
    fn sender(&mut self) -> io::Result<&mut SendStream<Bytes>> {
        if let Send::Unanswered(_) = self.send {
            let Send::Unanswered(mut respond) = std::mem::replace(&mut self.send, Send::Gone)
            else {
                unreachable!()
            };
            let open = respond
                .send_response(http::Response::new(()), false)
                .map_err(h2_error)?;
            self.send = Send::Open(open);
        }
        match &mut self.send {
            Send::Open(s) => Ok(s),
            _ => Err(io::ErrorKind::BrokenPipe.into()),
        }
    }

    /// Ends the send side (END_STREAM); a no-op once ended.
    fn end(&mut self) -> io::Result<()> {
        if std::mem::replace(&mut self.sent_end, true) {
            return Ok(());
        }
        match std::mem::replace(&mut self.send, Send::Gone) {
            Send::Unanswered(mut respond) => respond
                .send_response(http::Response::new(()), true)
                .map(drop)
                .map_err(h2_error),
            Send::Open(mut s) => {
                let r = s.send_data(Bytes::new(), true).map_err(h2_error);
                self.send = Send::Open(s);
                r
            }
            Send::Gone => Ok(()),
        }
    }

    /// Waits until h2 grants send capacity (at most `want` is asked for); returns how much.
    fn poll_send_capacity(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        let send = self.sender()?;
        loop {
            let have = send.capacity();
            if have > 0 {
                return Poll::Ready(Ok(have));
            }
            send.reserve_capacity(want);
            match ready!(send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(h2_error(e))),
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
    }

    fn take(&mut self, out: &mut [u8]) -> usize {
        let n = self.chunk.len().min(out.len());
        out[..n].copy_from_slice(&self.chunk[..n]);
        self.consumed(n);
        n
    }

    /// [`take`](Self::take) into a read buffer, writing only the bytes taken (initializing
    /// its whole unfilled part first would zero a large buffer on every read).
    fn take_into(&mut self, buf: &mut ReadBuf<'_>) {
        let n = self.chunk.len().min(buf.remaining());
        buf.put_slice(&self.chunk[..n]);
        self.consumed(n);
    }

    /// `n` bytes at the front of `chunk` were read: gives their flow-control capacity back.
    fn consumed(&mut self, n: usize) {
        self.chunk.advance(n);
        if let Recv::Open(r) = &mut self.recv {
            let _ = r.flow_control().release_capacity(n);
        }
    }

    /// Waits until bytes can be read or the stream has ended, reading none.
    pub async fn readable(&mut self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await
    }

    /// Reads what has arrived without waiting: `WouldBlock` if nothing, `Ok(0)` at the end.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.chunk.is_empty() {
            return Ok(self.take(buf));
        }
        if self.eof {
            return Ok(0);
        }
        let waker = std::task::Waker::noop();
        match self.poll_fill(&mut Context::from_waker(waker)) {
            Poll::Ready(Ok(())) => Ok(self.take(buf)),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl AsyncRead for LinkStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_fill(cx))?;
        this.take_into(buf);
        // Gather the DATA frames that are already here into the same read: a peer's flight
        // often comes as several frames, and one read means one write onward (one system
        // call at the dispatcher's client socket instead of one per frame). Pending here only
        // leaves a wake-up registered, which is harmless.
        while buf.remaining() > 0 && !this.eof {
            match this.poll_fill(cx) {
                Poll::Ready(Ok(())) if !this.chunk.is_empty() => this.take_into(buf),
                _ => break,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl LinkStream {
    /// Writes up to `total` bytes, as much as h2 grants; `data(n)` makes the first `n`.
    fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        total: usize,
        data: impl FnOnce(usize) -> Bytes,
    ) -> Poll<io::Result<usize>> {
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        ready!(self.poll_write_ready(cx))?;
        if self.sent_end {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let want = total.min(MAX_WRITE);
        let have = match self.poll_send_capacity(cx, want) {
            Poll::Ready(r) => r?,
            Poll::Pending => {
                self.note(Side::Write, cx);
                return Poll::Pending;
            }
        };
        let n = have.min(want);
        self.sender()?.send_data(data(n), false).map_err(h2_error)?;
        Poll::Ready(Ok(n))
    }
}

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_with(cx, buf.len(), |n| Bytes::copy_from_slice(&buf[..n]))
    }

    /// A TLS flight handed over as several records goes out as one DATA frame.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        self.get_mut().poll_write_with(cx, total, |n| {
            let mut data = bytes::BytesMut::with_capacity(n);
            for b in bufs {
                let take = (n - data.len()).min(b.len());
                data.extend_from_slice(&b[..take]);
                if data.len() == n {
                    break;
                }
            }
            data.freeze()
        })
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
        ready!(this.poll_rejoined(cx, Side::Write))?;
        Poll::Ready(this.end())
    }
}

/// Whether a read error is the peer's [`LinkStream::release`]: a verdict, not a failure.
pub fn is_release(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ConnectionReset
        && e.get_ref()
            .and_then(|inner| inner.downcast_ref::<h2::Error>())
            .is_some_and(|h| h.is_remote() && h.reason() == Some(h2::Reason::NO_ERROR))
}

/// Whether a read error says the agent never took the stream: refused with REFUSED_STREAM,
/// or above the last stream its GOAWAY promised to process (RFC 9113 8.7: safe to retry).
pub fn is_refused(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ConnectionReset
        && e.get_ref()
            .and_then(|inner| inner.downcast_ref::<h2::Error>())
            .is_some_and(|h| {
                h.reason() == Some(h2::Reason::REFUSED_STREAM) || (h.is_go_away() && h.is_remote())
            })
}

impl LinkStream {
    /// Ends the stream both ways at once with a reset the peer can tell from a failure
    /// ([`is_release`] on its next read): one frame, and the peer owes no answer. The
    /// dispatcher tells a handshake agent "Done" this way once its session has moved; anything
    /// still queued here is dropped, so nothing else may ride with it.
    pub fn release(mut self) {
        self.sent_end = true;
        match &mut self.send {
            Send::Unanswered(respond) => respond.send_reset(h2::Reason::NO_ERROR),
            Send::Open(s) => s.send_reset(h2::Reason::NO_ERROR),
            Send::Gone => {}
        }
    }

    /// [`release`](Self::release), but the reset waits (at most
    /// [`RELEASE_DELAY`](crate::RELEASE_DELAY)) for the next frame this side writes on the
    /// link connection, to leave in the same write ([`crate::later`]). For a release nobody
    /// waits on: the dispatcher's Done. At once on a stream without a queue (an agent's).
    pub fn release_later(mut self) {
        match self.later.take() {
            Some(later) => later.push(self),
            None => self.release(),
        }
    }

    /// Resets the stream: nothing queued is sent, and the peer's reads fail.
    pub fn abort(mut self) {
        self.sent_end = true;
        match &mut self.send {
            Send::Unanswered(respond) => respond.send_reset(h2::Reason::CANCEL),
            Send::Open(s) => s.send_reset(h2::Reason::CANCEL),
            Send::Gone => {}
        }
    }
}

impl Drop for LinkStream {
    fn drop(&mut self) {
        let _ = self.end();
        if let Some(r) = &mut self.rejoin {
            if let Some(w) = r.wait.take() {
                w.timer.abort();
                r.registry.leave(w.token, &w.slot);
            }
        }
    }
}
