//! Splicing a client to its agent once routing (and any handoff) is over: bytes both ways until
//! both ends are done, or until the connection has been silent too long.
//!
//! tokio's `copy_bidirectional`, with two additions:
//! - Bounds. A splice neither side speaks on for `idle` is closed, and once either side has
//!   ended its half, the other may stay silent only `half_closed`: otherwise a client that sends
//!   a ClientHello and goes quiet holds its dispatcher slot (and socket) long after the agent
//!   gave up on it, and enough of them lock everyone out. Reads count as activity in both
//!   directions (a download the client is slow to take still reads from the agent).
//! - One saving: once the client has ended its side and the agent ends too, the client socket
//!   is simply closed (a FIN all the same: everything it sent was read) instead of a
//!   `shutdown` first, which by then usually fails anyway (ENOTCONN) and costs a system call
//!   per connection.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use baton_migrate::{MigrationError, Passed, Relay};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

/// How long a splice may be silent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Neither side sent anything.
    pub idle: Duration,
    /// One side has ended its half; the other sent nothing.
    pub half_closed: Duration,
}

/// Copies both ways; returns the bytes client -> agent and agent -> client. `TimedOut` when a
/// limit ends it.
pub(crate) async fn splice<C, S>(
    client: &mut C,
    agent: &mut S,
    limits: Limits,
) -> io::Result<(u64, u64)>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let clock = Clock::new();
    let mut client = Side::new(client, &clock, true);
    let mut agent = Side::new(agent, &clock, false);
    let mut copy = pin!(tokio::io::copy_bidirectional(&mut client, &mut agent));
    let mut timer = pin!(tokio::time::sleep_until(clock.deadline(limits)));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = copy.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        ready!(clock.poll_silence(timer.as_mut(), limits, cx));
        Poll::Ready(Err(silent()))
    })
    .await
}

/// Sleeps until `deadline`, or forever without one (a `select!` branch that never fires; its
/// future is built on every pass of the loop, and makes no timer until it is polled).
pub(crate) async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

fn silent() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "splice silent too long")
}

/// A stop signal between the parts of one watched splice, which one task polls together: a
/// flag, not a `CancellationToken` (an allocation per splice, and a mutex taken and a waiter
/// registered at every look, every read and write). Whoever raises one also sets `raised`, and
/// the splice's poll then polls its parts again at once, so a part waiting on a flag is never
/// left asleep (waiting on a flag registers no waker).
struct Flags {
    /// The agent asked to leave: the client's direction stops between two chunks.
    left: AtomicBool,
    /// `stop` resolved: both directions stop between two chunks.
    halt: AtomicBool,
    raised: AtomicBool,
}

impl Flags {
    fn raise(&self, flag: &AtomicBool) {
        flag.store(true, Ordering::Relaxed);
        self.raised.store(true, Ordering::Relaxed);
    }

    /// Resolves once `flag` is up (polled again by the splice when it is raised).
    fn up(flag: &AtomicBool) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |_| match flag.load(Ordering::Relaxed) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
    }
}

/// How long bytes owed to the client wait for the agent's first ones ([`splice_watched`]'s
/// `lead`): the home agent answers a request that came with the session in well under a
/// millisecond here; a client that sent none gets them this much later.
pub(crate) const LEAD_WAIT: Duration = Duration::from_millis(4);

/// Each direction's buffer in a watched splice: what `copy_bidirectional` uses, so a client
/// idle on its keep-alive connection holds no more here than in a blind splice.
const BUF: usize = 8 * 1024;

/// How a watched splice ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Watched {
    /// Both sides are done.
    Ended,
    /// The agent asked to leave (it drains): the relay has [`Action::ChooseHome`] queued and
    /// every byte before the request has been forwarded. The client may still be open.
    ///
    /// [`Action::ChooseHome`]: baton_migrate::Action::ChooseHome
    Left { client_ended: bool },
    /// `stop` resolved (a dispatcher handover): both directions stopped, each between two
    /// chunks or inside a write its reader was not taking; what was read and followed but not
    /// written is `owed`. `client_ended`: the client had ended its half.
    Stopped { client_ended: bool, owed: Owed },
}

