//! The lab: local clusters of real `baton` processes, and (later) the documents' experiments
//! run against them. `cluster.rs` starts a dispatcher and N agents as child processes with
//! generated certificates and keys; `up.rs` is `baton up`; `demo.rs` is `baton demo`.

pub mod cluster;
mod demo;
pub mod pki;
mod up;

pub use cluster::{Cluster, ClusterSpec, Store};
pub use demo::{demo, DemoArgs};
pub use up::{up, UpArgs};
