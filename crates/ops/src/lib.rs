//! Operations plumbing shared by the agent and the dispatcher: the plain-HTTP Prometheus
//! endpoint and `prometheus-client` helpers (OpenMetrics text, collectors, the process's own
//! CPU and memory), listening sockets with their start-up lines, reading PROXY v2 headers (and who may send them), and
//! client-address affinity.

pub mod affinity;
pub mod cidr;
pub mod listen;
pub mod metrics;
pub mod process;
pub mod proxy_header;

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

/// Serves `GET /metrics`: the registry as OpenMetrics text ([`metrics::encode`]), until `stop`.
pub async fn serve_metrics(
    listener: TcpListener,
    registry: Arc<Registry>,
    stop: CancellationToken,
) {
    loop {
        let (tcp, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => {
                    // Out of descriptors or similar: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return,
        };
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
        });
    }
}
