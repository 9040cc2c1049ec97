//! The `list_pods` example is what a tool that reuses this crate does: it runs here against
//! `egress-kube-testserver` through a kubeconfig file (`KUBECONFIG`), with nothing of the
//! operator around it. Not covered: a real API server's authentication and RBAC.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use egress_kube_testserver::TestServer;
use egress_provider::{LABEL_MANAGED, LABEL_UID};
use egress_testkit::ScratchDir;
use egress_testkit::examples::{example_binary, run_example, succeeded};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

/// Longer than the example's own list deadline.
const PATIENCE: Duration = Duration::from_secs(120);

/// A Pod named `name` in `namespace` with `labels`.
fn pod(namespace: &str, name: &str, labels: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "squid".to_owned(),
                image: Some("ubuntu/squid".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// A server holding a managed Pod in `crawl` and in `other`, and one Pod that is not ours.
async fn server_with_pods() -> TestServer {
    let server = TestServer::builder()
        .namespace("crawl")
        .namespace("other")
        .start()
        .await
        .expect("test server");
    let client = server.client().expect("a client");
    for (namespace, name, labels) in [
        (
            "crawl",
            "proxy-listed",
            vec![(LABEL_MANAGED, "true"), (LABEL_UID, "uid-listed")],
        ),
        (
            "other",
            "proxy-elsewhere",
            vec![(LABEL_MANAGED, "true"), (LABEL_UID, "uid-elsewhere")],
        ),
        ("crawl", "not-ours", vec![("app", "web")]),
    ] {
        Api::<Pod>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &pod(namespace, name, &labels))
            .await
            .expect("seeding a pod");
    }
    server
}

/// Runs the example with a kubeconfig for `server` and `args`, off the runtime's threads.
async fn list_pods(server: &TestServer, args: &[&str]) -> Vec<String> {
    let scratch = ScratchDir::new("list-pods");
    let kubeconfig = scratch.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("writing the kubeconfig");
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        run_example(
            Command::new(example_binary("list_pods"))
                .args(&args)
                .env("KUBECONFIG", &kubeconfig),
            PATIENCE,
        )
    })
    .await
    .expect("the example's thread");
    succeeded(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_pods_example_lists_the_managed_pods_of_every_namespace() {
    let server = server_with_pods().await;
    let lines = list_pods(&server, &[]).await;
    let stdout = lines.join("\n");
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("proxy-listed") && l.ends_with("uid=uid-listed")),
        "{stdout}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("proxy-elsewhere") && l.ends_with("uid=uid-elsewhere")),
        "{stdout}"
    );
    assert!(!stdout.contains("not-ours"), "{stdout}");
    assert_eq!(lines[2], "2 managed pods", "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_pods_example_keeps_to_the_namespace_it_is_given() {
    let server = server_with_pods().await;
    let lines = list_pods(&server, &["crawl"]).await;
    let stdout = lines.join("\n");
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].contains("proxy-listed"), "{stdout}");
    assert_eq!(lines[1], "1 managed pods", "{stdout}");
}
