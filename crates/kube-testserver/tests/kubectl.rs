//! Real kubectl against the server, with the kubectl this machine has: `get`, `apply -f` and
//! `delete` of custom and built-in kinds; the imperative writes of built-in kinds (`create
//! secret|configmap|namespace`, sent as protobuf), `label`, `annotate`, every `patch --type`,
//! `apply --server-side`; and `describe` with the Events an operator writes through
//! events.k8s.io/v1. Without kubectl on the PATH a test says it skipped and passes, unless
//! EGRESS_REAL_BACKENDS_REQUIRED is set (as `cargo xtask test` sets it): then it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use egress_kube_testserver::TestServer;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;

/// A server with kubectl pointed at it through a kubeconfig in a scratch directory.
async fn with_kubectl(test: &str) -> Option<(TestServer, Kubectl)> {
    let bin = egress_testkit::on_path("kubectl", test)?;
    let s = TestServer::start().await.unwrap();
    let dir = egress_testkit::scratch_dir(&format!("kts-kubectl-{}", s.addr().port()));
    s.write_kubeconfig(&dir.join("kubeconfig")).unwrap();
    Some((s, Kubectl { bin, dir }))
}

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.kubectl.example.com
spec:
  group: kubectl.example.com
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1}
"#;

const OBJECTS: &str = r#"apiVersion: kubectl.example.com/v1
kind: Widget
metadata: {name: w1}
spec: {size: 3}
---
apiVersion: v1
kind: Secret
metadata: {name: s1}
stringData: {userdata: hello}
---
apiVersion: v1
kind: Pod
metadata: {name: p1, labels: {app: demo}}
spec:
  containers: [{name: c, image: busybox}]
"#;

struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    /// Runs kubectl and returns (success, stdout, stderr). kubectl runs on a blocking thread.
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .arg("--request-timeout=20s")
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("HOME", &self.dir);
        let out = within("kubectl", tokio::task::spawn_blocking(move || cmd.output()))
            .await
            .unwrap()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn kubectl_get_apply_and_delete() {
    let Some((s, k)) = with_kubectl("kubectl_get_apply_and_delete").await else {
        return;
    };
    let dir = k.dir.clone();
    let crd = write(&dir, "crd.yaml", CRD);
    let objects = write(&dir, "objects.yaml", OBJECTS);

    k.ok(&["apply", "-f", &crd]).await;
    let out = k.ok(&["apply", "-f", &objects]).await;
    assert!(out.contains("widget.kubectl.example.com/w1 created"), "{out}");
    assert!(
        out.contains("secret/s1 created") && out.contains("pod/p1 created"),
        "{out}"
    );

    // The objects are there for API clients too.
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kubectl.example.com", "v1", "Widget"), "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client(&s), "default", &ar);
    assert_eq!(widgets.get("w1").await.unwrap().data["spec"]["size"], 3);

    // get: the table with the printer column, by short name, and as JSON.
    let table = k.ok(&["get", "wd"]).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, vec!["NAME", "SIZE"], "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["w1", "3"]),
        "{table}"
    );
    let pods = k.ok(&["get", "pods", "-l", "app=demo", "-o", "name"]).await;
    assert_eq!(pods.trim(), "pod/p1");
    let json = k.ok(&["get", "secret", "s1", "-o", "json"]).await;
    let secret: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(secret["data"]["userdata"], "aGVsbG8=");

    // Applying the same file again changes nothing for the custom resource and the pod.
    let again = k.ok(&["apply", "-f", &objects]).await;
    assert!(again.contains("widget.kubectl.example.com/w1 unchanged"), "{again}");
    assert!(again.contains("pod/p1 unchanged"), "{again}");
    // A changed file is applied as a patch.
    let changed = write(&dir, "changed.yaml", &OBJECTS.replace("size: 3", "size: 5"));
    let out = k.ok(&["apply", "-f", &changed]).await;
    assert!(out.contains("widget.kubectl.example.com/w1 configured"), "{out}");
    assert_eq!(widgets.get("w1").await.unwrap().data["spec"]["size"], 5);
    // Server-side apply: the size client-side apply set belongs to another manager, so changing
    // it conflicts until forced.
    let (ok, _, err) = k.run(&["apply", "--server-side", "-f", &objects]).await;
    assert!(
        !ok && err.contains("Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using kubectl.example.com/v1: .spec.size"),
        "{err}"
    );
    let out = k
        .ok(&["apply", "--server-side", "--force-conflicts", "-f", &objects])
        .await;
    assert!(
        out.contains("widget.kubectl.example.com/w1 serverside-applied"),
        "{out}"
    );
    assert_eq!(widgets.get("w1").await.unwrap().data["spec"]["size"], 3);

    // An invalid object is refused with the server's message.
    let bad = write(
        &dir,
        "bad.yaml",
        "apiVersion: kubectl.example.com/v1\nkind: Widget\nmetadata: {name: w2}\nspec: {size: 0}\n",
    );
    let (ok, _, err) = k.run(&["apply", "-f", &bad]).await;
    assert!(!ok);
    assert!(err.contains("spec.size: Invalid value: 0"), "{err}");

    // delete
    let out = k.ok(&["delete", "-f", &objects]).await;
    assert!(out.contains("widget.kubectl.example.com \"w1\" deleted"), "{out}");
    assert!(widgets.get_opt("w1").await.unwrap().is_none());
    let (ok, _, err) = k.run(&["get", "pod", "p1"]).await;
    assert!(!ok && err.contains("pods \"p1\" not found"), "{err}");
    k.ok(&["delete", "-f", &crd]).await;
    let (ok, _, _) = k.run(&["get", "widgets"]).await;
    assert!(!ok, "the kind is gone with its CRD");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn kubectl_writes_built_in_kinds_as_it_does_against_a_cluster() {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
    let Some((s, k)) = with_kubectl("kubectl_writes_built_in_kinds_as_it_does_against_a_cluster").await else {
        return;
    };
    let secrets: Api<Secret> = Api::namespaced(client(&s), "default");
    let maps: Api<ConfigMap> = Api::namespaced(client(&s), "default");
    let namespaces: Api<Namespace> = Api::all(client(&s));

    // The typed creates kubectl sends as protobuf.
    let out = k
        .ok(&[
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=user=crawler",
            "--from-literal=pass=s3cret",
        ])
        .await;
    assert!(out.contains("secret/creds created"), "{out}");
    let secret = secrets.get("creds").await.unwrap();
    let data = secret.data.unwrap();
    assert_eq!(data["user"].0, b"crawler");
    assert_eq!(data["pass"].0, b"s3cret");
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    let out = k
        .ok(&[
            "create",
            "configmap",
            "settings",
            "--from-literal=mode=strict",
            "--from-literal=empty=",
        ])
        .await;
    assert!(out.contains("configmap/settings created"), "{out}");
    let data = maps.get("settings").await.unwrap().data.unwrap();
    assert_eq!((data["mode"].as_str(), data["empty"].as_str()), ("strict", ""));
    let out = k.ok(&["create", "namespace", "crawlers"]).await;
    assert!(out.contains("namespace/crawlers created"), "{out}");
    assert!(namespaces.get_opt("crawlers").await.unwrap().is_some());

    // label and annotate.
    k.ok(&["label", "secret", "creds", "team=crawl"]).await;
    k.ok(&["annotate", "configmap", "settings", "owner=platform"]).await;
    k.ok(&["label", "namespace", "crawlers", "egress.example.com/crawlers=true"])
        .await;
    assert_eq!(
        secrets.get("creds").await.unwrap().metadata.labels.unwrap()["team"],
        "crawl"
    );
    assert_eq!(
        maps.get("settings").await.unwrap().metadata.annotations.unwrap()["owner"],
        "platform"
    );
    let listed = k
        .ok(&[
            "get",
            "namespaces",
            "-l",
            "egress.example.com/crawlers=true",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(listed.trim(), "namespace/crawlers");

    // Every patch type.
    k.ok(&[
        "patch",
        "configmap",
        "settings",
        "--type=merge",
        "-p",
        r#"{"data":{"merge":"1"}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "configmap",
        "settings",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/data/json","value":"2"}]"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "configmap",
        "settings",
        "--type=strategic",
        "-p",
        r#"{"data":{"strategic":"3"}}"#,
    ])
    .await;
    let data = maps.get("settings").await.unwrap().data.unwrap();
    assert_eq!(
        (
            data["mode"].as_str(),
            data["merge"].as_str(),
            data["json"].as_str(),
            data["strategic"].as_str()
        ),
        ("strict", "1", "2", "3")
    );
    // A JSON patch whose test fails changes nothing.
    let (ok, _, err) = k
        .run(&[
            "patch",
            "configmap",
            "settings",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/data/mode","value":"lax"},{"op":"remove","path":"/data/mode"}]"#,
        ])
        .await;
    assert!(!ok, "a failed test op must fail the patch: {err}");
    assert_eq!(maps.get("settings").await.unwrap().data.unwrap()["mode"], "strict");

    // Server-side apply of a built-in kind, then again with a change.
    let applied = write(
        &k.dir,
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied}\ndata: {a: \"1\"}\n",
    );
    let out = k.ok(&["apply", "--server-side", "-f", &applied]).await;
    assert!(out.contains("configmap/applied serverside-applied"), "{out}");
    let changed = write(
        &k.dir,
        "cm2.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied}\ndata: {a: \"2\"}\n",
    );
    k.ok(&["apply", "--server-side", "-f", &changed]).await;
    let cm = maps.get("applied").await.unwrap();
    assert_eq!(cm.data.unwrap()["a"], "2");
    let managers: Vec<String> = cm
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.manager)
        .collect();
    assert_eq!(managers, vec!["kubectl".to_owned()]);

    // describe reads what was written.
    let described = k.ok(&["describe", "configmap", "settings"]).await;
    assert!(
        described.contains("owner: platform") && described.contains("strict"),
        "{described}"
    );
    let described = k.ok(&["describe", "secret", "creds"]).await;
    assert!(
        described.contains("team=crawl") && described.contains("pass:  6 bytes"),
        "{described}"
    );

    // delete.
    k.ok(&["delete", "secret", "creds"]).await;
    k.ok(&["delete", "configmap", "settings", "applied"]).await;
    k.ok(&["delete", "namespace", "crawlers"]).await;
    assert!(secrets.get_opt("creds").await.unwrap().is_none());
    assert!(maps.list(&Default::default()).await.unwrap().items.is_empty());
    assert!(namespaces.get_opt("crawlers").await.unwrap().is_none());
    std::fs::remove_dir_all(&k.dir).unwrap();
}

#[tokio::test]
async fn kubectl_describe_shows_events_written_through_events_k8s_io() {
    use k8s_openapi::api::events::v1::Event;
    let Some((s, k)) = with_kubectl("kubectl_describe_shows_events_written_through_events_k8s_io").await else {
        return;
    };
    let crd = write(&k.dir, "crd.yaml", CRD);
    k.ok(&["apply", "-f", &crd]).await;
    let widget = write(
        &k.dir,
        "w.yaml",
        "apiVersion: kubectl.example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3}\n",
    );
    k.ok(&["apply", "-f", &widget]).await;
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kubectl.example.com", "v1", "Widget"), "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client(&s), "default", &ar);
    let w = widgets.get("w1").await.unwrap();
    // Events as an operator publishes them (events.k8s.io/v1, as kube's clients do), one on
    // another Widget that describe must not show.
    let events: Api<Event> = Api::namespaced(client(&s), "default");
    let reference = |name: &str, uid: Option<String>| k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("kubectl.example.com/v1".into()),
        kind: Some("Widget".into()),
        name: Some(name.into()),
        namespace: Some("default".into()),
        uid,
        ..Default::default()
    };
    for (n, (reason, note, regarding)) in [
        (
            "Created",
            "created instance demo/1",
            reference("w1", w.metadata.uid.clone()),
        ),
        (
            "Ready",
            "the widget carries traffic",
            reference("w1", w.metadata.uid.clone()),
        ),
        ("Elsewhere", "not about w1", reference("w2", Some("other-uid".into()))),
    ]
    .into_iter()
    .enumerate()
    {
        let event = Event {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("w.{n}")),
                ..Default::default()
            },
            event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now(),
            )),
            type_: Some("Normal".into()),
            reason: Some(reason.into()),
            note: Some(note.into()),
            action: Some("Reconcile".into()),
            regarding: Some(regarding),
            reporting_controller: Some("widget-operator".into()),
            reporting_instance: Some("widget-operator-0".into()),
            ..Default::default()
        };
        events.create(&kube::api::PostParams::default(), &event).await.unwrap();
    }
    let described = k.ok(&["describe", "widget", "w1"]).await;
    let table: Vec<&str> = described.lines().skip_while(|l| !l.starts_with("Events:")).collect();
    let row = |reason: &str| {
        table
            .iter()
            .find(|l| l.split_whitespace().nth(1) == Some(reason))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
    };
    let created = row("Created").unwrap_or_else(|| panic!("no Created event in:\n{described}"));
    assert_eq!(created[0], "Normal");
    assert!(created.contains(&"widget-operator"), "{created:?}");
    assert!(described.contains("created instance demo/1"), "{described}");
    assert!(row("Ready").is_some(), "{described}");
    assert!(row("Elsewhere").is_none(), "another object's event shown:\n{described}");
    // And kubectl get events lists all three, through the core API.
    let listed = k.ok(&["get", "events", "-o", "name"]).await;
    assert_eq!(listed.lines().count(), 3, "{listed}");
    std::fs::remove_dir_all(&k.dir).unwrap();
}