/// Bytes a stopped splice read and followed but did not deliver, each way.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Owed {
    pub to_client: Vec<u8>,
    pub to_agent: Vec<u8>,
}

/// Writes `data` unless `halt` fires first; returns how much went (all of it unless halted).
/// Each `write` either takes bytes or takes none, so stopping between them loses no count.
async fn write_unless<W: AsyncWrite + Unpin>(
    w: &mut W,
    data: &[u8],
    halt: &AtomicBool,
) -> io::Result<usize> {
    let mut off = 0;
    while off < data.len() {
        let n = tokio::select! {
            biased;
            _ = Flags::up(halt) => return Ok(off),
            r = w.write(&data[off..]) => r?,
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        off += n;
    }
    Ok(off)
}

/// [`splice`] for a client on an agent's link stream: the same copy both ways under the same
/// bounds, but every byte is followed by `relay` (record boundaries, without copying), so that
/// an agent that drains can ask, in-band, to move the live connection elsewhere. When `stop`
/// resolves, both directions stop at their next chunk boundary. Returns the bytes client ->
/// agent and agent -> client, and why it stopped.
///
/// `lead`: bytes owed to the client ahead of the agent's, followed already (a migrated
/// session's tickets, which came with the handshake agent's Switch). They wait at most
/// [`LEAD_WAIT`] for the agent's first bytes, to leave with them in one write: one system call
/// to the client per migration fewer (a `send` costs 10-15 us here, the receiver's processing
/// included), as when the agent that made the handshake answers the request itself.
pub(crate) async fn splice_watched<C, S>(
    client: &mut C,
    agent: &mut S,
    relay: &mut Relay,
    limits: Limits,
    lead: Vec<u8>,
    stop: impl std::future::Future<Output = ()>,
) -> io::Result<(u64, u64, Watched)>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let clock = Clock::new();
    // Both directions follow records through the relay, a lock taken only between awaits.
    let relay = std::sync::Mutex::new(relay);
    let watch = |f: &mut dyn FnMut(&mut Relay) -> Result<Passed, MigrationError>| {
        let mut r = relay.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut r).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    };
    let (mut client_rd, mut client_wr) = tokio::io::split(client);
    let (mut agent_rd, mut agent_wr) = tokio::io::split(agent);
    // The agent's Leave stops the client's direction, but only between two chunks: a write
    // to the agent is never cut short (cancelling it would lose count of what went).
    // `stop` stops both directions, each between two chunks.
    let flags = Flags {
        left: AtomicBool::new(false),
        halt: AtomicBool::new(false),
        raised: AtomicBool::new(false),
    };
    let (left, halt) = (&flags.left, &flags.halt);
    // The client ended its half (its FIN was read): once the agent ends too, the caller
    // closes the socket (a FIN all the same), so the shutdown is skipped, as in [`splice`].
    let client_eof = AtomicBool::new(false);
    let up = async {
        // Read into spare capacity (`read_buf`): nothing is zeroed that a read then overwrites.
        let mut buf = Vec::with_capacity(BUF);
        let mut side = Side::new(&mut client_rd, &clock, true);
        let mut n_up = 0u64;
        loop {
            buf.clear();
            let n = tokio::select! {
                biased;
                _ = Flags::up(left) => return Ok::<_, io::Error>((n_up, false, Vec::new())),
                _ = Flags::up(halt) => return Ok((n_up, false, Vec::new())),
                r = side.read_buf(&mut buf) => r?,
            };
            if n == 0 {
                // the client's FIN: the agent's stream ends its half too
                client_eof.store(true, Ordering::Relaxed);
                let _ = agent_wr.shutdown().await;
                return Ok((n_up, true, Vec::new()));
            }
            watch(&mut |r| r.watch_client(&buf[..n]).map(|()| Passed::default()))?;
            let wrote = write_unless(&mut agent_wr, &buf[..n], halt).await?;
            n_up += wrote as u64;
            if wrote < n {
                // an agent that does not read must not hold the handover: the rest is owed
                return Ok((n_up, false, buf[wrote..n].to_vec()));
            }
        }
    };
    let down = async {
        let mut buf = Vec::with_capacity(BUF);
        let mut side = Side::new(&mut agent_rd, &clock, false);
        let mut n_down = 0u64;
        let after_leave =
            || io::Error::new(io::ErrorKind::InvalidData, "bytes after the agent's Leave");
        let mut lead = lead;
        let lead_by = (!lead.is_empty()).then(|| (Instant::now() + LEAD_WAIT).into_std());
        loop {
            buf.clear();
            let read = tokio::select! {
                biased;
                _ = Flags::up(halt) => return Ok((n_down, false, lead)),
                r = side.read_buf(&mut buf) => Some(r?),
                () = sleep_until(lead_by), if !lead.is_empty() => None,
            };
            if !lead.is_empty() && read.is_none_or(|n| n == 0) {
                // the agent had nothing to send with them in time (or ended): they go alone
                let wrote = write_unless(&mut client_wr, &lead, halt).await?;
                n_down += wrote as u64;
                if wrote < lead.len() {
                    return Ok((n_down, false, lead.split_off(wrote)));
                }
                lead.clear();
            }
            let Some(n) = read else { continue };
            if n == 0 {
                // Both ends are done and the splice ends as `Ended` (halt not cancelled; the
                // client's direction is over): the caller closes the socket next. Otherwise
                // (a handover passes the socket on) the client gets its FIN now.
                if !client_eof.load(Ordering::Relaxed) || halt.load(Ordering::Relaxed) {
                    let _ = client_wr.shutdown().await;
                }
                return Ok::<_, io::Error>((n_down, false, Vec::new()));
            }
            let mut data = &buf[..n];
            while !data.is_empty() {
                let passed = watch(&mut |r| r.watch_agent(data))?;
                let merged;
                let tls = match lead.is_empty() {
                    true => &data[..passed.tls],
                    false => {
                        lead.extend_from_slice(&data[..passed.tls]);
                        merged = std::mem::take(&mut lead);
                        &merged[..]
                    }
                };
                let wrote = write_unless(&mut client_wr, tls, halt).await?;
                n_down += wrote as u64;
                data = &data[passed.consumed..];
                if wrote < tls.len() {
                    // A client that does not read must not hold the handover: the rest of
                    // this read is followed and owed to it.
                    let mut owed = tls[wrote..].to_vec();
                    let mut frame = passed.frame.is_some();
                    while !data.is_empty() && !frame {
                        let p = watch(&mut |r| r.watch_agent(data))?;
                        owed.extend_from_slice(&data[..p.tls]);
                        data = &data[p.consumed..];
                        frame = p.frame.is_some();
                    }
                    if !data.is_empty() {
                        return Err(after_leave());
                    }
                    return Ok((n_down, false, owed));
                }
                if passed.frame.is_some() {
                    // An agent that leaves sends nothing after it until it is answered.
                    if !data.is_empty() {
                        return Err(after_leave());
                    }
                    flags.raise(left);
                    return Ok((n_down, true, Vec::new()));
                }
            }
        }
    };
    let mut both = pin!(async { tokio::try_join!(up, down) });
    let mut stop = pin!(stop);
    let mut timer = pin!(tokio::time::sleep_until(clock.deadline(limits)));
    let r = std::future::poll_fn(|cx| {
        loop {
            if !halt.load(Ordering::Relaxed) && stop.as_mut().poll(cx).is_ready() {
                flags.raise(halt);
            }
            flags.raised.store(false, Ordering::Relaxed);
            if let Poll::Ready(r) = both.as_mut().poll(cx) {
                return Poll::Ready(r);
            }
            // a part raised a flag the others wait on (they registered no waker for it)
            if !flags.raised.load(Ordering::Relaxed) {
                break;
            }
        }
        ready!(clock.poll_silence(timer.as_mut(), limits, cx));
        Poll::Ready(Err(silent()))
    })
    .await;
    let ((n_up, client_ended, to_agent), (n_down, leave, to_client)) = r?;
    let how = if leave {
        Watched::Left { client_ended }
    } else if halt.load(Ordering::Relaxed) {
        Watched::Stopped {
            client_ended,
            owed: Owed {
                to_client,
                to_agent,
            },
        }
    } else {
        Watched::Ended
    };
    Ok((n_up, n_down, how))
}

