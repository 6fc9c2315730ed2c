//! `--threshold EXPR`: pass/fail criteria for CI, in the manner of k6's thresholds: the
//! grammar, its parser, and the verdicts as shown. Evaluation against a finished run is in
//! `verdicts.rs`. Plain functions of text.
//!
//! Grammar (whitespace around the comparator is allowed):
//!
//! ```text
//! EXPR    = METRIC OP VALUE
//! OP      = "<" | "<=" | ">" | ">="
//! METRIC  = [PHASE "."] STAT        latency; VALUE a duration: 200ms, 1.5s, 800us
//!         | "failed"                 VALUE N% (share of requests) or N (a count of requests)
//!         | "tps" | "rps" | "handshakes_per_sec"   VALUE per second (N or N/s)
//! PHASE   = connect | handshake | ttfb | total | request   (default: request)
//! STAT    = pN (0 < N <= 100: p50, p95, p99.9) | max | mean
//! ```
//!
//! A threshold whose figure the run did not measure (a latency with nothing answered, a
//! failure share of no requests) is crossed: a CI gate must not pass on a run that did nothing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The latency phases a threshold can name, as the JSON's `latency_ms` keys.
const PHASES: [&str; 5] = ["connect", "handshake", "ttfb", "total", "request"];

/// One parsed `--threshold`.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub metric: Metric,
    pub op: Op,
    /// In the metric's unit: milliseconds, a fraction of 1 (shown as %), a count, per second.
    pub limit: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    Latency {
        phase: &'static str,
        stat: Stat,
    },
    /// Failed requests as a share of the requests answered or failed.
    FailedShare,
    /// Failed requests, counted.
    FailedCount,
    Tps,
    Rps,
    /// Completed handshakes (full and resumed) per second.
    HandshakesPerSec,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stat {
    /// A percentile, 0 < p <= 100.
    Percentile(f64),
    Max,
    Mean,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = ">=")]
    Ge,
}

impl Op {
    fn text(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }

    pub fn holds(self, measured: f64, limit: f64) -> bool {
        match self {
            Op::Lt => measured < limit,
            Op::Le => measured <= limit,
            Op::Gt => measured > limit,
            Op::Ge => measured >= limit,
        }
    }
}

const METRICS_HELP: &str = "p50, p99, p99.9, max, mean (optionally after a phase: connect., \
     handshake., ttfb., total., request.), failed, tps, rps, handshakes_per_sec";

impl FromStr for Threshold {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let at = s
            .find(['<', '>'])
            .ok_or_else(|| format!("`{s}`: no comparator (<, <=, >, >=), as in p99<200ms"))?;
        let (name, rest) = (s[..at].trim(), &s[at..]);
        let (op, value) = if let Some(v) = rest.strip_prefix("<=") {
            (Op::Le, v)
        } else if let Some(v) = rest.strip_prefix(">=") {
            (Op::Ge, v)
        } else if let Some(v) = rest.strip_prefix('<') {
            (Op::Lt, v)
        } else {
            (Op::Gt, &rest[1..])
        };
        let value = value.trim();
        if value.is_empty() {
            return Err(format!("`{s}`: no value after `{}`", op.text()));
        }
        let metric = parse_metric(name).map_err(|e| format!("`{s}`: {e}"))?;
        let limit = parse_value(&metric, value).map_err(|e| format!("`{s}`: {e}"))?;
        let metric = match (metric, value.ends_with('%')) {
            (Metric::FailedCount, true) => Metric::FailedShare,
            (m, _) => m,
        };
        Ok(Threshold { metric, op, limit })
    }
}

fn parse_metric(name: &str) -> Result<Metric, String> {
    if name.is_empty() {
        return Err(format!("no metric before the comparator ({METRICS_HELP})"));
    }
    match name {
        "failed" => return Ok(Metric::FailedCount),
        "tps" => return Ok(Metric::Tps),
        "rps" => return Ok(Metric::Rps),
        "handshakes_per_sec" => return Ok(Metric::HandshakesPerSec),
        _ => {}
    }
    let (phase, stat) = match name.split_once('.') {
        Some((p, st)) if !p.starts_with('p') || PHASES.contains(&p) => {
            let phase = PHASES.iter().find(|x| **x == p).ok_or_else(|| {
                format!("unknown phase `{p}` (connect, handshake, ttfb, total, request)")
            })?;
            (*phase, st)
        }
        _ => ("request", name),
    };
    let stat = match stat {
        "max" => Stat::Max,
        "mean" => Stat::Mean,
        p => {
            let n: f64 = p
                .strip_prefix('p')
                .and_then(|n| n.parse().ok())
                .filter(|n: &f64| n.is_finite())
                .ok_or_else(|| format!("unknown metric `{name}` ({METRICS_HELP})"))?;
            if !(n > 0.0 && n <= 100.0) {
                return Err(format!("percentile `{p}` is not between p0 and p100"));
            }
            Stat::Percentile(n)
        }
    };
    Ok(Metric::Latency { phase, stat })
}

