//! The kubernetes provider against `egress-kube-testserver`, which speaks the real API with its
//! semantics (object names, label selectors, the status subresource, delete answering with the
//! object, Status bodies with reasons) and injects faults by verb and resource. What it does not
//! cover: a kubelet (Pods never run by themselves; the tests set their status) and admission
//! (Pod Security is not enforced).

use egress_kube_testserver::{Fault, TestServer, Verb};
use egress_provider::{CreateRequest, ErrorClass, InstanceState, OpCtx, Placement, Provider, ProviderId};
use egress_provider_kubernetes::pod::PodSettings;
use egress_provider_kubernetes::provider::KubernetesProvider;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};

async fn server() -> TestServer {
    TestServer::builder()
        .namespace("crawl")
        .start()
        .await
        .expect("test server")
}

fn provider(s: &TestServer) -> KubernetesProvider {
    KubernetesProvider::new("k8s-home", s.client().unwrap(), s.url(), PodSettings::default())
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        name: egress_provider::name_from_uid(uid),
        uid: uid.to_owned(),
        namespace: "crawl".into(),
        proxy_name: format!("proxy-{uid}"),
        placement: Placement::default(),
        cloud_init: Vec::new(),
        port: 3128,
        installation: None,
        credentials: None,
        spread_group: None,
    }
}

/// What a kubelet would report.
async fn run(s: &TestServer, name: &str, ip: &str) {
    let pods: Api<Pod> = Api::namespaced(s.client().unwrap(), "crawl");
    let status = serde_json::json!({"status": {"phase": "Running", "podIP": ip}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_pod_is_created_read_listed_and_deleted() {
    let s = server().await;
    let p = provider(&s);
    let cx = OpCtx::background();
    let req = request("u-1");
    let id = p.create(&cx, &req).await.unwrap();
    assert_eq!(id.as_str(), format!("crawl/{}", req.name));
    // Idempotent by name.
    assert_eq!(p.create(&cx, &req).await.unwrap(), id);
    let got = p.get(&cx, &id).await.unwrap();
    assert_eq!(
        (got.state, got.ip, got.uid.as_str()),
        (InstanceState::Provisioning, None, "u-1")
    );
    assert!(got.created_at.is_some());
    run(&s, &req.name, "10.1.2.3").await;
    let got = p.get(&cx, &id).await.unwrap();
    assert_eq!(
        (got.state, got.ip),
        (InstanceState::Running, Some("10.1.2.3".parse().unwrap()))
    );
    let listed = p.list_by_tag(&cx).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].id.clone(), listed[0].uid.as_str()), (id.clone(), "u-1"));
    p.delete(&cx, &id).await.unwrap();
    let e = p.get(&cx, &id).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::NotFound, "{e}");
    p.delete(&cx, &id).await.unwrap();
    assert!(p.list_by_tag(&cx).await.unwrap().is_empty());
}

/// The test server schedules nothing, so the spread is checked on the Pod as stored: what a
/// scheduler would read.
#[tokio::test]
async fn a_pools_pods_carry_their_spread_over_nodes_and_a_bad_group_is_refused() {
    let s = server().await;
    let p = provider(&s);
    let cx = OpCtx::background();
    let pods: Api<Pod> = Api::namespaced(s.client().unwrap(), "crawl");
    for uid in ["u-a", "u-b"] {
        let req = CreateRequest {
            spread_group: Some("pool-uid-1".into()),
            ..request(uid)
        };
        p.create(&cx, &req).await.unwrap();
    }
    let grouped = pods
        .list(&kube::api::ListParams::default().labels("proxy-operator-spread-group=pool-uid-1"))
        .await
        .unwrap()
        .items;
    assert_eq!(grouped.len(), 2, "the group's label selects both Pods");
    for pod in &grouped {
        let spread = pod.spec.as_ref().unwrap().topology_spread_constraints.clone().unwrap();
        let c = &spread[0];
        assert_eq!(
            (c.topology_key.as_str(), c.when_unsatisfiable.as_str(), c.max_skew),
            ("kubernetes.io/hostname", "ScheduleAnyway", 1)
        );
        let selector = c.label_selector.as_ref().unwrap().match_labels.clone().unwrap();
        assert_eq!(selector["proxy-operator-spread-group"], "pool-uid-1");
    }
    let bad = CreateRequest {
        spread_group: Some("not a label".into()),
        ..request("u-c")
    };
    let e = p.create(&cx, &bad).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("not a label value"), "{e}");
    assert!(pods.get_opt(&bad.name).await.unwrap().is_none(), "nothing made");
}

