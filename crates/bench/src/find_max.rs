//! `baton bench find-max`: the 2048-bit migration report's SSL TPS at zero loss in a steady state, found by
//! running open-loop steps. The decisions are `search.rs`'s; this shell holds each rate it asks
//! for with the ordinary runner, judges the step, shows it, and reports.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::config::{parse_duration, BenchArgs};
use crate::report::{self, Report};
use crate::runner;
use crate::search::{Criteria, Found, Limits, Measurement, Next, Search, Verdict};

/// A step passes only if it completed this share of the offered rate (a server that falls
/// behind builds a backlog: not a steady state). 5 %: more than a one-second step loses to
/// the transactions still in flight at its end.
const KEEP_UP: f64 = 0.95;

/// Virtual clients when -c is not given: an open loop needs rate x latency of them in flight.
const DEFAULT_CLIENTS: usize = 100;

/// `baton bench find-max URL`: the highest sustained rate at zero loss.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct FindMaxArgs {
    #[command(flatten)]
    pub bench: BenchArgs,
    /// Largest share of failed requests a step may have, in percent (the 2048-bit migration report: 0.001).
    #[arg(long, value_name = "PERCENT", default_value = "0.001")]
    pub max_loss: String,
    /// Largest p99 of the total latency a step may have (e.g. 50ms). Default: unbounded.
    #[arg(long, value_name = "DURATION")]
    pub max_p99: Option<String>,
    /// How long each step holds its rate (the 2048-bit migration report: 5m).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub steady: String,
    /// Passes in a row the final rate needs; their TPS spread is reported (the 2048-bit migration report: 3).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub repeat: u32,
    /// First rate tried, transactions per second.
    #[arg(long, value_name = "R", default_value_t = 100.0)]
    pub start_rate: f64,
    /// Lowest rate tried: below it the server is reported as failing every step.
    #[arg(long, value_name = "R", default_value_t = 1.0)]
    pub min_rate: f64,
    /// Highest rate tried: a server that takes it is reported as "at least".
    #[arg(long, value_name = "R", default_value_t = 100_000.0)]
    pub max_rate: f64,
    /// Stop when the highest pass and the lowest failure are this close, in percent.
    #[arg(long, value_name = "PERCENT", default_value = "5")]
    pub precision: String,
}

const AFTER_HELP: &str = "\
Each step runs the open loop (--rate) for --steady. A step passes when failed requests are at
most --max-loss, p99 of the total latency is at most --max-p99 (if given), and at least 95 % of
the offered rate completed (no growing backlog). The rate doubles from --start-rate until a
step fails, is bisected to --precision, then the highest pass must pass --repeat times in a row
(a failure there moves the search below it). -c defaults to 100 virtual clients here.

--json FILE: criteria, limits, every step (rate, phase, TPS, loss, p99, verdict) and the result
(rate, TPS of each repeat, mean, min, max, spread_pct, converged, capped). --report FILE.html:
the last repeat at the found rate.

Exit status: 0 when a rate passed, 1 when none did, 2 on a bad flag.";

/// One step, as shown and written.
#[derive(Debug, Serialize)]
struct Step {
    rate: f64,
    /// "search" or "repeat i/n".
    phase: String,
    #[serde(flatten)]
    measured: Measurement,
    loss_pct: f64,
    #[serde(flatten)]
    verdict: Verdict,
}

#[derive(Debug, Serialize)]
struct Output<'a> {
    url: &'a str,
    criteria: Criteria,
    limits: Limits,
    steady_s: f64,
    clients: usize,
    steps: &'a [Step],
    result: Summary<'a>,
}

#[derive(Debug, Serialize)]
struct Summary<'a> {
    #[serde(flatten)]
    found: &'a Found,
    tps_mean: f64,
    tps_min: f64,
    tps_max: f64,
    spread_pct: f64,
}

fn percent(s: &str, what: &str) -> anyhow::Result<f64> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .with_context(|| format!("--{what} `{s}`: a percentage like 0.001"))?;
    if !(0.0..=100.0).contains(&v) {
        bail!("--{what} `{s}`: between 0 and 100");
    }
    Ok(v / 100.0)
}

