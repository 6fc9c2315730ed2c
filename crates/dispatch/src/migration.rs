//! The tokio shell of a migrated connection (`--policy migration`, CSSL-SF): through each move
//! it pumps `baton_migrate::MoveDriver` (around the protocol's `Relay`; every decision is made
//! there, the same driver the agent's in-memory harness runs) between the client, the
//! handshake agent's link stream and the home agent's, wakes it at the deadlines it keeps, and
//! once the driver says where the stream belongs, splices the client to that agent. A migration is a stream move: the home agent's stream is
//! one more stream on a link that is already up.

use std::net::SocketAddr;

use baton_link::{LinkHandle, LinkStream, StreamMeta};
use baton_migrate::{MigrationError, MoveDriver, MoveIo, MoveReason, Outcome, Relay, Target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::context::Context;
use crate::restart::give::HandedOver;
use crate::splice::Watched;

/// Who takes part in one handed-off connection.
pub struct Ends {
    pub agent_idx: usize,
    pub home_idx: usize,
    /// The home agent's link named in the Offer's binding (`None`: the agent declines).
    pub home: Option<LinkHandle>,
    /// The token of the Offer's binding, sent as the import stream's metadata.
    pub token: [u8; 16],
    pub source: SocketAddr,
    pub destination: SocketAddr,
    /// The stream opened on `home` for the import, once it is.
    pub stream: Option<LinkStream>,
    /// A move asked for by a draining agent (not a handshake's).
    pub drain: bool,
}

impl Ends {
    /// Opens the import stream on the home agent's link, by `deadline`.
    async fn open(&mut self, deadline: Instant) -> bool {
        // the imported connection is followed on, as every link stream
        let meta = StreamMeta {
            token: Some(self.token),
            drain: self.drain,
            ..StreamMeta::followed(self.source, self.destination)
        };
        self.stream = match &self.home {
            Some(link) => tokio::time::timeout_at(deadline, link.open(meta))
                .await
                .ok()
                .and_then(Result::ok),
            None => None,
        };
        self.stream.is_some()
    }
}

/// Relays one connection whose handshake runs on `agent` and whose session should move to the
/// home agent. The Offer and the client's first bytes are already written to `agent`. Returns
/// the agent the connection ended on (for the router's connection counts) and the bytes each
/// way. `first` is taken, to be freed as soon as the relay has it.
pub async fn relay(
    client: &mut TcpStream,
    agent: LinkStream,
    ends: Ends,
    first: Vec<u8>,
    shared: &Context,
) -> std::io::Result<(usize, u64, u64)> {
    // the first bytes are written already
    let relay = MoveDriver::offered(shared.config.migration_timeouts, &first)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?
        .into_relay();
    let handshaking = HandshakeGuard {
        shared,
        agent: ends.agent_idx,
        done: false,
    };
    let conn = Conn {
        agent_idx: ends.agent_idx,
        source: ends.source,
        destination: ends.destination,
        next: Some(ends),
        lead: Vec::new(),
        up: first.len() as u64,
        down: 0,
    };
    drop(first);
    drive(client, agent, relay, conn, Some(handshaking), shared).await
}

/// A connection on an agent's link stream once nothing is left to relay by hand: spliced,
/// with every record followed, so that its agent can ask to move it when it drains. `relay`
/// has seen every byte that went each way so far; `up` and `down` count them.
pub async fn serve(
    client: &mut TcpStream,
    agent: LinkStream,
    agent_idx: usize,
    relay: Relay,
    (up, down): (u64, u64),
    shared: &Context,
) -> std::io::Result<(usize, u64, u64)> {
    let meta = *agent.meta();
    let conn = Conn {
        agent_idx,
        source: meta.source,
        destination: meta.destination,
        next: None,
        lead: Vec::new(),
        up,
        down,
    };
    drive(client, agent, relay, conn, None, shared).await
}

/// One client connection through its moves.
struct Conn {
    /// The agent serving it now.
    agent_idx: usize,
    source: SocketAddr,
    destination: SocketAddr,
    /// Where the move under way goes.
    next: Option<Ends>,
    /// Bytes for the client held while the home agent's verdict is awaited (the tickets that
    /// came with the Switch): they leave with the first bytes of whoever serves on.
    lead: Vec<u8>,
    up: u64,
    down: u64,
}

/// Runs a connection to its end: the moves the relay is in the middle of (a handshake's, or
/// one its agent asked for by leaving), and between them a watched splice.
async fn drive(
    client: &mut TcpStream,
    mut agent: LinkStream,
    mut relay: Relay,
    mut conn: Conn,
    mut handshaking: Option<HandshakeGuard<'_>>,
    shared: &Context,
) -> std::io::Result<(usize, u64, u64)> {
    // A connection that cannot be handed over (its client ended its half) is not asked again.
    let mut may_hand_over = true;
    // what a stopped splice read but did not deliver, for the handover that stopped it
    let mut owed = crate::splice::Owed::default();
    loop {
        if relay.is_serving() {
            if let Some(h) = handshaking.as_mut() {
                h.finish();
            }
            if may_hand_over && shared.restart.is_on() {
                let owed = std::mem::take(&mut owed);
                let handed = crate::restart::give::hand_over(
                    client,
                    &mut agent,
                    &mut relay,
                    conn.agent_idx,
                    owed,
                    shared,
                )
                .await;
                match handed {
                    Ok((how, d)) => {
                        conn.down += d;
                        match how {
                            HandedOver::Passed | HandedOver::Ended => {
                                return Ok((conn.agent_idx, conn.up, conn.down))
                            }
                            HandedOver::Kept(stream) => agent = *stream,
                        }
                        continue;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "handover failed; connection closed");
                        shared.metrics.handover("lost");
                        return Ok((conn.agent_idx, conn.up, conn.down));
                    }
                }
            }
            // Stopped, but no handover took the connection after all (the successor failed,
            // or the client had ended its half): what the splice held goes first. Bytes owed
            // to the client alone (a move's tickets) lead the splice's first write instead.
            let mut o = std::mem::take(&mut owed);
            let lead = match o.to_agent.is_empty() {
                true => std::mem::take(&mut o.to_client),
                false => Vec::new(),
            };
            if !o.to_agent.is_empty() || !o.to_client.is_empty() {
                conn.up += o.to_agent.len() as u64;
                conn.down += o.to_client.len() as u64;
                let deliver = async {
                    agent.write_all(&o.to_agent).await?;
                    client.write_all(&o.to_client).await
                };
                let limit = shared.config.idle_timeout;
                if !matches!(tokio::time::timeout(limit, deliver).await, Ok(Ok(()))) {
                    return Ok((conn.agent_idx, conn.up, conn.down));
                }
            }
            let stop = async {
                if may_hand_over {
                    shared.restart.started().await
                } else {
                    std::future::pending().await
                }
            };
            let watched = crate::splice::splice_watched(
                client,
                &mut agent,
                &mut relay,
                shared.splice_limits(),
                lead,
                stop,
            )
            .await;
            let (u, d, how) = match watched {
                Ok(w) => w,
                Err(_) => return Ok((conn.agent_idx, conn.up, conn.down)),
            };
            conn.up += u;
            conn.down += d;
            match how {
                Watched::Ended => return Ok((conn.agent_idx, conn.up, conn.down)),
                Watched::Stopped {
                    client_ended,
                    owed: o,
                } => {
                    // a client that ended its half is not handed over: it splices on
                    may_hand_over &= !client_ended;
                    owed = o;
                    continue;
                }
                // A client that has ended its side will send nothing more to move for.
                Watched::Left { client_ended } => {
                    answer_leave(&mut relay, &mut conn, client_ended, shared)
                }
            }
        } else if relay.is_leaving() {
            // taken over from a predecessor with the agent's Leave unanswered
            answer_leave(&mut relay, &mut conn, false, shared);
        }
        let Some(target) =
            moving(client, &mut agent, &mut relay, &mut conn, &mut handshaking).await?
        else {
            return Ok((conn.agent_idx, conn.up, conn.down));
        };
        // What the move still holds for the client goes with the splice's first bytes (or
        // to a successor dispatcher with the connection).
        owed.to_client.append(&mut conn.lead);
        if let Some(outcome) = relay.outcome() {
            match relay.reason() {
                MoveReason::Handshake => shared.metrics.handoff(outcome),
                MoveReason::Drain => shared.metrics.drain_move(Some(outcome)),
            }
        }
        // (after a fallback, the import stream was reset already)
        if let (Target::HomeAgent, Some(ends)) = (target, conn.next.take()) {
            let Some(home) = ends.stream else {
                return Ok((conn.agent_idx, conn.up, conn.down));
            };
            shared.router().moved(conn.agent_idx, ends.home_idx);
            // Done: a reset with NO_ERROR, one frame, and the agent owes no END back. It
            // waits for the next frame to that agent's link (at most a few ms), so that it
            // costs no write, wake-up and read of its own (`LinkStream::release_later`).
            std::mem::replace(&mut agent, home).release_later();
            conn.agent_idx = ends.home_idx;
        }
    }
}

