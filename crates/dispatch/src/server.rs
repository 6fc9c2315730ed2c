//! The dispatcher's tokio shell: accept, peek at the ClientHello (bounded, under a deadline),
//! ask the router, connect to the agent, replay what was read, and splice both ways. With the
//! `session` policy it also reads the agent's ServerHello on the way back to learn TLS 1.2
//! session ids. Every byte read from the client is forwarded unchanged: the parse is a peek.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_link::{LinkStream, StreamMeta};
use baton_ops::accept::{Acceptor, Admitted};
use baton_ops::cidr::Cidr;
use baton_ops::control::Counters;
use baton_wire::proxy_v2::ProxyHeader;
use baton_wire::{Progress, ServerHelloReader};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::DispatchConfig;
use crate::context::Context;
use crate::metrics::{HelloOutcome, Metrics};
use crate::roster::Roster;
use crate::route::{Policy, Reason, Router};

/// The dispatcher's families, read at scrape time (counters and the router's agent state).
struct Collected(Arc<Context>);

impl std::fmt::Debug for Collected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dispatch metrics")
    }
}

impl prometheus_client::collector::Collector for Collected {
    fn encode(
        &self,
        mut e: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let r = self.0.router();
        let agents: Vec<(usize, u16, bool, u32)> = r
            .slots()
            .filter_map(|a| Some((a, r.id_of(a)?, r.is_healthy(a), r.active(a))))
            .collect();
        let table = r.table_len() as i64;
        drop(r);
        self.0.metrics.encode(&mut e, &agents)?;
        baton_ops::metrics::gauge(
            &mut e,
            "baton_dispatch_router_slots",
            "Slots in the router's table: agents on the roster, and removed ones whose \
             connections are still open.",
            table,
        )
    }
}

