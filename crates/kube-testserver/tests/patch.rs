//! Patches (merge, JSON, strategic, server-side apply), the status subresource, generation and
//! finalizers.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn merge_patch_changes_and_removes_fields() {
    let s = server().await;
    let api = toys(&s);
    let mut t = toy("a", 1);
    t.spec.color = Some("red".into());
    api.create(&PostParams::default(), &t).await.unwrap();
    let p = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5, "color": null}})),
        )
        .await
        .unwrap();
    assert_eq!(p.spec, ToySpec { size: 5, color: None });
    assert_eq!(p.metadata.generation, Some(2));
}

#[tokio::test]
async fn merge_patch_with_a_resource_version_is_optimistic() {
    let s = server().await;
    let api = toys(&s);
    let t = create_toy(&api, "a", 1).await;
    resize_toy(&api, "a", 2).await;
    let stale = json!({"metadata": {"resourceVersion": t.resource_version()}, "spec": {"size": 3}});
    let (code, reason, _) = api_error(api.patch("a", &PatchParams::default(), &Patch::Merge(stale)).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
}

#[tokio::test]
async fn json_patch_applies_with_test_ops_and_fails_whole_when_a_test_fails() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    let ok: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/spec/size", "value": 1},
        {"op": "replace", "path": "/spec/size", "value": 7},
        {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}
    ]))
    .unwrap();
    let p = api
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(ok))
        .await
        .unwrap();
    assert_eq!(p.spec.size, 7);
    assert_eq!(p.labels()["x"], "y");
    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "replace", "path": "/spec/size", "value": 9},
        {"op": "test", "path": "/spec/size", "value": 1}
    ]))
    .unwrap();
    let (code, reason, _) = api_error(
        api.patch("a", &PatchParams::default(), &Patch::<()>::Json(failing))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        api.get("a").await.unwrap().spec.size,
        7,
        "a failed JSON patch changes nothing"
    );
    let missing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/spec/nothing/here"}])).unwrap();
    let (code, _, _) = api_error(
        api.patch("a", &PatchParams::default(), &Patch::<()>::Json(missing))
            .await,
    );
    assert_eq!(code, 422);
}

#[tokio::test]
async fn strategic_merge_works_on_built_in_kinds_and_is_refused_for_custom_ones() {
    let s = server().await;
    let pods: Api<Pod> = Api::namespaced(client(&s), NS);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let patch = json!({"spec": {"containers": [{"name": "b", "image": "z"}]}});
    let p = pods
        .patch("p", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    let images: Vec<_> = p
        .spec
        .unwrap()
        .containers
        .iter()
        .map(|c| c.image.clone().unwrap())
        .collect();
    assert_eq!(images, vec!["x", "z"], "containers merge by name");
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    let (code, reason, message) = api_error(
        api.patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"size": 2}})),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (415, "UnsupportedMediaType"));
    assert!(message.contains("application/merge-patch+json"), "{message}");
}

