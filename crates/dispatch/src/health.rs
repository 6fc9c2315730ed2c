//! Active health checks: a TCP connect to each agent every interval. Two failures in a row take
//! an agent out (so a dead agent is out within 3 intervals: 1.5 s by default), one success
//! brings it back. With PROXY protocol on, the probe sends a LOCAL header so the agent knows
//! it is not a client. Failed relays also take an agent out at once (`server.rs`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::route::Router;

pub async fn check_forever(
    agents: Vec<SocketAddr>,
    router: Arc<Mutex<Router>>,
    interval: Duration,
    proxy_protocol: bool,
) {
    let mut failures = vec![0u32; agents.len()];
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut set = tokio::task::JoinSet::new();
        for (i, addr) in agents.iter().enumerate() {
            let addr = *addr;
            set.spawn(async move { (i, probe(addr, interval, proxy_protocol).await) });
        }
        let mut results = vec![false; agents.len()];
        while let Some(done) = set.join_next().await {
            if let Ok((i, ok)) = done {
                results[i] = ok;
            }
        }
        let mut r = router.lock().unwrap_or_else(|p| p.into_inner());
        for (i, ok) in results.into_iter().enumerate() {
            let was = r.is_healthy(i);
            let (healthy, n) = next(was, failures[i], ok);
            failures[i] = n;
            match (was, healthy) {
                (true, false) => {
                    tracing::warn!(agent = i, addr = %agents[i], "agent out: health checks failed")
                }
                (false, true) => tracing::info!(agent = i, addr = %agents[i], "agent back in"),
                _ => {}
            }
            r.set_health(i, healthy);
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
