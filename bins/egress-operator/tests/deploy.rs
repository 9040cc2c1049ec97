//! The shipped manifests agree with the binary: every argument they pass parses, the providers
//! ConfigMap loads with the binary's provider types, and the Deployment keeps the runtime envelope
//! (non-root, read-only root, 128Mi, 10 s grace, the mounts and the environment order).

use std::path::{Path, PathBuf};

use egress_operator::flags::{self, Command};
use serde_json::Value;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(file)
}

fn yaml(file: &str) -> Value {
    let text = std::fs::read_to_string(deploy(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn strings(v: &Value) -> Vec<String> {
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
    assert_eq!(
        c["env"][at("DISCOVERY_TOKEN")]["valueFrom"]["secretKeyRef"]["optional"],
        true
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
        ("tmp", "/tmp"),
    ] {
        assert!(mounts.contains(&(name.into(), path.into())), "{name} at {path}");
    }
    let volumes = pod["volumes"].as_array().unwrap();
    let volume = |n: &str| volumes.iter().find(|v| v["name"] == n).unwrap();
    assert_eq!(volume("kvm-ssh")["secret"]["optional"], true);
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

#[test]
fn the_shipped_providers_config_loads() {
    let cm = yaml("manager/providers_config.yaml");
    let text = cm["data"]["providers.yaml"].as_str().unwrap();
    // The binary's registry today: no backend types (they arrive with their crates).
    let registry = egress_provider::Registry::new();
    egress_provider::config::ProvidersConfig::parse(text, "providers.yaml", &registry)
        .unwrap_or_else(|e| panic!("the shipped config stops the manager: {e}"));
}

#[test]
fn the_kustomizations_name_files_that_exist() {
    for dir in ["crds", "rbac", "manager", "samples", "default"] {
        let k = yaml(&format!("{dir}/kustomization.yaml"));
        for r in strings(&k["resources"]) {
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
