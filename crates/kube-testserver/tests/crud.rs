//! Create, read, list, update and delete through `kube::Api`, with the real server's rules.

mod common;

use std::collections::BTreeMap;

use common::*;
use egress_kube_testserver::TestServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};

#[tokio::test]
async fn create_sets_server_fields_and_refuses_a_duplicate() {
    let s = server().await;
    let api = toys(&s);
    let created = create_toy(&api, "a", 3).await;
    let uid = created.uid().expect("a uid");
    assert_eq!(uid.len(), 36);
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    let rv: u64 = created
        .resource_version()
        .unwrap()
        .parse()
        .expect("a numeric resourceVersion");
    assert!(rv > 0);
    let (code, reason, message) = api_error(api.create(&PostParams::default(), &toy("a", 3)).await);
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(message, "toys.toys.example.com \"a\" already exists");
    let second = create_toy(&api, "b", 3).await;
    assert_ne!(second.uid(), Some(uid));
    let rv2: u64 = second.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv, "resourceVersions grow");
}

#[tokio::test]
async fn generate_name_gets_a_random_suffix() {
    let s = server().await;
    let api = toys(&s);
    let mut t = toy("", 2);
    t.metadata.name = None;
    t.metadata.generate_name = Some("gen-".into());
    let a = api.create(&PostParams::default(), &t).await.unwrap();
    let b = api.create(&PostParams::default(), &t).await.unwrap();
    assert!(
        a.name_any().starts_with("gen-") && a.name_any().len() == 9,
        "{}",
        a.name_any()
    );
    assert_ne!(a.name_any(), b.name_any());
    t.metadata.generate_name = None;
    let (code, reason, message) = api_error(api.create(&PostParams::default(), &t).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        message.contains("metadata.name: Required value: name or generateName is required"),
        "{message}"
    );
}

#[tokio::test]
async fn get_of_a_missing_object_is_a_not_found_status() {
    let s = server().await;
    let (code, reason, message) = api_error(toys(&s).get("nope").await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert_eq!(message, "toys.toys.example.com \"nope\" not found");
    let pods: Api<Pod> = Api::namespaced(client(&s), NS);
    let (_, _, message) = api_error(pods.get("nope").await);
    assert_eq!(message, "pods \"nope\" not found");
    assert!(toys(&s).get_opt("nope").await.unwrap().is_none());
}

async fn labelled(api: &Api<Toy>, name: &str, labels: &[(&str, &str)]) {
    let mut t = toy(name, 1);
    t.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    api.create(&PostParams::default(), &t).await.unwrap();
}

async fn names(api: &Api<Toy>, lp: &ListParams) -> Vec<String> {
    api.list(lp).await.unwrap().items.iter().map(|t| t.name_any()).collect()
}

#[tokio::test]
async fn label_selectors_support_every_operator() {
    let s = server().await;
    let api = toys(&s);
    labelled(&api, "a", &[("app", "web"), ("tier", "front")]).await;
    labelled(&api, "b", &[("app", "web"), ("tier", "back")]).await;
    labelled(&api, "c", &[("app", "db")]).await;
    let cases = [
        ("app=web", vec!["a", "b"]),
        ("app==db", vec!["c"]),
        ("app!=web", vec!["c"]),
        ("tier in (front,back)", vec!["a", "b"]),
        ("tier notin (front)", vec!["b", "c"]),
        ("tier", vec!["a", "b"]),
        ("!tier", vec!["c"]),
        ("app=web,tier=back", vec!["b"]),
    ];
    for (selector, want) in cases {
        assert_eq!(
            names(&api, &ListParams::default().labels(selector)).await,
            want,
            "{selector}"
        );
    }
    let (code, reason, _) = api_error(api.list(&ListParams::default().labels("app in web")).await);
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
}

#[tokio::test]
async fn field_selectors_on_name_and_namespace() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    create_toy(&api, "b", 1).await;
    Api::<Toy>::namespaced(client(&s), "default")
        .create(&PostParams::default(), &toy("a", 1))
        .await
        .unwrap();
    assert_eq!(
        names(&api, &ListParams::default().fields("metadata.name=b")).await,
        vec!["b"]
    );
    assert_eq!(
        names(&api, &ListParams::default().fields("metadata.name!=b")).await,
        vec!["a"]
    );
    let all: Api<Toy> = Api::all(client(&s));
    let in_default = all
        .list(&ListParams::default().fields("metadata.namespace=default"))
        .await
        .unwrap();
    assert_eq!(in_default.items.len(), 1);
    assert_eq!(all.list(&ListParams::default()).await.unwrap().items.len(), 3);
    let (code, _, message) = api_error(api.list(&ListParams::default().fields("spec.size=1")).await);
    assert_eq!(code, 400);
    assert_eq!(message, "field label not supported: spec.size");
}