/// When the splice last read a byte, and whether a side has ended. Atomics, not cells: the
/// splice's future must stay `Send`, and both wrapped streams and the timer see it. The reads
/// happen in the splice's own poll, which looks at the deadline right after them
/// ([`Clock::poll_silence`]): no signal is needed when a side ends.
struct Clock {
    start: Instant,
    last_read_ms: AtomicU64,
    half_closed: AtomicBool,
}

impl Clock {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_read_ms: AtomicU64::new(0),
            half_closed: AtomicBool::new(false),
        }
    }

    fn read(&self, n: usize) {
        if n == 0 {
            self.half_closed.store(true, Ordering::Relaxed);
        } else {
            let ms = self.start.elapsed().as_millis() as u64;
            self.last_read_ms.store(ms, Ordering::Relaxed);
        }
    }

    fn deadline(&self, limits: Limits) -> Instant {
        let last = self.start + Duration::from_millis(self.last_read_ms.load(Ordering::Relaxed));
        last + if self.half_closed.load(Ordering::Relaxed) {
            limits.half_closed
        } else {
            limits.idle
        }
    }

    /// Ready once the splice has been silent past its bound. `timer` is armed for a deadline
    /// that activity may since have moved later (it is re-armed when it fires: no timer work
    /// per read) or a side's end earlier (the shorter bound: re-armed at once).
    fn poll_silence(
        &self,
        mut timer: Pin<&mut tokio::time::Sleep>,
        limits: Limits,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        loop {
            let deadline = self.deadline(limits);
            if timer.is_elapsed() || deadline < timer.deadline() {
                if deadline <= Instant::now() {
                    return Poll::Ready(());
                }
                timer.as_mut().reset(deadline);
            }
            ready!(timer.as_mut().poll(cx));
        }
    }
}

