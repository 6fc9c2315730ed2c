//! A real `redis-server` for the shared-store tests: the lab's, in a throwaway directory.

use super::TempDir;

/// A real `redis-server` on a free port, killed on drop. `None` (the test skips) when it is
/// not installed, unless `BATON_REQUIRE_SERVERS` is set (`scripts/test` sets it).
pub struct Redis {
    server: baton_lab::rig::redis::Redis,
    pub port: u16,
    _dir: TempDir,
}

impl Redis {
    pub fn start() -> Option<Redis> {
        if !baton_cluster::redis::available() {
            super::require_or_skip("redis-server", "the shared session store");
            return None;
        }
        let dir = TempDir::new("redis");
        let server = baton_lab::rig::redis::Redis::start(&dir.0)
            .unwrap_or_else(|e| panic!("redis-server did not start: {e:#}"));
        Some(Redis {
            port: server.port(),
            server,
            _dir: dir,
        })
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Stops the server now (an outage).
    pub fn stop(&mut self) {
        self.server.kill();
    }
}
