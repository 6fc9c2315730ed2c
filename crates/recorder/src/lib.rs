//! `baton record`: an HTTPS proxy that records what a browser requests into a scenario file
//! for `baton bench --scenario`. The scenario format (`baton_bench::scenario`) and the
//! redaction rules (`baton_bench::redact`) are the bench's; this crate is the proxy that
//! fills them from a live browser. The `baton` binary runs [`main`] with [`RecordArgs`].
//!
//! The browser's `CONNECT host:port` is answered 200 (`connect`, sans-IO and fuzzed through
//! [`fuzzing`]), its TLS terminated with a leaf minted for the name it asks for (signed by the
//! recorder's CA, `ca`), and each request forwarded to the real origin over TLS (`proxy`),
//! the response streamed back. Every request the origin answers is recorded (`recording`);
//! the scenario keeps those to one host (`--host`, else the first recorded one's) in the
//! order they started, think time = the gap between starts.
//!
//! Refused, not recorded: plain `http://` requests (400: only HTTPS is replayed), request
//! bodies over `--max-body` (413), requests the origin does not answer (502). The recording
//! ends on SIGINT/SIGTERM, `--duration` or `--max-requests`.
//!
//! Safety properties:
//! - The CA: created on first use in `--ca-dir` (a 0700 directory; `ca.key` created 0600,
//!   exclusively), valid `--ca-days` days (at most 3650), replaced once expired (or with
//!   under an hour left), refused when valid for longer than asked; the recorder installs it
//!   nowhere and says at start-up how to trust it and how to remove it. Origins are verified
//!   against the system's roots (and `--upstream-ca`), never skipped.
//! - Redaction: the scenario has no credentials unless `--keep-credentials`: cookie values,
//!   authorization headers, headers and query parameters named like credentials, and request
//!   bodies are replaced by `x`s of the same length as each exchange comes in (`redact`), and
//!   the same query values are masked in the log. Responses are not stored.
//! - File modes: the scenario file is written whole, readable by its owner only (a temporary
//!   file created 0600, synced, renamed over it: `baton_bench::scenario::write_atomically`).
//!
//! No `unsafe`: the crate forbids it.

#![forbid(unsafe_code)]

mod ca;
mod connect;
pub mod fuzzing;
mod proxy;
mod recording;
mod redact;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::signal::unix::{signal, SignalKind};

use baton_bench::scenario;

/// Connections open at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 512;

/// `baton record`.
#[derive(clap::Args, Debug)]
pub struct RecordArgs {
    /// Where the proxy listens: the browser's HTTPS proxy (`--proxy-server=http://ADDR`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The scenario file to write when the recording ends.
    #[arg(long, value_name = "FILE.toml")]
    pub out: PathBuf,
    /// The recorder's CA (`ca.pem`, `ca.key`), created there on first use.
    /// Default: $XDG_DATA_HOME/baton/record-ca or ~/.local/share/baton/record-ca.
    #[arg(long, value_name = "DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Days a new CA is valid (1 to 3650). An expired CA is replaced; one valid for longer
    /// than this from now is refused, with the steps to retire it.
    #[arg(long, value_name = "N", default_value_t = ca::DEFAULT_DAYS,
          value_parser = clap::value_parser!(u32).range(1..=ca::MAX_DAYS as i64))]
    pub ca_days: u32,
    /// Write cookies, authorization headers, credential-like headers and query parameters,
    /// and request bodies as they were sent. Default: replaced by x's of the same length.
    #[arg(long)]
    pub keep_credentials: bool,
    /// CA certificates (PEM) to trust for origins, besides the system's bundle. Repeatable.
    #[arg(long, value_name = "PEM")]
    pub upstream_ca: Vec<PathBuf>,
    /// End the recording after this long (e.g. 30s, 5m). Default: until SIGINT/SIGTERM.
    #[arg(long, value_name = "D", value_parser = baton_bench::parse_duration)]
    pub duration: Option<Duration>,
    /// End the recording once this many requests to the recorded host are in.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_requests: Option<u64>,
    /// Record the requests to this host[:port] only. Default: the first recorded request's.
    #[arg(long, value_name = "H")]
    pub host: Option<String>,
    /// Request bodies over this many bytes are refused (413) and not recorded.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Time each phase a peer can stall may take (CONNECT head, TLS handshakes, origin
    /// connect); a request body and an origin's response head get 3 times that.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = baton_bench::parse_duration)]
    pub timeout: Duration,
}

