//! docs/architecture.md is the map from the README to every behaviour: each workspace member
//! must have a row in one of its tables, so a crate added or renamed without updating the map
//! fails here.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The member paths of the root manifest's `members = [...]`.
fn members(manifest: &str) -> Vec<String> {
    let start = manifest.find("members = [").expect("a members list") + "members = [".len();
    let end = start + manifest[start..].find(']').expect("the end of the members list");
    manifest[start..end]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The package name in a member's manifest (the first `name = "..."`, under `[package]`).
fn package_name(manifest: &str) -> String {
    manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("name = \"")?.strip_suffix('"').map(str::to_owned))
        .expect("a package name")
}

#[test]
fn every_workspace_member_has_a_row_in_the_architecture_map() {
    let root = root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = members(&manifest);
    assert!(members.len() > 10, "{members:?}");
    let map = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let rows: Vec<&str> = map.lines().filter(|l| l.trim_start().starts_with('|')).collect();
    let missing: Vec<String> = members
        .iter()
        .map(|m| package_name(&std::fs::read_to_string(root.join(m).join("Cargo.toml")).unwrap()))
        // A row of its own: the name in the first cell, not only mentioned in another's.
        .filter(|name| {
            !rows
                .iter()
                .any(|r| r.split('|').nth(1).map(str::trim) == Some(format!("`{name}`").as_str()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md has no table row naming {missing:?}"
    );
}

#[test]
fn the_members_list_is_read_whole() {
    assert_eq!(
        members("[workspace]\nmembers = [\"crates/a\", \"bins/b\",\n \"xtask\"]\n"),
        ["crates/a", "bins/b", "xtask"]
    );
    assert_eq!(
        package_name("[package]\nname = \"egress-x\"\nversion = \"1\"\n"),
        "egress-x"
    );
}

/// Every `.rs` file under the `src/` of `dir`'s crates (recursively).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target" && n != "tests") {
                sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") && path.components().any(|c| c.as_os_str() == "src") {
            out.push(path);
        }
    }
}

/// A source file over 700 lines says at its top why it is one file (`//! Long file: ...`).
#[test]
fn a_long_source_file_says_why() {
    let root = root();
    let mut files = Vec::new();
    for dir in ["crates", "bins", "xtask"] {
        sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "{} source files found", files.len());
    let unexplained: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).ok()?;
            let long = text.lines().count() > 700;
            let said = text.lines().take_while(|l| l.starts_with("//!")).any(|l| {
                l.strip_prefix("//! Long file: ")
                    .is_some_and(|why| why.trim().len() > 20)
            });
            (long && !said).then(|| f.strip_prefix(&root).unwrap_or(f).display().to_string())
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "over 700 lines with no `//! Long file:` reason: {unexplained:?}"
    );
}

/// The crates `-p package` pulls in as normal dependencies (build and dev dependencies left
/// out), by `cargo tree`.
fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none", "-p", package])
        .current_dir(root())
        .output()
        .expect("running cargo tree");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A tool that reuses the kvm, kvm2, gcp or local provider, the probe or the lease store
/// (docs/reuse.md) gets no Kubernetes client: none of them reaches kube or k8s-openapi through
/// any path.
#[test]
fn the_non_kubernetes_providers_pull_in_no_kubernetes_crate() {
    for package in [
        "egress-provider",
        "egress-provider-kvm",
        "egress-provider-kvm2",
        "egress-provider-gcp",
        "egress-provider-local",
        "egress-health",
        "egress-lease",
        "egress-lease-redis",
        "egress-discovery",
    ] {
        let deps = normal_dependencies(package);
        assert!(deps.iter().any(|d| d == package), "{package}: {deps:?}");
        let kubernetes: Vec<&String> = deps
            .iter()
            .filter(|d| d.starts_with("kube") || d.starts_with("k8s-"))
            .collect();
        assert!(kubernetes.is_empty(), "{package} pulls in {kubernetes:?}");
    }
    // The check can fail: the kubernetes provider does pull them in.
    let deps = normal_dependencies("egress-provider-kubernetes");
    assert!(deps.iter().any(|d| d == "kube") && deps.iter().any(|d| d == "k8s-openapi"));
}

/// The dependency table in docs/architecture.md is the manifests' (`cargo xtask map --check`,
/// which CI also runs on its own): an edge added or removed in a Cargo.toml without the table
/// fails here.
#[test]
fn the_dependency_table_matches_the_manifests() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_xtask"))
        .current_dir(root())
        .args(["map", "--check"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
