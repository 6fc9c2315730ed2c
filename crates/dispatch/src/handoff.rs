//! The tokio shell of a handed-off connection (`--policy handoff`, CSSL-SF): it pumps
//! `baton_wire::handoff::Relay` — the protocol's state machine, where every decision is made —
//! between the client, the handshake agent's link stream and the home agent's, applies the
//! timeouts the state machine leaves to it, and once the relay says where the stream belongs,
//! splices the client to that agent. A migration is a stream move: the home agent's stream is
//! one more stream on a link that is already up.

use std::net::SocketAddr;
use std::time::Duration;

use baton_link::{LinkHandle, LinkStream, StreamMeta};
use baton_wire::handoff::{Action, Frame, Outcome, Relay, Target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::server::Shared;

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
}

/// Relays one connection whose handshake runs on `agent` and whose session should move to the
/// home agent. The Offer and the client's first bytes are already written to `agent`. Returns
/// the agent the connection ended on (for the router's connection counts) and the bytes each
/// way. `first` is taken, to be freed as soon as the relay has it.
pub async fn relay(
    client: &mut TcpStream,
    mut agent: LinkStream,
    ends: Ends,
    first: Vec<u8>,
    shared: &Shared,
) -> std::io::Result<(usize, u64, u64)> {
    let cfg = &shared.config;
    let agent_idx = ends.agent_idx;
    let mut handshaking = HandshakeGuard {
        shared,
        agent: agent_idx,
        done: false,
    };
    let mut relay = Relay::new();
    relay
        .from_client(&first)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    // the first bytes are written already
    while relay.poll_action().is_some() {}
    let mut home: Option<LinkStream> = None;
    let mut cbuf = vec![0u8; 16 * 1024];
    let mut abuf = vec![0u8; 16 * 1024];
    let mut hbuf = vec![0u8; 4 * 1024];
    let (mut up, mut down) = (first.len() as u64, 0u64);
    drop(first);
    let far = Instant::now() + Duration::from_secs(86_400);
    let mut home_deadline = far;
    let mut freeze_deadline = far;
    let mut client_eof = false;
    let mut released = false;
    let target = loop {
        // Do what the relay asks, in order; a splice ends the protocol part.
        let mut spliced = None;
        while let Some(action) = relay.poll_action() {
            match action {
                Action::ToClient(b) => {
                    down += b.len() as u64;
                    client.write_all(&b).await?;
                }
                // Done is told by releasing the agent's stream once the splice starts (a reset
                // with NO_ERROR, `LinkStream::release`): one frame, and the agent owes no END.
                Action::ToAgent(b) if b == Frame::Done.to_bytes() => released = true,
                Action::ToAgent(b) => agent.write_all(&b).await?,
                Action::ToHome(b) => {
                    if let Some(h) = home.as_mut() {
                        if h.write_all(&b).await.is_err() && spliced.is_none() {
                            relay.home_failed();
                        }
                    }
                }
                Action::ConnectHome => {
                    home_deadline = Instant::now() + cfg.handoff_timeout;
                    let meta = StreamMeta {
                        source: ends.source,
                        destination: ends.destination,
                        token: Some(ends.token),
                    };
                    let opened = match &ends.home {
                        Some(link) => tokio::time::timeout_at(home_deadline, link.open(meta))
                            .await
                            .ok()
                            .and_then(Result::ok),
                        None => None,
                    };
                    match opened {
                        Some(s) => {
                            home = Some(s);
                            relay.home_connected();
                        }
                        None => relay.home_failed(),
                    }
                }
                Action::CloseAgent if released => {}
                Action::CloseAgent => {
                    let _ = agent.shutdown().await;
                }
                // Reset: the home agent drops the keys it was never told to use.
                Action::CloseHome => {
                    if let Some(h) = home.take() {
                        h.abort();
                    }
                }
                Action::Splice(t) => spliced = Some(t),
            }
        }
        if let Some(t) = spliced {
            break t;
        }
        if !relay.is_relaying_handshake() {
            handshaking.finish();
        }
        if relay.awaiting_freeze() && freeze_deadline == far {
            freeze_deadline = Instant::now() + cfg.handoff_timeout * 2;
        }
        let client_open = relay.wants_client_bytes() && !client_eof;
        let result = tokio::select! {
            r = client.read(&mut cbuf), if client_open => match r {
                // the client left before the handoff finished: nobody to serve
                Ok(0) | Err(_) if !relay.awaiting_freeze() => return Ok((agent_idx, up, down)),
                // frozen: its EOF waits with its held bytes, for whoever gets the stream
                Ok(0) | Err(_) => { client_eof = true; Ok(()) }
                Ok(n) => { up += n as u64; relay.from_client(&cbuf[..n]) }
            },
            r = agent.read(&mut abuf) => match r {
                Ok(0) | Err(_) => return Ok((agent_idx, up, down)),
                Ok(n) => relay.from_agent(&abuf[..n]),
            },
            r = read_opt(home.as_mut(), &mut hbuf) => match r {
                Ok(0) | Err(_) => { home = None; relay.home_failed(); Ok(()) }
                Ok(n) => relay.from_home(&hbuf[..n]),
            },
            _ = tokio::time::sleep_until(home_deadline), if relay.awaiting_home() => {
                relay.home_failed();
                Ok(())
            }
            _ = tokio::time::sleep_until(freeze_deadline), if relay.awaiting_freeze() => {
                return Ok((agent_idx, up, down));
            }
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "handoff protocol error");
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        }
    };
    handshaking.finish();
    if let Some(outcome) = relay.outcome() {
        shared.metrics.handoff(outcome);
    }
    // The protocol is over: its state and buffers are not held for the connection's life.
    drop((relay, cbuf, abuf, hbuf));
    let (idx, mut stream) = match (target, home) {
        (Target::HomeAgent, Some(h)) => {
            shared.router().moved(agent_idx, ends.home_idx);
            debug_assert!(released, "the relay commits with Done");
            agent.release();
            (ends.home_idx, h)
        }
        (Target::HomeAgent, None) => return Ok((agent_idx, up, down)),
        (Target::HandshakeAgent, _) => (agent_idx, agent),
    };
    let (u, d) = crate::splice::splice(client, &mut stream, shared.splice_limits())
        .await
        .unwrap_or((0, 0));
    Ok((idx, up + u, down + d))
}

