//! Skipping a test that needs something this machine lacks (root, a tool): loudly, and never
//! where `BATON_REQUIRE_SERVERS` says everything must be there (`scripts/test`, CI).

use std::io::Write as _;

/// Whether `BATON_REQUIRE_SERVERS` is set: every test must run, none may skip.
pub fn servers_required() -> bool {
    std::env::var_os("BATON_REQUIRE_SERVERS").is_some()
}

/// Call where a test cannot run for want of `what` (`why`: what it is needed for), then return
/// from the test. Panics under `BATON_REQUIRE_SERVERS`; otherwise writes a `SKIP` line
/// straight to the standard error, which the test harness does not capture (`eprintln!` output
/// of a passing test is captured and lost), so the skip shows in every run.
pub fn require_or_skip(what: &str, why: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string();
    assert!(
        !servers_required(),
        "{test}: {what} is required ({why}) and BATON_REQUIRE_SERVERS is set"
    );
    let _ = writeln!(
        std::io::stderr(),
        "SKIP {test}: no {what} ({why}); BATON_REQUIRE_SERVERS=1 makes this a failure"
    );
}

/// Whether the tests run as root; if not, the test is skipped with [`require_or_skip`]
/// (`why`: what root is needed for).
pub fn root_or_skip(why: &str) -> bool {
    let root = super::is_root();
    if !root {
        require_or_skip("root", why);
    }
    root
}
