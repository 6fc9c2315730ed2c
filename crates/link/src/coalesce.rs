//! Write-combining under h2: one system call per poll of a link connection, not one per frame.
//!
//! h2 (0.4) writes a DATA frame of 256 bytes or more with a write of its own (header and payload
//! chained, vectored) and flushes before it queues the next frame, so the frames one poll of the
//! connection produces (many client streams share a link; a migration sends several frames at
//! once) each cost a system call. Under h2 sits [`Coalesced`]: its writes only append to a
//! buffer and its flush is a no-op; the future that drives the connection, wrapped in
//! [`flushing`], writes that buffer out after every poll. So what one poll produced leaves in
//! one write, and no frame ever waits for a later one: the poll that queued it ends with its
//! write (or, on a full socket, with a wake-up registered for when it can go on).
//!
//! The buffer is bounded: past [`HIGH`] bytes a write first drains it, and waits (Pending, like
//! a full socket) while it cannot, so h2 sees the peer's backpressure as before.
//!
//! It is also where the link is sealed ([`crate::seal`]): what one poll produced is sealed
//! just before it is written, as few records as fit, and what h2 reads comes out of the
//! record reader, which tears the link down at the first record that does not open.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::later::Later;
use crate::seal::{Opener, Sealer, Transport};
use crate::LinkStats;

/// Closes a link's release queue when its driver ends.
struct Closing(Arc<Later>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Buffered bytes past which a write waits for the socket (h2 adds at most one frame, 16 KiB
/// and its header, beyond it).
const HIGH: usize = 64 * 1024;

/// What h2 reads and writes: the socket's read half behind the record reader, and the shared
/// write buffer.
pub(crate) struct Coalesced {
    read: OwnedReadHalf,
    opener: Opener,
    out: Arc<Out>,
    /// Counts a record that did not open (the agent's end).
    stats: Option<Arc<LinkStats>>,
    peer: Option<SocketAddr>,
}

/// The write side, shared by the IO under h2 and the future that drives the connection.
pub(crate) struct Out(Mutex<Pending>);

struct Pending {
    write: OwnedWriteHalf,
    /// What h2 wrote since the last drain, sealed when the drain begins.
    plain: Vec<u8>,
    sealer: Sealer,
    /// Records to write.
    buf: Vec<u8>,
    /// `buf[..pos]` is written already.
    pos: usize,
    /// A write failed: every later one fails the same way.
    broken: Option<io::ErrorKind>,
}

impl Coalesced {
    /// Takes over `tcp`, sealed with `transport`; returns the IO for h2 and the handle
    /// [`flushing`] needs. `stats` counts the records that do not open.
    pub(crate) fn new(
        tcp: TcpStream,
        transport: Transport,
        stats: Option<Arc<LinkStats>>,
    ) -> (Self, Arc<Out>) {
        let peer = tcp.peer_addr().ok();
        let (read, write) = tcp.into_split();
        let out = Arc::new(Out(Mutex::new(Pending {
            write,
            plain: Vec::new(),
            sealer: Sealer::new(transport.clone()),
            buf: Vec::new(),
            pos: 0,
            broken: None,
        })));
        (
            Self {
                read,
                opener: Opener::new(transport),
                out: out.clone(),
                stats,
                peer,
            },
            out,
        )
    }
}

impl Out {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Pending {
    /// Writes the buffer out; Ready(Ok) once it is empty, Pending (a wake-up registered) while
    /// the socket takes no more.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if let Some(kind) = self.broken {
                return Poll::Ready(Err(kind.into()));
            }
            if self.pos == self.buf.len() {
                self.buf.clear();
                self.pos = 0;
                if self.plain.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                if self.sealer.seal(&self.plain, &mut self.buf).is_err() {
                    self.broken = Some(io::ErrorKind::InvalidData);
                }
                self.plain.clear();
                continue;
            }
            match ready!(Pin::new(&mut self.write).poll_write(cx, &self.buf[self.pos..])) {
                Ok(0) => self.broken = Some(io::ErrorKind::WriteZero),
                Ok(n) => self.pos += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.broken = Some(e.kind()),
            }
        }
    }

    fn buffered(&self) -> usize {
        self.plain.len() + self.buf.len() - self.pos
    }
}

