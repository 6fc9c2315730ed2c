//! The signer process: a unix socket, the authentication exchange, and a fixed pool of signing
//! threads behind a bounded queue.
//!
//! The tokio side only moves frames; signatures run on `threads` dedicated OS threads fed by one
//! bounded channel of `queue` jobs. When the queue is full a request is answered `Busy` at once
//! rather than queued without bound (the agent counts it and fails that handshake; queueing
//! longer than a handshake timeout helps no one). Batching: each read decodes every complete
//! frame it delivered, and the writer answers every response ready at its wakeup with one
//! write, so a busy connection costs one syscall per batch, not per signature. A connection with
//! `MAX_IN_FLIGHT` answers outstanding is no longer read until its writer catches up (back
//! pressure per connection; the queue bound is what protects the process).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::auth::{self, AuthKey};
use crate::keys::KeyStore;
use crate::protocol::{split_frame, ErrorCode, Request, Response, MAX_FRAME};

/// Answers one connection may have outstanding before the signer stops reading it.
const MAX_IN_FLIGHT: usize = 64;
/// Time a client has to complete authentication.
const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Time one batch of answers may take to write before the connection is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Settings {
    pub path: PathBuf,
    pub auth: AuthKey,
    pub allowed_uids: Vec<u32>,
    /// Peers whose primary gid is one of these are allowed too (the socket is then mode 0660).
    pub allowed_gids: Vec<u32>,
    pub threads: usize,
    pub queue: usize,
    pub max_connections: usize,
    pub idle_timeout: Duration,
}

struct Job {
    key_id: [u8; 32],
    scheme: u16,
    message: Vec<u8>,
    id: u64,
    reply: mpsc::UnboundedSender<Reply>,
    permit: OwnedSemaphorePermit,
}

/// One answer and the in-flight slot it releases once written.
type Reply = (u64, Response, OwnedSemaphorePermit);

#[derive(Default)]
pub struct Counters {
    pub signed: AtomicU64,
    pub busy: AtomicU64,
    pub failed: AtomicU64,
    pub refused: AtomicU64,
}

struct Shared {
    settings: Settings,
    keys: Arc<KeyStore>,
    jobs: SyncSender<Job>,
    counters: Arc<Counters>,
}

/// Binds the socket (mode 0600, 0660 when a group is allowed; a stale socket file left by a
/// dead signer is replaced, a live one is an error) and starts the signing threads.
pub fn bind(settings: &Settings) -> anyhow::Result<UnixListener> {
    let path = &settings.path;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        // Only a socket is ours to replace: a mistyped path must not cost someone a file.
        if !meta.file_type().is_socket() {
            bail!(
                "{}: exists and is not a socket; refusing to replace it",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("{}: another signer is listening there", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))?;
    // connecting takes write permission on the socket file
    let mode = if settings.allowed_gids.is_empty() {
        0o600
    } else {
        0o660
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))?;
    Ok(listener)
}

/// Serves until `stop` resolves; returns the counters.
pub async fn serve(
    listener: UnixListener,
    settings: Settings,
    keys: KeyStore,
    stop: impl std::future::Future<Output = ()>,
) -> Arc<Counters> {
    let keys = Arc::new(keys);
    let counters = Arc::new(Counters::default());
    let (jobs, rx) = sync_channel::<Job>(settings.queue);
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..settings.threads {
        let (rx, keys, counters) = (rx.clone(), keys.clone(), counters.clone());
        std::thread::Builder::new()
            .name(format!("baton-sign-{i}"))
            .spawn(move || sign_loop(&rx, &keys, &counters))
            .expect("spawning a signing thread");
    }
    let conns = Arc::new(Semaphore::new(settings.max_connections));
    let shared = Arc::new(Shared {
        settings,
        keys,
        jobs,
        counters: counters.clone(),
    });
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(permit) = conns.clone().try_acquire_owned() else {
            tracing::warn!("connection limit reached; closing a new connection");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, &shared).await {
                tracing::debug!(error = %format!("{e:#}"), "signer connection closed");
            }
            drop(permit);
        });
    }
    let _ = std::fs::remove_file(&shared.settings.path);
    counters
}

/// A signing thread: one job at a time from the shared queue, until the queue is dropped.
fn sign_loop(rx: &Mutex<std::sync::mpsc::Receiver<Job>>, keys: &KeyStore, counters: &Counters) {
    loop {
        // The lock is held only while waiting for the next job, never while signing.
        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let response = match keys.sign(&job.key_id, job.scheme, &job.message) {
            Ok(sig) => {
                counters.signed.fetch_add(1, Ordering::Relaxed);
                Response::Signature(sig)
            }
            Err((code, detail)) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(code = code.label(), %detail, "signing failed");
                Response::Error { code, detail }
            }
        };
        let _ = job.reply.send((job.id, response, job.permit));
    }
}

