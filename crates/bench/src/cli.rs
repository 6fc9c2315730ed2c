//! `baton bench` and its subcommands: `baton bench URL` runs a benchmark; `merge` and
//! `find-max` are built on it. Only the command line lives here.

use std::path::PathBuf;

use crate::config::BenchArgs;
use crate::find_max::FindMaxArgs;

/// `baton bench URL [OPTIONS]`, or `baton bench merge|find-max ...`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchCli {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub args: BenchArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Combine the --json results of runs made at the same time from several machines into
    /// one: counts add, histograms merge, percentiles are recomputed from them.
    Merge(MergeArgs),
    /// The 2048-bit migration report's SSL TPS at zero loss: the highest open-loop rate the server sustains with
    /// failed requests under --max-loss (and p99 under --max-p99), each step held --steady,
    /// the result confirmed --repeat times.
    FindMax(Box<FindMaxArgs>),
}

#[derive(clap::Args, Debug)]
pub struct MergeArgs {
    /// JSON results of `baton bench --json` (or of earlier merges).
    #[arg(value_name = "RUN.json", required = true, num_args = 1..)]
    pub runs: Vec<PathBuf>,
    /// Where to write the merged JSON.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Also write the merged run as a self-contained HTML report.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// No summary on standard output.
    #[arg(long)]
    pub quiet: bool,
    /// Pass/fail criterion on the merged run, as `baton bench --threshold` (repeatable); exit
    /// 1 when one is crossed.
    #[arg(long, value_name = "EXPR", value_parser = crate::threshold::parse)]
    pub threshold: Vec<crate::threshold::Threshold>,
}
