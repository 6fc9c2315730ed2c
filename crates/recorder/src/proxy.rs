//! The recorder's network side: one proxy connection = `CONNECT host:port`, then the browser's
//! TLS terminated with a leaf for the name it asks for, then HTTP/1.1 or HTTP/2 (by ALPN)
//! whose requests are forwarded to the real origin over TLS and recorded once it answers.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

use super::ca::Ca;
use super::connect::{self, Head};
use super::recording::{headers_of, Exchange, Recording};

/// How long each phase a peer can stall may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The CONNECT head, the browser's TLS handshake, the origin's TCP connect and handshake.
    pub phase: Duration,
    /// A request body; the origin's response head.
    pub exchange: Duration,
    /// An idle keep-alive connection, to the browser or to the origin.
    pub idle: Duration,
    /// Request bodies above this are refused with 413 and not recorded.
    pub max_body: usize,
}

pub type Body = BoxBody<Bytes, hyper::Error>;

pub struct Shared {
    pub ca: Ca,
    pub client: Client<Upstream, Full<Bytes>>,
    pub recording: Mutex<Recording>,
    pub started: Instant,
    pub limits: Limits,
    /// Set once `--max-requests` are recorded.
    pub stop: tokio::sync::watch::Sender<bool>,
    /// `--keep-credentials`: else the log shows URLs with credential-like query values masked.
    pub keep_credentials: bool,
}

impl Shared {
    /// `url` as the log shows it.
    fn loggable(&self, url: &str) -> String {
        match self.keep_credentials {
            true => url.to_string(),
            false => super::redact::url(url).0,
        }
    }
}

/// Handles one proxy connection; failures are the peer's business and only logged.
pub async fn serve(tcp: TcpStream, shared: Arc<Shared>) {
    let peer = tcp.peer_addr().ok();
    if let Err(e) = intercept(tcp, &shared).await {
        tracing::debug!(?peer, "proxy connection: {e:#}");
    }
}

async fn intercept(mut tcp: TcpStream, shared: &Arc<Shared>) -> anyhow::Result<()> {
    let limits = shared.limits;
    let mut buf = Vec::with_capacity(1024);
    let head = timeout(limits.phase, async {
        let mut chunk = [0u8; 2048];
        loop {
            let n = tcp.read(&mut chunk).await?;
            if n == 0 {
                anyhow::bail!("closed before a request head");
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(h) = connect::parse(&buf).map_err(anyhow::Error::msg)? {
                return Ok(h);
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("no CONNECT within {:?}", limits.phase))??;
    let (host, port) = match head {
        Head::Refuse { status, reason } => {
            let reply = format!(
                "HTTP/1.1 {status} Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reason}\n",
                reason.len() + 1
            );
            tcp.write_all(reply.as_bytes()).await?;
            anyhow::bail!("refused: {reason}");
        }
        Head::Connect { host, port, len } => {
            // a client speaks in the tunnel only once it is open
            anyhow::ensure!(buf.len() == len, "data after CONNECT before the 200");
            (host, port)
        }
    };
    tcp.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await?;
    tcp.set_nodelay(true)?;

    let start = timeout(
        limits.phase,
        tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp),
    )
    .await
    .map_err(|_| anyhow::anyhow!("no ClientHello within {:?}", limits.phase))??;
    // the certificate is for the name the browser checks: SNI, else the CONNECT host (an IP)
    let name = start
        .client_hello()
        .server_name()
        .map(str::to_string)
        .unwrap_or_else(|| host.clone());
    let config = shared.ca.server_config(&name)?;
    let tls = timeout(limits.phase, start.into_stream(config))
        .await
        .map_err(|_| anyhow::anyhow!("TLS handshake over {:?}", limits.phase))??;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");

    // requests go where the browser tunnelled to
    let origin: Arc<str> = format!("https://{}", connect::url_authority(&host, port)).into();
    let s = shared.clone();
    let service = service_fn(move |req| forward(s.clone(), origin.clone(), req));
    let io = TokioIo::new(tls);
    if h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .max_header_list_size(64 * 1024)
            .max_concurrent_streams(128)
            .keep_alive_interval(limits.idle)
            .keep_alive_timeout(limits.phase)
            .serve_connection(io, service)
            .await?;
    } else {
        hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.idle)
            .max_headers(128)
            .max_buf_size(64 * 1024)
            .serve_connection(io, service)
            .await?;
    }
    Ok(())
}

/// Hop-by-hop fields (RFC 9110 7.6.1) and the proxy's own: never forwarded either way.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    // and whatever `Connection` names
    let named: Vec<String> = h
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .collect();
    for n in HOP_BY_HOP
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        h.remove(n);
    }
}

fn reply(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(text + "\n"))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}

