//! The dispatcher handover: on SIGUSR2 or `POST /handover` the dispatcher starts a
//! successor (the binary now at its path, with its own command line), passes it the listening
//! sockets, and once it is ready, every live client connection, then exits. Clients notice
//! nothing: their TCP connection, TLS session and agent stay the same.
//!
//! Each connection stops at a chunk boundary each way (never inside a write), ends its agent
//! stream with `baton-handover` trailers, forwards what the agent still sends until its `ack`
//! (the agent then waits for a re-attach stream with that token, `baton-link`), and passes
//! the client's socket with its record positions ([`baton_migrate::restart`]). The successor
//! opens the re-attach stream on its own link to the same agent and serves on.
//!
//! Failures: a successor that does not get ready in `--handover-timeout` is killed and the old
//! process serves on. A successor that dies once ready: connections not passed yet are
//! re-attached by the old process itself, which accepts again; those passed die with it.
//! Connections that cannot be handed over (not TLS, agents over plain TCP, a client that has
//! ended its half) stay until the deadline and close with the old process.
//!
//! Under systemd (`Type=notify`, [`crate::notify`]): the old process says `RELOADING=1`, the
//! successor `MAINPID=` itself and `READY=1` before it tells the old process it is ready (so
//! the old one's exit is not the service's), and an old process that serves on after a failed
//! successor claims the main pid back.

pub(crate) mod channel;

use std::ffi::OsString;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_link::{LinkStream, StreamMeta};
use baton_migrate::restart::{Handed, ListenerKind, Message, MAX_PENDING};
use baton_migrate::Relay;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;

use crate::server::Shared;
use crate::splice::Owed;
use channel::Channel;

/// Set in a successor's environment: the path of its predecessor's handover socket.
pub const SOCKET_ENV: &str = "BATON_HANDOVER_SOCKET";

/// Connections on their way to the successor at once.
const QUEUE: usize = 1024;

/// A connection's socket and state on its way to the successor; `taken` says it arrived, or
/// gives the state back.
pub(crate) struct Outgoing {
    fd: OwnedFd,
    handed: Handed,
    taken: oneshot::Sender<Result<(), Handed>>,
}

/// The handover's state in a running dispatcher.
pub(crate) struct Handover {
    /// The binary and arguments the successor is started with (the path, so that a binary
    /// replaced on disk is the one that starts).
    exe: PathBuf,
    args: Vec<OsString>,
    /// Copies of the listening sockets, to pass on (or to accept on again).
    listeners: Mutex<Vec<(ListenerKind, OwnedFd)>>,
    /// Set once a successor is ready: where connections go.
    to: watch::Sender<Option<mpsc::Sender<Outgoing>>>,
    requested: Notify,
    busy: AtomicBool,
}

impl Handover {
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
    fn kept_listeners(&self) -> io::Result<Vec<(ListenerKind, OwnedFd)>> {
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
/// handover trailers, and what it still sends up to its ack is collected, followed by
/// `relay`, for whoever serves on (a slow client does not hold the old process). Returns
/// the outcome and the bytes given to the client here.
pub(crate) async fn hand_over(
    client: &mut TcpStream,
    agent: &mut LinkStream,
    relay: &mut Relay,
    agent_idx: usize,
    owed: Owed,
    shared: &Shared,
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
    let to = shared.handover.to.borrow().clone();
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

/// Delivers what a handed-over connection owes each way, before anything else on it (a
/// stalled peer has the idle bound).
async fn owe(
    client: &mut TcpStream,
    agent: &mut LinkStream,
    handed: &Handed,
    shared: &Shared,
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
async fn attach(
    shared: &Shared,
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

/// The successor's side of one connection: re-attach at its agent and serve it on.
async fn adopt(handed: Handed, fd: OwnedFd, shared: Arc<Shared>) {
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
    let r = crate::handoff::serve(&mut client, stream, idx, relay, (0, down), &shared).await;
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

/// The old process's side, once asked: starts the successor, passes the listeners, and
/// waits for it to be ready. `Err`: no successor (it is killed if it started), the old
/// process serves on.
pub(crate) async fn start(shared: &Shared) -> anyhow::Result<Successor> {
    let h = &shared.handover;
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

async fn start_inner(shared: &Shared) -> anyhow::Result<Successor> {
    use anyhow::Context;
    let h = &shared.handover;
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
        shared: &Shared,
        all_done: impl std::future::Future<Output = ()>,
        deadline: Instant,
    ) -> bool {
        let (tx, mut rx) = mpsc::channel::<Outgoing>(QUEUE);
        shared.handover.to.send_replace(Some(tx));
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
        shared.handover.to.send_replace(None);
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
        shared.handover.busy.store(false, Ordering::Release);
        alive
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
        shared: Arc<Shared>,
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
