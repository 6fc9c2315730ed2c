//! Runs the virtual clients: closed loop (each starts its next transaction when the last one
//! ends) or open loop at `--rate` (each transaction has a due time; latency counts from it, so
//! a slow server cannot hide its queueing — wrk2's correction for coordinated omission).
//!
//! One thread per worker, each with a single-threaded runtime of its own, the clients dealt
//! among them (as h2load's `-t` deals its clients): a connection never moves between threads
//! and no wake-up crosses one, so the client pays per connection for no work stealing, no
//! cross-thread wake-ups and no shared timer wheel.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::time::Instant;

use crate::accounting::{global_index, share};
use crate::config::BenchConfig;
use crate::engine::TlsEngine;
use crate::live::Live;
use crate::scenario::Mix;
use crate::stats::Stats;
use crate::transaction::{request_bytes, Client, READ_BUF};

/// The merged result and how long the run took.
pub struct Outcome {
    pub stats: Stats,
    pub elapsed: Duration,
}

/// What every virtual client of a run shares.
struct Shared {
    cfg: Arc<BenchConfig>,
    mix: Option<Arc<Mix>>,
    /// The progress bar, when it counts connections.
    bar: Option<ProgressBar>,
    stop: Arc<AtomicBool>,
    start: Instant,
    deadline: Option<Instant>,
    clients: u64,
}

/// `live`: the `--metrics` counters, updated as transactions end.
pub async fn run(
    cfg: Arc<BenchConfig>,
    progress: bool,
    live: Option<Arc<Live>>,
) -> anyhow::Result<Outcome> {
    // what the TLS engine refuses is in the flags (suites, groups, CA files)
    let tls = TlsEngine::new(&cfg).map_err(baton_ops::exit::invalid)?;
    let addr = tokio::net::lookup_host((cfg.host.as_str(), cfg.port))
        .await
        .with_context(|| format!("resolving {}", cfg.host))?
        .next()
        .with_context(|| format!("{} has no address", cfg.host))?;
    let request = request_bytes(&cfg);
    let mix = cfg.mix().map_err(baton_ops::exit::invalid)?.map(Arc::new);
    let bar = progress.then(|| {
        let bar = match cfg.connections {
            Some(n) => ProgressBar::new(n),
            None => ProgressBar::new((cfg.duration_s.unwrap_or(0.0) * 10.0) as u64),
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {elapsed_precise} [{bar:40}] {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    let start = Instant::now();
    let deadline = cfg.duration_s.map(|d| start + Duration::from_secs_f64(d));
    let stop = Arc::new(AtomicBool::new(false));
    let clients = cfg.clients as u64;
    let threads = (cfg.workers as u64).clamp(1, clients.max(1));
    let mut dealt: Vec<Vec<(u64, Client)>> = (0..threads).map(|_| Vec::new()).collect();
    for c in 0..clients {
        let client = Client {
            cfg: cfg.clone(),
            tls: tls.client(),
            addr,
            source: (!cfg.source_ips.is_empty())
                .then(|| cfg.source_ips[c as usize % cfg.source_ips.len()]),
            request: request.clone(),
            buf: vec![0; READ_BUF].into_boxed_slice(),
            start,
            script: None,
            thought: Duration::ZERO,
            live: live.clone(),
        };
        dealt[(c % threads) as usize].push((c, client));
    }
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        mix,
        bar: bar.clone().filter(|_| cfg.connections.is_some()),
        stop: stop.clone(),
        start,
        deadline,
        clients,
    });
    let mut done = Vec::new();
    for (w, mine) in dealt.into_iter().enumerate() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("bench-{w}"))
            .spawn(move || {
                let _ = tx.send(worker(&shared, mine));
            })
            .context("starting a client thread")?;
        done.push(rx);
    }
    if let (Some(d), Some(b)) = (deadline, bar.clone()) {
        // duration runs: the bar shows time
        let stop = stop.clone();
        tokio::spawn(async move {
            while Instant::now() < d && !stop.load(Ordering::Relaxed) {
                b.set_position(((Instant::now() - start).as_secs_f64() * 10.0) as u64);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
    let mut stats = Stats::default();
    let mut failed = None;
    for rx in done {
        // every thread is waited for, even after one failed: none outlives the run
        match rx.await.context("a client thread died") {
            Ok(Ok(s)) => stats.merge(&s),
            Ok(Err(e)) | Err(e) => failed = failed.or(Some(e)),
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(e) = failed {
        return Err(e);
    }
    let elapsed = start.elapsed();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(Outcome { stats, elapsed })
}

/// One worker thread: its clients on a runtime of its own, until each is done, all recording
/// into the worker's one [`Stats`] (a latency histogram is tens of kilobytes: one set per
/// client would cost a large run hundreds of megabytes, and the client CPU to zero them).
fn worker(shared: &Arc<Shared>, clients: Vec<(u64, Client)>) -> anyhow::Result<Stats> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("a client thread's runtime")?;
    let stats = Rc::new(RefCell::new(Stats::default()));
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|(c, client)| {
                tokio::task::spawn_local(virtual_client(shared.clone(), c, client, stats.clone()))
            })
            .collect();
        for t in tasks {
            t.await.context("virtual client panicked")?;
        }
        anyhow::Ok(())
    })?;
    let stats = Rc::try_unwrap(stats)
        .map_err(|_| anyhow::anyhow!("a virtual client outlived its worker"))?;
    Ok(stats.into_inner())
}

/// Virtual client `c`: its transactions, one after the other, until its share is done, the
/// run's time is up or the run stops.
async fn virtual_client(
    shared: Arc<Shared>,
    c: u64,
    mut client: Client,
    stats: Rc<RefCell<Stats>>,
) {
    let Shared {
        cfg,
        mix,
        bar,
        stop,
        start,
        deadline,
        clients,
    } = &*shared;
    let (start, deadline, clients) = (*start, *deadline, *clients);
    let my_share = cfg
        .connections
        .map(|n| share(n, clients, cfg.full_every, c));
    let mut m = 0u64;
    loop {
        if my_share.is_some_and(|s| m >= s) || stop.load(Ordering::Relaxed) {
            break;
        }
        let i = global_index(clients, cfg.full_every, c, m);
        // --scenario: this connection's scenario; its first think time comes before the
        // connection (closed loop: before the clock starts; open loop: added to the due time)
        let think0 = match mix {
            Some(mix) => {
                let steps = mix.pick(i);
                let t = steps[0].think;
                client.script = Some(steps);
                t
            }
            None => Duration::ZERO,
        };
        let due = match cfg.rate {
            Some(r) => start + Duration::from_secs_f64(i as f64 / r) + think0,
            None if think0.is_zero() => Instant::now(),
            None => {
                if deadline.is_some_and(|d| Instant::now() + think0 >= d) {
                    break;
                }
                tokio::time::sleep(think0).await;
                Instant::now()
            }
        };
        // before sleeping: a client whose next turn falls after the end must not hold the run
        // open until then (at a low rate with many clients, many seconds)
        if deadline.is_some_and(|d| due >= d) {
            break;
        }
        if cfg.rate.is_some() {
            tokio::time::sleep_until(due).await;
        }
        if m.is_multiple_of(cfg.full_every) {
            client.tls.forget();
        }
        client.transaction(due, &stats).await;
        m += 1;
        if let Some(b) = bar {
            b.inc(1);
        }
    }
}
