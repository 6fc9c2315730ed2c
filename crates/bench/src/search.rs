//! `find-max`'s search, as a pure state machine (no clock, no sockets): it says which rate to
//! hold next, is told how that step went, and ends with the highest rate that passed
//! `--repeat` times in a row. The shell in `find_max.rs` only runs the steps it asks for.
//!
//! The 2048-bit migration report: "SSL TPS" is measured at zero loss (0.001 %) in a steady state, three times,
//! and the mean reported. Here: grow the rate by doubling until a step fails, bisect between
//! the highest pass and the lowest failure until they are within `precision` of each other,
//! then hold the highest pass `repeat` times; if one of those fails, that rate becomes the
//! lowest failure and the search goes on below it. The bracket only ever narrows (the lowest
//! failure never rises), so the search ends; `max_steps` bounds it whatever the server does.

use serde::Serialize;

/// What a step must achieve to pass.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Criteria {
    /// Largest share of failed requests (0.00001 = the 2048-bit migration report's 0.001 %).
    pub max_loss: f64,
    /// Largest p99 of the total latency, if bounded.
    pub max_p99_ms: Option<f64>,
    /// Share of the offered rate that must be completed: below it the server (or the client)
    /// fell behind and a backlog grew, which is not a steady state.
    pub keep_up: f64,
}

/// What one step measured.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Measurement {
    /// Requests made (ok + failed).
    pub requests: u64,
    pub failed: u64,
    /// Transactions completed per second over the step.
    pub tps: f64,
    pub p99_ms: f64,
}

/// Why a step passed or failed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "lowercase", tag = "verdict", content = "value")]
pub enum Verdict {
    Pass,
    /// Failed requests, as a share.
    Loss(f64),
    /// p99 in ms above the bound.
    Slow(f64),
    /// Completed share of the offered rate.
    Behind(f64),
    /// Nothing was attempted.
    Empty,
}

impl Criteria {
    pub fn judge(&self, rate: f64, m: &Measurement) -> Verdict {
        if m.requests == 0 {
            return Verdict::Empty;
        }
        let loss = m.failed as f64 / m.requests as f64;
        if loss > self.max_loss {
            return Verdict::Loss(loss);
        }
        if let Some(bound) = self.max_p99_ms {
            if m.p99_ms > bound {
                return Verdict::Slow(m.p99_ms);
            }
        }
        let share = m.tps / rate;
        if share < self.keep_up {
            return Verdict::Behind(share);
        }
        Verdict::Pass
    }
}

/// The search's range and stopping rules (rates in transactions per second).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Limits {
    pub start: f64,
    pub min: f64,
    pub max: f64,
    /// Stop bisecting once (lowest failure - highest pass) <= precision x highest pass.
    pub precision: f64,
    /// Passes in a row the final rate needs.
    pub repeat: u32,
    pub max_steps: u32,
}

impl Limits {
    /// Steps a server with a fixed capacity needs at most: doubling up (or halving down), then
    /// bisecting to `precision`, then `repeat`. `max_steps` should not be below this.
    pub fn steps_for_fixed_capacity(&self) -> u32 {
        let log2 = |x: f64| x.max(1.0).log2().ceil() as u32;
        log2(self.max / self.start)
            + log2(self.start / self.min)
            + log2(1.0 / self.precision)
            + 2
            + self.repeat
    }
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Hold this rate for one step; `confirm` is Some((i, of)) for the i-th repeat.
    Measure {
        rate: f64,
        confirm: Option<(u32, u32)>,
    },
    Done(Found),
}

/// The result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Found {
    /// The highest rate that passed `repeat` times; None when not even `min` passed.
    pub rate: Option<f64>,
    /// Completed TPS of each repeat at `rate`.
    pub tps: Vec<f64>,
    /// false: `max_steps` ran out first (`rate` is then the best pass so far, unconfirmed).
    pub converged: bool,
    /// `rate` is `max`: the server may take more.
    pub capped: bool,
    pub steps: u32,
}

impl Found {
    pub fn mean(&self) -> f64 {
        if self.tps.is_empty() {
            0.0
        } else {
            self.tps.iter().sum::<f64>() / self.tps.len() as f64
        }
    }

    pub fn min(&self) -> f64 {
        self.tps.iter().copied().fold(f64::INFINITY, f64::min)
    }

    pub fn max(&self) -> f64 {
        self.tps.iter().copied().fold(0.0, f64::max)
    }

    /// (max - min) / mean of the repeats, in percent.
    pub fn spread_pct(&self) -> f64 {
        let mean = self.mean();
        if mean > 0.0 {
            (self.max() - self.min()) / mean * 100.0
        } else {
            0.0
        }
    }
}