pub async fn run(config: DispatchConfig) -> anyhow::Result<()> {
    use baton_migrate::restart::ListenerKind;
    // The path of this binary before anything else: one renamed away later (an upgrade moves
    // the old file aside) must not be what a successor starts.
    let restart = crate::restart::state::Restart::new();
    let router = Arc::new(Mutex::new(
        Router::new(config.policy, 0).with_home_window(config.handoff_window),
    ));
    let metrics = Arc::new(Metrics::new(crate::members::MAX_AGENTS));
    let (roster, initial) = Roster::start(&config, metrics.clone())?;
    let roster = Arc::new(roster);
    roster
        .set(&router, initial)
        .map_err(|e| anyhow::anyhow!("agents: {e}"))?;
    // A successor of a dispatcher that hands over: its listeners come from its predecessor.
    let predecessor = crate::restart::take::Predecessor::connect().await?;
    // The links first, so that `ready` means clients can be carried (an agent that is down
    // now is only waited for briefly: it joins when its link comes up).
    roster.wait_up(config.connect_timeout).await;
    if predecessor.is_some() {
        // Half the handover's time, so that the predecessor still hears of the failure and
        // serves on.
        if let Err(ids) = roster
            .wait_reachable(config.handover_timeout / 2, config.connect_timeout)
            .await
        {
            anyhow::bail!(
                "agents {ids:?} answer on their TLS port but their links are not up: not taking \
                 over (the connections handed over for them would be lost)"
            );
        }
    }
    // Machine-readable start-up lines on stdout: scripts and tests wait for `ready`.
    let (listeners, admin_listener, metrics_listener, predecessor) = match predecessor {
        Some((p, inherited)) => {
            baton_ops::listen::announce(
                inherited
                    .public
                    .iter()
                    .map(|l| ("dispatch", l))
                    .chain(inherited.admin.iter().map(|l| ("admin", l)))
                    .chain(inherited.metrics.iter().map(|l| ("metrics", l))),
            )?;
            (
                inherited.public,
                inherited.admin,
                inherited.metrics,
                Some(p),
            )
        }
        None => {
            let admin = config.admin.map(|addr| ("admin", addr));
            let (l, a, m) =
                baton_ops::listen::open_with("dispatch", &config.listen, admin, config.metrics)?;
            (l, a, m, None)
        }
    };
    let shared = Arc::new(Context {
        metrics,
        router: router.clone(),
        config,
        roster: roster.clone(),
        restart,
    });
    for l in &listeners {
        shared.restart.keep(ListenerKind::Public, l)?;
    }
    if let Some(l) = &admin_listener {
        shared.restart.keep(ListenerKind::Admin, l)?;
    }
    if let Some(l) = &metrics_listener {
        shared.restart.keep(ListenerKind::Metrics, l)?;
    }
    let stop = CancellationToken::new();
    tokio::spawn(crate::health::check_forever(
        roster.clone(),
        router.clone(),
        shared.config.health_interval,
        shared.config.proxy_protocol,
    ));
    let reread = Arc::new(tokio::sync::Notify::new());
    if let Some(path) = shared.config.agents_file.clone() {
        tokio::spawn(crate::roster::watch_file(
            path,
            roster.clone(),
            router.clone(),
            reread.clone(),
        ));
    }
    let tracker = TaskTracker::new();
    let permits = Arc::new(Semaphore::new(shared.config.max_connections));
    // Everything that accepts stops when a successor is ready (and starts again from the
    // kept copies if it fails after that).
    let mut accepting = stop.child_token();
    serve_listeners(
        listeners,
        admin_listener,
        metrics_listener,
        &shared,
        &permits,
        &tracker,
        &accepting,
    );
    match predecessor {
        // (it tells the service manager itself, once it accepts)
        Some(p) => {
            tokio::spawn(p.take_over(shared.clone(), tracker.clone()));
        }
        None => crate::notify::ready(),
    }
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // SIGHUP re-reads the agents file (and must not end the process, its default action).
    let mut hup = signal(SignalKind::hangup())?;
    // SIGUSR2 hands over to a successor, as nginx's binary upgrade.
    let mut usr2 = signal(SignalKind::user_defined2())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => reread.notify_one(),
            _ = usr2.recv() => { shared.restart.request(); }
            _ = shared.restart.requested() => {
                crate::notify::reloading();
                let successor = match crate::restart::successor::start(&shared).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "handover failed; serving on");
                        eprintln!("handover failed; serving on: {e:#}");
                        // (a successor killed at its deadline may have claimed the service)
                        crate::notify::main_and_ready();
                        continue;
                    }
                };
                // the successor accepts now
                accepting.cancel();
                let deadline = tokio::time::Instant::now() + shared.config.handover_timeout;
                tracker.close();
                if successor.pass(&shared, tracker.wait(), deadline).await {
                    let left = tracker.len();
                    if left > 0 {
                        tracing::warn!(connections = left, "handover: connections not passed close now");
                    }
                    settle().await;
                    return Ok(());
                }
                // The successor failed once ready: accept again here, as the service's main
                // process again.
                crate::notify::main_and_ready();
                tracker.reopen();
                accepting = stop.child_token();
                match shared.restart.relisten() {
                    Ok((l, a, m)) => serve_listeners(l, a, m, &shared, &permits, &tracker, &accepting),
                    Err(e) => {
                        tracing::error!(error = %e, "handover: cannot accept again");
                        return Err(e.into());
                    }
                }
            }
        }
    }
    crate::notify::stopping();
    stop.cancel();
    tracker.close();
    // Relayed connections carry on until their ends close, for a bounded time.
    let _ = tokio::time::timeout(Duration::from_secs(10), tracker.wait()).await;
    settle().await;
    Ok(())
}

/// Before the process ends: the Done releases that wait for company on the links go out
/// (`LinkStream::release_later`), so that no handshake agent sees its stream fail instead.
async fn settle() {
    tokio::time::sleep(baton_link::RELEASE_DELAY * 2).await;
}