#[tokio::test]
async fn server_side_apply_creates_updates_and_tracks_the_manager() {
    let s = server().await;
    let api = toys(&s);
    let pp = PatchParams::apply("op");
    let applied = api
        .patch(
            "a",
            &pp,
            &Patch::Apply(json!({"apiVersion": "toys.example.com/v1", "kind": "Toy",
        "metadata": {"name": "a"}, "spec": {"size": 2, "color": "red"}})),
        )
        .await
        .unwrap();
    assert_eq!(applied.spec.size, 2);
    let managers: Vec<String> = applied
        .metadata
        .managed_fields
        .unwrap()
        .iter()
        .map(|m| m.manager.clone().unwrap())
        .collect();
    assert_eq!(managers, vec!["op"]);
    let rv = s.resource_version();
    // The same configuration again writes nothing.
    api.patch(
        "a",
        &pp,
        &Patch::Apply(json!({"apiVersion": "toys.example.com/v1", "kind": "Toy",
        "metadata": {"name": "a"}, "spec": {"size": 2, "color": "red"}})),
    )
    .await
    .unwrap();
    assert_eq!(s.resource_version(), rv, "an unchanged apply is a no-op");
    // Dropping a field from the configuration removes it.
    let p = api
        .patch(
            "a",
            &pp,
            &Patch::Apply(json!({"apiVersion": "toys.example.com/v1", "kind": "Toy",
        "metadata": {"name": "a"}, "spec": {"size": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(p.spec.color, None);
}

#[tokio::test]
async fn server_side_apply_conflicts_with_another_manager_unless_forced() {
    let s = server().await;
    let api = toys(&s);
    let config = |size: i32| {
        Patch::Apply(json!({"apiVersion": "toys.example.com/v1", "kind": "Toy",
        "metadata": {"name": "a"}, "spec": {"size": size}}))
    };
    api.patch("a", &PatchParams::apply("first"), &config(1)).await.unwrap();
    let (code, reason, message) = api_error(api.patch("a", &PatchParams::apply("second"), &config(2)).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        message,
        "Apply failed with 1 conflict: conflict with \"first\": .spec.size"
    );
    let forced = api
        .patch("a", &PatchParams::apply("second").force(), &config(2))
        .await
        .unwrap();
    assert_eq!(forced.spec.size, 2);
    let no_manager = PatchParams {
        field_manager: None,
        ..Default::default()
    };
    let (code, _, message) = api_error(api.patch("a", &no_manager, &config(3)).await);
    assert_eq!(code, 422);
    assert!(message.contains("fieldManager: Required value"), "{message}");
}

#[tokio::test]
async fn the_status_subresource_separates_spec_and_status_writes() {
    let s = server().await;
    let api = toys(&s);
    let mut t = toy("a", 1);
    t.status = Some(ToyStatus {
        ready: true,
        observed_generation: None,
    });
    let created = api.create(&PostParams::default(), &t).await.unwrap();
    assert_eq!(created.status, None, "status is dropped on create");
    // A main-resource write ignores .status.
    let p = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}})),
        )
        .await
        .unwrap();
    assert_eq!(p.status, None);
    assert_eq!(
        p.resource_version(),
        created.resource_version(),
        "ignoring .status left nothing to write"
    );
    // A /status write touches only .status and does not move the generation.
    let p = api
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 9}, "status": {"ready": true}})),
        )
        .await
        .unwrap();
    assert!(p.status.as_ref().unwrap().ready);
    assert_eq!(p.spec.size, 1);
    assert_eq!(p.metadata.generation, Some(1));
    // Status by PUT, with optimistic concurrency.
    let mut current = api.get_status("a").await.unwrap();
    current.status = Some(ToyStatus {
        ready: false,
        observed_generation: Some(1),
    });
    let replaced = api.replace_status("a", &PostParams::default(), &current).await.unwrap();
    assert_eq!(replaced.status.unwrap().observed_generation, Some(1));
    let (code, _, _) = api_error(api.replace_status("a", &PostParams::default(), &current).await);
    assert_eq!(code, 409);
}

#[tokio::test]
async fn generation_moves_on_spec_changes_only() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    let labelled = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(1), "metadata is not spec");
    let spec = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(spec.metadata.generation, Some(2));
    let same = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(same.metadata.generation, Some(2));
    assert_eq!(
        same.resource_version(),
        spec.resource_version(),
        "a no-op patch writes nothing"
    );
}

