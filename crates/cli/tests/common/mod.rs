//! Test support shared by the integration tests, one topic per file, all re-exported here:
//! `use common::*` brings in all of it. Processes, certificates, ports, caps and metrics come
//! from `baton-cluster` and `baton-lab` (and `baton-bench`'s scraper, `baton-ops`' /proc reader),
//! not copies.
#![allow(dead_code)]

mod browser;
mod client;
mod cpu;
pub mod early;
mod flood;
mod fs;
mod json;
mod metrics;
mod net;
mod pebble;
mod pki;
mod process;
pub mod recorder;
mod redis;
mod relay;
mod skip;
mod up;

// Each test binary uses only some of it.
#[allow(unused_imports)]
pub use {
    baton_cluster::cluster::peer_args, browser::*, client::*, cpu::*, flood::*, fs::*, json::*,
    metrics::*, net::*, pebble::*, pki::*, process::*, redis::*, relay::*, skip::*, up::*,
};
