//! A pool's connections to its upstreams: one hyper client per upstream (keep-alive
//! connections kept up to `max-idle`, for `keepalive-timeout`), TLS by rustls with the pool's
//! CA or the system's, SNI, an optional client certificate and session resumption (rustls'
//! client session cache: a new connection to an upstream resumes), HTTP/2 by ALPN over TLS or
//! by prior knowledge (h2c). And the pool's health checker: a thin task per upstream feeding
//! `upstream::Backends::checked`.
//!
//! Each upstream's client connects to that upstream whatever the request's URI says: the URI
//! carries the client's host, so that HTTP/1.1 gets it as `Host` and HTTP/2 as `:authority`
//! (a request may not carry both, and which one is known only once ALPN has picked).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use anyhow::{anyhow, bail, Context as _};
use http::uri::{Authority, Scheme};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::body::Body;
use crate::route_config::{PoolConfig, UpstreamProtocol};
use crate::upstream::Backends;

pub type UpstreamClient = Client<HttpsConnector<ToUpstream>, Body>;

/// A pool at run time.
#[derive(Debug)]
pub struct Pool {
    pub config: PoolConfig,
    pub backends: Arc<Backends>,
    /// One per upstream, in the order of `backends`.
    clients: Vec<UpstreamClient>,
}

impl Pool {
    pub fn new(config: PoolConfig) -> anyhow::Result<Pool> {
        let backends = Arc::new(Backends::new(
            config.name.clone(),
            &config.upstreams,
            config.balance,
        )?);
        let tls = tls_config(&config)?;
        let clients = config
            .upstreams
            .iter()
            .map(|a| client(&config, a, &tls))
            .collect::<anyhow::Result<_>>()?;
        Ok(Pool {
            config,
            backends,
            clients,
        })
    }

    /// The client that reaches upstream `i`.
    pub fn client(&self, i: usize) -> &UpstreamClient {
        &self.clients[i]
    }

    /// Starts one checker task per upstream when the pool has health checks; they run until
    /// `stop`.
    pub fn start_checks(self: &Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let Some(health) = self.config.health.clone() else {
            return;
        };
        for i in 0..self.backends.len() {
            let pool = self.clone();
            let health = health.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(health.interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    let status = pool.probe(i, &health.path, health.timeout).await;
                    let passed = status.as_ref().is_ok_and(|s| *s == health.status);
                    let upstream = pool.backends.authority(i);
                    if let Some(up) = pool.backends.checked(i, passed, health.rise, health.fall) {
                        let pool = &*pool.config.name;
                        match (up, &status) {
                            (true, _) => {
                                tracing::info!(pool, %upstream, "health checks: upstream back in")
                            }
                            (false, Ok(s)) => {
                                tracing::warn!(pool, %upstream, status = s.as_u16(), "health checks: upstream out")
                            }
                            (false, Err(e)) => {
                                tracing::warn!(pool, %upstream, error = %e, "health checks: upstream out")
                            }
                        }
                    }
                }
            });
        }
    }

    /// One health check: `GET path` on upstream `i`, its status.
    async fn probe(
        &self,
        i: usize,
        path: &str,
        timeout: std::time::Duration,
    ) -> anyhow::Result<StatusCode> {
        // the host asked for: the name the pool's certificates are checked for, if set
        let authority: Authority = match &self.config.sni {
            Some(name) => name.parse()?,
            None => self.backends.authority(i).clone(),
        };
        let uri = Uri::builder()
            .scheme(self.config.scheme.clone())
            .authority(authority)
            .path_and_query(path)
            .build()?;
        let req = Request::get(uri).body(Empty::new().map_err(|e| match e {}).boxed())?;
        let started = Instant::now();
        let response = tokio::time::timeout(timeout, self.clients[i].request(req))
            .await
            .map_err(|_| anyhow!("no answer in {timeout:?}"))??;
        let status = response.status();
        // read the body so the connection goes back to the pool, within the same deadline
        let left = timeout.saturating_sub(started.elapsed());
        let _ = tokio::time::timeout(left, response.into_body().collect()).await;
        Ok(status)
    }
}

/// The pool's rustls client configuration: its CA (or the system's), its client certificate.
fn tls_config(config: &PoolConfig) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    if config.scheme == Scheme::HTTPS {
        match &config.ca {
            Some(path) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                    .with_context(|| {
                        format!("pool {}: reading ca {}", config.name, path.display())
                    })?
                    .collect::<Result<_, _>>()
                    .with_context(|| {
                        format!("pool {}: parsing ca {}", config.name, path.display())
                    })?;
                if certs.is_empty() {
                    bail!("pool {}: no CERTIFICATE in {}", config.name, path.display());
                }
                for c in certs {
                    roots.add(c).with_context(|| {
                        format!(
                            "pool {}: a CA in {} is not usable",
                            config.name,
                            path.display()
                        )
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for e in &found.errors {
                    tracing::warn!(error = %e, "reading the system's CA certificates");
                }
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    bail!(
                        "pool {}: no system CA certificates found: give the pool a `ca`",
                        config.name
                    );
                }
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots);
    Ok(match &config.client_cert {
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("reading client-cert {}", cert.display()))?
                .collect::<Result<_, _>>()
                .with_context(|| format!("parsing client-cert {}", cert.display()))?;
            // the key's bytes are never logged: errors name the file only
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| anyhow!("{}: no usable private key: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .with_context(|| format!("pool {}: client-cert and client-key", config.name))?
        }
        None => builder.with_no_client_auth(),
    })
}

/// The client for one upstream: its address fixed under whatever URI a request has, its name
/// for SNI and the certificate check (the pool's `sni`, else the upstream's host).
fn client(
    config: &PoolConfig,
    upstream: &Authority,
    tls: &rustls::ClientConfig,
) -> anyhow::Result<UpstreamClient> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    http.set_connect_timeout(Some(config.connect_timeout));
    let target = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(upstream.clone())
        .path_and_query("/")
        .build()?;
    let host = upstream
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = config.sni.as_deref().unwrap_or(host);
    let name = ServerName::try_from(name.to_owned()).map_err(|e| {
        anyhow!(
            "pool {}: `{name}` is not a TLS server name: {e}",
            config.name
        )
    })?;
    // the pool's rustls config: one session cache (by server name) for all its upstreams
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_or_http()
        .with_server_name_resolver(FixedServerNameResolver::new(name));
    let to = ToUpstream { http, target };
    let connector = match (config.protocol, config.scheme == Scheme::HTTPS) {
        // over TLS the upstream picks by ALPN; in the clear, HTTP/1.1 unless told
        (UpstreamProtocol::Auto, true) => builder.enable_http1().enable_http2().wrap_connector(to),
        (UpstreamProtocol::H2, true) => builder.enable_http2().wrap_connector(to),
        _ => builder.enable_http1().wrap_connector(to),
    };
    Ok(Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(config.keepalive_timeout)
        .pool_max_idle_per_host(config.max_idle)
        .http2_only(config.protocol == UpstreamProtocol::H2)
        .build(connector))
}

/// A connector that always connects to one upstream, whatever the URI asks for.
#[derive(Clone, Debug)]
pub struct ToUpstream {
    http: HttpConnector,
    target: Uri,
}

type Connected = <HttpConnector as tower_service::Service<Uri>>::Response;
type ConnectError = <HttpConnector as tower_service::Service<Uri>>::Error;

impl tower_service::Service<Uri> for ToUpstream {
    type Response = Connected;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Connected, ConnectError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx)
    }

    fn call(&mut self, _asked: Uri) -> Self::Future {
        Box::pin(self.http.call(self.target.clone()))
    }
}
