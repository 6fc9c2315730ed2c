//! `baton bench`: how many TLS transactions per second a server takes, with the handshake mix,
//! suites and keys its users really bring, counted exactly as negotiated.
//!
//! Layout: `config` (flags + TOML), `tls` (client configs, per-virtual-client sessions),
//! `engine` (the TLS engine seam: rustls or `openssl_engine`, the system libssl),
//! `accounting` (full/resumed/refused, and dealing connections to clients so mixes are exact),
//! `transaction` (one connection, phase by phase), `http1` (response framing, sans-IO),
//! `runner` (closed and open loop), `scenario` (scenario files, HAR import), `redact` (what a
//! scenario keeps of credentials), `stats` (counters, histograms), `scrape` (server
//! metrics), `report` (JSON and the human summary), `html` + `svg` (the HTML report), `merge`
//! (runs of several machines as one), `search` + `find_max` (the highest rate at zero loss),
//! `cli` (the subcommands), `fuzzing` (the fuzz targets' entry points).
//!
//! `baton record`, the browser proxy that writes scenario files, is the `baton-recorder`
//! crate; it uses `scenario` and `redact` from here.

// No `unsafe` but two calls whose only API is unsafe, each allowed where it is (OpenSSL's
// `set_session`, a setsockopt that neither socket2 nor rustix has).
#![deny(unsafe_code)]

mod accounting;
mod cli;
mod config;
mod engine;
mod find_max;
pub mod fuzzing;
mod html;
mod http1;
mod live;
mod merge;
mod openssl_engine;
pub mod redact;
mod report;
mod runner;
pub mod scenario;
pub mod scrape;
mod search;
mod stats;
pub mod svg;
mod sweep;
mod sweep_run;
mod threshold;
mod tls;
mod transaction;
mod verdicts;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

pub use cli::{BenchCli, BenchCommand, MergeArgs};
pub use config::{parse_duration, BenchArgs, BenchConfig};
pub use find_max::FindMaxArgs;
pub use report::Report;
pub use scenario::{main as scenario_main, ScenarioCli};
pub use scrape::parse as parse_metrics;
pub use threshold::{Threshold, Verdict};
pub use tls::any_certificate;

/// `baton bench ...`: a run, or one of its subcommands.
pub fn main(cli: BenchCli) -> anyhow::Result<ExitCode> {
    match cli.command {
        None => run(cli.args),
        Some(BenchCommand::Merge(m)) => merge_files(m),
        Some(BenchCommand::FindMax(f)) => find_max::find_max(*f),
    }
}

/// `baton bench merge`: reads the runs, prints the merged summary, writes `--out`.
pub fn merge_files(a: MergeArgs) -> anyhow::Result<ExitCode> {
    let mut runs = Vec::new();
    for path in &a.runs {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()));
        let r: Report = bytes
            .and_then(|b| {
                serde_json::from_slice(&b)
                    .with_context(|| format!("{}: not a baton bench --json result", path.display()))
            })
            .map_err(baton_ops::exit::invalid)?;
        runs.push(r);
    }
    let mut merged = merge::merge(&runs)?;
    merged.thresholds = verdicts::evaluate(&a.threshold, &merged);
    if !a.quiet {
        print!("{}", report::human(&merged));
    }
    write_outputs(&merged, a.out.as_deref(), a.report.as_deref())?;
    Ok(if threshold::all_passed(&merged.thresholds) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(baton_ops::exit::FAILED)
    })
}

