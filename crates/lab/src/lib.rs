//! The lab: the documents' experiments, run against local clusters of real `baton` processes
//! (`baton_cluster`) beside real baselines. `demo.rs` is `baton demo`; `rig/` holds the capped
//! servers, nginx, HAProxy, Redis and the delay proxy; `experiments/` is `baton lab
//! EXPERIMENT`, one file per experiment; `table.rs` prints their results.
//!
//! No `unsafe` but the CPU cap's `pre_exec` hooks (`rig/cap.rs`, where it says why).

#![deny(unsafe_code)]

mod demo;
pub mod experiments;
pub mod profile;
pub mod rig;
pub mod soak;
pub mod table;

pub use demo::{demo, DemoArgs};
pub use experiments::{lab, LabArgs};
