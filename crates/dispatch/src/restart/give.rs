//! The old process's side of one connection in a hot restart: stop it at a chunk boundary, let
//! the agent acknowledge, and pass the client's socket and positions to the successor (or
//! re-attach here when the successor is gone).

use std::io;
use std::os::fd::AsFd;

use baton_link::LinkStream;
use baton_migrate::restart::{Handed, MAX_PENDING};
use baton_migrate::Relay;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::context::Context;
use crate::restart::attach::{attach, owe};
use crate::restart::state::Outgoing;
use crate::splice::Owed;

/// What became of a connection asked to hand over.
pub(crate) enum HandedOver {
    /// The successor has it.
    Passed,
    /// The successor failed: re-attached here, on this new stream to the same agent.
    Kept(Box<LinkStream>),
    /// The agent ended the connection instead of acknowledging; the client was told.
    Ended,
}

/// Hands a served connection over: `agent` stops getting client bytes (the caller stopped the
/// splice: `owed` is what it had read and followed but not delivered), is told with the
/// handover's END, and what it still sends up to its ack is collected, followed by
/// `relay`, for whoever serves on (a slow client does not hold the old process). Returns
/// the outcome and the bytes given to the client here.
pub(crate) async fn hand_over(
    client: &mut TcpStream,
    agent: &mut LinkStream,
    relay: &mut Relay,
    agent_idx: usize,
    owed: Owed,
    shared: &Context,
) -> io::Result<(HandedOver, u64)> {
    let token = baton_link::token();
    agent.hand_over(token)?;
    let deadline = Instant::now() + shared.config.handover_timeout;
    let invalid = |e| io::Error::new(io::ErrorKind::InvalidData, e);
    let Owed {
        to_client: mut pending,
        to_agent,
    } = owed;
    let mut buf = vec![0u8; 8 * 1024];
    loop {
        let n = match tokio::time::timeout_at(deadline, agent.read(&mut buf)).await {
            Ok(r) => r?,
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "agent did not ack")),
        };
        if n == 0 {
            break;
        }
        let mut data = &buf[..n];
        while !data.is_empty() {
            // (an agent that left sends nothing more until answered: watch_agent refuses it)
            let passed = relay.watch_agent(data).map_err(invalid)?;
            pending.extend_from_slice(&data[..passed.tls]);
            data = &data[passed.consumed..];
        }
        if pending.len() > MAX_PENDING {
            return Err(invalid(baton_migrate::MigrationError::Unexpected(
                "more than a stream window",
                "handover",
            )));
        }
    }
    if !agent.handed_over() {
        // the agent ended the connection instead: the client gets the rest and the end
        let rest = tokio::time::timeout(shared.config.idle_timeout, client.write_all(&pending));
        if matches!(rest.await, Ok(Ok(()))) {
            let _ = client.shutdown().await;
        }
        return Ok((HandedOver::Ended, pending.len() as u64));
    }
    let meta = *agent.meta();
    let position = relay.position().ok_or_else(|| {
        invalid(baton_migrate::MigrationError::Unexpected(
            "handover", "a move",
        ))
    })?;
    let handed = Handed {
        source: meta.source,
        destination: meta.destination,
        agent: shared.router().id_of(agent_idx).unwrap_or(0),
        token,
        position,
        to_client: pending,
        to_agent,
    };
    let to = shared.restart.to.borrow().clone();
    let handed = match to {
        Some(to) => {
            let (taken, answer) = oneshot::channel();
            let out = Outgoing {
                fd: client.as_fd().try_clone_to_owned()?,
                handed,
                taken,
            };
            match to.send(out).await {
                Ok(()) => match answer.await {
                    Ok(Ok(())) => {
                        shared.metrics.handover("passed");
                        return Ok((HandedOver::Passed, 0));
                    }
                    Ok(Err(handed)) => handed,
                    // the pass loop is gone with the connection's state
                    Err(_) => return Err(io::ErrorKind::BrokenPipe.into()),
                },
                Err(mpsc::error::SendError(out)) => out.handed,
            }
        }
        None => handed,
    };
    // The successor is gone: the agent waits for a re-attach all the same, from here.
    let mut stream = attach(shared, agent_idx, meta.source, meta.destination, token).await?;
    owe(client, &mut stream, &handed, shared).await?;
    shared.metrics.handover("kept");
    Ok((
        HandedOver::Kept(Box::new(stream)),
        handed.to_client.len() as u64,
    ))
}
