//! The `redis-server` a cluster runs for `--store redis` across hosts (each process in a
//! namespace of its own: the Redis gets one too).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::hosts::Host;

/// The `redis-server` to run: `BATON_REDIS_SERVER`, else the one on the PATH.
pub fn binary() -> PathBuf {
    std::env::var_os("BATON_REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// Whether [`binary`] runs at all.
pub fn available() -> bool {
    Command::new(binary())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// `redis-server` in `host` on port 6379 (no persistence), once it answers from here.
pub fn start_in(host: &Host, dir: &Path) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join("redis.log"))?;
    let mut child = host
        .command(binary())
        .args(["--port", "6379", "--bind", &host.addr.to_string()])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting redis-server")?;
    let addr = SocketAddr::from((host.addr, 6379));
    for _ in 0..200 {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    bail!("redis-server in its host did not listen on {addr}")
}
