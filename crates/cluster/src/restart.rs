//! Hot restart of `baton up`'s dispatchers: a dispatcher asked to restart (SIGUSR2 from anyone,
//! or `POST /restart` on `baton up --admin`) is replaced by a successor process with the same
//! command line that `baton up` did not start and has no `Child` handle for. `baton up` makes
//! itself a child subreaper, so that a successor orphaned by its predecessor's exit becomes
//! its child (reaped here, never a stray process); it then watches the successor by pid
//! (`/proc/PID`, its command line checked against pid reuse) and stops it with the cluster.
//! A dispatcher that exits without a successor still stops the cluster.
//!
//! `POST /restart` asks each dispatcher in turn: SIGUSR2, then wait until the old process is
//! gone, its successor (a child of the old one with the same command line) runs and the
//! metrics socket they share answers again, then the next dispatcher. A successor that fails
//! leaves the old process serving (its log says "handover failed; serving on"): the operation
//! stops there and says so.

use std::io::{Read as _, Seek as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::client::http;
use crate::cluster::{Cluster, Proc};
use crate::procs::{alive, args_of, find_successor, reap};
use crate::signal::{self, Signal};

/// How long one dispatcher may take to restart: its own deadline for handing its connections
/// to the successor (`--restart-timeout`, 30 s by default) and a little more for the
/// successor to start and the old process to exit.
const DEADLINE: Duration = Duration::from_secs(40);
const MAX_DEADLINE_MS: u64 = 600_000;

/// `POST /restart`'s optional body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartRequest {
    /// How long each dispatcher may take (SIGUSR2 to its successor serving); 40 s by default.
    pub timeout_ms: Option<u64>,
}

impl RestartRequest {
    pub fn deadline(&self) -> Result<Duration, String> {
        match self.timeout_ms {
            None => Ok(DEADLINE),
            Some(0) => Err("timeout_ms must be positive".into()),
            Some(v) if v > MAX_DEADLINE_MS => {
                Err(format!("timeout_ms {v}: at most {MAX_DEADLINE_MS}"))
            }
            Some(v) => Ok(Duration::from_millis(v)),
        }
    }
}

