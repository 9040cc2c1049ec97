//! Records the commit the binaries are built from, for `--version`, the start-up line and the
//! `service.version` of exported spans. `EGRESS_BUILD_COMMIT` wins (image builds without `.git`).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=EGRESS_BUILD_COMMIT");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for watched in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        let path = root.join(watched);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let commit = std::env::var("EGRESS_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "HEAD"])
                .current_dir(&root)
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=EGRESS_COMMIT={commit}");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=EGRESS_RUSTC_VERSION={version}");
}
