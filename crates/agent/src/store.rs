//! Opening the session store the configuration names: this agent's memory, its peers, or Redis.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use anyhow::Context;
use baton_session::{
    AllowFrom, KeyRing, MemoryStore, PeersConfig, RedisConfig, RedisStore, SessionStore, SharedRing,
};

use crate::config::{AgentConfig, StoreKind};

/// The store, and the cluster key ring sealing what it shares (none for `memory`).
pub struct Opened {
    pub store: Option<Arc<dyn SessionStore>>,
    pub ring: Option<SharedRing>,
}

pub async fn open(cfg: &AgentConfig) -> anyhow::Result<Opened> {
    // The ring also seals migrated sessions, so it is opened even without a store.
    let ring = match &cfg.cluster_key_file {
        Some(path) => Some(Arc::new(RwLock::new(read_ring(path)?))),
        None => None,
    };
    if cfg.session_cache_size == 0 {
        return Ok(Opened { store: None, ring });
    }
    let store: Arc<dyn SessionStore> = match (&cfg.store, &ring) {
        (StoreKind::Memory, _) => Arc::new(MemoryStore::new(
            cfg.session_cache_size,
            cfg.session_lifetime,
        )),
        (
            StoreKind::Peers {
                listen,
                peers,
                allow,
            },
            Some(ring),
        ) => {
            let nets = allow.clone();
            let config = PeersConfig {
                agent_id: cfg.agent_id,
                listen: *listen,
                peers: peers.clone(),
                capacity: cfg.session_cache_size,
                ttl: cfg.session_lifetime,
                allow: if nets.is_empty() {
                    AllowFrom::default()
                } else {
                    AllowFrom::new(move |ip| baton_ops::cidr::Cidr::any_contains(&nets, ip))
                },
            };
            baton_session::peers::start(config, ring.clone())
                .await
                .with_context(|| format!("replication listener on {listen}"))?
        }
        (StoreKind::Redis { url }, Some(ring)) => {
            let config = RedisConfig {
                url: url.clone(),
                agent_id: cfg.agent_id,
                capacity: cfg.session_cache_size,
                ttl: cfg.session_lifetime,
                wait: cfg.store_wait,
            };
            RedisStore::start(config, ring.clone()).map_err(anyhow::Error::msg)?
        }
        (_, None) => anyhow::bail!("a shared store needs --cluster-key-file"),
    };
    Ok(Opened {
        store: Some(store),
        ring,
    })
}

/// Reads a cluster (or ticket) key file.
pub fn read_ring(path: &std::path::Path) -> anyhow::Result<KeyRing> {
    Ok(KeyRing::read_key_file(path, Instant::now())?)
}
