//! `baton lab EXPERIMENT`: one file per experiment of the source documents (docs/references.md). Each experiment is a
//! function `fn(&Lab) -> anyhow::Result<Table>` listed in [`EXPERIMENTS`]; it starts its systems
//! under test with the rig (`crate::rig::Sut`), measures them with `Lab::run`, and returns a
//! table whose rows put the paper's figure beside ours. This module owns what every experiment
//! shares: the command line, the work directory, printing, JSON and the HTML report.
//!
//! To add one: write `experiments/NAME.rs` with `pub fn run(lab: &Lab) -> anyhow::Result<Table>`
//! (honour `lab.quick`: about a minute, same shape), add it to [`EXPERIMENTS`], and a variant to
//! [`Experiment`].

mod auth_modes;
mod crypto_share;
mod dispatcher_failover;
mod homes;
mod key_sizes;
mod policies;
mod report;
mod resumption;
mod scenario_a;
mod scenario_b;
mod ssl_tps;
mod suites;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::rig::cap::CapMode;
use crate::rig::Lab;
use crate::table::Table;

/// `baton lab`: reproduce the source documents' experiments on this machine.
#[derive(clap::Args, Debug)]
pub struct LabArgs {
    #[command(subcommand)]
    pub experiment: Experiment,
    /// Small runs (about a minute each) with the same shape: for CI and a first look.
    #[arg(long, global = true)]
    pub quick: bool,
    /// Write every table as JSON to this file.
    #[arg(long, global = true, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write one self-contained HTML report (tables and charts) to this file.
    #[arg(long, global = true, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Round-trip time added between clients and servers by the lab's delay proxy
    /// (the CSSL paper used 30 ms). Default: 30ms, or 0 with --quick; `0` or `off` for none.
    #[arg(long, global = true, value_name = "DURATION")]
    pub rtt: Option<String>,
    /// CPU cap of each server, percent of one core (cgroup v1; falls back to one core each
    /// with taskset when cgroups are not writable).
    #[arg(long, global = true, default_value_t = 20, value_name = "PERCENT")]
    pub quota: u32,
    /// Server key type of Scenarios A and B (`rsa-2048`, `ecdsa-p256`, ...). Default: RSA 2048,
    /// the paper's kind (its 1,024 bits are refused by rustls).
    #[arg(long, global = true, value_name = "TYPE")]
    pub key_type: Option<baton_cluster::pki::KeyKind>,
    /// The old name of --key-type (`--key` names a PEM file everywhere else).
    #[arg(
        long = "key",
        global = true,
        hide = true,
        value_name = "TYPE",
        conflicts_with = "key_type"
    )]
    pub old_key: Option<baton_cluster::pki::KeyKind>,
    /// Scenario A and B across hosts: the Baton clusters' dispatcher, each agent and each
    /// client host in a network namespace of its own (root only), beside the same clusters on
    /// loopback, for the dispatcher's CPU per connection over veth vs loopback.
    #[arg(long, global = true)]
    pub hosts: bool,
    /// Work directory (configs, certificates, logs); kept afterwards. Default: a temporary
    /// directory, removed at the end.
    #[arg(long, global = true, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Experiment {
    /// The CSSL paper, Table 2: client affinity (LB-IP, TLS proxy, CSSL-SF with and without migration).
    ScenarioA,
    /// The CSSL paper, Table 3: no affinity (LB-RR, TLS proxy, CSSL-SL with and without sharing).
    ScenarioB,
    /// The SSL benchmark tool paper, experiment A: server vs mutual authentication, 1 vs 2 servers.
    AuthModes,
    /// The SSL benchmark tool paper, experiment B: 2/3 resumed vs none.
    Resumption,
    /// The 2048-bit migration report: SSL TPS by key size (RSA 1024-4096, ECDSA P-256/P-384) and response size.
    KeySizes,
    /// The ATS cipher-suite post: ECDHE-ECDSA vs ECDHE-RSA vs RSA key exchange, X25519 vs P-256.
    Suites,
    /// The crypto offload paper: crypto's share of the agent's CPU by op (metering beside perf), full vs
    /// resumed, key in the agent vs in `baton signer`.
    CryptoShare,
    /// Clients whose home changes when one agent of 3, 5 or 8 joins or leaves
    /// (rendezvous hashing beside `hash % N`), and the spread of homes. Computed, no processes.
    Homes,
    /// Two dispatchers with the same agents behind HAProxy, one SIGKILLed under
    /// open-loop load: requests lost with it, failures after (goal 0), resumption before and
    /// after, and whether homes stayed (the dispatchers' own routing counters).
    DispatcherFailover,
    /// Every experiment, one after another, into one report.
    All,
    /// The chaos soak (not part of `all`): load through a handoff cluster with Redis and
    /// through HAProxy in front of peer-sharing agents while agents, Redis and the dispatcher
    /// are killed, stopped and restarted on a seeded schedule and every listener is attacked;
    /// fails on any failure not explained by a fault on its path, growth, or a panic.
    Soak(crate::soak::SoakArgs),
}

