//! The one accept loop of Baton's TCP servers (the agent's TLS port, the dispatcher's port and
//! every metrics endpoint): accept until told to stop, back off when accepting fails, and admit
//! a connection only with a slot of the server's connection cap.
//!
//! What a server does with an admitted connection (socket options, who may send a PROXY
//! header, the task that serves it) stays with the server: [`Acceptor::next`] hands out one
//! connection at a time and the caller spawns.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How long to wait after a failed accept: the usual cause is running out of file
/// descriptors, which retrying at once would turn into a busy loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// A connection let in: the socket, its peer and the slot it holds until dropped.
#[derive(Debug)]
pub struct Admitted {
    pub tcp: TcpStream,
    pub peer: SocketAddr,
    /// Released when the connection's task drops it; `None` for an uncapped acceptor.
    pub slot: Option<OwnedSemaphorePermit>,
}

/// Accepts from one listener until `stop` is cancelled.
pub struct Acceptor {
    listener: TcpListener,
    stop: CancellationToken,
    slots: Option<Arc<Semaphore>>,
    on_full: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("listener", &self.listener.local_addr().ok())
            .field("slots", &self.slots.as_ref().map(|s| s.available_permits()))
            .finish()
    }
}

impl Acceptor {
    /// Accepts every connection (no cap) until `stop`.
    pub fn new(listener: TcpListener, stop: CancellationToken) -> Self {
        Self {
            listener,
            stop,
            slots: None,
            on_full: Box::new(|| {}),
        }
    }

    /// Admits a connection only while `slots` has a permit (shared by all the server's
    /// listeners); one that arrives when none is left is closed at once and `on_full` runs.
    /// Closing beats queueing: a client that waits unanswered holds its own resources and the
    /// kernel's, and a balancer in front retries elsewhere sooner.
    pub fn capped(
        mut self,
        slots: Arc<Semaphore>,
        on_full: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        self.slots = Some(slots);
        self.on_full = Box::new(on_full);
        self
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next admitted connection, or `None` once `stop` is cancelled.
    pub async fn next(&self) -> Option<Admitted> {
        loop {
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                _ = self.stop.cancelled() => return None,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::select! {
                        _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                        _ = self.stop.cancelled() => return None,
                    }
                }
            };
            let slot = match &self.slots {
                None => None,
                Some(slots) => match slots.clone().try_acquire_owned() {
                    Ok(p) => Some(p),
                    Err(_) => {
                        (self.on_full)();
                        continue;
                    }
                },
            };
            return Some(Admitted { tcp, peer, slot });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::io::AsyncReadExt;

    async fn listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    #[tokio::test]
    async fn a_full_server_closes_new_connections_and_counts_them() {
        let (l, addr) = listener().await;
        let full = Arc::new(AtomicU64::new(0));
        let counted = full.clone();
        let slots = Arc::new(Semaphore::new(1));
        let acceptor =
            Acceptor::new(l, CancellationToken::new()).capped(slots.clone(), move || {
                counted.fetch_add(1, Ordering::Relaxed);
            });

        let _first = TcpStream::connect(addr).await.unwrap();
        let held = acceptor.next().await.unwrap();
        assert!(held.slot.is_some());
        assert_eq!(slots.available_permits(), 0);

        // The second connection is closed by the acceptor, which keeps waiting for a third.
        let mut second = TcpStream::connect(addr).await.unwrap();
        let next = tokio::spawn(async move { acceptor.next().await.map(|a| a.peer) });
        let mut buf = [0u8; 1];
        assert_eq!(
            second.read(&mut buf).await.unwrap(),
            0,
            "closed, not served"
        );
        assert_eq!(full.load(Ordering::Relaxed), 1);

        // A slot given back admits the next one.
        drop(held);
        let third = TcpStream::connect(addr).await.unwrap();
        let peer = next.await.unwrap().unwrap();
        assert_eq!(peer, third.local_addr().unwrap());
    }

    #[tokio::test]
    async fn stop_ends_the_loop() {
        let (l, _) = listener().await;
        let stop = CancellationToken::new();
        let acceptor = Acceptor::new(l, stop.clone());
        let next = tokio::spawn(async move { acceptor.next().await.is_none() });
        stop.cancel();
        assert!(next.await.unwrap());
    }
}
