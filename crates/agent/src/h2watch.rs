//! The tokio side of the HTTP/2 bounds (`h2bounds`): the stream hyper's HTTP/2 connection reads
//! and writes through. It follows the frames both ways (`h2frames`), keeps one timer at the
//! deadline the rules give, and tells the connection's driver (`conn::serve_stream::drive`) when to send a
//! GOAWAY or close, through a [`Signal`]. hyper polls this stream from the connection's own
//! task, the driver's, so a signal needs no channel: it is set, and the task woken.
//!
//! The timer is not moved for each request: a head that arrives whole in one read never sets
//! a deadline, and a deadline that moved later is re-armed only when the earlier one fires.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::h2bounds::{self, Cut, Due, Limits, ResetBudget};
use crate::h2frames::H2Frames;
use crate::metrics::Metrics;

/// What the driver is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Idle: a graceful GOAWAY (streams that race it finish).
    Goaway,
    /// Idle again after the GOAWAY: close.
    Close,
    /// Cut (counted already): GOAWAY, then close shortly, whatever is open.
    Cut,
}

/// The one action pending for the driver, set by the watched stream.
#[derive(Debug, Default)]
pub struct Signal(AtomicU8);

impl Signal {
    fn set(&self, action: Action) {
        let v = match action {
            Action::Goaway => 1,
            Action::Close => 2,
            Action::Cut => 3,
        };
        // a cut or close is not overwritten by a lesser action
        self.0.fetch_max(v, Ordering::Relaxed);
    }

    fn take(&self) -> Option<Action> {
        match self.0.swap(0, Ordering::Relaxed) {
            1 => Some(Action::Goaway),
            2 => Some(Action::Close),
            3 => Some(Action::Cut),
            _ => None,
        }
    }

    /// The next action. Woken by the watched stream, which hyper polls in the same task.
    pub async fn next(&self) -> Action {
        std::future::poll_fn(|_| self.take().map_or(Poll::Pending, Poll::Ready)).await
    }
}

/// An HTTP/2 connection's stream, watched.
pub struct Watched<S> {
    inner: S,
    frames: H2Frames,
    limits: Limits,
    resets: ResetBudget,
    /// The timer and the deadline it is armed for.
    timer: Option<(Pin<Box<Sleep>>, Instant)>,
    /// When an idle GOAWAY was asked for.
    goaway: Option<Instant>,
    /// Cut or closed: reads stay pending while the driver sends GOAWAY and closes.
    done: bool,
    signal: Arc<Signal>,
    metrics: Arc<Metrics>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, limits: Limits, signal: Arc<Signal>, metrics: Arc<Metrics>) -> Self {
        Watched {
            inner,
            frames: H2Frames::new(Instant::now()),
            limits,
            resets: ResetBudget::default(),
            timer: None,
            goaway: None,
            done: false,
            signal,
            metrics,
        }
    }

    fn act(&mut self, action: Action, cx: &mut Context<'_>) {
        if action != Action::Goaway {
            self.done = true;
        }
        self.signal.set(action);
        cx.waker().wake_by_ref();
    }

    fn cut(&mut self, why: Cut, cx: &mut Context<'_>) {
        self.metrics.h2_cut(why);
        tracing::debug!(reason = why.label(), "HTTP/2 connection cut");
        self.act(Action::Cut, cx);
    }

    /// Arms the timer for the rules' next deadline, or acts on it if it has passed.
    fn check(&mut self, cx: &mut Context<'_>) {
        while !self.done {
            let Some((at, due)) = h2bounds::due(&self.frames, &self.limits, self.goaway) else {
                return;
            };
            let fired = match &mut self.timer {
                Some((timer, armed)) => {
                    // armed for a later deadline: moved; for an earlier one: it fires first,
                    // then this is asked again
                    if at < *armed {
                        timer.as_mut().reset(at);
                        *armed = at;
                    }
                    timer.as_mut().poll(cx).is_ready()
                }
                None => {
                    let mut timer = Box::pin(tokio::time::sleep_until(at));
                    let fired = timer.as_mut().poll(cx).is_ready();
                    self.timer = Some((timer, at));
                    fired
                }
            };
            if !fired {
                return;
            }
            if at > Instant::now() {
                // it fired for a deadline that has since moved later
                if let Some((timer, armed)) = &mut self.timer {
                    timer.as_mut().reset(at);
                    *armed = at;
                }
                continue;
            }
            match due {
                Due::Cut(why) => self.cut(why, cx),
                Due::Idle if self.goaway.is_none() => {
                    self.goaway = Some(Instant::now());
                    self.act(Action::Goaway, cx);
                }
                Due::Idle => self.act(Action::Close, cx),
            }
        }
    }
}

