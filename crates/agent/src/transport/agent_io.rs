//! Where an agent's client connection comes from: a TCP socket on the public port (direct
//! clients, or an L4 balancer in front), or a stream of the agent link from the dispatcher
//! (`baton-link`). Everything above this — TLS, HTTP, migration — sees one byte stream.
//!
//! Bytes read to look at the first flight (legacy client check, client random) are kept in
//! front and read again. A link stream cannot be peeked like a socket; a socket could, but a
//! peek costs a system call of its own before the read that follows it, so a socket's first
//! look is the real first read (as much as rustls would have read), and rustls gets it from
//! here.
//!
//! A TCP socket can also coalesce writes ([`AgentIo::coalesce_writes`]): a short connection
//! otherwise sends its server flight, its session tickets, its response and its close_notify in
//! four system calls and four segments (each one a kernel send path, and on the client an ACK
//! and a wakeup), because rustls and hyper flush after each. Coalesced, the bytes written stay
//! here until the connection would wait for the client (a read that finds nothing, a wait for
//! readability), shuts down or is dropped, or until more than [`HOLD_MAX`] are held: a
//! `Connection: close` response leaves with its close_notify. A TLS 1.3 server's session
//! tickets are written once the client's Finished is read, and a client sends its first request
//! just after that Finished, usually in a segment of its own: the wait for that request would
//! send the tickets alone. [`AgentIo::hold_until_request`] keeps them through that one wait, so
//! that they leave with the response (3 sends per short connection to 2). A client never waits
//! for tickets (it may resume only once it has them, which it does after its response), and
//! one that sends no request gets them when the wait ends (the connection parks, or closes).
//! A link stream holds only a migrating handshake's tickets ([`AgentIo::hold_writes`]).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use baton_link::LinkStream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Held bytes beyond this are written at once: a response body is not buffered again here.
const HOLD_MAX: usize = 16 * 1024;

pub struct AgentIo {
    kind: Kind,
    /// Whether writes are held (see the module doc); only ever set on a TCP socket.
    coalesce: bool,
    /// Bytes written and not yet sent. Sent before the connection waits for its client, so a
    /// client never waits for bytes held here.
    held: Vec<u8>,
    /// Bytes read ahead by [`AgentIo::peek`], served first.
    ahead: Vec<u8>,
    /// The next wait for readability keeps what is held (see [`AgentIo::hold_until_request`]).
    hold_for_request: bool,
}

enum Kind {
    Tcp(TcpStream),
    Link(Box<LinkStream>),
}

/// What a socket's first look reads: what rustls would have read (its reads are this size),
/// so the ClientHello is read once.
const FIRST_READ: usize = 4096;

impl AgentIo {
    pub fn tcp(stream: TcpStream) -> Self {
        Self::of(Kind::Tcp(stream))
    }

    pub fn link(stream: LinkStream) -> Self {
        Self::of(Kind::Link(Box::new(stream)))
    }

    fn of(kind: Kind) -> Self {
        AgentIo {
            kind,
            coalesce: false,
            held: Vec::new(),
            ahead: Vec::new(),
            hold_for_request: false,
        }
    }

    /// Whether this is a TCP socket (a peek returns what has come, without waiting for more).
    pub fn is_tcp(&self) -> bool {
        matches!(self.kind, Kind::Tcp(_))
    }

    /// Holds what is written until the connection waits for its client (see the module doc).
    /// Only for a connection whose task waits on nothing but this stream while bytes are held
    /// (the built-in HTTP/1.1 responder: an upstream or an HTTP/2 stream task could keep a
    /// flushed response waiting); a link stream ignores it.
    pub fn coalesce_writes(&mut self) {
        self.coalesce = matches!(self.kind, Kind::Tcp(_));
    }

    /// Keeps what is held (a TLS 1.3 server's tickets) until the next write, the first
    /// request's response, which carries them out (see the module doc): through the wait for
    /// that request's bytes and the reads that find nothing more. The caller bounds that wait
    /// (the park time): a wait given up without bytes to read lets them go at the next wait; a
    /// connection that ends sends them at its close.
    pub fn hold_until_request(&mut self) {
        self.hold_for_request = self.coalesce && !self.held.is_empty();
    }

