//! `baton bench`: how many TLS transactions per second a server takes, with the handshake mix,
//! suites and keys its users really bring, counted exactly as negotiated.
//!
//! Layout: `config` (flags + TOML), `tls` (client configs, per-virtual-client sessions),
//! `accounting` (full/resumed/refused, and dealing connections to clients so mixes are exact),
//! `transaction` (one connection, phase by phase), `http1` (response framing, sans-IO),
//! `runner` (closed and open loop), `stats` (counters, histograms), `scrape` (server
//! metrics), `report` (JSON and the human summary).

mod accounting;
mod config;
mod http1;
mod report;
mod runner;
mod scrape;
mod stats;
mod tls;
mod transaction;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

pub use config::{BenchArgs, BenchConfig};
pub use report::Report;

/// `baton bench`: runs, prints the summary, writes `--json`. Exit code 1 when no transaction
/// succeeded, so scripts notice a dead target.
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let cfg = Arc::new(args.resolve()?);
    let report = execute(cfg.clone())?;
    // the summary first: a run is not lost to an unwritable --json path
    if !cfg.quiet {
        print!("{}", report::human(&report));
    }
    if let Some(path) = &cfg.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(if report.requests.ok == 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs a benchmark and returns its report (for `baton demo` and the lab).
pub fn execute(cfg: Arc<BenchConfig>) -> anyhow::Result<Report> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.workers)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut before = BTreeMap::new();
        for url in &cfg.server_metrics {
            before.insert(url.clone(), scrape::scrape(url).await?);
        }
        let cpu0 = cpu_seconds();
        let progress = !cfg.quiet && std::io::stderr().is_terminal();
        let outcome = runner::run(cfg.clone(), progress).await?;
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

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass; zeroed is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
