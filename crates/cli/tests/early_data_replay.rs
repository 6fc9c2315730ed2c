//! 0-RTT single use when the store is slow or the agent new: a ticket that allows early data
//! reaches its client only once Redis has it (so no agent can find it missing, refuse it, and
//! let a replay of the same flight run elsewhere once the write lands); while Redis's writes
//! are slow tickets go out without early data; a freshly started agent calls no take
//! exclusive until its quarantine ends. Real processes: agents, redis-server (one agent's
//! connection to it through the lab's delay proxy), a counting upstream, a rustls client.

mod common;

use std::time::Duration;

use baton_lab::rig::delay::DelayProxy;
use common::early::{
    early, early_client, eventually, get, replay_raw, request, store_quarantine_over, Upstream,
};
use common::{Agent, Pki, Redis, TempDir};

/// Round trip added between an agent and Redis: its SETs land half of it after they leave.
/// Below the store's one-second I/O deadline, so that the answers still count.
const SLOW_RTT: Duration = Duration::from_millis(600);

/// An agent with early data, sharing sessions in the Redis at `url`, waiting for it at most
/// `wait`.
fn agent(pki: &Pki, key: &str, url: &str, id: u16, wait: &str, upstream: &Upstream) -> Agent {
    Agent::serving(
        pki,
        &[
            "--store",
            &format!("redis={url}"),
            "--cluster-key-file",
            key,
            "--tickets",
            "false",
            "--early-data",
            "16384",
            "--store-wait",
            wait,
            "--agent-id",
            &id.to_string(),
            &upstream.arg(),
        ],
    )
}

/// Redis, and a delay proxy in front of it.
fn slow_redis(redis: &Redis) -> (DelayProxy, String) {
    let proxy = DelayProxy::start(([127, 0, 0, 1], redis.port).into(), SLOW_RTT).unwrap();
    let url = format!("redis://{}/", proxy.addr());
    (proxy, url)
}

/// A issues the ticket, its SET slowed down on the way to Redis; the client resumes at B at
/// once, with its request as early data; an attacker replays that flight to C once A's SET has
/// surely landed. Before the fix A sent the ticket while its SET was still on the way: B found
/// nothing (a replay, for all it knew: refused, the request sent again after the handshake and
/// run), then C found the ticket and ran the replayed early request a second time.
#[test]
fn a_ticket_resumed_before_its_write_lands_runs_its_early_request_once() {
    let Some(redis) = Redis::start() else { return };
    let pki = Pki::new();
    let dir = TempDir::new("early-slow-set");
    let key = common::key_file(&dir, "cluster.key");
    let upstream = Upstream::start();
    let (_proxy, slow) = slow_redis(&redis);
    // A waits for Redis longer than the added round trip: its writes are answered in time
    let a = agent(&pki, &key, &slow, 0, "3s", &upstream);
    let b = agent(&pki, &key, &redis.url(), 1, "2s", &upstream);
    let c = agent(&pki, &key, &redis.url(), 2, "2s", &upstream);
    store_quarantine_over();
    let config = early_client(&pki);

    let first = request(a.addr, &config, &get("/first"));
    assert_eq!((first.status, first.resumed), (200, false), "{first:?}");
    let used = request(b.addr, &config, &get("/early"));
    assert!(
        used.early_written > 0,
        "the ticket allowed no early data: {used:?}"
    );
    assert_eq!(used.status, 200, "{used:?}");
    eventually("B served the request", || {
        !upstream.requests("/early").is_empty()
    });
    // A's SET lands SLOW_RTT / 2 after it left, if it had not before
    std::thread::sleep(SLOW_RTT * 2);

    assert!(replay_raw(c.addr, &used.first_flight) > 0, "no answer");
    eventually("C judged the replayed early data", || {
        early(&c, "accepted") + early(&c, "replay_refused") + early(&c, "rejected") == 1
    });
    std::thread::sleep(Duration::from_millis(300));
    let seen = upstream.requests("/early");
    assert_eq!(
        seen.len(),
        1,
        "the early request ran more than once: {seen:?}"
    );
    assert_eq!(early(&c, "accepted"), 0);
    assert_eq!(early(&c, "replay_refused"), 1);
    // and the ticket was good for its one 0-RTT use, at B
    assert!(used.accepted && used.resumed, "{used:?}");
    assert!(seen[0].early, "{seen:?}");
    assert_eq!(early(&b, "accepted"), 1);
    for agent in [&a, &b, &c] {
        assert_eq!(agent.failures("other"), 0);
    }
}

/// Redis answers A's writes later than A waits: A's tickets stop allowing early data (stored
/// without waiting), and resume 1-RTT. Before the fix they allowed it whatever the store did.
#[test]
fn while_store_writes_are_slow_tickets_allow_no_early_data() {
    let Some(redis) = Redis::start() else { return };
    let pki = Pki::new();
    let dir = TempDir::new("early-slow-store");
    let key = common::key_file(&dir, "cluster.key");
    let upstream = Upstream::start();
    let (_proxy, slow) = slow_redis(&redis);
    let a = agent(&pki, &key, &slow, 0, "100ms", &upstream);
    store_quarantine_over();
    let config = early_client(&pki);

    // the first handshake's writes show how slow Redis is (its tickets, if any, unknown)
    assert_eq!(request(a.addr, &config, &get("/first")).status, 200);
    std::thread::sleep(SLOW_RTT * 2);
    let fresh = early_client(&pki);
    let full = request(a.addr, &fresh, &get("/full"));
    assert_eq!((full.status, full.resumed), (200, false), "{full:?}");
    let o = request(a.addr, &fresh, &get("/again"));
    assert_eq!(o.status, 200, "{o:?}");
    assert!(o.resumed, "no ticket, or not resumed: {o:?}");
    assert_eq!(o.early_written, 0, "the ticket allowed early data: {o:?}");
    // the first handshake's tickets waited for Redis in vain, and were not sent
    let unacknowledged = "baton_session_store_events_total{event=\"unacknowledged\"}";
    assert!(a.metric(unacknowledged) >= 1.0);
    assert_eq!(a.failures("other"), 0);
}

/// A freshly started agent takes its first tickets from Redis as a reconnected one does: not
/// exclusively (it cannot tell a just-promoted replica, which may still hold tickets taken
/// before, from any other primary), so it refuses early data and resumes 1-RTT until its
/// quarantine ends. Before the fix its first connection started no quarantine.
#[test]
fn a_fresh_agent_accepts_no_early_data_during_its_first_quarantine() {
    let Some(redis) = Redis::start() else { return };
    let pki = Pki::new();
    let dir = TempDir::new("early-fresh");
    let key = common::key_file(&dir, "cluster.key");
    let upstream = Upstream::start();
    let a = agent(&pki, &key, &redis.url(), 0, "2s", &upstream);
    store_quarantine_over();
    let config = early_client(&pki);
    assert_eq!(request(a.addr, &config, &get("/first")).status, 200);

    let b = agent(&pki, &key, &redis.url(), 1, "2s", &upstream);
    let o = request(b.addr, &config, &get("/fresh"));
    assert!(o.early_written > 0, "{o:?}");
    assert!(!o.accepted, "a fresh agent accepted early data: {o:?}");
    assert!(o.resumed, "{o:?}");
    assert_eq!(o.status, 200);
    let seen = upstream.requests("/fresh");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(!seen[0].early, "{seen:?}");
    assert_eq!(early(&b, "rejected"), 1);
}
