//! One client connection on the link, as a tokio byte stream over an h2 stream.
//!
//! Reads hand out DATA frames and give their flow-control capacity back only as the consumer
//! takes the bytes, so the stream window (not a buffer of ours) bounds what an unread stream
//! holds. Writes send no more than the capacity h2 grants, so h2 never buffers without bound
//! either. Shutdown ends the send side (END_STREAM, a clean EOF at the peer); dropping a stream
//! that has not ended both ways resets it (the peer sees an error, never a clean EOF).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::meta::StreamMeta;

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
    meta: StreamMeta,
    link_id: [u8; 16],
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
    ) -> Self {
        Self::new(Send::Unanswered(respond), Recv::Open(recv), meta, link_id)
    }

    pub(crate) fn client(
        send: SendStream<Bytes>,
        response: h2::client::ResponseFuture,
        meta: StreamMeta,
        link_id: [u8; 16],
    ) -> Self {
        Self::new(Send::Open(send), Recv::Waiting(response), meta, link_id)
    }

    fn new(send: Send, recv: Recv, meta: StreamMeta, link_id: [u8; 16]) -> Self {
        Self {
            send,
            recv,
            chunk: Bytes::new(),
            eof: false,
            sent_end: false,
            meta,
            link_id,
        }
    }

    pub fn meta(&self) -> &StreamMeta {
        &self.meta
    }

    /// The id of the link connection this stream rides on.
    pub fn link_id(&self) -> [u8; 16] {
        self.link_id
    }

    /// Fetches the next DATA frame into `chunk` (or notes the end). Ready(Ok) when there is
    /// something to read or the stream ended.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.chunk.is_empty() && !self.eof {
            let recv = match &mut self.recv {
                Recv::Waiting(response) => {
                    let resp = ready!(Pin::new(response).poll(cx)).map_err(h2_error)?;
                    self.recv = Recv::Open(resp.into_body());
                    continue;
                }
                Recv::Open(r) => r,
            };
            match ready!(recv.poll_data(cx)) {
                Some(Ok(b)) => self.chunk = b,
                Some(Err(e)) => return Poll::Ready(Err(h2_error(e))),
                None => self.eof = true,
            }
        }
        Poll::Ready(Ok(()))
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
        self.chunk.advance(n);
        if let Recv::Open(r) = &mut self.recv {
            let _ = r.flow_control().release_capacity(n);
        }
        n
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
        let n = this.take(buf.initialize_unfilled());
        buf.advance(n);
        // Gather the DATA frames that are already here into the same read: a peer's flight
        // often comes as several frames, and one read means one write onward (one system
        // call at the dispatcher's client socket instead of one per frame). Pending here only
        // leaves a wake-up registered, which is harmless.
        while buf.remaining() > 0 && !this.eof {
            match this.poll_fill(cx) {
                Poll::Ready(Ok(())) if !this.chunk.is_empty() => {
                    let n = this.take(buf.initialize_unfilled());
                    buf.advance(n);
                }
                _ => break,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if this.sent_end {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let want = buf.len().min(MAX_WRITE);
        let have = ready!(this.poll_send_capacity(cx, want))?;
        let n = have.min(want);
        this.sender()?
            .send_data(Bytes::copy_from_slice(&buf[..n]), false)
            .map_err(h2_error)?;
        Poll::Ready(Ok(n))
    }

    /// A TLS flight handed over as several records goes out as one DATA frame.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        if this.sent_end {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let want = total.min(MAX_WRITE);
        let have = ready!(this.poll_send_capacity(cx, want))?;
        let n = have.min(want);
        let mut data = bytes::BytesMut::with_capacity(n);
        for b in bufs {
            let take = (n - data.len()).min(b.len());
            data.extend_from_slice(&b[..take]);
            if data.len() == n {
                break;
            }
        }
        this.sender()?
            .send_data(data.freeze(), false)
            .map_err(h2_error)?;
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The link connection's task writes what streams send.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().end())
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
    }
}