#[tokio::test]
async fn limit_and_continue_page_through_a_list() {
    let s = server().await;
    let api = toys(&s);
    for i in 0..7 {
        create_toy(&api, &format!("t{i}"), 1).await;
    }
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 3);
        seen.extend(page.items.iter().map(|t| t.name_any()));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => {
                assert!(page.metadata.remaining_item_count.unwrap() > 0);
                lp = lp.continue_token(&token);
            }
            _ => break,
        }
        assert!(pages < 10, "paging must end");
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, (0..7).map(|i| format!("t{i}")).collect::<Vec<_>>());
    let (code, _, _) = api_error(api.list(&ListParams::default().continue_token("garbage!")).await);
    assert_eq!(code, 400);
}

#[tokio::test]
async fn update_with_a_stale_resource_version_is_a_conflict() {
    let s = server().await;
    let api = toys(&s);
    let first = create_toy(&api, "a", 1).await;
    let mut fresh = first.clone();
    fresh.spec.size = 2;
    let updated = api.replace("a", &PostParams::default(), &fresh).await.unwrap();
    assert_eq!(updated.metadata.generation, Some(2));
    let mut stale = first;
    stale.spec.size = 3;
    let (code, reason, message) = api_error(api.replace("a", &PostParams::default(), &stale).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        message,
        "Operation cannot be fulfilled on toys.toys.example.com \"a\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(api.get("a").await.unwrap().spec.size, 2);
    // Without a resourceVersion: refused for custom resources, unconditional for built-in kinds.
    let mut blind = toy("a", 4);
    blind.metadata.resource_version = None;
    let (code, _, message) = api_error(api.replace("a", &PostParams::default(), &blind).await);
    assert_eq!(code, 422);
    assert!(
        message.ends_with("metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"),
        "{message}"
    );
    let secrets: Api<Secret> = Api::namespaced(client(&s), NS);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let mut labelled = secret.clone();
    labelled.metadata.labels = Some(BTreeMap::from([("a".to_string(), "b".to_string())]));
    secrets.replace("s", &PostParams::default(), &labelled).await.unwrap();
    let mut missing = toy("missing", 1);
    missing.metadata.resource_version = Some("1".into());
    let (code, _, _) = api_error(api.replace("missing", &PostParams::default(), &missing).await);
    assert_eq!(code, 404);
    let mut renamed = api.get("a").await.unwrap();
    renamed.metadata.name = Some("b".into());
    let (code, _, message) = api_error(api.replace("a", &PostParams::default(), &renamed).await);
    assert_eq!(code, 400);
    assert_eq!(
        message,
        "the name of the object (b) does not match the name on the URL (a)"
    );
}

#[tokio::test]
async fn sixteen_conflicting_writers_lose_no_update() {
    let s = server().await;
    let api = toys(&s);
    let mut counter = toy("counter", 1);
    counter.metadata.annotations = Some(BTreeMap::from([("count".to_string(), "0".to_string())]));
    api.create(&PostParams::default(), &counter).await.unwrap();
    const WRITERS: usize = 16;
    const EACH: usize = 5;
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0u32;
            for _ in 0..EACH {
                let mut attempts = 0;
                loop {
                    attempts += 1;
                    assert!(attempts < 1000, "a writer must eventually win");
                    let mut current = api.get("counter").await.unwrap();
                    let annotations = current.metadata.annotations.get_or_insert_with(BTreeMap::new);
                    let n: usize = annotations["count"].parse().unwrap();
                    annotations.insert("count".into(), (n + 1).to_string());
                    match api.replace("counter", &PostParams::default(), &current).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(e)) if e.code == 409 => conflicts += 1,
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += within("writers", t).await.unwrap();
    }
    let final_count: usize = api.get("counter").await.unwrap().annotations()["count"]
        .parse()
        .unwrap();
    assert_eq!(
        final_count,
        WRITERS * EACH,
        "no update may be lost ({conflicts} conflicts were retried)"
    );
}

#[tokio::test]
async fn an_object_in_a_missing_namespace_is_refused() {
    let s = server().await;
    let api: Api<Toy> = Api::namespaced(client(&s), "ghost");
    let (code, reason, message) = api_error(api.create(&PostParams::default(), &toy("a", 1)).await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert_eq!(message, "namespaces \"ghost\" not found");
    let secrets: Api<Secret> = Api::namespaced(client(&s), "ghost");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let (code, _, _) = api_error(secrets.create(&PostParams::default(), &secret).await);
    assert_eq!(code, 404);
}

#[tokio::test]
async fn deleting_a_namespace_takes_its_objects_and_refuses_new_ones_meanwhile() {
    let s = server().await;
    let namespaces: Api<Namespace> = Api::all(client(&s));
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("doomed".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces.create(&PostParams::default(), &ns).await.unwrap();
    let api: Api<Toy> = Api::namespaced(client(&s), "doomed");
    create_toy(&api, "plain", 1).await;
    let mut held = toy("held", 1);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    namespaces.delete("doomed", &DeleteParams::default()).await.unwrap();
    let terminating = namespaces.get("doomed").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.status.unwrap().phase.as_deref(), Some("Terminating"));
    assert!(api.get_opt("plain").await.unwrap().is_none());
    assert!(api.get("held").await.unwrap().metadata.deletion_timestamp.is_some());
    let (code, reason, message) = api_error(api.create(&PostParams::default(), &toy("late", 1)).await);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert!(message.contains("because it is being terminated"), "{message}");
    api.patch(
        "held",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(
        namespaces.get_opt("doomed").await.unwrap().is_none(),
        "the empty namespace goes"
    );
    let (code, _, _) = api_error(namespaces.delete("default", &DeleteParams::default()).await);
    assert_eq!(code, 403);
}

#[tokio::test]
async fn cluster_scoped_kinds_have_no_namespace() {
    let s = server().await;
    let gadgets: Api<Gadget> = Api::all(client(&s));
    let g = gadgets
        .create(
            &PostParams::default(),
            &Gadget::new("g", GadgetSpec { mode: "x".into() }),
        )
        .await
        .unwrap();
    assert_eq!(g.metadata.namespace, None);
    assert_eq!(gadgets.list(&ListParams::default()).await.unwrap().items.len(), 1);
    let ar = kube::api::ApiResource::erase::<Gadget>(&());
    let namespaced: Api<kube::api::DynamicObject> = Api::namespaced_with(client(&s), NS, &ar);
    let (code, _, _) = api_error(namespaced.get("g").await);
    assert_eq!(code, 404, "a cluster-scoped kind is not served under a namespace");
}

#[tokio::test]
async fn delete_answers_with_a_status_or_the_object_as_the_kind_does() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    let answer = api.delete("a", &DeleteParams::default()).await.unwrap();
    let status = answer
        .right()
        .expect("a custom resource deleted at once answers with a Status");
    assert_eq!(status.details.unwrap().name, "a");
    let pods: Api<Pod> = Api::namespaced(client(&s), NS);
    let pod: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let answer = pods.delete("p", &DeleteParams::default()).await.unwrap();
    assert_eq!(answer.left().expect("pods answer with the object").name_any(), "p");
    let (code, _, _) = api_error(api.delete("a", &DeleteParams::default()).await);
    assert_eq!(code, 404);
}

#[tokio::test]
async fn delete_preconditions_are_checked() {
    let s = server().await;
    let api = toys(&s);
    let t = create_toy(&api, "a", 1).await;
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("other".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let (code, _, message) = api_error(api.delete("a", &wrong).await);
    assert_eq!(code, 409);
    assert!(
        message.contains("Precondition failed: UID in precondition: other"),
        "{message}"
    );
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: t.uid(),
            resource_version: t.resource_version(),
        }),
        ..Default::default()
    };
    api.delete("a", &right).await.unwrap();
}