/// Accepts clients on `listeners`, and serves the admin endpoint and metrics, until
/// `accepting` is cancelled.
fn serve_listeners(
    listeners: Vec<TcpListener>,
    admin: Option<TcpListener>,
    metrics: Option<TcpListener>,
    shared: &Arc<Context>,
    permits: &Arc<Semaphore>,
    tracker: &TaskTracker,
    accepting: &CancellationToken,
) {
    let admin_counters = Counters::new("admin");
    if let (Some(l), Some(token)) = (admin, shared.config.admin_token.clone()) {
        tokio::spawn(crate::admin::serve(
            l,
            token,
            admin_counters.clone(),
            shared.clone(),
            accepting.clone(),
        ));
    }
    if let Some(l) = metrics {
        let counters = Counters::new("metrics");
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Collected(shared.clone())));
        registry.register_collector(Box::new(baton_ops::metrics::ProcessCollector));
        registry.register_collector(Box::new(baton_ops::control::Collected(vec![
            counters.clone(),
            admin_counters,
        ])));
        tokio::spawn(baton_ops::serve_metrics(
            l,
            Arc::new(registry),
            counters,
            accepting.clone(),
        ));
    }
    for l in listeners {
        tokio::spawn(accept_loop(
            l,
            shared.clone(),
            permits.clone(),
            tracker.clone(),
            accepting.clone(),
        ));
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Context>,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    // The address clients reach, when the listener has only one (saves a getsockname per
    // connection); a wildcard listener asks each connection.
    let bound = listener
        .local_addr()
        .ok()
        .filter(|a| !a.ip().is_unspecified());
    // Set once on the listener (Linux copies TCP_NODELAY and keepalive into every socket it
    // accepts: five setsockopt calls fewer per client), else on each client. A successor's
    // listeners come with them set already; setting again is harmless.
    let keepalive = client_keepalive(shared.config.tcp_keepalive);
    let inherited = baton_ops::listen::nodelay_on_accept(&listener)
        && baton_ops::listen::keepalive_on_accept(&listener, &keepalive);
    let counted = shared.clone();
    let acceptor =
        Acceptor::new(listener, stop).capped(permits, move || counted.metrics.rejected());
    while let Some(Admitted {
        tcp: client,
        peer,
        slot,
    }) = acceptor.next().await
    {
        // A PROXY header names the client to route as: only the balancers may send one.
        if shared.config.accept_proxy_protocol
            && !Cidr::any_contains(&shared.config.proxy_protocol_from, peer.ip())
        {
            shared.metrics.proxy_refused();
            tracing::debug!(%peer, "PROXY protocol expected, but not from this address: refused");
            continue;
        }
        if !inherited {
            let _ = client.set_nodelay(true);
            let _ = socket2::SockRef::from(&client).set_tcp_keepalive(&keepalive);
        }
        let shared = shared.clone();
        // Boxed: a connection's future is large (15.6 kB: the handshake's read buffers, the
        // splice's and the handoff's state), and tokio moves a task's future by value when it
        // spawns it, stores it, and again when the task ends (profiled: memcpy was the
        // largest user-space cost of a connection). In a box it is moved once.
        let conn = Box::pin(async move {
            if let Err(e) = handle(client, peer, bound, &shared).await {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            drop(slot);
        });
        tracker.spawn(conn);
    }
}

/// Keepalive for client sockets, which finds clients that vanished without a FIN (a dead
/// host, a dropped NAT entry): the first probe after `idle` of silence, then every 10 s, 3
/// probes.
fn client_keepalive(idle: Duration) -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(Duration::from_secs(10))
        .with_retries(3)
}

/// Everything read from the client before the agent was chosen, and what it said.
struct FirstBytes {
    bytes: Vec<u8>,
    hello: Option<baton_wire::ClientHello>,
}

