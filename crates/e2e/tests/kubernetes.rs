//! The shipped binary with a `kubernetes` entry: the provider builds its own client from the
//! same kubeconfig, and its health check (one list of managed Pods) turns the entry's
//! ProviderHealth Ready.

mod common;

use common::{Cluster, Operator, cluster, operator_binary, wait_target_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_entry_is_built_and_checked() {
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("kubernetes-entry", "providers:\n  - name: pods\n    type: kubernetes\n").await;
    let flags = [
        providers_flag,
        "--health-probe-bind-address=0".into(),
        "--zap-encoder=json".into(),
        "--discovery-addr=127.0.0.1:0".into(),
        "--discovery-tls=off".into(),
        "--provider-check-interval=10s".into(),
    ];
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut op = Operator::start(&operator_binary(), &args, &[("KUBECONFIG", kubeconfig.as_str())]);
    let ready = op.wait_msg("Providers ready");
    assert_eq!(ready["providers"], "[\"pods\"]", "{ready}");
    wait_target_ready(&server, "pods", "apiserver").await;
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}
