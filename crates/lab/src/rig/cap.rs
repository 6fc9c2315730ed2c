//! CPU caps for the servers under test, so that N "machines" and the client share two cores
//! without the client ever being the bottleneck.
//!
//! The first choice is a cgroup (v1 `cpu` controller: `cfs_quota_us` out of `cfs_period_us`),
//! with a sibling group in the `cpuacct` hierarchy to count the CPU-seconds of every process and
//! thread of the server (nginx's master and workers, an agent's runtime threads) exactly. When
//! cgroups cannot be written (not root, cgroup v2 only, a container), the fallback pins each
//! server to one core with `sched_setaffinity`: a weaker cap (a whole core), and the lab says so.
//!
//! A process joins its group between fork and exec (see [`Confine::pre_exec`]), so everything it
//! ever starts inherits the cap; nothing runs uncapped for a moment.

use std::ffi::CString;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
const CPUACCT_ROOT: &str = "/sys/fs/cgroup/cpuacct";
/// The CFS period of a cap: 10 ms, longer only where the quota would fall below the kernel's
/// 1 ms minimum (under 10 % of a core). A "machine" at 10 % of a core then runs 1 ms in every
/// 10, close to a slower CPU that is always there; with the kernel's default 100 ms it ran 10 ms
/// and then stood still for 90, longer than the lab's 30 ms round trip, so a capped server's
/// load arrived and left in bursts that no balancer could see coming.
fn period_us(percent: u32) -> u64 {
    const MIN_QUOTA_US: u64 = 1_000;
    (MIN_QUOTA_US * 100)
        .div_ceil(u64::from(percent.max(1)))
        .clamp(10_000, 1_000_000)
}

/// How servers are capped in this lab run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapMode {
    /// cgroup v1 CPU quota per server: the requested share of a core.
    Cgroup,
    /// No cgroups here: each server pinned to one core (its cap is a whole core).
    Taskset,
    /// No cap at all (asked for with `--quota 0`).
    None,
}

impl CapMode {
    /// cgroups if this process can create them, else taskset.
    pub fn detect() -> CapMode {
        let probe = Path::new(CPU_ROOT).join(format!("baton-lab-probe-{}", std::process::id()));
        let ok = fs::create_dir(&probe).is_ok() && probe.join("cpu.cfs_quota_us").exists();
        let _ = fs::remove_dir(&probe);
        if ok && Path::new(CPUACCT_ROOT).join("cpuacct.usage").exists() {
            CapMode::Cgroup
        } else {
            CapMode::Taskset
        }
    }
}

/// One server's cap: a cgroup pair (cpu quota + cpuacct) or a core to pin to.
#[derive(Debug)]
pub struct Confine {
    name: String,
    mode: CapMode,
    /// percent of one core (cgroup mode)
    percent: u32,
    /// core to pin to (taskset mode)
    core: usize,
    cpu_dir: Option<PathBuf>,
    acct_dir: Option<PathBuf>,
}

impl Confine {
    /// Creates the group `baton-lab-<pid>-<name>` capped at `percent` of one core (cgroup
    /// mode), or remembers core `core` (taskset mode).
    pub fn new(mode: CapMode, name: &str, percent: u32, core: usize) -> anyhow::Result<Confine> {
        let name = format!("baton-lab-{}-{name}", std::process::id());
        let mut c = Confine {
            name,
            mode,
            percent,
            core,
            cpu_dir: None,
            acct_dir: None,
        };
        if mode == CapMode::Cgroup {
            if percent == 0 || percent > 100 * 64 {
                bail!("CPU cap {percent}%: between 1 and 6400 (percent of one core)");
            }
            let cpu = Path::new(CPU_ROOT).join(&c.name);
            let acct = Path::new(CPUACCT_ROOT).join(&c.name);
            // each directory is remembered as soon as it exists, so that drop removes it even
            // when the other cannot be made
            for (d, slot) in [(&cpu, &mut c.cpu_dir), (&acct, &mut c.acct_dir)] {
                if !d.exists() {
                    fs::create_dir(d)
                        .with_context(|| format!("creating cgroup {}", d.display()))?;
                }
                *slot = Some(d.clone());
            }
            let period = period_us(percent);
            write(&cpu.join("cpu.cfs_period_us"), &period.to_string())?;
            write(
                &cpu.join("cpu.cfs_quota_us"),
                &(period * u64::from(percent) / 100).to_string(),
            )?;
        }
        Ok(c)
    }

    pub fn mode(&self) -> CapMode {
        self.mode
    }

    /// What the cap is, for tables: `40% of a core (cgroup)`, `core 1 (taskset)`, `none`.
    pub fn describe(&self) -> String {
        match self.mode {
            CapMode::Cgroup => format!("{}% of a core (cgroup)", self.percent),
            CapMode::Taskset => format!("core {} (taskset)", self.core),
            CapMode::None => "none".into(),
        }
    }

