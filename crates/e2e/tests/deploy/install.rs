//! The install as docs/operations.md walks it: the providers ConfigMap generated with a hash of
//! its file (a change rolls the Deployment), the overlay `deploy/example` a platform engineer
//! copies, and every file, resource and command the install, upgrade and uninstall steps name.

use std::path::Path;

use serde_json::Value;

use super::{deploy, deployment, load, render, render_path, strings};

const MANAGER: &str = "egress-proxies-operator-controller-manager";
const GATEWAY: &str = "egress-proxies-operator-gateway";
const CONFIG_MAP_PREFIX: &str = "egress-proxies-operator-providers-config-";

/// The one providers ConfigMap of a rendered install.
pub(crate) fn providers_config_map(rendered: &[Value]) -> &Value {
    let found: Vec<&Value> = rendered
        .iter()
        .filter(|v| {
            v["kind"] == "ConfigMap"
                && v["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(CONFIG_MAP_PREFIX))
        })
        .collect();
    let [one] = found.as_slice() else {
        panic!("one providers ConfigMap, not {}", found.len())
    };
    one
}

/// The name of the ConfigMap the manager's Deployment mounts as its providers config.
fn mounted_config_map(rendered: &[Value]) -> String {
    let pod = &deployment(rendered, MANAGER)["spec"]["template"]["spec"];
    pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "providers-config")
        .and_then(|v| v["configMap"]["name"].as_str())
        .expect("the providers-config volume")
        .to_owned()
}

#[test]
fn the_example_overlay_sets_the_image_and_its_providers() {
    let Some(rendered) = render("example", "the_example_overlay_sets_the_image_and_its_providers") else {
        return;
    };
    for name in [MANAGER, GATEWAY] {
        let image = &deployment(&rendered, name)["spec"]["template"]["spec"]["containers"][0]["image"];
        assert_eq!(image, "registry.example.com/egress-proxies-operator:v0.1.0", "{name}");
    }
    let config_map = providers_config_map(&rendered);
    assert_eq!(config_map["metadata"]["name"], mounted_config_map(&rendered).as_str());
    let text = config_map["data"]["providers.yaml"].as_str().unwrap();
    assert_eq!(text, std::fs::read_to_string(deploy("example/providers.yaml")).unwrap());
    assert!(load(text).providers.iter().any(|p| p.name == "kubernetes"));
}

/// A copy of the overlay with another providers file renders another ConfigMap name, and the
/// Deployment mounts it: applying the change rolls the manager, which reads the file at start.
#[test]
fn a_change_to_the_providers_file_rolls_the_manager() {
    let test = "a_change_to_the_providers_file_rolls_the_manager";
    // Under target/: kustomize takes the base by a relative path only.
    let copy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/deploy-example-copy");
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(&copy).unwrap();
    let kustomization = std::fs::read_to_string(deploy("example/kustomization.yaml")).unwrap();
    assert!(kustomization.contains("  - ../default\n"));
    let kustomization = kustomization.replace("  - ../default\n", "  - ../../deploy/default\n");
    std::fs::write(copy.join("kustomization.yaml"), kustomization).unwrap();
    let changed = "providers:\n  - name: kubernetes-two\n    type: kubernetes\n";
    std::fs::write(copy.join("providers.yaml"), changed).unwrap();
    let (Some(before), Some(after)) = (render("example", test), render_path(&copy, test)) else {
        return;
    };
    let (old, new) = (mounted_config_map(&before), mounted_config_map(&after));
    assert!(old.starts_with(CONFIG_MAP_PREFIX) && new.starts_with(CONFIG_MAP_PREFIX));
    assert_ne!(old, new, "the ConfigMap's name follows its content");
    assert_eq!(providers_config_map(&after)["data"]["providers.yaml"], changed);
    let _ = std::fs::remove_dir_all(&copy);
}

/// The `deploy/...` paths the README and the install guide name exist, and the objects their
/// commands name (`deployment/...`, `secret ...`, the kinds deleted first) are what the install
/// makes.
#[test]
fn the_install_steps_name_what_exists() {
    let Some(rendered) = render("default", "the_install_steps_name_what_exists") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for doc in ["README.md", "docs/operations.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let copy = overlay_copy(doc, &text);
        for path in deploy_paths(&text).into_iter().filter(|p| *p != copy) {
            assert!(root.join(&path).exists(), "{doc} names {path}, which does not exist");
        }
    }
    let guide = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let named = |kind: &str, name: &str| {
        rendered
            .iter()
            .any(|v| v["kind"] == kind && v["metadata"]["name"] == name)
    };
    assert!(guide.contains(&format!("deployment/{MANAGER}")) && named("Deployment", MANAGER));
    for service in ["egress-proxies-operator-controller-manager-discovery-service", GATEWAY] {
        assert!(guide.contains(&format!("{service}.")), "{service}");
        assert!(named("Service", service), "{service}");
    }
    // Secrets the guide reads or creates: what the manager makes or mounts.
    let pod = &deployment(&rendered, MANAGER)["spec"]["template"]["spec"];
    let mounted: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["secret"]["secretName"].as_str())
        .collect();
    for secret in ["discovery-token", "kvm-ssh"] {
        assert!(guide.contains(&format!("secret {secret}")) || guide.contains(&format!("secret generic {secret}")));
        assert!(mounted.contains(&secret), "{secret} is not mounted: {mounted:?}");
    }
    // The uninstall deletes every kind whose objects carry the manager's finalizer, by plural.
    for plural in ["proxypools", "proxies"] {
        assert!(guide.contains(&format!("kubectl delete {plural} --all")), "{plural}");
        assert!(
            rendered
                .iter()
                .any(|v| v["kind"] == "CustomResourceDefinition" && v["spec"]["names"]["plural"] == plural),
            "{plural}"
        );
    }
    let args = strings(&pod["containers"][0]["args"]);
    assert!(
        args.contains(&"--zap-devel=false".to_owned()),
        "the production logger: {args:?}"
    );
}

/// Where the install steps in `text` copy the overlay (`cp -r deploy/example DEST`), checked to
/// work as written: beside deploy/example, so that the copy's `resources: ../default` still finds
/// deploy/default, and applied by that path.
fn overlay_copy(doc: &str, text: &str) -> String {
    let (_, rest) = text
        .split_once("cp -r deploy/example ")
        .unwrap_or_else(|| panic!("{doc} copies deploy/example"));
    let copy: String = rest.chars().take_while(|c| !c.is_whitespace() && *c != '`').collect();
    assert_eq!(
        Path::new(&copy).parent(),
        Some(Path::new("deploy")),
        "{doc}: the copy {copy} must sit beside deploy/example, or its ../default finds nothing"
    );
    assert!(
        text.contains(&format!("apply --server-side -k {copy}\n")),
        "{doc} applies {copy}"
    );
    copy
}

/// Every `deploy/...` path in `text` (up to a character that ends a path).
fn deploy_paths(text: &str) -> Vec<String> {
    text.match_indices("deploy/")
        .filter(|(at, _)| *at == 0 || !text[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '-'))
        .map(|(at, _)| {
            text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '-' | '_' | '.'))
                .collect::<String>()
                .trim_end_matches(['.', '/'])
                .to_owned()
        })
        .collect()
}
