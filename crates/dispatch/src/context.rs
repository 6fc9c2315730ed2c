//! What every task of a running dispatcher shares: its configuration, the router, the
//! roster of agents and their links, the counters, and the hot restart's state.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use baton_wire::proxy_v2::{self, ProxyHeader};

use crate::config::DispatchConfig;
use crate::metrics::Metrics;
use crate::roster::Roster;
use crate::route::Router;

/// The dispatcher's state, one per process.
pub(crate) struct Context {
    pub(crate) config: DispatchConfig,
    pub(crate) router: Arc<Mutex<Router>>,
    pub(crate) metrics: Arc<Metrics>,
    /// The agents by the router's slots, with their link pools (`--agent-link`).
    pub(crate) roster: Arc<Roster>,
    /// The hot restart: a successor takes the listeners and live connections.
    pub(crate) restart: crate::restart::state::Restart,
}

impl Context {
    /// The PROXY v2 header that opens a stream to an agent (`--proxy-protocol`), or nothing.
    pub(crate) fn proxy_head(&self, source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
        let mut head = Vec::with_capacity(64);
        if self.config.proxy_protocol {
            proxy_v2::encode(
                &ProxyHeader::Proxy {
                    source,
                    destination,
                },
                &mut head,
            );
        }
        head
    }

    /// How long a splice may stay silent (`--idle-timeout`, `--half-close-timeout`).
    pub(crate) fn splice_limits(&self) -> crate::splice::Limits {
        crate::splice::Limits {
            idle: self.config.idle_timeout,
            half_closed: self.config.half_close_timeout,
        }
    }

    pub(crate) fn router(&self) -> std::sync::MutexGuard<'_, Router> {
        self.router.lock().unwrap_or_else(|p| p.into_inner())
    }
}