#[tokio::test]
async fn another_proxys_pod_of_the_name_is_not_adopted() {
    let s = server().await;
    let p = provider(&s);
    let cx = OpCtx::background();
    let mut req = request("u-2");
    p.create(&cx, &req).await.unwrap();
    req.uid = "someone-else".into();
    let e = p.create(&cx, &req).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent);
    assert!(
        e.to_string().contains("u-2") && e.to_string().contains("someone-else"),
        "{e}"
    );
}

#[tokio::test]
async fn api_answers_are_classified() {
    let s = server().await;
    let p = provider(&s);
    let cx = OpCtx::background();
    for (verb, status, op_create, want) in [
        (Verb::Create, 403, true, ErrorClass::Permanent),
        (Verb::Create, 422, true, ErrorClass::Permanent),
        (Verb::Create, 404, true, ErrorClass::Transient),
        (Verb::Create, 500, true, ErrorClass::Transient),
        (Verb::Create, 429, true, ErrorClass::Transient),
        (Verb::Get, 500, false, ErrorClass::Transient),
        (Verb::Get, 401, false, ErrorClass::Permanent),
    ] {
        // Several: kube's client itself retries 429, 503 and 504 a few times.
        s.faults().inject(Fault::fail(verb, "pods", status).times(20));
        let e = if op_create {
            p.create(&cx, &request("u-3")).await.unwrap_err()
        } else {
            p.get(&cx, &ProviderId::new("crawl/proxy-x")).await.unwrap_err()
        };
        assert_eq!(e.class(), want, "{verb:?} {status}: {e}");
        assert!(e.to_string().starts_with("k8s-home "), "the configured name: {e}");
        s.faults().clear();
    }
    let e = p.get(&cx, &ProviderId::new("crawl/")).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent);
}

#[tokio::test]
async fn the_check_lists_once_and_names_the_reason() {
    let s = server().await;
    let p = provider(&s);
    let cx = OpCtx::background();
    let checker = p.checker().unwrap();
    let ok = checker.check(&cx).await;
    assert_eq!(ok.len(), 1);
    assert!(ok[0].ready, "{ok:?}");
    assert_eq!(
        (ok[0].name.as_str(), ok[0].address.as_str()),
        ("apiserver", s.url().as_str())
    );
    assert!(ok[0].details.contains_key("version"), "{ok:?}");
    let lists = s.requests().count(Verb::List, "pods");
    for (status, reason) in [(403, "Forbidden"), (401, "Unauthorized"), (500, "APIError")] {
        s.faults().inject(Fault::fail(Verb::List, "pods", status));
        let failed = checker.check(&cx).await;
        assert_eq!(failed[0].reason, reason, "{status}: {failed:?}");
        assert!(!failed[0].ready);
        s.faults().clear();
    }
    // One list per check.
    assert_eq!(s.requests().count(Verb::List, "pods"), lists + 3);
    // A gateway timeout, past kube's own retries.
    s.faults().inject(Fault::fail(Verb::List, "pods", 504).times(20));
    assert_eq!(checker.check(&cx).await[0].reason, "Timeout");
}

