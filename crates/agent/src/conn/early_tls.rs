//! The tokio shell of TLS 1.3 0-RTT (`--early-data`); the decisions are in `early.rs`.
//!
//! With `--early-data`, the agent reads the ClientHello itself before rustls sees it (bounded
//! like the dispatcher's read: 64 KiB, by the handshake deadline). A hello that offers no early
//! data goes to tokio-rustls as every connection does, with the bytes already inside rustls.
//! One that offers it, where this agent can give a single-use guarantee, has its first ticket
//! taken from the store here (`take_once`: a Redis GETDEL), judged (`early::judge`: exclusive,
//! and of the right age), and handed to rustls through a per-connection session cache that
//! gives out that one value; a refused one has `reject_early_data` called before rustls reads
//! the hello, so rustls answers without early_data in EncryptedExtensions and skips the early
//! records; the handshake goes on as 1-RTT.
//!
//! Those connections are driven here (`EarlyConn`), not by tokio-rustls, whose accept future
//! ends only at the client's Finished: the point of 0-RTT is to answer the request that came
//! with the hello at once, in the server's first flight's wake (0.5-RTT data), a round trip
//! before the client's Finished arrives. `EarlyConn` hands out early data first, then what
//! follows the handshake; `EarlyState` tells the HTTP layer whether the handshake is still
//! running (a request read then came in early data: marked `Early-Data: 1`, or 425).
//!
//! Only until the first request is answered, though (HTTP/1.1: `early_serve`): then the
//! handshake is driven to its end, and the connection goes on as a tokio-rustls stream, on the
//! path every other HTTP/1.1 connection takes (`http1::serve_http1`: it waits for requests,
//! parks, and moves when the agent drains). What came after the first request, early data
//! included, is served there: by then the client's Finished has come, so none of it can be a
//! replay. HTTP/2 stays on `EarlyConn` for its life (on no path does it park or move).

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{self, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use baton_wire::ClientHello;
use rustls::server::{ServerConnection, StoresServerSessions};
use rustls::{HandshakeKind, ProtocolVersion};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use zeroize::Zeroizing;

use crate::conn_info::ConnInfo;
use crate::context::Context;
use crate::early::{self, EarlyState, Refusal};
use crate::metrics::{FailureReason, Metrics, Version};
use crate::transport::agent_io::AgentIo;
use crate::transport::conn_io::ConnIo;
use crate::transport::engine::RustlsStream;

/// How a connection's handshake goes on once its ClientHello has been read.
// Returned once and consumed at once: boxing the accept future would cost an allocation per
// connection for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Start {
    /// As every connection: tokio-rustls, with the hello already inside rustls.
    Plain(tokio_rustls::Accept<ConnIo<AgentIo>>),
    /// Early data offered to a configuration that can accept it: driven here.
    Early(Box<EarlyConn>),
    /// Closed, timed out or failed (counted).
    Done,
}

