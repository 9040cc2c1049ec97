//! The `list_domains` example is what a tool that reuses this crate does: it runs here against
//! the local hypervisor (`cargo xtask hypervisor up`), dialling it over SSH and listing the
//! managed domains, with nothing of the operator around it.
//!
//! Skips without a hypervisor; fails under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1).

use std::process::Command;
use std::time::Duration;

use egress_libvirt::HypervisorEnv;
use egress_testkit::examples::{example_binary, run_example, succeeded};

/// Longer than the example's own list deadline.
const PATIENCE: Duration = Duration::from_secs(120);

#[test]
fn the_list_domains_example_lists_the_managed_domains_of_the_hypervisor() {
    if HypervisorEnv::for_test().is_none() {
        return;
    }
    let lines = succeeded(&run_example(
        &mut Command::new(example_binary("list_domains")),
        PATIENCE,
    ));
    let stdout = lines.join("\n");
    let (count, domains) = lines.split_last().unwrap_or_else(|| panic!("no output"));
    let n: usize = count
        .strip_suffix(" managed domains")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count: {stdout}"));
    assert_eq!(n, domains.len(), "{stdout}");
    for domain in domains {
        assert!(domain.starts_with("hosts/hv/domains/"), "{stdout}");
    }
}
