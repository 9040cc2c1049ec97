//! `cargo xtask dev`: the whole system on one machine, with real proxies.
//!
//! ```text
//!  egress-kube-testserver (CRDs) ◄── egress-operator ──► local provider ──► tinyproxy × 6
//!                                                         (3 Proxies, a pool of 2 + 1 standby)
//!          ▲                              │  └─ health probes ──► TLS target (this process)
//!     samples applied                     └─ discovery API 127.0.0.1:<port>
//!                                                  ▲
//!                        egress-gateway ───────────┘ leases with each client's token
//!                        (HTTP and SOCKS5 fronts on 127.0.0.1)
//! ```
//!
//! Everything lives under `<target>/egress-dev/`: the kubeconfig, the providers config, the
//! target's CA, the proxies' state directory and the logs. The children run in their own process
//! groups, so a Ctrl-C reaches this process only and the teardown runs in order: the Proxies are
//! deleted (the operator stops their tinyproxies), then the operator and the test server stop,
//! then anything a crash left in the state directory is removed through the local provider. A run
//! killed outright is cleaned up by the next one. The target's certificates and the target itself
//! are `egress-testkit`'s, the ones the tests use.
//!
//! The steps, each in its module: [`leftovers`] (what an earlier run left), [`session`] (start,
//! use, tear down), [`gateway`] (started, its guide lines and their check), [`samples`]
//! (applied and followed to Ready), [`guide`] (for a person),
//! [`smoke`] (the check without one), [`running`] (the children and the teardown), [`layout`]
//! (the run's files and names).

mod exits;
mod gateway;
mod guide;
mod layout;
mod leftovers;
mod running;
mod samples;
mod session;
mod smoke;

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::system;
use layout::Layout;
pub(crate) use session::Options;

/// Where the operator's tinyproxy comes from.
const TINYPROXY: &str = "/usr/bin/tinyproxy";

/// Builds the workspace's programs (`release` or debug); returns the directory they are in.
fn build(root: &Path, release: bool) -> Result<std::path::PathBuf> {
    let mut build = Command::new(crate::cargo_bin());
    build.current_dir(root).args(["build", "--workspace", "--bins"]);
    if release {
        build.arg("--release");
    }
    if !build.status().context("running cargo build")?.success() {
        bail!("building the operator and the test server failed");
    }
    Ok(crate::target_dir(root).join(if release { "release" } else { "debug" }))
}

/// The directory of this program, where cargo put the workspace's other programs; each one the
/// run starts must be there.
fn built_beside_xtask() -> Result<std::path::PathBuf> {
    let exe = std::env::current_exe().context("finding the xtask program")?;
    let dir = exe
        .parent()
        .context("the xtask program has no directory")?
        .to_path_buf();
    for program in ["egress-operator", "egress-kube-testserver", "egress-gateway"] {
        if !dir.join(program).exists() {
            bail!(
                "{program} is not built in {}: run cargo build --workspace first",
                dir.display()
            );
        }
    }
    Ok(dir)
}

pub(crate) fn run(root: &Path, options: &Options) -> Result<()> {
    // Before anything compiles: the build needs libvirt-dev, the run needs tinyproxy.
    system::require_packages(&[system::BUILD_PACKAGES, &["tinyproxy"]].concat())?;
    if !Path::new(TINYPROXY).exists() {
        bail!("{TINYPROXY} is needed: apt-get install tinyproxy (as root, cargo xtask dev installs it)");
    }
    // The stack for tests runs the programs `cargo xtask test` built, beside this one, in a
    // directory of its own (a person's `cargo xtask dev` may be running too).
    let (bin, dir) = match &options.stack_file {
        None => (build(root, options.release)?, "egress-dev"),
        Some(_) => (built_beside_xtask()?, "egress-stack"),
    };
    let layout = Layout {
        dir: crate::target_dir(root).join(dir),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(leftovers::clean_leftovers(&layout))?;
    std::fs::create_dir_all(&layout.dir)?;
    runtime.block_on(session::session(root, &bin, &layout, options))
}