/// Answers an agent that asked to leave: the client's next home, or a Stay (the relay queues
/// the frames; `moving` sends them).
fn answer_leave(relay: &mut Relay, conn: &mut Conn, client_ended: bool, shared: &Context) {
    let next = (!client_ended)
        .then(|| next_home(conn.agent_idx, conn.source, conn.destination, shared))
        .flatten();
    // ChooseHome is queued: answer it now, the protocol loop sends the rest
    let _ = relay.poll_action();
    match &next {
        Some(e) => {
            let home_id = shared.router().id_of(e.home_idx).unwrap_or(0);
            relay.move_to(home_id, binding(e));
        }
        None => {
            shared.metrics.drain_move(None);
            relay.stay();
        }
    }
    conn.next = next;
}

/// Where a connection whose agent leaves goes next: the client's home among the agents that
/// take clients, other than the one leaving, with a live link.
fn next_home(
    leaving: usize,
    source: SocketAddr,
    destination: SocketAddr,
    shared: &Context,
) -> Option<Ends> {
    let home_idx = shared.router().home_excluding(source.ip(), leaving)?;
    let home = shared.roster.link(home_idx)?;
    Some(Ends {
        agent_idx: leaving,
        home_idx,
        home: Some(home),
        token: baton_link::token(),
        source,
        destination,
        stream: None,
        drain: true,
    })
}

