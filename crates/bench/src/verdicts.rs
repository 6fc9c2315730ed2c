//! Each `--threshold` against a finished run: a plain function of the thresholds and the
//! [`Report`].

use crate::report::Report;
use crate::stats::from_raw;
use crate::threshold::{Metric, Stat, Threshold, Verdict};

/// Each threshold against the run.
pub fn evaluate(thresholds: &[Threshold], r: &Report) -> Vec<Verdict> {
    thresholds
        .iter()
        .map(|t| {
            let measured = measure(&t.metric, r);
            Verdict {
                threshold: t.to_string(),
                measured: measured.map(|x| t.metric.shown(x)),
                limit: t.metric.shown(t.limit),
                unit: t.metric.unit().into(),
                passed: measured.is_some_and(|x| t.op.holds(x, t.limit)),
            }
        })
        .collect()
}

/// The run's figure for `m`, in the threshold's unit (ms, fraction, count, per second).
fn measure(m: &Metric, r: &Report) -> Option<f64> {
    let per_sec = |x: u64| (r.duration_s > 0.0).then(|| x as f64 / r.duration_s);
    match m {
        Metric::Latency { phase, stat } => {
            let h = from_raw(r.histograms.get(*phase)?).ok()?;
            if h.is_empty() {
                return None;
            }
            let us = match stat {
                Stat::Percentile(p) => h.value_at_quantile(p / 100.0) as f64,
                Stat::Max => h.max() as f64,
                Stat::Mean => h.mean(),
            };
            Some(us / 1000.0)
        }
        Metric::FailedShare => {
            let n = r.requests.ok + r.requests.failed;
            (n > 0).then(|| r.requests.failed as f64 / n as f64)
        }
        Metric::FailedCount => Some(r.requests.failed as f64),
        Metric::Tps => Some(r.tps),
        Metric::Rps => Some(r.rps),
        Metric::HandshakesPerSec => per_sec(r.handshakes.full + r.handshakes.resumed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threshold::{all_passed, lines};

    fn t(s: &str) -> Threshold {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn report() -> Report {
        let mut s = crate::stats::Stats::default();
        for ms in 1..=100u64 {
            s.request.record(ms * 1000).unwrap();
        }
        s.requests_ok = 99;
        s.requests_failed = 1;
        s.full = 300;
        s.resumed = 200;
        let cfg = crate::config::BenchArgs {
            url: Some("https://127.0.0.1:1/".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        crate::report::build(&cfg, &s, 2.0, 0.1, Default::default())
    }

    #[test]
    fn evaluation() {
        let r = report();
        let v = evaluate(
            &[
                t("p50<=51ms"),
                t("p99<99ms"),
                t("max<=101ms"),
                t("failed<1%"),
                t("failed<=1%"),
                t("failed<2"),
                t("handshakes_per_sec>=250"),
                t("handshakes_per_sec>250"),
                t("handshake.p99<1s"),
            ],
            &r,
        );
        let passed: Vec<bool> = v.iter().map(|v| v.passed).collect();
        assert_eq!(
            passed,
            [true, false, true, false, true, true, true, false, false]
        );
        assert_eq!(v[3].measured, Some(1.0));
        assert_eq!(v[3].unit, "%");
        assert_eq!(v[6].measured, Some(250.0));
        // nothing measured for the handshake phase: crossed, and said so
        assert_eq!(v[8].measured, None);
        assert!(lines(&v).contains("CROSSED  request.p99<99ms"));
        assert!(lines(&v).contains("not measured"));
        assert!(!all_passed(&v));
        assert!(all_passed(&v[..1]));
    }
}
