//! What a run counted: handshakes, requests, errors by class, bytes, and latency histograms
//! per phase. One per worker thread while running (its virtual clients share it), merged exactly
//! at the end (and later across
//! machines by `bench merge`: the histograms are serialized value by value).

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::accounting::{settle, End, ErrorClass, Handshake, Kind, Negotiated, Settled};

pub const PHASES: [&str; 4] = ["connect", "handshake", "ttfb", "total"];

#[derive(Debug, Clone)]
pub struct Stats {
    pub full: u64,
    pub resumed: u64,
    pub resume_refused: u64,
    pub handshake_failed: u64,
    pub requests_ok: u64,
    pub requests_failed: u64,
    /// Requests never sent: the server closed the connection before them (see
    /// [`crate::accounting::settle`]).
    pub requests_unsent: u64,
    /// Requests the finished transactions were to make (each its own count: a scenario's
    /// length, else `--requests-per-conn`): ok + failed + unsent, exactly.
    pub requests_expected: u64,
    pub by_status: BTreeMap<u16, u64>,
    pub errors: BTreeMap<ErrorClass, u64>,
    pub bytes: u64,
    /// The first failure's cause in each class.
    pub examples: BTreeMap<ErrorClass, String>,
    /// Completed handshakes per (version, suite, group).
    pub negotiated: BTreeMap<Negotiated, u64>,
    pub transactions: u64,
    /// connect, handshake, ttfb, total (microseconds)
    pub latency: [Histogram<u64>; 4],
    /// Time from a transaction's start (TCP connect included) to its first response byte, by
    /// [`Kind`]: full, resumed (1-RTT), 0-RTT (microseconds).
    pub ttfb_by_kind: [Histogram<u64>; 3],
    /// `--early-data`: first requests sent as early data, and the server's answers.
    pub early_offered: u64,
    pub early_accepted: u64,
    pub early_rejected: u64,
    /// Transactions that ended in each [`TIMELINE_MS`] interval since the run started:
    /// `[completed, failed]` (the report's throughput over time).
    pub timeline: Vec<[u64; 2]>,
    /// Each answered request's latency (microseconds), from when it started (the first: with
    /// its transaction, so connect and handshake count; the next ones: at the end of the think
    /// time before them) to its response's last byte. Think time never counts, nor an open-loop
    /// schedule's lag (which `latency[3]`, the total, has).
    pub request: Histogram<u64>,
    /// The same by the second (since the run started) in which each request started: p99
    /// before, during and after an event (a restart) from one run, exactly mergeable.
    pub request_by_second: Vec<Histogram<u64>>,
}

/// Width of one timeline interval: fine enough to chart a one-second run, and an hour-long one
/// is 36,000 pairs.
pub const TIMELINE_MS: u64 = 100;

impl Default for Stats {
    fn default() -> Self {
        let h = histogram;
        Self {
            full: 0,
            resumed: 0,
            resume_refused: 0,
            handshake_failed: 0,
            requests_ok: 0,
            requests_failed: 0,
            requests_unsent: 0,
            requests_expected: 0,
            by_status: BTreeMap::new(),
            errors: BTreeMap::new(),
            bytes: 0,
            negotiated: BTreeMap::new(),
            examples: BTreeMap::new(),
            transactions: 0,
            latency: [h(), h(), h(), h()],
            ttfb_by_kind: [h(), h(), h()],
            early_offered: 0,
            early_accepted: 0,
            early_rejected: 0,
            timeline: Vec::new(),
            request: h(),
            request_by_second: Vec::new(),
        }
    }
}

/// An empty latency histogram of the run's precision, for values up to [`HIGHEST_US`] (the
/// callers clamp). It starts small and grows to the largest value recorded: one of the full
/// range is 190 KB of zeroed counters, and every virtual client keeps eight, plus one per
/// second of the run; zeroing them (page faults included) cost the client about as much CPU
/// as its X25519. Bucket for bucket the same as one of the full range, so percentiles and
/// merges are unchanged.
pub fn histogram() -> Histogram<u64> {
    let mut h =
        Histogram::new_with_bounds(LOWEST_US, 2, SIGNIFICANT_FIGURES).expect("static bounds");
    h.auto(true);
    h
}

