//! What a running dispatcher keeps for a hot restart: its listening sockets, the command line
//! a successor starts with, and where connections go once one is ready.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use baton_migrate::restart::{Handed, ListenerKind};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch, Notify};

/// Set in a successor's environment: the path of its predecessor's handover socket.
pub(crate) const SOCKET_ENV: &str = "BATON_HANDOVER_SOCKET";

/// Connections on their way to the successor at once.
pub(crate) const QUEUE: usize = 1024;

/// A connection's socket and state on its way to the successor; `taken` says it arrived, or
/// gives the state back.
pub(crate) struct Outgoing {
    pub(crate) fd: OwnedFd,
    pub(crate) handed: Handed,
    pub(crate) taken: oneshot::Sender<Result<(), Handed>>,
}

/// The hot restart's state in a running dispatcher.
pub(crate) struct Restart {
    /// The binary and arguments the successor is started with (the path, so that a binary
    /// replaced on disk is the one that starts).
    pub(crate) exe: PathBuf,
    pub(crate) args: Vec<OsString>,
    /// Copies of the listening sockets, to pass on (or to accept on again).
    pub(crate) listeners: Mutex<Vec<(ListenerKind, OwnedFd)>>,
    /// Set once a successor is ready: where connections go.
    pub(crate) to: watch::Sender<Option<mpsc::Sender<Outgoing>>>,
    pub(crate) requested: Notify,
    pub(crate) busy: AtomicBool,
}

impl Restart {
    pub(crate) fn new() -> Self {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("baton"));
        // `current_exe` of a binary replaced on disk ends in " (deleted)": the path is what
        // starts the new one.
        let exe = exe
            .to_str()
            .and_then(|s| s.strip_suffix(" (deleted)"))
            .map(PathBuf::from)
            .unwrap_or(exe);
        Self {
            exe,
            args: std::env::args_os().skip(1).collect(),
            listeners: Mutex::new(Vec::new()),
            to: watch::channel(None).0,
            requested: Notify::new(),
            busy: AtomicBool::new(false),
        }
    }

    /// Keeps a copy of a listening socket, to pass on.
    pub(crate) fn keep(&self, kind: ListenerKind, l: &TcpListener) -> io::Result<()> {
        let fd = l.as_fd().try_clone_to_owned()?;
        self.listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((kind, fd));
        Ok(())
    }

    /// Copies of the kept listening sockets.
    pub(crate) fn kept_listeners(&self) -> io::Result<Vec<(ListenerKind, OwnedFd)>> {
        let kept = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter()
            .map(|(k, fd)| Ok((*k, fd.try_clone()?)))
            .collect()
    }

    /// Listening sockets again from the kept copies (the successor failed after it took
    /// over accepting): clients, admin, metrics.
    #[allow(clippy::type_complexity)]
    pub(crate) fn relisten(
        &self,
    ) -> io::Result<(Vec<TcpListener>, Option<TcpListener>, Option<TcpListener>)> {
        let (mut public, mut admin, mut metrics) = (Vec::new(), None, None);
        for (kind, fd) in self.kept_listeners()? {
            let l = std::net::TcpListener::from(fd);
            l.set_nonblocking(true)?;
            let l = TcpListener::from_std(l)?;
            match kind {
                ListenerKind::Public => public.push(l),
                ListenerKind::Admin => admin = Some(l),
                ListenerKind::Metrics => metrics = Some(l),
            }
        }
        Ok((public, admin, metrics))
    }

    /// Asks for a handover; `false` when one is under way already.
    pub(crate) fn request(&self) -> bool {
        if self.busy.load(Ordering::Relaxed) {
            return false;
        }
        self.requested.notify_one();
        true
    }

    pub(crate) async fn requested(&self) {
        self.requested.notified().await
    }

    /// Whether connections are being passed to a successor now.
    pub(crate) fn is_on(&self) -> bool {
        self.to.borrow().is_some()
    }

    /// Resolves once connections are to be passed.
    pub(crate) async fn started(&self) {
        let mut rx = self.to.subscribe();
        let _ = rx.wait_for(Option::is_some).await;
    }
}
