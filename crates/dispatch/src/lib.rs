//! `baton dispatch`: the TLS-aware dispatcher of the CSSL paper (the RAgent) in front of the agents.
//! It reads a new connection's ClientHello without terminating TLS, picks an agent
//! (`route.rs`, a pure state machine), optionally prefixes a PROXY v2 header so the agent sees
//! the real client, and splices bytes both ways (`server.rs`). Health checks (`health.rs`) take
//! dead agents out; counters are served as Prometheus text (`metrics.rs`). With `--policy
//! handoff` a full handshake's session moves to the client's home agent afterwards:
//! `migration.rs` pumps the protocol's state machine (`baton_migrate`). `restart/` replaces
//! this process by a successor without dropping a connection (hot restart); `context.rs` is
//! the state every task shares.
//! Agents are named by id and may come and go: `members.rs` is the roster and the plan from one
//! roster to another (pure), `roster.rs` applies it (link pools, the agents file), `admin.rs`
//! takes changes from operators.

#![forbid(unsafe_code)]

mod admin;
mod check;
mod config;
mod context;
mod health;
pub mod members;
mod metrics;
mod migration;
mod notify;
mod restart;
mod roster;
pub mod route;
mod server;
mod splice;

pub use check::{check, check_agents_file};
pub use config::{DispatchArgs, DispatchConfig};
pub use route::{Policy, Reason, Router};

/// `baton dispatch`: runs until SIGTERM/SIGINT.
pub fn run(args: DispatchArgs) -> anyhow::Result<()> {
    let config = args.resolve().map_err(baton_ops::exit::invalid)?;
    // `--workers 1`: a current-thread runtime, the cheapest per connection (see
    // `baton_ops::runtime`: 2.6 link writes per client instead of 3.6, about a fifth less CPU
    // per connection than two workers on this 2-core machine).
    let runtime = baton_ops::runtime::for_workers(config.workers, "baton-dispatch")?;
    runtime.block_on(server::run(config))
}