impl Stats {
    pub fn handshake(&mut self, h: Handshake) {
        match h {
            Handshake::Full => self.full += 1,
            Handshake::Resumed => self.resumed += 1,
            Handshake::ResumeRefused => {
                self.full += 1;
                self.resume_refused += 1;
            }
        }
    }

    /// Counts one finished transaction (see [`settle`] for the rules); returns how it settled.
    pub fn finish(&mut self, end: &End, requests_per_conn: u32) -> Settled {
        self.transactions += 1;
        self.requests_expected += requests_per_conn as u64;
        if let Some(class) = end.error {
            self.error(class);
        }
        let s = settle(end, requests_per_conn);
        if let Some(h) = s.handshake {
            self.handshake(h);
        }
        if let Some(accepted) = end.early.filter(|_| s.handshake.is_some()) {
            self.early_offered += 1;
            if accepted {
                self.early_accepted += 1;
            } else {
                self.early_rejected += 1;
            }
        }
        if let (Some(kind), Some(ttfb)) =
            (Kind::of(end).filter(|_| s.handshake.is_some()), end.ttfb)
        {
            let us = (ttfb.as_micros() as u64).clamp(LOWEST_US, HIGHEST_US);
            let _ = self.ttfb_by_kind[kind as usize].record(us);
        }
        if let Some(n) = s.negotiated {
            *self.negotiated.entry(n).or_default() += 1;
        }
        self.handshake_failed += s.handshake_failed as u64;
        self.requests_failed += s.unanswered;
        self.requests_unsent += s.unsent;
        s
    }

    /// One answered request that started `due_since_start` after the run began and took
    /// `latency` (think time excluded by the caller).
    pub fn request_latency(&mut self, due_since_start: Duration, latency: Duration) {
        let us = (latency.as_micros() as u64).clamp(LOWEST_US, HIGHEST_US);
        let _ = self.request.record(us);
        let second = due_since_start.as_secs() as usize;
        // bounded like the timeline: one histogram per second of the run
        if self.request_by_second.len() <= second {
            self.request_by_second.resize_with(second + 1, histogram);
        }
        let _ = self.request_by_second[second].record(us);
    }

    /// Keeps the first cause seen in `class` (longer causes are cut: this is a hint, not a log).
    pub fn example(&mut self, class: ErrorClass, mut detail: String) {
        if let std::collections::btree_map::Entry::Vacant(e) = self.examples.entry(class) {
            if let Some((cut, _)) = detail.char_indices().nth(200) {
                detail.truncate(cut);
            }
            e.insert(detail);
        }
    }

    /// Counts a transaction that ended `since_start` after the run began.
    pub fn ended(&mut self, since_start: Duration, completed: bool) {
        let i = (since_start.as_millis() as u64 / TIMELINE_MS) as usize;
        if self.timeline.len() <= i {
            self.timeline.resize(i + 1, [0, 0]);
        }
        self.timeline[i][usize::from(!completed)] += 1;
    }

    pub fn error(&mut self, class: ErrorClass) {
        *self.errors.entry(class).or_default() += 1;
    }

    /// Counts a response's status; whether it is a success (2xx, 3xx).
    pub fn status(&mut self, status: u16) -> bool {
        *self.by_status.entry(status).or_default() += 1;
        let ok = (200..400).contains(&status);
        if ok {
            self.requests_ok += 1;
        } else {
            self.requests_failed += 1;
        }
        ok
    }

    /// Records a phase's latency (saturating at the histogram's bound).
    pub fn latency(&mut self, phase: usize, d: Duration) {
        let us = (d.as_micros() as u64).clamp(LOWEST_US, HIGHEST_US);
        let _ = self.latency[phase].record(us);
    }

