//! The `one_vm` example is what a tool that reuses this crate does: it runs here against the
//! local hypervisor (`cargo xtask hypervisor up`), creating one VM, reading its address and
//! deleting it, with nothing of the operator around it.
//!
//! Skips without a hypervisor; fails under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1).

use std::path::{Path, PathBuf};
use std::process::Command;

use egress_libvirt::HypervisorEnv;

/// The example, which `cargo test` builds next to the test binaries.
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
    match HypervisorEnv::load() {
        Ok(Some(_)) => {}
        Ok(None) if std::env::var("EGRESS_REAL_BACKENDS_REQUIRED").is_ok_and(|v| v == "1") => {
            panic!(
                "the test hypervisor is required but {} is missing",
                HypervisorEnv::file().display()
            )
        }
        Ok(None) => {
            println!("SKIPPED: no test hypervisor (cargo xtask hypervisor up)");
            return;
        }
        Err(e) => panic!("{e}"),
    }
    let out = Command::new(example_binary())
        .env_remove("EGRESS_IMAGE_URL")
        .output()
        .expect("running the example");
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
