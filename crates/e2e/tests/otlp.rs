//! Tracing export end to end: the operator (with the reference provider) sends its spans to an
//! OTLP/HTTP receiver inside the test, only because `OTEL_EXPORTER_OTLP_ENDPOINT` says so. One
//! Proxy's lifecycle gives the documented span tree, and log lines inside those spans carry their
//! trace ID. With the SDK disabled, nothing reaches the receiver and no line has a trace ID. A
//! kubernetes entry's API calls (kube's client spans) arrive under the health check's span.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{Cluster, Operator, PATIENCE, cluster, operator_binary, reference_binary, wait_target_ready};
use egress_api::{Phase, Proxy, ProxySpec};
use egress_kube_testserver::TestServer;
use http_body_util::{BodyExt as _, Full};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;

#[derive(Debug, Clone)]
struct Span {
    trace: String,
    id: String,
    parent: String,
    name: String,
    kind: i32,
    attributes: HashMap<String, String>,
    service: String,
}

/// An OTLP/HTTP receiver: decodes every export request and keeps the spans.
async fn receiver() -> (SocketAddr, Arc<Mutex<Vec<Span>>>) {
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let kept = spans.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let kept = kept.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1/traces");
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let export = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
                        let mut kept = kept.lock().unwrap();
                        for resource in export.resource_spans {
                            let service = resource
                                .resource
                                .iter()
                                .flat_map(|r| &r.attributes)
                                .find(|a| a.key == "service.name")
                                .map(|a| format!("{:?}", a.value))
                                .unwrap_or_default();
                            for scope in resource.scope_spans {
                                for s in scope.spans {
                                    kept.push(Span {
                                        trace: hex(&s.trace_id),
                                        id: hex(&s.span_id),
                                        parent: hex(&s.parent_span_id),
                                        name: s.name,
                                        kind: s.kind,
                                        attributes: s
                                            .attributes
                                            .into_iter()
                                            .map(|a| (a.key, format!("{:?}", a.value)))
                                            .collect(),
                                        service: service.clone(),
                                    });
                                }
                            }
                        }
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, spans)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Run {
    _server: TestServer,
    op: Operator,
    api: Api<Proxy>,
}

async fn start(env: &[(&str, &str)], name: &str) -> Run {
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster(name, "providers:\n  - name: mem\n    type: reference\n").await;
    let mut all_env = vec![
        ("KUBECONFIG", kubeconfig.as_str()),
        ("POD_NAMESPACE", "default"),
        ("DISCOVERY_TOKEN", "crawler-token"),
    ];
    all_env.extend_from_slice(env);
    let op = Operator::start(
        &reference_binary(),
        &[
            &providers_flag,
            "--health-probe-bind-address=0",
            "--provider-check-interval=0",
            "--leader-elect",
            "--zap-encoder=json",
            "--discovery-addr=127.0.0.1:0",
            "--discovery-tls=off",
        ],
        &all_env,
    );
    let api = Api::namespaced(server.client().unwrap(), "default");
    Run {
        _server: server,
        op,
        api,
    }
}

