//! Cluster operations on one machine: a local cluster of real `baton` processes (a dispatcher
//! and N agents with generated certificates and keys, `cluster.rs`), `baton up` to run one
//! (`up.rs`), and what its admin endpoint (`admin.rs`, `control.rs`) does to it while it
//! serves: a rolling restart of the agents (`rollout.rs`, and `baton rollout`, its client) and
//! a hot restart of the dispatchers, each replaced by a successor process (`restart.rs`).
//! `hosts.rs` puts each process in a network namespace of its own; `pki.rs` makes the
//! certificates.

#![forbid(unsafe_code)]

mod admin;
pub mod client;
pub mod cluster;
mod control;
pub mod hosts;
pub mod pki;
pub mod procs;
pub mod redis;
pub mod restart;
pub mod rollout;
pub mod signal;
mod up;

pub use cluster::{free_port, Cap, Cluster, ClusterSpec, Store, Topology};
pub use rollout::{rollout_cli, RolloutArgs};
pub use up::{up, UpArgs};
