//! Operations plumbing shared by the agent and the dispatcher: the plain-HTTP Prometheus
//! endpoint, the text format's family header, the process's own CPU and memory, listening
//! sockets with their start-up lines, reading PROXY v2 headers (and who may send them), and
//! client-address affinity.

pub mod affinity;
pub mod cidr;
pub mod listen;
pub mod metrics;
pub mod process;
pub mod proxy_header;

use std::fmt::Write as _;
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

/// Writes the `# HELP` and `# TYPE` lines of a metric family.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Appends `process_cpu_seconds_total` and `process_resident_memory_bytes`.
pub fn render_process(out: &mut String) {
    let usage = process::usage();
    family(
        out,
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time of the process.",
    );
    let _ = writeln!(out, "process_cpu_seconds_total {:.6}", usage.cpu_seconds);
    family(
        out,
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory of the process.",
    );
    let _ = writeln!(out, "process_resident_memory_bytes {}", usage.rss_bytes);
}

/// Serves `GET /metrics` (Prometheus text, from `render`) until `stop`.
pub async fn serve_metrics(
    listener: TcpListener,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    stop: CancellationToken,
) {
    serve(listener, render, "text/plain; version=0.0.4", stop).await
}

/// Serves `GET /metrics`: the registry as OpenMetrics text ([`metrics::encode`]), until `stop`.
pub async fn serve_registry(
    listener: TcpListener,
    registry: Arc<Registry>,
    stop: CancellationToken,
) {
    let render = Arc::new(move || metrics::encode(&registry));
    serve(listener, render, metrics::CONTENT_TYPE, stop).await
}

async fn serve(
    listener: TcpListener,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    content_type: &'static str,
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
        let render = render.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let render = render.clone();
                async move {
                    let (status, body) = match req.uri().path() {
                        "/metrics" | "/" => (StatusCode::OK, render()),
                        _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
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