async fn handle(
    mut client: TcpStream,
    peer: SocketAddr,
    bound: Option<SocketAddr>,
    shared: &Context,
) -> std::io::Result<()> {
    let cfg = &shared.config;
    let deadline = tokio::time::Instant::now() + cfg.hello_timeout;
    let mut source = peer;
    if cfg.accept_proxy_protocol {
        match tokio::time::timeout_at(deadline, baton_ops::proxy_header::read(&mut client)).await {
            Ok(Ok(Some(ProxyHeader::Proxy { source: s, .. }))) => source = s,
            Ok(Ok(_)) => return Ok(()), // LOCAL (a balancer's health check) or closed
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        }
    }
    let first = match tokio::time::timeout_at(deadline, baton_ops::hello::read(&mut client)).await {
        Ok(Ok((bytes, hello))) => FirstBytes { bytes, hello },
        Ok(Err(e)) => {
            shared.metrics.hello(HelloOutcome::Closed);
            return Err(e);
        }
        Err(_) => {
            shared.metrics.hello(HelloOutcome::Timeout);
            return Ok(());
        }
    };
    shared
        .metrics
        .hello(match (&first.hello, first.bytes.len()) {
            (Some(_), _) => HelloOutcome::Parsed,
            (None, n) if n >= baton_wire::DEFAULT_MESSAGE_LIMIT => HelloOutcome::TooLarge,
            (None, _) => HelloOutcome::Unparsed,
        });

    // Route; if the chosen agent cannot take the connection (refused, no live link, going
    // away), mark it down and ask again, up to three times.
    let destination = bound.or_else(|| client.local_addr().ok()).unwrap_or(peer);
    let mut tries = 0;
    let (agent_idx, agent, plan) = loop {
        let Some((idx, reason)) = shared.router().route(first.hello.as_ref(), source.ip()) else {
            shared.metrics.no_agent();
            return Ok(());
        };
        match connect(idx, source, destination, shared).await {
            Some(AgentStream::Link(mut s)) => {
                // a CA's validation is answered where it lands: nothing moves home
                let (plan, mut head) = match reason {
                    Reason::Acme => (Plan::Relay, Vec::new()),
                    _ => plan_for(idx, source, destination, shared),
                };
                head.extend_from_slice(&first.bytes);
                if confirm(&mut s, &head, first.hello.is_some(), shared).await {
                    shared.metrics.routed(idx, reason);
                    break (idx, AgentStream::Link(s), plan);
                }
                tracing::debug!(agent = idx, "agent did not take the stream; routing again");
            }
            Some(s) => {
                shared.metrics.routed(idx, reason);
                break (idx, s, Plan::Relay);
            }
            None => {}
        }
        shared.metrics.connect_failed(idx);
        let mut r = shared.router();
        r.closed(idx);
        r.handshake_done(idx);
        r.set_health(idx, false);
        drop(r);
        tries += 1;
        if tries >= 3 {
            return Ok(());
        }
    };
    let ended = match (agent, plan) {
        (AgentStream::Link(agent), Plan::Handoff(ends)) => {
            return handoff(client, agent, *ends, first, shared).await;
        }
        (AgentStream::Link(agent), Plan::AtHome) => {
            crate::migration::at_home(&mut client, agent, agent_idx, first.bytes, shared).await
        }
        (AgentStream::Link(agent), Plan::Relay) => {
            linked(&mut client, agent, first, agent_idx, shared).await
        }
        (AgentStream::Tcp(mut agent), _) => {
            let head = shared.proxy_head(source, destination);
            if !head.is_empty() {
                agent.write_all(&head).await?;
            }
            let r = relay(&mut client, &mut agent, first, agent_idx, shared).await;
            shared.router().closed(agent_idx);
            return r;
        }
    };
    // a connection may end on another agent than it started on (its agent left)
    match ended {
        Ok((idx, up, down)) => {
            shared.metrics.bytes(up, down);
            shared.router().closed(idx);
            Ok(())
        }
        Err(e) => {
            shared.router().closed(agent_idx);
            Err(e)
        }
    }
}

/// What a link stream to the chosen agent carries.
enum Plan {
    /// The client's bytes, spliced both ways.
    Relay,
    /// `handoff`, and the agent is the client's home: nothing to migrate.
    AtHome,
    /// `handoff`: offered for migration to the client's home agent.
    Handoff(Box<crate::migration::Ends>),
}

/// The plan for a stream to agent `agent_idx`, and what goes before the client's bytes on it
/// (the handoff offer).
fn plan_for(
    agent_idx: usize,
    source: SocketAddr,
    destination: SocketAddr,
    shared: &Context,
) -> (Plan, Vec<u8>) {
    if shared.router().policy() != Policy::Handoff {
        return (Plan::Relay, Vec::new());
    }
    let home_idx = shared.router().home_of(source.ip()).unwrap_or(agent_idx);
    if home_idx == agent_idx {
        return (Plan::AtHome, Vec::new());
    }
    // The home agent's link the session will travel on, fixed now: the object is sealed for
    // it. No live link to the home agent: the handshake agent keeps the client (it declines).
    let home = shared.roster.link(home_idx);
    let (home_idx, home) = match home {
        Some(h) => (home_idx, Some(h)),
        None => (agent_idx, None),
    };
    // The home agent's id names who the session object is sealed for.
    let home_id = shared.router().id_of(home_idx).unwrap_or(0);
    let token = baton_link::token();
    let mut binding = [0u8; baton_migrate::BINDING_LEN];
    if let Some(h) = &home {
        binding[..16].copy_from_slice(&h.id());
    }
    binding[16..].copy_from_slice(&token);
    let head = baton_migrate::Relay::offer(home_id, binding);
    let ends = crate::migration::Ends {
        agent_idx,
        home_idx,
        home,
        token,
        source,
        destination,
        stream: None,
        drain: false,
    };
    (Plan::Handoff(Box::new(ends)), head)
}

