//! Signals to the processes a cluster (or the lab) starts or follows: kill(2) through rustix,
//! without `unsafe`.

pub use rustix::process::Signal;

/// Sends `sig` to process `pid`. A process gone already is not an error here: every caller
/// looks at how the process ended afterwards.
pub fn send(pid: u32, sig: Signal) {
    // (0 would be this process group, and no pid is past i32::MAX)
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, sig);
    }
}