    /// Makes `cmd`'s process join this cap before it execs.
    ///
    /// The one `unsafe` of the lab: `CommandExt::pre_exec` is unsafe by contract (the hook
    /// runs between fork and exec), and neither std nor rustix starts a child in a cgroup or
    /// with an affinity otherwise. The hooks themselves are safe rustix calls that allocate
    /// nothing.
    #[allow(unsafe_code)]
    pub fn apply(&self, cmd: &mut Command) -> anyhow::Result<()> {
        match self.mode {
            CapMode::None => Ok(()),
            CapMode::Cgroup => {
                // Paths are prepared here: between fork and exec only async-signal-safe calls
                // (open, write, close) may run, so no allocation happens in the hook.
                let files: Vec<CString> = [&self.cpu_dir, &self.acct_dir]
                    .into_iter()
                    .flatten()
                    .map(|d| {
                        CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes())
                    })
                    .collect::<Result<_, _>>()?;
                // SAFETY: the hook only opens, writes and closes (rustix's system calls, on
                // pre-built C strings); writing "0" to cgroup.procs moves the calling (child)
                // process.
                unsafe {
                    cmd.pre_exec(move || {
                        use rustix::fs::{open, Mode, OFlags};
                        for f in &files {
                            let fd = open(
                                f.as_c_str(),
                                OFlags::WRONLY | OFlags::CLOEXEC,
                                Mode::empty(),
                            )?;
                            if rustix::io::write(&fd, b"0\n")? != 2 {
                                return Err(std::io::ErrorKind::WriteZero.into());
                            }
                        }
                        Ok(())
                    })
                };
                Ok(())
            }
            CapMode::Taskset => {
                let core = self.core % available_cores();
                let mut set = rustix::thread::CpuSet::new();
                set.set(core);
                // SAFETY: the hook only calls sched_setaffinity(2) on the child itself with a
                // set made before the fork; no allocation.
                unsafe {
                    cmd.pre_exec(move || {
                        rustix::thread::sched_setaffinity(None, &set)?;
                        Ok(())
                    })
                };
                Ok(())
            }
        }
    }

    /// Moves running process `pid` (all its threads) into this cap (cgroup mode; nothing to do
    /// without a cap). A process started under the cap is better: see [`Confine::apply`].
    pub fn add(&self, pid: u32) -> anyhow::Result<()> {
        match self.mode {
            CapMode::None => Ok(()),
            CapMode::Cgroup => {
                for d in [&self.cpu_dir, &self.acct_dir].into_iter().flatten() {
                    write(&d.join("cgroup.procs"), &pid.to_string())?;
                }
                Ok(())
            }
            CapMode::Taskset => bail!("only a cgroup cap takes a running process"),
        }
    }

    /// CPU-seconds used by every process that ever ran in this group (cgroup mode), or `None`.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let d = self.acct_dir.as_ref()?;
        let ns: u64 = fs::read_to_string(d.join("cpuacct.usage"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(ns as f64 / 1e9)
    }

    /// How many periods the group hit its quota (cgroup mode): > 0 means the cap was binding,
    /// i.e. the server, not the client, was the bottleneck.
    pub fn throttled(&self) -> Option<u64> {
        let d = self.cpu_dir.as_ref()?;
        let stat = fs::read_to_string(d.join("cpu.stat")).ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Processes still in the group.
    pub fn pids(&self) -> Vec<u32> {
        let Some(d) = self.cpu_dir.as_ref() else {
            return Vec::new();
        };
        fs::read_to_string(d.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl baton_cluster::Cap for Confine {
    fn apply(&self, cmd: &mut Command) -> anyhow::Result<()> {
        Confine::apply(self, cmd)
    }
}

impl Drop for Confine {
    /// Kills what is left in the group (the servers' children, if a server forgot them), then
    /// removes the directories. A cgroup can only be removed once empty.
    fn drop(&mut self) {
        for pid in self.pids() {
            // (a pid listed in our own cgroup)
            baton_cluster::signal::send(pid, baton_cluster::signal::Signal::KILL);
        }
        for d in [&self.cpu_dir, &self.acct_dir].into_iter().flatten() {
            for _ in 0..50 {
                if fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    fs::write(path, value).with_context(|| format!("writing {value} to {}", path.display()))
}

pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_child_joins_its_group_and_is_counted() {
        if CapMode::detect() != CapMode::Cgroup {
            eprintln!("skipping: no writable cgroup v1 cpu controller here");
            return;
        }
        let c = Confine::new(CapMode::Cgroup, "unit-test", 20, 0).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"]);
        c.apply(&mut cmd).unwrap();
        let mut child = cmd.spawn().unwrap();
        let pid = child.id();
        assert!(c.pids().contains(&pid), "child {pid} not in {:?}", c.pids());
        child.wait().unwrap();
        assert!(c.cpu_seconds().unwrap() > 0.0);
    }

    #[test]
    fn a_running_process_can_be_moved_in() {
        if CapMode::detect() != CapMode::Cgroup {
            return;
        }
        let c = Confine::new(CapMode::Cgroup, "unit-test-add", 20, 0).unwrap();
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        c.add(child.id()).unwrap();
        assert!(c.pids().contains(&child.id()), "{:?}", c.pids());
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn periods_are_short_and_quotas_never_below_the_kernels_minimum() {
        assert_eq!(period_us(10), 10_000);
        assert_eq!(period_us(20), 10_000);
        assert_eq!(period_us(100), 10_000);
        assert_eq!(period_us(6400), 10_000);
        assert_eq!(period_us(5), 20_000);
        assert_eq!(period_us(3), 33_334);
        assert_eq!(period_us(1), 100_000);
        for percent in 1..=6400u32 {
            let period = period_us(percent);
            assert!(period * u64::from(percent) / 100 >= 1_000, "{percent}%");
            assert!((1_000..=1_000_000).contains(&period), "{percent}%");
        }
    }

    #[test]
    fn nonsense_caps_are_refused() {
        if CapMode::detect() != CapMode::Cgroup {
            return;
        }
        assert!(Confine::new(CapMode::Cgroup, "bad", 0, 0).is_err());
    }
}