/// The limit in the metric's unit.
fn parse_value(metric: &Metric, value: &str) -> Result<f64, String> {
    let number = |n: &str, what: &str| -> Result<f64, String> {
        n.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| format!("`{value}` is not {what}"))
    };
    match metric {
        Metric::Latency { .. } => {
            let split = value
                .find(|c: char| !c.is_ascii_digit() && c != '.')
                .unwrap_or(value.len());
            let (n, unit) = value.split_at(split);
            let ms_per = match unit.trim() {
                "us" | "µs" => 0.001,
                "ms" => 1.0,
                "s" => 1000.0,
                "m" => 60_000.0,
                _ => {
                    return Err(format!(
                        "`{value}` is not a latency with its unit, like 200ms, 1.5s, 800us"
                    ))
                }
            };
            Ok(number(n, "a latency with its unit, like 200ms, 1.5s, 800us")? * ms_per)
        }
        Metric::FailedCount | Metric::FailedShare => match value.strip_suffix('%') {
            Some(p) => {
                let p = number(p, "a share like 1% or a count of requests like 5")?;
                if p > 100.0 {
                    return Err(format!("`{value}` is more than 100%"));
                }
                Ok(p / 100.0)
            }
            None => number(value, "a share like 1% or a count of requests like 5"),
        },
        Metric::Tps | Metric::Rps | Metric::HandshakesPerSec => number(
            value.strip_suffix("/s").unwrap_or(value),
            "a rate per second, like 500 or 500/s",
        ),
    }
}

impl fmt::Display for Stat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stat::Percentile(p) => write!(f, "p{p}"),
            Stat::Max => f.write_str("max"),
            Stat::Mean => f.write_str("mean"),
        }
    }
}

impl Metric {
    /// The canonical name, as the grammar reads it.
    fn name(&self) -> String {
        match self {
            Metric::Latency { phase, stat } => format!("{phase}.{stat}"),
            Metric::FailedShare | Metric::FailedCount => "failed".into(),
            Metric::Tps => "tps".into(),
            Metric::Rps => "rps".into(),
            Metric::HandshakesPerSec => "handshakes_per_sec".into(),
        }
    }

    pub fn unit(&self) -> &'static str {
        match self {
            Metric::Latency { .. } => "ms",
            Metric::FailedShare => "%",
            Metric::FailedCount => "requests",
            Metric::Tps | Metric::Rps | Metric::HandshakesPerSec => "/s",
        }
    }

    /// The figure as shown in `unit` (a share as a percentage).
    pub fn shown(&self, x: f64) -> f64 {
        match self {
            Metric::FailedShare => x * 100.0,
            _ => x,
        }
    }
}

/// The canonical text: parsing it gives the same threshold back.
impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.metric;
        let limit = m.shown(self.limit);
        let unit = match m {
            Metric::Latency { .. } => "ms",
            Metric::FailedShare => "%",
            Metric::Tps | Metric::Rps | Metric::HandshakesPerSec => "/s",
            Metric::FailedCount => "",
        };
        write!(f, "{}{}{limit}{unit}", m.name(), self.op.text())
    }
}

