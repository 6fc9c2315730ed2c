//! How slowly a client may send a request: deadlines a trickle of bytes cannot extend.
//!
//! The idle timeout (`io.rs`) restarts on every byte, so on its own it lets a client hold a
//! connection forever at one byte per minute (slowloris). Two bounds close that:
//! - the first request's head must be complete by `--request-timeout` after accept (handshake
//!   included), however the bytes arrive;
//! - every request head must arrive at `--min-header-rate` bytes per second or faster, after a
//!   short grace (a head is normally one packet).
//!
//! hyper's `header_read_timeout` bounds each head too, but only once hyper has started, and an
//! HTTP/2 connection has no such bound at all; these cover every phase up to the head.
//! Plain arithmetic here; `overdue` sleeps until [`HeadPace::deadline`] and asks again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The grace before `--min-header-rate` applies: a head of normal size arrives within it at any
/// rate.
pub const GRACE: Duration = Duration::from_secs(2);

/// Which bound cut a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TooSlow {
    /// `--request-timeout`: the first request was not in by its deadline.
    Deadline,
    /// `--min-header-rate`: the head came in slower than the minimum.
    Rate,
}

/// The bounds on one request head.
#[derive(Clone, Copy, Debug)]
pub struct HeadPace {
    /// When the wait for this head began.
    pub start: Instant,
    /// For a connection's first request: when it must be in (`--request-timeout`).
    pub first_by: Option<Instant>,
    /// Bytes per second; 0: no minimum.
    pub min_rate: u64,
}

impl HeadPace {
    /// When the head must be complete, given `bytes` of it received so far, and the bound that
    /// sets that time. `None`: no bound applies.
    pub fn deadline(&self, bytes: u64) -> Option<(Instant, TooSlow)> {
        // each byte buys 1/min_rate s; past any representable time, rate sets no bound
        let rate = (self.min_rate > 0)
            .then(|| Duration::try_from_secs_f64(bytes as f64 / self.min_rate as f64).ok())
            .flatten()
            .and_then(|earned| GRACE.checked_add(earned))
            .and_then(|d| self.start.checked_add(d))
            .map(|at| (at, TooSlow::Rate));
        let first = self.first_by.map(|t| (t, TooSlow::Deadline));
        match (rate, first) {
            (Some(r), Some(f)) => Some(if f.0 <= r.0 { f } else { r }),
            (r, f) => r.or(f),
        }
    }
}

/// What a request's service and reader share with the connection's loop.
#[derive(Debug, Default)]
pub struct RequestState {
    /// Heads complete (the service called) in this hyper connection.
    heads: AtomicU64,
    /// Heads before the request paced now (a hyper connection kept from one request to the
    /// next counts one per response sent): with more complete, its head is in and the pace no
    /// longer applies. (A count, not a flag: a pipelined request's head may be in before its
    /// predecessor's response is sent.)
    before: AtomicU64,
    /// Plaintext bytes the reader has handed to hyper for this request.
    pub bytes: AtomicU64,
}

impl RequestState {
    pub fn head_seen(&self) -> bool {
        self.heads.load(Ordering::Relaxed) > self.before.load(Ordering::Relaxed)
    }

    pub fn saw_head(&self) {
        self.heads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// `n` responses are sent: the request after them is paced (a hyper connection kept from
    /// one request to the next).
    pub fn responses_sent(&self, n: u64) {
        self.before.store(n, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
    }

    pub fn read(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Waits until `state`'s head is past its bounds: returns which bound, or never returns while
/// the head keeps pace (and never at all once it is complete). Wakes only at deadlines, not
/// per byte.
pub async fn overdue(pace: HeadPace, state: &RequestState) -> TooSlow {
    loop {
        if state.head_seen() {
            return std::future::pending().await;
        }
        let Some((at, why)) = pace.deadline(state.bytes()) else {
            return std::future::pending().await;
        };
        if at <= Instant::now() {
            return why;
        }
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(first: Option<u64>, rate: u64) -> HeadPace {
        let start = Instant::now();
        HeadPace {
            start,
            first_by: first.map(|s| start + Duration::from_secs(s)),
            min_rate: rate,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_the_bytes_received() {
        let p = pace(None, 100);
        let (at, why) = p.deadline(0).unwrap();
        assert_eq!((at - p.start, why), (GRACE, TooSlow::Rate));
        // 300 bytes at 100 B/s buy 3 s more
        assert_eq!(
            p.deadline(300).unwrap().0 - p.start,
            GRACE + Duration::from_secs(3)
        );
        // the first request's deadline wins once it is the nearer
        let p = pace(Some(4), 100);
        assert_eq!(p.deadline(0).unwrap().1, TooSlow::Rate);
        assert_eq!(
            p.deadline(1000).unwrap(),
            (p.start + Duration::from_secs(4), TooSlow::Deadline)
        );
        assert!(pace(None, 0).deadline(5).is_none());
        assert_eq!(pace(Some(1), 0).deadline(5).unwrap().1, TooSlow::Deadline);
        // no overflow on absurd counts: such a head is bounded by the other limits
        assert!(pace(None, 1).deadline(u64::MAX).is_none());
    }

    #[test]
    fn a_kept_connection_paces_each_head_and_a_pipelined_one_stays_in() {
        let s = RequestState::default();
        assert!(!s.head_seen());
        s.read(10);
        s.saw_head();
        assert!(s.head_seen());
        // its response sent: the next head is paced from nothing
        s.responses_sent(1);
        assert!(!s.head_seen());
        assert_eq!(s.bytes(), 0);
        s.saw_head();
        // a pipelined head came before this response was sent: still in after it
        s.saw_head();
        s.responses_sent(2);
        assert!(s.head_seen());
        s.responses_sent(3);
        assert!(!s.head_seen());
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_is_cut_and_a_steady_head_is_not() {
        // one byte a second against 512 B/s: cut when the grace is spent
        let state = RequestState::default();
        let p = pace(Some(30), 512);
        let cut = tokio::select! {
            why = overdue(p, &state) => Some(why),
            _ = async {
                for _ in 0..60 {
                    state.read(1);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            } => None,
        };
        assert_eq!(cut, Some(TooSlow::Rate));
        assert!(
            p.start.elapsed() < Duration::from_secs(3),
            "{:?}",
            p.start.elapsed()
        );

        // a head that keeps pace and completes is never cut, even past the first deadline
        let state = RequestState::default();
        let p = pace(Some(5), 512);
        let cut = tokio::select! {
            why = overdue(p, &state) => Some(why),
            _ = async {
                for _ in 0..4 {
                    state.read(1024);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                state.saw_head();
                tokio::time::sleep(Duration::from_secs(60)).await;
            } => None,
        };
        assert_eq!(cut, None);

        // with no rate minimum, the first request's deadline still holds
        let state = RequestState::default();
        let p = pace(Some(5), 0);
        assert_eq!(overdue(p, &state).await, TooSlow::Deadline);
        assert_eq!(p.start.elapsed(), Duration::from_secs(5));
    }
}
