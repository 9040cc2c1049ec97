//! The shipped manifests agree with the binaries: every argument they pass parses, the providers
//! ConfigMap loads with the binary's provider types, the manager's Deployment keeps the runtime
//! envelope (non-root, read-only root, 128Mi, 10 s grace, the mounts and the environment order),
//! and the gateway's runs with no API access and drains within its grace.

use std::path::{Path, PathBuf};

use egress_manager::flags::{self, Command};
use serde_json::Value;

/// The install as the docs walk it: the example overlay, the generated providers ConfigMap.
mod install;
/// The network policies and the gateway's install.
mod policies;
mod tls;
use policies::deployment;

pub(crate) fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(file)
}

fn yaml(file: &str) -> Value {
    let text = std::fs::read_to_string(deploy(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

pub(crate) fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_manager_deployment_keeps_the_runtime_envelope() {
    let d = yaml("manager/manager.yaml");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(pod["terminationGracePeriodSeconds"], 10);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "manager");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["resources"]["limits"]["memory"], "128Mi");

    let env: Vec<String> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    let at = |n: &str| env.iter().position(|e| e == n).unwrap_or_else(|| panic!("{n} missing"));
    assert!(at("POD_NAME") < at("OTEL_RESOURCE_ATTRIBUTES"));
    assert!(at("POD_NAMESPACE") < at("OTEL_RESOURCE_ATTRIBUTES"));
    assert!(
        env.iter().all(|e| e != "OTEL_EXPORTER_OTLP_ENDPOINT"),
        "tracing is off by default"
    );
    assert!(
        env.iter().all(|e| e != "DISCOVERY_TOKEN"),
        "the token comes from the volume, which rotates; an environment variable cannot"
    );

    let mounts: Vec<(String, String)> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().into(),
                m["mountPath"].as_str().unwrap().into(),
            )
        })
        .collect();
    for (name, path) in [
        ("providers-config", "/etc/proxy-operator"),
        ("kvm-ssh", "/etc/proxy-operator/kvm"),
        ("discovery-token", "/etc/proxy-operator/discovery"),
        ("tmp", "/tmp"),
    ] {
        assert!(mounts.contains(&(name.into(), path.into())), "{name} at {path}");
    }
    let volumes = pod["volumes"].as_array().unwrap();
    let volume = |n: &str| volumes.iter().find(|v| v["name"] == n).unwrap();
    assert_eq!(volume("kvm-ssh")["secret"]["optional"], true);
    // The Secret the manager makes when it is missing: the pod starts without it.
    assert_eq!(volume("discovery-token")["secret"]["secretName"], "discovery-token");
    assert_eq!(volume("discovery-token")["secret"]["optional"], true);
    assert_eq!(volume("tmp")["emptyDir"]["sizeLimit"], "64Mi");
    assert!(
        volume("tmp")["emptyDir"].get("medium").is_none(),
        "scratch files go to node disk"
    );
}

#[test]
fn every_argument_the_manifests_pass_is_a_flag_the_binary_takes() {
    let d = yaml("manager/manager.yaml");
    let mut args = strings(&d["spec"]["template"]["spec"]["containers"][0]["args"]);
    let patch = yaml("default/manager_metrics_patch.yaml");
    for op in patch.as_array().unwrap() {
        if op["path"].as_str().unwrap().contains("/args/") {
            args.push(op["value"].as_str().unwrap().into());
        }
    }
    let Ok(Command::Run(o)) = flags::parse(args.clone()) else {
        panic!("{args:?} do not parse");
    };
    assert!(o.leader_elect);
    assert_eq!(o.metrics_bind_address, ":8443");
    assert!(o.metrics_secure, "served securely, as the metrics-auth role expects");
    assert_eq!(o.health_probe_bind_address, ":8081");
    assert_eq!(o.providers_config, "/etc/proxy-operator/providers.yaml");
}