/// A connection whose handshake agent is its home agent already (every resumption, and the
/// full handshakes the balance happens to send home): nothing can move, so no Offer and no
/// protocol, a plain splice like the other policies. For the router the handshake is over
/// where the agent would have declined an Offer: at the agent's first bytes after the
/// client's second flight (TLS 1.3 tickets, the TLS 1.2 server Finished), or at the
/// handshake deadline, whichever comes first.
pub async fn at_home(
    client: &mut TcpStream,
    agent: &mut LinkStream,
    agent_idx: usize,
    first: Vec<u8>,
    shared: &Shared,
) -> std::io::Result<(u64, u64)> {
    let mut handshaking = HandshakeGuard {
        shared,
        agent: agent_idx,
        done: false,
    };
    shared.metrics.handoff(Outcome::Declined);
    // the client's first bytes are on the stream already (`server::confirm`)
    let (mut up, mut down) = (first.len() as u64, 0u64);
    drop(first);
    let deadline = Instant::now() + shared.config.hello_timeout;
    // In a block: the buffers end with the handshake, not with the connection.
    {
        let mut cbuf = [0u8; 4096];
        let mut abuf = [0u8; 4096];
        let (mut agent_spoke, mut client_answered) = (false, false);
        while !handshaking.done {
            tokio::select! {
                r = agent.read(&mut abuf) => {
                    let n = r?;
                    if n == 0 {
                        return Ok((up, down));
                    }
                    client.write_all(&abuf[..n]).await?;
                    down += n as u64;
                    if client_answered {
                        handshaking.finish();
                    }
                    agent_spoke = true;
                }
                r = client.read(&mut cbuf) => {
                    let n = r?;
                    if n == 0 {
                        // the client ended its side: the splice carries that on
                        handshaking.finish();
                        let _ = agent.shutdown().await;
                        break;
                    }
                    agent.write_all(&cbuf[..n]).await?;
                    up += n as u64;
                    client_answered |= agent_spoke;
                }
                _ = tokio::time::sleep_until(deadline) => handshaking.finish(),
            }
        }
    }
    let (u, d) = crate::splice::splice(client, agent, shared.splice_limits()).await?;
    Ok((up + u, down + d))
}

/// Tells the router, once, that this connection's handshake is over.
struct HandshakeGuard<'a> {
    shared: &'a Shared,
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

async fn read_opt(s: Option<&mut LinkStream>, buf: &mut [u8]) -> std::io::Result<usize> {
    match s {
        Some(s) => s.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Label of a handoff outcome, for metrics.
pub fn outcome_label(o: Outcome) -> &'static str {
    match o {
        Outcome::Migrated => "migrated",
        Outcome::Declined => "declined",
        Outcome::Aborted => "aborted",
        Outcome::FellBack(_) => "fell_back",
    }
}
