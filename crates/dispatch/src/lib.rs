//! `baton dispatch`: the TLS-aware dispatcher of the CSSL paper (the RAgent) in front of the agents.
//! It reads a new connection's ClientHello without terminating TLS, picks an agent
//! (`route.rs`, a pure state machine), optionally prefixes a PROXY v2 header so the agent sees
//! the real client, and splices bytes both ways (`server.rs`). Health checks (`health.rs`) take
//! dead agents out; counters are served as Prometheus text (`metrics.rs`). With `--policy
//! handoff` a full handshake's session moves to the client's home agent afterwards:
//! `handoff.rs` is the shell around the protocol's state machine in `baton_wire::handoff`.
//! Agents are named by id and may come and go: `members.rs` is the roster and the plan from one
//! roster to another (pure), `roster.rs` applies it (link pools, the agents file), `admin.rs`
//! takes changes from operators.

#![forbid(unsafe_code)]

mod admin;
mod config;
mod handoff;
mod handover;
mod health;
pub mod members;
mod metrics;
mod roster;
pub mod route;
mod server;
mod splice;

pub use config::{DispatchArgs, DispatchConfig};
pub use route::{Policy, Reason, Router};

/// `baton dispatch`: runs until SIGTERM/SIGINT.
pub fn run(args: DispatchArgs) -> anyhow::Result<()> {
    let config = args.resolve()?;
    // One worker (`--workers 1`): a current-thread runtime. Every task runs on the thread that
    // owns the sockets, so nothing is woken across threads (no futex, no work stealing), and
    // a link connection's task runs after the client tasks that queued frames on it, so their
    // frames leave in one write (measured: 2.6 link writes per client instead of 3.6, and
    // about a fifth less CPU per connection than two workers on this 2-core machine).
    // `--workers N` (N > 1) is a multi-thread runtime, for a dispatcher that needs more than
    // one core.
    let mut builder = if config.workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(config.workers);
        b
    };
    let runtime = builder.thread_name("baton-dispatch").enable_all().build()?;
    runtime.block_on(server::run(config))
}