/// The binding a move's session object is sealed for: the home agent's link and the token.
fn binding(ends: &Ends) -> [u8; baton_migrate::BINDING_LEN] {
    let mut b = [0u8; baton_migrate::BINDING_LEN];
    if let Some(h) = &ends.home {
        b[..16].copy_from_slice(&h.id());
    }
    b[16..].copy_from_slice(&ends.token);
    b
}

/// Pumps one move (`baton_migrate::MoveDriver`, around the connection's relay) until it says
/// where the connection goes (`Some`), or the connection ends (`None`). After a Stay the relay
/// serves again: `Some` of the current agent.
async fn moving(
    client: &mut TcpStream,
    agent: &mut LinkStream,
    relay: &mut Relay,
    conn: &mut Conn,
    handshaking: &mut Option<HandshakeGuard<'_>>,
) -> std::io::Result<Option<Target>> {
    let mut driver = MoveDriver::new(std::mem::take(relay));
    let r = pump(client, agent, &mut driver, conn, handshaking).await;
    *relay = driver.into_relay();
    r
}

async fn pump(
    client: &mut TcpStream,
    agent: &mut LinkStream,
    driver: &mut MoveDriver,
    conn: &mut Conn,
    handshaking: &mut Option<HandshakeGuard<'_>>,
) -> std::io::Result<Option<Target>> {
    // Read into spare capacity (`read_buf`): 36 KiB are not zeroed per move to be overwritten.
    let mut cbuf = Vec::with_capacity(16 * 1024);
    let mut abuf = Vec::with_capacity(16 * 1024);
    let mut hbuf = Vec::with_capacity(4 * 1024);
    loop {
        // Do what the driver asks, in order.
        while let Some(io) = driver.poll_io() {
            match io {
                // held in `lead`, written before the next wait unless the home agent's
                // verdict is awaited (see `Conn::lead`); counted when written
                MoveIo::ToClient(b) => conn.lead.extend_from_slice(&b),
                MoveIo::ToAgent(b) => agent.write_all(&b).await?,
                MoveIo::ToHome(b) => {
                    let home = conn.next.as_mut().and_then(|e| e.stream.as_mut());
                    if let Some(h) = home {
                        if h.write_all(&b).await.is_err() {
                            driver.home_write_failed();
                        }
                    }
                }
                MoveIo::OpenHome => {
                    let deadline = driver
                        .poll_timeout(Instant::now().into_std())
                        .map_or_else(Instant::now, Instant::from_std);
                    let opened = match conn.next.as_mut() {
                        Some(ends) => ends.open(deadline).await,
                        None => false,
                    };
                    driver.home_opened(opened);
                }
                MoveIo::ShutdownAgent => {
                    let _ = agent.shutdown().await;
                }
                MoveIo::ResetHome => {
                    if let Some(h) = conn.next.as_mut().and_then(|e| e.stream.take()) {
                        h.abort();
                    }
                }
                MoveIo::HandshakeOver => {
                    if let Some(h) = handshaking.as_mut() {
                        h.finish();
                    }
                }
                MoveIo::Splice(t) => return Ok(Some(t)),
                MoveIo::Close => {
                    flush_lead(client, conn).await?;
                    return Ok(None);
                }
                MoveIo::Broken(e) => {
                    tracing::debug!(error = %e, "handoff protocol error");
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
                }
            }
        }
        // Waiting on the home agent's verdict, the client's bytes stay held for the splice.
        if conn.next.as_ref().is_none_or(|e| e.stream.is_none()) {
            flush_lead(client, conn).await?;
        }
        let deadline = driver.poll_timeout(Instant::now().into_std());
        let client_open = driver.wants_client_bytes();
        let home = conn.next.as_mut().and_then(|e| e.stream.as_mut());
        cbuf.clear();
        abuf.clear();
        hbuf.clear();
        tokio::select! {
            r = client.read_buf(&mut cbuf), if client_open => match r {
                Ok(0) | Err(_) => driver.client_ended(),
                Ok(n) => { conn.up += n as u64; driver.handle_client(&cbuf[..n]) }
            },
            r = agent.read_buf(&mut abuf) => match r {
                Ok(0) | Err(_) => driver.agent_ended(),
                Ok(n) => driver.handle_agent(&abuf[..n]),
            },
            r = read_opt(home, &mut hbuf) => match r {
                Ok(0) | Err(_) => {
                    if let Some(e) = conn.next.as_mut() {
                        e.stream = None;
                    }
                    driver.home_ended();
                }
                Ok(n) => driver.handle_home(&hbuf[..n]),
            },
            () = crate::splice::sleep_until(deadline) => driver.handle_timeout(Instant::now().into_std()),
        }
    }
}