/// The binary's provider types, as `src/main.rs` registers them.
fn registry() -> egress_provider::Registry {
    egress_provider::Registry::new()
        .with(egress_provider_local::provider_type())
        .with(egress_provider_kubernetes::provider_type())
        .with(egress_provider_kvm::provider_type())
        .with(egress_provider_kvm2::provider_type())
        .with(egress_provider_gcp::provider_type(
            egress_provider_gcp::WireOptions::default(),
        ))
}

fn load(text: &str) -> egress_provider::config::ProvidersConfig {
    egress_provider::config::ProvidersConfig::parse(text, "providers.yaml", &registry())
        .map(|loaded| loaded.config)
        .unwrap_or_else(|e| panic!("the config stops the manager: {e}\n{text}"))
}

fn shipped_providers_text() -> String {
    std::fs::read_to_string(deploy("manager/providers.yaml")).unwrap()
}

/// The commented example entries of the shipped config, each uncommented.
fn example_entries(text: &str) -> Vec<String> {
    let mut entries: Vec<Vec<String>> = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in text.lines() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        match body.strip_prefix("# ") {
            Some(rest) if rest.starts_with("- name:") => {
                entries.extend(current.take());
                current = Some(vec![format!("{indent}{rest}")]);
            }
            Some(rest) if current.is_some() && !rest.starts_with("---") => {
                current.as_mut().unwrap().push(format!("{indent}{rest}"));
            }
            _ => entries.extend(current.take()),
        }
    }
    entries.extend(current);
    entries.into_iter().map(|lines| lines.join("\n")).collect()
}

#[test]
fn the_shipped_providers_config_loads_with_a_kubernetes_entry() {
    let config = load(&shipped_providers_text());
    let entries: Vec<(&str, &str)> = config
        .providers
        .iter()
        .map(|p| (p.name.as_str(), p.type_name.as_str()))
        .collect();
    assert_eq!(entries, vec![("kubernetes", "kubernetes")]);
}

#[test]
fn every_commented_example_entry_validates_once_uncommented() {
    let text = shipped_providers_text();
    let examples = example_entries(&text);
    let names: Vec<String> = examples
        .iter()
        .map(|e| {
            let config = load(&format!("providers:\n{e}\n"));
            assert_eq!(config.providers.len(), 1, "{e}");
            config.providers[0].type_name.clone()
        })
        .collect();
    assert_eq!(names, vec!["kvm2", "kvm", "gcp"]);
    // And all of them beside the shipped entry.
    let all = load(&format!("{text}\n{}\n", examples.join("\n")));
    assert_eq!(all.providers.len(), 4);
}

