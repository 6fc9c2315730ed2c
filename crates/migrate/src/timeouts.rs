//! Every deadline of a migration, derived from one setting (`--migration-timeout`, the same flag
//! with the same default in `baton dispatch` and `baton agent`).
//!
//! The agents wait longer than the dispatcher can take to decide, so that a live dispatcher
//! always decides first and an agent gives up only on one that is gone. The dispatcher waits
//! at most `cut` for a record boundary, then `home` for the home agent: its verdict comes
//! within `cut + home` (3 steps) of the Switch; the agents wait `verdict` (4 steps). Giving up
//! never uses the keys: an agent that stops waiting closes the connection.

use std::time::Duration;

/// The deadlines of one migration, as multiples of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    step: Duration,
}

impl Timeouts {
    /// The step when none is configured.
    pub const DEFAULT_STEP: Duration = Duration::from_secs(1);

    pub const fn new(step: Duration) -> Self {
        Self { step }
    }

    /// The deadlines of a `--migration-timeout` setting: the default step when there is none;
    /// a step must be more than zero and less than an hour.
    pub fn from_setting(step: Option<Duration>) -> Result<Self, String> {
        let step = step.unwrap_or(Self::DEFAULT_STEP);
        if step.is_zero() || step >= Duration::from_secs(3600) {
            return Err(format!(
                "--migration-timeout {step:?}: must be more than 0 and less than 1h"
            ));
        }
        Ok(Self::new(step))
    }

    /// The configured step.
    pub fn step(self) -> Duration {
        self.step
    }

    /// The dispatcher: from asking for the home agent's stream to its Ready (or Refused).
    pub fn home(self) -> Duration {
        self.step
    }

    /// The dispatcher: from the handshake agent's cut (or a Leave's Offer) until the client's
    /// current record ends and the agent's Switch has come.
    pub fn cut(self) -> Duration {
        self.step * 2
    }

    /// The home agent: from a new import stream to its Import frame.
    pub fn import(self) -> Duration {
        self.step * 2
    }

    /// Both agents: from Switch (or Leave) to the dispatcher's Resume or Done, and from Ready
    /// to its Commit or Abort.
    pub fn verdict(self) -> Duration {
        self.step * 4
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self::new(Self::DEFAULT_STEP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_outwaits_the_dispatchers_longest_decision() {
        for ms in [1, 250, 1000, 30_000] {
            let t = Timeouts::new(Duration::from_millis(ms));
            assert!(t.verdict() > t.cut() + t.home());
            assert!(t.import() > t.home());
        }
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        assert_eq!(Timeouts::from_setting(None), Ok(Timeouts::default()));
        assert!(Timeouts::from_setting(Some(Duration::ZERO)).is_err());
        assert!(Timeouts::from_setting(Some(Duration::from_secs(3600))).is_err());
        let t = Timeouts::from_setting(Some(Duration::from_millis(250))).unwrap();
        assert_eq!(t.step(), Duration::from_millis(250));
    }
}
