//! Protobuf request bodies, as kubectl and client-go send them for built-in kinds: each kind the
//! server decodes is created twice, once as JSON and once as the same object in protobuf, and
//! the two stored objects must read back the same.

mod common;

use common::*;
use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pbmeta;
use kube::api::{Api, DynamicObject};
use prost::Message;
use serde_json::{Value, json};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// The k8s envelope around one message: magic, then a runtime.Unknown.
fn envelope(api_version: &str, kind: &str, message: &impl Message) -> Vec<u8> {
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown {
        type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(message.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [b"k8s\0".as_slice(), unknown.encode_to_vec().as_slice()].concat()
}

/// POSTs a protobuf body to `path` and returns the server's JSON answer or its error.
async fn post_protobuf(client: &kube::Client, path: &str, body: Vec<u8>) -> Result<Value, kube::Error> {
    let request = http::Request::post(path)
        .header("content-type", PROTOBUF)
        .header("accept", "application/vnd.kubernetes.protobuf,application/json")
        .body(body)
        .unwrap();
    let text = client.request_text(request).await?;
    Ok(serde_json::from_str(&text).unwrap())
}

/// POSTs a JSON body to `path`.
async fn post_json(client: &kube::Client, path: &str, body: &Value) -> Value {
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    serde_json::from_str(&client.request_text(request).await.unwrap()).unwrap()
}

/// What the server decided itself, so two creations of one object compare equal.
fn without_server_fields(mut o: Value) -> Value {
    let m = o["metadata"].as_object_mut().unwrap();
    for f in [
        "name",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "generation",
    ] {
        m.remove(f);
    }
    o
}

fn pb_meta(name: &str) -> Option<pbmeta::ObjectMeta> {
    Some(pbmeta::ObjectMeta {
        name: Some(name.into()),
        // What client-go sends for the fields an object leaves unset.
        generate_name: Some(String::new()),
        namespace: Some(String::new()),
        generation: Some(0),
        labels: [("app".to_owned(), "demo".to_owned())].into(),
        annotations: [("note".to_owned(), "x".to_owned())].into(),
        finalizers: vec!["example.com/keep".into()],
        ..Default::default()
    })
}

fn json_meta(name: &str) -> Value {
    json!({"name": name, "labels": {"app": "demo"}, "annotations": {"note": "x"}, "finalizers": ["example.com/keep"]})
}

/// Creates `json` and `protobuf` (the same object) at `collection`, then reads both back as
/// JSON and compares them; returns what was stored.
async fn same_either_way(
    s: &egress_kube_testserver::TestServer,
    collection: &str,
    json: Value,
    protobuf: Vec<u8>,
) -> Value {
    let client = client(s);
    let from_json = post_json(&client, collection, &json).await;
    let from_protobuf = post_protobuf(&client, collection, protobuf).await.unwrap();
    let name = |o: &Value| o["metadata"]["name"].as_str().unwrap().to_owned();
    let get = |n: String| {
        let client = client.clone();
        let path = format!("{collection}/{n}");
        async move {
            let request = http::Request::get(path).body(Vec::new()).unwrap();
            serde_json::from_str::<Value>(&client.request_text(request).await.unwrap()).unwrap()
        }
    };
    let a = without_server_fields(get(name(&from_json)).await);
    let b = without_server_fields(get(name(&from_protobuf)).await);
    assert_eq!(a, b, "the protobuf body must store what the JSON body stores");
    b
}

#[tokio::test]
async fn secrets_round_trip() {
    let s = server().await;
    let secret = pb::Secret {
        metadata: pb_meta("from-pb"),
        immutable: Some(false),
        data: [("bin".to_owned(), vec![0u8, 159, 146, 150])].into(),
        string_data: [("plain".to_owned(), "hello".to_owned())].into(),
        r#type: Some("Opaque".into()),
    };
    let stored = same_either_way(
        &s,
        &format!("/api/v1/namespaces/{NS}/secrets"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": json_meta("from-json"), "immutable": false,
            "data": {"bin": "AJ+Slg=="}, "stringData": {"plain": "hello"}, "type": "Opaque"}),
        envelope("v1", "Secret", &secret),
    )
    .await;
    assert_eq!(stored["data"], json!({"bin": "AJ+Slg==", "plain": "aGVsbG8="}));
    assert_eq!(stored["metadata"]["namespace"], NS);
}

#[tokio::test]
async fn config_maps_round_trip() {
    let s = server().await;
    let cm = pb::ConfigMap {
        metadata: pb_meta("from-pb"),
        immutable: None,
        data: [("a".to_owned(), "1".to_owned()), ("empty".to_owned(), String::new())].into(),
        binary_data: [("b".to_owned(), vec![1u8, 2, 3])].into(),
    };
    let stored = same_either_way(
        &s,
        &format!("/api/v1/namespaces/{NS}/configmaps"),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": json_meta("from-json"),
            "data": {"a": "1", "empty": ""}, "binaryData": {"b": "AQID"}}),
        envelope("v1", "ConfigMap", &cm),
    )
    .await;
    assert_eq!(stored["data"]["empty"], "");
}

