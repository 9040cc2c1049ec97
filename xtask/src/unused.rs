//! `cargo xtask unused`: no manifest declares a dependency its crate does not use, checked by
//! cargo-machete at a pinned version (installed with `cargo install --locked` when missing or
//! another version; about a minute on two cores).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The cargo-machete release the check runs.
const MACHETE_VERSION: &str = "0.9.2";

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Whether `cargo machete` is there at [`MACHETE_VERSION`].
fn installed() -> bool {
    cargo()
        .args(["machete", "--version"])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == MACHETE_VERSION)
}

fn install() -> Result<()> {
    let status = cargo()
        .args(["install", "--locked", &format!("cargo-machete@{MACHETE_VERSION}")])
        .status()
        .context("running cargo install")?;
    if !status.success() {
        bail!("cargo install cargo-machete@{MACHETE_VERSION} failed ({status})");
    }
    Ok(())
}

pub(crate) fn run(root: &Path) -> Result<()> {
    if !installed() {
        install()?;
    }
    // --with-metadata: dependency names as cargo resolves them (renames, `-` and `_`), which
    // finds unused dev-dependencies the plain mode misses.
    let status = cargo()
        .current_dir(root)
        // NB: cargo-machete takes CARGO_PKG_NAME (which `cargo xtask` inherits from cargo run)
        // as a sign it runs as its own `cargo run`, and then reads every argument as a path.
        .env_remove("CARGO_PKG_NAME")
        .args(["machete", "--with-metadata"])
        .status()
        .context("running cargo machete")?;
    if !status.success() {
        bail!(
            "cargo machete found unused dependencies (or failed): remove them, or list a false positive under [package.metadata.cargo-machete] ignored, saying why"
        );
    }
    Ok(())
}
