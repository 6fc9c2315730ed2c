//! A local `redis-server` (the soak's side A store, the integration tests' shared store): on a
//! free port of 127.0.0.1, without persistence, so a restart comes back empty.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

pub use baton_cluster::redis::{available, binary};

/// A running `redis-server` on a fixed port (kept across [`Redis::kill`] and
/// [`Redis::spawn`]), its output appended to `redis.log`; killed on drop.
pub struct Redis {
    port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl Redis {
    /// Starts it on a free port, logging to `dir/redis.log`, and waits until it listens.
    pub fn start(dir: &Path) -> anyhow::Result<Redis> {
        let mut r = Redis {
            port: super::free_port()?,
            child: None,
            log: dir.join("redis.log"),
        };
        r.spawn()?;
        Ok(r)
    }

    /// Starts it (again) on its port.
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(binary())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting redis-server")?;
        self.child = Some(child);
        super::wait_port(self.port, Duration::from_secs(10)).context("redis-server did not listen")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Its pid, 0 while it is not running.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// SIGKILL (an outage); [`Redis::spawn`] brings it back, empty.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