#[tokio::test]
async fn namespaces_round_trip() {
    let s = server().await;
    let mut meta = pb_meta("from-pb");
    meta.as_mut().unwrap().finalizers.clear();
    let ns = pb::Namespace {
        metadata: meta,
        spec: Some(pb::NamespaceSpec {
            finalizers: vec!["kubernetes".into()],
        }),
        status: Some(pb::NamespaceStatus::default()),
    };
    let mut meta = json_meta("from-json");
    meta.as_object_mut().unwrap().remove("finalizers");
    let stored = same_either_way(
        &s,
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta, "spec": {"finalizers": ["kubernetes"]}}),
        envelope("v1", "Namespace", &ns),
    )
    .await;
    assert_eq!(stored["status"]["phase"], "Active");
}

#[tokio::test]
async fn events_round_trip_and_show_through_events_k8s_io() {
    let s = server().await;
    let time = |seconds: i64| {
        Some(pbmeta::Time {
            seconds: Some(seconds),
            nanos: Some(0),
        })
    };
    let reference = |name: &str| {
        Some(pb::ObjectReference {
            kind: Some("Toy".into()),
            namespace: Some(NS.into()),
            name: Some(name.into()),
            uid: Some("u-1".into()),
            api_version: Some("toys.example.com/v1".into()),
            resource_version: Some(String::new()),
            field_path: Some(String::new()),
        })
    };
    let mut meta = pb_meta("from-pb");
    meta.as_mut().unwrap().finalizers.clear();
    let event = pb::Event {
        metadata: meta,
        involved_object: reference("t1"),
        reason: Some("Ready".into()),
        message: Some("it works".into()),
        source: Some(pb::EventSource {
            component: Some("egress".into()),
            host: Some(String::new()),
        }),
        first_timestamp: time(1_767_225_600),
        last_timestamp: time(1_767_225_660),
        count: Some(2),
        r#type: Some("Normal".into()),
        event_time: Some(pbmeta::MicroTime {
            seconds: Some(1_767_225_600),
            nanos: Some(250_000_000),
        }),
        series: Some(pb::EventSeries {
            count: Some(2),
            last_observed_time: Some(pbmeta::MicroTime {
                seconds: Some(1_767_225_660),
                nanos: Some(0),
            }),
        }),
        action: Some("Probe".into()),
        related: reference("t2"),
        reporting_component: Some("egress-operator".into()),
        reporting_instance: Some("pod-1".into()),
    };
    let mut meta = json_meta("from-json");
    meta.as_object_mut().unwrap().remove("finalizers");
    let reference = |name: &str| json!({"kind": "Toy", "namespace": NS, "name": name, "uid": "u-1", "apiVersion": "toys.example.com/v1"});
    let stored = same_either_way(
        &s,
        &format!("/api/v1/namespaces/{NS}/events"),
        json!({"apiVersion": "v1", "kind": "Event", "metadata": meta, "involvedObject": reference("t1"),
            "reason": "Ready", "message": "it works", "source": {"component": "egress"},
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:01:00Z", "count": 2,
            "type": "Normal", "eventTime": "2026-01-01T00:00:00.250000Z",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}, "action": "Probe",
            "related": reference("t2"), "reportingComponent": "egress-operator", "reportingInstance": "pod-1"}),
        envelope("v1", "Event", &event),
    )
    .await;
    assert_eq!(stored["eventTime"], "2026-01-01T00:00:00.250000Z");
    // The same object through the other Events API.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client(&s), NS);
    let seen = events.get("from-pb").await.unwrap();
    assert_eq!(seen.note.as_deref(), Some("it works"));
    assert_eq!(seen.regarding.and_then(|r| r.name).as_deref(), Some("t1"));
}