    pub fn merge(&mut self, o: &Stats) {
        self.full += o.full;
        self.resumed += o.resumed;
        self.resume_refused += o.resume_refused;
        self.handshake_failed += o.handshake_failed;
        self.requests_ok += o.requests_ok;
        self.requests_failed += o.requests_failed;
        self.requests_unsent += o.requests_unsent;
        self.requests_expected += o.requests_expected;
        for (k, v) in &o.by_status {
            *self.by_status.entry(*k).or_default() += v;
        }
        for (k, v) in &o.errors {
            *self.errors.entry(*k).or_default() += v;
        }
        self.bytes += o.bytes;
        for (k, v) in &o.examples {
            self.examples.entry(*k).or_insert_with(|| v.clone());
        }
        for (k, v) in &o.negotiated {
            *self.negotiated.entry(*k).or_default() += v;
        }
        self.transactions += o.transactions;
        for (a, b) in self.latency.iter_mut().zip(o.latency.iter()) {
            let _ = a.add(b);
        }
        for (a, b) in self.ttfb_by_kind.iter_mut().zip(o.ttfb_by_kind.iter()) {
            let _ = a.add(b);
        }
        self.early_offered += o.early_offered;
        self.early_accepted += o.early_accepted;
        self.early_rejected += o.early_rejected;
        add_timelines(&mut self.timeline, &o.timeline);
        let _ = self.request.add(&o.request);
        add_histograms(&mut self.request_by_second, &o.request_by_second);
    }
}

/// Adds `b` into `a` second by second (runs aligned at their start).
pub fn add_histograms(a: &mut Vec<Histogram<u64>>, b: &[Histogram<u64>]) {
    if a.len() < b.len() {
        a.resize_with(b.len(), histogram);
    }
    for (x, y) in a.iter_mut().zip(b) {
        let _ = x.add(y);
    }
}

/// Adds `b` into `a` interval by interval (runs aligned at their start).
pub fn add_timelines(a: &mut Vec<[u64; 2]>, b: &[[u64; 2]]) {
    if a.len() < b.len() {
        a.resize(b.len(), [0, 0]);
    }
    for (x, y) in a.iter_mut().zip(b) {
        x[0] += y[0];
        x[1] += y[1];
    }
}

/// Percentiles of one phase, in milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
    pub count: u64,
}

pub fn summary(h: &Histogram<u64>) -> Summary {
    let ms = |us: u64| us as f64 / 1000.0;
    Summary {
        p50: ms(h.value_at_quantile(0.50)),
        p90: ms(h.value_at_quantile(0.90)),
        p99: ms(h.value_at_quantile(0.99)),
        p999: ms(h.value_at_quantile(0.999)),
        max: ms(h.max()),
        mean: h.mean() / 1000.0,
        count: h.len(),
    }
}

/// Bounds and precision of every latency histogram (microseconds, 1 us to 1 h, 3 significant
/// figures): `bench merge` rebuilds histograms with exactly these.
pub const LOWEST_US: u64 = 1;
pub const HIGHEST_US: u64 = 3_600_000_000;
pub const SIGNIFICANT_FIGURES: u8 = 3;

/// A histogram in the JSON: `[value_us, count]` pairs, one per recorded HdrHistogram bucket
/// (the value is the bucket's highest equivalent value). Recording each pair (`record_n`) into
/// an empty histogram of the same bounds and precision lands every count in the same bucket,
/// so adding the pairs of several runs gives exactly the histogram of all of them: percentiles
/// of merged runs are exact, not averages of percentiles.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RawHistogram {
    pub format: String,
    pub unit: String,
    pub lowest: u64,
    pub highest: u64,
    pub significant_figures: u8,
    pub counts: Vec<[u64; 2]>,
}

pub const RAW_FORMAT: &str = "hdrhistogram-value-count-pairs";

pub fn raw(h: &Histogram<u64>) -> RawHistogram {
    RawHistogram {
        format: RAW_FORMAT.into(),
        unit: "us".into(),
        lowest: LOWEST_US,
        highest: HIGHEST_US,
        significant_figures: SIGNIFICANT_FIGURES,
        counts: h
            .iter_recorded()
            .map(|v| [v.value_iterated_to(), v.count_at_value()])
            .collect(),
    }
}

