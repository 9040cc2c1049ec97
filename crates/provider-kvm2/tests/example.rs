//! The `one_vm` example is what a tool that reuses this crate does: it runs here against the
//! local hypervisor (`cargo xtask hypervisor up`), creating one VM, reading its address and
//! deleting it, with nothing of the operator around it.
//!
//! Skips without a hypervisor; fails under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1).

use std::process::Command;
use std::time::Duration;

use egress_libvirt::HypervisorEnv;
use egress_testkit::examples::{example_binary, run_example, succeeded};

/// Longer than the example's own deadlines (boot and delete), so it reports its failure first.
const PATIENCE: Duration = Duration::from_secs(600);

#[test]
fn the_one_vm_example_creates_a_vm_reads_its_address_and_deletes_it() {
    if HypervisorEnv::for_test().is_none() {
        return;
    }
    let out = run_example(
        Command::new(example_binary("one_vm")).env_remove("EGRESS_IMAGE_URL"),
        PATIENCE,
    );
    let lines = succeeded(&out);
    let stdout = lines.join("\n");
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines[0].starts_with("created hosts/hv/domains/proxy-"), "{stdout}");
    let ip: std::net::IpAddr = lines[1]
        .strip_prefix("running at ")
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("no address: {stdout}"));
    assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
    assert_eq!(lines[2], lines[0].replacen("created", "deleted", 1), "{stdout}");
}