#[tokio::test]
async fn finalizers_hold_a_deleted_object_until_the_last_one_goes() {
    let s = server().await;
    let api = toys(&s);
    let mut t = toy("a", 1);
    t.metadata.finalizers = Some(vec!["example.com/one".into(), "example.com/two".into()]);
    api.create(&PostParams::default(), &t).await.unwrap();
    let answer = api.delete("a", &DeleteParams::default()).await.unwrap();
    let held = answer.left().expect("an object with finalizers comes back");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.metadata.generation, Some(2));
    // Deleting again changes nothing.
    let again = api.delete("a", &DeleteParams::default()).await.unwrap().left().unwrap();
    assert_eq!(again.resource_version(), held.resource_version());
    // No new finalizer may be added now.
    let add = json!({"metadata": {"finalizers": ["example.com/one", "example.com/two", "example.com/three"]}});
    let (code, reason, message) = api_error(api.patch("a", &PatchParams::default(), &Patch::Merge(add)).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        message.contains("no new finalizers can be added if the object is being deleted"),
        "{message}"
    );
    // Spec updates still work while it is held.
    resize_toy(&api, "a", 3).await;
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/two"]}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("a").await.unwrap().is_some());
    let mut last = api.get("a").await.unwrap();
    last.metadata.finalizers = None;
    api.replace("a", &PostParams::default(), &last).await.unwrap();
    assert!(
        api.get_opt("a").await.unwrap().is_none(),
        "removing the last finalizer deletes it"
    );
}

#[tokio::test]
async fn kube_runtime_finalizer_helper_runs_its_cleanup() {
    use kube::runtime::controller::Action;
    use kube::runtime::finalizer::{Event, finalizer};
    use std::sync::{Arc, Mutex};
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    let seen: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let run = |api: Api<Toy>, seen: Arc<Mutex<Vec<&'static str>>>| async move {
        let obj = Arc::new(api.get("a").await.unwrap());
        finalizer(&api, "toys.example.com/cleanup", obj, |event| async move {
            let what = match event {
                Event::Apply(_) => "applied",
                Event::Cleanup(_) => "cleaned",
            };
            seen.lock().unwrap().push(what);
            Ok::<_, std::convert::Infallible>(Action::await_change())
        })
        .await
        .map(|_| ())
    };
    // The first run adds the finalizer, the second applies.
    run(api.clone(), seen.clone()).await.unwrap();
    assert_eq!(api.get("a").await.unwrap().finalizers(), ["toys.example.com/cleanup"]);
    run(api.clone(), seen.clone()).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec!["applied"]);
    api.delete("a", &DeleteParams::default()).await.unwrap();
    run(api.clone(), seen.clone()).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec!["applied", "cleaned"]);
    assert!(
        api.get_opt("a").await.unwrap().is_none(),
        "the helper removed its finalizer and the object went"
    );
}

#[tokio::test]
async fn an_apply_may_leave_the_name_out_but_must_name_its_type() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    // controller-style status apply: no metadata.name in the body.
    let status = Patch::Apply(json!({"apiVersion": "toys.example.com/v1", "kind": "Toy", "status": {"ready": true}}));
    let p = api
        .patch_status("a", &PatchParams::apply("ctl").force(), &status)
        .await
        .unwrap();
    assert!(p.status.unwrap().ready);
    let untyped = Patch::Apply(json!({"spec": {"size": 2}}));
    let (code, _, _) = api_error(api.patch("a", &PatchParams::apply("ctl"), &untyped).await);
    assert_eq!(code, 400);
    let with_fields = Patch::Apply(json!({"apiVersion": "toys.example.com/v1", "kind": "Toy",
        "metadata": {"managedFields": [{"manager": "x"}]}, "spec": {"size": 2}}));
    let (code, _, message) = api_error(api.patch("a", &PatchParams::apply("ctl"), &with_fields).await);
    assert_eq!((code, message.as_str()), (400, "metadata.managedFields must be nil"));
}

#[tokio::test]
async fn strict_field_validation_covers_json_patches() {
    let s = server().await;
    create_toy(&toys(&s), "a", 1).await;
    let req = http::Request::builder()
        .method("PATCH")
        .uri("/apis/toys.example.com/v1/namespaces/tests/toys/a?fieldValidation=Strict")
        .header("content-type", "application/json-patch+json")
        .body(br#"[{"op": "add", "path": "/spec/bogus", "value": 1}]"#.to_vec())
        .unwrap();
    match client(&s).request::<Toy>(req).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 400);
            assert!(e.message.contains("unknown field \"spec.bogus\""), "{}", e.message);
        }
        other => panic!("expected 400, got {other:?}"),
    }
}
