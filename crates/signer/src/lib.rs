//! Private-key offload: `baton signer` holds TLS private keys in a process of its own (the shape
//! of PKCS#11 offload and of keyless TLS) and signs for agents over an authenticated unix
//! socket; `baton agent --key-signer unix:PATH` uses [`client::RemoteKey`] instead of a key.
//!
//! Layout: `protocol` (sans-IO frames, fuzzed), `auth` (peer credentials + mutual HMAC
//! challenge), `keys` (keys by SPKI hash, PEM backend), `server` (the tokio shell: bounded
//! queue, signing threads, batched answers), `pkcs11` (keys in a PKCS#11 token), `client` (blocking pool + rustls `SigningKey`),
//! `metrics` (the agent's signer counters).

#![forbid(unsafe_code)]

pub mod auth;
pub mod client;
pub mod fuzzing;
pub mod keys;
pub mod metrics;
pub mod pkcs11;
pub mod protocol;
pub mod server;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

/// `baton signer`: hold private keys and sign for agents.
#[derive(clap::Args, Debug, Clone)]
pub struct SignerArgs {
    /// Socket to serve on, `unix:PATH` (created mode 0600, or 0660 with --allow-own-group; a
    /// stale socket is replaced).
    #[arg(long, value_name = "unix:PATH")]
    pub listen: String,

    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1) to hold (repeatable). Agents find a key by
    /// their certificate's public key.
    #[arg(long, value_name = "PEM")]
    pub key: Vec<PathBuf>,

    /// PKCS#11 module (shared library) whose token holds keys to serve as well, e.g.
    /// /usr/lib/softhsm/libsofthsm2.so. Needs --pkcs11-token and --pkcs11-pin-file.
    #[arg(long, value_name = "PATH")]
    pub pkcs11_module: Option<PathBuf>,

    /// Label of the PKCS#11 token; every RSA and P-256/P-384 ECDSA signing key on it is served.
    #[arg(long, value_name = "LABEL")]
    pub pkcs11_token: Option<String>,

    /// File holding the token's user PIN.
    #[arg(long, value_name = "FILE")]
    pub pkcs11_pin_file: Option<PathBuf>,

    /// Shared secret agents must prove they hold (at least 32 bytes, e.g. `openssl rand -hex
    /// 32`; mode 0600). The same file goes to `baton agent --key-signer-auth-key-file`.
    #[arg(long, value_name = "FILE")]
    pub auth_key_file: PathBuf,

    /// Uid allowed to connect (repeatable or comma separated). Default: the signer's own uid.
    #[arg(long, value_name = "UID", value_delimiter = ',')]
    pub allow_uid: Vec<u32>,

    /// Also allow peers whose primary group is the signer's own, and create the socket mode
    /// 0660: an agent running as another user that shares the signer's group (the units in
    /// deploy/systemd give the signer a user of its own and the agent's group).
    #[arg(long)]
    pub allow_own_group: bool,

    /// Signing threads.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub threads: usize,

    /// Signing requests waiting at most; beyond, requests are answered `busy`.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub queue: usize,

    /// Connections served at once; more are closed at accept.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_connections: usize,

    /// How long an authenticated connection may stay idle (e.g. 5m).
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    pub idle_timeout: baton_ops::duration::HumanDuration,
}

/// Runs the signer until SIGTERM/SIGINT. Prints `signer PATH` then `ready` on stdout once the
/// socket accepts connections.
pub fn run(args: SignerArgs) -> anyhow::Result<()> {
    if args.threads == 0 || args.queue == 0 {
        let e = anyhow::anyhow!("--threads and --queue must be at least 1");
        return Err(baton_ops::exit::invalid(e));
    }
    let path = server::unix_path(&args.listen)?;
    refuse_inspection()?;
    let auth = auth::AuthKey::from_file(&args.auth_key_file)?;
    let mut loaded = Vec::new();
    for k in &args.key {
        loaded.push(keys::Key::from_pem_file(k)?);
    }
    match (
        &args.pkcs11_module,
        &args.pkcs11_token,
        &args.pkcs11_pin_file,
    ) {
        (Some(module), Some(token), Some(pin)) => loaded.extend(pkcs11::load(module, token, pin)?),
        (None, None, None) => {}
        _ => anyhow::bail!("--pkcs11-module, --pkcs11-token and --pkcs11-pin-file go together"),
    }
    for k in &loaded {
        tracing::info!(key = %keys::short_id(&k.info.key_id), "holding key");
    }
    let store = keys::KeyStore::new(loaded)?;
    let own_uid = rustix::process::geteuid().as_raw();
    let settings = server::Settings {
        path: path.clone(),
        auth,
        allowed_uids: if args.allow_uid.is_empty() {
            vec![own_uid]
        } else {
            args.allow_uid
        },
        allowed_gids: if args.allow_own_group {
            vec![rustix::process::getegid().as_raw()]
        } else {
            Vec::new()
        },
        threads: args.threads,
        queue: args.queue,
        max_connections: args.max_connections.max(1),
        idle_timeout: args.idle_timeout.0.max(Duration::from_secs(1)),
    };
    // The shell only moves frames: one thread is plenty, signing has threads of its own.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting runtime")?;
    runtime.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let listener = server::bind(&settings)?;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        {
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            writeln!(out, "signer {}\nready", path.display())?;
            out.flush()?;
        }
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        };
        let counters = server::serve(listener, settings, store, stop).await;
        use std::sync::atomic::Ordering::Relaxed;
        tracing::info!(
            signed = counters.signed.load(Relaxed),
            busy = counters.busy.load(Relaxed),
            failed = counters.failed.load(Relaxed),
            refused = counters.refused.load(Relaxed),
            "signer stopped"
        );
        Ok(())
    })
}

/// Before any key is read: no core dumps, and no other process of the same user may attach
/// to this one or read its memory through /proc (a non-dumpable process needs
/// CAP_SYS_PTRACE for that). The signer exists so that an agent's compromise does not
/// reveal the keys, and deployments may run both under one user or group (`deploy/systemd`
/// gives them one group).
fn refuse_inspection() -> anyhow::Result<()> {
    use rustix::process::{set_dumpable_behavior, DumpableBehavior};
    set_dumpable_behavior(DumpableBehavior::NotDumpable)
        .map_err(|e| anyhow::anyhow!("making the signer non-dumpable: {e}"))
}
