//! Carrying a connection on at its agent after a hot restart: the re-attach stream, and the
//! bytes owed each way before anything else.

use std::io;
use std::net::SocketAddr;

use baton_link::{LinkStream, StreamMeta};
use baton_migrate::restart::Handed;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::context::Context;

/// Delivers what a handed-over connection owes each way, before anything else on it (a
/// stalled peer has the idle bound).
pub(crate) async fn owe(
    client: &mut TcpStream,
    agent: &mut LinkStream,
    handed: &Handed,
    shared: &Context,
) -> io::Result<()> {
    let both = async {
        agent.write_all(&handed.to_agent).await?;
        client.write_all(&handed.to_client).await
    };
    tokio::time::timeout(shared.config.idle_timeout, both)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "owed bytes not taken"))?
}

/// Opens the re-attach stream for `token` on a link to agent `idx`, and waits for the agent
/// to take it.
pub(crate) async fn attach(
    shared: &Context,
    idx: usize,
    source: SocketAddr,
    destination: SocketAddr,
    token: [u8; 16],
) -> io::Result<LinkStream> {
    let link = shared
        .roster
        .link(idx)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no link to the agent"))?;
    let meta = StreamMeta {
        reattach: Some(token),
        ..StreamMeta::followed(source, destination)
    };
    let timeout = shared.config.connect_timeout;
    let timed_out = |_| io::Error::new(io::ErrorKind::TimedOut, "re-attach");
    let mut stream = tokio::time::timeout(timeout, link.open(meta))
        .await
        .map_err(timed_out)??;
    tokio::time::timeout(timeout, stream.answered())
        .await
        .map_err(timed_out)??;
    Ok(stream)
}
