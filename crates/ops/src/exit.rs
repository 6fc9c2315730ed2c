//! `baton`'s exit codes, so that a script can tell a typo from a failed run: 0 success, 1 a run
//! that failed (or a benchmark that crossed a threshold), 2 a usage or configuration error
//! (clap's own usage errors exit 2 as well).

use std::fmt;

/// A run that failed.
pub const FAILED: u8 = 1;
/// Flags or configuration that cannot be used.
pub const USAGE: u8 = 2;

/// An error in what the operator asked for: flags, configuration files and their contents.
#[derive(Debug)]
pub struct Invalid(anyhow::Error);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Invalid {}

/// Marks `e` as a configuration error (exit code [`USAGE`]).
pub fn invalid(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(Invalid(e))
}

/// The exit code for `e`: [`USAGE`] if a configuration error is anywhere in its chain.
pub fn code_of(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<Invalid>()) {
        USAGE
    } else {
        FAILED
    }
}

#[cfg(test)]
mod tests {
    use anyhow::Context as _;

    use super::*;

    #[test]
    fn configuration_errors_are_told_from_failures_through_context() {
        let bad = invalid(anyhow::anyhow!("--workers must be at least 1"));
        assert_eq!(code_of(&bad), USAGE);
        assert_eq!(bad.to_string(), "--workers must be at least 1");
        let wrapped = Err::<(), _>(bad).context("starting").unwrap_err();
        assert_eq!(code_of(&wrapped), USAGE);
        assert_eq!(code_of(&anyhow::anyhow!("connection refused")), FAILED);
    }
}