const SCALABLE: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: fleets.kubectl.example.com
spec:
  group: kubectl.example.com
  scope: Namespaced
  names: {kind: Fleet, plural: fleets, singular: fleet}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              replicas: {type: integer, minimum: 0, maximum: 10}
          status:
            type: object
            properties:
              replicas: {type: integer}
              selector: {type: string}
"#;

#[tokio::test]
async fn kubectl_scale_writes_through_the_scale_subresource() {
    let Some((s, k)) = with_kubectl("kubectl_scale_writes_through_the_scale_subresource").await else {
        return;
    };
    let crd = write(&k.dir, "fleet-crd.yaml", SCALABLE);
    k.ok(&["apply", "-f", &crd]).await;
    let fleet = write(
        &k.dir,
        "fleet.yaml",
        "apiVersion: kubectl.example.com/v1\nkind: Fleet\nmetadata: {name: f1}\nspec: {replicas: 2}\n",
    );
    k.ok(&["apply", "-f", &fleet]).await;
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kubectl.example.com", "v1", "Fleet"), "fleets");
    let fleets: Api<DynamicObject> = Api::namespaced_with(client(&s), "default", &ar);
    let status = kube::api::Patch::Merge(serde_json::json!({"status": {"replicas": 2, "selector": "fleet=f1"}}));
    fleets
        .patch_status("f1", &kube::api::PatchParams::default(), &status)
        .await
        .unwrap();

    // The Scale, as an HPA reads it.
    let scale = fleets.get_scale("f1").await.unwrap();
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(2));
    let status = scale.status.unwrap();
    assert_eq!((status.replicas, status.selector.as_deref()), (2, Some("fleet=f1")));

    // kubectl scale: the spec path moves, with the generation, as a spec change does.
    let before = fleets.get("f1").await.unwrap().metadata.generation.unwrap();
    let out = k.ok(&["scale", "fleet", "f1", "--replicas=5"]).await;
    assert!(out.contains("fleet.kubectl.example.com/f1 scaled"), "{out}");
    let after = fleets.get("f1").await.unwrap();
    assert_eq!(after.data["spec"]["replicas"], 5);
    assert_eq!(after.metadata.generation, Some(before + 1));
    assert_eq!(
        after.data["status"]["replicas"], 2,
        "the status is not written through the Scale"
    );

    // The object's schema holds for a write through the Scale.
    let (ok, _, err) = k.run(&["scale", "fleet", "f1", "--replicas=11"]).await;
    assert!(!ok, "a replica count over the schema's maximum is refused");
    assert!(err.contains("spec.replicas"), "{err}");
    // A precondition kubectl checks against the Scale it reads.
    let (ok, _, err) = k
        .run(&["scale", "fleet", "f1", "--current-replicas=3", "--replicas=1"])
        .await;
    assert!(!ok && err.contains("Expected replicas to be 3, was 5"), "{err}");
    k.ok(&["scale", "fleet", "f1", "--current-replicas=5", "--replicas=0"])
        .await;
    assert_eq!(fleets.get("f1").await.unwrap().data["spec"]["replicas"], 0);
    // Discovery names the subresource, so `kubectl scale` finds it.
    let resources = k
        .ok(&["api-resources", "--api-group=kubectl.example.com", "-o", "name"])
        .await;
    assert!(resources.contains("fleets"), "{resources}");
}
