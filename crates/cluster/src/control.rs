//! What `baton up --admin` shares between its main loop, its admin endpoint and the operations
//! it runs on the cluster, one at a time: a rollout of the agents (`rollout.rs`) and a hot
//! restart of the dispatchers (`restart.rs`), and the processes' status (`GET /status`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cluster::{Cluster, Proc};
use crate::procs::alive;
use crate::restart::{self, Dispatcher, RestartReport, Seen, Successors};
use crate::rollout::{RolloutOptions, RolloutReport, Watch};

/// What `baton up --admin` shares between its main loop, its admin endpoint and an operation
/// (a rollout or a hot restart).
pub(crate) struct Control {
    pub cluster: Mutex<Cluster>,
    /// Each agent's command line, taken at start (a dead agent's is no longer readable).
    pub argv: Mutex<Vec<Vec<String>>>,
    pub watch: Watch,
    /// Each dispatcher's current process (a successor after a hot restart).
    pub dispatchers: Mutex<Vec<Dispatcher>>,
    /// The operation running, if any (one rollout or hot restart at a time): why another is
    /// refused.
    pub busy: Mutex<Option<&'static str>>,
    /// The cluster is stopping: an operation gives up at its next wait.
    pub abort: AtomicBool,
    /// The processes as last seen, and the operations' progress (`GET /status`), kept apart from
    /// the cluster's lock so that the answer never waits for a draining agent.
    pub status: Mutex<Status>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Status {
    pub dispatchers: Vec<ProcStatus>,
    pub agents: Vec<ProcStatus>,
    pub rollout: RolloutStatus,
    pub restart: RestartStatus,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProcStatus {
    pub id: usize,
    pub pid: u32,
    pub alive: bool,
    /// What it announced: tls/dispatch, link, metrics, admin.
    pub addrs: std::collections::BTreeMap<String, SocketAddr>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct RolloutStatus {
    pub running: bool,
    /// The agent being restarted, while running.
    pub agent: Option<usize>,
    pub last: Option<RolloutReport>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct RestartStatus {
    pub running: bool,
    /// The dispatcher being replaced, while running.
    pub dispatcher: Option<usize>,
    pub last: Option<RestartReport>,
}

/// Holds [`Control::busy`] while an operation runs.
pub(crate) struct Busy<'a>(&'a Mutex<Option<&'static str>>);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

impl Control {
    pub fn new(cluster: Cluster, watch: Watch) -> anyhow::Result<Arc<Control>> {
        let argv = (0..cluster.agents.len())
            .map(|i| cluster.agent_command_line(i))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let dispatchers = restart::dispatchers_of(&cluster)?;
        let c = Arc::new(Control {
            cluster: Mutex::new(cluster),
            argv: Mutex::new(argv),
            watch,
            dispatchers: Mutex::new(dispatchers),
            busy: Mutex::new(None),
            abort: AtomicBool::new(false),
            status: Mutex::new(Status::default()),
        });
        let mut cluster = c.cluster.lock().unwrap_or_else(|p| p.into_inner());
        c.refresh(&mut cluster);
        drop(cluster);
        Ok(c)
    }

    /// Starts an operation, or says which one runs.
    pub(crate) fn begin(&self, what: &'static str) -> Result<Busy<'_>, &'static str> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(running) = *busy {
            return Err(running);
        }
        *busy = Some(what);
        Ok(Busy(&self.busy))
    }

    /// Records the processes as they are now.
    pub fn refresh(&self, cluster: &mut Cluster) {
        let proc_status = |id: usize, p: &mut Proc| ProcStatus {
            id,
            pid: p.child.id(),
            alive: matches!(p.child.try_wait(), Ok(None)),
            addrs: p.addrs.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        };
        let current = self
            .dispatchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let dispatchers = std::iter::once(&mut cluster.dispatcher)
            .chain(cluster.more_dispatchers.iter_mut())
            .enumerate()
            .map(|(i, p)| {
                let mut s = proc_status(i, p);
                // a successor after a hot restart: same addresses, another process
                if let Some(d) = current.get(i).filter(|d| d.followed) {
                    s.pid = d.pid;
                    s.alive = alive(d.pid);
                }
                s
            })
            .collect();
        let agents = cluster
            .agents
            .iter_mut()
            .enumerate()
            .map(|(i, p)| proc_status(i, p))
            .collect();
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        s.dispatchers = dispatchers;
        s.agents = agents;
    }

    /// Restarts every agent in turn (blocking: run it off the async runtime). Refused while
    /// another rollout or a hot restart runs.
    pub fn rollout(&self, opts: RolloutOptions) -> Result<RolloutReport, &'static str> {
        let _busy = self.begin("a rollout is running")?;
        let n = self
            .cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .agents
            .len();
        let progress = |s: &mut Status, running, agent| {
            s.rollout.running = running;
            s.rollout.agent = agent;
        };
        let turns = self.in_turn(n, opts.pause, progress, |i| {
            let argv = self.argv.lock().unwrap_or_else(|p| p.into_inner())[i].clone();
            let mut cluster = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
            tracing::info!(agent = i, "rollout: draining and restarting");
            let r = cluster.restart_agent(i, &argv, &opts, &self.watch, &self.abort);
            self.refresh(&mut cluster);
            match &r.error {
                None => tracing::info!(
                    agent = i,
                    old_pid = r.old_pid,
                    new_pid = r.new_pid,
                    drain_ms = r.drain_ms,
                    killed = r.killed,
                    restart_ms = r.restart_ms,
                    "rollout: agent back"
                ),
                Some(e) => tracing::error!(agent = i, error = %e, "rollout: stopped"),
            }
            let failed = r.error.clone();
            (r, failed)
        });
        let report = RolloutReport {
            ok: turns.ok,
            agents: turns.done,
            total_ms: turns.total_ms,
            error: turns.error,
        };
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        s.rollout.last = Some(report.clone());
        progress(&mut s, false, None);
        Ok(report)
    }

    /// Hot-restarts every dispatcher in turn (blocking: run it off the async runtime). Refused
    /// while a rollout or another hot restart runs.
    pub fn restart(&self, deadline: Duration) -> Result<RestartReport, &'static str> {
        let _busy = self.begin("a hot restart is running")?;
        let n = self
            .dispatchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        let progress = |s: &mut Status, running, dispatcher| {
            s.restart.running = running;
            s.restart.dispatcher = dispatcher;
        };
        let turns = self.in_turn(n, Duration::ZERO, progress, |i| {
            let mut cluster = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
            tracing::info!(
                dispatcher = i,
                "hot restart: asking the dispatcher (SIGUSR2)"
            );
            let r = restart::restart_one(&mut cluster, &self.dispatchers, i, deadline, &self.abort);
            self.refresh(&mut cluster);
            match &r.error {
                None => tracing::info!(
                    dispatcher = i,
                    old_pid = r.old_pid,
                    new_pid = r.new_pid,
                    gone_ms = r.gone_ms,
                    taken = r.taken,
                    lost = r.lost,
                    "hot restart: the successor serves"
                ),
                Some(e) => tracing::error!(dispatcher = i, error = %e, "hot restart: stopped"),
            }
            let failed = r.error.clone();
            (r, failed)
        });
        let report = RestartReport {
            ok: turns.ok,
            dispatchers: turns.done,
            total_ms: turns.total_ms,
            error: turns.error,
        };
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        s.restart.last = Some(report.clone());
        progress(&mut s, false, None);
        Ok(report)
    }

    /// Looks at every dispatcher: one that exited with a successor is followed from now on, one
    /// without is reported.
    pub(crate) fn check_dispatchers(&self, cluster: &mut Cluster) -> Vec<Seen> {
        let mut ds = self.dispatchers.lock().unwrap_or_else(|p| p.into_inner());
        restart::check(cluster, &mut ds)
    }

    /// Stops the dispatchers' processes that are not the cluster's children (see
    /// [`restart::stop_successors`]).
    pub(crate) fn stop_successors(&self) -> Successors {
        let ds = self.dispatchers.lock().unwrap_or_else(|p| p.into_inner());
        restart::stop_successors(&ds)
    }

    /// What a rollout and a hot restart share: `step` for each of `n` processes in order,
    /// `pause` apart, until one fails (its error) or the cluster stops; the progress in
    /// [`Status`] as it goes. The caller records the outcome and clears the progress.
    pub(crate) fn in_turn<T>(
        &self,
        n: usize,
        pause: Duration,
        progress: impl Fn(&mut Status, bool, Option<usize>),
        mut step: impl FnMut(usize) -> (T, Option<String>),
    ) -> Turns<T> {
        let began = Instant::now();
        let mut turns = Turns {
            ok: true,
            done: Vec::new(),
            total_ms: 0,
            error: None,
        };
        for i in 0..n {
            if i > 0 && !pause.is_zero() {
                sleep_unless(&self.abort, pause);
            }
            if self.abort.load(Ordering::Relaxed) {
                turns.ok = false;
                turns.error = Some("stopped: the cluster is shutting down".into());
                break;
            }
            progress(
                &mut self.status.lock().unwrap_or_else(|p| p.into_inner()),
                true,
                Some(i),
            );
            let (r, failed) = step(i);
            turns.done.push(r);
            if let Some(e) = failed {
                turns.ok = false;
                turns.error = Some(e);
                break;
            }
        }
        turns.total_ms = began.elapsed().as_millis() as u64;
        turns
    }
}

/// The outcome of [`Control::in_turn`].
pub(crate) struct Turns<T> {
    /// Every step succeeded.
    pub ok: bool,
    /// Each step's report, the failed one last.
    pub done: Vec<T>,
    pub total_ms: u64,
    pub error: Option<String>,
}

fn sleep_unless(abort: &AtomicBool, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !abort.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
    }
}