/// Reads the ClientHello and decides how the handshake goes on. `may_migrate`: the
/// dispatcher offered this connection for migration; early data never rides one, so it is
/// refused without reading anything.
pub(crate) async fn start(
    mut io: ConnIo<AgentIo>,
    may_migrate: bool,
    deadline: Instant,
    ctx: &Context,
) -> Start {
    let metrics = &ctx.metrics;
    if may_migrate {
        // unread, the hello may carry early data: skipped up to what the tickets allowed
        return Start::Plain(
            TlsAcceptor::from(ctx.tls.early_config()).accept_with(io, |tls| {
                tls.reject_early_data();
            }),
        );
    }
    let (bytes, hello) =
        match tokio::time::timeout_at(deadline, baton_ops::hello::read(&mut io)).await {
            Ok(Ok(read)) => read,
            Ok(Err(_)) => {
                metrics.failure(FailureReason::Eof);
                return Start::Done;
            }
            Err(_) => {
                metrics.failure(FailureReason::Timeout);
                return Start::Done;
            }
        };
    let Some(hello) = hello.filter(ClientHello::early_data) else {
        return plain(io, bytes, deadline, ctx).await;
    };
    metrics.early_offered();
    let first_psk = hello.pre_shared_key().and_then(|p| p.identities.first());
    let (Ok(_), Some(psk), Some(store)) = (ctx.tls.early_data(), first_psk, ctx.tls.store()) else {
        metrics.early_result(Refusal::NoGuarantee.label());
        return plain(io, bytes, deadline, ctx).await;
    };
    let taken = store.take_once(&psk.identity, std::time::Instant::now());
    let verdict = early::judge(&taken, psk.obfuscated_ticket_age, unix_ms());
    // The config that accepts early data, even to refuse it: rustls skips refused early data
    // up to its max_early_data_size, and the client may send as much as its ticket allowed.
    let base = ctx.tls.early_config();
    let mut config = (*base).clone();
    config.session_storage = Arc::new(Prefetched {
        key: psk.identity.clone(),
        value: Mutex::new(taken.into_value().map(Zeroizing::new)),
        inner: base.session_storage.clone(),
    });
    // Answer early requests in the server's first flight's wake (0.5-RTT data).
    config.send_half_rtt_data = verdict.is_ok();
    let mut tls = match ServerConnection::new(Arc::new(config)) {
        Ok(tls) => tls,
        Err(e) => {
            tracing::warn!(error = %e, "TLS connection state");
            metrics.failure(FailureReason::Other);
            return Start::Done;
        }
    };
    if verdict.is_err() {
        tls.reject_early_data();
    }
    let fed = feed(&mut tls, &bytes);
    drop(bytes);
    let accepted = tls.early_data().is_some();
    metrics.early_result(match verdict {
        Ok(()) if accepted => "accepted",
        // rustls said no: suite or ALPN unlike the ticket's, not the first PSK, a retry
        Ok(()) => Refusal::NoGuarantee.label(),
        Err(refusal) => refusal.label(),
    });
    let mut conn = EarlyConn {
        io,
        tls,
        state: Arc::new(EarlyState::new(ctx.config.early_data_methods.clone())),
        accepted,
        metrics: metrics.clone(),
        eof: false,
        closing: false,
        counted: false,
    };
    if let Err(e) = fed {
        conn.failed(&e);
        let _ =
            tokio::time::timeout_at(deadline, std::future::poll_fn(|cx| conn.poll_send(cx))).await;
        return Start::Done;
    }
    Start::Early(Box::new(conn))
}

/// A hello without early data (or early data this agent refuses): tokio-rustls as usual,
/// after putting the bytes read into rustls (and processing them, since tokio-rustls would
/// only look at them after reading more, which a client waiting for our answer never sends).
async fn plain(io: ConnIo<AgentIo>, bytes: Vec<u8>, deadline: Instant, ctx: &Context) -> Start {
    let mut failed = None;
    let mut alert = Vec::new();
    let mut accept = TlsAcceptor::from(ctx.tls.config()).accept_with(io, |tls| {
        tls.reject_early_data();
        if let Err(e) = feed(tls, &bytes) {
            let _ = tls.write_tls(&mut alert);
            failed = Some(e);
        }
    });
    let Some(e) = failed else {
        return Start::Plain(accept);
    };
    let reason = FailureReason::of(&e);
    ctx.metrics.failure(reason);
    tracing::debug!(reason = reason.label(), error = %e, "handshake failed");
    if let Some(io) = accept.get_mut() {
        let _ = tokio::time::timeout_at(deadline, io.write_all(&alert)).await;
    }
    Start::Done
}

/// Puts bytes already read from the client into rustls and processes them.
fn feed(tls: &mut ServerConnection, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        if tls.read_tls(&mut bytes)? == 0 {
            break;
        }
        tls.process_new_packets()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
    Ok(())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// rustls' session cache for one connection: the session taken for its first PSK identity
/// (given out once), everything else from the agent's cache.
struct Prefetched {
    key: Vec<u8>,
    value: Mutex<Option<Zeroizing<Vec<u8>>>>,
    inner: Arc<dyn StoresServerSessions>,
}

/// Never the value: it holds the resumption secret.
impl std::fmt::Debug for Prefetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetched").finish_non_exhaustive()
    }
}

