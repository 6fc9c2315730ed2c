//! One link connection's streams, sans-IO: the frames that arrive applied to the streams'
//! state, and what the streams do turned into frames for the socket.
//!
//! Shared under one lock by the connection's driver (`driver.rs`, which reads and writes the
//! socket) and every [`LinkStream`](crate::LinkStream) on it. Nothing here waits: an operation
//! that cannot go on registers the caller's waker and says so.
//!
//! Flow control, as HTTP/2's: each stream may have [`STREAM_WINDOW`] bytes in flight each way
//! and the link [`CONNECTION_WINDOW`]; a receiver gives the window back (WINDOW frames) as its
//! reader takes the bytes, so an unread stream holds at most its window here and never stalls
//! the others. What a stream writes goes into the link's one buffer of frames, which writers of
//! data wait on past [`HIGH`] bytes: the socket's backpressure reaches them.
//!
//! How streams end: END is one side's end (reads then meet a clean end after the data), RESET
//! both sides' at once (reads meet an error after the data that came first, unless an END came
//! first). A stream dropped before both sides ended is reset; its state goes when its owner
//! drops it, and frames that still come for it are ignored (their bytes' link window given
//! back).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use tokio::io::ReadBuf;
use tokio::time::Instant;

use crate::frame::{self, End, Frame, Reason, MAX_DATA};
use crate::meta::StreamMeta;
use crate::rejoin::Wait;
use crate::{CONNECTION_WINDOW, MAX_STREAMS, RELEASE_DELAY, STREAM_WINDOW};

/// Frames buffered for the socket past which writers of data wait.
pub(crate) const HIGH: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Opens streams.
    Dispatcher,
    /// Takes them.
    Agent,
}

/// A peer that broke the protocol: the link is torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Violation(pub(crate) &'static str);

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "link protocol violation: {}", self.0)
    }
}

impl std::error::Error for Violation {}

/// A stream's reset, as its reads and writes report it: [`crate::is_release`] and
/// [`crate::is_refused`] look for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reset {
    pub(crate) reason: Reason,
    /// The peer reset it (not this side, not the link's end).
    pub(crate) remote: bool,
}

impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let by = if self.remote { "the peer" } else { "this side" };
        write!(f, "link stream reset by {by}: {:?}", self.reason)
    }
}

impl std::error::Error for Reset {}

impl Reset {
    fn error(self) -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionReset, self)
    }
}

/// What the driver does for a frame outside the lock.
#[derive(Debug)]
pub(crate) enum Event {
    /// Agent: a client's stream, for the agent to take.
    Opened(u32, StreamMeta),
    /// Agent: a successor dispatcher's stream, for the stream waiting for this token.
    Reattach(u32, [u8; 16]),
    /// Agent: the dispatcher hands this stream over with this token.
    Handover(u32, [u8; 16]),
    /// Dispatcher: the agent takes no new streams here.
    GoAway,
}

#[derive(Default)]
enum Handover {
    #[default]
    None,
    /// The dispatcher's END asked for it; the driver registers it and acknowledges.
    Pending,
    /// Acknowledged: the stream's owner takes the wait and goes on at the successor's stream.
    Acked(Box<Wait>),
}

/// A stream's state (what [`Conn::drop_stream`] and [`Conn::reset`] return is dropped by the
/// caller after the lock: a handover's wait in it may hold a stream of another link).
pub(crate) struct Stream {
    recv: VecDeque<Bytes>,
    /// What the peer may still send before the window is given back.
    recv_window: u32,
    /// Bytes taken by the reader and not yet given back.
    unreleased: u32,
    end: Option<End>,
    reset: Option<Reset>,
    /// Dispatcher: the agent has taken the stream (ANSWER, or anything else from it).
    answered: bool,
    send_window: u64,
    sent_end: bool,
    handover: Handover,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

impl Stream {
    fn new() -> Self {
        Self {
            recv: VecDeque::new(),
            recv_window: STREAM_WINDOW,
            unreleased: 0,
            end: None,
            reset: None,
            answered: false,
            send_window: u64::from(STREAM_WINDOW),
            sent_end: false,
            handover: Handover::None,
            reader: None,
            writer: None,
        }
    }

