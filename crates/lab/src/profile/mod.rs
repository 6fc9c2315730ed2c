//! An independent check of the agent's crypto accounting: `perf` samples the agent during a
//! load run, and the share of its samples inside metered calls is set beside crypto's share
//! of its CPU as the agent meters it (`baton_crypto_seconds_total` over `/proc/PID/stat` CPU
//! time). A second, narrower view counts the samples whose leaf symbol is crypto code.
//!
//! How: `perf record -e cpu-clock -F FREQ --call-graph dwarf -p PID` (the software clock
//! event needs no PMU, so it works in VMs where `cycles` is "not supported"; the release
//! profile has no frame pointers, so call chains are unwound from a copy of the stack with
//! the binary's `.eh_frame`), then `perf script -F tid,ip,sym,dso --no-inline`. A sample is
//! inside a metered call when its chain holds one of the metering wrappers
//! (`baton_agent::metering::Metered*`, the ticketer); its leaf symbol says whether it is
//! crypto code ([`classify`]). `script`, `classify` and `compare` are sans-IO; this file is
//! the shell that runs perf and reads `/proc` and the metrics page.
//!
//! What separates the two accounts (measured in README "Crypto accounting"):
//! - Sampling: perf's share of N samples has a standard error of sqrt(p(1-p)/N), about one
//!   point at 2,500 samples.
//! - Preemption: the short ops (hash, records, tickets) are timed on the monotonic clock, so a
//!   call preempted by another thread counts up to `PREEMPTED_AFTER` (50 us) of someone
//!   else's time; perf's samples are the agent's own.
//! - Clock reads: the thread CPU clock's calibrated cost is subtracted from sign/verify/kx,
//!   its variance is not; the monotonic reads (~30 ns) around short calls are counted.
//! - Unwinding: a chain that stops early (a frame without unwind info) hides a metered call,
//!   which lowers perf's share; the table shows how many chains reached the thread's start.
//! - perf's own sampling work (copying 16 KB of stack per sample) is CPU of the agent in
//!   `/proc`, not in perf's samples: about one point at 999 Hz.
//!
//! The leaf view is lower than both by design: inside a metered call the record is copied
//! into its output buffer (memmove), allocated (malloc), wrapped (aws-lc-rs, EVP plumbing),
//! and the many small transcript-hash and HKDF calls are mostly such overhead; outside any
//! call the random generator fills rustls' randoms. Leaf classification also cannot tell
//! ECDSA's P-256 point arithmetic from P-256 ECDHE's ([`Attribution`]).

pub mod classify;
pub mod compare;
pub mod script;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use baton_cluster::signal::Signal;

pub use classify::{classify, Attribution, Family, OpGroup, Profile};
pub use compare::{crypto_seconds, Comparison, Snapshot, WAITING_OPS};

/// The systematic part of how far apart (percentage points of the agent's CPU) the metered
/// crypto share and perf's share of samples inside metered calls may be for the accounting
/// to be called right: the largest difference measured on this project's 2-core VM (5.0
/// points over 14 runs: ECDSA P-256 and RSA 2048, TLS 1.2 and 1.3, full and resumed
/// handshakes, 50 KB bodies, debug and release agents, load average 10). README "Crypto
/// accounting" has the measurements. [`margin_points`] adds the sampling error of a run.
pub const SYSTEMATIC_POINTS: f64 = 5.0;

/// The bound for one run: [`SYSTEMATIC_POINTS`] plus three standard errors of perf's sampled
/// share (`share` of `samples`). A fixed 8 points (5 + ~1.5 standard errors at 500 samples)
/// failed about one quick lab run in twenty on sampling noise alone (8.3 points at ~600
/// samples); three standard errors make that about one in a thousand, and a wrong
/// accounting (dropping the hash metering moves TLS 1.3 by 10 to 17 points) still shows at
/// the sample counts the tests require.
pub fn margin_points(samples: u64, share: f64) -> f64 {
    let n = samples.max(1) as f64;
    let p = share.clamp(0.0, 1.0);
    SYSTEMATIC_POINTS + 3.0 * 100.0 * (p * (1.0 - p) / n).sqrt()
}