/// Runs `fut` (what drives an h2 connection over the [`Coalesced`] that `out` belongs to),
/// writing out after each of its polls what it buffered. Ends when `fut` has ended and its
/// last bytes are written (or the socket failed: its next user learns that from the socket).
/// With `later` (the dispatcher's end), the stream releases waiting there leave with the
/// first write that goes anyway, or alone once due ([`crate::later`]).
pub(crate) async fn flushing<F: Future>(
    fut: F,
    out: Arc<Out>,
    later: Option<Arc<Later>>,
) -> F::Output {
    let mut fut = pin!(fut);
    let mut done = None;
    let mut told = false;
    // the timer of a release that waits alone, made when one first does
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
    // the queue is closed when this ends, however it ends (its streams hold it)
    let _closing = later.clone().map(Closing);
    std::future::poll_fn(move |cx| {
        if done.is_none() {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                done = Some(v);
            }
        }
        if let Some(l) = later.as_ref().filter(|_| done.is_none()) {
            if let Some(due) = l.due(cx.waker()) {
                // company: this poll writes anyway; or alone, once due
                if out.lock().buffered() > 0 || due <= tokio::time::Instant::now() {
                    l.release_all();
                    // h2 writes the resets it was just given into this same write
                    if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                        done = Some(v);
                    }
                } else {
                    let t = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                    if t.deadline() != due {
                        t.as_mut().reset(due);
                    }
                    if t.as_mut().poll(cx).is_ready() {
                        // due meanwhile: poll again at once
                        cx.waker().wake_by_ref();
                    }
                }
            }
        }
        let drained = out.lock().poll_drain(cx);
        if matches!(drained, Poll::Ready(Err(_))) && done.is_none() && !told {
            // The write failed after h2's poll: poll it once more, so that it meets the error
            // at its next flush now, not at the next event on the socket.
            told = true;
            cx.waker().wake_by_ref();
        }
        match done.take() {
            // the last bytes went, or never will
            Some(v) if drained.is_ready() => Poll::Ready(v),
            Some(v) => {
                done = Some(v);
                Poll::Pending
            }
            None => Poll::Pending,
        }
    })
    .await
}

impl AsyncRead for Coalesced {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Every record already received goes to h2 in this one read, as far as `buf` takes it
        // (one read of the socket often brings several): h2 then decodes them in one pass, as
        // it would the same bytes unsealed.
        let mut delivered = false;
        loop {
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            match this.opener.available() {
                Ok([]) if delivered => return Poll::Ready(Ok(())),
                Ok([]) => {}
                Ok(plain) => {
                    let n = plain.len().min(buf.remaining());
                    buf.put_slice(&plain[..n]);
                    this.opener.consume(n);
                    delivered = true;
                    continue;
                }
                // what came before the refused record first; the error at the next read
                Err(_) if delivered => return Poll::Ready(Ok(())),
                Err(e) => return Poll::Ready(Err(this.refused(e))),
            }
            let mut into = ReadBuf::new(this.opener.spare());
            ready!(Pin::new(&mut this.read).poll_read(cx, &mut into))?;
            let n = into.filled().len();
            if n == 0 {
                // the end: at a record's boundary like the end of a plain socket, else cut
                return Poll::Ready(if this.opener.partial() {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the link closed within a message",
                    ))
                } else {
                    Ok(())
                });
            }
            this.opener.filled(n);
        }
    }
}

