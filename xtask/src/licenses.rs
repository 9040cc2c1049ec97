//! `cargo xtask licenses [--check]`: `deploy/licenses/rust-crates.tsv`, the Rust crates the
//! image ships (every crate the two binaries link, from `Cargo.lock` as cargo resolves it for
//! Linux on x86_64), each with its version, licence expression and source. The image carries
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
    let want = render(&shipped_crates(&metadata(root)?)?);
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
}