/// The perf binary (Debian `linux-perf`).
pub const PERF: &str = "perf";

/// Whether perf can sample a process here, and if not why (no binary, no permission, no
/// perf_event support in this kernel or container).
pub fn check_perf(scratch: &Path) -> anyhow::Result<()> {
    let data = scratch.join("perf-probe.data");
    let out = Command::new(PERF)
        .args(["record", "-e", "cpu-clock", "-F", "99", "-q", "-o"])
        .arg(&data)
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run `{PERF}` (Debian package linux-perf)"))?;
    let _ = std::fs::remove_file(&data);
    if !out.status.success() {
        bail!(
            "`perf record -e cpu-clock` cannot open events here (perf_event_paranoid, seccomp \
             or a container without perf_event_open): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A `perf record` attached to one process.
pub struct Recording {
    child: Child,
    data: PathBuf,
    log: PathBuf,
}

impl Recording {
    /// Starts sampling `pid` at `freq` Hz into `data` (perf's messages go to `data.log`).
    pub fn start(pid: u32, freq: u32, data: &Path) -> anyhow::Result<Recording> {
        let log = data.with_extension("log");
        let child = Command::new(PERF)
            .args(["record", "-e", "cpu-clock", "-F", &freq.to_string()])
            // 16 KB of stack per sample reaches from aws-lc's leaf frames to the metering
            // wrappers and beyond
            .args(["--call-graph", "dwarf,16384", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("cannot run `{PERF}` (Debian package linux-perf)"))?;
        let mut rec = Recording {
            child,
            data: data.to_path_buf(),
            log,
        };
        // perf says nothing when it is attached; give it the time to open its events, and
        // notice if it gave up instead.
        std::thread::sleep(Duration::from_millis(500));
        if let Some(status) = rec.child.try_wait()? {
            bail!("perf record exited at once ({status}): {}", rec.messages());
        }
        Ok(rec)
    }

    /// Stops sampling (SIGINT, as ^C: perf then writes its data) and reads the samples.
    pub fn stop(mut self) -> anyhow::Result<Profile> {
        baton_cluster::signal::send(self.child.id(), Signal::INT);
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("perf record did not stop within 30s of SIGINT");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // perf record exits with the signal's status after writing its data
        if !status.success() && status.code().is_some() {
            bail!("perf record failed ({status}): {}", self.messages());
        }
        Profile::from_script(&script_text(&self.data)?)
    }

    fn messages(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .trim()
            .to_string()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `perf script` of a recording: every sample's call chain, leaf first.
pub fn script_text(data: &Path) -> anyhow::Result<String> {
    let out = Command::new(PERF)
        .args(["script", "-F", "tid,ip,sym,dso", "--no-inline", "-i"])
        .arg(data)
        .stdin(Stdio::null())
        .output()
        .context("perf script")?;
    if !out.status.success() {
        bail!(
            "perf script failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // symbols are bytes from the binary; a stray non-UTF-8 one must not lose the run
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The agent's crypto seconds (from its metrics page) and CPU seconds (from `/proc`), now.
pub fn snapshot(pid: u32, metrics: SocketAddr) -> anyhow::Result<Snapshot> {
    let cpu_seconds = process_cpu_seconds(pid)?;
    let page = metrics_page(metrics)?;
    Ok(Snapshot {
        crypto: crypto_seconds(&page),
        cpu_seconds,
    })
}

pub fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    baton_ops::process::cpu_seconds_of(pid).with_context(|| format!("process {pid}: gone"))
}

/// `GET /metrics` over plain HTTP/1.0.
pub fn metrics_page(addr: SocketAddr) -> anyhow::Result<String> {
    baton_bench::scrape::page_blocking(addr)
}
