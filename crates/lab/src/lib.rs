//! The lab: local clusters of real `baton` processes, and the documents' experiments run against
//! them beside real baselines. `cluster.rs` starts a dispatcher and N agents as child processes
//! with generated certificates and keys; `up.rs` is `baton up` (`rollout.rs` and
//! `handover.rs`: what its admin endpoint does); `demo.rs` is `baton demo`;
//! `rig/` holds the capped servers, nginx, HAProxy, Redis and the delay proxy; `experiments/` is
//! `baton lab EXPERIMENT`, one file per experiment; `table.rs` prints their results.
//!
//! No `unsafe` but the CPU cap's `pre_exec` hooks (`rig/cap.rs`, where it says why).

#![deny(unsafe_code)]

pub mod cluster;
mod demo;
pub mod experiments;
pub mod handover;
pub mod hosts;
pub mod pki;
pub mod profile;
pub mod rig;
pub mod rollout;
mod signal;
pub mod soak;
pub mod table;
mod up;

pub use cluster::{Cluster, ClusterSpec, Store, Topology};
pub use demo::{demo, DemoArgs};
pub use experiments::{lab, LabArgs};
pub use rollout::{rollout_cli, RolloutArgs};
pub use up::{up, UpArgs};