fn pb_container() -> pb::Container {
    use k8s_pb::apimachinery::pkg::api::resource::Quantity;
    let q = |s: &str| Quantity { string: Some(s.into()) };
    pb::Container {
        name: Some("squid".into()),
        image: Some("ubuntu/squid:6.6".into()),
        command: vec!["/bin/sh".into(), "-c".into()],
        args: vec!["exec squid -N".into()],
        working_dir: Some(String::new()),
        ports: vec![pb::ContainerPort {
            name: Some("proxy".into()),
            host_port: Some(0),
            container_port: Some(3128),
            protocol: Some("TCP".into()),
            host_ip: Some(String::new()),
        }],
        env: vec![pb::EnvVar {
            name: Some("MODE".into()),
            value: Some("strict".into()),
            value_from: None,
        }],
        resources: Some(pb::ResourceRequirements {
            limits: [("memory".to_owned(), q("128Mi"))].into(),
            requests: [("cpu".to_owned(), q("50m"))].into(),
            claims: Vec::new(),
        }),
        volume_mounts: vec![pb::VolumeMount {
            name: Some("cache".into()),
            read_only: Some(true),
            mount_path: Some("/var/spool/squid".into()),
            ..Default::default()
        }],
        termination_message_path: Some("/dev/termination-log".into()),
        termination_message_policy: Some("File".into()),
        image_pull_policy: Some("IfNotPresent".into()),
        stdin: Some(false),
        stdin_once: Some(false),
        tty: Some(false),
        ..Default::default()
    }
}

#[tokio::test]
async fn pods_round_trip() {
    let s = server().await;
    let mut meta = pb_meta("from-pb");
    meta.as_mut().unwrap().finalizers.clear();
    let pod = pb::Pod {
        metadata: meta,
        spec: Some(pb::PodSpec {
            containers: vec![pb_container()],
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(0),
            dns_policy: Some("ClusterFirst".into()),
            node_selector: [("kubernetes.io/os".to_owned(), "linux".to_owned())].into(),
            service_account_name: Some("proxy".into()),
            automount_service_account_token: Some(false),
            host_network: Some(false),
            enable_service_links: Some(false),
            ..Default::default()
        }),
        status: Some(pb::PodStatus::default()),
    };
    let mut meta = json_meta("from-json");
    meta.as_object_mut().unwrap().remove("finalizers");
    let stored = same_either_way(
        &s,
        &format!("/api/v1/namespaces/{NS}/pods"),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
            "containers": [{"name": "squid", "image": "ubuntu/squid:6.6", "command": ["/bin/sh", "-c"],
                "args": ["exec squid -N"], "ports": [{"name": "proxy", "containerPort": 3128, "protocol": "TCP"}],
                "env": [{"name": "MODE", "value": "strict"}],
                "resources": {"limits": {"memory": "128Mi"}, "requests": {"cpu": "50m"}},
                "volumeMounts": [{"name": "cache", "readOnly": true, "mountPath": "/var/spool/squid"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "dnsPolicy": "ClusterFirst",
            "nodeSelector": {"kubernetes.io/os": "linux"}, "serviceAccountName": "proxy",
            "automountServiceAccountToken": false, "enableServiceLinks": false}}),
        envelope("v1", "Pod", &pod),
    )
    .await;
    assert_eq!(stored["spec"]["containers"][0]["ports"][0]["containerPort"], 3128);
}

#[tokio::test]
async fn what_is_not_decoded_is_refused_and_nothing_is_stored() {
    let s = server().await;
    let c = client(&s);
    // A Pod field outside the mapping: 415 naming it, and no Pod.
    let mut container = pb_container();
    container.liveness_probe = Some(pb::Probe::default());
    let pod = pb::Pod {
        metadata: pb_meta("probed"),
        spec: Some(pb::PodSpec {
            containers: vec![container],
            ..Default::default()
        }),
        status: None,
    };
    let path = format!("/api/v1/namespaces/{NS}/pods");
    let (code, reason, message) = api_error(post_protobuf(&c, &path, envelope("v1", "Pod", &pod)).await);
    assert_eq!((code, reason.as_str()), (415, "UnsupportedMediaType"));
    assert!(message.contains("spec.containers[0].livenessProbe"), "{message}");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), NS);
    assert!(pods.get_opt("probed").await.unwrap().is_none());

    // Garbage after the magic: 400, and custom resources have no protobuf form: 415.
    let (code, _, _) = api_error(post_protobuf(&c, &path, b"k8s\0\x0a\xff".to_vec()).await);
    assert_eq!(code, 400);
    let toys_path = format!("/apis/toys.example.com/v1/namespaces/{NS}/toys");
    let (code, _, message) = api_error(
        post_protobuf(
            &c,
            &toys_path,
            envelope("toys.example.com/v1", "Toy", &pb::Secret::default()),
        )
        .await,
    );
    assert_eq!(code, 415, "{message}");
    let toys: Api<DynamicObject> = Api::namespaced_with(
        c,
        NS,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("toys.example.com", "v1", "Toy"),
            "toys",
        ),
    );
    assert!(toys.list(&Default::default()).await.unwrap().items.is_empty());
}
