//! Test controls: injected faults, request counts, discovery, the kubeconfig and the binary's
//! clients (`kube::Discovery`, and `kubectl` when the machine has it).

mod common;

use std::time::Duration;

use common::*;
use egress_kube_testserver::{Fault, TestServer, Verb};
use kube::api::{ListParams, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use serde_json::json;

#[tokio::test]
async fn an_injected_failure_hits_the_next_matching_requests_only() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    s.faults().inject(Fault::fail(Verb::Patch, "toys", 500).times(2));
    let patch = Patch::Merge(json!({"spec": {"size": 2}}));
    for _ in 0..2 {
        let (code, reason, _) = api_error(api.patch("a", &PatchParams::default(), &patch).await);
        assert_eq!((code, reason.as_str()), (500, "InternalError"));
    }
    assert_eq!(
        api.get("a").await.unwrap().spec.size,
        1,
        "a failed request changed nothing"
    );
    api.patch("a", &PatchParams::default(), &patch).await.unwrap();
    assert_eq!(s.faults().pending(), 0);
    // Any verb, any resource.
    s.faults().inject(Fault::fail(Verb::Get, "*", 403).any_verb());
    let (code, reason, _) = api_error(api.list(&ListParams::default()).await);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
}

#[tokio::test]
async fn the_kube_client_retries_an_injected_503_by_itself() {
    // kube 5 retries 429, 503 and 504: a fault of those codes shows up as extra requests, not an
    // error, unless it outlasts the client's retries.
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    s.faults().inject(Fault::fail(Verb::Get, "toys", 503));
    api.get("a").await.unwrap();
    assert_eq!(s.requests().count(Verb::Get, "toys"), 2);
}

#[tokio::test]
async fn an_injected_failure_can_target_the_status_subresource() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    s.faults().inject(Fault::fail(Verb::Patch, "toys/status", 409));
    let status = Patch::Merge(json!({"status": {"ready": true}}));
    let (code, _, _) = api_error(api.patch_status("a", &PatchParams::default(), &status).await);
    assert_eq!(code, 409);
    resize_toy(&api, "a", 2).await;
    api.patch_status("a", &PatchParams::default(), &status).await.unwrap();
}

#[tokio::test]
async fn an_injected_delay_holds_only_the_request_it_matches() {
    let s = server().await;
    let api = toys(&s);
    s.faults()
        .inject(Fault::delay(Verb::List, "toys", Duration::from_secs(3600)));
    let held = tokio::spawn({
        let api = api.clone();
        async move { api.list(&ListParams::default()).await }
    });
    // Wait until the server has taken the held request, by its count (it counts before it holds).
    within("the held request to arrive", async {
        while s.requests().count(Verb::List, "toys") == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The next list is not delayed (the rule was used up) and other requests flow meanwhile.
    api.list(&ListParams::default()).await.unwrap();
    create_toy(&api, "a", 1).await;
    assert!(!held.is_finished(), "the delayed request is still held");
    held.abort();
}

#[tokio::test]
async fn requests_are_counted_by_verb_and_resource() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    api.get("a").await.unwrap();
    api.get("a").await.unwrap();
    api.list(&ListParams::default()).await.unwrap();
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"ready": true}})),
    )
    .await
    .unwrap();
    assert_eq!(s.requests().count(Verb::Create, "toys"), 1);
    assert_eq!(s.requests().count(Verb::Get, "toys"), 2);
    assert_eq!(s.requests().count(Verb::List, "toys"), 1);
    assert_eq!(s.requests().count(Verb::Patch, "toys/status"), 1);
    assert_eq!(s.requests().writes("toys"), 1);
    assert_eq!(s.requests().writes("*"), 2);
    s.requests().reset();
    api.get("a").await.unwrap();
    assert_eq!(s.requests().writes("*"), 0, "steady state: reads only");
}

#[tokio::test]
async fn discovery_lists_built_in_and_custom_kinds() {
    let s = server().await;
    let discovery = Discovery::new(client(&s)).run().await.unwrap();
    let mut found = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            found.push((ar.group.clone(), ar.plural.clone(), caps.scope == Scope::Namespaced));
        }
    }
    for want in [
        ("", "pods", true),
        ("", "secrets", true),
        ("", "namespaces", false),
        ("", "events", true),
        ("events.k8s.io", "events", true),
        ("coordination.k8s.io", "leases", true),
        ("toys.example.com", "toys", true),
        ("toys.example.com", "gadgets", false),
    ] {
        let want = (want.0.to_string(), want.1.to_string(), want.2);
        assert!(found.contains(&want), "{want:?} missing from {found:?}");
    }
    let version = client(&s).apiserver_version().await.unwrap();
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "33"));
}

#[tokio::test]
async fn the_kubeconfig_works_for_kube_clients() {
    let s = server().await;
    let dir = egress_testkit::scratch_dir("kts-kubeconfig");
    let path = dir.join("config");
    s.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    client.apiserver_version().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn shutdown_ends_open_watches() {
    use futures::StreamExt;
    let s = server().await;
    let api = toys(&s);
    let mut stream = api
        .watch(&kube::api::WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    s.shutdown().await;
    let rest = within("the watch to end at shutdown", async {
        let mut n = 0;
        while let Some(Ok(_)) = stream.next().await {
            n += 1;
        }
        n
    })
    .await;
    assert_eq!(rest, 0);
}

#[tokio::test]
async fn a_second_server_is_independent() {
    let a = server().await;
    let b = TestServer::start().await.unwrap();
    assert_ne!(a.addr(), b.addr());
    create_toy(&toys(&a), "x", 1).await;
    let (code, _, _) = api_error(toys(&b).get("x").await);
    assert_eq!(code, 404, "b does not serve toys at all");
}

#[tokio::test]
async fn requests_are_also_counted_per_named_client() {
    let s = server().await;
    let operator: kube::Api<Toy> = kube::Api::namespaced(s.client_named("operator").unwrap(), NS);
    create_toy(&toys(&s), "a", 1).await;
    operator.get("a").await.unwrap();
    operator.list(&ListParams::default()).await.unwrap();
    let mine = s.requests().by_client("operator");
    assert_eq!(mine.get(&(Verb::Get, "toys".to_string())), Some(&1));
    assert_eq!(mine.get(&(Verb::List, "toys".to_string())), Some(&1));
    assert_eq!(
        mine.get(&(Verb::Create, "toys".to_string())),
        None,
        "the test's own create is not the operator's"
    );
    assert_eq!(s.requests().count(Verb::Create, "toys"), 1);
}
