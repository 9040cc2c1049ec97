//! The `one_proxy` example is what a tool that reuses this crate does: a providers file read
//! through a registry, one real tinyproxy started, found listening, and stopped, with nothing of
//! the operator around it.
//!
//! Skips without tinyproxy; fails under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1).

use std::process::Command;
use std::time::Duration;

use egress_testkit::ScratchDir;
use egress_testkit::examples::{example_binary, run_example, succeeded};

/// Longer than the example's own deadlines (start and delete), so it reports its failure first.
const PATIENCE: Duration = Duration::from_secs(120);

/// Checks the three lines of a run that worked.
fn assert_created_listened_deleted(lines: &[String]) {
    let stdout = lines.join("\n");
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].starts_with("created local/proxy-"), "{stdout}");
    let addr: std::net::SocketAddr = lines[1]
        .strip_prefix("listening at ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address: {stdout}"));
    assert!(addr.ip().is_loopback() && addr.port() == 3128, "{addr}");
    assert_eq!(lines[2], lines[0].replacen("created", "deleted", 1), "{stdout}");
}

#[test]
fn the_one_proxy_example_starts_a_tinyproxy_from_its_built_in_file_and_stops_it() {
    let test = "the_one_proxy_example_starts_a_tinyproxy_from_its_built_in_file_and_stops_it";
    if egress_testkit::on_path("tinyproxy", test).is_none() {
        return;
    }
    let out = run_example(&mut Command::new(example_binary("one_proxy")), PATIENCE);
    assert_created_listened_deleted(&succeeded(&out));
}

#[test]
fn the_one_proxy_example_reads_a_providers_file_and_leaves_its_state_dir_empty() {
    let test = "the_one_proxy_example_reads_a_providers_file_and_leaves_its_state_dir_empty";
    if egress_testkit::on_path("tinyproxy", test).is_none() {
        return;
    }
    let scratch = ScratchDir::new("one-proxy-file");
    let state = scratch.path().join("state");
    let file = scratch.path().join("providers.yaml");
    std::fs::write(
        &file,
        format!(
            "providers:\n  - name: mine\n    type: local\n    local:\n      stateDir: {}\n",
            state.display()
        ),
    )
    .unwrap();
    let out = run_example(Command::new(example_binary("one_proxy")).arg(&file), PATIENCE);
    assert_created_listened_deleted(&succeeded(&out));
    let left: Vec<_> = std::fs::read_dir(&state)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the delete left {left:?}");
}

#[test]
fn the_one_proxy_example_refuses_a_file_the_operator_would_refuse_and_starts_nothing() {
    let scratch = ScratchDir::new("one-proxy-refused");
    let file = scratch.path().join("providers.yaml");
    std::fs::write(
        &file,
        "providers:\n  - name: mine\n    type: local\n    local:\n      stateDir: relative/state\n",
    )
    .unwrap();
    // Run from the scratch directory, where a relative state directory would land.
    let out = run_example(
        Command::new(example_binary("one_proxy"))
            .arg(&file)
            .current_dir(scratch.path()),
        PATIENCE,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains("local.stateDir must be an absolute path"), "{stderr}");
    assert!(!scratch.path().join("relative").exists());
}
