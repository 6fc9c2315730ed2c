//! File descriptors and resident memory of every process, from /proc, once a second; and the
//! judgement of growth (pure, tested): a process must end, after the quiet period, within a
//! tolerance of where it started (after the warm-up, under the same load).

use std::time::Duration;

/// Open descriptors the end may exceed the start by: a few listener, link or replication
/// connections re-established in another order, and the Redis client's reconnection.
pub const FD_TOLERANCE: u64 = 16;
/// Resident memory the end may exceed the start by, relative: session caches keep filling
/// with the load's new sessions all run long (LRU-bounded, not a leak).
pub const RSS_TOLERANCE: f64 = 0.25;
/// ... and absolute, whichever is larger (small processes, allocator arenas).
pub const RSS_TOLERANCE_BYTES: u64 = 8 << 20;

/// One sample of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub t: Duration,
    pub pid: u32,
    pub fds: u64,
    pub rss: u64,
}

/// Reads `pid`'s descriptor count and RSS; `None` once it is gone (or stopped mid-read).
pub fn sample(pid: u32, t: Duration) -> Option<Sample> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Sample {
        t,
        pid,
        fds,
        rss: baton_ops::process::rss_bytes_of(pid)?,
    })
}

/// Start, peak and end of one process slot (an agent and its restarts are one slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Span {
    pub fds_start: u64,
    pub fds_peak: u64,
    pub fds_end: u64,
    pub rss_start: u64,
    pub rss_peak: u64,
    pub rss_end: u64,
    /// Different processes seen in the slot (1 + restarts).
    pub pids: usize,
}

impl Span {
    /// `samples` in time order; the start is the first sample at or after `start` (the end of
    /// the warm-up), the end the last one. `None` without samples in range.
    pub fn of(samples: &[Sample], start: Duration) -> Option<Span> {
        let from = samples.iter().position(|s| s.t >= start)?;
        let first = samples[from];
        let last = *samples.last()?;
        let mut pids: Vec<u32> = samples.iter().map(|s| s.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        Some(Span {
            fds_start: first.fds,
            fds_peak: samples[from..].iter().map(|s| s.fds).max()?,
            fds_end: last.fds,
            rss_start: first.rss,
            rss_peak: samples[from..].iter().map(|s| s.rss).max()?,
            rss_end: last.rss,
            pids: pids.len(),
        })
    }

    /// Why this process grew beyond the tolerances, if it did.
    pub fn growth(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.fds_end > self.fds_start + FD_TOLERANCE {
            why.push(format!(
                "fds {} -> {} (more than +{FD_TOLERANCE})",
                self.fds_start, self.fds_end
            ));
        }
        let allowed = ((self.rss_start as f64 * RSS_TOLERANCE) as u64).max(RSS_TOLERANCE_BYTES);
        if self.rss_end > self.rss_start + allowed {
            why.push(format!(
                "RSS {:.1} -> {:.1} MiB (more than +{:.1})",
                mib(self.rss_start),
                mib(self.rss_end),
                mib(allowed)
            ));
        }
        (!why.is_empty()).then(|| why.join(", "))
    }
}

pub fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: u64, pid: u32, fds: u64, rss_mib: u64) -> Sample {
        Sample {
            t: Duration::from_secs(t),
            pid,
            fds,
            rss: rss_mib << 20,
        }
    }

    #[test]
    fn span_starts_after_the_warmup_and_counts_restarts() {
        let v = [
            s(1, 10, 5, 10),
            s(8, 10, 20, 40),
            s(9, 10, 90, 60),
            s(10, 11, 12, 20),
            s(20, 11, 22, 45),
        ];
        let sp = Span::of(&v, Duration::from_secs(8)).unwrap();
        assert_eq!((sp.fds_start, sp.fds_peak, sp.fds_end), (20, 90, 22));
        assert_eq!(
            (sp.rss_start, sp.rss_peak, sp.rss_end),
            (40 << 20, 60 << 20, 45 << 20)
        );
        assert_eq!(sp.pids, 2);
        assert_eq!(sp.growth(), None);
        assert!(Span::of(&v, Duration::from_secs(30)).is_none());
    }

    #[test]
    fn growth_beyond_the_tolerances_is_named() {
        let fds = Span::of(&[s(0, 1, 20, 40), s(9, 1, 37, 40)], Duration::ZERO).unwrap();
        assert!(fds.growth().unwrap().contains("fds 20 -> 37"));
        let rss = Span::of(&[s(0, 1, 20, 100), s(9, 1, 20, 126)], Duration::ZERO).unwrap();
        assert!(rss.growth().unwrap().contains("RSS"));
        let small = Span::of(&[s(0, 1, 20, 4), s(9, 1, 36, 12)], Duration::ZERO).unwrap();
        assert_eq!(
            small.growth(),
            None,
            "+8 MiB allowed even for small processes"
        );
    }

    #[test]
    fn reads_this_process() {
        let me = sample(std::process::id(), Duration::ZERO).unwrap();
        assert!(me.fds >= 3 && me.rss > 1 << 20, "{me:?}");
    }
}