impl StoresServerSessions for Prefetched {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner.put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(key)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        if key != self.key.as_slice() {
            return self.inner.take(key);
        }
        // Taken from the store already: never a second take of the same ticket.
        let mut value = self
            .value
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        Some(std::mem::take(&mut *value))
    }

    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

/// A TLS connection whose client offered early data, driven here from its ClientHello on.
pub(crate) struct EarlyConn {
    io: ConnIo<AgentIo>,
    tls: ServerConnection,
    state: Arc<EarlyState>,
    /// rustls accepted the early data (fixed by the hello).
    accepted: bool,
    metrics: Arc<Metrics>,
    /// The client's side has ended (rustls has been told).
    eof: bool,
    /// close_notify queued.
    closing: bool,
    /// The handshake's end (or failure) has been counted.
    counted: bool,
}

impl EarlyConn {
    /// What the HTTP layer is told; `early` only when early data was accepted.
    pub(crate) fn info(&self, peer: SocketAddr) -> ConnInfo {
        // early data is refused with --client-ca, so there is no client certificate here
        ConnInfo {
            early: self.accepted.then(|| self.state.clone()),
            ..ConnInfo::of(peer, &self.tls)
        }
    }

    /// Counts a failed handshake once (an error after the handshake is not one).
    fn failed(&mut self, e: &io::Error) {
        if self.tls.is_handshaking() && !self.counted {
            self.counted = true;
            let reason = FailureReason::of(e);
            self.metrics.failure(reason);
            tracing::debug!(reason = reason.label(), error = %e, "handshake failed");
        }
    }

    /// Counts the handshake when it has just ended, and tells the HTTP layer.
    fn note_progress(&mut self) {
        if self.tls.is_handshaking() || self.counted {
            return;
        }
        self.counted = true;
        self.state.handshake_done();
        let version = match self.tls.protocol_version() {
            Some(ProtocolVersion::TLSv1_2) => Version::Tls12,
            _ => Version::Tls13,
        };
        let kind = self.tls.handshake_kind();
        self.metrics.handshake(
            version,
            kind == Some(HandshakeKind::Resumed),
            kind == Some(HandshakeKind::FullWithHelloRetryRequest),
        );
    }

    /// Drives the handshake to its end (the client's Finished), reading no plaintext out: what
    /// follows it stays in rustls for whoever reads the connection next. Ends once rustls has
    /// sent all it queued (the tickets).
    fn poll_handshake(&mut self, cx: &mut task::Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if let Poll::Ready(Err(e)) = self.poll_send(cx) {
                self.failed(&e);
                return Poll::Ready(Err(e));
            }
            if !self.tls.is_handshaking() {
                self.note_progress();
                return self.poll_send(cx);
            }
            if self.eof {
                let e = io::Error::from(io::ErrorKind::UnexpectedEof);
                self.failed(&e);
                return Poll::Ready(Err(e));
            }
            let mut sync = SyncIo {
                io: &mut self.io,
                cx,
            };
            match self.tls.read_tls(&mut sync) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => {
                    self.failed(&e);
                    return Poll::Ready(Err(e));
                }
            }
            if let Err(e) = self.tls.process_new_packets() {
                let e = io::Error::new(io::ErrorKind::InvalidData, e);
                self.failed(&e);
                let _ = self.poll_send(cx); // the alert, if the socket takes it now
                return Poll::Ready(Err(e));
            }
            self.note_progress();
        }
    }

    /// The connection, its handshake done and its flight sent ([`EarlyConn::poll_handshake`]),
    /// as a tokio-rustls stream, and the early data not read yet. rustls' state moves over as
    /// it is: tokio-rustls makes streams only by accepting, but lets the caller set up the
    /// connection it accepts with; this one replaces it, and with its handshake done,
    /// accepting is flushing.
    async fn into_stream(
        self,
        deadline: Instant,
        config: Arc<rustls::ServerConfig>,
    ) -> Option<(RustlsStream, Vec<u8>)> {
        let EarlyConn { io, tls, .. } = self;
        let mut tls = Some(tls);
        let mut early = Vec::new();
        if let Some(mut data) = tls.as_mut().and_then(|t| t.early_data()) {
            // bounded by --early-data: rustls refused a client that sent more
            data.read_to_end(&mut early).ok()?;
        }
        let accept = TlsAcceptor::from(config).accept_with(io, |fresh| {
            if let Some(tls) = tls.take() {
                *fresh = tls;
            }
        });
        match tokio::time::timeout_at(deadline, accept).await {
            Ok(Ok(stream)) => Some((stream, early)),
            _ => None,
        }
    }

    /// Writes what rustls has queued (records, alerts); `Pending` while the socket is full.
    fn poll_send(&mut self, cx: &mut task::Context<'_>) -> Poll<io::Result<()>> {
        while self.tls.wants_write() {
            let mut sync = SyncIo {
                io: &mut self.io,
                cx,
            };
            match self.tls.write_tls(&mut sync) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }
}

