//! Notifications to the service manager (`sd_notify(3)`), for a `Type=notify` unit: `READY=1`
//! once the dispatcher serves, and across a handover the successor's `MAINPID=` so that the
//! manager follows it and does not take the old process's exit for the service's end
//! (`deploy/systemd/baton-dispatch.service`, `NotifyAccess=all`: the successor is not the main
//! process when it says so). Without `NOTIFY_SOCKET` in the environment each is a no-op.
//!
//! The variable stays set: a successor inherits it and notifies the same manager.

use sd_notify::NotifyState;

/// Serving (a process that started on its own, not as a successor).
pub(crate) fn ready() {
    send(&[NotifyState::Ready]);
}

/// A handover begins: the manager shows the unit reloading until a `READY=1`.
pub(crate) fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// This process is the service's main process and serves: the successor once it accepts
/// (before its predecessor exits), or the old process again when its successor failed.
pub(crate) fn main_and_ready() {
    send(&[NotifyState::MainPid(std::process::id()), NotifyState::Ready]);
}

/// Shutting down (SIGTERM/SIGINT); never after a handover, where the successor serves on.
pub(crate) fn stopping() {
    send(&[NotifyState::Stopping]);
}

fn send(state: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!(error = %e, "notifying the service manager");
    }
}
