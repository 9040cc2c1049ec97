//! `cargo xtask licenses [--check]`: `deploy/licenses/rust-crates.tsv`, the Rust crates the
//! image ships (every crate the two binaries link, from `Cargo.lock` as cargo resolves it for
//! those two packages on Linux on x86_64, so a test-only feature adds nothing), each with its
//! version, licence expression and source. The image carries
//! the file beside Debian's copyright files; `--check` fails when it is stale, as CI runs it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Where the list is kept, from the repository root.
pub(crate) const FILE: &str = "deploy/licenses/rust-crates.tsv";

/// The packages whose binaries the image ships.
const SHIPPED: &[&str] = &["egress-operator", "egress-gateway-bin"];

pub(crate) fn run(root: &Path, check: bool) -> Result<()> {
    let linked = linked(root)?;
    let crates = shipped_crates(&metadata(root)?)?
        .into_iter()
        .filter(|c| linked.contains(&(c.name.clone(), c.version.clone())))
        .collect();
    let want = render(&crates);
    let path = root.join(FILE);
    if check {
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            bail!("{FILE} is stale: run cargo xtask licenses");
        }
        return Ok(());
    }
    std::fs::create_dir_all(path.parent().context("the list's directory")?)?;
    std::fs::write(&path, want).with_context(|| format!("writing {FILE}"))?;
    println!("xtask: wrote {FILE}");
    Ok(())
}

/// `cargo metadata` with the dependency graph as built for the image's platform (contacts
/// nothing: Cargo.lock is the answer).
fn metadata(root: &Path) -> Result<Value> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", "x86_64-unknown-linux-gnu"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).context("reading cargo metadata's answer")
}

/// The crates (name, version) the shipped binaries link, as `cargo tree` resolves them for
/// those packages alone: `cargo metadata` resolves the whole workspace, where a test's feature
/// (egress-geoip's `testing`, say) adds crates no shipped binary links.
fn linked(root: &Path) -> Result<BTreeSet<(String, String)>> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root)
        .args(["tree", "--locked", "--offline", "-e", "normal"]);
    for package in SHIPPED {
        cmd.args(["-p", package]);
    }
    let out = cmd
        .args(["--target", "x86_64-unknown-linux-gnu", "--prefix", "none", "-f", "{p}"])
        .output()
        .context("running cargo tree")?;
    if !out.status.success() {
        bail!("cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(tree_crates(&String::from_utf8_lossy(&out.stdout)))
}

/// (name, version) of each line of `cargo tree --prefix none -f {p}`: `tokio v1.0.0 (*)`.
fn tree_crates(tree: &str) -> BTreeSet<(String, String)> {
    tree.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            let version = words.next()?.strip_prefix('v')?;
            Some((name.to_owned(), version.to_owned()))
        })
        .collect()
}

/// One shipped crate.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Crate {
    name: String,
    version: String,
    license: String,
    source: String,
}

/// Every crate the shipped binaries link: the closure of their packages over normal
/// dependencies (build scripts and proc macros run at build time and ship nothing, but their
/// normal dependencies are followed as cargo records them, which errs on the side of listing).
fn shipped_crates(metadata: &Value) -> Result<BTreeSet<Crate>> {
    let packages: BTreeMap<&str, &Value> = metadata["packages"]
        .as_array()
        .context("no packages in cargo metadata")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .context("no resolve graph in cargo metadata")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let mut todo: Vec<&str> = packages
        .iter()
        .filter(|(_, p)| p["name"].as_str().is_some_and(|n| SHIPPED.contains(&n)))
        .map(|(id, _)| *id)
        .collect();
    if todo.len() != SHIPPED.len() {
        bail!("cargo metadata lacks one of {SHIPPED:?}");
    }
    let mut seen = BTreeSet::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        todo.extend(nodes.get(id).into_iter().flat_map(|n| normal_dependencies(n)));
    }
    Ok(seen
        .into_iter()
        .filter_map(|id| packages.get(id))
        .map(|p| Crate {
            name: text(p, "name"),
            version: text(p, "version"),
            license: text(p, "license"),
            source: p["source"].as_str().unwrap_or("this repository").to_owned(),
        })
        .collect())
}

/// The ids a resolve node depends on at run time (a `null` kind).
fn normal_dependencies(node: &Value) -> impl Iterator<Item = &str> {
    node["deps"].as_array().into_iter().flatten().filter_map(|d| {
        let normal = d["dep_kinds"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()));
        normal.then(|| d["pkg"].as_str()).flatten()
    })
}

fn text(package: &Value, field: &str) -> String {
    package[field].as_str().unwrap_or("unknown").to_owned()
}

/// The file: a header, then one tab-separated line per crate.
fn render(crates: &BTreeSet<Crate>) -> String {
    let mut out = String::from(
        "# The Rust crates in the egress-operator and egress-gateway binaries, from Cargo.lock\n\
         # (cargo xtask licenses writes this file; CI checks it is current).\n\
         # name\tversion\tlicense\tsource\n",
    );
    for c in crates {
        out.push_str(&format!("{}\t{}\t{}\t{}\n", c.name, c.version, c.license, c.source));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closure_follows_normal_dependencies_only() {
        let metadata = serde_json::json!({
            "packages": [
                {"id": "op", "name": "egress-operator", "version": "0.1.0", "license": "Apache-2.0"},
                {"id": "gw", "name": "egress-gateway-bin", "version": "0.1.0", "license": "Apache-2.0"},
                {"id": "lib", "name": "tokio", "version": "1.0.0", "license": "MIT", "source": "registry+x"},
                {"id": "dev", "name": "proptest", "version": "1.0.0", "license": "MIT", "source": "registry+x"},
            ],
            "resolve": {"nodes": [
                {"id": "op", "deps": [
                    {"pkg": "lib", "dep_kinds": [{"kind": null}]},
                    {"pkg": "dev", "dep_kinds": [{"kind": "dev"}]},
                ]},
                {"id": "gw", "deps": []},
                {"id": "lib", "deps": []},
                {"id": "dev", "deps": []},
            ]},
        });
        let names: Vec<String> = shipped_crates(&metadata).unwrap().into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["egress-gateway-bin", "egress-operator", "tokio"]);
        let text = render(&shipped_crates(&metadata).unwrap());
        assert!(text.ends_with("tokio\t1.0.0\tMIT\tregistry+x\n"), "{text}");
    }

    #[test]
    fn cargo_trees_lines_give_name_and_version_once() {
        let tree = "egress-operator v0.1.0 (/src/bins/egress-operator)\ntokio v1.48.0\ntokio v1.48.0 (*)\n\nserde v1.0.228 (proc-macro)\n";
        let crates: Vec<(String, String)> = tree_crates(tree).into_iter().collect();
        assert_eq!(
            crates,
            [
                ("egress-operator".to_owned(), "0.1.0".to_owned()),
                ("serde".to_owned(), "1.0.228".to_owned()),
                ("tokio".to_owned(), "1.48.0".to_owned()),
            ]
        );
    }
}