impl AsyncRead for EarlyConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            // Early data first: it comes before anything sent after the handshake. (Bounded
            // by --early-data: rustls refuses a client that sends more.)
            if let Some(mut early) = this.tls.early_data() {
                let n = early.read(buf.initialize_unfilled())?;
                if n > 0 {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
            }
            if !this.tls.is_handshaking() {
                match this.tls.reader().read(buf.initialize_unfilled()) {
                    // 0: close_notify, the end
                    Ok(n) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            // What rustls queued goes out before we wait on the client (its flight, tickets).
            if let Poll::Ready(Err(e)) = this.poll_send(cx) {
                this.failed(&e);
                return Poll::Ready(Err(e));
            }
            if this.eof {
                let e = io::Error::from(io::ErrorKind::UnexpectedEof);
                this.failed(&e);
                return Poll::Ready(Err(e));
            }
            let mut sync = SyncIo {
                io: &mut this.io,
                cx,
            };
            match this.tls.read_tls(&mut sync) {
                Ok(0) => this.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => {
                    this.failed(&e);
                    return Poll::Ready(Err(e));
                }
            }
            if let Err(e) = this.tls.process_new_packets() {
                let e = io::Error::new(io::ErrorKind::InvalidData, e);
                this.failed(&e);
                let _ = this.poll_send(cx); // the alert, if the socket takes it now
                return Poll::Ready(Err(e));
            }
            this.note_progress();
        }
    }
}