#[tokio::test]
async fn dry_run_writes_nothing() {
    let s = server().await;
    let api = toys(&s);
    let rv = s.resource_version();
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let would = api.create(&pp, &toy("a", 1)).await.unwrap();
    assert_eq!(would.name_any(), "a");
    assert!(api.get_opt("a").await.unwrap().is_none());
    create_toy(&api, "b", 1).await;
    api.delete(
        "b",
        &DeleteParams {
            dry_run: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(api.get_opt("b").await.unwrap().is_some());
    assert_eq!(s.resource_version(), rv + 1, "only the real create moved the clock");
}

#[tokio::test]
async fn delete_collection_takes_what_the_selector_picks() {
    let s = server().await;
    let api = toys(&s);
    labelled(&api, "a", &[("batch", "1")]).await;
    labelled(&api, "b", &[("batch", "1")]).await;
    labelled(&api, "c", &[("batch", "2")]).await;
    api.delete_collection(&DeleteParams::default(), &ListParams::default().labels("batch=1"))
        .await
        .unwrap();
    assert_eq!(names(&api, &ListParams::default()).await, vec!["c"]);
}

#[tokio::test]
async fn secrets_fold_string_data_into_data() {
    let s = server().await;
    let secrets: Api<Secret> = Api::namespaced(client(&s), NS);
    let secret: Secret = serde_json::from_value(serde_json::json!({"metadata": {"name": "s"},
        "stringData": {"userdata": "#cloud-config"}}))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let stored = secrets.get("s").await.unwrap();
    assert!(stored.string_data.is_none());
    assert_eq!(stored.data.unwrap()["userdata"].0, b"#cloud-config".to_vec());
}

#[tokio::test]
async fn leases_round_trip_for_leader_election() {
    let s = server().await;
    let leases: Api<Lease> = Api::namespaced(client(&s), NS);
    let lease: Lease = serde_json::from_value(serde_json::json!({"metadata": {"name": "leader"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut taken = created.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases.replace("leader", &PostParams::default(), &taken).await.unwrap();
    let mut late = created;
    late.spec.as_mut().unwrap().holder_identity = Some("c".into());
    let (code, _, _) = api_error(leases.replace("leader", &PostParams::default(), &late).await);
    assert_eq!(code, 409, "a second candidate with a stale copy loses");
    assert_eq!(
        leases
            .get("leader")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("b")
    );
}

#[tokio::test]
async fn events_are_one_set_served_through_both_apis() {
    let s = server().await;
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client(&s), NS);
    let e: k8s_openapi::api::core::v1::Event = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "e1"}, "involvedObject": {"kind": "Toy", "name": "a", "uid": "u-a"},
        "reason": "Created", "message": "made", "type": "Normal", "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z", "source": {"component": "old-style"}}))
    .unwrap();
    core.create(&PostParams::default(), &e).await.unwrap();
    let new: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client(&s), NS);
    let e2: k8s_openapi::api::events::v1::Event = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "e2"}, "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "x",
        "reportingInstance": "y", "action": "Reconcile", "reason": "Ok", "type": "Normal", "note": "fine",
        "regarding": {"kind": "Toy", "name": "b", "uid": "u-b"}}))
    .unwrap();
    new.create(&PostParams::default(), &e2).await.unwrap();
    assert_eq!(new.list(&ListParams::default()).await.unwrap().items.len(), 2);
    assert_eq!(core.list(&ListParams::default()).await.unwrap().items.len(), 2);

    // Each API shows the other's Event in its own field names.
    let seen_as_core = core.get("e2").await.unwrap();
    assert_eq!(seen_as_core.message.as_deref(), Some("fine"));
    assert_eq!(seen_as_core.involved_object.name.as_deref(), Some("b"));
    assert_eq!(seen_as_core.reporting_component.as_deref(), Some("x"));
    let seen_as_new = new.get("e1").await.unwrap();
    assert_eq!(seen_as_new.note.as_deref(), Some("made"));
    assert_eq!(
        seen_as_new.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("a")
    );
    assert_eq!(seen_as_new.deprecated_count, Some(1));
    assert_eq!(
        seen_as_new
            .deprecated_source
            .as_ref()
            .and_then(|s| s.component.as_deref()),
        Some("old-style")
    );
    assert!(seen_as_new.deprecated_first_timestamp.is_some());

    // A write through one API is a write of the same object for the other.
    let patch = serde_json::json!({"note": "changed"});
    new.patch(
        "e1",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    assert_eq!(core.get("e1").await.unwrap().message.as_deref(), Some("changed"));
    // A write through the other API that changes nothing is no change: same resourceVersion.
    let rv = core.get("e1").await.unwrap().metadata.resource_version;
    let same = serde_json::json!({"message": "changed"});
    let after = core
        .patch(
            "e1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&same),
        )
        .await
        .unwrap();
    assert_eq!(after.metadata.resource_version, rv);

    // Server-side apply through events.k8s.io/v1 creates, then changes, the one object.
    let mut applied = serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e3"}, "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "x",
        "reportingInstance": "y", "action": "Apply", "reason": "Ok", "note": "applied",
        "regarding": {"kind": "Toy", "name": "c"}});
    let apply = kube::api::PatchParams::apply("applier");
    new.patch("e3", &apply, &kube::api::Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(core.get("e3").await.unwrap().message.as_deref(), Some("applied"));
    applied["note"] = "applied again".into();
    let shown = new
        .patch("e3", &apply, &kube::api::Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(shown.note.as_deref(), Some("applied again"));
    assert_eq!(core.get("e3").await.unwrap().message.as_deref(), Some("applied again"));

    // The field selectors kubectl describe sends, and their events.k8s.io names.
    let by_object =
        ListParams::default().fields("involvedObject.kind=Toy,involvedObject.name=b,involvedObject.uid=u-b");
    let names: Vec<String> = core
        .list(&by_object)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.metadata.name)
        .collect();
    assert_eq!(names, vec!["e2".to_owned()]);
    let by_regarding = ListParams::default().fields("regarding.name=a");
    assert_eq!(new.list(&by_regarding).await.unwrap().items.len(), 1);
    // `source` finds an events.k8s.io Event by its reporting controller, as on a real server.
    assert_eq!(
        core.list(&ListParams::default().fields("source=x"))
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    let (code, _, message) = api_error(core.list(&ListParams::default().fields("regarding.name=a")).await);
    assert_eq!(code, 400);
    assert_eq!(message, "field label not supported: regarding.name");

    // Deleting through one API removes it from both.
    new.delete("e2", &Default::default()).await.unwrap();
    assert!(core.get_opt("e2").await.unwrap().is_none());
}

#[tokio::test]
async fn a_crd_created_through_the_api_starts_serving_and_deleting_it_stops() {
    let s = TestServer::start().await.unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client(&s));
    use kube::CustomResourceExt;
    crds.create(&PostParams::default(), &Toy::crd()).await.unwrap();
    let api: Api<Toy> = Api::namespaced(client(&s), "default");
    create_toy(&api, "a", 1).await;
    crds.delete(&toy_crd_name(), &DeleteParams::default()).await.unwrap();
    let (code, _, message) = api_error(api.get("a").await);
    assert_eq!(code, 404);
    assert_eq!(message, "the server could not find the requested resource");
}