/// What happened to one dispatcher.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DispatcherRestart {
    pub id: usize,
    pub old_pid: u32,
    /// The successor (absent when none was seen).
    pub new_pid: Option<u32>,
    /// Client connections the old process had when asked (`baton_dispatch_connections_active`).
    pub connections: Option<u64>,
    /// SIGUSR2 to the old process gone.
    pub gone_ms: u64,
    /// SIGUSR2 to the successor answering on the metrics socket, the old process gone.
    pub serving_ms: u64,
    /// How the old process ended, as the OS says (when it was ours to reap).
    pub exit: String,
    /// Connections the successor took over and lost, from its own counters
    /// (`baton_dispatch_restart_connections_total`; the old process's went with it).
    pub taken: Option<u64>,
    pub lost: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /restart`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestartReport {
    /// Every dispatcher was replaced and its successor serves.
    pub ok: bool,
    pub dispatchers: Vec<DispatcherRestart>,
    pub total_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One dispatcher as `baton up` knows it now.
#[derive(Debug, Clone)]
pub(crate) struct Dispatcher {
    /// The current process: the one the cluster started, or a successor.
    pub pid: u32,
    /// Its command line after argv[0] (`/proc/PID/cmdline`), the same for its successors.
    args: Vec<u8>,
    /// `pid` is a successor (watched by pid), not the cluster's child.
    pub followed: bool,
}

impl Dispatcher {
    pub(crate) fn of(p: &Proc) -> anyhow::Result<Dispatcher> {
        let pid = p.child.id();
        let args = args_of(pid)
            .ok_or_else(|| anyhow!("reading the dispatcher's command line (pid {pid})"))?;
        Ok(Dispatcher {
            pid,
            args,
            followed: false,
        })
    }
}

/// What a look at a dispatcher found.
#[derive(Debug)]
pub(crate) enum Seen {
    /// Dispatcher `i` (`old`) exited and `new` serves in its place.
    Restarted { i: usize, old: u32, new: u32 },
    /// Dispatcher `i` (`pid`) exited without a successor.
    Exited { i: usize, pid: u32, status: String },
}

/// The cluster's dispatcher `i` (0 is `cluster.dispatcher`).
pub(crate) fn proc_of(cluster: &mut Cluster, i: usize) -> &mut Proc {
    match i {
        0 => &mut cluster.dispatcher,
        _ => &mut cluster.more_dispatchers[i - 1],
    }
}

/// Makes this process the reaper of its orphaned descendants (a successor whose predecessor
/// exited), so that they stay visible as its children.
pub(crate) fn become_subreaper() {
    // (any pid sets the flag; None clears it)
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        tracing::warn!(
            error = %e,
            "not a child subreaper: a dispatcher restarted outside `POST /restart` may go unseen"
        );
    }
}

/// Whether `pid` still runs as dispatcher `d` (a reused pid has another command line).
fn runs_as(pid: u32, d: &Dispatcher) -> bool {
    alive(pid) && args_of(pid).as_deref() == Some(&d.args[..])
}

/// How dispatcher `i`'s current process ended, or `None` while it runs.
fn exit_of(cluster: &mut Cluster, i: usize, d: &Dispatcher) -> Option<String> {
    if d.followed {
        if runs_as(d.pid, d) {
            return None;
        }
        Some(reap(d.pid).unwrap_or_else(|| "gone".into()))
    } else {
        match proc_of(cluster, i).child.try_wait() {
            Ok(None) => None,
            Ok(Some(s)) => Some(s.to_string()),
            Err(e) => Some(format!("unknown ({e})")),
        }
    }
}

/// Dispatcher `i`'s stderr (its successors inherit it).
fn log_of(cluster: &Cluster, i: usize) -> PathBuf {
    cluster.dir.join(match i {
        0 => "dispatch.log".to_string(),
        _ => format!("dispatch{i}.log"),
    })
}

/// The `outcome` counts of `baton_dispatch_restart_connections_total` and the active
/// connections on a dispatcher's metrics page.
fn counters(metrics: std::net::SocketAddr) -> anyhow::Result<(u64, u64, u64)> {
    let page = baton_bench::scrape::page_blocking(metrics)?;
    let s = baton_bench::scrape::samples(&page);
    let name = "baton_dispatch_restart_connections_total";
    let n = |o: &str| baton_bench::scrape::sum(&s, name, &[("outcome", o)]) as u64;
    let active = baton_bench::scrape::sum(&s, "baton_dispatch_connections_active", &[]) as u64;
    Ok((n("taken"), n("lost"), active))
}

/// Looks at every dispatcher: one that exited with a successor is followed (the successor is
/// its process from now on), one without is reported.
pub(crate) fn check(cluster: &mut Cluster, ds: &mut [Dispatcher]) -> Vec<Seen> {
    let mut seen = Vec::new();
    for i in 0..ds.len() {
        let Some(status) = exit_of(cluster, i, &ds[i]) else {
            continue;
        };
        let old = ds[i].pid;
        let except: Vec<u32> = ds.iter().map(|d| d.pid).collect();
        let me = std::process::id();
        match find_successor(&ds[i].args, &[old, me], &except) {
            Some(new) => {
                ds[i].pid = new;
                ds[i].followed = true;
                seen.push(Seen::Restarted { i, old, new });
            }
            None => seen.push(Seen::Exited {
                i,
                pid: old,
                status,
            }),
        }
    }
    seen
}

/// Hot-restarts dispatcher `i` (of `ds`, the dispatchers as `baton up` follows them): SIGUSR2,
/// then until the old process is gone and its successor serves, at most `deadline`. `abort`
/// stops the wait early (the cluster is being stopped).
pub(crate) fn restart_one(
    cluster: &mut Cluster,
    ds: &Mutex<Vec<Dispatcher>>,
    i: usize,
    deadline: Duration,
    abort: &AtomicBool,
) -> DispatcherRestart {
    let began = Instant::now();
    let d = ds.lock().unwrap_or_else(|p| p.into_inner())[i].clone();
    let old = d.pid;
    let metrics = proc_of(cluster, i).addr("metrics");
    let mut r = DispatcherRestart {
        id: i,
        old_pid: old,
        new_pid: None,
        connections: None,
        gone_ms: 0,
        serving_ms: 0,
        exit: String::new(),
        taken: None,
        lost: None,
        error: None,
    };
    if let Some(status) = exit_of(cluster, i, &d) {
        r.error = Some(format!(
            "dispatcher {i} (pid {old}) is not running: {status}"
        ));
        return r;
    }
    r.connections = metrics.and_then(|m| counters(m).ok()).map(|c| c.2);
    // what the dispatcher logs from now on: a failed successor says so there
    let mut log = Tail::new(log_of(cluster, i));
    // (a pid that runs as this dispatcher: checked just above)
    signal::send(old, Signal::USR2);
    let until = began + deadline;
    let me = std::process::id();
    let mut successor = None;
    let mut gone = false;
    let result: anyhow::Result<()> = loop {
        let except: Vec<u32> = ds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|d| d.pid)
            .collect();
        if successor.is_none() {
            successor = find_successor(&d.args, &[old, me], &except);
        }
        if !gone {
            if let Some(status) = exit_of(cluster, i, &d) {
                gone = true;
                r.gone_ms = began.elapsed().as_millis() as u64;
                r.exit = status;
                // orphaned by the exit: a child of this process now
                if successor.is_none() {
                    successor = find_successor(&d.args, &[old, me], &except);
                }
                let Some(new) = successor else {
                    break Err(anyhow!(
                        "dispatcher {i} (pid {old}) exited ({}) without a successor",
                        r.exit
                    ));
                };
                let mut ds = ds.lock().unwrap_or_else(|p| p.into_inner());
                ds[i].pid = new;
                ds[i].followed = true;
            }
        }
        r.new_pid = successor;
        match (gone, successor) {
            (true, Some(new)) => {
                if !runs_as(new, &d) {
                    break Err(anyhow!(
                        "dispatcher {i}'s successor (pid {new}) exited after pid {old} did"
                    ));
                }
                let serving = match metrics {
                    Some(m) => baton_bench::scrape::page_blocking(m).is_ok(),
                    None => true,
                };
                if serving {
                    r.serving_ms = began.elapsed().as_millis() as u64;
                    break Ok(());
                }
            }
            (false, Some(new)) if !alive(new) => {
                break Err(anyhow!(
                    "dispatcher {i}'s successor (pid {new}) exited before it took over; pid {old} serves on{}",
                    log.failure().map(|l| format!(": {l}")).unwrap_or_default()
                ));
            }
            (false, _) => {
                if let Some(line) = log.failure() {
                    break Err(anyhow!("dispatcher {i} (pid {old}): {line}"));
                }
            }
            (true, None) => unreachable!("a dispatcher gone without a successor breaks above"),
        }
        if Instant::now() >= until {
            break Err(match gone {
                true => anyhow!(
                    "dispatcher {i}'s successor (pid {}) did not serve its metrics within {deadline:?}",
                    successor.unwrap_or(0)
                ),
                false => anyhow!(
                    "dispatcher {i} (pid {old}) was not replaced within {deadline:?}; it serves on"
                ),
            });
        }
        if abort.load(Ordering::Relaxed) {
            break Err(anyhow!("stopped: the cluster is shutting down"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if let Err(e) = result {
        r.error = Some(format!("{e:#}"));
        return r;
    }
    // the successor counts a connection once it is re-attached: until the counts settle
    if let Some(m) = metrics {
        let settle = Instant::now() + Duration::from_secs(1);
        let mut last = None;
        while Instant::now() < settle {
            let Ok((taken, lost, _)) = counters(m) else {
                break;
            };
            if last == Some((taken, lost)) {
                break;
            }
            last = Some((taken, lost));
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some((taken, lost)) = last {
            r.taken = Some(taken);
            r.lost = Some(lost);
        }
    }
    r
}

/// Stops the processes of `ds` that are not the cluster's children: successors followed, and
/// any on their way (a restart under way as the cluster stops). SIGTERM now, and `finish`
/// (after the cluster's own stop) waits and kills what is left.
pub(crate) fn stop_successors(ds: &[Dispatcher]) -> Successors {
    let pids = successors_of(ds);
    for pid in &pids {
        // (a pid just seen running with a dispatcher's command line)
        signal::send(*pid, Signal::TERM);
    }
    Successors {
        pids,
        ds: ds.to_vec(),
    }
}

/// Processes that run as one of `ds` beyond the cluster's children: the followed ones, and
/// children of any of them (or orphans of this process) with a dispatcher's command line.
fn successors_of(ds: &[Dispatcher]) -> Vec<u32> {
    let mut pids: Vec<u32> = ds
        .iter()
        .filter(|d| d.followed && runs_as(d.pid, d))
        .map(|d| d.pid)
        .collect();
    let mut parents: Vec<u32> = ds.iter().map(|d| d.pid).collect();
    parents.push(std::process::id());
    for d in ds {
        // a successor's successor too, until there is none
        loop {
            let mut except: Vec<u32> = ds.iter().filter(|d| !d.followed).map(|d| d.pid).collect();
            except.extend(&pids);
            match find_successor(&d.args, &parents, &except) {
                Some(pid) => {
                    pids.push(pid);
                    parents.push(pid);
                }
                None => break,
            }
        }
    }
    pids
}

/// The successors [`stop_successors`] asked to stop.
pub(crate) struct Successors {
    pids: Vec<u32>,
    ds: Vec<Dispatcher>,
}

impl Successors {
    /// Waits until `deadline` for them to exit, kills what is left (and any successor that
    /// appeared meanwhile), and reaps them.
    pub(crate) fn finish(mut self, deadline: Instant) {
        let running = |pids: &[u32]| pids.iter().any(|p| alive(*p));
        while running(&self.pids) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // the cluster's dispatchers are gone now: whatever runs as one of them is left over
        for pid in successors_of(&self.ds) {
            if !self.pids.contains(&pid) {
                self.pids.push(pid);
            }
        }
        for pid in &self.pids {
            if alive(*pid) && self.ds.iter().any(|d| runs_as(*pid, d)) {
                signal::send(*pid, Signal::KILL);
            }
        }
        let until = Instant::now() + Duration::from_secs(2);
        for pid in &self.pids {
            while reap(*pid).is_none() && alive(*pid) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// New lines of a log file since it was opened here.
struct Tail {
    path: PathBuf,
    offset: u64,
}

impl Tail {
    fn new(path: PathBuf) -> Tail {
        let offset = std::fs::metadata(&path).map_or(0, |m| m.len());
        Tail { path, offset }
    }

    /// The dispatcher's line that its successor failed and it serves on, if written since.
    fn failure(&mut self) -> Option<String> {
        let mut f = std::fs::File::open(&self.path).ok()?;
        f.seek(std::io::SeekFrom::Start(self.offset)).ok()?;
        let mut new = Vec::new();
        // bounded: a log that grows fast is read a little at a time
        f.take(1 << 20).read_to_end(&mut new).ok()?;
        // whole lines only: the rest is read again next time
        let end = new.iter().rposition(|b| *b == b'\n').map_or(0, |n| n + 1);
        self.offset += end as u64;
        // its own line, else the log record (whichever format the log has)
        let text = String::from_utf8_lossy(&new[..end]);
        let mut lines = text
            .lines()
            .filter(|l| l.contains("handover failed; serving on"));
        let first = lines.next()?;
        let plain = std::iter::once(first)
            .chain(lines)
            .find(|l| l.starts_with("handover failed"));
        Some(plain.unwrap_or(first).trim().to_string())
    }
}

/// `baton rollout --restart`: asks `baton up --admin` for a hot restart of every dispatcher and
/// prints the summary; an error when one was not replaced.
pub(crate) fn restart_cli(
    admin: std::net::SocketAddr,
    token: &baton_ops::guard::Token,
    timeout_ms: Option<u64>,
    as_json: bool,
) -> anyhow::Result<()> {
    let body = serde_json::json!({ "timeout_ms": timeout_ms });
    let (status, answer) = http(
        admin,
        token,
        "POST",
        "/restart",
        &body.to_string(),
        Duration::from_secs(3600),
    )?;
    let report: RestartReport = match serde_json::from_str(&answer) {
        Ok(r) => r,
        Err(_) => bail!("baton up at {admin} answered {status}: {}", answer.trim()),
    };
    if as_json {
        println!("{answer}");
    } else {
        print!("{}", table(&report));
    }
    if !report.ok {
        bail!(
            "hot restart stopped: {}",
            report.error.as_deref().unwrap_or("see above")
        );
    }
    Ok(())
}

/// The summary a person reads.
pub fn table(r: &RestartReport) -> String {
    use std::fmt::Write as _;
    let opt = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:>10} {:>9} {:>9} {:>6} {:>8} {:>10} {:>6} {:>5}  exit",
        "dispatcher", "old pid", "new pid", "conns", "gone ms", "serving ms", "taken", "lost"
    );
    for d in &r.dispatchers {
        let _ = writeln!(
            o,
            "{:>10} {:>9} {:>9} {:>6} {:>8} {:>10} {:>6} {:>5}  {}",
            d.id,
            d.old_pid,
            opt(d.new_pid.map(u64::from)),
            opt(d.connections),
            d.gone_ms,
            d.serving_ms,
            opt(d.taken),
            opt(d.lost),
            d.exit
        );
        if let Some(e) = &d.error {
            let _ = writeln!(o, "           error: {e}");
        }
    }
    let _ = writeln!(
        o,
        "{} in {:.1} s",
        if r.ok {
            format!("{} dispatchers restarted", r.dispatchers.len())
        } else {
            "hot restart stopped".into()
        },
        r.total_ms as f64 / 1000.0
    );
    o
}

/// The dispatchers' command lines at start (each must be readable).
pub(crate) fn dispatchers_of(cluster: &Cluster) -> anyhow::Result<Vec<Dispatcher>> {
    std::iter::once(&cluster.dispatcher)
        .chain(&cluster.more_dispatchers)
        .map(Dispatcher::of)
        .collect::<anyhow::Result<Vec<_>>>()
        .context("watching the dispatchers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bodies_are_checked() {
        assert_eq!(RestartRequest::default().deadline().unwrap(), DEADLINE);
        let r: RestartRequest = serde_json::from_str(r#"{"timeout_ms": 5000}"#).unwrap();
        assert_eq!(r.deadline().unwrap(), Duration::from_secs(5));
        assert!(serde_json::from_str::<RestartRequest>(r#"{"timeout": 1}"#).is_err());
        let zero = RestartRequest {
            timeout_ms: Some(0),
        };
        assert!(zero.deadline().is_err());
        let long = RestartRequest {
            timeout_ms: Some(MAX_DEADLINE_MS + 1),
        };
        assert!(long.deadline().is_err());
    }
}