#[derive(Debug, Clone)]
pub struct Search {
    limits: Limits,
    /// Highest rate that passed (while searching).
    lo: Option<f64>,
    /// Lowest rate that failed.
    hi: Option<f64>,
    /// Every rate that passed, ascending: where the search falls back to when a repeat fails.
    passed: Vec<f64>,
    /// Repeats at `lo` so far (TPS of each).
    confirming: Option<Vec<f64>>,
    steps: u32,
    done: Option<Found>,
}

impl Search {
    pub fn new(limits: Limits) -> Self {
        assert!(
            limits.min > 0.0 && limits.min <= limits.start && limits.start <= limits.max,
            "min <= start <= max"
        );
        assert!(limits.precision > 0.0 && limits.repeat >= 1);
        Self {
            limits,
            lo: None,
            hi: None,
            passed: Vec::new(),
            confirming: None,
            steps: 0,
            done: None,
        }
    }

    /// The bracket: (highest pass, lowest failure).
    pub fn bracket(&self) -> (Option<f64>, Option<f64>) {
        (self.lo, self.hi)
    }

    pub fn next(&mut self) -> Next {
        if let Some(f) = &self.done {
            return Next::Done(f.clone());
        }
        let l = self.limits;
        if self.steps >= l.max_steps {
            return self.finish(self.lo, false);
        }
        if let (Some(r), Some(done)) = (self.lo, &self.confirming) {
            return Next::Measure {
                rate: r,
                confirm: Some((done.len() as u32 + 1, l.repeat)),
            };
        }
        let rate = match (self.lo, self.hi) {
            (None, None) => l.start,
            (Some(lo), None) if lo >= l.max => return self.confirm(),
            (Some(lo), None) => (lo * 2.0).min(l.max),
            (None, Some(hi)) if hi <= l.min => return self.finish(None, true),
            (None, Some(hi)) => (hi / 2.0).max(l.min),
            (Some(lo), Some(hi)) if hi - lo <= l.precision * lo => return self.confirm(),
            (Some(lo), Some(hi)) => (lo + hi) / 2.0,
        };
        Next::Measure {
            rate,
            confirm: None,
        }
    }

    /// How the step at `rate` (the one [`Search::next`] asked for) went, and its TPS.
    pub fn record(&mut self, rate: f64, pass: bool, tps: f64) {
        self.steps += 1;
        if let Some(done) = &mut self.confirming {
            if pass {
                done.push(tps);
                if done.len() as u32 >= self.limits.repeat {
                    let tps = std::mem::take(done);
                    self.done = Some(Found {
                        rate: Some(rate),
                        capped: rate >= self.limits.max,
                        tps,
                        converged: true,
                        steps: self.steps,
                    });
                }
                return;
            }
            // not repeatable: a failure at this rate; go on below it
            self.confirming = None;
            self.passed.retain(|r| *r < rate);
            self.lo = self.passed.last().copied();
            self.hi = Some(self.hi.map_or(rate, |h| h.min(rate)));
            return;
        }
        if pass {
            self.lo = Some(self.lo.map_or(rate, |l| l.max(rate)));
            self.passed.push(rate);
            self.passed.sort_by(f64::total_cmp);
        } else {
            self.hi = Some(self.hi.map_or(rate, |h| h.min(rate)));
        }
    }

    fn confirm(&mut self) -> Next {
        self.confirming = Some(Vec::new());
        self.next()
    }

