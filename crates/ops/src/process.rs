//! CPU time and memory: this process's, for its metrics, and another's from `/proc/PID` (the
//! lab's servers, the soak's processes): the one place that reads them.

/// CPU and memory of this process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
}

pub fn usage() -> Usage {
    // user + system time of every thread, as getrusage(RUSAGE_SELF) adds them up
    let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Usage {
        cpu_seconds: cpu.tv_sec as f64 + cpu.tv_nsec as f64 / 1e9,
        rss_bytes: rss_bytes().unwrap_or(0),
    }
}

fn rss_bytes() -> Option<u64> {
    rss_bytes_in("/proc/self/statm")
}

/// Resident set size from a `statm` file (second field, in pages).
fn rss_bytes_in(statm: &str) -> Option<u64> {
    let statm = std::fs::read_to_string(statm).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = rustix::param::page_size();
    Some(pages * u64::try_from(page).ok()?.max(4096))
}

/// Another process's resident set size; `None` once it is gone.
pub fn rss_bytes_of(pid: u32) -> Option<u64> {
    rss_bytes_in(&format!("/proc/{pid}/statm"))
}

/// Another process's user + system CPU seconds; `None` once it is gone.
pub fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_seconds_in_stat(&stat, rustix::param::clock_ticks_per_second()).ok()
}

/// User + system CPU seconds from the text of `/proc/PID/stat`, `ticks` per second
/// (`sysconf(_SC_CLK_TCK)`). The command name (field 2) may hold spaces and parentheses, so
/// fields are counted from the last `)`: utime and stime are fields 14 and 15.
pub fn cpu_seconds_in_stat(stat: &str, ticks: u64) -> anyhow::Result<f64> {
    use anyhow::{bail, Context};
    let (_, rest) = stat
        .rsplit_once(')')
        .context("/proc/PID/stat without a command name")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // after `)`: field 3 (state) is fields[0], so field N is fields[N - 3]
    let tick = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .context("/proc/PID/stat too short")?
            .parse()
            .with_context(|| format!("/proc/PID/stat field {n}"))
    };
    if ticks == 0 {
        bail!("clock ticks per second is 0");
    }
    Ok((tick(14)? + tick(15)?) as f64 / ticks as f64)
}

/// CPU time the calling thread has used: for metering a synchronous piece of work (it does
/// not follow an async task across threads, so measure between awaits only).
pub fn thread_cpu() -> std::time::Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_from_proc_stat_with_an_awkward_command_name() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        let stat = "4242 (baton (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 5 0";
        assert_eq!(cpu_seconds_in_stat(stat, 100).unwrap(), 3.0);
        assert!(cpu_seconds_in_stat("4242 (baton) S 1", 100).is_err());
        assert!(cpu_seconds_in_stat("no parens", 100).is_err());
    }

    #[test]
    fn another_process_is_read_like_this_one() {
        let me = std::process::id();
        assert!(cpu_seconds_of(me).is_some());
        assert!(rss_bytes_of(me).unwrap() > 0);
        // a pid past pid_max: gone
        assert_eq!(cpu_seconds_of(u32::MAX), None);
        assert_eq!(rss_bytes_of(u32::MAX), None);
    }
}
