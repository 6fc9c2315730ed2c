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
            failures[i] = if ok { 0 } else { failures[i] + 1 };
            let healthy = failures[i] < 2;
            if r.is_healthy(i) != healthy {
                tracing::warn!(agent = i, addr = %agents[i], healthy, "agent health changed");
            }
            r.set_health(i, healthy);
        }
    }
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
