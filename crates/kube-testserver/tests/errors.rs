//! Bad requests get the status code and reason the real API server gives, and nothing panics.

mod common;

use common::*;
use egress_kube_testserver::TestServer;
use serde_json::{Value, json};

/// Sends a raw request and returns the status code and the decoded body.
async fn raw(s: &TestServer, method: &str, path: &str, content_type: Option<&str>, body: &[u8]) -> (u16, Value) {
    let mut req = http::Request::builder().method(method).uri(path);
    if let Some(ct) = content_type {
        req = req.header(http::header::CONTENT_TYPE, ct);
    }
    let req = req.body(kube::client::Body::from(body.to_vec())).unwrap();
    let resp = within("a raw request", client(s).send(req))
        .await
        .expect("an HTTP answer");
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect_bytes().await.unwrap();
    (
        code,
        serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into())),
    )
}

fn reason(v: &Value) -> &str {
    assert_eq!(v["kind"], "Status", "{v}");
    v["reason"].as_str().unwrap_or_default()
}

const TOYS: &str = "/apis/toys.example.com/v1/namespaces/tests/toys";

#[tokio::test]
async fn malformed_json_is_a_bad_request() {
    let s = server().await;
    let (code, body) = raw(&s, "POST", TOYS, Some("application/json"), b"{\"apiVersion\": ").await;
    assert_eq!((code, reason(&body)), (400, "BadRequest"));
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("the object provided is unrecognized (must be of type Toy)")
    );
    let (code, _) = raw(&s, "POST", TOYS, Some("application/json"), b"[1, 2]").await;
    assert_eq!(code, 400);
    let (code, body) = raw(
        &s,
        "POST",
        TOYS,
        Some("application/json"),
        br#"{"apiVersion": "toys.example.com/v1", "kind": "Gadget", "metadata": {"name": "a"}}"#,
    )
    .await;
    assert_eq!((code, reason(&body)), (400, "BadRequest"));
    assert_eq!(
        body["message"],
        "the kind in the data (Gadget) does not match the expected kind (Toy)"
    );
}

#[tokio::test]
async fn unknown_resources_groups_and_versions_are_not_found() {
    let s = server().await;
    for path in [
        "/apis/toys.example.com/v1/namespaces/tests/robots",
        "/apis/toys.example.com/v9/namespaces/tests/toys",
        "/apis/nowhere.io/v1/things",
        "/api/v1/namespaces/tests/pods/a/exec",
        "/totally/else",
    ] {
        let (code, body) = raw(&s, "GET", path, None, b"").await;
        assert_eq!((code, reason(&body)), (404, "NotFound"), "{path}");
        assert_eq!(
            body["message"], "the server could not find the requested resource",
            "{path}"
        );
    }
}

#[tokio::test]
async fn wrong_content_types_are_unsupported_media() {
    let s = server().await;
    let toy = serde_json::to_vec(&json!({"apiVersion": "toys.example.com/v1", "kind": "Toy",
        "metadata": {"name": "a"}, "spec": {"size": 1}}))
    .unwrap();
    let (code, body) = raw(&s, "POST", TOYS, Some("application/vnd.kubernetes.protobuf"), &toy).await;
    assert_eq!((code, reason(&body)), (415, "UnsupportedMediaType"));
    let (code, body) = raw(&s, "POST", TOYS, Some("text/plain"), &toy).await;
    assert_eq!((code, reason(&body)), (415, "UnsupportedMediaType"));
    let (code, _) = raw(&s, "POST", TOYS, Some("application/json"), &toy).await;
    assert_eq!(code, 201);
    let (code, body) = raw(&s, "PATCH", &format!("{TOYS}/a"), Some("application/json"), b"{}").await;
    assert_eq!((code, reason(&body)), (415, "UnsupportedMediaType"));
    // YAML bodies are accepted, as by the real server.
    let yaml = b"apiVersion: toys.example.com/v1\nkind: Toy\nmetadata:\n  name: from-yaml\nspec:\n  size: 2\n";
    let (code, body) = raw(&s, "POST", TOYS, Some("application/yaml"), yaml).await;
    assert_eq!(code, 201, "{body}");
}