type Run = fn(&Lab) -> anyhow::Result<Table>;

/// Every experiment, in the order `all` runs them.
pub const EXPERIMENTS: &[(Experiment, &str, Run)] = &[
    (Experiment::ScenarioA, "scenario-a", scenario_a::run),
    (Experiment::ScenarioB, "scenario-b", scenario_b::run),
    (Experiment::AuthModes, "auth-modes", auth_modes::run),
    (Experiment::Resumption, "resumption", resumption::run),
    (Experiment::KeySizes, "key-sizes", key_sizes::run),
    (Experiment::Suites, "suites", suites::run),
    (Experiment::CryptoShare, "crypto-share", crypto_share::run),
    (Experiment::Homes, "homes", homes::run),
    (
        Experiment::DispatcherFailover,
        "dispatcher-failover",
        dispatcher_failover::run,
    ),
];

pub fn lab(args: LabArgs) -> anyhow::Result<()> {
    let baton = std::env::current_exe().context("locating the baton binary")?;
    let owns_dir = args.dir.is_none();
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("baton-lab-{}", std::process::id())));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let rtt = match args.rtt.as_deref() {
        // a full-size run without added RTT (--hosts on a kernel without netem)
        Some("0" | "off" | "none") => None,
        Some(s) => Some(baton_bench::parse_duration(s)?).filter(|d| !d.is_zero()),
        None if args.quick => None,
        None => Some(Duration::from_millis(30)),
    };
    let cap = if args.quota == 0 {
        CapMode::None
    } else {
        CapMode::detect()
    };
    let lab = Lab {
        baton,
        dir: dir.clone(),
        quick: args.quick,
        rtt,
        quota: args.quota,
        cap,
        key: args.key_type.or_else(|| {
            args.old_key.inspect(|_| {
                eprintln!(
                    "baton lab: --key is now --key-type (the old name goes in the next release)"
                )
            })
        }),
        hosts: args.hosts,
        across: None,
    };
    raise_fd_limit();
    let hosts_apply = matches!(
        args.experiment,
        Experiment::ScenarioA | Experiment::ScenarioB | Experiment::All
    );
    if args.hosts && hosts_apply {
        // says so and stops without the privileges, before waiting for the lab lock or
        // running any loopback row (creates a bridge and removes it again)
        drop(baton_cluster::hosts::Hosts::create()?);
    }
    let _machine = machine_lock()?;
    println!(
        "baton lab: {} CPUs, servers capped at {} ({:?}), RTT {}, {}",
        crate::rig::cap::available_cores(),
        if cap == CapMode::None {
            "nothing".to_string()
        } else {
            format!("{}% of a core each", args.quota)
        },
        cap,
        rtt.map_or("none".into(), |d| format!("{} ms", d.as_millis())),
        if args.quick {
            "quick runs"
        } else {
            "full runs"
        }
    );
    if cap == CapMode::Taskset {
        println!("  cgroups are not writable here: each server is pinned to one core instead (a weaker cap)");
    }
    let mut tables = Vec::new();
    let result = (|| {
        if let Experiment::Soak(soak) = args.experiment {
            println!("\n== soak");
            let soak = crate::soak::run(&lab, soak).context("soak")?;
            let mut failed = Vec::new();
            for table in soak {
                print!("{}", table.render());
                failed.extend(table.failed.iter().cloned());
                tables.push(table);
            }
            if !failed.is_empty() {
                anyhow::bail!("soak: {}", failed.join("; "));
            }
            println!("\nsoak: passed");
        }
        for (e, name, run) in EXPERIMENTS {
            if args.experiment != Experiment::All && args.experiment != *e {
                continue;
            }
            println!("\n== {name}");
            let table = run(&lab).with_context(|| format!("experiment {name}"))?;
            print!("{}", table.render());
            let failed = table.failed.clone();
            tables.push(table);
            if !failed.is_empty() {
                anyhow::bail!("experiment {name}: {}", failed.join("; "));
            }
        }
        anyhow::Ok(())
    })();
    if let Some(path) = &args.json {
        let json = serde_json::json!({ "lab": {
            "quick": lab.quick, "rtt_ms": rtt.map(|d| d.as_secs_f64() * 1e3),
            "quota_percent": lab.quota, "cap": cap, "cpus": crate::rig::cap::available_cores(),
        }, "experiments": tables });
        std::fs::write(path, serde_json::to_vec_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.report {
        std::fs::write(path, report::render(&tables, &lab))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nreport: {}", path.display());
    }
    if owns_dir && result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else if result.is_err() {
        eprintln!("baton lab: logs and configs kept in {}", dir.display());
    }
    result
}

/// One lab at a time on a machine: each run sizes its CPU caps so that its servers, balancer
/// and client fit the cores, and a second run alongside would take that room and skew both
/// (a quick Scenario A beside a Scenario B once put the handoff agents' handshakes 11% apart).
/// A second `baton lab` waits for the first; the lock goes with the process, however it ends.
fn machine_lock() -> anyhow::Result<std::fs::File> {
    let path = std::env::temp_dir().join("baton-lab.lock");
    lock_exclusive(&path, || {
        println!(
            "baton lab: another lab is running on this machine ({}); waiting for it",
            path.display()
        )
    })
}

/// An exclusive `flock` on `path`, calling `waiting` first if someone else holds it.
fn lock_exclusive(path: &std::path::Path, waiting: impl FnOnce()) -> anyhow::Result<std::fs::File> {
    // another user's lock file can still be locked through a read-only descriptor
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .or_else(|_| std::fs::File::open(path))
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => return Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => waiting(),
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
    file.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

/// Thousands of connections in flight: lift the soft descriptor limit to the hard one (our
/// children, nginx and HAProxy, inherit it).
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    // (None is unlimited)
    let value = |v: Option<u64>| v.unwrap_or(u64::MAX);
    if value(r.current) < value(r.maximum) {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: r.maximum,
                maximum: r.maximum,
            },
        );
    }
}

