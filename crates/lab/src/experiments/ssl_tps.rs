//! What `key-sizes` and `suites` share: one capped server (nginx or a Baton agent) with a given
//! key, loaded with new connections only, reporting SSL TPS and — the figure that survives a
//! shared, noisy machine — new connections per server CPU-second.

use std::path::Path;

use baton_bench::BenchArgs;

use crate::rig::{Lab, Sut};
use baton_cluster::pki::KeyKind;

/// A single server of implementation `server` (`nginx` or `baton`) with `key`; `ciphers` is
/// nginx's `ssl_ciphers` when set.
pub fn single(
    lab: &Lab,
    server: &str,
    name: &str,
    key: KeyKind,
    www: &Path,
    ciphers: Option<String>,
) -> anyhow::Result<Sut> {
    match server {
        "nginx" => Sut::nginx_servers(lab, name, 1, key, www, ciphers, None),
        _ => Sut::baton_single(lab, name, key, &[]),
    }
}

/// Whether nginx rows can run (or must: `BATON_REQUIRE_SERVERS`).
pub fn nginx_ok() -> bool {
    crate::rig::nginx::available() || std::env::var_os("BATON_REQUIRE_SERVERS").is_some()
}

/// New connections only, TLS 1.2 unless `version` says otherwise.
pub fn new_connections(body: usize, n: u64, version: &str) -> BenchArgs {
    BenchArgs {
        url: Some(format!("https://{{addr}}/bytes/{body}")),
        connections: Some(n),
        clients: Some(20),
        resume: Some("none".into()),
        tls_version: Some(version.into()),
        timeout: Some("10s".into()),
        ..Default::default()
    }
}

/// Transactions per CPU-second of the servers.
pub fn per_cpu_second(run: &crate::rig::Run) -> Option<f64> {
    run.server_cpu_per_tx_ms()
        .filter(|ms| *ms > 0.0)
        .map(|ms| 1e3 / ms)
}
