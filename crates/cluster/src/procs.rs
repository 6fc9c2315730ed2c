//! Processes by pid, as `/proc` shows them: whether one runs, its command line and parent, how
//! it ended. `baton up` follows processes it did not start this way (a dispatcher's successor
//! after a hot restart), and finds a successor among its predecessor's children.

/// Whether `pid` is a running process (`/proc/PID` exists and is not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // the state follows the command name in parentheses: Z is a zombie
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Argv after argv[0] of `pid`, NUL-separated as the kernel has it.
pub(crate) fn args_of(pid: u32) -> Option<Vec<u8>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let start = raw.iter().position(|b| *b == 0)? + 1;
    Some(raw[start..].to_vec())
}

/// The parent of `pid`, if it runs (not a zombie).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    rest.next()?.parse().ok()
}

/// A running process with command line `args`, a child of one of `parents` (the first
/// parent's children first), not in `except`.
pub(crate) fn find_successor(args: &[u8], parents: &[u32], except: &[u32]) -> Option<u32> {
    let mut best: Option<(usize, u32)> = None;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if except.contains(&pid) {
            continue;
        }
        let Some(rank) = parent_of(pid).and_then(|pp| parents.iter().position(|p| *p == pp)) else {
            continue;
        };
        if best.is_some_and(|(r, _)| r <= rank) {
            continue;
        }
        if args_of(pid).as_deref() == Some(args) {
            best = Some((rank, pid));
        }
    }
    best.map(|(_, pid)| pid)
}

/// Reaps `pid` if it is an exited child of this process: how it ended.
pub(crate) fn reap(pid: u32) -> Option<String> {
    use rustix::process::{waitpid, Pid, WaitOptions};
    use std::os::unix::process::ExitStatusExt as _;
    let pid = Pid::from_raw(i32::try_from(pid).ok()?)?;
    let (_, status) = waitpid(Some(pid), WaitOptions::NOHANG).ok()??;
    Some(std::process::ExitStatus::from_raw(status.as_raw()).to_string())
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::signal::{self, Signal};

    #[test]
    fn a_child_with_the_same_command_line_is_found_by_its_parent() {
        // `sh -c 'sleep 30 & wait'`: the sleep is a child of the shell, with its own argv
        let mut sh = Command::new("sh")
            .args(["-c", "sleep 30.5 & wait"])
            .spawn()
            .unwrap();
        let shell = sh.id();
        let args = b"30.5\0".to_vec();
        let until = Instant::now() + Duration::from_secs(5);
        let mut found = None;
        while found.is_none() && Instant::now() < until {
            found = find_successor(&args, &[shell], &[]);
            std::thread::sleep(Duration::from_millis(10));
        }
        let sleep = found.expect("the shell's sleep");
        assert_eq!(parent_of(sleep), Some(shell));
        assert_eq!(args_of(sleep).as_deref(), Some(&args[..]));
        // not found under another parent, nor when excluded
        assert_eq!(find_successor(&args, &[std::process::id()], &[]), None);
        assert_eq!(find_successor(&args, &[shell], &[sleep]), None);
        signal::send(sleep, Signal::KILL);
        let _ = sh.kill();
        let _ = sh.wait();
    }

    #[test]
    fn liveness_from_proc() {
        assert!(alive(std::process::id()));
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        // exited but not reaped: a zombie is not alive
        let until = Instant::now() + Duration::from_secs(5);
        while alive(pid) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(pid));
        let _ = c.wait();
        assert!(!alive(pid));
    }
}
