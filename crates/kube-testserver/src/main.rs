//! `egress-kube-testserver`: the in-memory API server as a process, for local runs of the
//! operator (the coming `cargo xtask dev`) and for pointing `kubectl` at. Not a cluster: see
//! docs/testing.md.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use egress_kube_testserver::TestServer;
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "An in-memory Kubernetes API server for tests and local runs (not a cluster)."
)]
struct Args {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where to write a kubeconfig pointing at the server.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// CustomResourceDefinition YAML files (or directories of them) to install at start.
    #[arg(long = "crds")]
    crds: Vec<PathBuf>,
    /// Namespaces to create at start.
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
}

fn crd_files(path: &PathBuf) -> anyhow::Result<Vec<PathBuf>> {
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            // A kustomize directory of CRDs (deploy/crds) also holds its kustomization.
            .filter(|p| p.file_stem().is_none_or(|s| s != "kustomization"))
            .collect();
        files.sort();
        Ok(files)
    } else {
        Ok(vec![path.clone()])
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let mut builder = TestServer::builder().port(args.port);
    for path in &args.crds {
        for file in crd_files(path)? {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let crd: Value = serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
            builder = builder.crd_json(crd);
        }
    }
    for ns in &args.namespaces {
        builder = builder.namespace(ns);
    }
    let server = builder.start().await?;
    if let Some(path) = &args.kubeconfig {
        server
            .write_kubeconfig(path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("egress-kube-testserver listening on {}", server.url());
    if let Some(path) = &args.kubeconfig {
        println!("kubeconfig written to {}", path.display());
    }
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    server.shutdown().await;
    Ok(())
}