    fn finish(&mut self, rate: Option<f64>, converged: bool) -> Next {
        let f = Found {
            rate,
            tps: self.confirming.take().unwrap_or_default(),
            converged,
            capped: rate.is_some_and(|r| r >= self.limits.max),
            steps: self.steps,
        };
        self.done = Some(f.clone());
        Next::Done(f)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn limits() -> Limits {
        Limits {
            start: 100.0,
            min: 1.0,
            max: 100_000.0,
            precision: 0.05,
            repeat: 3,
            max_steps: 60,
        }
    }

    /// Runs a search against a server that passes every rate up to `capacity`; returns the
    /// result and each rate measured.
    fn against(limits: Limits, mut passes: impl FnMut(f64) -> bool) -> (Found, Vec<f64>) {
        let mut s = Search::new(limits);
        let mut rates = Vec::new();
        let mut last_hi = f64::INFINITY;
        loop {
            match s.next() {
                Next::Done(f) => return (f, rates),
                Next::Measure { rate, .. } => {
                    assert!(rate >= limits.min && rate <= limits.max, "{rate}");
                    rates.push(rate);
                    s.record(rate, passes(rate), rate);
                    // the lowest failure never rises, the highest pass stays below it
                    let (lo, hi) = s.bracket();
                    let hi = hi.unwrap_or(f64::INFINITY);
                    assert!(hi <= last_hi);
                    assert!(lo.is_none_or(|lo| lo < hi));
                    last_hi = hi;
                }
            }
        }
    }

    #[test]
    fn finds_a_fixed_capacity_within_precision() {
        let (f, rates) = against(limits(), |r| r <= 1234.0);
        let rate = f.rate.unwrap();
        assert!((1234.0 / 1.05 * 0.999..=1234.0).contains(&rate), "{rate}");
        assert!(f.converged && !f.capped);
        assert_eq!(f.tps, vec![rate; 3]);
        assert_eq!(f.spread_pct(), 0.0);
        // doubling 100 -> 1600, then bisecting 800..1600
        assert_eq!(&rates[..5], &[100.0, 200.0, 400.0, 800.0, 1600.0]);
        assert!(f.steps <= limits().steps_for_fixed_capacity());
    }

    #[test]
    fn below_the_start_and_nothing_at_all() {
        let (f, rates) = against(limits(), |r| r <= 30.0);
        assert!(f.rate.unwrap() <= 30.0 && f.rate.unwrap() > 28.0);
        assert_eq!(&rates[..3], &[100.0, 50.0, 25.0]);
        let (f, rates) = against(limits(), |_| false);
        assert_eq!((f.rate, f.converged), (None, true));
        assert_eq!(*rates.last().unwrap(), 1.0);
    }

    #[test]
    fn everything_passes_up_to_the_cap() {
        let (f, _) = against(limits(), |_| true);
        assert_eq!(f.rate, Some(100_000.0));
        assert!(f.capped && f.converged);
    }

    #[test]
    fn a_repeat_that_fails_moves_the_search_below_it() {
        // the server passes 800 once, then never again: the result must be below 800
        let mut seen_800 = 0;
        let (f, rates) = against(limits(), |r| {
            if r == 800.0 {
                seen_800 += 1;
                return seen_800 == 1;
            }
            r <= 820.0
        });
        assert!(f.rate.unwrap() < 800.0, "{f:?} {rates:?}");
        assert!(f.converged);
        assert_eq!(f.tps.len(), 3);
    }

    #[test]
    fn steps_are_bounded_whatever_the_server_does() {
        // a server that flips every time never lets the repeats pass
        let mut flip = false;
        let (f, rates) = against(limits(), |_| {
            flip = !flip;
            flip
        });
        assert!(rates.len() as u32 <= limits().max_steps);
        assert!(f.steps <= limits().max_steps);
    }

    #[test]
    fn criteria() {
        let c = Criteria {
            max_loss: 0.00001,
            max_p99_ms: Some(50.0),
            keep_up: 0.95,
        };
        let m = |requests, failed, tps, p99_ms| Measurement {
            requests,
            failed,
            tps,
            p99_ms,
        };
        assert_eq!(c.judge(100.0, &m(1000, 0, 99.0, 3.0)), Verdict::Pass);
        assert_eq!(c.judge(100.0, &m(1000, 1, 99.0, 3.0)), Verdict::Loss(0.001));
        // 1 in 100,000 is exactly 0.001 %: allowed
        assert_eq!(c.judge(100.0, &m(100_000, 1, 99.0, 3.0)), Verdict::Pass);
        assert_eq!(c.judge(100.0, &m(1000, 0, 99.0, 60.0)), Verdict::Slow(60.0));
        assert_eq!(c.judge(100.0, &m(1000, 0, 90.0, 3.0)), Verdict::Behind(0.9));
        assert_eq!(c.judge(100.0, &m(0, 0, 0.0, 0.0)), Verdict::Empty);
    }

    proptest! {
        #[test]
        fn converges_on_any_capacity(
            capacity in 0.5f64..200_000.0,
            start in 1.0f64..5000.0,
            precision in 0.01f64..0.5,
            repeat in 1u32..5,
        ) {
            let l = Limits { start, precision, repeat, ..limits() };
            let (f, _) = against(l, |r| r <= capacity);
            prop_assert!(f.converged);
            prop_assert!(f.steps <= l.steps_for_fixed_capacity());
            match f.rate {
                None => prop_assert!(capacity < l.min),
                Some(r) if r >= l.max => prop_assert!(capacity >= l.max),
                Some(r) => {
                    prop_assert!(r <= capacity);
                    prop_assert!(r * (1.0 + precision) >= capacity.min(l.max) * 0.999_999,
                        "{} vs {}", r, capacity);
                }
            }
        }
    }
}
