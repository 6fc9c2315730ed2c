//! Active health checks: a TCP connect to each agent every interval. Two failures in a row take
//! an agent out (so a dead agent is out within 3 intervals: 1.5 s by default), one success
//! brings it back. With PROXY protocol on, the probe sends a LOCAL header so the agent knows
//! it is not a client. Failed relays also take an agent out at once (`server.rs`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::members::Admin;
use crate::roster::Roster;
use crate::route::Router;

/// Probes every agent on the roster each `interval` (but disabled ones: parked, nobody asks
/// after them), as the roster is at that tick.
pub async fn check_forever(
    roster: Arc<Roster>,
    router: Arc<Mutex<Router>>,
    interval: Duration,
    proxy_protocol: bool,
) {
    // failures in a row, by slot
    let mut failures: HashMap<usize, u32> = HashMap::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let probed: Vec<(usize, u16, SocketAddr)> = {
            let r = router.lock().unwrap_or_else(|p| p.into_inner());
            r.slots()
                .filter(|a| r.admin(*a) != Admin::Disabled)
                .filter_map(|a| roster.agent(a).map(|ag| (a, ag.id, ag.addr)))
                .collect()
        };
        failures.retain(|slot, _| probed.iter().any(|p| p.0 == *slot));
        let mut set = tokio::task::JoinSet::new();
        for (slot, _, addr) in &probed {
            let (slot, addr) = (*slot, *addr);
            set.spawn(async move { (slot, probe(addr, interval, proxy_protocol).await) });
        }
        let mut results = HashMap::new();
        while let Some(done) = set.join_next().await {
            if let Ok((slot, ok)) = done {
                results.insert(slot, ok);
            }
        }
        let mut r = router.lock().unwrap_or_else(|p| p.into_inner());
        for (slot, id, addr) in probed {
            let ok = results.get(&slot).copied().unwrap_or(false);
            let was = r.is_healthy(slot);
            let f = failures.entry(slot).or_default();
            let (healthy, n) = next(was, *f, ok);
            *f = n;
            match (was, healthy) {
                (true, false) => {
                    tracing::warn!(agent = id, %addr, "agent out: health checks failed")
                }
                (false, true) => tracing::info!(agent = id, %addr, "agent back in"),
                _ => {}
            }
            r.set_health(slot, healthy);
        }
    }
}

/// One probe's verdict: `(healthy, failures in a row)` from the agent's state, the failures
/// so far and this probe. A success brings an agent in; the second failure in a row takes it
/// out; a single failure changes nothing, in particular it never brings back an agent that a
/// failed relay took out (`server.rs`), which is dead as far as anyone knows.
fn next(healthy: bool, failures: u32, ok: bool) -> (bool, u32) {
    if ok {
        return (true, 0);
    }
    let failures = failures.saturating_add(1);
    (healthy && failures < 2, failures)
}

async fn probe(addr: SocketAddr, timeout: Duration, proxy_protocol: bool) -> bool {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(mut s)) => {
            if proxy_protocol {
                let mut h = Vec::new();
                baton_wire::proxy_v2::encode(&baton_wire::proxy_v2::ProxyHeader::Local, &mut h);
                let _ = s.write_all(&h).await;
            }
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::next;

    #[test]
    fn one_failure_never_brings_an_agent_back() {
        // up: one failure keeps it, the second takes it out, a success brings it back
        assert_eq!(next(true, 0, false), (true, 1));
        assert_eq!(next(true, 1, false), (false, 2));
        assert_eq!(next(false, 2, false), (false, 3));
        assert_eq!(next(false, 3, true), (true, 0));
        // taken out by a failed relay: a failing probe leaves it out (it used to bring it
        // back, then the next relay failed again)
        assert_eq!(next(false, 0, false), (false, 1));
        assert_eq!(next(false, 1, true), (true, 0));
        assert_eq!(next(true, u32::MAX, false), (false, u32::MAX));
    }
}
