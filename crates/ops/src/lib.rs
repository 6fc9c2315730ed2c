//! Operations plumbing shared by the agent and the dispatcher: the plain-HTTP Prometheus
//! endpoint and `prometheus-client` helpers (OpenMetrics text, collectors, the process's own
//! CPU and memory), listening sockets with their start-up lines and the one accept loop,
//! reading PROXY v2 headers (and who may send them), and client-address affinity.

#![forbid(unsafe_code)]

pub mod accept;
pub mod addr;
pub mod affinity;
pub mod check;
pub mod cidr;
pub mod control;
pub mod duration;
pub mod exit;
pub mod guard;
pub mod hello;
pub mod listen;
pub mod metrics;
pub mod process;
pub mod proxy_header;
pub mod reply;
pub mod runtime;
pub mod slots;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use prometheus_client;
use prometheus_client::registry::Registry;

/// Connections the metrics endpoint serves at once, and from one address. Scrapers are few;
/// a held connection costs a task and a socket, and lives at most a few seconds unless it
/// reads its answers; past the cap a newcomer pushes out the oldest (silent first).
const METRICS_CONNECTIONS: usize = 256;
const METRICS_PER_SOURCE: usize = 256;

/// The bounds of a metrics endpoint: a scrape is one small request and a prompt read.
pub fn metrics_limits() -> control::Limits {
    control::Limits {
        slots: slots::Slots::new(slots::Table::new(
            METRICS_CONNECTIONS,
            METRICS_PER_SOURCE,
            0,
        )),
        header_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(5),
        lifetime: Duration::from_secs(120),
        requests: 100,
    }
}

/// Serves `GET /metrics`: the registry as OpenMetrics text ([`metrics::encode`]), until `stop`;
/// `counters` (register them in the registry: [`control::Collected`]) count what its bounds did.
pub async fn serve_metrics(
    listener: TcpListener,
    registry: Arc<Registry>,
    counters: Arc<control::Counters>,
    stop: CancellationToken,
) {
    serve_metrics_with(listener, registry, counters, stop, None).await
}

/// For orchestrators' probes beside the metrics: `GET /live` answers 200 while the process
/// serves at all; `GET /ready` 200 while the server takes new work, 503 once it drains.
#[derive(Debug, Clone)]
pub struct Probes {
    /// Cancelled when the server starts draining.
    pub draining: CancellationToken,
}

/// [`serve_metrics`] with `/live` and `/ready` when `probes` is given.
pub async fn serve_metrics_with(
    listener: TcpListener,
    registry: Arc<Registry>,
    counters: Arc<control::Counters>,
    stop: CancellationToken,
    probes: Option<Probes>,
) {
    control::serve(
        listener,
        stop,
        metrics_limits(),
        counters,
        move |req, _slot| {
            let registry = registry.clone();
            let probes = probes.clone();
            async move {
                const TEXT: &str = "text/plain; charset=utf-8";
                let (status, body, content_type) = match (req.uri().path(), &probes) {
                    ("/metrics" | "/", _) => (
                        StatusCode::OK,
                        metrics::encode(&registry),
                        metrics::CONTENT_TYPE,
                    ),
                    ("/live", Some(_)) => (StatusCode::OK, "live\n".to_string(), TEXT),
                    ("/ready", Some(p)) if p.draining.is_cancelled() => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "draining\n".to_string(),
                        TEXT,
                    ),
                    ("/ready", Some(_)) => (StatusCode::OK, "ready\n".to_string(), TEXT),
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
                r
            }
        },
    )
    .await
}