/// Runs `baton record` until the recording ends, then writes `--out`.
pub fn main(args: RecordArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: RecordArgs) -> anyhow::Result<()> {
    let dir = match &args.ca_dir {
        Some(d) => d.clone(),
        None => ca::default_dir()?,
    };
    let (ca, origin) = ca::Ca::load_or_create(&dir, args.ca_days, time::OffsetDateTime::now_utc())?;
    match &origin {
        ca::Origin::Reused => {}
        ca::Origin::Created => eprintln!("created a new recorder CA in {}", dir.display()),
        ca::Origin::Replaced { old, until } => eprintln!(
            "the recorder CA in {} ({old}) expired {}: replaced by a new one; remove the old one \
             from the browsers that trusted it:\n{}",
            dir.display(),
            ca::show_time(*until),
            ca::removal_steps(old)
        ),
    }
    let (roots, from_system) = proxy::roots(&args.upstream_ca)?;
    tracing::debug!(from_system, "origin trust roots");
    let mut tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let upstream = proxy::Upstream {
        tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
        timeout: args.timeout,
    };
    let limits = proxy::Limits {
        phase: args.timeout,
        exchange: args.timeout * 3,
        idle: Duration::from_secs(60),
        max_body: args.max_body,
    };
    let client = Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(limits.idle)
        .build(upstream);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let max = args.max_requests.map(|n| n as usize);
    let shared = Arc::new(proxy::Shared {
        ca,
        client,
        recording: Mutex::new(recording::Recording::new(
            args.host.as_deref(),
            max,
            args.keep_credentials,
        )),
        started: tokio::time::Instant::now(),
        limits,
        stop,
        keep_credentials: args.keep_credentials,
    });

    let listener = baton_ops::listen::bind(args.listen)
        .with_context(|| format!("listening on {}", args.listen))?;
    let ca = &shared.ca;
    println!(
        "ca certificate {} ({}, valid until {})",
        ca.cert_path().display(),
        ca.name(),
        ca::show_time(ca.not_after())
    );
    eprintln!("{}", ca_guide(ca, &dir));
    if args.keep_credentials {
        eprintln!(
            "--keep-credentials: cookies, authorization headers and request bodies are \
             written as sent"
        );
    }
    baton_ops::listen::announce([("proxy", &listener)])?;

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let deadline = tokio::time::sleep(args.duration.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let why = loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => {
                    let Ok(slot) = slots.clone().acquire_owned().await else { break "closed" };
                    let s = shared.clone();
                    tokio::spawn(async move {
                        proxy::serve(tcp, s).await;
                        drop(slot);
                    });
                }
                // out of descriptors and the like: the next accept may work
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stopped.changed() => break "--max-requests reached",
            _ = &mut deadline => break "--duration elapsed",
            _ = sigint.recv() => break "SIGINT",
            _ = sigterm.recv() => break "SIGTERM",
        }
    };
    eprintln!("recording ended: {why}");
    let recording = std::mem::take(&mut *shared.recording.lock().unwrap());
    let finished = recording.finish()?;
    let mut comment =
        "baton scenario, recorded by `baton record` (think-ms: gaps between request starts)"
            .to_string();
    match finished.redacted {
        Some(counts) => {
            comment.push('\n');
            comment.push_str(&redact::comment(counts));
        }
        None => comment.push_str("\ncredentials kept (--keep-credentials): keep this file private"),
    }
    let text = scenario::to_toml(&finished.imported.scenario, &comment)?;
    scenario::parse(&text).context("the recorded scenario does not read back")?;
    scenario::write_atomically(&args.out, text.as_bytes())?;
    eprintln!(
        "{}{}",
        scenario::summary(&finished.imported, &args.out),
        finished.notes()
    );
    Ok(())
}

/// What the user needs to know about the CA at start-up: it is not installed anywhere by
/// baton, how to trust it, until when, and how to remove it afterwards.
fn ca_guide(ca: &ca::Ca, dir: &Path) -> String {
    let (name, path) = (ca.name(), ca.cert_path().display());
    format!(
        "baton installs its CA nowhere: the browser you record with must trust {path} \
         (valid until {until}), e.g.\n\
         \x20 Chromium/Chrome on Linux (NSS): \
         certutil -d sql:$HOME/.pki/nssdb -A -t C,, -n '{name}' -i {path}\n\
         \x20 Firefox: Settings > Privacy & Security > Certificates > View Certificates > \
         Authorities > Import\n\
         a browser that trusts it accepts any site signed with {key}; \
         when done recording, remove it:\n\
         {steps}\n\
         \x20 and `rm -r '{dir}'` to retire it (the next run makes a new one)",
        until = ca::show_time(ca.not_after()),
        key = dir.join("ca.key").display(),
        steps = ca::removal_steps(name),
        dir = dir.display(),
    )
}
