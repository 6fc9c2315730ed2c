//! The home agent's memory of the session objects it imported: each opens once (replay
//! guard), and none issued before this agent started (the guard would not know them).

use std::sync::Mutex;
use std::time::SystemTime;

use baton_session::migration::ReplayGuard;

/// Ids of imported session objects, remembered until they expire. Objects live seconds, so
/// this bounds the rate of imports at ~MAX_REMEMBERED per TTL, far above what an agent serves.
const MAX_REMEMBERED: usize = 1 << 20;

/// The home agent's import state.
#[derive(Debug)]
pub struct ImportState {
    pub(crate) guard: Mutex<ReplayGuard>,
    /// Objects issued before this are refused: the guard has forgotten them (a restart).
    pub(crate) started: SystemTime,
}

impl Default for ImportState {
    fn default() -> Self {
        Self {
            guard: Mutex::new(ReplayGuard::new(MAX_REMEMBERED)),
            started: SystemTime::now(),
        }
    }
}
