//! The agent's side: a blocking client of the signer and a rustls `SigningKey` that signs
//! through it.
//!
//! rustls calls `Signer::sign` synchronously, on whichever tokio worker thread is driving the
//! handshake, and rustls 0.23 has no asynchronous signing seam. So a signature is a blocking
//! round trip on that worker: a std `UnixStream` taken from a small pool of authenticated
//! connections, one request written, one answer read, with a read/write deadline
//! (`--key-signer-timeout`). The trade-off: while it waits, that worker runs no other
//! connection; with the signer on the same machine the wait is the signature's own time plus
//! ~20-50 us of IPC, the same time the worker would have spent signing in-process, so
//! throughput is not lost, only the key's isolation gained. A stalled signer costs each waiting
//! worker at most the timeout, and the in-flight requests are bounded by the worker count (each
//! worker waits on at most one), which also bounds the pool. The pool's lock is held only to
//! take or return a connection, never across I/O.
//!
//! After the signer restarts, pooled connections are dead: the first request to hit one sees
//! EOF, the pool is emptied and the request retried once on a fresh connection. A timeout is not
//! retried (the signer is stalled, not gone; retrying would double the wait).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::sign::{Signer, SigningKey};
use rustls::{SignatureAlgorithm, SignatureScheme};
use socket2::{Domain, SockAddr, Socket, Type};

use crate::auth::{self, AuthKey};
use crate::keys::short_id;
use crate::metrics::{ClientMetrics, Outcome};
use crate::protocol::{split_frame, ErrorCode, KeyId, KeyInfo, Request, Response, MAX_MESSAGE};

/// Idle authenticated connections kept for reuse.
const POOL: usize = 16;

/// Why a request to the signer failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No signer at the path, or it closed the connection: it is gone (or restarting).
    #[error("signer unreachable: {0}")]
    Unreachable(std::io::Error),
    #[error("signer did not answer within {0:?}")]
    Timeout(Duration),
    /// The signer answered with an error (busy, unknown key, ...).
    #[error("signer refused: {} ({detail})", code.label())]
    Refused { code: ErrorCode, detail: String },
    #[error("signer protocol error: {0}")]
    Protocol(String),
    #[error("the signer failed to prove it holds the auth key")]
    BadSigner,
}

impl ClientError {
    fn outcome(&self) -> Outcome {
        match self {
            ClientError::Unreachable(_) => Outcome::Unreachable,
            ClientError::Timeout(_) => Outcome::Timeout,
            ClientError::Refused {
                code: ErrorCode::Busy,
                ..
            } => Outcome::Busy,
            ClientError::Refused {
                code: ErrorCode::Unauthenticated,
                ..
            }
            | ClientError::BadSigner => Outcome::Auth,
            ClientError::Refused { .. } => Outcome::Refused,
            ClientError::Protocol(_) => Outcome::Protocol,
        }
    }

    /// Whether the signer is not there to ask (the case `--key-signer-fallback local` covers).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ClientError::Unreachable(_) | ClientError::Timeout(_))
    }
}

fn io_error(e: std::io::Error, timeout: Duration) -> ClientError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            ClientError::Timeout(timeout)
        }
        _ => ClientError::Unreachable(e),
    }
}