async fn connection(stream: UnixStream, shared: &Shared) -> anyhow::Result<()> {
    let peer = stream.peer_cred().context("peer credentials")?;
    let (uid, gid) = (peer.uid(), peer.gid());
    if !shared.settings.allowed_uids.contains(&uid) && !shared.settings.allowed_gids.contains(&gid)
    {
        shared.counters.refused.fetch_add(1, Ordering::Relaxed);
        bail!("uid {uid} (gid {gid}) is not allowed");
    }
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = Vec::with_capacity(1024);
    tokio::time::timeout(
        AUTH_TIMEOUT,
        authenticate(&mut rd, &mut wr, &mut buf, shared),
    )
    .await
    .context("authentication timed out")??;

    let (tx, rx) = mpsc::unbounded_channel::<Reply>();
    let writer = tokio::spawn(write_loop(wr, rx));
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let result = read_loop(&mut rd, &mut buf, shared, &tx, &in_flight).await;
    drop(tx);
    // Answers already computed are still delivered (the writer ends when the signing threads
    // drop their senders), within the write timeout.
    let _ = writer.await;
    result
}

async fn authenticate(
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    buf: &mut Vec<u8>,
    shared: &Shared,
) -> anyhow::Result<()> {
    let server_nonce = auth::nonce()?;
    let mut out = Vec::new();
    Response::Challenge { server_nonce }.encode(0, &mut out);
    wr.write_all(&out).await?;
    let (id, request) = loop {
        if let Some((frame, used)) = split_frame(buf)? {
            let decoded = Request::decode(frame)?;
            buf.drain(..used);
            break decoded;
        }
        read_some(rd, buf).await?;
    };
    let accepted = match request {
        Request::Auth {
            client_nonce,
            proof,
        } if shared
            .settings
            .auth
            .check_client(&server_nonce, &client_nonce, &proof) =>
        {
            Some(client_nonce)
        }
        _ => None,
    };
    let mut out = Vec::new();
    let Some(client_nonce) = accepted else {
        shared.counters.refused.fetch_add(1, Ordering::Relaxed);
        Response::Error {
            code: ErrorCode::Unauthenticated,
            detail: "authentication failed".into(),
        }
        .encode(id, &mut out);
        let _ = wr.write_all(&out).await;
        bail!("client failed authentication");
    };
    let proof = shared
        .settings
        .auth
        .signer_proof(&server_nonce, &client_nonce);
    Response::Welcome { proof }.encode(id, &mut out);
    wr.write_all(&out).await?;
    Ok(())
}