/// Creates a Managed Proxy, waits until it is Ready, deletes it and waits until it is gone.
async fn lifecycle(api: &Api<Proxy>, name: &str) {
    let proxy = Proxy::new(
        name,
        ProxySpec {
            provider: "mem".into(),
            placement: Some(egress_api::Placement {
                zone: "zone-a".into(),
                machine_type: "small".into(),
                image: "debian-13".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    api.create(&PostParams::default(), &proxy).await.unwrap();
    let ready = await_condition(api.clone(), name, |p: Option<&Proxy>| {
        p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase) == Some(Phase::Ready)
    });
    tokio::time::timeout(PATIENCE, ready)
        .await
        .expect("Ready in time")
        .unwrap();
    let uid = api.get(name).await.unwrap().metadata.uid.unwrap();
    api.delete(name, &DeleteParams::default()).await.unwrap();
    let gone = await_condition(api.clone(), name, conditions::is_deleted(&uid));
    tokio::time::timeout(PATIENCE, gone)
        .await
        .expect("gone in time")
        .unwrap();
}

fn parent_of<'a>(spans: &'a [Span], s: &Span) -> Option<&'a Span> {
    spans.iter().find(|p| p.trace == s.trace && p.id == s.parent)
}

/// The chain of names from `s` up to its root.
fn chain(spans: &[Span], s: &Span) -> Vec<String> {
    let mut names = vec![s.name.clone()];
    let mut at = s;
    while let Some(p) = parent_of(spans, at) {
        names.push(p.name.clone());
        at = p;
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_lifecycle_exports_the_documented_span_tree() {
    let (addr, spans) = receiver().await;
    let endpoint = format!("http://{addr}");
    let mut run = start(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=manager-0"),
        ],
        "otlp-on",
    )
    .await;
    run.op.wait_msg("tracing enabled");
    let discovery = run.op.wait_msg("Serving the discovery API")["address"]
        .as_str()
        .unwrap()
        .to_string();
    lifecycle(&run.api, "traced").await;
    // A crawler's trace continues into the discovery API.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let listed = reqwest::Client::new()
        .get(format!("http://{discovery}/v1/proxies"))
        .bearer_auth("crawler-token")
        .header("traceparent", format!("00-{client_trace}-{client_span}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    run.op.terminate();
    let status = run.op.wait_exit();
    assert_eq!(status.code(), Some(0), "{}", run.op.output());
    // The flush on shutdown has delivered every span by now.
    let spans = spans.lock().unwrap().clone();
    let names = |want: &str| spans.iter().filter(|s| s.name == want).cloned().collect::<Vec<_>>();

    let create = names("provider.create");
    assert_eq!(create.len(), 1, "one create: {spans:#?}");
    let create = &create[0];
    assert_eq!(
        chain(&spans, create),
        ["provider.create", "reconcile.managed", "Reconcile Proxy"]
    );
    let root = parent_of(&spans, parent_of(&spans, create).unwrap()).unwrap();
    assert!(root.parent.is_empty(), "Reconcile Proxy is a root span");
    assert_eq!(
        root.attributes["k8s.object.name"],
        format!("{:?}", Some(string_value("traced")))
    );
    assert_eq!(
        create.attributes["provider.name"],
        format!("{:?}", Some(string_value("mem")))
    );
    assert_eq!(create.kind, 3, "provider calls are client spans");
    assert!(
        spans
            .iter()
            .any(|s| s.name == "status.patch" && s.trace == root.trace && s.parent == root.id),
        "status.patch under the same Reconcile Proxy"
    );
    let patches: Vec<&Span> = spans.iter().filter(|s| s.name == "status.patch").collect();
    assert!(
        spans
            .iter()
            .any(|s| patches.iter().any(|p| p.trace == s.trace && p.id == s.parent)),
        "a real status PATCH appears as the HTTP child of status.patch"
    );

    let delete = names("provider.delete");
    assert!(!delete.is_empty(), "{spans:#?}");
    assert!(
        delete
            .iter()
            .any(|d| chain(&spans, d) == ["provider.delete", "reconcile.delete", "Reconcile Proxy"]),
        "{:?}",
        delete.iter().map(|d| chain(&spans, d)).collect::<Vec<_>>()
    );

    // Watches, lease renewals and other background calls start no trace.
    for s in spans.iter().filter(|s| s.parent.is_empty()) {
        assert!(
            // discovery.token: the manager making its discovery token's Secret at start.
            ["Reconcile Proxy", "gc.sweep", "providerhealth.check", "discovery.token"].contains(&s.name.as_str()),
            "unexpected root span {s:?}"
        );
    }
    for s in &spans {
        assert!(s.service.contains("egress-proxies-operator"), "{s:?}");
    }

    let served = spans
        .iter()
        .find(|s| s.name == "GET /v1/proxies")
        .unwrap_or_else(|| panic!("no discovery span: {spans:#?}"));
    assert_eq!(
        (served.trace.as_str(), served.parent.as_str()),
        (client_trace, client_span)
    );
    assert_eq!(served.kind, 2, "a server span");
    let request_line = run
        .op
        .seen
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["msg"] == "request" && v["path"] == "/v1/proxies")
        .expect("the request log line");
    assert_eq!(request_line["traceID"], client_trace, "{request_line}");
    assert_eq!(request_line["logger"], "discovery");

    // Log lines inside the create's trace carry its trace ID.
    let correlated: Vec<serde_json::Value> = run
        .op
        .seen
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["traceID"] == create.trace.as_str())
        .collect();
    assert!(
        !correlated.is_empty(),
        "no log line carries trace {}:\n{}",
        create.trace,
        run.op.output()
    );
    for line in &correlated {
        let span_id = line["spanID"].as_str().expect("spanID beside traceID");
        assert!(
            spans.iter().any(|s| s.trace == create.trace && s.id == span_id),
            "{line} names a span of its trace"
        );
        // controller-runtime's keys on the line, the OTel names on the span.
        assert_eq!(
            (
                line["controller"].as_str(),
                line["controllerKind"].as_str(),
                line["name"].as_str(),
                line["Proxy"]["name"].as_str()
            ),
            (Some("proxy"), Some("Proxy"), Some("traced"), Some("traced")),
            "{line}"
        );
        assert!(line.get("k8s.object.name").is_none(), "{line}");
        let id = line["reconcileID"].as_str().expect("reconcileID on a reconcile's line");
        assert_eq!(
            root.attributes["reconcile.id"],
            format!("{:?}", Some(string_value(id))),
            "the line's reconcileID is its span's reconcile.id"
        );
    }
}

fn string_value(s: &str) -> opentelemetry_proto::tonic::common::v1::AnyValue {
    opentelemetry_proto::tonic::common::v1::AnyValue {
        value: Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
            s.into(),
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_sdk_disabled_nothing_is_exported() {
    let (addr, spans) = receiver().await;
    let endpoint = format!("http://{addr}");
    let mut run = start(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
        "otlp-off",
    )
    .await;
    run.op.wait_msg("tracing disabled");
    lifecycle(&run.api, "untraced").await;
    run.op.terminate();
    let status = run.op.wait_exit();
    assert_eq!(status.code(), Some(0), "{}", run.op.output());
    assert!(spans.lock().unwrap().is_empty(), "exported while disabled");
    for line in run.op.seen.iter().filter(|l| l.starts_with('{')) {
        assert!(!line.contains("traceID"), "{line}");
    }
    // The run still did the work: the create was logged.
    assert!(
        run.op.seen.iter().any(|l| l.contains("untraced")),
        "{}",
        run.op.output()
    );
}

/// The kubernetes provider's API calls are kube's own client spans: exported under the caller's
/// span (here the health check's list of managed Pods), never as roots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_entrys_api_calls_are_spans_under_the_check() {
    let (addr, spans) = receiver().await;
    let endpoint = format!("http://{addr}");
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("otlp-kubernetes", "providers:\n  - name: pods\n    type: kubernetes\n").await;
    let mut op = Operator::start(
        &operator_binary(),
        &[
            &providers_flag,
            "--health-probe-bind-address=0",
            "--zap-encoder=json",
            "--discovery-addr=127.0.0.1:0",
            "--discovery-tls=off",
            "--provider-check-interval=10s",
        ],
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    op.wait_msg("tracing enabled");
    wait_target_ready(&server, "pods", "apiserver").await;
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    // The flush on shutdown has delivered every span by now.
    let spans = spans.lock().unwrap().clone();
    let pod_lists: Vec<&Span> = spans
        .iter()
        .filter(|s| {
            s.attributes
                .get("http.url")
                .is_some_and(|u| u.contains("/pods?") && u.contains("labelSelector"))
        })
        .collect();
    assert!(!pod_lists.is_empty(), "no span for the check's list: {spans:#?}");
    for list in pod_lists {
        assert_eq!(list.kind, 3, "an API call is a client span: {list:?}");
        assert_eq!(
            chain(&spans, list).last().map(String::as_str),
            Some("providerhealth.check"),
            "{:?}",
            chain(&spans, list)
        );
    }
    for s in spans.iter().filter(|s| s.parent.is_empty()) {
        assert!(
            // discovery.token: the manager making its discovery token's Secret at start.
            ["Reconcile Proxy", "gc.sweep", "providerhealth.check", "discovery.token"].contains(&s.name.as_str()),
            "unexpected root span {s:?}"
        );
    }
}