/// Sends a link stream's first bytes and, when they hold a whole ClientHello (so the agent
/// owes an answer), waits for the agent's first byte: whether the agent took the stream. An
/// agent going away refuses streams it never read (GOAWAY, a refusing RESET); one that fails
/// before answering has shown the client nothing. Either way the client can be routed again
/// without loss. Waits at most `--hello-timeout`; a silent agent counts as taken (the relay
/// then meets whatever it does).
async fn confirm(stream: &mut LinkStream, head: &[u8], answer_due: bool, shared: &Context) -> bool {
    if stream.write_all(head).await.is_err() {
        return false;
    }
    if !answer_due {
        return true;
    }
    match tokio::time::timeout(shared.config.hello_timeout, stream.readable()).await {
        Ok(Err(e)) => {
            if baton_link::is_refused(&e) {
                tracing::debug!("agent refused the stream (going away)");
            }
            false
        }
        Ok(Ok(())) | Err(_) => true,
    }
}

/// A stream to an agent: a TCP connection, or a stream of its link.
// Lives only while a connection is routed; boxing the link stream would cost every
// connection an allocation.
#[allow(clippy::large_enum_variant)]
enum AgentStream {
    Tcp(TcpStream),
    Link(LinkStream),
}

/// A stream to agent `idx` for a client at `source`; `None` if it cannot be had in time.
async fn connect(
    idx: usize,
    source: SocketAddr,
    destination: SocketAddr,
    shared: &Context,
) -> Option<AgentStream> {
    let cfg = &shared.config;
    let agent = shared.roster.agent(idx)?;
    if shared.roster.uses_links() {
        // `linked`, `at_home` and `handoff` follow every link stream's records
        let meta = StreamMeta::followed(source, destination);
        let link = agent.links.as_ref()?.pick()?;
        let s = tokio::time::timeout(cfg.connect_timeout, link.open(meta));
        return s.await.ok()?.ok().map(AgentStream::Link);
    }
    let addr = agent.addr;
    match tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Some(AgentStream::Tcp(s))
        }
        _ => None,
    }
}

/// `handoff`: every connection is offered (its offer went out with the client's first bytes,
/// [`plan_for`]), so its agent says when the handshake is over (Switch, or Decline when it is
/// the home agent already) and the router balances handshakes; a full handshake on an agent
/// other than the client's home agent migrates.
async fn handoff(
    mut client: TcpStream,
    agent: LinkStream,
    ends: crate::migration::Ends,
    first: FirstBytes,
    shared: &Context,
) -> std::io::Result<()> {
    let agent_idx = ends.agent_idx;
    let result = crate::migration::relay(&mut client, agent, ends, first.bytes, shared).await;
    let ended_on = match result {
        Ok((idx, up, down)) => {
            shared.metrics.bytes(up, down);
            idx
        }
        Err(_) => agent_idx,
    };
    shared.router().closed(ended_on);
    result.map(|_| ())
}

/// Replays what was read from the client to an agent reached over TCP (not a link), then
/// splices both ways.
async fn relay(
    client: &mut TcpStream,
    agent: &mut TcpStream,
    first: FirstBytes,
    agent_idx: usize,
    shared: &Context,
) -> std::io::Result<()> {
    agent.write_all(&first.bytes).await?;
    let first_len = first.bytes.len() as u64;
    // the hello, its parse and its bytes are not needed for the rest of the connection
    drop(first);
    let mut to_client = 0u64;
    if shared.config.policy == Policy::Session {
        to_client = learn_session_id(agent, client, agent_idx, None, shared).await?;
    }
    let result = crate::splice::splice(client, agent, shared.splice_limits()).await;
    let (up, down) = result.as_ref().map_or((0, 0), |(u, d)| (*u, *d));
    shared.metrics.bytes(first_len + up, to_client + down);
    result.map(|_| ())
}

