//! The bounds on an HTTP/2 connection after its first request, as plain decisions over what
//! its frames say (`h2frames`); `h2watch` applies them. HTTP/1.1 gets the same from its
//! per-request loop (`conn::http1`); one HTTP/2 connection carries many requests at once,
//! so the rules are about the connection:
//! - a request head (a header block, or any frame but DATA) part-way in must complete within
//!   `--header-timeout` of its first byte, and at `--min-header-rate` after the grace (`pace`),
//!   however its bytes trickle in;
//! - a connection with no stream open gets a GOAWAY after `--idle-timeout` (keep-alive PINGs,
//!   which keep the bytes flowing, do not count), and is closed after another;
//! - a client may cancel (RST_STREAM) at most `--h2-max-resets` open streams per
//!   [`RESET_WINDOW`] (rapid reset, CVE-2023-44487): past that the connection is cut.

use std::time::Duration;

use tokio::time::Instant;

use crate::conn::pace::{HeadPace, TooSlow};
use crate::h2frames::H2Frames;

/// The window `--h2-max-resets` counts in.
pub const RESET_WINDOW: Duration = Duration::from_secs(10);

/// hyper's own caps on resets (beside the budget here): streams the client reset before hyper
/// accepted them, at once; and streams hyper had to reset for the client's errors, over the
/// connection's life. Past either, hyper sends GOAWAY (ENHANCE_YOUR_CALM).
pub const PENDING_ACCEPT_RESETS: usize = 64;
pub const LOCAL_ERROR_RESETS: usize = 128;

/// The settings the rules use.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub header_timeout: Duration,
    /// Bytes per second; 0: no minimum.
    pub min_header_rate: u64,
    pub idle_timeout: Duration,
    pub max_resets: u32,
}

/// Why a connection is cut (a counted abuse, not an idle close).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// A head part-way in for longer than `--header-timeout`.
    HeaderTimeout,
    /// A head arriving slower than `--min-header-rate`.
    HeaderRate,
    /// More cancelled streams than `--h2-max-resets` in a window.
    Resets,
}

impl Cut {
    pub const ALL: [Cut; 3] = [Cut::HeaderTimeout, Cut::HeaderRate, Cut::Resets];

    pub fn label(self) -> &'static str {
        match self {
            Cut::HeaderTimeout => "header_timeout",
            Cut::HeaderRate => "header_rate",
            Cut::Resets => "resets",
        }
    }
}

/// What is due at a deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    Cut(Cut),
    /// No stream open for `--idle-timeout`: GOAWAY, or the close if one was sent.
    Idle,
}

/// When the connection is next due to be cut or closed, and why; `None` while nothing bounds it
/// (streams are open and no head is part-way in), or when its frames are not followed.
/// `goaway`: when an idle GOAWAY was sent (the idle time counts again from there).
pub fn due(frames: &H2Frames, limits: &Limits, goaway: Option<Instant>) -> Option<(Instant, Due)> {
    if frames.lost() {
        return None;
    }
    if let Some((since, bytes)) = frames.pending() {
        let pace = HeadPace {
            start: since,
            first_by: since.checked_add(limits.header_timeout),
            min_rate: limits.min_header_rate,
        };
        return pace.deadline(bytes).map(|(at, why)| {
            let cut = match why {
                TooSlow::Deadline => Cut::HeaderTimeout,
                TooSlow::Rate => Cut::HeaderRate,
            };
            (at, Due::Cut(cut))
        });
    }
    if frames.open_streams() > 0 {
        return None;
    }
    let from = goaway.map_or(frames.quiet_since(), |g| g.max(frames.quiet_since()));
    from.checked_add(limits.idle_timeout)
        .map(|at| (at, Due::Idle))
}

/// Cancelled streams counted in fixed windows of [`RESET_WINDOW`].
#[derive(Debug, Default)]
pub struct ResetBudget {
    window: Option<Instant>,
    spent: u32,
}

