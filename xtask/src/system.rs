//! System packages: what the workspace needs from Debian, installed when
//! missing and when running as root (as CI does).

use std::process::Command;

use anyhow::{Context, Result, bail};

/// Debian packages without which the workspace does not compile: libvirt-dev and pkg-config
/// (virt-sys finds libvirt through `libvirt.pc`), and CA roots.
pub(crate) const BUILD_PACKAGES: &[&str] = &["ca-certificates", "libvirt-dev", "pkg-config"];

/// Debian packages the workspace's build and tests need: CA roots; libvirt-dev and pkg-config
/// (the libvirt C bindings build against them); tinyproxy (the real forward proxy of the health
/// probes and the local provider); the OpenSSH client (test keys); redis-server and redis-tools'
/// `redis-cli` (the shared lease store's tests, on one server and on a cluster); Squid (the kubernetes provider's generated config, run for real) with
/// iproute2 and util-linux's `unshare` (the Squid test's own network namespace); strace (the
/// record of where the binary sends packets, in the test of refused destinations); podman,
/// runc, catatonit, mmdebstrap and binutils (the image, `crate::image::PACKAGES`, built and run
/// by the shipped-install test). The hypervisor's own packages are `cargo xtask hypervisor up`'s.
pub(crate) const APT_PACKAGES: &[&str] = &[
    "ca-certificates",
    "libvirt-dev",
    "pkg-config",
    "tinyproxy",
    "openssh-client",
    "redis-server",
    "redis-tools",
    "squid",
    "iproute2",
    "util-linux",
    "strace",
    "podman",
    "runc",
    "catatonit",
    "mmdebstrap",
    "binutils",
    "skopeo",
];

/// Packages whose install starts a system service the tests do not want: Debian's squid
/// listens on 3128 at once, where it would answer in place of a test's own proxy.
const STARTED_BY_INSTALL: &[&str] = &["squid"];

/// Installs the packages of `wanted` that are missing. Without root it only
/// reports what is missing, so a developer's run never needs sudo.
pub(crate) fn ensure_packages(wanted: &[&str]) -> Result<()> {
    let missing = missing(wanted);
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        println!(
            "xtask: not root, so not installing missing packages: {} (tests that need them will say so)",
            missing.join(" ")
        );
        return Ok(());
    }
    install(&missing)
}

/// The package step of every command that compiles the workspace (`dev`, `bench`,
/// `conformance`): as root, installs what `wanted` lacks; otherwise, when anything is missing,
/// fails before cargo starts with the exact line that installs it, rather than letting a build
/// script fail later with a message about `libvirt.pc`.
pub(crate) fn require_packages(wanted: &[&str]) -> Result<()> {
    if wanted.is_empty() {
        return Ok(());
    }
    if !has_dpkg() {
        // Not Debian: the packages have other names here, and cargo names what it misses.
        println!(
            "xtask: no dpkg-query, so not checking for the Debian packages {} (install their equivalents)",
            wanted.join(" ")
        );
        return Ok(());
    }
    let missing = missing(wanted);
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "these Debian packages are missing and this command needs them before it can build: \
             {list}\n  install them with: sudo apt-get install -y --no-install-recommends {list}\n  \
             (run as root, cargo xtask installs them itself)",
            list = missing.join(" ")
        );
    }
    install(&missing)
}

fn has_dpkg() -> bool {
    Command::new("dpkg-query")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn missing<'a>(wanted: &[&'a str]) -> Vec<&'a str> {
    wanted.iter().copied().filter(|p| !installed(p)).collect()
}

fn install(missing: &[&str]) -> Result<()> {
    println!("xtask: installing {}", missing.join(" "));
    run(Command::new("apt-get").arg("update").arg("-q"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    for service in missing.iter().filter(|p| STARTED_BY_INSTALL.contains(p)) {
        // Not there, or already stopped (a container's policy-rc.d forbids starts): fine.
        let _ = Command::new("service").args([*service, "stop"]).status();
    }
    Ok(())
}

pub(crate) fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}