/// Reads more bytes; the buffer never holds more than one maximal frame plus one read.
async fn read_some(rd: &mut OwnedReadHalf, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    let mut chunk = [0u8; 8192];
    let n = rd.read(&mut chunk).await?;
    if n == 0 {
        bail!("peer closed");
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

async fn read_loop(
    rd: &mut OwnedReadHalf,
    buf: &mut Vec<u8>,
    shared: &Shared,
    tx: &mpsc::UnboundedSender<Reply>,
    in_flight: &Arc<Semaphore>,
) -> anyhow::Result<()> {
    loop {
        // Every complete frame of this read, before reading again.
        while let Some((frame, used)) = split_frame(buf)? {
            let (id, request) = match Request::decode(frame) {
                Ok(r) => r,
                Err(e) => {
                    // Nothing after a malformed frame can be trusted to line up: answer, close.
                    let permit = in_flight.clone().acquire_owned().await?;
                    let detail = e.to_string();
                    let _ = tx.send((
                        0,
                        Response::Error {
                            code: ErrorCode::BadRequest,
                            detail,
                        },
                        permit,
                    ));
                    bail!("malformed request: {e}");
                }
            };
            buf.drain(..used);
            let permit = in_flight.clone().acquire_owned().await?;
            match request {
                Request::ListKeys => {
                    let _ = tx.send((id, Response::Keys(shared.keys.infos()), permit));
                }
                Request::Sign {
                    key_id,
                    scheme,
                    message,
                } => {
                    let job = Job {
                        key_id,
                        scheme,
                        message,
                        id,
                        reply: tx.clone(),
                        permit,
                    };
                    if let Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) =
                        shared.jobs.try_send(job)
                    {
                        shared.counters.busy.fetch_add(1, Ordering::Relaxed);
                        let busy = Response::Error {
                            code: ErrorCode::Busy,
                            detail: "signing queue full".into(),
                        };
                        let _ = tx.send((id, busy, job.permit));
                    }
                }
                Request::Auth { .. } => {
                    let bad = Response::Error {
                        code: ErrorCode::BadRequest,
                        detail: "already authenticated".into(),
                    };
                    let _ = tx.send((id, bad, permit));
                }
            }
        }
        match tokio::time::timeout(shared.settings.idle_timeout, read_some(rd, buf)).await {
            Ok(r) => r?,
            Err(_) => bail!("idle timeout"),
        }
    }
}

async fn write_loop(mut wr: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Reply>) {
    let mut out = Vec::with_capacity(4096);
    while let Some(first) = rx.recv().await {
        out.clear();
        let mut permits = Vec::new();
        let mut next = Some(first);
        // Batch: everything already answered goes out in the same write.
        while let Some((id, resp, permit)) = next.take() {
            resp.encode(id, &mut out);
            permits.push(permit);
            if out.len() < MAX_FRAME {
                next = rx.try_recv().ok();
            }
        }
        match tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(&out)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        drop(permits);
    }
}

/// Parses `unix:PATH`.
pub fn unix_path(spec: &str) -> anyhow::Result<PathBuf> {
    match spec.strip_prefix("unix:") {
        Some(p) if !p.is_empty() => Ok(Path::new(p).to_path_buf()),
        _ => bail!("`{spec}`: expected unix:PATH"),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::mpsc;

    use rustls::{SignatureAlgorithm, SignatureScheme};

    use super::*;
    use crate::keys::{Backend, Key};

    /// A key whose signatures wait until the test lets them through, so the queue fills.
    struct Gated(Mutex<mpsc::Receiver<()>>);

    impl Backend for Gated {
        fn sign(&self, _: SignatureScheme, message: &[u8]) -> Result<Vec<u8>, String> {
            let _ = self.0.lock().unwrap().recv();
            Ok(message.to_vec())
        }
    }

    fn read_frame(s: &mut std::os::unix::net::UnixStream, buf: &mut Vec<u8>) -> (u64, Response) {
        loop {
            if let Some((frame, used)) = split_frame(buf).unwrap() {
                let r = Response::decode(frame).unwrap();
                buf.drain(..used);
                return r;
            }
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "signer closed");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    #[test]
    fn full_queue_answers_busy_and_every_request_is_answered() {
        let dir = std::env::temp_dir().join(format!("baton-signer-q-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (gate, gated) = mpsc::channel();
        let spki = vec![0x30, 0x00];
        let key = Key::new(
            spki.clone(),
            SignatureAlgorithm::ECDSA,
            vec![SignatureScheme::ECDSA_NISTP256_SHA256],
            Box::new(Gated(Mutex::new(gated))),
        )
        .unwrap();
        let id = key.info.key_id;
        let settings = Settings {
            path: dir.join("s.sock"),
            auth: AuthKey::from_bytes(&[1; 32]),
            allowed_uids: vec![rustix::process::geteuid().as_raw()],
            allowed_gids: Vec::new(),
            threads: 1,
            queue: 1,
            max_connections: 4,
            idle_timeout: Duration::from_secs(30),
        };
        let path = settings.path.clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = bind(&settings).unwrap();
                let store = KeyStore::new(vec![key]).unwrap();
                serve(listener, settings, store, async {
                    let _ = stop_rx.await;
                })
                .await
            })
        });
        let mut s = loop {
            match std::os::unix::net::UnixStream::connect(&path) {
                Ok(s) => break s,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = Vec::new();
        let auth = AuthKey::from_bytes(&[1; 32]);
        let (_, Response::Challenge { server_nonce }) = read_frame(&mut s, &mut buf) else {
            panic!("no challenge");
        };
        let client_nonce = [2; 32];
        let mut out = Vec::new();
        Request::Auth {
            client_nonce,
            proof: auth.client_proof(&server_nonce, &client_nonce),
        }
        .encode(0, &mut out);
        // Five signing requests in the same write as the authentication: one for the thread,
        // one for the queue, the rest cannot all fit.
        for i in 1..=5u64 {
            Request::Sign {
                key_id: id,
                scheme: u16::from(SignatureScheme::ECDSA_NISTP256_SHA256),
                message: vec![i as u8],
            }
            .encode(i, &mut out);
        }
        s.write_all(&out).unwrap();
        assert!(matches!(
            read_frame(&mut s, &mut buf).1,
            Response::Welcome { .. }
        ));
        let mut busy = 0u64;
        let mut signed = Vec::new();
        // Busy answers come at once, before any signature is let through.
        for _ in 0..3 {
            match read_frame(&mut s, &mut buf) {
                (
                    _,
                    Response::Error {
                        code: ErrorCode::Busy,
                        ..
                    },
                ) => busy += 1,
                other => panic!("expected busy, got {other:?}"),
            }
        }
        for _ in 0..5 {
            let _ = gate.send(());
        }
        while busy + (signed.len() as u64) < 5 {
            match read_frame(&mut s, &mut buf) {
                (i, Response::Signature(sig)) => {
                    assert_eq!(sig, vec![i as u8], "answer matches its request id");
                    signed.push(i);
                }
                (
                    _,
                    Response::Error {
                        code: ErrorCode::Busy,
                        ..
                    },
                ) => busy += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(!signed.is_empty() && signed.len() <= 2, "{signed:?}");
        drop(s);
        let _ = stop_tx.send(());
        let counters = server.join().unwrap();
        assert_eq!(counters.busy.load(Ordering::Relaxed), busy);
        assert!(!path.exists(), "socket removed on stop");
        std::fs::remove_dir_all(&dir).ok();
    }
}
