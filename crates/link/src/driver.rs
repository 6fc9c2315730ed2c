//! A link connection's task: reads the socket, opens its records and applies their frames to
//! the streams (`mux.rs`); seals what the streams wrote and writes it. One task per link
//! connection, at either end.
//!
//! What one poll of the task finds to write leaves in one write (the frames of many streams,
//! a migration's several frames at once): a stream's write only wakes the task, which takes
//! the whole buffer when it runs. At the dispatcher, resets that wait for company (the Done of
//! a migration) leave with the next write, or alone once due.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll, Waker};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc::error::TrySendError;
use tokio_util::sync::PollSender;

use crate::frame;
use crate::mux::{Conn, Event, Role};
use crate::rejoin::Registry;
use crate::seal::{Opener, Sealer, Transport};
use crate::stream::At;
use crate::{LinkStats, LinkStream};

/// Socket reads one poll of the task makes at most before it lets other tasks run.
const READS_PER_POLL: usize = 16;

/// What a link connection's task and its streams share.
pub(crate) struct Shared {
    conn: Mutex<Conn>,
    /// The id the agent gave this connection.
    pub(crate) link_id: [u8; 16],
    /// Dispatcher: new streams may be opened here (up, and no GOAWAY).
    pub(crate) alive: AtomicBool,
}