/// Writes what the move holds for the client.
async fn flush_lead(client: &mut TcpStream, conn: &mut Conn) -> std::io::Result<()> {
    if !conn.lead.is_empty() {
        conn.down += conn.lead.len() as u64;
        client.write_all(&conn.lead).await?;
        conn.lead.clear();
    }
    Ok(())
}

/// A connection whose handshake agent is its home agent already (every resumption, and the
/// full handshakes the balance happens to send home): nothing can move, so no Offer and no
/// protocol, a plain splice like the other policies. For the router the handshake is over
/// where the agent would have declined an Offer: at the agent's first bytes after the
/// client's second flight (TLS 1.3 tickets, the TLS 1.2 server Finished), or at the
/// handshake deadline, whichever comes first.
pub async fn at_home(
    client: &mut TcpStream,
    mut agent: LinkStream,
    agent_idx: usize,
    first: Vec<u8>,
    shared: &Context,
) -> std::io::Result<(usize, u64, u64)> {
    let mut handshaking = HandshakeGuard {
        shared,
        agent: agent_idx,
        done: false,
    };
    shared.metrics.handoff(Outcome::Declined);
    let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    // Every byte each way is followed from the first: the agent may ask to leave later.
    let mut relay = Relay::serving().with_timeouts(shared.config.migration_timeouts);
    // the client's first bytes are on the stream already (`server::confirm`)
    let (mut up, mut down) = (first.len() as u64, 0u64);
    if relay.watch_client(&first).is_err() {
        // Not TLS: the agent answers it (an alert), and nothing here can ever move.
        drop(first);
        handshaking.finish();
        let r = crate::splice::splice(client, &mut agent, shared.splice_limits()).await;
        return r.map(|(u, d)| (agent_idx, up + u, d));
    }
    drop(first);
    let deadline = Instant::now() + shared.config.hello_timeout;
    // In a block: the buffers end with the handshake, not with the connection. On the heap,
    // not in the connection's future (which is moved when it is spawned), and never zeroed
    // (`read_buf` reads into spare capacity).
    {
        let mut cbuf = Vec::with_capacity(4096);
        let mut abuf = Vec::with_capacity(4096);
        let (mut agent_spoke, mut client_answered) = (false, false);
        while !handshaking.done {
            cbuf.clear();
            abuf.clear();
            tokio::select! {
                r = agent.read_buf(&mut abuf) => {
                    let n = r?;
                    if n == 0 {
                        return Ok((agent_idx, up, down));
                    }
                    // The one frame an agent may send here is a Leave: a draining agent asks
                    // to move a connection as soon as it has answered the first request, which
                    // can ride with the client's Finished, so its tickets, the response and the
                    // Leave can come in one read before this phase has seen the handshake end.
                    // `drive` answers it (the relay is leaving).
                    let mut data = &abuf[..n];
                    while !data.is_empty() {
                        let passed = relay.watch_agent(data).map_err(invalid)?;
                        client.write_all(&data[..passed.tls]).await?;
                        down += passed.tls as u64;
                        data = &data[passed.consumed..];
                        if passed.frame.is_some() {
                            if !data.is_empty() {
                                let e = MigrationError::Unexpected("bytes after a Leave", "handshake");
                                return Err(invalid(e));
                            }
                            handshaking.finish();
                        }
                    }
                    if client_answered {
                        handshaking.finish();
                    }
                    agent_spoke = true;
                }
                r = client.read_buf(&mut cbuf) => {
                    let n = r?;
                    if n == 0 {
                        // the client ended its side: the splice carries that on
                        handshaking.finish();
                        let _ = agent.shutdown().await;
                        break;
                    }
                    relay.watch_client(&cbuf[..n]).map_err(invalid)?;
                    agent.write_all(&cbuf[..n]).await?;
                    up += n as u64;
                    client_answered |= agent_spoke;
                }
                _ = tokio::time::sleep_until(deadline) => handshaking.finish(),
            }
        }
    }
    serve(client, agent, agent_idx, relay, (up, down), shared).await
}

/// Tells the router, once, that this connection's handshake is over.
struct HandshakeGuard<'a> {
    shared: &'a Context,
    agent: usize,
    done: bool,
}

impl HandshakeGuard<'_> {
    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.shared.router().handshake_done(self.agent);
        }
    }
}

impl Drop for HandshakeGuard<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}

async fn read_opt(s: Option<&mut LinkStream>, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    match s {
        Some(s) => s.read_buf(buf).await,
        None => std::future::pending().await,
    }
}