#[tokio::test]
async fn patches_that_do_not_parse_or_do_not_apply() {
    let s = server().await;
    create_toy(&toys(&s), "a", 1).await;
    let item = format!("{TOYS}/a");
    let (code, body) = raw(&s, "PATCH", &item, Some("application/merge-patch+json"), b"{not json").await;
    assert_eq!((code, reason(&body)), (400, "BadRequest"));
    let (code, body) = raw(
        &s,
        "PATCH",
        &item,
        Some("application/json-patch+json"),
        br#"{"op": "add"}"#,
    )
    .await;
    assert_eq!((code, reason(&body)), (400, "BadRequest"));
    let (code, body) = raw(
        &s,
        "PATCH",
        &item,
        Some("application/json-patch+json"),
        br#"[{"op": "replace", "path": "/spec/nothing/deeper", "value": 1}]"#,
    )
    .await;
    assert_eq!((code, reason(&body)), (422, "Invalid"));
    let (code, body) = raw(
        &s,
        "PATCH",
        &item,
        Some("application/merge-patch+json"),
        br#"{"spec": {"size": "big"}}"#,
    )
    .await;
    assert_eq!((code, reason(&body)), (422, "Invalid"));
    assert_eq!(body["details"]["causes"][0]["field"], "spec.size");
    let (code, body) = raw(
        &s,
        "PATCH",
        &item,
        Some("application/merge-patch+json"),
        br#"{"metadata": {"name": "b"}}"#,
    )
    .await;
    assert_eq!((code, reason(&body)), (400, "BadRequest"));
    assert_eq!(
        body["message"],
        "the name of the object (b) does not match the name on the URL (a)"
    );
    let (code, _) = raw(
        &s,
        "PATCH",
        &format!("{TOYS}/missing"),
        Some("application/merge-patch+json"),
        b"{}",
    )
    .await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn hostile_bodies_and_methods_are_refused_cleanly() {
    let s = server().await;
    let huge = vec![b' '; 4 * 1024 * 1024];
    let (code, body) = raw(&s, "POST", TOYS, Some("application/json"), &huge).await;
    assert_eq!((code, reason(&body)), (413, "RequestEntityTooLarge"));
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let (code, _) = raw(&s, "POST", TOYS, Some("application/json"), deep.as_bytes()).await;
    assert_eq!(code, 400, "a deeply nested body is refused, not a stack overflow");
    let (code, body) = raw(&s, "PUT", TOYS, Some("application/json"), b"{}").await;
    assert_eq!((code, reason(&body)), (405, "MethodNotAllowed"));
    let (code, body) = raw(&s, "GET", &format!("{TOYS}?labelSelector=a%20in%20b"), None, b"").await;
    assert_eq!((code, reason(&body)), (400, "BadRequest"));
    let (code, _) = raw(&s, "GET", &format!("{TOYS}?limit=many"), None, b"").await;
    assert_eq!(code, 400);
    let (code, _) = raw(&s, "GET", &format!("{TOYS}?watch=true&resourceVersion=abc"), None, b"").await;
    assert_eq!(code, 400);
    let (code, _) = raw(
        &s,
        "POST",
        &format!("{TOYS}?dryRun=Maybe"),
        Some("application/json"),
        b"{}",
    )
    .await;
    assert_eq!(code, 400);
    let (code, _) = raw(&s, "DELETE", &format!("{TOYS}/a"), Some("application/json"), b"{oops").await;
    assert_eq!(code, 400);
    // The server still serves after all of it.
    let (code, _) = raw(&s, "GET", TOYS, None, b"").await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn an_apply_body_that_expands_without_bound_is_refused() {
    let s = server().await;
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 0..12 {
        let prev = if i == 0 { "a".to_string() } else { format!("l{}", i - 1) };
        bomb.push_str(&format!(
            "l{i}: &l{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        ));
    }
    let (code, body) = raw(
        &s,
        "PATCH",
        &format!("{TOYS}/a?fieldManager=m"),
        Some("application/apply-patch+yaml"),
        bomb.as_bytes(),
    )
    .await;
    assert_eq!((code, reason(&body)), (400, "BadRequest"), "{body}");
}

#[tokio::test]
async fn a_protobuf_only_client_is_not_acceptable() {
    let s = server().await;
    let req = http::Request::builder()
        .uri(TOYS)
        .header(http::header::ACCEPT, "application/vnd.kubernetes.protobuf")
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = client(&s).send(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 406);
}

#[tokio::test]
async fn watch_parameters_the_real_server_refuses_together() {
    let s = server().await;
    let (code, body) = raw(
        &s,
        "GET",
        &format!("{TOYS}?watch=true&resourceVersionMatch=NotOlderThan"),
        None,
        b"",
    )
    .await;
    assert_eq!((code, reason(&body)), (422, "Invalid"));
    let (code, body) = raw(
        &s,
        "GET",
        &format!("{TOYS}?watch=true&sendInitialEvents=false"),
        None,
        b"",
    )
    .await;
    assert_eq!((code, reason(&body)), (422, "Invalid"));
    let (code, body) = raw(&s, "GET", &format!("{TOYS}?watch=true&timeoutSeconds=soon"), None, b"").await;
    assert_eq!((code, reason(&body)), (400, "BadRequest"));
}
