//! One client connection: TLS handshake under a deadline, counted as full or resumed, then
//! HTTP/1.1 or HTTP/2 by ALPN until the client leaves, the connection idles out, or the agent
//! drains.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::{HandshakeKind, ProtocolVersion};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use crate::certs::subject_of;
use crate::http::ConnInfo;
use crate::io::ConnIo;
use crate::metrics::{FailureReason, Version};
use crate::server::Shared;

pub async fn serve(tcp: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let cfg = &shared.config;
    let metrics = &shared.metrics;
    let io = ConnIo::new(tcp, metrics.clone(), cfg.idle_timeout);
    let acceptor = TlsAcceptor::from(shared.tls.config());
    let stream = match tokio::time::timeout(cfg.handshake_timeout, acceptor.accept(io)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            let reason = FailureReason::of(&e);
            metrics.failure(reason);
            tracing::debug!(%peer, reason = reason.label(), error = %e, "handshake failed");
            return;
        }
        Err(_) => {
            metrics.failure(FailureReason::Timeout);
            tracing::debug!(%peer, "handshake timed out");
            return;
        }
    };

    let info = {
        let (_, tls) = stream.get_ref();
        let version = match tls.protocol_version() {
            Some(ProtocolVersion::TLSv1_2) => Version::Tls12,
            _ => Version::Tls13,
        };
        let kind = tls.handshake_kind();
        metrics.handshake(
            version,
            kind == Some(HandshakeKind::Resumed),
            kind == Some(HandshakeKind::FullWithHelloRetryRequest),
        );
        ConnInfo {
            peer,
            version: match version {
                Version::Tls12 => "TLSv1.2",
                Version::Tls13 => "TLSv1.3",
            },
            suite: tls
                .negotiated_cipher_suite()
                .map(|s| format!("{:?}", s.suite()))
                .unwrap_or_default(),
            alpn: tls
                .alpn_protocol()
                .map(|p| String::from_utf8_lossy(p).into_owned()),
            sni: tls.server_name().map(String::from),
            resumed: kind == Some(HandshakeKind::Resumed),
            client_subject: tls
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(subject_of),
        }
    };
    let h2 = info.alpn.as_deref() == Some("h2");
    let info = Arc::new(info);
    let http = shared.http.clone();
    let service = service_fn(move |req| http.clone().handle(info.clone(), req));
    let io = TokioIo::new(stream);
    let draining = shared.draining.clone();

    let result = if h2 {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_header_list_size(cfg.max_header_bytes as u32)
            .max_concurrent_streams(256)
            .max_pending_accept_reset_streams(64);
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => r,
            _ = draining.cancelled() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(cfg.header_timeout)
            .max_headers(cfg.max_headers)
            .max_header_size(cfg.max_header_bytes)
            // Bounds what one connection may buffer (pipelined requests, body reads).
            .max_buf_size(cfg.max_header_bytes.max(64 * 1024));
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => r,
            _ = draining.cancelled() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}