#[tokio::test]
async fn a_pod_being_deleted_is_stopped_not_running() {
    let s = server().await;
    let p = provider(&s);
    let cx = OpCtx::background();
    let req = request("u-4");
    let id = p.create(&cx, &req).await.unwrap();
    run(&s, &req.name, "10.1.2.4").await;
    assert_eq!(p.get(&cx, &id).await.unwrap().state, InstanceState::Running);
    // A finalizer keeps it in its grace period, as a kubelet stopping it would.
    let pods: Api<Pod> = Api::namespaced(s.client().unwrap(), "crawl");
    let hold = serde_json::json!({"metadata": {"finalizers": ["test.egress/hold"]}});
    pods.patch(&req.name, &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .unwrap();
    p.delete(&cx, &id).await.unwrap();
    let got = p.get(&cx, &id).await.unwrap();
    assert_eq!((got.state, got.ip), (InstanceState::Stopped, None));
}

#[tokio::test]
async fn the_check_lists_at_most_one_managed_pod_cluster_wide() {
    let s = server().await;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = seen.clone();
    s.faults().set_hook(Some(std::sync::Arc::new(
        move |r: egress_kube_testserver::HookedRequest| {
            kept.lock().unwrap().push(r);
            Box::pin(async { egress_kube_testserver::HookVerdict::Serve })
        },
    )));
    let p = provider(&s);
    let status = p.checker().unwrap().check(&OpCtx::background()).await;
    assert!(status[0].ready, "{status:?}");
    let seen = seen.lock().unwrap();
    let lists: Vec<_> = seen.iter().filter(|r| r.verb == Verb::List).collect();
    assert_eq!(lists.len(), 1, "{seen:?}");
    assert_eq!(lists[0].namespace, None, "cluster-wide");
    let query = lists[0].query.as_deref().unwrap_or_default();
    assert!(query.contains("limit=1"), "{query}");
    assert!(query.contains("labelSelector=proxy-operator-managed%3Dtrue"), "{query}");
}

/// `kubernetes.namespace`: Pods only there. A Proxy elsewhere is refused for good, and Pods of
/// other namespaces are neither listed, read nor deleted (the entry's RBAC is a Role there).
#[tokio::test]
async fn an_entry_with_a_namespace_stays_in_it() {
    let s = TestServer::builder()
        .namespace("crawl")
        .namespace("other")
        .start()
        .await
        .expect("test server");
    let cx = OpCtx::background();
    // A managed Pod in another namespace, made by an entry without a namespace.
    let mut elsewhere = request("u-elsewhere");
    elsewhere.namespace = "other".into();
    let foreign = provider(&s).create(&cx, &elsewhere).await.unwrap();
    let scoped = KubernetesProvider::new(
        "k8s-crawl",
        s.client().unwrap(),
        s.url(),
        PodSettings {
            namespace: Some("crawl".into()),
            ..PodSettings::default()
        },
    );
    let e = scoped.create(&cx, &elsewhere).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("only in namespace crawl, not other"), "{e}");
    for e in [
        scoped.get(&cx, &foreign).await.unwrap_err(),
        scoped.delete(&cx, &foreign).await.unwrap_err(),
    ] {
        assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    }
    let own = scoped.create(&cx, &request("u-own")).await.unwrap();
    let listed: Vec<ProviderId> = scoped
        .list_by_tag(&cx)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(listed, [own], "only the entry's namespace is listed");
    // The foreign Pod is still there.
    assert!(provider(&s).get(&cx, &foreign).await.is_ok());
}

/// An operator that serves some namespaces only: an entry without a namespace of its own places
/// Pods only in those, and lists them one namespace at a time (its RBAC is a Role in each).
#[tokio::test]
async fn an_entry_of_an_operator_serving_some_namespaces_stays_in_them() {
    let s = TestServer::builder()
        .namespace("crawl")
        .namespace("team-b")
        .namespace("other")
        .start()
        .await
        .expect("test server");
    let cx = OpCtx::background();
    let mut elsewhere = request("u-elsewhere");
    elsewhere.namespace = "other".into();
    let foreign = provider(&s).create(&cx, &elsewhere).await.unwrap();
    let served = provider(&s).serving(Some(vec!["crawl".into(), "team-b".into()]));
    let e = served.create(&cx, &elsewhere).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert!(
        e.to_string()
            .contains("serves only the namespaces crawl, team-b (--proxy-namespace), not other"),
        "{e}"
    );
    assert_eq!(
        served.delete(&cx, &foreign).await.unwrap_err().class(),
        ErrorClass::Permanent
    );
    let mut in_b = request("u-b");
    in_b.namespace = "team-b".into();
    let mut own = vec![
        served.create(&cx, &request("u-own")).await.unwrap(),
        served.create(&cx, &in_b).await.unwrap(),
    ];
    own.sort();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = seen.clone();
    s.faults().set_hook(Some(std::sync::Arc::new(
        move |r: egress_kube_testserver::HookedRequest| {
            kept.lock().unwrap().push(r);
            Box::pin(async { egress_kube_testserver::HookVerdict::Serve })
        },
    )));
    let mut listed: Vec<ProviderId> = served
        .list_by_tag(&cx)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    listed.sort();
    assert_eq!(listed, own, "only the namespaces served are listed");
    let status = served.checker().unwrap().check(&cx).await;
    assert!(status[0].ready, "{status:?}");
    let lists: Vec<Option<String>> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.verb == Verb::List)
        .map(|r| r.namespace.clone())
        .collect();
    let served_ns = [Some("crawl".to_owned()), Some("team-b".to_owned())];
    assert_eq!(
        lists,
        [served_ns.clone(), served_ns].concat(),
        "never across namespaces"
    );
    // A namespace that cannot be listed (the second) fails the whole list.
    s.faults()
        .set_hook(Some(std::sync::Arc::new(|r: egress_kube_testserver::HookedRequest| {
            let forbidden = r.verb == Verb::List && r.namespace.as_deref() == Some("team-b");
            Box::pin(async move {
                if forbidden {
                    egress_kube_testserver::HookVerdict::Fail {
                        code: 403,
                        reason: None,
                        message: "pods is forbidden".into(),
                    }
                } else {
                    egress_kube_testserver::HookVerdict::Serve
                }
            })
        })));
    let e = served.list_by_tag(&cx).await.unwrap_err();
    assert!(e.to_string().contains("forbidden"), "{e}");
}

