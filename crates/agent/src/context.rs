//! What every connection of the agent shares: the configuration, the TLS configuration, the
//! counters, the HTTP service, the import state of migrations and the drain signals. Built by
//! `server` and passed down the connection path, which never reaches back up for it.

use std::sync::{Arc, OnceLock};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::challenges::Challenges;
use crate::config::AgentConfig;
use crate::http::HttpService;
use crate::metrics::Metrics;
use crate::migration::replay::ImportState;
use crate::tls::Tls;

/// What every connection task shares.
pub struct Context {
    pub config: AgentConfig,
    pub tls: Tls,
    pub metrics: Arc<Metrics>,
    /// Imports of migrated sessions (replay guard).
    pub importer: ImportState,
    pub http: Arc<HttpService>,
    /// Cancelled on SIGTERM: listeners stop, connections finish their current request.
    pub draining: CancellationToken,
    /// The agent link's counters, when it listens.
    pub link_stats: OnceLock<Arc<baton_link::LinkStats>>,
    /// Set while a dispatcher has this agent drained by its operator (`POST /agents/ID/drain`):
    /// the agent goes on serving, but its idle connections move to other agents. Cleared when
    /// it is enabled again.
    pub shedding: watch::Sender<bool>,
    /// ACME challenge answers, while an order waits on them (shared with the resolver).
    pub challenges: Arc<Challenges>,
}

impl Context {
    /// A context before any connection: nothing imported, no link yet, not shed.
    pub fn new(
        config: AgentConfig,
        tls: Tls,
        metrics: Arc<Metrics>,
        http: Arc<HttpService>,
        draining: CancellationToken,
    ) -> Self {
        Context {
            config,
            metrics,
            importer: Default::default(),
            http,
            draining,
            link_stats: Default::default(),
            shedding: watch::Sender::new(false),
            challenges: tls.challenges().clone(),
            tls,
        }
    }
}

/// What the agent builds for its connections, without listeners or signals (tests that drive
/// the connection path over sockets of their own); with the PEM of any self-signed
/// certificates.
#[cfg(test)]
pub(crate) async fn for_test(config: AgentConfig) -> (Arc<Context>, String) {
    let metrics = Arc::new(Metrics::default());
    let opened = crate::store::open(&config).await.expect("store");
    let (tls, pem) = Tls::new(&config, metrics.clone(), opened).expect("TLS configuration");
    let draining = CancellationToken::new();
    let http = Arc::new(HttpService {
        metrics: metrics.clone(),
        proxy: None,
        root_body: crate::http::fixed_body(config.body_size),
        max_bytes: config.max_bytes,
        draining: draining.clone(),
        access_log: None,
        drain_timeout: config.drain_timeout,
    });
    let context = Context::new(config, tls, metrics, http, draining);
    (Arc::new(context), pem)
}
