//! Ports on 127.0.0.1 (the lab's `free_port` and `wait_port`) and a plain HTTP backend.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A free TCP port on 127.0.0.1 (for addresses that must be known before a process starts).
pub fn free_port() -> u16 {
    baton_cluster::free_port().unwrap()
}

/// Waits up to 5 s for something to accept on 127.0.0.1:`port` (a server just spawned);
/// whether it did.
pub fn wait_for_port(port: u16) -> bool {
    baton_lab::rig::wait_port(port, Duration::from_secs(5)).is_ok()
}

/// A plain HTTP/1.1 keep-alive backend serving `dir` (`python3 -m http.server`), killed on drop.
pub struct StaticServer {
    child: Child,
    pub port: u16,
}

impl StaticServer {
    pub fn start(dir: &Path) -> StaticServer {
        let port = free_port();
        let child = Command::new("python3")
            .args(["-m", "http.server", "--protocol", "HTTP/1.1"])
            .args(["--bind", "127.0.0.1", &port.to_string()])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 (scripts/test installs it)");
        wait_for_port(port);
        StaticServer { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
