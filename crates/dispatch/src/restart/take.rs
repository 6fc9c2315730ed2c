//! The successor's side of a hot restart: the predecessor's listeners, then each connection it
//! passes, re-attached at its agent and served on.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use baton_migrate::restart::{Handed, ListenerKind, Message};
use baton_migrate::Relay;
use tokio::net::{TcpListener, TcpStream, UnixStream};

use crate::context::Context;
use crate::restart::attach::{attach, owe};
use crate::restart::channel::Channel;
use crate::restart::state::SOCKET_ENV;

/// The successor's side of one connection: re-attach at its agent and serve it on.
async fn adopt(handed: Handed, fd: OwnedFd, shared: Arc<Context>) {
    let client = std::net::TcpStream::from(fd);
    let client = client
        .set_nonblocking(true)
        .and_then(|()| TcpStream::from_std(client));
    let Ok(mut client) = client else {
        shared.metrics.handover("lost");
        return;
    };
    let slot = shared.router().slot_of(handed.agent);
    let attached = match slot {
        Some(idx) => attach(
            &shared,
            idx,
            handed.source,
            handed.destination,
            handed.token,
        )
        .await
        .map(|s| (idx, s)),
        None => Err(io::Error::new(io::ErrorKind::NotFound, "no such agent")),
    };
    let (idx, mut stream) = match attached {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(agent = handed.agent, error = %e, "handover: re-attach failed; connection closed");
            shared.metrics.handover("lost");
            return;
        }
    };
    if owe(&mut client, &mut stream, &handed, &shared)
        .await
        .is_err()
    {
        shared.metrics.handover("lost");
        return;
    }
    shared.metrics.handover("taken");
    shared.router().adopted(idx);
    let relay = Relay::resume(handed.position).with_timeouts(shared.config.migration_timeouts);
    let down = handed.to_client.len() as u64;
    let r = crate::migration::serve(&mut client, stream, idx, relay, (0, down), &shared).await;
    match r {
        Ok((idx, up, down)) => {
            shared.metrics.bytes(up, down);
            shared.router().closed(idx);
        }
        Err(e) => {
            tracing::debug!(error = %e, "taken-over connection ended");
            shared.router().closed(idx);
        }
    }
}

/// The successor's side: the predecessor's socket, its listeners, and then the connections.
pub(crate) struct Predecessor {
    channel: Channel,
}

/// Listeners received from the predecessor, by what they are for.
pub(crate) struct Inherited {
    pub public: Vec<TcpListener>,
    pub metrics: Option<TcpListener>,
    pub admin: Option<TcpListener>,
}

impl Predecessor {
    /// Connects to the predecessor named in [`SOCKET_ENV`] (if any) and takes its listeners.
    pub(crate) async fn connect() -> anyhow::Result<Option<(Predecessor, Inherited)>> {
        use anyhow::Context;
        let Some(path) = std::env::var_os(SOCKET_ENV) else {
            return Ok(None);
        };
        let sock = UnixStream::connect(&path)
            .await
            .context("connecting to the predecessor's handover socket")?;
        let mut channel = Channel::new(sock);
        let got = tokio::time::timeout(Duration::from_secs(10), channel.recv())
            .await
            .context("the predecessor sent no listeners")??;
        let Some((Message::Listeners(kinds), fds)) = got else {
            anyhow::bail!("the predecessor sent something else than its listeners");
        };
        let mut inherited = Inherited {
            public: Vec::new(),
            metrics: None,
            admin: None,
        };
        for (kind, fd) in kinds.into_iter().zip(fds) {
            let l = std::net::TcpListener::from(fd);
            l.set_nonblocking(true)?;
            let l = TcpListener::from_std(l)?;
            match kind {
                ListenerKind::Public => inherited.public.push(l),
                ListenerKind::Metrics => inherited.metrics = Some(l),
                ListenerKind::Admin => inherited.admin = Some(l),
            }
        }
        Ok(Some((Predecessor { channel }, inherited)))
    }

    /// Tells the service manager, then the predecessor, that this process accepts now (the
    /// manager first: it must know the new main process before the old one exits), then takes
    /// over every connection it passes, each as a task of `tracker`, until it says Done or
    /// goes away.
    pub(crate) async fn take_over(
        mut self,
        shared: Arc<Context>,
        tracker: tokio_util::task::TaskTracker,
    ) {
        crate::notify::main_and_ready();
        if let Err(e) = self.channel.send(&Message::Ready, &[]).await {
            tracing::warn!(error = %e, "handover: the predecessor is gone");
            return;
        }
        loop {
            match self.channel.recv().await {
                Ok(Some((Message::Conn(handed), mut fds))) => {
                    let Some(fd) = fds.pop() else { continue };
                    tracker.spawn(adopt(*handed, fd, shared.clone()));
                }
                Ok(Some((Message::Done, _))) | Ok(None) => break,
                Ok(Some((other, _))) => {
                    tracing::warn!(message = ?other, "handover: unexpected message");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "handover socket failed");
                    break;
                }
            }
        }
    }
}
