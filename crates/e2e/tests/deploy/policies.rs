//! The shipped NetworkPolicies, each against the Deployment whose Pods it selects, and the
//! gateway's install: its arguments, its lack of API access, its drain within the grace period,
//! its PodDisruptionBudget and Service.

use serde_json::Value;

use super::{render, strings};

/// The Deployment `name` of a rendered install.
pub(crate) fn deployment<'a>(rendered: &'a [Value], name: &str) -> &'a Value {
    rendered
        .iter()
        .find(|v| v["kind"] == "Deployment" && v["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Deployment {name}"))
}

/// The named container port `name` of a Deployment's first container.
fn container_port(d: &Value, name: &str) -> u64 {
    d["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no {name} port"))["containerPort"]
        .as_u64()
        .unwrap()
}

/// Each (component, port, source) a policy admits: the component is the `control-plane` of the
/// Pods it selects, which must be a Deployment's; a source is `namespace <label>` or, within the
/// install's namespace, `pods <label>`.
fn admitted(rendered: &[Value], policy: &Value) -> Vec<(String, u64, String)> {
    assert_eq!(policy["metadata"]["namespace"], "egress-proxies-operator-system");
    let spec = &policy["spec"];
    assert_eq!(strings(&spec["policyTypes"]), ["Ingress"]);
    let selector = spec["podSelector"]["matchLabels"].as_object().expect("matchLabels");
    let component = selector["control-plane"]
        .as_str()
        .expect("a control-plane label")
        .to_owned();
    let selected = rendered
        .iter()
        .filter(|v| v["kind"] == "Deployment")
        .find(|d| {
            selector
                .iter()
                .all(|(k, v)| &d["spec"]["template"]["metadata"]["labels"][k.as_str()] == v)
        })
        .unwrap_or_else(|| panic!("{component}: no Deployment's Pods carry {selector:?}"));
    let mut admitted = Vec::new();
    for rule in spec["ingress"].as_array().unwrap() {
        let from = rule["from"].as_array().expect("a source: never every namespace");
        for p in rule["ports"].as_array().expect("named ports: never every port") {
            let port = p["port"].as_u64().unwrap();
            assert!(
                selected["spec"]["template"]["spec"]["containers"][0]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| c["containerPort"] == port),
                "{component} has no port {port}"
            );
            for source in from {
                assert!(source.get("ipBlock").is_none(), "{source:?}");
                let (kind, labels) = match (source.get("namespaceSelector"), source.get("podSelector")) {
                    (Some(ns), None) => ("namespace", &ns["matchLabels"]),
                    (None, Some(pods)) => ("pods", &pods["matchLabels"]),
                    _ => panic!("one selector per source: {source:?}"),
                };
                let labels = labels.as_object().expect("a selector with labels");
                assert_eq!(labels.len(), 1, "{source:?}");
                let (k, v) = labels.iter().next().unwrap();
                admitted.push((component.clone(), port, format!("{kind} {k}={}", v.as_str().unwrap())));
            }
        }
    }
    admitted
}

/// The shipped policies, as rendered: each selects a Deployment's Pods and admits named ports
/// only from labelled namespaces or the gateway's Pods: the discovery API from crawler
/// namespaces and the gateway, metrics from `monitoring`, the gateway's fronts from crawler
/// namespaces. (No test server enforces NetworkPolicies; this checks what they say.)
#[test]
fn the_network_policies_admit_crawlers_to_discovery_and_the_gateway_and_monitoring_to_metrics() {
    let Some(rendered) = render(
        "default",
        "the_network_policies_admit_crawlers_to_discovery_and_the_gateway_and_monitoring_to_metrics",
    ) else {
        return;
    };
    let mut all: Vec<(String, u64, String)> = rendered
        .iter()
        .filter(|v| v["kind"] == "NetworkPolicy")
        .flat_map(|p| admitted(&rendered, p))
        .collect();
    all.sort();
    let manager = deployment(&rendered, "egress-proxies-operator-controller-manager");
    let gateway = deployment(&rendered, "egress-proxies-operator-gateway");
    let (discovery, metrics) = (container_port(manager, "discovery"), container_port(manager, "metrics"));
    assert_eq!((discovery, metrics), (8090, 8443));
    let (http, socks) = (container_port(gateway, "http-proxy"), container_port(gateway, "socks"));
    assert_eq!((http, socks), (8080, 1080));
    let crawlers = "namespace crawl.example.com/discovery-client=true".to_owned();
    let mut expected = vec![
        ("controller-manager".to_owned(), discovery, crawlers.clone()),
        (
            "controller-manager".to_owned(),
            discovery,
            "pods control-plane=gateway".to_owned(),
        ),
        (
            "controller-manager".to_owned(),
            metrics,
            "namespace kubernetes.io/metadata.name=monitoring".to_owned(),
        ),
        ("gateway".to_owned(), http, crawlers.clone()),
        ("gateway".to_owned(), socks, crawlers),
    ];
    expected.sort();
    assert_eq!(all, expected);
}

/// The gateway as the default install runs it: its arguments parse with the gateway's own
/// flags, it has no Kubernetes API access (no token mounted, no binding to its account), its
/// drain ends before the kubelet's grace period, two replicas of which a disruption keeps one,
/// and its Service reaches both fronts.
#[test]
fn the_gateway_runs_with_no_api_access_and_drains_within_its_grace() {
    let Some(rendered) = render(
        "default",
        "the_gateway_runs_with_no_api_access_and_drains_within_its_grace",
    ) else {
        return;
    };
    let d = deployment(&rendered, "egress-proxies-operator-gateway");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["serviceAccountName"], "egress-proxies-operator-gateway");
    assert!(
        rendered
            .iter()
            .filter(|v| v["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
            .all(|b| {
                b["subjects"]
                    .as_array()
                    .is_none_or(|s| s.iter().all(|s| s["name"] != "egress-proxies-operator-gateway"))
            }),
        "no role is bound to the gateway's account"
    );
    let c = &pod["containers"][0];
    assert_eq!(strings(&c["command"]), ["/usr/local/bin/egress-gateway"]);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let mut options = egress_gateway::program::Options::default();
    let args = strings(&c["args"]);
    egress_runtime::flags::parse(&egress_gateway::program::flags(), &mut options, args.iter())
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let drain = options.drain_timeout();
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(drain.as_secs() < grace, "a {drain:?} drain within {grace} s");
    assert_eq!(d["spec"]["replicas"], 2);
    let pdb = rendered
        .iter()
        .find(|v| v["kind"] == "PodDisruptionBudget")
        .expect("a PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    let service = rendered
        .iter()
        .find(|v| v["kind"] == "Service" && v["metadata"]["name"] == "egress-proxies-operator-gateway")
        .expect("the gateway Service");
    assert_eq!(service["spec"]["selector"], d["spec"]["selector"]["matchLabels"]);
    let targets: Vec<String> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["targetPort"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(targets, ["http-proxy", "socks"]);
}