async fn forward(
    shared: Arc<Shared>,
    origin: Arc<str>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let start_ms = shared.started.elapsed().as_secs_f64() * 1000.0;
    let limits = shared.limits;
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let url = format!("{origin}{path}");
    let (parts, body) = req.into_parts();
    let method = parts.method.as_str().to_string();
    let fail = |status: StatusCode, why: String| {
        tracing::warn!("{method} {}: {why}", shared.loggable(&url));
        shared
            .recording
            .lock()
            .unwrap()
            .fail(&method, &url, why.clone());
        Ok(reply(status, format!("baton record: {why}")))
    };

    let body = match timeout(
        limits.exchange,
        Limited::new(body, limits.max_body).collect(),
    )
    .await
    {
        Ok(Ok(c)) => c.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return fail(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body over --max-body {} bytes", limits.max_body),
            )
        }
        Ok(Err(e)) => return fail(StatusCode::BAD_REQUEST, format!("request body: {e}")),
        Err(_) => {
            return fail(
                StatusCode::REQUEST_TIMEOUT,
                format!("request body not in within {:?}", limits.exchange),
            )
        }
    };
    let recorded_body = (!body.is_empty() || matches!(method.as_str(), "POST" | "PUT" | "PATCH"))
        .then(|| body.to_vec());

    let Ok(uri) = url.parse::<Uri>() else {
        return fail(StatusCode::BAD_REQUEST, "not a valid URL".into());
    };
    let mut up = Request::new(Full::new(body));
    *up.method_mut() = parts.method.clone();
    *up.uri_mut() = uri;
    *up.headers_mut() = parts.headers.clone();
    strip_hop_by_hop(up.headers_mut());
    // the URL names the origin; the body is whole, so the client frames it
    up.headers_mut().remove(http::header::HOST);
    up.headers_mut().remove(http::header::CONTENT_LENGTH);

    let resp = match timeout(limits.exchange, shared.client.request(up)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            let mut why = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                why = format!("{why}: {s}");
                src = s.source();
            }
            return fail(StatusCode::BAD_GATEWAY, format!("origin: {why}"));
        }
        Err(_) => {
            return fail(
                StatusCode::BAD_GATEWAY,
                format!("origin: no response within {:?}", limits.exchange),
            )
        }
    };
    tracing::info!(
        "recorded {method} {} -> {}",
        shared.loggable(&url),
        resp.status().as_u16()
    );
    let full = shared.recording.lock().unwrap().observe(Exchange {
        start_ms,
        method,
        url,
        headers: headers_of(&parts.headers),
        body: recorded_body,
    });
    if full {
        shared.stop.send_replace(true);
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, body.boxed()))
}

/// Connects to origins: TCP, then TLS with the URL's host as the name (ALPN h2, http/1.1),
/// each phase timed.
#[derive(Clone)]
pub struct Upstream {
    pub tls: tokio_rustls::TlsConnector,
    pub timeout: Duration,
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<UpstreamIo>> + Send>>;

impl tower_service::Service<Uri> for Upstream {
    type Response = UpstreamIo;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let this = self.clone();
        Box::pin(async move {
            let err = |m: String| io::Error::other(m);
            let host = uri
                .host()
                .ok_or_else(|| err(format!("{uri}: no host")))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = timeout(this.timeout, TcpStream::connect((host.as_str(), port)))
                .await
                .map_err(|_| err(format!("connecting to {host}:{port}: timed out")))??;
            tcp.set_nodelay(true)?;
            let name = ServerName::try_from(host.clone())
                .map_err(|_| err(format!("`{host}` is not a server name")))?;
            let tls = timeout(this.timeout, this.tls.connect(name, tcp))
                .await
                .map_err(|_| err(format!("TLS handshake with {host}:{port}: timed out")))??;
            Ok(UpstreamIo(TokioIo::new(tls)))
        })
    }
}

/// A TLS connection to an origin, telling the pool whether it speaks HTTP/2.
pub struct UpstreamIo(TokioIo<tokio_rustls::client::TlsStream<TcpStream>>);

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        let c = Connected::new();
        if self.0.inner().get_ref().1.alpn_protocol() == Some(b"h2") {
            c.negotiated_h2()
        } else {
            c
        }
    }
}

impl hyper::rt::Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// Trust roots for origins: the `--upstream-ca` files, and the system's bundle when there is
/// one (`SSL_CERT_FILE`, else Debian's or Red Hat's path).
pub fn roots(upstream_ca: &[std::path::PathBuf]) -> anyhow::Result<(rustls::RootCertStore, usize)> {
    use anyhow::Context as _;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for path in upstream_ca {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect())
            .with_context(|| format!("--upstream-ca {}", path.display()))?;
        anyhow::ensure!(
            !certs.is_empty(),
            "--upstream-ca {}: no certificate",
            path.display()
        );
        for c in certs {
            roots
                .add(c)
                .with_context(|| format!("--upstream-ca {}", path.display()))?;
        }
    }
    let system = std::env::var_os("SSL_CERT_FILE")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain(
            [
                "/etc/ssl/certs/ca-certificates.crt",
                "/etc/pki/tls/certs/ca-bundle.crt",
            ]
            .map(std::path::PathBuf::from),
        )
        .find(|p| p.is_file());
    let mut from_system = 0;
    if let Some(p) = system {
        if let Ok(it) = CertificateDer::pem_file_iter(&p) {
            let certs: Vec<_> = it.filter_map(Result::ok).collect();
            from_system = roots.add_parsable_certificates(certs).0;
        }
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "no trust roots for origins: no system bundle found; give --upstream-ca"
    );
    Ok((roots, from_system))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_fields_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("accept", "*/*".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("accept"));
    }
}