/// The run's settings from its flags; an error is a usage error.
fn settings(a: &FindMaxArgs) -> anyhow::Result<(std::time::Duration, Criteria, Limits)> {
    if a.bench.rate.is_some()
        || a.bench.connections.is_some()
        || a.bench.requests.is_some()
        || a.bench.duration.is_some()
    {
        bail!("find-max chooses the rate and holds each step for --steady: no --rate, -n, --connections or -d");
    }
    if !a.bench.threshold.is_empty() || a.bench.metrics.is_some() {
        bail!("--threshold and --metrics are for a run; find-max's criteria are --max-loss and --max-p99");
    }
    if !a.bench.sweep().is_empty() {
        bail!("find-max measures one setting: run it once per size, suite or key");
    }
    let steady = parse_duration(&a.steady)?;
    let criteria = Criteria {
        max_loss: percent(&a.max_loss, "max-loss")?,
        max_p99_ms: a
            .max_p99
            .as_deref()
            .map(parse_duration)
            .transpose()?
            .map(|d| d.as_secs_f64() * 1000.0),
        keep_up: KEEP_UP,
    };
    let precision = percent(&a.precision, "precision")?;
    if precision == 0.0 {
        bail!("--precision must be above 0");
    }
    if !(a.min_rate > 0.0 && a.min_rate <= a.start_rate && a.start_rate <= a.max_rate) {
        bail!("rates: 0 < --min-rate <= --start-rate <= --max-rate");
    }
    if a.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let mut limits = Limits {
        start: a.start_rate,
        min: a.min_rate,
        max: a.max_rate,
        precision,
        repeat: a.repeat,
        max_steps: 0,
    };
    // room for a server that is not a fixed capacity (repeats that fail) but never unbounded
    limits.max_steps = 2 * limits.steps_for_fixed_capacity();
    Ok((steady, criteria, limits))
}