/// A client on an agent's link stream (its first bytes written already, `confirm`): every
/// byte each way is followed from the first, so that the agent can ask to move the live
/// connection when it drains. Returns the agent it ended on and the bytes each way.
async fn linked(
    client: &mut TcpStream,
    mut agent: LinkStream,
    first: FirstBytes,
    agent_idx: usize,
    shared: &Context,
) -> std::io::Result<(usize, u64, u64)> {
    let mut watch = baton_migrate::Relay::serving().with_timeouts(shared.config.migration_timeouts);
    let first_len = first.bytes.len() as u64;
    if watch.watch_client(&first.bytes).is_err() {
        // Not TLS: the agent answers it (an alert), and nothing here can ever move.
        drop(first);
        let r = crate::splice::splice(client, &mut agent, shared.splice_limits()).await;
        return r.map(|(up, down)| (agent_idx, first_len + up, down));
    }
    drop(first);
    let mut to_client = 0u64;
    if shared.config.policy == Policy::Session {
        to_client =
            learn_session_id(&mut agent, client, agent_idx, Some(&mut watch), shared).await?;
    }
    crate::migration::serve(
        client,
        agent,
        agent_idx,
        watch,
        (first_len, to_client),
        shared,
    )
    .await
}

/// Forwards the agent's first bytes to the client while reading its ServerHello; a TLS 1.2
/// session id in it is remembered for this agent. Returns the bytes forwarded.
async fn learn_session_id<S: AsyncRead + Unpin>(
    agent: &mut S,
    client: &mut TcpStream,
    agent_idx: usize,
    mut watch: Option<&mut baton_migrate::Relay>,
    shared: &Context,
) -> std::io::Result<u64> {
    let mut reader = ServerHelloReader::new();
    // on the heap, not in the connection's future (moved when it is spawned), never zeroed
    let mut buf = Vec::with_capacity(4096);
    let mut forwarded = 0u64;
    let deadline = tokio::time::Instant::now() + shared.config.hello_timeout;
    loop {
        buf.clear();
        let n = match tokio::time::timeout_at(deadline, agent.read_buf(&mut buf)).await {
            Ok(r) => r?,
            Err(_) => return Ok(forwarded), // let the splice carry on; nothing learned
        };
        if n == 0 {
            return Ok(forwarded);
        }
        if let Some(w) = watch.as_deref_mut() {
            // a handshake carries no frame: anything but records ends the connection
            let passed = w
                .watch_agent(&buf[..n])
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            if passed.frame.is_some() || passed.tls < n {
                return Err(std::io::ErrorKind::InvalidData.into());
            }
        }
        client.write_all(&buf[..n]).await?;
        forwarded += n as u64;
        match reader.push(&buf[..n]) {
            Ok(Progress::NeedMore) => continue,
            Ok(Progress::Done(sh, _)) => {
                if let Some(id) = sh.tls12_session_id() {
                    shared.router().learned_session_id(id, agent_idx);
                }
                return Ok(forwarded);
            }
            Err(_) => return Ok(forwarded),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-client setsockopt calls were dropped on the strength of this: a connection
    /// accepted on a tuned listener has no Nagle delay and the keepalive settings.
    #[tokio::test]
    async fn accepted_sockets_inherit_the_listeners_tcp_settings() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        assert!(baton_ops::listen::nodelay_on_accept(&listener));
        let keepalive = client_keepalive(Duration::from_secs(77));
        assert!(baton_ops::listen::keepalive_on_accept(
            &listener, &keepalive
        ));
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (_client, (accepted, _)) = (client.unwrap(), accepted.unwrap());
        use rustix::net::sockopt;
        assert!(sockopt::tcp_nodelay(&accepted).unwrap());
        assert!(sockopt::socket_keepalive(&accepted).unwrap());
        assert_eq!(
            sockopt::tcp_keepidle(&accepted).unwrap(),
            Duration::from_secs(77)
        );
        assert_eq!(
            sockopt::tcp_keepintvl(&accepted).unwrap(),
            Duration::from_secs(10)
        );
        assert_eq!(sockopt::tcp_keepcnt(&accepted).unwrap(), 3);
    }
}