/// A client of one signer socket, shared by every key that lives there.
pub struct Client {
    path: PathBuf,
    auth: AuthKey,
    timeout: Duration,
    idle: Mutex<Vec<Conn>>,
    next_id: AtomicU64,
    pub metrics: Arc<ClientMetrics>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("path", &self.path).finish()
    }
}

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn new(path: &Path, auth: AuthKey, timeout: Duration) -> Self {
        Self {
            path: path.to_path_buf(),
            auth,
            timeout,
            idle: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            metrics: Arc::new(ClientMetrics::default()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The keys the signer holds.
    pub fn list_keys(&self) -> Result<Vec<KeyInfo>, ClientError> {
        match self.call(&Request::ListKeys)? {
            Response::Keys(keys) => Ok(keys),
            other => Err(unexpected(&other)),
        }
    }

    /// One signature, counted and timed in [`ClientMetrics`].
    pub fn sign(
        &self,
        key_id: &KeyId,
        scheme: SignatureScheme,
        message: &[u8],
    ) -> Result<Vec<u8>, ClientError> {
        if message.len() > MAX_MESSAGE {
            return Err(ClientError::Protocol(format!(
                "message of {} bytes over the limit",
                message.len()
            )));
        }
        let start = Instant::now();
        let request = Request::Sign {
            key_id: *key_id,
            scheme: u16::from(scheme),
            message: message.to_vec(),
        };
        let result = self.call(&request).and_then(|r| match r {
            Response::Signature(sig) => Ok(sig),
            other => Err(unexpected(&other)),
        });
        let outcome = match &result {
            Ok(_) => Outcome::Ok,
            Err(e) => e.outcome(),
        };
        self.metrics.record(outcome, start.elapsed());
        result
    }

    fn call(&self, request: &Request) -> Result<Response, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(mut conn) = pooled {
            match conn.call(id, request, self.timeout) {
                Ok(r) => return self.keep(conn, r),
                // The signer went away since this connection was made (restart): every idle
                // connection is as dead as this one. Retry once on a new connection.
                Err(ClientError::Unreachable(_)) => {
                    self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
                }
                Err(e) => return Err(e),
            }
        }
        let mut conn = self.connect()?;
        let r = conn.call(id, request, self.timeout)?;
        self.keep(conn, r)
    }

    /// Returns a connection that answered to the pool. Error answers keep the connection too:
    /// the signer stays in step after refusing a request.
    fn keep(&self, conn: Conn, response: Response) -> Result<Response, ClientError> {
        {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < POOL {
                idle.push(conn);
            }
        }
        match response {
            Response::Error { code, detail } => Err(ClientError::Refused { code, detail }),
            r => Ok(r),
        }
    }

    /// A connected socket with the deadline set before `connect`: a signer that stopped
    /// accepting, its listen backlog full, would otherwise block a plain connect for good
    /// (Linux bounds a blocking unix-socket connect by the send timeout, then says EAGAIN).
    fn open(&self) -> std::io::Result<UnixStream> {
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        socket.set_read_timeout(Some(self.timeout))?;
        socket.set_write_timeout(Some(self.timeout))?;
        socket.connect(&SockAddr::unix(&self.path)?)?;
        Ok(socket.into())
    }

    fn connect(&self) -> Result<Conn, ClientError> {
        let stream = self.open().map_err(|e| io_error(e, self.timeout))?;
        let mut conn = Conn {
            stream,
            buf: Vec::with_capacity(1024),
        };
        let deadline = Instant::now() + self.timeout;
        let server_nonce = match conn.read_response(deadline, self.timeout)? {
            (_, Response::Challenge { server_nonce }) => server_nonce,
            (_, other) => return Err(unexpected(&other)),
        };
        let client_nonce = auth::nonce().map_err(|e| ClientError::Protocol(e.to_string()))?;
        let proof = self.auth.client_proof(&server_nonce, &client_nonce);
        let auth_request = Request::Auth {
            client_nonce,
            proof,
        };
        match conn.call(0, &auth_request, self.timeout)? {
            Response::Welcome { proof }
                if self.auth.check_signer(&server_nonce, &client_nonce, &proof) =>
            {
                Ok(conn)
            }
            Response::Welcome { .. } => Err(ClientError::BadSigner),
            Response::Error { code, detail } => Err(ClientError::Refused { code, detail }),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(r: &Response) -> ClientError {
    let what = match r {
        Response::Error { code, detail } => {
            return ClientError::Refused {
                code: *code,
                detail: detail.clone(),
            }
        }
        Response::Challenge { .. } => "challenge",
        Response::Welcome { .. } => "welcome",
        Response::Keys(_) => "key list",
        Response::Signature(_) => "signature",
    };
    ClientError::Protocol(format!("unexpected {what}"))
}

impl Conn {
    fn call(
        &mut self,
        id: u64,
        request: &Request,
        timeout: Duration,
    ) -> Result<Response, ClientError> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(256);
        request.encode(id, &mut out);
        self.stream
            .write_all(&out)
            .map_err(|e| io_error(e, timeout))?;
        let (got, response) = self.read_response(deadline, timeout)?;
        // One request at a time per connection, so the answer must carry our id; anything else
        // means the stream is out of step and the connection is dropped (by the caller).
        if got != id {
            return Err(ClientError::Protocol(format!(
                "answer for request {got}, expected {id}"
            )));
        }
        Ok(response)
    }

    fn read_response(
        &mut self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(u64, Response), ClientError> {
        loop {
            if let Some((frame, used)) =
                split_frame(&self.buf).map_err(|e| ClientError::Protocol(e.to_string()))?
            {
                let decoded =
                    Response::decode(frame).map_err(|e| ClientError::Protocol(e.to_string()))?;
                self.buf.drain(..used);
                return Ok(decoded);
            }
            // The deadline covers the whole answer, not each read.
            let left = deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or(ClientError::Timeout(timeout))?;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(ClientError::Unreachable)?;
            let mut chunk = [0u8; 4096];
            let n = self
                .stream
                .read(&mut chunk)
                .map_err(|e| io_error(e, timeout))?;
            if n == 0 {
                return Err(ClientError::Unreachable(
                    std::io::ErrorKind::UnexpectedEof.into(),
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A private key held by the signer, as rustls sees it. With a fallback (a local copy of the
/// same key, `--key-signer-fallback local`), signatures are made locally while the signer is
/// unreachable; any other refusal (busy, unknown key) still fails the handshake.
#[derive(Debug)]
pub struct RemoteKey {
    client: Arc<Client>,
    key_id: KeyId,
    algorithm: SignatureAlgorithm,
    schemes: Vec<SignatureScheme>,
    spki: Vec<u8>,
    fallback: Option<Arc<dyn SigningKey>>,
}

impl RemoteKey {
    pub fn new(client: Arc<Client>, info: &KeyInfo, fallback: Option<Arc<dyn SigningKey>>) -> Self {
        Self {
            client,
            key_id: info.key_id,
            algorithm: SignatureAlgorithm::from(info.algorithm),
            schemes: info
                .schemes
                .iter()
                .map(|s| SignatureScheme::from(*s))
                .collect(),
            spki: info.spki.clone(),
            fallback,
        }
    }

    pub fn key_id(&self) -> &KeyId {
        &self.key_id
    }
}

impl SigningKey for RemoteKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        let scheme = *self.schemes.iter().find(|s| offered.contains(s))?;
        Some(Box::new(RemoteSigner {
            client: self.client.clone(),
            key_id: self.key_id,
            scheme,
            fallback: self
                .fallback
                .as_ref()
                .and_then(|k| k.choose_scheme(&[scheme])),
        }))
    }

    fn public_key(&self) -> Option<rustls::pki_types::SubjectPublicKeyInfoDer<'_>> {
        Some(self.spki.as_slice().into())
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        self.algorithm
    }
}

/// A handshake signature the signer did not give: the error rustls carries out of the
/// handshake, typed so the agent counts these failures as the signer's, not as "other".
#[derive(Debug, thiserror::Error)]
#[error("key {key}: {cause}")]
pub struct SignFailed {
    pub key: String,
    #[source]
    pub cause: ClientError,
}

#[derive(Debug)]
struct RemoteSigner {
    client: Arc<Client>,
    key_id: KeyId,
    scheme: SignatureScheme,
    fallback: Option<Box<dyn Signer>>,
}

impl Signer for RemoteSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        match self.client.sign(&self.key_id, self.scheme, message) {
            Ok(sig) => Ok(sig),
            Err(e) => match &self.fallback {
                Some(local) if e.is_unreachable() => {
                    self.client.metrics.fallback(&e, self.client.path());
                    local.sign(message)
                }
                _ => {
                    self.client.metrics.warn(&e, self.client.path());
                    Err(rustls::Error::Other(rustls::OtherError(Arc::new(
                        SignFailed {
                            key: short_id(&self.key_id),
                            cause: e,
                        },
                    ))))
                }
            },
        }
    }

    fn scheme(&self) -> SignatureScheme {
        self.scheme
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// A signer that stopped accepting, with its backlog full: the request fails as a
    /// timeout after the client's deadline instead of hanging in `connect`.
    #[test]
    fn full_backlog_is_a_timeout_not_a_hang() {
        let dir = std::env::temp_dir().join(format!("baton-signer-backlog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("signer.sock");
        let _ = std::fs::remove_file(&path);
        let listener = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        listener.bind(&SockAddr::unix(&path).unwrap()).unwrap();
        listener.listen(0).unwrap();
        let mut queued = Vec::new();
        for _ in 0..64 {
            let s = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
            s.set_nonblocking(true).unwrap();
            match s.connect(&SockAddr::unix(&path).unwrap()) {
                Ok(()) => queued.push(s),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the backlog: {e}"),
            }
        }
        assert!(
            !queued.is_empty() && queued.len() < 64,
            "backlog never filled"
        );

        let client = Client::new(
            &path,
            AuthKey::from_bytes(&[7; 32]),
            Duration::from_millis(300),
        );
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(client.list_keys());
        });
        let result = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("connect hung");
        assert!(matches!(result, Err(ClientError::Timeout(_))), "{result:?}");
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