pub fn find_max(mut a: FindMaxArgs) -> anyhow::Result<ExitCode> {
    let (steady, criteria, limits) = settings(&a).map_err(baton_ops::exit::invalid)?;
    a.bench.clients = a.bench.clients.or(Some(DEFAULT_CLIENTS));
    let html = a.bench.report.take();
    let json = a.bench.json.take();
    let mut base = a.bench.resolve()?;
    let quiet = base.quiet;
    base.connections = None;
    base.duration_s = Some(steady.as_secs_f64());
    base.quiet = true;

    // the clients run on threads of their own (see `runner`)
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new_spinner();
        b.set_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        b
    });
    let show = |line: &str| match &bar {
        Some(b) => b.println(line),
        None if !quiet => eprintln!("{line}"),
        None => {}
    };
    show(&format!("  {}", header()));
    let mut search = Search::new(limits);
    let mut steps = Vec::new();
    let mut last_pass: Option<Report> = None;
    let found = loop {
        let (rate, confirm) = match search.next() {
            Next::Done(f) => break f,
            Next::Measure { rate, confirm } => (rate, confirm),
        };
        let phase = confirm.map_or("search".to_string(), |(i, n)| format!("repeat {i}/{n}"));
        if let Some(b) = &bar {
            let (lo, hi) = search.bracket();
            let r = |x: Option<f64>| x.map_or("?".to_string(), |x| format!("{x:.1}"));
            b.set_message(format!(
                "step {}: {phase}, holding {rate:.1}/s for {} (passes up to {}, fails from {})",
                steps.len() + 1,
                a.steady,
                r(lo),
                r(hi)
            ));
        }
        let mut cfg = base.clone();
        cfg.rate = Some(rate);
        let cfg = Arc::new(cfg);
        let outcome = runtime.block_on(runner::run(cfg.clone(), false, None))?;
        let r = report::build(
            &cfg,
            &outcome.stats,
            outcome.elapsed.as_secs_f64(),
            0.0,
            BTreeMap::new(),
        );
        // over the step's window at least: a run whose last transaction was due early and
        // ended before the window closed did not take more than the offered rate
        let completed = r.latency_ms.get("total").map_or(0, |s| s.count);
        let measured = Measurement {
            requests: r.requests.ok + r.requests.failed,
            failed: r.requests.failed,
            tps: completed as f64 / outcome.elapsed.as_secs_f64().max(steady.as_secs_f64()),
            p99_ms: r.latency_ms.get("total").map_or(0.0, |s| s.p99),
        };
        let verdict = criteria.judge(rate, &measured);
        search.record(rate, verdict == Verdict::Pass, measured.tps);
        let step = Step {
            rate,
            phase,
            loss_pct: if measured.requests > 0 {
                measured.failed as f64 / measured.requests as f64 * 100.0
            } else {
                0.0
            },
            measured,
            verdict,
        };
        show(&format!("  {}", row(steps.len() + 1, &step)));
        if verdict == Verdict::Pass {
            last_pass = Some(r);
        }
        steps.push(step);
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let summary = Summary {
        found: &found,
        tps_mean: found.mean(),
        tps_min: if found.tps.is_empty() {
            0.0
        } else {
            found.min()
        },
        tps_max: found.max(),
        spread_pct: found.spread_pct(),
    };
    if !quiet {
        print!(
            "{}",
            human(&base.url, &criteria, &a.steady, &steps, &summary)
        );
    }
    if let Some(path) = json {
        let out = Output {
            url: &base.url,
            criteria,
            limits,
            steady_s: steady.as_secs_f64(),
            clients: base.clients,
            steps: &steps,
            result: summary,
        };
        std::fs::write(&path, serde_json::to_vec_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let (Some(path), Some(r)) = (html, last_pass.filter(|_| found.rate.is_some())) {
        std::fs::write(&path, crate::html::render(&r))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if found.rate.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn header() -> String {
    format!(
        "{:>4}  {:<12} {:>10} {:>10} {:>9} {:>9}  verdict",
        "step", "phase", "rate/s", "TPS", "loss %", "p99 ms"
    )
}

fn row(i: usize, s: &Step) -> String {
    let verdict = match s.verdict {
        Verdict::Pass => "pass".to_string(),
        Verdict::Loss(l) => format!("loss {:.4} %", l * 100.0),
        Verdict::Slow(p) => format!("p99 {p:.1} ms"),
        Verdict::Behind(x) => format!("behind ({:.0} % done)", x * 100.0),
        Verdict::Empty => "nothing ran".into(),
    };
    format!(
        "{i:>4}  {:<12} {:>10.1} {:>10.1} {:>9.4} {:>9.3}  {verdict}",
        s.phase, s.rate, s.measured.tps, s.loss_pct, s.measured.p99_ms
    )
}

fn human(url: &str, c: &Criteria, steady: &str, steps: &[Step], s: &Summary<'_>) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "baton bench find-max {url}  loss <= {} %, p99 {}, steady {steady}, {} repeats\n",
        c.max_loss * 100.0,
        c.max_p99_ms
            .map_or("unbounded".to_string(), |p| format!("<= {p} ms")),
        s.found.tps.len().max(1)
    );
    let _ = writeln!(o, "  {}", header());
    for (i, step) in steps.iter().enumerate() {
        let _ = writeln!(o, "  {}", row(i + 1, step));
    }
    let f = s.found;
    match f.rate {
        None => {
            let _ = writeln!(o, "\n  no rate passed (not even the lowest tried)");
        }
        Some(rate) => {
            let _ = writeln!(
                o,
                "\n  max SSL TPS  {:.1}{}  at {rate:.1}/s offered   {} repeats: min {:.1}  max {:.1}  spread {:.2} %",
                s.tps_mean,
                if f.capped { " (at least: --max-rate reached)" } else { "" },
                f.tps.len(),
                s.tps_min,
                s.tps_max,
                s.spread_pct
            );
        }
    }
    if !f.converged {
        let _ = writeln!(
            o,
            "  not converged: {} steps and the repeats never held",
            f.steps
        );
    }
    o
}
