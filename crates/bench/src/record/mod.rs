//! `baton record`: an HTTPS proxy that records what a browser requests into a scenario file
//! for `baton bench --scenario`.
//!
//! The browser's `CONNECT host:port` is answered 200, its TLS terminated with a leaf minted
//! for the name it asks for (signed by the recorder's CA, `ca`), and each request forwarded
//! to the real origin over TLS (`proxy`), the response streamed back. Every request the origin
//! answers is recorded (`recording`); the scenario keeps those to one host (`--host`, else the
//! first recorded one's) in the order they started, think time = the gap between starts.
//!
//! Refused, not recorded: plain `http://` requests (400: only HTTPS is replayed), request
//! bodies over `--max-body` (413), requests the origin does not answer (502). The recording
//! ends on SIGINT/SIGTERM, `--duration` or `--max-requests`, and the file is written whole
//! (a temporary file renamed over it).

mod ca;
pub(crate) mod connect;
mod proxy;
mod recording;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::signal::unix::{signal, SignalKind};

use crate::scenario;

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
    /// CA certificates (PEM) to trust for origins, besides the system's bundle. Repeatable.
    #[arg(long, value_name = "PEM")]
    pub upstream_ca: Vec<PathBuf>,
    /// End the recording after this long (e.g. 30s, 5m). Default: until SIGINT/SIGTERM.
    #[arg(long, value_name = "D", value_parser = crate::config::parse_duration)]
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
    #[arg(long, value_name = "D", default_value = "10s", value_parser = crate::config::parse_duration)]
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
    let (ca, created) = ca::Ca::load_or_create(&dir)?;
    if created {
        eprintln!("created a new recorder CA in {}", dir.display());
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
        recording: Mutex::new(recording::Recording::new(args.host.as_deref(), max)),
        started: tokio::time::Instant::now(),
        limits,
        stop,
    });

    let listener = baton_ops::listen::bind(args.listen)
        .with_context(|| format!("listening on {}", args.listen))?;
    println!(
        "ca certificate {} (trust it in the browser)",
        shared.ca.cert_path().display()
    );
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
    let text = scenario::to_toml(
        &finished.imported.scenario,
        "baton scenario, recorded by `baton record` (think-ms: gaps between request starts)",
    )?;
    scenario::parse(&text).context("the recorded scenario does not read back")?;
    write_atomically(&args.out, text.as_bytes())?;
    eprintln!(
        "{}{}",
        scenario::summary(&finished.imported, &args.out),
        finished.notes()
    );
    Ok(())
}

/// Writes `path` whole or not at all: a temporary file next to it, synced, renamed over it.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let name = path
        .file_name()
        .with_context(|| format!("--out {}: not a file name", path.display()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("writing {}", path.display()))
}