    /// Holds what is written on a link stream too, until [`AgentIo::stop_coalescing`] and a
    /// flush: for the handshake of a connection offered for a move, whose NewSessionTickets
    /// then leave in one DATA frame with the handoff frame that follows them (the Switch,
    /// Abort or Decline; `migration::export`), which stops holding. (On the link each DATA frame above
    /// h2's copy threshold costs a write of its own.)
    pub fn hold_writes(&mut self) {
        self.coalesce = true;
    }

    /// Stops holding writes: what is held leaves with the next write or flush.
    pub fn stop_coalescing(&mut self) {
        self.coalesce = false;
    }

    /// Sends what is held. Pending until all of it is in the socket's send buffer.
    fn poll_send_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_send_held_then(cx, false)
    }

    /// Sends what is held; `fin_follows`: the caller shuts the socket down next, so a TCP
    /// socket's send says `MSG_MORE` and the bytes wait in the kernel for that shutdown, whose
    /// FIN then rides on their last segment (one segment, and one receive on the client's
    /// side, fewer per connection; `shutdown` pushes whatever is queued at once).
    fn poll_send_held_then(
        &mut self,
        cx: &mut Context<'_>,
        fin_follows: bool,
    ) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let n = match &mut self.kind {
                Kind::Tcp(t) if fin_follows => ready!(poll_send_more(t, cx, &self.held))?,
                Kind::Tcp(t) => ready!(Pin::new(t).poll_write(cx, &self.held))?,
                Kind::Link(stream) => ready!(Pin::new(stream.as_mut()).poll_write(cx, &self.held))?,
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held.drain(..n);
        }
        if self.held.capacity() > 0 {
            self.held = Vec::new(); // give the capacity back: connections idle for long
        }
        Poll::Ready(Ok(()))
    }

    /// Holds `bufs` if coalescing and they fit; returns how many bytes were taken.
    fn hold(&mut self, bufs: &[io::IoSlice<'_>]) -> Option<usize> {
        // what is held from here on is more than the tickets: a response, which must not wait
        self.hold_for_request = false;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if !self.coalesce || self.held.len() + len > HOLD_MAX {
            return None;
        }
        if self.held.is_empty() {
            // room for a typical short flight at once (tickets ~0.5 KiB, a small response)
            self.held.reserve(len.max(2048));
        }
        for b in bufs {
            self.held.extend_from_slice(b);
        }
        Some(len)
    }

    /// Up to `buf.len()` of the first unread bytes, without consuming them; on a link stream
    /// it waits until that many arrived or the stream ended, on a socket only for the first
    /// byte. 0 at EOF.
    pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.kind {
            Kind::Tcp(t) => {
                let have = self.ahead.len();
                if have < buf.len() {
                    if have == 0 {
                        // the buffer only once there is something to read into it
                        t.readable().await?;
                    }
                    // One read of what has come, as large as rustls' next read would be. By
                    // poll_read, which (unlike try_read) clears the readiness after a short
                    // read: rustls' next read then waits instead of finding nothing.
                    self.ahead.resize(have.max(FIRST_READ).max(buf.len()), 0);
                    let mut read = ReadBuf::new(&mut self.ahead[have..]);
                    let r = std::future::poll_fn(|cx| {
                        match Pin::new(&mut *t).poll_read(cx, &mut read) {
                            // some bytes are there already: those are what has come
                            Poll::Pending if have > 0 => Poll::Ready(Ok(())),
                            r => r,
                        }
                    })
                    .await;
                    let got = read.filled().len();
                    self.ahead.truncate(have + got);
                    r?;
                }
            }
            Kind::Link(stream) => {
                while self.ahead.len() < buf.len() {
                    let mut chunk = [0u8; 512];
                    let want = (buf.len() - self.ahead.len()).min(chunk.len());
                    let n = stream.read(&mut chunk[..want]).await?;
                    if n == 0 {
                        break;
                    }
                    self.ahead.extend_from_slice(&chunk[..n]);
                }
            }
        }
        let n = self.ahead.len().min(buf.len());
        buf[..n].copy_from_slice(&self.ahead[..n]);
        Ok(n)
    }

    /// Writes without waiting for more than a free send buffer (best effort: an alert).
    pub async fn write_best_effort(&mut self, data: &[u8]) {
        match &mut self.kind {
            Kind::Tcp(t) => {
                if t.writable().await.is_ok() {
                    let _ = t.try_write(data);
                }
            }
            Kind::Link(stream) => {
                let _ = tokio::io::AsyncWriteExt::write_all(stream.as_mut(), data).await;
            }
        }
    }

    /// Waits until bytes can be read (or EOF / an error is due), reading none.
    /// Held bytes are sent first (the client may be waiting for them), unless this is the wait
    /// [`AgentIo::hold_until_request`] asked for.
    pub async fn readable(&mut self) -> io::Result<()> {
        let holding = self.hold_for_request;
        if !holding {
            std::future::poll_fn(|cx| self.poll_send_held(cx)).await?;
        }
        if !self.ahead.is_empty() {
            return Ok(());
        }
        // A held wait given up before the request came (at the park time) does not hold them
        // again: the next wait sends them.
        let mut kept = KeptIfReady(&mut self.hold_for_request, false);
        let r = match &mut self.kind {
            Kind::Tcp(t) => t.readable().await,
            Kind::Link(stream) => stream.readable().await,
        };
        kept.1 = r.is_ok();
        r
    }

    /// Reads what is there without waiting (`WouldBlock` if nothing).
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.ahead.is_empty() {
            return Ok(take_ahead(&mut self.ahead, buf));
        }
        match &mut self.kind {
            Kind::Tcp(t) => try_read_tcp(t, buf),
            Kind::Link(stream) => stream.try_read(buf),
        }
    }
}