impl Serialize for Threshold {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Threshold {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `--threshold`, checked as clap reads it: a bad expression is a usage error (exit 2) naming
/// its bad part.
pub fn parse(s: &str) -> Result<Threshold, String> {
    s.parse()
}

/// How one threshold went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The threshold as written canonically (`request.p99<200ms`).
    pub threshold: String,
    /// The measured figure in `unit`; absent when the run did not measure it.
    pub measured: Option<f64>,
    /// The limit in `unit`.
    pub limit: f64,
    pub unit: String,
    pub passed: bool,
}

/// Whether every threshold passed.
pub fn all_passed(v: &[Verdict]) -> bool {
    v.iter().all(|v| v.passed)
}

/// The verdicts as the human summary shows them.
pub fn lines(v: &[Verdict]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    for (i, v) in v.iter().enumerate() {
        let label = if i == 0 { "thresholds" } else { "" };
        let measured = v
            .measured
            .map_or("not measured".to_string(), |m| format!("{m:.3} {}", v.unit));
        let verdict = if v.passed { "passed " } else { "CROSSED" };
        let _ = writeln!(
            o,
            "  {label:<11}  {verdict}  {}   (measured {measured})",
            v.threshold
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn t(s: &str) -> Threshold {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn grammar() {
        assert_eq!(
            t("p99<200ms"),
            Threshold {
                metric: Metric::Latency {
                    phase: "request",
                    stat: Stat::Percentile(99.0)
                },
                op: Op::Lt,
                limit: 200.0
            }
        );
        assert_eq!(t("handshake.p99.9 <= 1.5s").limit, 1500.0);
        assert_eq!(t("handshake.p99.9 <= 1.5s").op, Op::Le);
        assert_eq!(
            t("handshake.p99.9<=1.5s").metric,
            Metric::Latency {
                phase: "handshake",
                stat: Stat::Percentile(99.9)
            }
        );
        assert_eq!(t("total.max<800us").limit, 0.8);
        assert_eq!(t("failed<1%").metric, Metric::FailedShare);
        assert_eq!(t("failed<1%").limit, 0.01);
        assert_eq!(t("failed<=5").metric, Metric::FailedCount);
        assert_eq!(t("handshakes_per_sec>500").metric, Metric::HandshakesPerSec);
        assert_eq!(t("tps >= 20/s").op, Op::Ge);
        assert_eq!(t("rps>1e3").limit, 1000.0);
        assert_eq!(t("p50<=10ms").to_string(), "request.p50<=10ms");
        assert_eq!(t("failed<1%").to_string(), "failed<1%");
    }

    #[test]
    fn errors_name_the_bad_part() {
        for (bad, says) in [
            ("p99", "no comparator"),
            ("p99<", "no value"),
            ("<200ms", "no metric"),
            ("p99<200", "`200` is not a latency"),
            ("p99<2xx", "`2xx`"),
            ("p42x<1ms", "unknown metric `p42x`"),
            ("p0<1ms", "between p0 and p100"),
            ("p101<1ms", "between p0 and p100"),
            ("connekt.p99<1ms", "unknown phase `connekt`"),
            ("failed<101%", "more than 100%"),
            ("failed<lots", "`lots`"),
            ("tps>fast", "a rate per second"),
            ("latency<1ms", "unknown metric `latency`"),
            ("p99<-1ms", "`-1ms`"),
        ] {
            let e = bad.parse::<Threshold>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(
                e.contains(bad),
                "{bad}: the message quotes the expression: {e}"
            );
        }
    }

    fn metric() -> impl Strategy<Value = String> {
        prop_oneof![
            (
                prop::sample::select(vec!["", "connect.", "ttfb.", "total.", "request."]),
                prop_oneof![
                    (1u32..=1000).prop_map(|p| format!("p{}", p as f64 / 10.0)),
                    Just("max".to_string()),
                    Just("mean".to_string()),
                ],
                (0u32..100_000, prop::sample::select(vec!["us", "ms", "s"])),
            )
                .prop_map(|(ph, st, (v, u))| format!("{ph}{st}#{v}{u}")),
            (0u32..=100).prop_map(|p| format!("failed#{p}%")),
            (0u32..1000).prop_map(|n| format!("failed#{n}")),
            (
                prop::sample::select(vec!["tps", "rps", "handshakes_per_sec"]),
                0u32..100_000
            )
                .prop_map(|(m, v)| format!("{m}#{v}")),
        ]
    }

    proptest! {
        // any text: an answer, never a panic
        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<Threshold>();
        }

        // whatever is accepted reads back the same from its canonical text
        #[test]
        fn canonical_text_round_trips(
            m in metric(),
            op in prop::sample::select(vec!["<", "<=", ">", ">="]),
            space in prop::bool::ANY,
        ) {
            let op = if space { format!(" {op} ") } else { op.to_string() };
            let text = m.replace('#', &op);
            let a: Threshold = text.parse().unwrap();
            let b: Threshold = a.to_string().parse().unwrap();
            prop_assert_eq!(a.metric, b.metric);
            prop_assert_eq!(a.op, b.op);
            prop_assert!((a.limit - b.limit).abs() <= 1e-9 * a.limit.max(1.0));
        }

        // `<` and `>=` (and `>` and `<=`) split every measurement between them
        #[test]
        fn opposite_comparators_disagree(x in 0.0..1e6f64, limit in 0.0..1e6f64) {
            prop_assert_ne!(Op::Lt.holds(x, limit), Op::Ge.holds(x, limit));
            prop_assert_ne!(Op::Gt.holds(x, limit), Op::Le.holds(x, limit));
        }
    }
}