use std::future::Future as _;

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.done {
            // closing: the driver's timer wakes the task
            return Poll::Pending;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if !read.is_empty() {
                    let now = Instant::now();
                    let cancelled = this.frames.read(read, now).cancelled;
                    if cancelled > 0 && this.resets.spend(cancelled, now, this.limits.max_resets) {
                        this.cut(Cut::Resets, cx);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                this.check(cx);
                Poll::Pending
            }
            err => err,
        }
    }
}

impl<S: AsyncWrite + Unpin> Watched<S> {
    /// Follows what a write took; a write that ended the last open stream starts the idle
    /// clock.
    fn wrote(&mut self, bufs: &[io::IoSlice<'_>], n: usize, cx: &mut Context<'_>) {
        let now = Instant::now();
        let mut left = n;
        let mut quiet = false;
        for b in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(b.len());
            quiet |= self.frames.wrote(&b[..take], now);
            left -= take;
        }
        if quiet {
            self.check(cx);
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.wrote(&[io::IoSlice::new(buf)], n, cx);
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            this.wrote(bufs, n, cx);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h2bounds::tests::LIMITS;
    use crate::h2frames::tests::{frame, opening, request};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    fn watched() -> (
        DuplexStream,
        Watched<DuplexStream>,
        Arc<Signal>,
        Arc<Metrics>,
    ) {
        let (client, server) = tokio::io::duplex(4096);
        let signal = Arc::new(Signal::default());
        let metrics = Arc::new(Metrics::default());
        let w = Watched::new(server, LIMITS, signal.clone(), metrics.clone());
        (client, w, signal, metrics)
    }

    /// Reads as hyper does until the watched stream signals; the signal, and when.
    async fn until_signal(w: &mut Watched<DuplexStream>, signal: &Signal) -> (Action, Instant) {
        tokio::select! {
            a = signal.next() => (a, Instant::now()),
            _ = async {
                let mut buf = [0u8; 1024];
                while w.read(&mut buf).await.unwrap() > 0 {}
            } => panic!("the client closed"),
        }
    }

    fn cuts(metrics: &Arc<Metrics>, reason: &str) -> bool {
        let m = metrics.clone();
        crate::metrics::tests::encoded(move |e| m.encode(e)).contains(&format!(
            "baton_h2_connections_cut_total{{reason=\"{reason}\"}} 1"
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_head_is_cut_at_the_header_timeout() {
        let (mut client, mut w, signal, metrics) = watched();
        client
            .write_all(&[opening(), request(1)].concat())
            .await
            .unwrap();
        let start = Instant::now();
        let trickle = async {
            for b in request(3) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                client.write_all(&[b]).await.unwrap();
            }
            std::future::pending::<()>().await
        };
        let (action, at) = tokio::select! {
            r = until_signal(&mut w, &signal) => r,
            _ = trickle => unreachable!(),
        };
        assert_eq!(action, Action::Cut);
        // from the first byte, a second in, whatever came after it
        assert_eq!(at - start, Duration::from_secs(1) + LIMITS.header_timeout);
        assert!(cuts(&metrics, "header_timeout"));
        // cut: it reads no more
        let mut buf = [0u8; 8];
        let more = tokio::time::timeout(Duration::from_secs(1), w.read(&mut buf)).await;
        assert!(more.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_gets_a_goaway_then_a_close() {
        let (mut client, mut w, signal, _) = watched();
        client
            .write_all(&[opening(), request(1)].concat())
            .await
            .unwrap();
        // a request open: no idle time runs, however long it takes
        let waited =
            tokio::time::timeout(Duration::from_secs(300), until_signal(&mut w, &signal)).await;
        assert!(waited.is_err(), "{waited:?}");
        // its response ends it: idle from then
        w.write_all(&frame(0x1, 0x1 | 0x4, 1, 10)).await.unwrap();
        let ended = Instant::now();
        let (action, at) = until_signal(&mut w, &signal).await;
        assert_eq!((action, at - ended), (Action::Goaway, LIMITS.idle_timeout));
        let (action, at) = until_signal(&mut w, &signal).await;
        assert_eq!(
            (action, at - ended),
            (Action::Close, 2 * LIMITS.idle_timeout)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_streams_past_the_budget_cut() {
        let (mut client, mut w, signal, metrics) = watched();
        let mut burst = opening();
        for s in (1..=11).step_by(2) {
            burst.extend(request(s));
            burst.extend(frame(0x3, 0, s, 4));
        }
        client.write_all(&burst).await.unwrap();
        let start = Instant::now();
        let (action, at) = until_signal(&mut w, &signal).await;
        assert_eq!((action, at), (Action::Cut, start));
        assert!(cuts(&metrics, "resets"));
    }
}