impl Shared {
    pub(crate) fn new(role: Role, link_id: [u8; 16]) -> Arc<Self> {
        Arc::new(Self {
            conn: Mutex::new(Conn::new(role)),
            link_id,
            alive: AtomicBool::new(true),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The agent's part: where its streams go.
pub(crate) struct Accepting {
    pub(crate) tx: PollSender<LinkStream>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) stats: Arc<LinkStats>,
    /// Resolves when the agent drains.
    pub(crate) drain: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Streams taken from the link that wait for room in the agent's queue (what one read
    /// brought at most); the link is not read meanwhile.
    held: std::collections::VecDeque<LinkStream>,
    drained: bool,
}

impl Accepting {
    pub(crate) fn new(
        tx: tokio::sync::mpsc::Sender<LinkStream>,
        registry: Arc<Registry>,
        stats: Arc<LinkStats>,
        drain: Pin<Box<dyn Future<Output = ()> + Send>>,
    ) -> Self {
        Self {
            tx: PollSender::new(tx),
            registry,
            stats,
            drain,
            held: Default::default(),
            drained: false,
        }
    }
}

pub(crate) struct Driver {
    shared: Arc<Shared>,
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
    opener: Opener,
    sealer: Sealer,
    /// Opened plaintext not yet a whole frame.
    inbuf: BytesMut,
    /// Frames taken from the streams, to seal.
    plain: BytesMut,
    /// Sealed records; `sealed[pos..]` not yet written.
    sealed: Vec<u8>,
    pos: usize,
    /// When the waiting resets are due.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    agent: Option<Accepting>,
    peer: Option<SocketAddr>,
    /// The peer closed its side.
    eof: bool,
}

impl Driver {
    /// Takes over `tcp`, sealed with `transport`, for `shared`'s streams; `agent` at the agent.
    pub(crate) fn new(
        tcp: TcpStream,
        transport: Transport,
        shared: Arc<Shared>,
        agent: Option<Accepting>,
    ) -> Self {
        let peer = tcp.peer_addr().ok();
        let (read, write) = tcp.into_split();
        Self {
            shared,
            read,
            write,
            opener: Opener::new(transport.clone()),
            sealer: Sealer::new(transport),
            inbuf: BytesMut::new(),
            plain: BytesMut::new(),
            sealed: Vec::new(),
            pos: 0,
            timer: None,
            agent,
            peer,
            eof: false,
        }
    }

    /// Runs the link until it ends: Ok when the peer closed it or nothing is left to serve,
    /// an error when it broke. Either way its streams fail from then on.
    pub(crate) async fn run(mut self) -> io::Result<()> {
        let result = std::future::poll_fn(|cx| self.poll_drive(cx)).await;
        let kind = match &result {
            Ok(()) => io::ErrorKind::ConnectionReset,
            Err(e) => e.kind(),
        };
        self.shared.alive.store(false, Ordering::Relaxed);
        let mut wakers = Vec::new();
        self.shared.lock().fail(kind, &mut wakers);
        wakers.into_iter().for_each(Waker::wake);
        result
    }

    fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut wakers = Vec::new();
        let result = self.poll_inner(cx, &mut wakers);
        wakers.into_iter().for_each(Waker::wake);
        result
    }

    fn poll_inner(
        &mut self,
        cx: &mut Context<'_>,
        wakers: &mut Vec<Waker>,
    ) -> Poll<io::Result<()>> {
        if let Some(a) = &mut self.agent {
            if !a.drained && a.drain.as_mut().poll(cx).is_ready() {
                a.drained = true;
                self.shared.lock().go_away();
            }
        }
        let mut reads = 0;
        while !self.eof && self.deliver_held(cx)? {
            match self.poll_read_records(cx) {
                Poll::Pending => break,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            self.apply(wakers)?;
            reads += 1;
            if reads == READS_PER_POLL {
                cx.waker().wake_by_ref();
                break;
            }
        }
        let writing = self.poll_write_out(cx, wakers)?;
        let finished = self.shared.lock().finished();
        let held = self.agent.as_ref().is_some_and(|a| !a.held.is_empty());
        if writing.is_ready() && !held && (finished || self.eof) {
            if finished {
                ready!(Pin::new(&mut self.write).poll_shutdown(cx))?;
            }
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }

    /// Agent: hands the held streams to the agent's queue; whether the link may be read.
    fn deliver_held(&mut self, cx: &mut Context<'_>) -> io::Result<bool> {
        let Some(a) = &mut self.agent else {
            return Ok(true);
        };
        while !a.held.is_empty() {
            match a.tx.poll_reserve(cx) {
                Poll::Pending => return Ok(false),
                Poll::Ready(Ok(())) => {
                    if let Some(s) = a.held.pop_front() {
                        let _ = a.tx.send_item(s);
                    }
                }
                // a gone agent drops (resets) its streams as they come
                Poll::Ready(Err(_)) => a.held.clear(),
            }
        }
        Ok(true)
    }

    /// Reads the socket once into the record reader: Ready when something came (or the end).
    fn poll_read_records(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut into = ReadBuf::new(self.opener.spare());
        ready!(Pin::new(&mut self.read).poll_read(cx, &mut into))?;
        let n = into.filled().len();
        if n == 0 {
            if self.opener.partial() || !self.inbuf.is_empty() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the link closed within a message",
                )));
            }
            self.eof = true;
            return Poll::Ready(Ok(()));
        }
        self.opener.filled(n);
        Poll::Ready(Ok(()))
    }

    /// Opens the records received and applies their frames.
    fn apply(&mut self, wakers: &mut Vec<Waker>) -> io::Result<()> {
        loop {
            match self.opener.available() {
                Ok([]) => break,
                Ok(plain) => {
                    let n = plain.len();
                    self.inbuf.extend_from_slice(plain);
                    self.opener.consume(n);
                }
                Err(e) => return Err(self.integrity(e)),
            }
        }
        let mut events = Vec::new();
        let broken = {
            let mut conn = self.shared.lock();
            loop {
                match frame::decode(&mut self.inbuf) {
                    Ok(Some(f)) => {
                        if let Err(v) = conn.receive(f, wakers, &mut events) {
                            break Some(v);
                        }
                    }
                    Ok(None) => break None,
                    Err(e) => {
                        drop(conn);
                        return Err(self.torn_down(e));
                    }
                }
            }
        };
        if let Some(v) = broken {
            return Err(self.torn_down(v));
        }
        for e in events {
            self.event(e, wakers);
        }
        Ok(())
    }

