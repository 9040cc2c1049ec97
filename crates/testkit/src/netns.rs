//! Tests that run inside a network namespace of their own (`unshare --net`): the test re-runs
//! its own binary, that test only, in a new namespace whose one device is a loopback carrying
//! the test's addresses. No request can leave the machine there, even through a broken rule,
//! and addresses outside loopback have no route at all.
//!
//! ```text
//! #[test]
//! fn case() {
//!     if netns::inside(ENV) { return in_namespace(); }      // the re-run
//!     netns::rerun_isolated("case", ENV, "the case", budget); // the first run
//! }
//! ```
//!
//! Needs root; without it the test skips with a reason, and fails when real backends are
//! required ([`crate::real`]).

use std::process::Command;
use std::time::Duration;

use crate::real::skip_or_fail;

/// Whether this process is the re-run inside the namespace (the variable `env` is set).
pub fn inside(env: &str) -> bool {
    std::env::var_os(env).is_some()
}

/// Runs the test `name` of this test binary again inside a new network namespace with `env`
/// set, and asserts it passed there, within `budget` (coreutils' `timeout` ends a run that
/// hangs anywhere). `what` names the test in a skip's reason.
pub fn rerun_isolated(name: &str, env: &str, what: &str, budget: Duration) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = Command::new("timeout")
        .args(["--kill-after=10", &budget.as_secs().to_string(), "unshare", "--net"])
        .arg("--")
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .output()
        .expect("running unshare");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() && stderr.contains("unshare failed") {
        return skip_or_fail(
            what,
            &format!("cannot make a network namespace (root is needed): {}", stderr.trim()),
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_ne!(
        output.status.code(),
        Some(124),
        "the run inside the namespace did not end within {budget:?}:\n{stdout}\n{stderr}"
    );
    assert!(
        output.status.success(),
        "the run inside the namespace failed:\n{stdout}\n{stderr}"
    );
    // The re-run must have run the test, not filtered it away.
    assert!(stdout.contains("1 passed"), "{stdout}");
}

/// Inside the namespace: the loopback device up, carrying `addresses` (each a /32) besides
/// 127.0.0.1.
pub fn loopback_with(addresses: &[&str]) {
    ip(&["link", "set", "lo", "up"]);
    for address in addresses {
        ip(&["addr", "add", &format!("{address}/32"), "dev", "lo"]);
    }
}

fn ip(args: &[&str]) {
    let status = Command::new("ip")
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    assert!(status.success(), "ip {args:?}: {status}");
}