/// Rebuilds a histogram from its JSON form; refuses one of other bounds or precision, whose
/// buckets would not line up (the merge would no longer be exact).
pub fn from_raw(r: &RawHistogram) -> anyhow::Result<Histogram<u64>> {
    if r.format != RAW_FORMAT
        || r.unit != "us"
        || (r.lowest, r.highest, r.significant_figures)
            != (LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)
    {
        anyhow::bail!(
            "histogram `{}` in {} from {} to {} at {} significant figures: this baton reads \
             {RAW_FORMAT} in us from {LOWEST_US} to {HIGHEST_US} at {SIGNIFICANT_FIGURES}",
            r.format,
            r.unit,
            r.lowest,
            r.highest,
            r.significant_figures
        );
    }
    let mut h = histogram();
    for &[v, c] in &r.counts {
        // (a growing histogram would take it: the bounds are checked here)
        if v > h.highest_equivalent(HIGHEST_US) {
            anyhow::bail!("histogram value {v} us above its highest, {HIGHEST_US}");
        }
        h.record_n(v, c)?;
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_exact() {
        let mut a = Stats::default();
        let mut b = Stats::default();
        a.handshake(Handshake::Full);
        b.handshake(Handshake::ResumeRefused);
        b.handshake(Handshake::Resumed);
        a.status(200);
        b.status(503);
        b.error(ErrorClass::Tls);
        for i in 1..=1000u64 {
            a.latency(3, Duration::from_micros(i));
            b.latency(3, Duration::from_micros(i * 7));
        }
        let mut m = Stats::default();
        m.merge(&a);
        m.merge(&b);
        assert_eq!((m.full, m.resumed, m.resume_refused), (2, 1, 1));
        assert_eq!((m.requests_ok, m.requests_failed), (1, 1));
        assert_eq!(m.by_status[&503], 1);
        assert_eq!(m.latency[3].len(), 2000);
        // adding the raw pairs of two runs gives exactly the merged histogram (`bench merge`)
        let mut rebuilt = histogram();
        for run in [&a, &b] {
            rebuilt
                .add(from_raw(&raw(&run.latency[3])).unwrap())
                .unwrap();
        }
        assert!(rebuilt == m.latency[3]);
        for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(
                rebuilt.value_at_quantile(q),
                m.latency[3].value_at_quantile(q)
            );
        }
    }

    #[test]
    fn request_latency_by_second_and_unsent_add_up() {
        let mut a = Stats::default();
        let mut b = Stats::default();
        // a: one request due in second 0, one in second 2; b: one in second 1 (shorter run)
        a.request_latency(Duration::from_millis(10), Duration::from_millis(3));
        a.request_latency(Duration::from_millis(2500), Duration::from_millis(40));
        b.request_latency(Duration::from_millis(1999), Duration::from_millis(7));
        b.finish(
            &End {
                handshake_started: true,
                handshake: Some(Handshake::Resumed),
                first_byte: true,
                responses: 1,
                unsent: 2,
                error: Some(ErrorClass::Closed),
                ..End::default()
            },
            3,
        );
        assert_eq!(a.request_by_second.len(), 3);
        assert!(a.request_by_second[1].is_empty());
        let mut m = a.clone();
        m.merge(&b);
        assert_eq!(m.request.len(), 3);
        let per_second: Vec<u64> = m.request_by_second.iter().map(|h| h.len()).collect();
        assert_eq!(per_second, [1, 1, 1]);
        assert_eq!(m.request_by_second[2].max(), a.request_by_second[2].max());
        // unsent is neither ok nor failed; the connection is `closed`
        assert_eq!(
            (m.requests_unsent, m.requests_failed, m.requests_expected),
            (2, 0, 3)
        );
        assert_eq!(m.errors[&ErrorClass::Closed], 1);
    }

    #[test]
    fn timeline_counts_by_interval_and_adds() {
        let mut a = Stats::default();
        a.ended(Duration::from_millis(5), true);
        a.ended(Duration::from_millis(250), false);
        a.ended(Duration::from_millis(299), true);
        assert_eq!(a.timeline, vec![[1, 0], [0, 0], [1, 1]]);
        let mut b = Stats::default();
        b.ended(Duration::from_millis(120), true);
        a.merge(&b);
        assert_eq!(a.timeline, vec![[1, 0], [1, 0], [1, 1]]);
        let mut other = raw(&a.latency[0]);
        other.significant_figures = 2;
        assert!(from_raw(&other).is_err());
    }
}
