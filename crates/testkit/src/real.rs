//! The one rule for tests of real backends and components (tinyproxy, redis-server, Squid,
//! strace, kubectl, the test hypervisor, a provider's real backend in the conformance suite):
//! a test that cannot find what it needs skips with a printed reason, unless the run requires
//! real backends, [`REQUIRED_ENV`]`=1` (as `cargo xtask test` and `cargo xtask conformance
//! --real` set it), where it fails instead. So a developer's `cargo test` passes on a machine
//! without them, and CI cannot skip them silently.
//!
//! Every such test decides with [`skip_or_fail`]; nothing else reads the variable but
//! [`required`].

/// The variable that makes real backends required: set it to `1`.
pub const REQUIRED_ENV: &str = "EGRESS_REAL_BACKENDS_REQUIRED";

/// Whether this run requires real backends ([`REQUIRED_ENV`] is `1`).
#[must_use]
pub fn required() -> bool {
    std::env::var(REQUIRED_ENV).is_ok_and(|v| v == "1")
}

/// `what` (a test, a case, a check) cannot run here because of `why` (what is missing, and
/// where it comes from). Returns when `what` is to be skipped, having printed
/// `SKIPPED <what>: <why>`; the caller then returns without running it.
///
/// # Panics
/// When real backends are [`required`]: `what` fails with `why`.
#[track_caller]
pub fn skip_or_fail(what: &str, why: &str) {
    assert!(
        !required(),
        "{what} cannot run here ({why}), but real backends are required ({REQUIRED_ENV}=1)"
    );
    println!("SKIPPED {what}: {why}");
}
