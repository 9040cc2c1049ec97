//! `kubectl get`, `apply -f` and `delete` against the server, with the kubectl this machine has.
//! Without kubectl on the PATH the test says it skipped and passes.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use egress_kube_testserver::TestServer;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;

fn kubectl_path() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
    })
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
    let Some(bin) = kubectl_path() else {
        println!("SKIPPED: no kubectl on PATH; kubectl_get_apply_and_delete did not run");
        return;
    };
    let s = TestServer::start().await.unwrap();
    let dir = std::env::temp_dir().join(format!("kts-kubectl-{}-{}", std::process::id(), s.addr().port()));
    std::fs::create_dir_all(&dir).unwrap();
    s.write_kubeconfig(&dir.join("kubeconfig")).unwrap();
    let k = Kubectl { bin, dir: dir.clone() };
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
