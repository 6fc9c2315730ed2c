//! The Baton TLS agent: terminates TLS 1.2 and 1.3 with rustls (aws-lc-rs), picks RSA or ECDSA
//! certificates per client, resumes sessions (session ids and tickets), and serves HTTP/1.1 and
//! HTTP/2 from a built-in benchmark responder or as a reverse proxy to a plain HTTP backend.
//!
//! Layout, bottom up: `config` (flags + TOML), `policy` (versions, suites, groups), `certs` +
//! `resolver` (which certificate for which hello), `sessions` (rustls' session seams over
//! `baton-session`), `metering` (crypto CPU-seconds), `early` (0-RTT decisions), `tls` (the
//! `ServerConfig`), `body` + `conn_info` + `http` + `proxy` (what is served), `h2frames` +
//! `h2bounds` + `h2watch` (the bounds on an HTTP/2 connection), `forwarded` (the forwarding
//! headers), `websocket`, `access_log`, `http_listen` (the plain-HTTP redirect), `metrics`,
//! `context` (what every connection shares), `transport` (what a connection runs on: the
//! socket or link stream, idle I/O, the TLS engine, the migrated stream), `migration` (session
//! migration: export, import), `conn` (the connection path: accept, waits, park, pace, early
//! data), `server` (listeners, signals).

#![forbid(unsafe_code)]

mod access_log;
mod acme;
mod body;
mod certdir;
mod certs;
mod certwatch;
mod challenges;
mod check;
mod config;
mod conn;
mod conn_info;
mod context;
mod early;
mod forwarded;
mod h2bounds;
mod h2frames;
mod h2watch;
mod http;
mod http_listen;
mod idle_body;
mod keysigner;
pub mod metering;
pub mod metrics;
mod migration;
pub mod ocsp;
mod policy;
mod pool;
mod proxy;
mod resolver;
mod route_config;
mod routing;
mod served;
mod server;
mod sessions;
mod stapler;
mod store;
mod tls;
mod transport;
mod upgrade;
mod upstream;
mod websocket;

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context;

pub use check::check;
pub use config::{
    AgentArgs, AgentConfig, ClientAuth, HumanDuration, KeyKind, SignerFallback, StoreKind,
};
pub use policy::parse_versions as parse_tls_versions;

/// `baton agent`: resolves the configuration and runs until SIGTERM.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    let config = args.resolve().map_err(baton_ops::exit::invalid)?;
    let runtime = baton_ops::runtime::for_workers(config.workers, "baton-agent")
        .context("starting runtime")?;
    runtime.block_on(server::run(config))
}

/// `baton ticket-key`: add a fresh ticket key to a key file.
#[derive(clap::Args, Debug)]
pub struct TicketKeyArgs {
    /// Key file to update (created if missing). The new key goes first (it seals new tickets);
    /// older keys stay to open tickets already issued. Without --out, print one key line.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Older keys kept in the file after adding the new one.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub keep: usize,
}

pub fn ticket_key_command(args: TicketKeyArgs) -> anyhow::Result<()> {
    let line = baton_session::generate_key_line()?;
    let Some(path) = args.out else {
        println!("{line}");
        return Ok(());
    };
    // A symlink could point the new keys (or the read of the old ones) anywhere.
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
        anyhow::bail!(
            "{} is a symbolic link; refusing to write keys through it",
            path.display()
        );
    }
    let old = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let kept: Vec<&str> = old
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .take(args.keep)
        .collect();
    let mut text = format!("# baton ticket keys: first line seals, all open\n{line}\n");
    for l in kept {
        text.push_str(l);
        text.push('\n');
    }
    // Written to a private temporary file and renamed, so a reloading agent never reads half
    // a file and the keys are never world-readable.
    let tmp = path.with_extension("tmp");
    {
        use std::os::unix::fs::OpenOptionsExt;
        // A fresh file, always: one left over (or planted, or a symlink) keeps its own mode
        // and target, and create_new neither reuses nor follows it.
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", tmp.display()));
            }
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}
