//! The kubernetes provider in a tool of its own, without the operator: builds the provider from
//! a config block and lists the proxy Pods it manages in the cluster the kubeconfig names (every
//! namespace, or only the one given): one line each with its id, state, address and UID mark,
//! then a count.
//!
//! ```sh
//! cargo run -p egress-provider-kubernetes --example list_pods
//! KUBECONFIG=~/.kube/staging cargo run -p egress-provider-kubernetes --example list_pods -- crawl
//! ```
//!
//! The client is found as the operator finds it: `KUBECONFIG`, `~/.kube/config`, or the
//! in-cluster service account. It needs `list` on Pods (cluster-wide, or in the namespace).
//! Changes nothing. Exits non-zero, naming the step, when anything fails; the list has a
//! deadline.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use egress_provider::config::{Block, ProviderConfig};
use egress_provider::{Instance, OpCtx};
use egress_provider_kubernetes::KubernetesConfig;

/// One list call, with kube's connection set-up.
const LIST_PATIENCE: Duration = Duration::from_secs(60);

// The provider's constructor loads the kubeconfig inside the runtime it is called from, which
// must therefore be multi-threaded (tokio's default for `main`).
#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("list_pods: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let namespace = args.next();
    if let Some(extra) = args.next() {
        return Err(format!("one namespace only (also got {extra:?})"));
    }
    // The block as a providers file would give it, checked by the rules the operator applies.
    let block = KubernetesConfig {
        namespace,
        ..KubernetesConfig::default()
    };
    KubernetesConfig::validate(egress_provider_kubernetes::TYPE_NAME, Some(&block))
        .map_err(|e| format!("the config block: {e}"))?;
    let entry = ProviderConfig::new("kubernetes-example", egress_provider_kubernetes::TYPE_NAME).with_block(&block);
    let provider = egress_provider_kubernetes::construct(&entry).map_err(|e| format!("building the provider: {e}"))?;

    let cx = OpCtx::background().with_deadline((Instant::now() + LIST_PATIENCE).into());
    let pods = provider.list_by_tag(&cx).await.map_err(|e| format!("list: {e}"))?;
    for pod in &pods {
        println!("{}", line(pod));
    }
    println!("{} managed pods", pods.len());
    Ok(())
}

/// One Pod: `<id> <state> <address or -> uid=<mark>`.
fn line(pod: &Instance) -> String {
    let ip = pod.ip.map_or_else(|| "-".to_owned(), |ip| ip.to_string());
    format!("{} {:?} {ip} uid={}", pod.id.as_str(), pod.state, pod.uid)
}
