//! Errors of this crate, grouped by who is at fault.

/// What went wrong with session state.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A ticket key file could not be read or parsed (the operator's input).
    #[error("key file: {0}")]
    KeyFile(String),
    /// The system's random number generator failed (local fault).
    #[error("random number generator failed")]
    Rng,
}
