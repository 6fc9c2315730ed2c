//! Operations plumbing shared by the agent and the dispatcher: the plain-HTTP Prometheus
//! endpoint and `prometheus-client` helpers (OpenMetrics text, collectors, the process's own
//! CPU and memory), listening sockets with their start-up lines and the one accept loop,
//! reading PROXY v2 headers (and who may send them), and client-address affinity.

#![forbid(unsafe_code)]

pub mod accept;
pub mod affinity;
pub mod cidr;
pub mod hello;
pub mod listen;
pub mod metrics;
pub mod process;
pub mod proxy_header;
pub mod reply;
pub mod runtime;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use prometheus_client;
use prometheus_client::registry::Registry;

/// Connections the metrics endpoint serves at once.
const METRICS_CONNECTIONS: usize = 64;

/// Serves `GET /metrics`: the registry as OpenMetrics text ([`metrics::encode`]), until `stop`.
pub async fn serve_metrics(
    listener: TcpListener,
    registry: Arc<Registry>,
    stop: CancellationToken,
) {
    // Scrapers are few; a cap keeps a flood of connections to this port from costing more
    // than a few tasks.
    let acceptor = accept::Acceptor::new(listener, stop).capped(
        Arc::new(tokio::sync::Semaphore::new(METRICS_CONNECTIONS)),
        || {},
    );
    while let Some(accept::Admitted { tcp, slot, .. }) = acceptor.next().await {
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                async move {
                    let (status, body, content_type) = match req.uri().path() {
                        "/metrics" | "/" => (
                            StatusCode::OK,
                            metrics::encode(&registry),
                            metrics::CONTENT_TYPE,
                        ),
                        _ => (
                            StatusCode::NOT_FOUND,
                            "not found\n".to_string(),
                            "text/plain; charset=utf-8",
                        ),
                    };
                    let mut r = Response::new(Full::new(Bytes::from(body)));
                    *r.status_mut() = status;
                    r.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static(content_type),
                    );
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10));
            let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
            drop(slot);
        });
    }
}
