//! The dispatcher's agent links (`--agent-link`): a pool of authenticated, multiplexed
//! connections per agent (`baton-link`), opened at start and kept up in the background.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use anyhow::Context;
use baton_link::LinkPool;
use baton_session::ticket::KeyRing;

use crate::config::DispatchConfig;

/// One pool per agent, in agent order; none without `--agent-link`.
pub fn pools(config: &DispatchConfig) -> anyhow::Result<Vec<LinkPool>> {
    if config.agent_links.is_empty() {
        return Ok(Vec::new());
    }
    let path = config
        .cluster_key_file
        .as_ref()
        .context("--agent-link needs --cluster-key-file")?;
    let ring = KeyRing::read_key_file(path, Instant::now())
        .with_context(|| format!("cluster key file {}", path.display()))?;
    let ring = Arc::new(RwLock::new(ring));
    Ok(config
        .agent_links
        .iter()
        .enumerate()
        .map(|(id, addr)| LinkPool::new(*addr, id as u16, ring.clone(), config.link_connections))
        .collect())
}

/// Waits until every pool has a live connection, or `limit` has passed.
pub async fn wait_up(pools: &[LinkPool], limit: std::time::Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while !pools.iter().all(LinkPool::is_up) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
