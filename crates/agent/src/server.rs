//! The agent process: listeners, the connection cap, the metrics endpoint and signals
//! (SIGHUP reloads certificates and ticket keys, SIGUSR1 reopens the access log, SIGTERM/SIGINT
//! drain).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use baton_ops::accept::{Acceptor, Admitted};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access_log::AccessLog;
use crate::config::AgentConfig;
use crate::context::Context;
use crate::http::{fixed_body, HttpService};
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::tls::Tls;

/// Runs the agent until SIGTERM/SIGINT and the drain that follows.
pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let opened = crate::store::open(&config).await?;
    let (tls, self_signed_pem) = Tls::new(&config, metrics.clone(), opened)?;
    if let Some(path) = &config.self_signed_out {
        std::fs::write(path, &self_signed_pem)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let draining = CancellationToken::new();
    let proxy = config
        .routing
        .as_ref()
        .map(|r| Proxy::new(r).map(|p| p.with_forwarding(config.forwarding.clone())))
        .transpose()?;
    if let Some(p) = &proxy {
        p.start_checks(&draining);
    }
    let upstreams = proxy.as_ref().map(Proxy::backends).unwrap_or_default();
    let access_log = match &config.access_log {
        Some(path) => Some(AccessLog::open(
            path,
            config.access_log_format,
            config.agent_id,
        )?),
        None => None,
    };
    let http = Arc::new(HttpService {
        metrics: metrics.clone(),
        proxy,
        root_body: fixed_body(config.body_size),
        max_bytes: config.max_bytes,
        draining: draining.clone(),
        access_log: access_log.clone(),
        drain_timeout: config.drain_timeout,
    });

    // Handlers first: a SIGTERM sent right after `ready` must drain, not kill the process
    // (the default action) before the handlers exist.
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    // Machine-readable start-up lines on stdout: scripts and tests wait for `ready`.
    let link: Vec<_> = config.link_listen.into_iter().collect();
    let (mut bound, metrics_listener) = baton_ops::listen::open_groups(
        &[
            ("tls", &config.listen),
            ("link", &link),
            ("http", &config.http_listen),
        ],
        config.metrics,
    )?;
    let (http_listeners, link_listener_socket, listeners) = (
        bound.pop().unwrap_or_default(),
        bound.pop().and_then(|mut l| l.pop()),
        bound.pop().unwrap_or_default(),
    );
    // redirects go to the first TLS listener's port (its real one, if it was 0)
    let tls_port = listeners
        .first()
        .and_then(|l| l.local_addr().ok())
        .map_or(443, |a| a.port());
    for entry in tls.cert_summary() {
        tracing::info!(certificate = %entry.0, names = ?entry.1, "serving certificate");
    }

    let ctx = Arc::new(Context::new(
        config,
        tls,
        metrics.clone(),
        http,
        draining.clone(),
    ));
    let tracker = TaskTracker::new();
    let permits = Arc::new(Semaphore::new(ctx.config.max_connections));
    for listener in listeners {
        tokio::spawn(accept_loop(
            listener,
            ctx.clone(),
            permits.clone(),
            tracker.clone(),
        ));
    }
    let mut link_listener = None;
    if let Some(l) = link_listener_socket {
        let ring = ctx
            .tls
            .cluster_ring()
            .cloned()
            .context("--link-listen needs --cluster-key-file")?;
        if ctx.config.link_allow.is_empty() && l.local_addr().is_ok_and(|a| !a.ip().is_loopback()) {
            tracing::warn!(
                "--link-listen accepts link connections from any address: set --link-allow to \
                 the dispatchers' networks"
            );
        }
        let link = Arc::new(baton_link::LinkListener::new(
            l,
            ctx.config.agent_id,
            ring,
            ctx.config.link_allow.clone(),
        ));
        ctx.link_stats.set(link.stats()).ok();
        link_listener = Some(link.clone());
        tokio::spawn(link_accept_loop(
            link,
            ctx.clone(),
            permits.clone(),
            tracker.clone(),
        ));
    }
    tokio::spawn(crate::stapler::run(
        ctx.tls.resolver().clone(),
        ctx.config.ocsp_stapling.clone(),
    ));
    let acme_metrics = ctx.config.acme.as_ref().map(|acme| {
        let m = Arc::new(crate::acme::metrics::AcmeMetrics::new(&acme.domains));
        tokio::spawn(crate::acme::run(ctx.clone(), acme.clone(), m.clone()));
        m
    });
    let http_counters = baton_ops::control::Counters::new("http");
    if !http_listeners.is_empty() {
        let redirect = crate::http_listen::Redirect {
            tls_port,
            challenges: ctx.challenges.clone(),
        };
        // one set of bounds (and one connection cap) for all of them
        let limits = crate::http_listen::limits(ctx.config.header_timeout);
        for l in http_listeners {
            tokio::spawn(crate::http_listen::serve(
                l,
                redirect.clone(),
                limits.clone(),
                http_counters.clone(),
                draining.clone(),
            ));
        }
    }
    // The metrics endpoint outlives the drain, so that /ready can say 503 through it.
    let stopped = CancellationToken::new();
    let _stop_metrics = stopped.clone().drop_guard();
    if let Some(l) = metrics_listener {
        let counters = baton_ops::control::Counters::new("metrics");
        let mut registry = crate::metrics::Collected {
            metrics: metrics.clone(),
            upstreams,
            link: ctx.link_stats.get().cloned(),
            certs: Some(ctx.tls.resolver().clone()),
        }
        .registry();
        registry.register_collector(Box::new(baton_ops::control::Collected(vec![
            counters.clone(),
            http_counters.clone(),
        ])));
        if let Some(m) = acme_metrics {
            registry.register_collector(Box::new(crate::acme::metrics::Collected(m)));
        }
        if let Some(log) = &access_log {
            registry.register_collector(Box::new(crate::access_log::Collected(log.counters())));
        }
        let probes = baton_ops::Probes {
            draining: draining.clone(),
        };
        tokio::spawn(baton_ops::serve_metrics_with(
            l,
            Arc::new(registry),
            counters,
            stopped.clone(),
            Some(probes),
        ));
    }

    loop {
        tokio::select! {
            _ = hup.recv() => reload(&ctx),
            _ = usr1.recv() => match &access_log {
                Some(log) => {
                    tracing::info!("reopening the access log");
                    log.reopen();
                }
                None => tracing::info!("SIGUSR1: no access log to reopen"),
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }

    tracing::info!(
        connections = metrics.active_connections(),
        "draining: no new connections, waiting for open ones"
    );
    draining.cancel();
    let drained = async {
        // Dispatchers hear it on every link (GOAWAY) and take new clients elsewhere; streams
        // they opened before hearing it still arrive, so the links must have closed (each
        // once its last stream ends) before an empty tracker means the work is done.
        if let Some(link) = &link_listener {
            link.drain();
            let stats = link.stats();
            while stats.connections_active() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        tracker.close();
        tracker.wait().await;
    };
    if tokio::time::timeout(ctx.config.drain_timeout, drained)
        .await
        .is_err()
    {
        tracing::warn!(
            connections = metrics.active_connections(),
            "drain timeout reached; closing remaining connections"
        );
    }
    if let Some(log) = access_log {
        // the lines of the connections that ended, out before the process is
        let _ = tokio::task::spawn_blocking(move || log.close(Duration::from_secs(5))).await;
    }
    Ok(())
}

fn reload(ctx: &Context) {
    match ctx.tls.reload(&ctx.config) {
        Ok(()) => {
            ctx.metrics.reload(true);
            tracing::info!("reloaded certificates and ticket keys");
        }
        Err(e) => {
            ctx.metrics.reload(false);
            tracing::error!(error = %format!("{e:#}"), "reload failed; keeping the running configuration");
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<Context>,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
) {
    let metrics = ctx.metrics.clone();
    // Set once on the listener rather than once per connection where the kernel allows.
    let inherited_nodelay = baton_ops::listen::nodelay_on_accept(&listener);
    let acceptor = Acceptor::new(listener, ctx.draining.clone())
        .capped(permits, move || metrics.connection_rejected());
    while let Some(Admitted { tcp, peer, slot }) = acceptor.next().await {
        if !inherited_nodelay {
            let _ = tcp.set_nodelay(true);
        }
        let ctx = ctx.clone();
        // Boxed, as a link stream's task is (`link_accept_loop`).
        tracker.spawn(Box::pin(async move {
            ctx.metrics.connection_opened();
            crate::conn::accept::serve_tcp(tcp, peer, ctx.clone()).await;
            ctx.metrics.connection_closed();
            drop(slot);
        }));
    }
}

/// Streams of the agent link count against the same connection cap as sockets. Draining
/// does not end this loop: the link refuses new streams itself (GOAWAY), and the streams a
/// dispatcher opened before that are still served.
async fn link_accept_loop(
    link: Arc<baton_link::LinkListener>,
    ctx: Arc<Context>,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
) {
    loop {
        let Some(stream) = link.accept().await else {
            return;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            ctx.metrics.connection_rejected();
            drop(stream);
            continue;
        };
        let ctx = ctx.clone();
        // Boxed: the connection's future is large (a TLS handshake, a migration, HTTP), and
        // a task moves an unboxed future into its cell; the box is moved instead.
        tracker.spawn(Box::pin(async move {
            ctx.metrics.connection_opened();
            crate::conn::accept::serve_link(stream, ctx.clone()).await;
            ctx.metrics.connection_closed();
            drop(permit);
        }));
    }
}