/// A read of what a socket holds, without waiting. Unlike `TcpStream::try_read` alone, a
/// short read (fewer bytes than asked for: the socket was drained) clears the socket's
/// readiness, as `poll_read` does, so the next read (hyper's, after the request that
/// `Engine::wait_request` read here) waits for the next event instead of making a system call
/// that finds nothing. The readiness is cleared as of before the read (`try_io` takes its
/// event first): bytes that arrived since have set it again.
fn try_read_tcp(t: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let asked = buf.len();
    let mut short = None;
    let read = t.try_io(tokio::io::Interest::READABLE, || match t.try_read(buf) {
        Ok(n) if n > 0 && n < asked => {
            short = Some(n);
            Err(io::ErrorKind::WouldBlock.into()) // what makes try_io clear the readiness
        }
        r => r,
    });
    match short {
        Some(n) => Ok(n),
        None => read,
    }
}

/// A send of `buf` with `MSG_MORE`: queued, not pushed, until the shutdown that follows (see
/// [`AgentIo::poll_send_held_then`]). If that shutdown never comes, the close does the same.
fn poll_send_more(t: &TcpStream, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
    use rustix::net::SendFlags;
    loop {
        ready!(t.poll_write_ready(cx))?;
        let sent = t.try_io(tokio::io::Interest::WRITABLE, || {
            rustix::net::send(t, buf, SendFlags::MORE | SendFlags::NOSIGNAL)
                .map_err(io::Error::from)
        });
        match sent {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return Poll::Ready(r),
        }
    }
}

/// Clears the flag it holds when dropped, unless told the wait it guards ended ready.
struct KeptIfReady<'a>(&'a mut bool, bool);

impl Drop for KeptIfReady<'_> {
    fn drop(&mut self) {
        if !self.1 {
            *self.0 = false;
        }
    }
}

fn take_ahead(ahead: &mut Vec<u8>, buf: &mut [u8]) -> usize {
    let n = ahead.len().min(buf.len());
    buf[..n].copy_from_slice(&ahead[..n]);
    ahead.drain(..n);
    if ahead.is_empty() {
        *ahead = Vec::new(); // give the capacity back: connections idle for long
    }
    n
}

impl AsyncRead for AgentIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.ahead.is_empty() {
            let n = take_ahead(&mut this.ahead, buf.initialize_unfilled());
            buf.advance(n);
            return Poll::Ready(Ok(()));
        }
        let r = match &mut this.kind {
            Kind::Tcp(t) => Pin::new(t).poll_read(cx, buf),
            Kind::Link(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        };
        if r.is_pending() && !this.held.is_empty() && !this.hold_for_request {
            // Nothing to read: the client may be waiting for what is held (not for tickets
            // held for the response: `hold_until_request`). Still pending either way (the read
            // registered for readiness; a blocked send for writability).
            if let Poll::Ready(Err(e)) = this.poll_send_held(cx) {
                return Poll::Ready(Err(e));
            }
        }
        r
    }
}

