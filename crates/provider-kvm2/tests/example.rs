//! The `one_vm` example is what a tool that reuses this crate does: it runs here against the
//! local hypervisor (`cargo xtask hypervisor up`), creating one VM, reading its address and
//! deleting it, with nothing of the operator around it.
//!
//! Skips without a hypervisor; fails under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use egress_libvirt::HypervisorEnv;

/// Longer than the example's own deadlines (boot and delete), so it reports its failure first.
const PATIENCE: Duration = Duration::from_secs(600);

/// Runs `cmd` to its end, killing it after `patience`.
fn run_within(cmd: &mut Command, patience: Duration) -> std::process::Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the example");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(patience) {
        Ok(out) => out.expect("waiting for the example"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("the example did not finish within {patience:?}");
        }
    }
}

/// The example, which `cargo test` builds next to the test binaries (a run of this target
/// alone, `--test example`, does not: build it with `cargo build --examples` first).
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = profile_dir.join("examples/one_vm");
    assert!(
        path.exists(),
        "{} is missing: cargo test builds the examples",
        path.display()
    );
    path
}

#[test]
fn the_one_vm_example_creates_a_vm_reads_its_address_and_deletes_it() {
    if HypervisorEnv::for_test().is_none() {
        return;
    }
    let out = run_within(Command::new(example_binary()).env_remove("EGRESS_IMAGE_URL"), PATIENCE);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].starts_with("created hosts/hv/domains/proxy-"), "{stdout}");
    let ip: std::net::IpAddr = lines[1]
        .strip_prefix("running at ")
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("no address: {stdout}"));
    assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
    assert_eq!(lines[2], lines[0].replacen("created", "deleted", 1), "{stdout}");
}
