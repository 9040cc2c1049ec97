//! The rendered install made runnable by `podman kube play` on this machine: only what a real
//! cluster would inject and this machine lacks, and what podman 4.3 does not do as the kubelet
//! does. Everything else (the image, args, security contexts, mounts' paths, the ConfigMap) runs
//! as rendered. Each change says why.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

/// Where this machine keeps what the cluster would give the Pod.
pub(crate) struct HostSide {
    /// A directory holding `kubeconfig`, for the test API server: in place of the service
    /// account a cluster mounts.
    pub(crate) kubeconfig_dir: PathBuf,
    /// Per Secret the Deployment mounts, the directory holding its files, laid out as the
    /// kubelet lays out a Secret volume.
    pub(crate) secrets: BTreeMap<String, PathBuf>,
}

/// Where the kubeconfig is mounted in the container.
const KUBECONFIG_MOUNT: &str = "/var/run/egress-test";

/// The manager's Deployment `deployment` and the ConfigMaps of `rendered`, changed for podman.
///
/// # Panics
/// When the Deployment is missing, or mounts a Secret `host` has no directory for.
pub(crate) fn documents(rendered: &[Value], deployment: &str, host: &HostSide) -> Vec<Value> {
    let mut manager = rendered
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == deployment)
        .unwrap_or_else(|| panic!("no Deployment {deployment} rendered"))
        .clone();
    adapt(&mut manager, host);
    let config_maps = rendered.iter().filter(|d| d["kind"] == "ConfigMap").cloned();
    config_maps.chain(std::iter::once(manager)).collect()
}

fn adapt(deployment: &mut Value, host: &HostSide) {
    let namespace = deployment["metadata"]["namespace"].clone();
    let pod = &mut deployment["spec"]["template"]["spec"];
    // The test API server and the hypervisor are on this machine's loopback: the Pod shares
    // the host's network. podman refuses port mappings then; the process binds its ports itself.
    pod["hostNetwork"] = json!(true);
    let container = &mut pod["containers"][0];
    if let Some(c) = container.as_object_mut() {
        c.remove("ports");
    }
    // podman 4.3 knows `metadata.name` among the downward API's fields, not
    // `metadata.namespace`: the value the kubelet would give.
    for var in container["env"].as_array_mut().into_iter().flatten() {
        if var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace" {
            *var = json!({"name": var["name"], "value": namespace});
        }
    }
    push(
        &mut container["env"],
        json!({"name": "KUBECONFIG", "value": format!("{KUBECONFIG_MOUNT}/kubeconfig")}),
    );
    push(
        &mut container["volumeMounts"],
        json!({"name": "test-kubeconfig", "mountPath": KUBECONFIG_MOUNT, "readOnly": true}),
    );
    writable_parents_of_nested_mounts(container);
    push(
        &mut pod["volumes"],
        json!({"name": "test-kubeconfig", "hostPath": {"path": host.kubeconfig_dir, "type": "Directory"}}),
    );
    for volume in pod["volumes"].as_array_mut().into_iter().flatten() {
        secret_as_host_directory(volume, host);
    }
}

/// The kubelet makes the mount point of a volume nested in a ConfigMap volume inside that
/// volume itself, read-only as it is; podman can only when the outer mount is writable. Only
/// the mount's flag changes: what the manager writes there is nothing, and it runs as non-root
/// on the ConfigMap volume's files all the same.
fn writable_parents_of_nested_mounts(container: &mut Value) {
    let paths: Vec<String> = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["mountPath"].as_str().map(str::to_owned))
        .collect();
    for mount in container["volumeMounts"].as_array_mut().into_iter().flatten() {
        let Some(path) = mount["mountPath"].as_str().map(str::to_owned) else {
            continue;
        };
        let prefix = format!("{}/", path.trim_end_matches('/'));
        if paths.iter().any(|p| p.starts_with(&prefix)) {
            mount["readOnly"] = json!(false);
        }
    }
}

/// podman 4.3 panics on a Secret volume without `optional`, and mounts nothing with it: the
/// Secret's files come from a host directory the test fills as the kubelet would (mode and
/// group as `defaultMode` and `fsGroup` ask), which also lets the test rotate them the
/// kubelet's way (podman copies a Secret volume once).
fn secret_as_host_directory(volume: &mut Value, host: &HostSide) {
    let Some(name) = volume["secret"]["secretName"].as_str().map(str::to_owned) else {
        return;
    };
    let dir = host
        .secrets
        .get(&name)
        .unwrap_or_else(|| panic!("the Deployment mounts Secret {name}, which the test does not provide"));
    *volume = json!({"name": volume["name"], "hostPath": {"path": dir, "type": "Directory"}});
}

fn push(list: &mut Value, item: Value) {
    if !list.is_array() {
        *list = json!([]);
    }
    list.as_array_mut().expect("an array").push(item);
}

/// The documents as one file `podman kube play` reads (JSON is YAML).
pub(crate) fn file_text(documents: &[Value]) -> String {
    documents
        .iter()
        .map(|d| serde_json::to_string_pretty(d).expect("JSON"))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_podman_lacks_changes() {
        let rendered = vec![
            json!({"kind": "ConfigMap", "metadata": {"name": "cfg-abc"}}),
            json!({"kind": "Deployment", "metadata": {"name": "m", "namespace": "ns"}, "spec": {"template": {"spec": {
                "securityContext": {"runAsUser": 65532},
                "containers": [{"name": "manager", "image": "img", "ports": [{"containerPort": 8090}],
                    "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                    "volumeMounts": [
                        {"name": "cfg", "mountPath": "/etc/p", "readOnly": true},
                        {"name": "tok", "mountPath": "/etc/p/token", "readOnly": true},
                        {"name": "tmp", "mountPath": "/tmp"}]}],
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "cfg-abc"}},
                    {"name": "tok", "secret": {"secretName": "token", "defaultMode": 288}}]}}}}),
        ];
        let host = HostSide {
            kubeconfig_dir: "/k".into(),
            secrets: [("token".to_owned(), PathBuf::from("/t"))].into(),
        };
        let docs = documents(&rendered, "m", &host);
        assert_eq!(docs[0]["metadata"]["name"], "cfg-abc");
        let pod = &docs[1]["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(pod["securityContext"]["runAsUser"], 65532);
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "img");
        assert!(c.get("ports").is_none());
        assert_eq!(c["env"][0], json!({"name": "POD_NAMESPACE", "value": "ns"}));
        assert_eq!(c["volumeMounts"][0]["readOnly"], false, "the parent of a nested mount");
        assert_eq!(c["volumeMounts"][1]["readOnly"], true);
        assert_eq!(
            pod["volumes"][1],
            json!({"name": "tok", "hostPath": {"path": "/t", "type": "Directory"}})
        );
        assert_eq!(pod["volumes"][2]["hostPath"]["path"], "/k");
    }
}