impl ResetBudget {
    /// Counts `n` cancelled streams at `now`; `true` once more than `max` fell in one window.
    pub fn spend(&mut self, n: u32, now: Instant, max: u32) -> bool {
        if self.window.is_none_or(|w| now >= w + RESET_WINDOW) {
            self.window = Some(now);
            self.spent = 0;
        }
        self.spent = self.spent.saturating_add(n);
        self.spent > max
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::h2frames::tests::{frame, opening, request};

    /// The limits the rules' and the watcher's tests run with.
    pub(crate) const LIMITS: Limits = Limits {
        header_timeout: Duration::from_secs(10),
        min_header_rate: 0,
        idle_timeout: Duration::from_secs(60),
        max_resets: 5,
    };

    #[tokio::test(start_paused = true)]
    async fn a_head_part_way_in_is_due_at_the_header_timeout() {
        let t0 = Instant::now();
        let mut f = H2Frames::new(t0);
        f.read(&opening(), t0);
        f.read(&request(1), t0);
        // a request open, nothing part-way in: nothing bounds the connection
        assert_eq!(due(&f, &LIMITS, None), None);
        // a second request's head, trickled: its first byte sets the deadline, later ones
        // do not move it
        let t1 = t0 + Duration::from_secs(3);
        let head = request(3);
        f.read(&head[..1], t1);
        let at = t1 + LIMITS.header_timeout;
        assert_eq!(
            due(&f, &LIMITS, None),
            Some((at, Due::Cut(Cut::HeaderTimeout)))
        );
        f.read(&head[1..2], t1 + Duration::from_secs(9));
        assert_eq!(
            due(&f, &LIMITS, None),
            Some((at, Due::Cut(Cut::HeaderTimeout)))
        );
        // with a minimum rate, a slow head is due sooner
        let paced = Limits {
            min_header_rate: 512,
            ..LIMITS
        };
        let (when, why) = due(&f, &paced, None).unwrap();
        assert_eq!(why, Due::Cut(Cut::HeaderRate));
        assert!(when < at);
        // complete: the open requests hold the connection again
        f.read(&head[2..], t1 + Duration::from_secs(9));
        assert_eq!(due(&f, &LIMITS, None), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_no_stream_open_idles_out() {
        let t0 = Instant::now();
        let mut f = H2Frames::new(t0);
        f.read(&opening(), t0);
        assert_eq!(
            due(&f, &LIMITS, None),
            Some((t0 + LIMITS.idle_timeout, Due::Idle))
        );
        f.read(&request(1), t0);
        let t1 = t0 + Duration::from_secs(5);
        f.wrote(&frame(0x1, 0x1 | 0x4, 1, 10), t1);
        assert_eq!(
            due(&f, &LIMITS, None),
            Some((t1 + LIMITS.idle_timeout, Due::Idle))
        );
        // PINGs either way do not count as activity
        f.read(&frame(0x6, 1, 0, 8), t1 + Duration::from_secs(30));
        f.wrote(&frame(0x6, 0, 0, 8), t1 + Duration::from_secs(30));
        assert_eq!(
            due(&f, &LIMITS, None),
            Some((t1 + LIMITS.idle_timeout, Due::Idle))
        );
        // after the GOAWAY, another idle time
        let g = t1 + LIMITS.idle_timeout;
        assert_eq!(
            due(&f, &LIMITS, Some(g)),
            Some((g + LIMITS.idle_timeout, Due::Idle))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn resets_past_the_budget_in_one_window_cut() {
        let t0 = Instant::now();
        let mut b = ResetBudget::default();
        assert!(!b.spend(3, t0, 5));
        assert!(!b.spend(2, t0 + Duration::from_secs(9), 5));
        assert!(b.spend(1, t0 + Duration::from_secs(9), 5));
        // a new window starts afresh
        let mut b = ResetBudget::default();
        assert!(!b.spend(5, t0, 5));
        assert!(!b.spend(5, t0 + RESET_WINDOW, 5));
        assert!(b.spend(u32::MAX, t0 + RESET_WINDOW, 5));
    }

    #[test]
    fn cut_labels_are_distinct() {
        let labels: std::collections::HashSet<_> = Cut::ALL.map(Cut::label).into();
        assert_eq!(labels.len(), Cut::ALL.len());
    }
}