/// One end of the splice: reads reported to the clock. For the client's end (`close_after_eof`),
/// a shutdown after its read side has ended is skipped: both directions are over, and the
/// caller closes the socket next.
struct Side<'a, S> {
    inner: &'a mut S,
    clock: &'a Clock,
    read_eof: bool,
    close_after_eof: bool,
}

impl<'a, S> Side<'a, S> {
    fn new(inner: &'a mut S, clock: &'a Clock, close_after_eof: bool) -> Self {
        Self {
            inner,
            clock,
            read_eof: false,
            close_after_eof,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Side<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut *this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let n = buf.filled().len() - before;
            this.read_eof |= n == 0;
            this.clock.read(n);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Side<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.close_after_eof && this.read_eof {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    const LIMITS: Limits = Limits {
        idle: Duration::from_secs(30),
        half_closed: Duration::from_secs(5),
    };

    type Task = tokio::task::JoinHandle<io::Result<(u64, u64)>>;

    /// An in-memory client and agent, spliced; returns the far end of each (in memory, so
    /// paused time never runs ahead of bytes in a kernel buffer).
    async fn spliced(limits: Limits) -> (DuplexStream, DuplexStream, Task) {
        let (client, mut near) = tokio::io::duplex(1024);
        let (mut agent, far) = tokio::io::duplex(1024);
        let task = tokio::spawn(async move { splice(&mut near, &mut agent, limits).await });
        (client, far, task)
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_splice_is_closed_and_traffic_postpones_it() {
        let (mut client, mut agent, task) = spliced(LIMITS).await;
        let start = Instant::now();
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(20)).await;
            client.write_all(b"x").await.unwrap();
            let mut b = [0u8; 1];
            agent.read_exact(&mut b).await.unwrap();
        }
        let r = task.await.unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
        // 60 s of traffic every 20 s, then 30 s of silence
        let held = start.elapsed();
        assert!(
            held >= Duration::from_secs(90) && held < Duration::from_secs(92),
            "{held:?}"
        );
        // the dispatcher's end is gone: the client reads the end of the stream
        let mut b = [0u8; 1];
        assert_eq!(client.read(&mut b).await.unwrap_or(0), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn after_one_side_ends_the_other_has_only_the_short_bound() {
        let (mut client, agent, task) = spliced(LIMITS).await;
        let start = Instant::now();
        // the agent gives up on the client (its handshake timeout), the client stays silent
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(agent);
        let mut b = [0u8; 1];
        // the agent's end reaches the client as EOF at once...
        assert_eq!(client.read(&mut b).await.unwrap(), 0);
        // ...and the dispatcher lets go of its socket the short bound after the last byte (none
        // here), not the idle one
        let r = task.await.unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
        let held = start.elapsed();
        assert!(
            held >= Duration::from_secs(5) && held < Duration::from_secs(7),
            "{held:?}"
        );
    }

    /// A client end that counts the writes made to it.
    struct Counted {
        inner: DuplexStream,
        writes: Arc<AtomicU64>,
    }

    impl AsyncRead for Counted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Counted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let r = ready!(Pin::new(&mut self.inner).poll_write(cx, buf));
            self.writes.fetch_add(1, Ordering::Relaxed);
            Poll::Ready(r)
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    type WatchedTask = tokio::task::JoinHandle<io::Result<(u64, u64, Watched)>>;

    /// A watched splice with `lead` owed to the client; the far ends, the client's write count.
    fn watched_with(lead: &[u8]) -> (DuplexStream, DuplexStream, Arc<AtomicU64>, WatchedTask) {
        let (client, near) = tokio::io::duplex(1024);
        let (mut agent, far) = tokio::io::duplex(1024);
        let writes = Arc::new(AtomicU64::new(0));
        let mut near = Counted {
            inner: near,
            writes: writes.clone(),
        };
        let lead = lead.to_vec();
        let task = tokio::spawn(async move {
            let mut relay = Relay::serving();
            let stop = std::future::pending();
            splice_watched(&mut near, &mut agent, &mut relay, LIMITS, lead, stop).await
        });
        (client, far, writes, task)
    }

    /// An application-data record as an agent sends it.
    const RECORD: &[u8] = &[23, 3, 3, 0, 2, b'h', b'i'];

    #[tokio::test(start_paused = true)]
    async fn bytes_owed_to_the_client_leave_with_the_agents_first_in_one_write() {
        let (mut client, mut agent, writes, task) = watched_with(b"tickets");
        tokio::time::sleep(LEAD_WAIT / 2).await;
        agent.write_all(RECORD).await.unwrap();
        let mut got = vec![0u8; 7 + RECORD.len()];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..7], b"tickets");
        assert_eq!(&got[7..], RECORD);
        assert_eq!(writes.load(Ordering::Relaxed), 1, "one write for both");
        drop(agent);
        client.shutdown().await.unwrap();
        let (up, down, how) = task.await.unwrap().unwrap();
        assert_eq!(
            (up, down, how),
            (0, 7 + RECORD.len() as u64, Watched::Ended)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_owed_to_the_client_go_alone_once_the_agent_has_been_silent_a_moment() {
        let (mut client, mut agent, writes, task) = watched_with(b"tickets");
        let start = Instant::now();
        let mut got = [0u8; 7];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"tickets");
        let waited = start.elapsed();
        assert!(waited >= LEAD_WAIT && waited < LEAD_WAIT * 2, "{waited:?}");
        // the agent's bytes later are a write of their own
        agent.write_all(RECORD).await.unwrap();
        let mut rec = vec![0u8; RECORD.len()];
        client.read_exact(&mut rec).await.unwrap();
        assert_eq!(rec, RECORD);
        assert_eq!(writes.load(Ordering::Relaxed), 2);
        drop(agent);
        client.shutdown().await.unwrap();
        let (_, down, _) = task.await.unwrap().unwrap();
        assert_eq!(down, 7 + RECORD.len() as u64);
    }

    #[tokio::test(start_paused = true)]
    async fn an_agent_that_ends_at_once_lets_the_owed_bytes_go_first() {
        let (mut client, agent, _, task) = watched_with(b"tickets");
        drop(agent);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"tickets");
        drop(client);
        let (_, down, _) = task.await.unwrap().unwrap();
        assert_eq!(down, 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_splice_both_sides_end_finishes_with_its_byte_counts() {
        let (mut client, mut agent, task) = spliced(LIMITS).await;
        client.write_all(b"hello").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        agent.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
        agent.write_all(b"bye!").await.unwrap();
        drop(agent);
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"bye!");
        assert_eq!(task.await.unwrap().unwrap(), (5, 4));
    }
}