impl AsyncWrite for EarlyConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // rustls buffers at most its buffer limit (64 KiB) and says how much it took.
        let n = this.tls.writer().write(buf)?;
        if let Poll::Ready(Err(e)) = this.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        if n == 0 && !buf.is_empty() {
            if this.tls.wants_write() {
                return Poll::Pending; // woken when the socket takes records
            }
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut task::Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut task::Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closing {
            this.closing = true;
            this.tls.send_close_notify();
        }
        std::task::ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// `std::io` over the async socket for rustls: `Pending` is `WouldBlock` (the waker is set).
struct SyncIo<'a, 'b> {
    io: &'a mut ConnIo<AgentIo>,
    cx: &'a mut task::Context<'b>,
}

impl Read for SyncIo<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rb = ReadBuf::new(buf);
        match Pin::new(&mut *self.io).poll_read(self.cx, &mut rb) {
            Poll::Ready(Ok(())) => Ok(rb.filled().len()),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl Write for SyncIo<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write(self.cx, buf) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write_vectored(self.cx, bufs) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match Pin::new(&mut *self.io).poll_flush(self.cx) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

/// An HTTP/1.1 connection that offered early data, its handshake done: what the path of every
/// other connection needs to serve it on.
pub(crate) struct Handover {
    pub(crate) stream: RustlsStream,
    pub(crate) info: ConnInfo,
    /// Read, not served yet (what followed the first request, early data included).
    pub(crate) ahead: bytes::Bytes,
    /// The first request's deadline, if it has not come yet (early data refused).
    pub(crate) first: Option<Instant>,
}

impl EarlyConn {
    /// Whether rustls accepted the early data (fixed by the hello).
    pub(crate) fn accepted(&self) -> bool {
        self.accepted
    }

    /// Sends the server's flight by `deadline`; `false` if the connection ended (counted).
    pub(crate) async fn send_flight(&mut self, deadline: Instant) -> bool {
        match tokio::time::timeout_at(deadline, std::future::poll_fn(|cx| self.poll_send(cx))).await
        {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                self.failed(&e);
                false
            }
            Err(_) => {
                self.metrics.failure(FailureReason::Timeout);
                false
            }
        }
    }

    /// Ends at `deadline` if the handshake is still running then (counted as a timeout: a
    /// client that sent early data and never its Finished is cut, its early request answered);
    /// never ends otherwise.
    pub(crate) fn handshake_overdue(
        &self,
        deadline: Instant,
        peer: SocketAddr,
    ) -> impl std::future::Future<Output = ()> {
        let (state, metrics) = (self.state.clone(), self.metrics.clone());
        async move {
            tokio::time::sleep_until(deadline).await;
            if state.handshaking() {
                metrics.failure(FailureReason::Timeout);
                tracing::debug!(%peer, "handshake timed out after early data");
            } else {
                std::future::pending::<()>().await
            }
        }
    }

    /// Drives the handshake to its end by `deadline` and hands the HTTP/1.1 connection over
    /// (`None`: it ended). `ahead`: what was read after the first request; `first`: the first
    /// request's deadline if it has not come yet (early data refused).
    pub(crate) async fn finish(
        mut self,
        ahead: bytes::Bytes,
        first: Option<Instant>,
        peer: SocketAddr,
        deadline: Instant,
        config: Arc<rustls::ServerConfig>,
    ) -> Option<Handover> {
        match tokio::time::timeout_at(deadline, std::future::poll_fn(|cx| self.poll_handshake(cx)))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return None, // counted
            Err(_) => {
                self.metrics.failure(FailureReason::Timeout);
                tracing::debug!(%peer, "handshake timed out after early data");
                return None;
            }
        }
        let (stream, early) = self.into_stream(deadline, config).await?;
        let info = ConnInfo::of(peer, stream.get_ref().1);
        Some(Handover {
            stream,
            info,
            ahead: [&ahead[..], &early[..]].concat().into(),
            first,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use rustls::server::StoresServerSessions;

    /// Keeps what rustls stores, to read its encoding back.
    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<Vec<u8>>>);

    impl StoresServerSessions for Recorder {
        fn put(&self, _: Vec<u8>, value: Vec<u8>) -> bool {
            self.0.lock().unwrap().push(value);
            true
        }
        fn get(&self, _: &[u8]) -> Option<Vec<u8>> {
            None
        }
        fn take(&self, _: &[u8]) -> Option<Vec<u8>> {
            None
        }
        fn can_cache(&self) -> bool {
            true
        }
    }

    /// `early::session_times` reads rustls' own encoding: a real TLS 1.3 handshake's stored
    /// session ends with its creation time (now) and an age_add.
    #[test]
    fn session_times_match_rustls_encoding() {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der().clone();
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![der.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let recorder = Arc::new(Recorder::default());
        server.session_storage = recorder.clone();
        server.max_early_data_size = 1024;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut c =
            rustls::ClientConnection::new(Arc::new(client), "localhost".try_into().unwrap())
                .unwrap();
        let mut s = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).unwrap();
            s.read_tls(&mut buf.as_slice()).unwrap();
            s.process_new_packets().unwrap();
            let mut buf = Vec::new();
            s.write_tls(&mut buf).unwrap();
            c.read_tls(&mut buf.as_slice()).unwrap();
            c.process_new_packets().unwrap();
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let stored = recorder.0.lock().unwrap();
        assert!(!stored.is_empty(), "no ticket stored");
        let times: Vec<_> = stored
            .iter()
            .map(|v| crate::early::session_times(v).unwrap())
            .collect();
        for t in &times {
            assert!(t.created_unix_s.abs_diff(now) <= 2, "{t:?} vs {now}");
        }
        // each ticket its own random age_add
        assert_ne!(times[0].age_add, times[times.len() - 1].age_add);
    }
}