/// A hook that, on the provider's first patch of a Pod, writes `label=value` on Pod `name`
/// through another client before the patch is served: someone labelling the Pod between the
/// provider's read and its write.
fn label_before_the_first_patch(s: &TestServer, name: &str, label: &'static str, value: &'static str) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (meddled, other, name) = (
        Arc::new(AtomicBool::new(false)),
        s.client_named("other").unwrap(),
        name.to_owned(),
    );
    s.faults()
        .set_hook(Some(Arc::new(move |r: egress_kube_testserver::HookedRequest| {
            let (meddled, other, name) = (meddled.clone(), other.clone(), name.clone());
            Box::pin(async move {
                if r.verb == Verb::Patch && r.client.is_none() && !meddled.swap(true, Ordering::SeqCst) {
                    let pods: Api<Pod> = Api::namespaced(other, "crawl");
                    let labels = serde_json::json!({"metadata": {"labels": {label: value}}});
                    pods.patch(&name, &PatchParams::default(), &Patch::Merge(&labels))
                        .await
                        .expect("the other client's label");
                }
                egress_kube_testserver::HookVerdict::Serve
            })
        })));
}

fn label_of(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.labels.as_ref().and_then(|l| l.get(key)).cloned()
}

#[tokio::test]
async fn a_mark_is_one_label_patch_on_the_version_read_and_a_second_mark_sends_none() {
    let s = server().await;
    let p = provider(&s);
    let cx = OpCtx::background();
    let req = request("u-mark");
    let id = p.create(&cx, &req).await.unwrap();
    p.mark_installation(&cx, &id, "blue").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client().unwrap(), "crawl");
    let pod = pods.get(&req.name).await.unwrap();
    assert_eq!(
        label_of(&pod, egress_provider::LABEL_INSTALLATION).as_deref(),
        Some("blue")
    );
    assert_eq!(label_of(&pod, egress_provider::LABEL_UID).as_deref(), Some("u-mark"));
    assert_eq!(p.get(&cx, &id).await.unwrap().installation.as_deref(), Some("blue"));
    let patches = s.requests().count(Verb::Patch, "pods");
    assert_eq!(patches, 1);
    p.mark_installation(&cx, &id, "blue").await.unwrap();
    assert_eq!(
        s.requests().count(Verb::Patch, "pods"),
        patches,
        "a second mark patched"
    );
}

#[tokio::test]
async fn a_label_written_between_the_read_and_the_patch_fails_the_mark_and_is_kept() {
    let s = server().await;
    let p = provider(&s);
    let cx = OpCtx::background();
    let req = request("u-race");
    let id = p.create(&cx, &req).await.unwrap();
    label_before_the_first_patch(&s, &req.name, egress_provider::LABEL_INSTALLATION, "green");
    let e = p.mark_installation(&cx, &id, "blue").await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Transient, "{e}");
    // Read again, the Pod is another installation's: refused, and left as it is.
    let e = p.mark_installation(&cx, &id, "blue").await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    let pods: Api<Pod> = Api::namespaced(s.client().unwrap(), "crawl");
    let pod = pods.get(&req.name).await.unwrap();
    assert_eq!(
        label_of(&pod, egress_provider::LABEL_INSTALLATION).as_deref(),
        Some("green")
    );
}
