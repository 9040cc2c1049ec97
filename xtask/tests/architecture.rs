//! docs/architecture.md is the map from the README to every behaviour: each workspace member
//! must have a row in one of its tables, so a crate added or renamed without updating the map
//! fails here; its dependency table is the manifests'; and its "Long files" table lists exactly
//! the files over 700 lines, each with its reason.

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

/// Every `.rs` file under `dir` (recursively: sources, tests, examples, build scripts alike),
/// build output left out.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file longer than this is listed in docs/architecture.md with its reason.
const LONG: usize = 700;

/// The rows of the table under `## Long files` in docs/architecture.md: the path (the first
/// cell, in backticks) and the reason (the second).
fn long_files_listed(map: &str) -> Vec<(String, String)> {
    let Some(section) = map.split("\n## ").find(|s| s.starts_with("Long files\n")) else {
        return Vec::new();
    };
    section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim().strip_prefix('|')?.strip_suffix('|')?.split('|').collect();
            let path = cells.first()?.trim().strip_prefix('`')?.strip_suffix('`')?;
            Some((path.to_owned(), cells.get(1).map_or("", |r| r.trim()).to_owned()))
        })
        .collect()
}

#[test]
fn the_long_files_table_is_read_from_its_section_alone() {
    let map = "# Map\n\n| `elsewhere.rs` | a table of another section |\n\n## Long files\n\n\
               | File | Why it is one file |\n|---|---|\n| `a/b.rs` | one table, read whole |\n\
               | `c.rs` |  |\n\n## Next\n\n| `d.rs` | not a long file |\n";
    assert_eq!(
        long_files_listed(map),
        [
            ("a/b.rs".to_owned(), "one table, read whole".to_owned()),
            ("c.rs".to_owned(), String::new())
        ]
    );
    assert!(long_files_listed("# Map\n\n| `a.rs` | no section |\n").is_empty());
}

/// Every file over [`LONG`] lines in crates/, bins/ and xtask/ (tests and examples included) has
/// a row with its reason under "Long files" in docs/architecture.md, and every row names a file
/// that is still that long: the list is the one place a long file is explained, and it stays
/// true.
#[test]
fn every_file_over_700_lines_is_listed_with_its_reason_and_only_those() {
    let root = root();
    let map = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let listed = long_files_listed(&map);
    assert!(
        !listed.is_empty(),
        "no table under \"## Long files\" in docs/architecture.md"
    );
    let mut files = Vec::new();
    for dir in ["crates", "bins", "xtask"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "{} .rs files found", files.len());
    let lines_of = |path: &Path| std::fs::read_to_string(path).ok().map(|t| t.lines().count());
    let mut problems = Vec::new();
    for file in &files {
        let path = file.strip_prefix(&root).unwrap_or(file).display().to_string();
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let lines = text.lines().count();
        if lines > LONG && !listed.iter().any(|(p, _)| *p == path) {
            problems.push(format!(
                "{path} has {lines} lines, over {LONG}: split it (a file past ~600 lines becomes a \
                 folder, one concept a file), or add this row, with the reason, to the table under \
                 \"## Long files\" in docs/architecture.md: | `{path}` | <why it is one file> |"
            ));
        }
        if text.lines().any(|l| l.starts_with("//! Long file:")) {
            problems.push(format!(
                "{path} explains its length in a `//! Long file:` comment: put the reason in its \
                 row under \"## Long files\" in docs/architecture.md and delete the comment"
            ));
        }
    }
    for (i, (path, reason)) in listed.iter().enumerate() {
        match lines_of(&root.join(path)) {
            None => problems.push(format!(
                "\"## Long files\" in docs/architecture.md lists {path}, which does not exist: \
                 delete its row, or correct the path if the file moved"
            )),
            Some(lines) if lines <= LONG => problems.push(format!(
                "\"## Long files\" in docs/architecture.md lists {path}, which has {lines} lines \
                 now, not over {LONG}: delete its row"
            )),
            Some(_) => {}
        }
        if reason.len() < 20 {
            problems.push(format!(
                "\"## Long files\" in docs/architecture.md gives {path} no reason ({reason:?}): \
                 say in its second cell why it is one file"
            ));
        }
        if listed[..i].iter().any(|(p, _)| p == path) {
            problems.push(format!(
                "\"## Long files\" in docs/architecture.md lists {path} twice: keep one row"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
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