impl Coalesced {
    /// A record did not open: counted once, told once, and the read fails (h2 then ends the
    /// link; the dispatcher's pool reconnects).
    fn refused(&mut self, e: crate::seal::Integrity) -> io::Error {
        if let Some(stats) = self.stats.take() {
            stats
                .integrity_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(peer) = self.peer.take() {
            tracing::warn!(%peer, error = %e, "agent link integrity failure");
        }
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

impl AsyncWrite for Coalesced {
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
        let mut out = self.out.lock();
        if out.buffered() >= HIGH {
            ready!(out.poll_drain(cx))?;
        }
        if let Some(kind) = out.broken {
            return Poll::Ready(Err(kind.into()));
        }
        let mut n = 0;
        for b in bufs {
            out.plain.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    /// Vectored, so that h2 chains a frame's payload instead of copying it into its own buffer
    /// first (the one copy is ours).
    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Deferred: [`flushing`] writes after the poll that queued the bytes.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.out.lock().broken {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
    }

    /// Everything buffered first, then the socket's write side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.out.lock();
        ready!(out.poll_drain(cx))?;
        Pin::new(&mut out.write).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A sealed writer's socket, and its peer's socket with the reader of its records.
    async fn pair() -> (TcpStream, TcpStream, Transport, Opener) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap());
        let (a, b) = tokio::join!(a, l.accept());
        let (mine, theirs) = crate::seal::pair();
        (a.unwrap(), b.unwrap().0, mine, Opener::new(theirs))
    }

    /// Plaintext from `b` until `want` bytes or the end.
    async fn recv(b: &mut TcpStream, o: &mut Opener, want: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while got.len() < want {
            let n = o.read(&mut buf).unwrap();
            if n > 0 {
                got.extend_from_slice(&buf[..n]);
                continue;
            }
            let r = b.read(o.spare()).await.unwrap();
            if r == 0 {
                break;
            }
            o.filled(r);
        }
        got
    }

    #[tokio::test]
    async fn what_one_poll_wrote_arrives_without_a_later_write() {
        let (a, mut b, t, mut o) = pair().await;
        let (mut io, out) = Coalesced::new(a, t, None);
        // a driver that writes two frames, then waits forever
        let driver = async move {
            io.write_all(b"one ").await.unwrap();
            let n = io
                .write_vectored(&[io::IoSlice::new(b"two")])
                .await
                .unwrap();
            assert_eq!(n, 3);
            io.flush().await.unwrap();
            std::future::pending::<()>().await;
        };
        let task = tokio::spawn(flushing(driver, out, None));
        assert_eq!(recv(&mut b, &mut o, 7).await, b"one two");
        task.abort();
    }

    #[tokio::test]
    async fn a_peer_that_does_not_read_holds_the_writer_within_the_bound() {
        let (a, mut b, t, mut o) = pair().await;
        let (mut io, out) = Coalesced::new(a, t, None);
        let out2 = out.clone();
        let chunk = vec![7u8; 16 * 1024];
        let total = 64 * 1024 * 1024;
        let driver = async move {
            let mut sent = 0;
            while sent < total {
                sent += io.write(&chunk).await.unwrap();
            }
            io.shutdown().await.unwrap();
            sent
        };
        let task = tokio::spawn(flushing(driver, out, None));
        // nobody reads: the writer stalls with a bounded buffer
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!task.is_finished());
        assert!(out2.lock().buffered() < HIGH + 16 * 1024);
        // the reader catches up: everything arrives, then the end
        let got = recv(&mut b, &mut o, usize::MAX).await;
        assert_eq!(got.len(), total);
        assert!(got.iter().all(|&x| x == 7));
        assert_eq!(task.await.unwrap(), total);
    }

    #[tokio::test]
    async fn a_record_that_does_not_open_fails_the_read_and_is_counted_once() {
        let (a, mut b, _, _) = pair().await;
        let (sender, receiver) = crate::seal::pair();
        let stats = Arc::new(LinkStats::default());
        let (mut io, _out) = Coalesced::new(a, receiver, Some(stats.clone()));
        let mut wire = Vec::new();
        let mut sealer = Sealer::new(sender);
        sealer.seal(b"fine", &mut wire).unwrap();
        let good = wire.len();
        sealer.seal(b"forged", &mut wire).unwrap();
        *wire.last_mut().unwrap() ^= 1;
        b.write_all(&wire).await.unwrap();
        let mut got = [0u8; 4];
        io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"fine");
        let e = io.read(&mut [0u8; 16]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // and so is every read after it, even of good bytes
        b.write_all(&wire[..good]).await.unwrap();
        assert!(io.read(&mut [0u8; 16]).await.is_err());
        assert_eq!(stats.integrity_failures(), 1);
    }

    #[tokio::test]
    async fn the_driver_ends_after_its_last_bytes_are_written() {
        let (a, mut b, t, mut o) = pair().await;
        let (mut io, out) = Coalesced::new(a, t, None);
        let driver = async move {
            io.write_all(b"last words").await.unwrap();
            7
        };
        assert_eq!(flushing(driver, out, None).await, 7);
        assert_eq!(recv(&mut b, &mut o, 10).await, b"last words");
    }
}
