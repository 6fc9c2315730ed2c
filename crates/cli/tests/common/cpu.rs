//! A CPU cap on a running process: the lab's cgroup cap (`Confine`).

use baton_lab::rig::cap::{CapMode, Confine};

/// A CPU cap on a process (cgroup v1 `cpu` controller, as root): `percent` of one core.
/// `None` where cgroups cannot be written (the test then runs uncapped). Whatever still runs
/// in it is killed on drop.
pub struct CpuCap(Confine);

impl CpuCap {
    pub fn apply(pid: u32, percent: u32) -> Option<CpuCap> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cap = Confine::new(CapMode::Cgroup, &format!("test-{n}"), percent, 0).ok()?;
        cap.add(pid).ok()?;
        Some(CpuCap(cap))
    }
}