    fn wake(&mut self, wakers: &mut Vec<Waker>) {
        wakers.extend(self.reader.take());
        wakers.extend(self.writer.take());
    }

    /// The peer has ended or reset its side.
    fn peer_done(&self) -> bool {
        self.end.is_some() || self.reset.is_some()
    }
}

/// Moves bytes from the front of `queue` into `buf`, as many as it takes; how many.
pub(crate) fn drain_into(queue: &mut VecDeque<Bytes>, buf: &mut ReadBuf<'_>) -> usize {
    let mut n = 0;
    while buf.remaining() > 0 {
        let Some(front) = queue.front_mut() else {
            break;
        };
        let k = front.len().min(buf.remaining());
        buf.put_slice(&front[..k]);
        n += k;
        bytes::Buf::advance(front, k);
        if front.is_empty() {
            queue.pop_front();
        }
    }
    n
}

fn remember(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

pub(crate) struct Conn {
    role: Role,
    streams: HashMap<u32, Stream>,
    /// Frames for the driver to seal and write.
    out: BytesMut,
    /// Resets that wait for company ([`Conn::reset`] with `later`), and when the first is due.
    lazy: BytesMut,
    lazy_due: Option<Instant>,
    send_window: u64,
    recv_window: u64,
    unreleased: u64,
    /// Dispatcher: the id of the next stream. Agent: the last stream opened.
    next_id: u32,
    /// The agent's GOAWAY (sent or received): the last stream it took.
    goaway: Option<u32>,
    /// The link has ended, and how: every operation fails.
    gone: Option<io::ErrorKind>,
    driver: Option<Waker>,
    /// The driver has been woken since it last took the buffer.
    notified: bool,
    /// Writers waiting for the buffer to drain or for the link's window.
    blocked: Vec<Waker>,
    /// Dispatcher: live handles that may open streams.
    pub(crate) handles: usize,
}

impl Conn {
    pub(crate) fn new(role: Role) -> Self {
        Self {
            role,
            streams: HashMap::new(),
            out: BytesMut::new(),
            lazy: BytesMut::new(),
            lazy_due: None,
            send_window: u64::from(CONNECTION_WINDOW),
            recv_window: u64::from(CONNECTION_WINDOW),
            unreleased: 0,
            next_id: match role {
                Role::Dispatcher => 1,
                Role::Agent => 0,
            },
            goaway: None,
            gone: None,
            driver: None,
            notified: false,
            blocked: Vec::new(),
            handles: 0,
        }
    }

    fn wake_driver(&mut self) {
        if !self.notified {
            self.notified = true;
            if let Some(w) = &self.driver {
                w.wake_by_ref();
            }
        }
    }

    fn send(&mut self, f: &Frame) {
        frame::put(&mut self.out, f);
        self.wake_driver();
    }

    fn gone_error(&self) -> Option<io::Error> {
        self.gone
            .map(|kind| io::Error::new(kind, "the agent link is gone"))
    }

    /// Whether `id` names a stream that was opened (perhaps gone since).
    fn known(&self, id: u32) -> bool {
        id != 0
            && match self.role {
                Role::Dispatcher => id < self.next_id,
                Role::Agent => id <= self.next_id,
            }
    }

    // ----- the driver's side -----

    /// Applies one frame that arrived; the wakers to wake and what the driver does next are
    /// added to `wakers` and `events`. An error tears the link down.
    pub(crate) fn receive(
        &mut self,
        f: Frame,
        wakers: &mut Vec<Waker>,
        events: &mut Vec<Event>,
    ) -> Result<(), Violation> {
        let agent = self.role == Role::Agent;
        let id = match &f {
            Frame::Open(id, _)
            | Frame::Answer(id)
            | Frame::Data(id, _)
            | Frame::End(id, _)
            | Frame::Reset(id, _)
            | Frame::Window(id, _)
            | Frame::GoAway(id) => *id,
        };
        let only_from_agent = matches!(f, Frame::Answer(_) | Frame::GoAway(_));
        let only_from_dispatcher = matches!(f, Frame::Open(..));
        if (agent && only_from_agent) || (!agent && only_from_dispatcher) {
            return Err(Violation("a frame only this side sends"));
        }
        match f {
            Frame::Open(_, meta) => return self.opened(id, &meta, events),
            Frame::GoAway(last) => {
                if self.goaway.is_none() {
                    self.goaway = Some(last);
                    events.push(Event::GoAway);
                }
                for (&s, st) in &mut self.streams {
                    if s > last && !st.peer_done() {
                        st.reset = Some(Reset {
                            reason: Reason::Refused,
                            remote: true,
                        });
                        st.wake(wakers);
                    }
                }
                return Ok(());
            }
            Frame::Window(0, n) => {
                self.send_window += u64::from(n);
                if self.send_window > 1 << 40 {
                    return Err(Violation("the link's window overflows"));
                }
                wakers.append(&mut self.blocked);
                return Ok(());
            }
            Frame::Data(_, ref b) => {
                let len = b.len() as u64;
                if len > self.recv_window {
                    return Err(Violation("more data than the link's window"));
                }
                self.recv_window -= len;
            }
            _ => {}
        }
        let Some(st) = self.streams.get_mut(&id) else {
            if !self.known(id) {
                return Err(Violation("a frame for a stream never opened"));
            }
            if let Frame::Data(_, b) = f {
                self.release_link(b.len());
            }
            return Ok(());
        };
        match f {
            Frame::Answer(_) => st.answered = true,
            Frame::Data(_, b) => {
                let len = b.len();
                if st.peer_done() || !matches!(st.handover, Handover::None) {
                    // after its end: ignored
                    self.release_link(len);
                    return Ok(());
                }
                let len32 = len as u32;
                if len32 > st.recv_window {
                    return Err(Violation("more data than the stream's window"));
                }
                st.recv_window -= len32;
                st.recv.push_back(b);
                st.answered = true;
                wakers.extend(st.reader.take());
                return Ok(());
            }
            Frame::End(_, end) => {
                if st.peer_done() || !matches!(st.handover, Handover::None) {
                    return Ok(());
                }
                st.answered = true;
                match (self.role, end) {
                    (Role::Agent, End::Handover(token)) if !st.sent_end => {
                        st.handover = Handover::Pending;
                        events.push(Event::Handover(id, token));
                        return Ok(());
                    }
                    (Role::Dispatcher, End::Ack) => st.end = Some(End::Ack),
                    _ => st.end = Some(End::Plain),
                }
            }
            Frame::Reset(_, reason) => {
                if st.reset.is_none() {
                    st.reset = Some(Reset {
                        reason,
                        remote: true,
                    });
                }
            }
            Frame::Window(_, n) => {
                st.send_window += u64::from(n);
                if st.send_window > 1 << 40 {
                    return Err(Violation("a stream's window overflows"));
                }
                wakers.extend(st.writer.take());
                return Ok(());
            }
            Frame::Open(..) | Frame::GoAway(_) => unreachable!("handled above"),
        }
        st.wake(wakers);
        Ok(())
    }

    /// Agent: a new stream.
    fn opened(&mut self, id: u32, meta: &[u8], events: &mut Vec<Event>) -> Result<(), Violation> {
        if id <= self.next_id {
            return Err(Violation("a stream opened twice, or out of order"));
        }
        self.next_id = id;
        if self.goaway.is_some() || self.streams.len() >= MAX_STREAMS as usize {
            self.send(&Frame::Reset(id, Reason::Refused));
            return Ok(());
        }
        let Some(meta) = StreamMeta::decode(meta) else {
            self.send(&Frame::Reset(id, Reason::Protocol));
            return Ok(());
        };
        self.streams.insert(id, Stream::new());
        events.push(match meta.reattach {
            Some(token) => Event::Reattach(id, token),
            None => Event::Opened(id, meta),
        });
        Ok(())
    }

    /// The link ended (`kind`: how its streams' operations fail from now on).
    pub(crate) fn fail(&mut self, kind: io::ErrorKind, wakers: &mut Vec<Waker>) {
        if self.gone.is_none() {
            self.gone = Some(kind);
        }
        for st in self.streams.values_mut() {
            st.wake(wakers);
        }
        wakers.append(&mut self.blocked);
    }

    /// The driver's turn: remembers its waker, and takes the frames to write (the waiting
    /// resets too when frames go anyway or they are due). Returns when waiting resets are due
    /// next; writers that waited for room are added to `wakers`.
    pub(crate) fn take_out(
        &mut self,
        cx: &Context<'_>,
        into: &mut BytesMut,
        now: Instant,
        wakers: &mut Vec<Waker>,
    ) -> Option<Instant> {
        remember(&mut self.driver, cx);
        self.notified = false;
        if !self.lazy.is_empty()
            && (!self.out.is_empty() || self.lazy_due.is_some_and(|d| d <= now))
        {
            let lazy = self.lazy.split();
            self.out.unsplit(lazy);
            self.lazy_due = None;
        }
        if !self.out.is_empty() {
            into.unsplit(self.out.split());
            wakers.append(&mut self.blocked);
        }
        self.lazy_due
    }

    /// Agent: no new streams from now on (GOAWAY naming the last one taken).
    pub(crate) fn go_away(&mut self) {
        if self.goaway.is_none() {
            self.goaway = Some(self.next_id);
            self.send(&Frame::GoAway(self.next_id));
        }
    }

    /// Whether nothing is left to serve: no stream, and (at the dispatcher) no handle that
    /// could open one, or (at the agent) no new stream coming after its GOAWAY.
    pub(crate) fn finished(&self) -> bool {
        self.streams.is_empty()
            && match self.role {
                Role::Dispatcher => self.handles == 0 || self.next_id == u32::MAX,
                Role::Agent => self.goaway.is_some(),
            }
    }

    /// The bytes the streams hold unread: in all, and in the fullest stream.
    pub(crate) fn buffered(&self) -> (usize, usize) {
        let each = self
            .streams
            .values()
            .map(|st| st.recv.iter().map(Bytes::len).sum::<usize>());
        each.fold((0, 0), |(total, most), n| (total + n, most.max(n)))
    }

    /// Dispatcher: a handle is gone; the driver looks whether it was the last.
    pub(crate) fn handle_dropped(&mut self) {
        self.handles = self.handles.saturating_sub(1);
        if self.handles == 0 {
            self.wake_driver();
        }
    }

    /// Dispatcher: whether new streams may be opened here.
    pub(crate) fn open_for_streams(&self) -> bool {
        self.gone.is_none() && self.goaway.is_none() && self.next_id < u32::MAX
    }

    /// Agent, a handover registered: acknowledges it (after everything the stream sent) and
    /// leaves the wait for its owner. Returns the wait if the stream ended meanwhile (to drop
    /// after the lock).
    pub(crate) fn ack_handover(
        &mut self,
        id: u32,
        wait: Box<Wait>,
        wakers: &mut Vec<Waker>,
    ) -> Option<Box<Wait>> {
        let Some(st) = self.streams.get_mut(&id) else {
            return Some(wait);
        };
        if st.sent_end || st.reset.is_some() {
            st.handover = Handover::None;
            st.end = Some(End::Plain);
            st.wake(wakers);
            return Some(wait);
        }
        st.sent_end = true;
        st.handover = Handover::Acked(wait);
        st.wake(wakers);
        self.send(&Frame::End(id, End::Ack));
        None
    }

    /// Agent, a handover that cannot wait: a plain end instead.
    pub(crate) fn refuse_handover(&mut self, id: u32, wakers: &mut Vec<Waker>) {
        if let Some(st) = self.streams.get_mut(&id) {
            st.handover = Handover::None;
            st.end = Some(End::Plain);
            st.wake(wakers);
        }
    }

    /// Agent: answers a successor's stream at once (its `answered()` returns whatever the
    /// agent's task is doing).
    pub(crate) fn answer(&mut self, id: u32) {
        if self.streams.contains_key(&id) {
            self.send(&Frame::Answer(id));
        }
    }

    // ----- the streams' side -----

    /// Dispatcher: a new stream.
    pub(crate) fn open(&mut self, meta: &StreamMeta) -> io::Result<u32> {
        if let Some(e) = self.gone_error() {
            return Err(e);
        }
        if !self.open_for_streams() || self.streams.len() >= MAX_STREAMS as usize {
            return Err(Reset {
                reason: Reason::Refused,
                remote: false,
            }
            .error());
        }
        let id = self.next_id;
        self.next_id += 1;
        self.streams.insert(id, Stream::new());
        let mut payload = Vec::with_capacity(frame::MAX_OPEN);
        meta.encode(&mut payload);
        self.send(&Frame::Open(id, payload.into()));
        Ok(id)
    }

    fn stream(&mut self, id: u32) -> io::Result<&mut Stream> {
        self.streams
            .get_mut(&id)
            .ok_or_else(|| io::ErrorKind::BrokenPipe.into())
    }

    /// Dispatcher: Ready once the agent took the stream; an error if it refused or reset it.
    pub(crate) fn poll_answered(&mut self, id: u32, cx: &Context<'_>) -> Poll<io::Result<()>> {
        let gone = self.gone_error();
        let st = self.stream(id)?;
        if st.answered || !st.recv.is_empty() {
            return Poll::Ready(Ok(()));
        }
        if let Some(r) = st.reset {
            return Poll::Ready(Err(r.error()));
        }
        if let Some(e) = gone {
            return Poll::Ready(Err(e));
        }
        remember(&mut st.reader, cx);
        Poll::Pending
    }

    /// Agent: takes an acknowledged handover's wait, with the bytes that came before it, and
    /// lets the old stream go (it ended both ways).
    pub(crate) fn take_handover(&mut self, id: u32) -> Option<(Box<Wait>, VecDeque<Bytes>)> {
        let st = self.streams.get_mut(&id)?;
        if !matches!(st.handover, Handover::Acked(_)) {
            return None;
        }
        let st = self.remove(id)?;
        let Handover::Acked(wait) = st.handover else {
            unreachable!("checked above")
        };
        Some((wait, st.recv))
    }

    /// Whether a read would find something (bytes, the end, an error); registers `cx` as the
    /// reader's if not. With `take`, moves what is here into it (as much as it holds).
    pub(crate) fn poll_read(
        &mut self,
        id: u32,
        cx: Option<&Context<'_>>,
        take: Option<&mut ReadBuf<'_>>,
    ) -> Poll<io::Result<()>> {
        let gone = self.gone_error();
        let st = self.stream(id)?;
        if !st.recv.is_empty() {
            let Some(buf) = take else {
                return Poll::Ready(Ok(()));
            };
            let n = drain_into(&mut st.recv, buf);
            self.released(id, n);
            return Poll::Ready(Ok(()));
        }
        if st.end.is_some() {
            return Poll::Ready(Ok(()));
        }
        if let Some(r) = st.reset {
            return Poll::Ready(Err(r.error()));
        }
        if let Some(e) = gone {
            return Poll::Ready(Err(e));
        }
        if let Some(cx) = cx {
            remember(&mut st.reader, cx);
        }
        Poll::Pending
    }

    /// The peer's end: `Some(true)` for an agent's acknowledgement of a handover.
    pub(crate) fn ended(&self, id: u32) -> Option<bool> {
        let st = self.streams.get(&id)?;
        if !st.recv.is_empty() {
            return None;
        }
        st.end.map(|e| e == End::Ack)
    }

    /// `n` bytes of stream `id` were read: their window goes back (in WINDOW frames once half
    /// a window has gathered).
    fn released(&mut self, id: u32, n: usize) {
        if let Some(st) = self.streams.get_mut(&id) {
            st.unreleased += n as u32;
            if st.unreleased >= STREAM_WINDOW / 2 && !st.peer_done() {
                let give = std::mem::take(&mut st.unreleased);
                st.recv_window += give;
                self.send(&Frame::Window(id, give));
            }
        }
        self.release_link(n);
    }

    fn release_link(&mut self, n: usize) {
        self.unreleased += n as u64;
        if self.unreleased >= u64::from(CONNECTION_WINDOW / 2) {
            let give = std::mem::take(&mut self.unreleased);
            self.recv_window += give;
            self.send(&Frame::Window(0, give as u32));
        }
    }

    /// Writes what the windows and the buffer take of `bufs` (at most one DATA frame).
    pub(crate) fn poll_write(
        &mut self,
        id: u32,
        cx: &Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if let Some(e) = self.gone_error() {
            return Poll::Ready(Err(e));
        }
        let room = HIGH.saturating_sub(self.out.len());
        let link = self.send_window;
        let st = self.stream(id)?;
        if let Some(r) = st.reset {
            return Poll::Ready(Err(r.error()));
        }
        if st.sent_end {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        if st.send_window == 0 {
            remember(&mut st.writer, cx);
            return Poll::Pending;
        }
        let n = (total.min(MAX_DATA) as u64)
            .min(st.send_window)
            .min(link)
            .min(room as u64) as usize;
        if n == 0 {
            if !self.blocked.iter().any(|w| w.will_wake(cx.waker())) {
                self.blocked.push(cx.waker().clone());
            }
            return Poll::Pending;
        }
        let mut parts: [&[u8]; 8] = [&[]; 8];
        let mut left = n;
        let mut count = 0;
        for b in bufs {
            if left == 0 {
                break;
            }
            let k = b.len().min(left);
            if k == 0 {
                continue;
            }
            if count == parts.len() {
                break;
            }
            parts[count] = &b[..k];
            count += 1;
            left -= k;
        }
        let n = n - left;
        st.send_window -= n as u64;
        self.send_window -= n as u64;
        frame::put_data(&mut self.out, id, &parts[..count]);
        self.wake_driver();
        Poll::Ready(Ok(n))
    }

    /// Whether this side has ended the stream.
    pub(crate) fn sent_end(&self, id: u32) -> bool {
        self.streams.get(&id).is_none_or(|st| st.sent_end)
    }

    /// Ends this side of the stream (a no-op once ended).
    pub(crate) fn end(&mut self, id: u32, end: End) -> io::Result<()> {
        if let Some(e) = self.gone_error() {
            return Err(e);
        }
        let st = self.stream(id)?;
        if st.sent_end {
            return Ok(());
        }
        if let Some(r) = st.reset {
            return Err(r.error());
        }
        st.sent_end = true;
        self.send(&Frame::End(id, end));
        Ok(())
    }

    /// Resets the stream and lets it go. With `later`, the RESET waits (at most
    /// [`RELEASE_DELAY`]) for the next frames to go anyway.
    pub(crate) fn reset(&mut self, id: u32, reason: Reason, later: bool) -> Option<Stream> {
        let st = self.remove(id)?;
        if st.reset.is_some() || self.gone.is_some() {
            return Some(st);
        }
        if later {
            frame::put(&mut self.lazy, &Frame::Reset(id, reason));
            if self.lazy_due.is_none() {
                self.lazy_due = Some(Instant::now() + RELEASE_DELAY);
                self.wake_driver();
            }
        } else {
            self.send(&Frame::Reset(id, reason));
        }
        Some(st)
    }

    /// The stream's owner is gone: a stream the peer ended is ended here too (if it was not);
    /// one the peer has not is reset, so that its reads fail rather than pass a cut-off stream
    /// for a complete one (unless this side's end came first: then its writes fail).
    pub(crate) fn drop_stream(&mut self, id: u32) -> Option<Stream> {
        let st = self.streams.get(&id)?;
        if self.gone.is_none() && st.reset.is_none() {
            if st.peer_done() {
                let _ = self.end(id, End::Plain);
            } else {
                self.send(&Frame::Reset(id, Reason::Cancel));
            }
        }
        self.remove(id)
    }

    /// Lets a stream go, sending nothing: its unread bytes' link window goes back. The last
    /// one wakes the driver, which may be done ([`Conn::finished`]).
    fn remove(&mut self, id: u32) -> Option<Stream> {
        let st = self.streams.remove(&id)?;
        let unread: usize = st.recv.iter().map(Bytes::len).sum();
        self.release_link(unread);
        if self.streams.is_empty() {
            self.wake_driver();
        }
        Some(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> StreamMeta {
        StreamMeta::followed(
            "192.0.2.1:1000".parse().unwrap(),
            "192.0.2.2:443".parse().unwrap(),
        )
    }

    /// A waker that counts its wakes.
    fn counting_waker() -> (Waker, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        struct Count(std::sync::Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        (Waker::from(std::sync::Arc::new(Count(n.clone()))), n)
    }

    fn cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    /// Moves what `from` wrote into `to`; the events `to` produced.
    fn pump(from: &mut Conn, to: &mut Conn) -> Result<Vec<Event>, Violation> {
        let mut wire = BytesMut::new();
        let (mut wakers, mut events) = (Vec::new(), Vec::new());
        from.take_out(
            &cx(),
            &mut wire,
            Instant::now() + RELEASE_DELAY * 2,
            &mut wakers,
        );
        while let Some(f) = frame::decode(&mut wire).unwrap() {
            to.receive(f, &mut wakers, &mut events)?;
        }
        Ok(events)
    }

    /// A dispatcher and an agent with one stream open between them.
    fn pair() -> (Conn, Conn, u32) {
        let (mut d, mut a) = (Conn::new(Role::Dispatcher), Conn::new(Role::Agent));
        let id = d.open(&meta()).unwrap();
        let events = pump(&mut d, &mut a).unwrap();
        assert!(matches!(events[..], [Event::Opened(i, m)] if i == id && m == meta()));
        (d, a, id)
    }

    fn write(c: &mut Conn, id: u32, n: usize) -> Poll<io::Result<usize>> {
        let data = vec![1u8; n];
        c.poll_write(id, &cx(), &[io::IoSlice::new(&data)])
    }

    fn read(c: &mut Conn, id: u32, n: usize) -> usize {
        let mut space = vec![0u8; n];
        let mut buf = ReadBuf::new(&mut space);
        let _ = c.poll_read(id, None, Some(&mut buf));
        buf.filled().len()
    }

    #[test]
    fn a_writer_stops_at_the_stream_window_and_goes_on_as_the_reader_reads() {
        let (mut d, mut a, id) = pair();
        let mut sent = 0;
        while let Poll::Ready(Ok(n)) = write(&mut a, id, MAX_DATA) {
            sent += n;
            pump(&mut a, &mut d).unwrap();
        }
        assert_eq!(sent, STREAM_WINDOW as usize);
        assert_eq!(d.buffered(), (sent, sent));
        // reading half a window gives it back
        assert_eq!(read(&mut d, id, STREAM_WINDOW as usize / 2), sent / 2);
        pump(&mut d, &mut a).unwrap();
        assert!(matches!(write(&mut a, id, 10), Poll::Ready(Ok(10))));
    }

    #[test]
    fn data_beyond_a_window_tears_the_link_down() {
        let (_, mut a, id) = pair();
        let (mut wakers, mut events) = (Vec::new(), Vec::new());
        let chunk = Bytes::from(vec![0u8; MAX_DATA]);
        let mut result = Ok(());
        for _ in 0..=(STREAM_WINDOW as usize / MAX_DATA) {
            result = a.receive(Frame::Data(id, chunk.clone()), &mut wakers, &mut events);
        }
        assert_eq!(result, Err(Violation("more data than the stream's window")));
        // and a frame for a stream never opened
        let e = a.receive(Frame::Data(99, chunk), &mut wakers, &mut events);
        assert!(e.is_err());
    }

    #[test]
    fn frames_for_a_dropped_stream_are_ignored_and_their_window_comes_back() {
        let (mut d, mut a, id) = pair();
        d.drop_stream(id);
        // the agent writes on before it hears of the reset
        let mut sent = 0;
        for _ in 0..(CONNECTION_WINDOW as usize / MAX_DATA) {
            let (mut wakers, mut events) = (Vec::new(), Vec::new());
            d.receive(
                Frame::Data(id, Bytes::from(vec![0u8; MAX_DATA])),
                &mut wakers,
                &mut events,
            )
            .unwrap();
            sent += MAX_DATA;
        }
        assert_eq!(sent, CONNECTION_WINDOW as usize);
        assert_eq!(d.buffered(), (0, 0));
        // the link's window went back in WINDOW frames: the agent may send as much again
        pump(&mut d, &mut a).unwrap();
        assert_eq!(a.send_window, 2 * u64::from(CONNECTION_WINDOW));
    }

    #[test]
    fn a_goaway_refuses_streams_it_did_not_cover_and_new_ones() {
        let (mut d, mut a, first) = pair();
        let second = d.open(&meta()).unwrap();
        a.go_away();
        let events = pump(&mut a, &mut d).unwrap();
        assert!(matches!(events[..], [Event::GoAway]));
        assert!(!d.open_for_streams());
        assert!(d.open(&meta()).is_err());
        // the second stream's OPEN crossed the GOAWAY: refused at the agent too
        assert!(pump(&mut d, &mut a).unwrap().is_empty());
        let mut space = [0u8; 4];
        let e = d.poll_read(second, None, Some(&mut ReadBuf::new(&mut space)));
        assert!(matches!(e, Poll::Ready(Err(ref e)) if crate::is_refused(e)));
        assert!(d.poll_read(first, None, None).is_pending());
        // the agent ends its last stream and is finished; the dispatcher once its handle goes
        let (waker, woken) = counting_waker();
        let mut sink = BytesMut::new();
        a.take_out(
            &Context::from_waker(&waker),
            &mut sink,
            Instant::now(),
            &mut Vec::new(),
        );
        a.drop_stream(first);
        assert!(a.finished());
        assert_eq!(
            woken.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "the driver must look"
        );
    }

    #[test]
    fn an_end_reads_clean_after_the_data_and_a_reset_as_an_error() {
        let (mut d, mut a, id) = pair();
        assert!(matches!(write(&mut a, id, 5), Poll::Ready(Ok(5))));
        a.end(id, End::Plain).unwrap();
        a.drop_stream(id);
        pump(&mut a, &mut d).unwrap();
        assert_eq!(read(&mut d, id, 100), 5);
        assert!(matches!(d.poll_read(id, None, None), Poll::Ready(Ok(()))));
        assert_eq!(d.ended(id), Some(false));

        let id = d.open(&meta()).unwrap();
        pump(&mut d, &mut a).unwrap();
        assert!(matches!(write(&mut a, id, 3), Poll::Ready(Ok(3))));
        a.reset(id, Reason::Release, false);
        pump(&mut a, &mut d).unwrap();
        assert_eq!(read(&mut d, id, 100), 3);
        let e = d.poll_read(id, None, None);
        assert!(matches!(e, Poll::Ready(Err(ref e)) if crate::is_release(e)));
    }
}