#[tokio::test]
async fn deleting_an_owner_collects_its_dependents_unless_orphaned() {
    let s = server().await;
    let api = toys(&s);
    let owner = create_toy(&api, "owner", 1).await;
    let reference = json_owner(&owner);
    let pods: Api<Pod> = Api::namespaced(client(&s), NS);
    for name in ["dep1", "dep2"] {
        let pod: Pod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": name, "ownerReferences": [reference]},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    api.delete("owner", &DeleteParams::background()).await.unwrap();
    assert!(
        pods.list(&ListParams::default()).await.unwrap().items.is_empty(),
        "dependents go with their owner"
    );

    let owner = create_toy(&api, "owner2", 1).await;
    let pod: Pod = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "kept", "ownerReferences": [json_owner(&owner)]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    api.delete("owner2", &DeleteParams::orphan()).await.unwrap();
    let kept = pods.get("kept").await.unwrap();
    assert!(
        kept.metadata.owner_references.unwrap_or_default().is_empty(),
        "an orphan loses the reference"
    );
}

fn json_owner(owner: &Toy) -> serde_json::Value {
    serde_json::json!({"apiVersion": "toys.example.com/v1", "kind": "Toy", "name": owner.name_any(), "uid": owner.uid()})
}

#[tokio::test]
async fn an_update_naming_another_uid_fails_its_precondition() {
    let s = server().await;
    let api = toys(&s);
    let mut t = create_toy(&api, "a", 1).await;
    t.metadata.uid = Some("00000000-0000-4000-a000-000000000000".into());
    let (code, _, message) = api_error(api.replace("a", &PostParams::default(), &t).await);
    assert_eq!(code, 409);
    assert!(
        message.contains("Precondition failed: UID in precondition: 00000000-0000-4000-a000-000000000000"),
        "{message}"
    );
}

#[tokio::test]
async fn names_follow_the_subdomain_and_label_rules() {
    let s = server().await;
    let api = toys(&s);
    // A subdomain's parts are not limited to 63 characters; only the whole to 253.
    let long = "a".repeat(100);
    create_toy(&api, &long, 1).await;
    for bad in ["Upper", "-lead", "trail-", "a..b", &"a".repeat(254)] {
        let (code, _, message) = api_error(api.create(&PostParams::default(), &toy(bad, 1)).await);
        assert_eq!(code, 422, "{bad}");
        assert!(message.contains("metadata.name: Invalid value"), "{message}");
    }
    let namespaces: Api<Namespace> = Api::all(client(&s));
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("a.b".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let (code, _, _) = api_error(namespaces.create(&PostParams::default(), &ns).await);
    assert_eq!(code, 422, "a namespace name is a label, without dots");
}

#[tokio::test]
async fn a_namespace_with_its_own_finalizer_waits_for_it() {
    let s = server().await;
    let namespaces: Api<Namespace> = Api::all(client(&s));
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("held".into()),
            finalizers: Some(vec!["example.com/hold".into()]),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces.create(&PostParams::default(), &ns).await.unwrap();
    namespaces.delete("held", &DeleteParams::default()).await.unwrap();
    assert!(
        namespaces
            .get("held")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "empty, but still held"
    );
    let release = kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    namespaces
        .patch("held", &kube::api::PatchParams::default(), &release)
        .await
        .unwrap();
    assert!(namespaces.get_opt("held").await.unwrap().is_none());
}

#[tokio::test]
async fn string_data_must_hold_strings() {
    let s = server().await;
    let secrets: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client(&s), NS, &kube::api::ApiResource::erase::<Secret>(&()));
    let bad: kube::api::DynamicObject =
        serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s"}, "stringData": {"n": 1}}))
        .unwrap();
    let (code, reason, message) = api_error(secrets.create(&PostParams::default(), &bad).await);
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
    assert!(message.contains("stringData.n"), "{message}");
}