/// The `spec.provider` of every Managed Proxy in the files a kustomization lists.
fn sample_providers(dir: &str) -> Vec<String> {
    let k = yaml(&format!("{dir}/kustomization.yaml"));
    let mut names = Vec::new();
    for file in strings(&k["resources"]) {
        let text = std::fs::read_to_string(deploy(dir).join(&file)).unwrap();
        for doc in text.split("\n---") {
            let v: Value = serde_saphyr::from_str(doc).unwrap();
            if v["kind"] == "Proxy" && v["spec"]["mode"] == "Managed" {
                names.push(v["spec"]["provider"].as_str().unwrap_or_default().to_owned());
            }
            // A pool's members are Managed Proxies of its template's provider.
            if v["kind"] == "ProxyPool" {
                names.push(
                    v["spec"]["template"]["spec"]["provider"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
            }
        }
    }
    names
}

#[test]
fn the_samples_name_entries_that_exist() {
    let text = shipped_providers_text();
    let shipped: Vec<String> = load(&text).providers.into_iter().map(|p| p.name).collect();
    let samples = sample_providers("samples");
    assert!(!samples.is_empty());
    for p in &samples {
        assert!(
            shipped.contains(p),
            "deploy/samples names {p:?}, not in the shipped config {shipped:?}"
        );
    }
    // The other providers' samples name the commented examples.
    let examples: Vec<String> = example_entries(&text)
        .iter()
        .flat_map(|e| load(&format!("providers:\n{e}\n")).providers)
        .map(|p| p.name)
        .collect();
    for p in sample_providers("samples/other-providers") {
        assert!(
            examples.contains(&p),
            "samples/other-providers names {p:?}, not an example entry {examples:?}"
        );
    }
}

/// `kubectl kustomize deploy/<dir>`, one value per document; None when kubectl is missing.
pub(crate) fn render(dir: &str, test: &str) -> Option<Vec<Value>> {
    render_path(&deploy(dir), test)
}

/// `kubectl kustomize <dir>`, one value per document; None when kubectl is missing.
pub(crate) fn render_path(dir: &Path, test: &str) -> Option<Vec<Value>> {
    let kubectl = egress_testkit::on_path("kubectl", test)?;
    let out = std::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rendered = String::from_utf8(out.stdout).unwrap();
    Some(
        rendered
            .split("\n---\n")
            .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
            .collect(),
    )
}

#[test]
fn the_rendered_default_install_carries_a_config_that_loads() {
    let Some(rendered) = render("default", "the_rendered_default_install_carries_a_config_that_loads") else {
        return;
    };
    let config_map = install::providers_config_map(&rendered);
    assert_eq!(config_map["metadata"]["namespace"], "egress-proxies-operator-system");
    let config = load(config_map["data"]["providers.yaml"].as_str().unwrap());
    assert!(
        config
            .providers
            .iter()
            .any(|p| p.name == "kubernetes" && p.type_name == "kubernetes"),
        "{config:?}"
    );
}

/// The template for the Squid Pods' namespaces: it selects exactly the operator's Pods, admits
/// clients on the default proxy port from crawler namespaces and the operator's own, and lets
/// the Pods reach only port 443 of public addresses (never link-local, metadata or private
/// ranges) and the cluster DNS. (No test server enforces it; this checks what it says.)
#[test]
fn the_proxy_pod_policy_keeps_squid_off_internal_addresses() {
    let Some(rendered) = render(
        "proxy-network-policy",
        "the_proxy_pod_policy_keeps_squid_off_internal_addresses",
    ) else {
        return;
    };
    let [policy] = rendered.as_slice() else {
        panic!("one policy: {rendered:?}")
    };
    let spec = &policy["spec"];
    assert_eq!(
        spec["podSelector"]["matchLabels"][egress_provider::LABEL_MANAGED],
        egress_provider::LABEL_MANAGED_YES
    );
    assert_eq!(strings(&spec["policyTypes"]), ["Ingress", "Egress"]);
    let ingress = spec["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1);
    assert_eq!(
        ingress[0]["ports"][0]["port"].as_i64(),
        Some(i64::from(egress_api::DEFAULT_PORT))
    );
    let sources: Vec<String> = ingress[0]["from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let labels = f["namespaceSelector"]["matchLabels"]
                .as_object()
                .expect("namespaces only");
            labels
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
                .collect()
        })
        .collect();
    assert_eq!(
        sources,
        [
            "crawl.example.com/discovery-client=true",
            "kubernetes.io/metadata.name=egress-proxies-operator-system"
        ]
    );
    let egress = spec["egress"].as_array().unwrap();
    let (public, dns) = (&egress[0], &egress[1]);
    let ports = |rule: &Value| -> Vec<(String, u64)> {
        rule["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["protocol"].as_str().unwrap().to_owned(), p["port"].as_u64().unwrap()))
            .collect()
    };
    assert_eq!(ports(public), [("TCP".to_owned(), 443)]);
    assert_eq!(ports(dns), [("UDP".to_owned(), 53), ("TCP".to_owned(), 53)]);
    let mut excepted = Vec::new();
    for to in public["to"].as_array().unwrap() {
        let block = &to["ipBlock"];
        assert!(["0.0.0.0/0", "::/0"].contains(&block["cidr"].as_str().unwrap()));
        excepted.extend(strings(&block["except"]));
    }
    for internal in [
        "169.254.0.0/16",
        "fe80::/10",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "fc00::/7",
        "127.0.0.0/8",
        "::1/128",
    ] {
        assert!(excepted.iter().any(|e| e == internal), "{internal} is reachable");
    }
    assert!(dns["to"][0]["podSelector"]["matchLabels"]["k8s-app"] == "kube-dns");
}

/// Each `(apiGroup, resource, verb)` a rendered Role or ClusterRole grants, with the namespace
/// it holds in (`None`: cluster-wide).
fn grants(rendered: &[Value]) -> Vec<(Option<String>, String, String)> {
    let mut out = Vec::new();
    for role in rendered
        .iter()
        .filter(|v| v["kind"] == "Role" || v["kind"] == "ClusterRole")
    {
        let namespace = (role["kind"] == "Role").then(|| role["metadata"]["namespace"].as_str().unwrap().to_owned());
        // Rules of non-resource URLs (metrics-reader) have no resources.
        for rule in role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["resources"].is_array())
        {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    out.push((namespace.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

/// The Secret and Pod rules a rendered install grants, sorted.
fn sensitive(rendered: &[Value]) -> Vec<(Option<String>, String, String)> {
    let mut v: Vec<_> = grants(rendered)
        .into_iter()
        .filter(|(_, resource, _)| resource == "secrets" || resource == "pods")
        .collect();
    v.sort();
    v
}

/// Each Secret and Pod verb the manager's work needs, granted in `namespace` (`None`:
/// cluster-wide), plus the token Secret's two in its own namespace.
fn manager_grants(namespace: Option<&str>) -> Vec<(Option<String>, String, String)> {
    let at = |r: &str, v: &str| (namespace.map(str::to_owned), r.to_owned(), v.to_owned());
    let own = |v: &str| {
        (
            Some("egress-proxies-operator-system".to_owned()),
            "secrets".to_owned(),
            v.to_owned(),
        )
    };
    let mut want = vec![own("create"), own("get")];
    want.extend(["create", "delete", "get", "list", "patch"].map(|v| at("pods", v)));
    want.extend(["create", "get", "list", "patch", "watch"].map(|v| at("secrets", v)));
    want.sort();
    want
}

/// The default install serves only its own namespace: no ClusterRole on Secrets or Pods.
#[test]
fn the_default_install_grants_secrets_and_pods_only_in_its_own_namespace() {
    let Some(default) = render(
        "default",
        "the_default_install_grants_secrets_and_pods_only_in_its_own_namespace",
    ) else {
        return;
    };
    assert_eq!(
        sensitive(&default),
        manager_grants(Some("egress-proxies-operator-system"))
    );
    let deployment = deployment(&default, "egress-proxies-operator-controller-manager");
    let args = strings(&deployment["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(
        !args.iter().any(|a| a.starts_with("--proxy-namespace")),
        "the default, its own namespace: {args:?}"
    );
}

/// The cluster-wide overlay, chosen knowingly, serves every namespace with cluster-wide grants.
#[test]
fn the_cluster_wide_install_serves_every_namespace() {
    let Some(rendered) = render("cluster-wide", "the_cluster_wide_install_serves_every_namespace") else {
        return;
    };
    assert_eq!(sensitive(&rendered), manager_grants(None));
    let account = rendered.iter().find(|v| v["kind"] == "ServiceAccount").unwrap();
    for binding in rendered.iter().filter(|v| v["kind"] == "ClusterRoleBinding") {
        assert_eq!(binding["subjects"][0]["name"], account["metadata"]["name"]);
        assert_eq!(binding["subjects"][0]["namespace"], account["metadata"]["namespace"]);
        let role = &binding["roleRef"]["name"];
        assert!(
            rendered
                .iter()
                .any(|v| v["kind"] == "ClusterRole" && &v["metadata"]["name"] == role),
            "{role} is rendered"
        );
    }
    let deployment = deployment(&rendered, "egress-proxies-operator-controller-manager");
    let args = strings(&deployment["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(args.contains(&"--proxy-namespace=*".to_owned()), "{args:?}");
}

/// The namespace-scoped install has them only in the namespace it serves.
#[test]
fn the_namespaced_install_reads_secrets_and_manages_pods_only_in_its_namespace() {
    let test = "the_namespaced_install_reads_secrets_and_manages_pods_only_in_its_namespace";
    let Some(namespaced) = render("namespaced", test) else {
        return;
    };
    assert_eq!(
        sensitive(&namespaced),
        manager_grants(Some("crawlers")),
        "nothing cluster-wide"
    );
    // The Role is bound to the manager's ServiceAccount.
    let binding = namespaced
        .iter()
        .find(|v| v["kind"] == "RoleBinding" && v["metadata"]["namespace"] == "crawlers")
        .expect("a RoleBinding in crawlers");
    let role = namespaced
        .iter()
        .find(|v| v["kind"] == "Role" && v["metadata"]["namespace"] == "crawlers")
        .unwrap();
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let account = namespaced.iter().find(|v| v["kind"] == "ServiceAccount").unwrap();
    assert_eq!(binding["subjects"][0]["name"], account["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["namespace"], account["metadata"]["namespace"]);
    // The manager serves that namespace, and its kubernetes entry places Pods there.
    let deployment = deployment(&namespaced, "egress-proxies-operator-controller-manager");
    let args = strings(&deployment["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(args.contains(&"--proxy-namespace=crawlers".to_owned()), "{args:?}");
    assert!(
        args.contains(&"--external-proxy-namespaces=crawlers".to_owned()),
        "{args:?}"
    );
    let config_map = namespaced.iter().find(|v| v["kind"] == "ConfigMap").unwrap();
    let config = load(config_map["data"]["providers.yaml"].as_str().unwrap());
    let kubernetes = config.providers.iter().find(|p| p.type_name == "kubernetes").unwrap();
    assert_eq!(
        kubernetes
            .block::<egress_provider_kubernetes::KubernetesConfig>()
            .unwrap()
            .and_then(|k| k.namespace),
        Some("crawlers".to_owned())
    );
}

/// `kubectl apply -k deploy/samples` puts them where the default install serves.
#[test]
fn the_samples_go_to_the_namespace_the_default_install_serves() {
    let served = yaml("default/kustomization.yaml")["namespace"].clone();
    assert_eq!(served, "egress-proxies-operator-system");
    for dir in ["samples", "samples/other-providers"] {
        assert_eq!(yaml(&format!("{dir}/kustomization.yaml"))["namespace"], served, "{dir}");
    }
}

#[test]
fn the_kustomizations_name_files_that_exist() {
    for dir in [
        "crds",
        "rbac",
        "network-policy",
        "proxy-network-policy",
        "namespaced",
        "cluster-wide",
        "manager",
        "gateway",
        "samples",
        "samples/other-providers",
        "default",
        "example",
    ] {
        let k = yaml(&format!("{dir}/kustomization.yaml"));
        let components = if k["components"].is_array() {
            strings(&k["components"])
        } else {
            Vec::new()
        };
        let generated = k["configMapGenerator"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| strings(&g["files"]));
        for r in strings(&k["resources"]).into_iter().chain(components).chain(generated) {
            assert!(
                deploy(dir).join(&r).exists(),
                "{dir}/kustomization.yaml lists missing {r}"
            );
        }
    }
    let rendered_names = [
        "namespace: egress-proxies-operator-system",
        "namePrefix: egress-proxies-operator-",
    ];
    let text = std::fs::read_to_string(deploy("default/kustomization.yaml")).unwrap();
    for n in rendered_names {
        assert!(text.contains(n), "{n}");
    }
}