/// Writes the JSON and the HTML report, each when asked for.
fn write_outputs(
    r: &Report,
    json: Option<&std::path::Path>,
    html: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(r)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = html {
        std::fs::write(path, html::render(r))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `baton bench`: runs, prints the summary, writes `--json`. Exit code 1 when no transaction
/// succeeded, so scripts notice a dead target.
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let args = args.load().map_err(baton_ops::exit::invalid)?;
    let sweep = args.sweep();
    if !sweep.is_empty() {
        return run_sweep(args, &sweep);
    }
    let cfg = Arc::new(args.resolve().map_err(baton_ops::exit::invalid)?);
    let live = serve_live(&cfg)?;
    let mut report = execute_live(cfg.clone(), live)?;
    report.thresholds = verdicts::evaluate(&cfg.thresholds, &report);
    // the summary first: a run is not lost to an unwritable --json path
    if !cfg.quiet {
        print!("{}", report::human(&report));
    }
    write_outputs(&report, cfg.json.as_deref(), cfg.report.as_deref())?;
    Ok(exit_code(&report))
}

/// 1 when no request succeeded (a dead target) or a `--threshold` was crossed.
fn exit_code(r: &Report) -> ExitCode {
    if r.requests.ok == 0 || !threshold::all_passed(&r.thresholds) {
        ExitCode::from(baton_ops::exit::FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// `--metrics ADDR`: the live counters, served from now until the process ends.
fn serve_live(cfg: &BenchConfig) -> anyhow::Result<Option<Arc<live::Live>>> {
    let Some(addr) = cfg.metrics else {
        return Ok(None);
    };
    let (live, registry) = live::Live::new();
    let bound = live::serve(addr, registry).map_err(baton_ops::exit::invalid)?;
    if !cfg.quiet {
        eprintln!("live metrics at http://{bound}/metrics");
    }
    Ok(Some(live))
}

/// A matrix of runs (`--body-size`, `[sweep]`): one after the other, one table at the end;
/// `--json` holds every run. Exit code 1 when some run had no successful request.
fn run_sweep(args: BenchArgs, sweep: &sweep::Sweep) -> anyhow::Result<ExitCode> {
    let cells = sweep.cells();
    let quiet = args.quiet;
    let (json, html) = (args.json.clone(), args.report.clone());
    if html.is_some() {
        let e = anyhow::anyhow!("--report is for one run; a sweep writes its table and --json");
        return Err(baton_ops::exit::invalid(e));
    }
    let mut results = Vec::new();
    let mut live = None;
    for (i, cell) in cells.iter().enumerate() {
        let mut cfg = sweep_run::apply(&args, cell)
            .and_then(|a| a.resolve())
            .map_err(baton_ops::exit::invalid)?;
        cfg.quiet = true;
        if i == 0 {
            // one endpoint for the whole sweep: its counters add the runs up
            live = serve_live(&BenchConfig {
                quiet,
                ..cfg.clone()
            })?;
        }
        let what: Vec<String> = cell.iter().map(|(k, v)| format!("{k} {v}")).collect();
        if !quiet {
            eprintln!("run {}/{}: {}", i + 1, cells.len(), what.join(", "));
        }
        let mut r = execute_live(Arc::new(cfg.clone()), live.clone())?;
        r.thresholds = verdicts::evaluate(&cfg.thresholds, &r);
        if !quiet && !threshold::all_passed(&r.thresholds) {
            eprint!("{}", threshold::lines(&r.thresholds));
        }
        results.push((cell.clone(), r));
    }
    if !quiet {
        print!("{}", sweep_run::table(&results));
    }
    if let Some(path) = json {
        let runs: Vec<serde_json::Value> = results
            .iter()
            .map(|(cell, r)| {
                let axes: BTreeMap<&str, &str> =
                    cell.iter().map(|(k, v)| (*k, v.as_str())).collect();
                serde_json::json!({ "sweep": axes, "report": r })
            })
            .collect();
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&serde_json::json!({ "runs": runs }))?,
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(
        if results
            .iter()
            .all(|(_, r)| exit_code(r) == ExitCode::SUCCESS)
        {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(baton_ops::exit::FAILED)
        },
    )
}

/// Runs a benchmark and returns its report (for `baton demo` and the lab).
pub fn execute(cfg: Arc<BenchConfig>) -> anyhow::Result<Report> {
    execute_live(cfg, None)
}

/// [`execute`], updating `live` (`--metrics`) as it goes.
fn execute_live(cfg: Arc<BenchConfig>, live: Option<Arc<live::Live>>) -> anyhow::Result<Report> {
    // the clients run on threads of their own (see `runner`); this one scrapes and waits
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut before = BTreeMap::new();
        for url in &cfg.server_metrics {
            before.insert(url.clone(), scrape::scrape(url).await?);
        }
        let cpu0 = cpu_seconds();
        let progress = !cfg.quiet && std::io::stderr().is_terminal();
        let outcome = runner::run(cfg.clone(), progress, live).await?;
        let cpu = cpu_seconds() - cpu0;
        let mut server = BTreeMap::new();
        for (url, b) in &before {
            // a server that went away during the run does not cost the client's results
            match scrape::scrape(url).await {
                Ok(after) => {
                    server.insert(url.clone(), scrape::delta(b, &after));
                }
                Err(e) => tracing::warn!("--server-metrics after the run: {e:#}"),
            }
        }
        Ok(report::build(
            &cfg,
            &outcome.stats,
            outcome.elapsed.as_secs_f64(),
            cpu,
            server,
        ))
    })
}

/// User + system CPU time of this process (every thread), as getrusage(RUSAGE_SELF) adds
/// them up.
fn cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}