    fn event(&mut self, e: Event, wakers: &mut Vec<Waker>) {
        match e {
            Event::GoAway => self.shared.alive.store(false, Ordering::Relaxed),
            Event::Opened(id, meta) => {
                let Some(a) = &mut self.agent else { return };
                a.stats.streams.fetch_add(1, Ordering::Relaxed);
                let at = At {
                    link: self.shared.clone(),
                    id,
                };
                let stream = LinkStream::server(at, meta, self.shared.link_id, a.registry.clone());
                // room now, or held until there is (the link waits meanwhile)
                if !a.held.is_empty() {
                    a.held.push_back(stream);
                } else if let Some(tx) = a.tx.get_ref() {
                    if let Err(TrySendError::Full(s)) = tx.try_send(stream) {
                        a.held.push_back(s);
                    }
                }
            }
            Event::Reattach(id, token) => {
                if let Some(a) = &self.agent {
                    a.registry.deliver(token, &self.shared, id);
                }
            }
            Event::Handover(id, token) => {
                let Some(a) = &self.agent else { return };
                match a.registry.enter(token) {
                    Some(wait) => {
                        let unused = self.shared.lock().ack_handover(id, wait, wakers);
                        drop(unused);
                    }
                    None => {
                        // The token waits already, or too many do: not acknowledged, so the
                        // dispatcher sees a plain end and closes the client; so does the agent.
                        tracing::debug!("a handover could not wait for its successor");
                        a.stats.reattach_failed.fetch_add(1, Ordering::Relaxed);
                        self.shared.lock().refuse_handover(id, wakers);
                    }
                }
            }
        }
    }

    /// Writes what the streams wrote: Ready once all of it is written, Pending while the
    /// socket takes no more (or resets wait for their due time).
    fn poll_write_out(
        &mut self,
        cx: &mut Context<'_>,
        wakers: &mut Vec<Waker>,
    ) -> io::Result<Poll<()>> {
        loop {
            if self.pos == self.sealed.len() {
                self.sealed.clear();
                self.pos = 0;
                let now = tokio::time::Instant::now();
                let due = self
                    .shared
                    .lock()
                    .take_out(cx, &mut self.plain, now, wakers);
                self.arm(cx, due);
                if self.plain.is_empty() {
                    return Ok(Poll::Ready(()));
                }
                self.sealer
                    .seal(&self.plain, &mut self.sealed)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                self.plain.clear();
            }
            match Pin::new(&mut self.write).poll_write(cx, &self.sealed[self.pos..]) {
                Poll::Pending => return Ok(Poll::Pending),
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => self.pos += n,
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Poll::Ready(Err(e)) => return Err(e),
            }
        }
    }

    /// A timer for resets that wait (polled, so that it wakes the task when due).
    fn arm(&mut self, cx: &mut Context<'_>, due: Option<tokio::time::Instant>) {
        let Some(due) = due else {
            return;
        };
        let t = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if t.deadline() != due {
            t.as_mut().reset(due);
        }
        if t.as_mut().poll(cx).is_ready() {
            cx.waker().wake_by_ref();
        }
    }

    /// A record did not open: counted (at the agent), told once, and the link is torn down.
    fn integrity(&mut self, e: crate::seal::Integrity) -> io::Error {
        if let Some(a) = &self.agent {
            a.stats.integrity_failures.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(peer) = self.peer.take() {
            tracing::warn!(%peer, error = %e, "agent link integrity failure");
        }
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    /// Frames that break the protocol: told once, and the link is torn down.
    fn torn_down<E: std::error::Error + Send + Sync + 'static>(&mut self, e: E) -> io::Error {
        if let Some(peer) = self.peer.take() {
            tracing::warn!(%peer, error = %e, "agent link torn down");
        }
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}