impl AsyncWrite for AgentIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(n) = this.hold(bufs) {
            return Poll::Ready(Ok(n));
        }
        ready!(this.poll_send_held(cx))?;
        match &mut this.kind {
            Kind::Tcp(t) => Pin::new(t).poll_write_vectored(cx, bufs),
            Kind::Link(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.kind {
            Kind::Tcp(t) => t.is_write_vectored(),
            Kind::Link(stream) => stream.is_write_vectored(),
        }
    }

    /// While coalescing, a flush leaves the bytes held: they go before the connection waits
    /// for its client (see the module doc).
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.coalesce {
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_send_held(cx))?;
        match &mut this.kind {
            Kind::Tcp(t) => Pin::new(t).poll_flush(cx),
            Kind::Link(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_held_then(cx, true))?;
        match &mut this.kind {
            Kind::Tcp(t) => Pin::new(t).poll_shutdown(cx),
            Kind::Link(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Drop for AgentIo {
    /// What is still held when the connection ends (the alert of a failed handshake, a
    /// response cut short by a timeout) goes in one try, as it would have without coalescing:
    /// only a TCP socket holds bytes, and a fresh socket's send buffer has room for them.
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        match &mut self.kind {
            Kind::Tcp(t) => {
                let _ = t.try_write(&self.held);
            }
            // A fresh link stream has window for a handshake's last flight: queued now, or
            // not at all (the alert of a handshake that failed while writes were held).
            Kind::Link(stream) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let _ = Pin::new(stream.as_mut()).poll_write(&mut cx, &self.held);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (AgentIo, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        let mut io = AgentIo::tcp(server);
        io.coalesce_writes();
        // as after a handshake: the last read found nothing (a fresh socket may look readable)
        let e = io.try_read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        (io, client)
    }

    /// Whether the client has anything to read within a short while.
    async fn client_got(client: &mut TcpStream) -> Vec<u8> {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(100), client.read(&mut buf)).await {
            Ok(Ok(n)) => buf[..n].to_vec(),
            _ => Vec::new(),
        }
    }

    #[tokio::test]
    async fn tickets_wait_for_the_request_and_leave_with_the_response() {
        let (mut io, mut client) = pair().await;
        io.write_all(b"tickets").await.unwrap();
        io.flush().await.unwrap();
        io.hold_until_request();
        // the wait for the request sends nothing
        let waited = tokio::time::timeout(Duration::from_millis(100), io.readable()).await;
        assert!(waited.is_err(), "no request yet");
        // ...but that wait was the only one: the next sends them before waiting
        tokio::time::timeout(Duration::from_millis(100), io.readable())
            .await
            .unwrap_err();
        assert_eq!(client_got(&mut client).await, b"tickets");

        // a request that comes during the held wait: tickets and response in one send, even
        // if a read finds nothing more after the request
        let (mut io, mut client) = pair().await;
        io.write_all(b"tickets").await.unwrap();
        io.hold_until_request();
        client.write_all(b"request").await.unwrap();
        io.readable().await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(io.read(&mut buf).await.unwrap(), 7);
        let more = std::future::poll_fn(|cx| {
            let mut rb = ReadBuf::new(&mut buf);
            Poll::Ready(Pin::new(&mut io).poll_read(cx, &mut rb).is_pending())
        })
        .await;
        assert!(more, "nothing more to read");
        assert!(
            client_got(&mut client).await.is_empty(),
            "held until the response"
        );
        io.write_all(b"+response").await.unwrap();
        io.shutdown().await.unwrap();
        assert_eq!(client_got(&mut client).await, b"tickets+response");
    }

    #[tokio::test]
    async fn a_response_never_waits_for_the_next_request() {
        // the request was there before any wait (it came with the Finished): the response is
        // written, and the next wait (for a keep-alive request) sends it
        let (mut io, mut client) = pair().await;
        io.write_all(b"tickets").await.unwrap();
        io.hold_until_request();
        io.write_all(b"+response").await.unwrap();
        tokio::time::timeout(Duration::from_millis(100), io.readable())
            .await
            .unwrap_err();
        assert_eq!(client_got(&mut client).await, b"tickets+response");
    }
}