/// The client "hosts" of an experiment: loopback addresses 127.0.0.2, .3, ...
pub fn hosts(n: u8) -> Vec<std::net::IpAddr> {
    (0..n)
        .map(|i| std::net::IpAddr::from([127, 0, 0, 2 + i]))
        .collect()
}

/// Standard notes about how far to trust a run: caps, client headroom, bottleneck.
pub fn run_notes<'a, N: AsRef<str> + 'a>(
    t: &mut Table,
    lab: &Lab,
    runs: impl IntoIterator<Item = (N, &'a crate::rig::Run)>,
) {
    let runs: Vec<(N, &crate::rig::Run)> = runs.into_iter().collect();
    let client = runs
        .iter()
        .map(|(_, r)| r.client_cores())
        .fold(0.0f64, f64::max);
    t.note(format!(
        "client (bench + delay proxy) used at most {client:.2} of {} cores",
        crate::rig::cap::available_cores()
    ));
    let unbound: Vec<&str> = runs
        .iter()
        .filter(|(_, r)| r.servers_bound() == Some(false))
        .map(|(n, _)| n.as_ref())
        .collect();
    if lab.cap == CapMode::Cgroup && !unbound.is_empty() {
        t.note(format!(
            "not every server reached its CPU cap in: {} (there the client, RTT or the balancer limited TPS)",
            unbound.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_second_lab_waits_for_the_first() {
        let dir = std::env::temp_dir().join(format!("baton-lab-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lab.lock");
        let first = super::lock_exclusive(&path, || panic!("nobody holds it yet")).unwrap();
        let waited = Arc::new(AtomicBool::new(false));
        let second = std::thread::spawn({
            let (path, waited) = (path.clone(), waited.clone());
            move || {
                let _lock =
                    super::lock_exclusive(&path, || waited.store(true, Ordering::SeqCst)).unwrap();
            }
        });
        // the second one is told to wait, and blocks until the first lets go
        while !waited.load(Ordering::SeqCst) && !second.is_finished() {
            std::thread::yield_now();
        }
        assert!(
            waited.load(Ordering::SeqCst),
            "the second lab was not told to wait"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!second.is_finished(), "the second lab did not wait");
        drop(first);
        second.join().unwrap();
        let _again = super::lock_exclusive(&path, || panic!("released with its process")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
