//! `baton bench` (being written: issue 4).
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Target URL, e.g. https://127.0.0.1:8443/
    pub url: String,
}

pub fn run(_args: BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("baton bench is not built yet")
}
