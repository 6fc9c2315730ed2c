//! The old process's side of a hot restart: start the successor, pass it the listeners, wait
//! until it is ready, then pass it every connection.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use baton_migrate::restart::{ListenerKind, Message};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::context::Context;
use crate::restart::channel::Channel;
use crate::restart::state::{Outgoing, QUEUE, SOCKET_ENV};

/// The old process's side, once asked: starts the successor, passes the listeners, and
/// waits for it to be ready. `Err`: no successor (it is killed if it started), the old
/// process serves on.
pub(crate) async fn start(shared: &Context) -> anyhow::Result<Successor> {
    let h = &shared.restart;
    if h.busy.swap(true, Ordering::AcqRel) {
        anyhow::bail!("a handover is under way");
    }
    let r = start_inner(shared).await;
    if r.is_err() {
        h.busy.store(false, Ordering::Release);
    }
    r
}

/// A successor that is ready; connections go to it while this lives.
pub(crate) struct Successor {
    child: ChildGuard,
    channel: Arc<Channel>,
    dir: TempDir,
}

async fn start_inner(shared: &Context) -> anyhow::Result<Successor> {
    use anyhow::Context as _;
    let h = &shared.restart;
    let deadline = Instant::now() + shared.config.handover_timeout;
    let dir = TempDir::new()?;
    let path = dir.0.join("handover.sock");
    let listener = UnixListener::bind(&path).context("handover socket")?;
    let child = tokio::process::Command::new(&h.exe)
        .args(&h.args)
        .env(SOCKET_ENV, &path)
        .stdin(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting the successor {}", h.exe.display()))?;
    let pid = child.id();
    let mut child = ChildGuard(Some(child));
    let accepted = tokio::select! {
        a = tokio::time::timeout_at(deadline, listener.accept()) => a,
        s = child.wait() => anyhow::bail!("the successor exited at start: {s:?}"),
    };
    let (sock, _) = accepted
        .map_err(|_| anyhow::anyhow!("the successor did not connect in time"))?
        .context("handover accept")?;
    // Only the process we started may take the sockets (the directory is ours alone too).
    let peer = sock.peer_cred().context("handover peer")?.pid();
    if peer.map(|p| p as u32) != pid {
        anyhow::bail!("handover socket: a process other than the successor connected");
    }
    drop(listener);
    let mut channel = Channel::new(sock);
    let owned = h.kept_listeners()?;
    let (kinds, fds): (Vec<ListenerKind>, Vec<BorrowedFd<'_>>) =
        owned.iter().map(|(k, fd)| (*k, fd.as_fd())).unzip();
    channel.send(&Message::Listeners(kinds), &fds).await?;
    let ready = tokio::select! {
        r = tokio::time::timeout_at(deadline, channel.recv()) => r,
        s = child.wait() => anyhow::bail!("the successor exited before it was ready: {s:?}"),
    };
    match ready {
        Ok(Ok(Some((Message::Ready, _)))) => {}
        Ok(Ok(other)) => anyhow::bail!("the successor said {other:?} instead of Ready"),
        Ok(Err(e)) => anyhow::bail!("handover socket: {e}"),
        Err(_) => anyhow::bail!("the successor was not ready in time"),
    }
    Ok(Successor {
        child,
        channel: Arc::new(channel),
        dir,
    })
}

impl Successor {
    /// Passes every connection that hands itself over, until `deadline` or until no
    /// connection is left (`all_done` resolves). Returns `true` when the successor took
    /// them; `false` at once when it failed (exited, or its socket broke): connections not
    /// passed are kept here, and the caller accepts again.
    pub(crate) async fn pass(
        mut self,
        shared: &Context,
        all_done: impl std::future::Future<Output = ()>,
        deadline: Instant,
    ) -> bool {
        let (tx, mut rx) = mpsc::channel::<Outgoing>(QUEUE);
        shared.restart.to.send_replace(Some(tx));
        tokio::pin!(all_done);
        let mut alive = true;
        loop {
            let out = tokio::select! {
                o = rx.recv() => o,
                _ = &mut all_done => break,
                _ = tokio::time::sleep_until(deadline) => break,
                s = self.child.wait() => {
                    tracing::warn!(status = ?s, "handover: the successor exited; keeping the rest here");
                    alive = false;
                    break;
                }
            };
            let Some(out) = out else { break };
            let message = Message::Conn(Box::new(out.handed));
            // a successor that stops reading is a failed one
            let fds = [out.fd.as_fd()];
            let send = self.channel.send(&message, &fds);
            let sent = matches!(tokio::time::timeout_at(deadline, send).await, Ok(Ok(())));
            let back = match message {
                Message::Conn(handed) if !sent => Err(*handed),
                _ => Ok(()),
            };
            let _ = out.taken.send(back);
            if !sent {
                tracing::warn!("handover: the successor's socket failed; keeping the rest here");
                alive = false;
                break;
            }
        }
        // Connections that asked meanwhile are kept here.
        shared.restart.to.send_replace(None);
        rx.close();
        while let Ok(out) = rx.try_recv() {
            let _ = out.taken.send(Err(out.handed));
        }
        if alive {
            let _ = self.channel.send(&Message::Done, &[]).await;
            // the successor runs on: it is no longer ours to kill
            self.child.0 = None;
        }
        drop(self.dir);
        shared.restart.busy.store(false, Ordering::Release);
        alive
    }
}

/// The successor process, killed if dropped before it took over.
struct ChildGuard(Option<tokio::process::Child>);

impl ChildGuard {
    /// Waits for the child to exit (never, if there is none).
    async fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        match &mut self.0 {
            Some(c) => c.wait().await,
            None => std::future::pending().await,
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.start_kill();
        }
    }
}

/// An owner-only directory for the handover socket, removed with it.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let t = baton_link::token();
        let name = format!(
            "baton-handover-{}-{:02x}{:02x}{:02x}{:02x}",
            std::process::id(),
            t[0],
            t[1],
            t[2],
            t[3]
        );
        let path = std::env::temp_dir().join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
