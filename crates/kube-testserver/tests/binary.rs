//! The `egress-kube-testserver` binary: starts, installs CRDs from files, writes a kubeconfig,
//! serves, and refuses a broken CRD file with a clear message.

mod common;

use common::*;
use egress_testkit::scratch_dir;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: things.bin.example.com}
spec:
  group: bin.example.com
  scope: Namespaced
  names: {kind: Thing, plural: things}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
";

#[tokio::test]
async fn the_binary_serves_with_its_crds_and_kubeconfig() {
    let dir = scratch_dir("kts-bin-ok");
    std::fs::write(dir.join("thing.yaml"), CRD).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_egress-kube-testserver"))
        .args(["--port", "0", "--namespace", "work", "--crds"])
        .arg(&dir)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = within("the listening line", lines.next_line()).await.unwrap().unwrap();
    assert!(
        first.starts_with("egress-kube-testserver listening on http://127.0.0.1:"),
        "{first}"
    );
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("bin.example.com", "v1", "Thing"), "things");
    let things: Api<DynamicObject> = Api::namespaced_with(client, "work", &ar);
    let thing: DynamicObject = serde_json::from_value(serde_json::json!({"apiVersion": "bin.example.com/v1",
        "kind": "Thing", "metadata": {"name": "t"}, "anything": {"goes": true}}))
    .unwrap();
    within("create", things.create(&PostParams::default(), &thing))
        .await
        .unwrap();
    assert_eq!(things.get("t").await.unwrap().data["anything"]["goes"], true);
    child.kill().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn the_binary_refuses_a_broken_crd_file() {
    let dir = scratch_dir("kts-bin-bad");
    let file = dir.join("broken.yaml");
    std::fs::write(
        &file,
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: x}\nspec: {group: g\n",
    )
    .unwrap();
    let out = within(
        "the binary to exit",
        Command::new(env!("CARGO_BIN_EXE_egress-kube-testserver"))
            .arg("--crds")
            .arg(&file)
            .output(),
    )
    .await
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broken.yaml"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
