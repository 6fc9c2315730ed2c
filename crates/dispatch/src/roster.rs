//! The tokio side of membership (`members.rs` is the sans-IO side): the agents the connection
//! path reaches, by the router's slots, with each agent's pool of link connections
//! (`--agent-link`, `baton-link`), and the changes operators make, from the agents file
//! (watched, and re-read on SIGHUP) or the admin endpoint (`admin.rs`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use baton_link::{LinkHandle, LinkPool};
use baton_session::{ticket::KeyRing, SharedRing};

use crate::config::DispatchConfig;
use crate::members::{self, Admin, Change, RosterError, Spec};
use crate::metrics::Metrics;
use crate::route::Router;

/// One agent as the connection path reaches it.
pub(crate) struct Agent {
    pub id: u16,
    pub addr: SocketAddr,
    /// Its link connections; `None` without links, and once it has left the roster (the
    /// streams it carries finish on their own connections).
    pub links: Option<LinkPool>,
}

/// The agents by slot, and the roster operators see.
pub(crate) struct Roster {
    /// Indexed like the router's slots (a removed agent's slot is reused with it).
    agents: RwLock<Vec<Arc<Agent>>>,
    /// The roster as last set (what a file reload is compared with).
    specs: Mutex<Vec<Spec>>,
    /// Whether clients travel on links (fixed at start: every agent must then have one).
    ring: Option<SharedRing>,
    link_connections: usize,
    metrics: Arc<Metrics>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError {
    #[error(transparent)]
    Roster(#[from] RosterError),
    #[error("this dispatcher carries clients on agent links: give the agent's link address")]
    LinkNeeded(u16),
    #[error("this dispatcher connects to agents by TCP (no --cluster-key-file): no link address")]
    NoLinks(u16),
    #[error("no agent with id {0}")]
    Unknown(u16),
    #[error("agent {0} is on the roster already")]
    Exists(u16),
}

impl Roster {
    /// The roster at start: from `--agent`/`--agent-link` (ids in order) or the agents file.
    /// `metrics` count by slot: a reused slot's counters start again at zero.
    pub fn start(
        config: &DispatchConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<(Roster, Vec<Spec>)> {
        let specs = config.initial_agents()?;
        let links = specs.iter().any(|s| s.link.is_some());
        let ring = if links {
            let path = config
                .cluster_key_file
                .as_ref()
                .context("agent links need --cluster-key-file")?;
            let ring = KeyRing::read_key_file(path, Instant::now())
                .with_context(|| format!("cluster key file {}", path.display()))?;
            Some(Arc::new(RwLock::new(ring)))
        } else {
            None
        };
        let roster = Roster {
            agents: RwLock::new(Vec::new()),
            specs: Mutex::new(Vec::new()),
            ring,
            link_connections: config.link_connections,
            metrics,
        };
        Ok((roster, specs))
    }

    /// The agent in `slot`.
    pub fn agent(&self, slot: usize) -> Option<Arc<Agent>> {
        self.agents
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(slot)
            .cloned()
    }

    /// A live link connection to the agent in `slot`.
    pub fn link(&self, slot: usize) -> Option<LinkHandle> {
        self.agent(slot)?.links.as_ref()?.pick()
    }

    /// Whether clients travel on links.
    pub fn uses_links(&self) -> bool {
        self.ring.is_some()
    }

    /// The roster as last set.
    pub fn specs(&self) -> Vec<Spec> {
        self.specs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Makes `desired` the roster; returns the changes made.
    pub fn set(
        &self,
        router: &Mutex<Router>,
        desired: Vec<Spec>,
    ) -> Result<Vec<Change>, ChangeError> {
        members::check(&desired)?;
        for s in &desired {
            self.check_links(s)?;
        }
        let mut specs = self.specs.lock().unwrap_or_else(|p| p.into_inner());
        let changes = members::plan(&specs, &desired);
        for c in &changes {
            self.apply(router, c);
        }
        *specs = desired;
        Ok(changes)
    }

    /// One change from an operator, checked against the roster as it is.
    pub fn change(&self, router: &Mutex<Router>, change: Change) -> Result<(), ChangeError> {
        let mut specs = self.specs.lock().unwrap_or_else(|p| p.into_inner());
        match &change {
            Change::Add(s) => {
                if specs.iter().any(|o| o.id == s.id) {
                    return Err(ChangeError::Exists(s.id));
                }
                self.check_links(s)?;
            }
            Change::Remove(id) | Change::SetAdmin(id, _) => {
                if !specs.iter().any(|o| o.id == *id) {
                    return Err(ChangeError::Unknown(*id));
                }
            }
        }
        let next = members::apply(&specs, std::slice::from_ref(&change));
        members::check(&next)?;
        self.apply(router, &change);
        *specs = next;
        Ok(())
    }

    fn check_links(&self, s: &Spec) -> Result<(), ChangeError> {
        match (self.uses_links(), s.link.is_some()) {
            (true, false) => Err(ChangeError::LinkNeeded(s.id)),
            (false, true) => Err(ChangeError::NoLinks(s.id)),
            _ => Ok(()),
        }
    }

    fn apply(&self, router: &Mutex<Router>, change: &Change) {
        let mut router = router.lock().unwrap_or_else(|p| p.into_inner());
        let mut agents = self.agents.write().unwrap_or_else(|p| p.into_inner());
        match change {
            Change::Add(s) => {
                let links = match (&self.ring, s.link) {
                    (Some(ring), Some(addr)) => Some(LinkPool::new(
                        addr,
                        s.id,
                        ring.clone(),
                        self.link_connections,
                    )),
                    _ => None,
                };
                let slot = router.add(s.id);
                router.set_admin(slot, s.admin);
                let agent = Arc::new(Agent {
                    id: s.id,
                    addr: s.addr,
                    links,
                });
                // a removed agent's slot once nothing counts there (`Router::add`)
                match agents.get_mut(slot) {
                    Some(old) => {
                        *old = agent;
                        self.metrics.reset_slot(slot);
                    }
                    None => agents.push(agent),
                }
                tracing::info!(agent = s.id, addr = %s.addr, state = s.admin.label(), "agent joined");
            }
            Change::Remove(id) => {
                if let Some(slot) = router.slot_of(*id) {
                    router.remove(slot);
                    shed(&agents[slot], true);
                    // Its pool goes (no new streams, no reconnects); open streams keep their
                    // connections until they end.
                    let old = agents[slot].clone();
                    agents[slot] = Arc::new(Agent {
                        id: old.id,
                        addr: old.addr,
                        links: None,
                    });
                    tracing::info!(agent = id, "agent left");
                }
            }
            Change::SetAdmin(id, admin) => {
                if let Some(slot) = router.slot_of(*id) {
                    if router.admin(slot) != *admin {
                        shed(&agents[slot], *admin != Admin::Active);
                    }
                    router.set_admin(slot, *admin);
                    tracing::info!(agent = id, state = admin.label(), "agent state set");
                }
            }
        }
    }

    /// Waits until every agent on the roster whose TLS port answers also has a live link, for
    /// up to `limit`; the ids of those that answer without a link by then. A dispatcher's
    /// successor serves only when there are none: connections handed over for an agent it
    /// cannot reach would be lost, while an agent that is down is down for both processes.
    pub async fn wait_reachable(&self, limit: Duration, probe: Duration) -> Result<(), Vec<u16>> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let unlinked: Vec<(u16, SocketAddr)> = {
                let agents = self.agents.read().unwrap_or_else(|p| p.into_inner());
                agents
                    .iter()
                    .filter(|a| a.links.as_ref().is_some_and(|l| !l.is_up()))
                    .map(|a| (a.id, a.addr))
                    .collect()
            };
            let mut answering = Vec::new();
            for (id, addr) in unlinked {
                let connect = tokio::net::TcpStream::connect(addr);
                if matches!(tokio::time::timeout(probe, connect).await, Ok(Ok(_))) {
                    answering.push(id);
                }
            }
            if answering.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(answering);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every agent on the roster has a live link, or `limit` has passed.
    pub async fn wait_up(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        let pools_up = || {
            let agents = self.agents.read().unwrap_or_else(|p| p.into_inner());
            agents
                .iter()
                .all(|a| a.links.as_ref().is_none_or(LinkPool::is_up))
        };
        while !pools_up() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Re-reads the agents file when it changes (checked every second) or when `reread` fires
/// (SIGHUP). A file that does not parse, or a roster that cannot be served, is reported and
/// the running roster kept.
pub(crate) async fn watch_file(
    path: std::path::PathBuf,
    roster: Arc<Roster>,
    router: Arc<Mutex<Router>>,
    reread: Arc<tokio::sync::Notify>,
) {
    let mut seen = modified(&path);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                let now = modified(&path);
                if now == seen {
                    continue;
                }
                seen = now;
            }
            _ = reread.notified() => {}
        }
        match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| members::parse_file(&text).map_err(|e| e.to_string()))
        {
            Ok(specs) => match roster.set(&router, specs) {
                Ok(changes) => {
                    tracing::info!(changes = changes.len(), file = %path.display(), "agents file applied")
                }
                Err(e) => {
                    tracing::error!(error = %e, file = %path.display(), "agents file refused; keeping the running roster")
                }
            },
            Err(e) => {
                tracing::error!(error = %e, file = %path.display(), "agents file unreadable; keeping the running roster")
            }
        }
    }
}

fn modified(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// The state of one agent for operators (the admin endpoint's listing).
#[derive(Debug, serde::Serialize)]
pub(crate) struct Listed {
    #[serde(flatten)]
    pub spec: Spec,
    pub up: bool,
    pub active: u32,
    /// Draining and no connection left: safe to stop.
    pub drained: bool,
}

/// Every agent on the roster with its health and load.
pub(crate) fn list(roster: &Roster, router: &Mutex<Router>) -> Vec<Listed> {
    let specs = roster.specs();
    let r = router.lock().unwrap_or_else(|p| p.into_inner());
    specs
        .into_iter()
        .map(|spec| {
            let slot = r.slot_of(spec.id);
            let active = slot.map_or(0, |s| r.active(s));
            Listed {
                up: slot.is_some_and(|s| r.is_healthy(s)),
                drained: spec.admin != Admin::Active && active == 0,
                active,
                spec,
            }
        })
        .collect()
}

/// Tells an agent (on one of its links) that it is out of rotation (`true`: it moves its idle
/// connections to other agents, which its clients do not notice) or back in (`false`). Sent and
/// forgotten: an agent that misses it only keeps its connections until they end, as before.
fn shed(agent: &Agent, shed: bool) {
    let (Some(link), Ok(rt)) = (
        agent.links.as_ref().and_then(|p| p.pick()),
        tokio::runtime::Handle::try_current(),
    ) else {
        return;
    };
    let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
    let meta = baton_link::StreamMeta {
        source: unspecified,
        destination: unspecified,
        token: None,
        drain: false,
        shed: Some(shed),
        follows: false,
        reattach: None,
    };
    rt.spawn(async move {
        // the agent acts on the stream's headers and resets it; nothing to wait for
        let _ = tokio::time::timeout(Duration::from_secs(5), link.open(meta)).await;
    });
}
