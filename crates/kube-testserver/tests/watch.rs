//! Watches, from raw event streams to `kube::runtime::watcher`, reflectors and a `Controller`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use egress_kube_testserver::TestServer;
use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// The next event of a raw watch stream, within the liveness bound.
async fn next<S>(stream: &mut S) -> WatchEvent<Toy>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<Toy>>> + Unpin,
{
    within("the next watch event", stream.next())
        .await
        .expect("the stream is open")
        .expect("a decodable event")
}

fn describe(e: &WatchEvent<Toy>) -> String {
    match e {
        WatchEvent::Added(t) => format!("ADDED {}", t.name_any()),
        WatchEvent::Modified(t) => format!("MODIFIED {} size={}", t.name_any(), t.spec.size),
        WatchEvent::Deleted(t) => format!("DELETED {}", t.name_any()),
        WatchEvent::Bookmark(b) => format!("BOOKMARK {}", b.metadata.resource_version),
        WatchEvent::Error(e) => format!("ERROR {}", e.code),
    }
}

#[tokio::test]
async fn a_watch_from_a_resource_version_replays_the_changes_in_order() {
    let s = server().await;
    let api = toys(&s);
    let start = list_rv(&api).await;
    create_toy(&api, "a", 1).await;
    resize_toy(&api, "a", 2).await;
    create_toy(&api, "b", 1).await;
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let mut stream = api.watch(&WatchParams::default(), &start).await.unwrap().boxed();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(describe(&next(&mut stream).await));
    }
    assert_eq!(seen, vec!["ADDED a", "MODIFIED a size=2", "ADDED b", "DELETED a"]);
    // Then live changes follow.
    resize_toy(&api, "b", 5).await;
    assert_eq!(describe(&next(&mut stream).await), "MODIFIED b size=5");
}

#[tokio::test]
async fn a_watch_from_zero_starts_with_the_current_objects() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    create_toy(&api, "b", 1).await;
    let mut stream = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    assert_eq!(describe(&next(&mut stream).await), "ADDED a");
    assert_eq!(describe(&next(&mut stream).await), "ADDED b");
    api.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(describe(&next(&mut stream).await), "DELETED b");
}

#[tokio::test]
async fn bookmarks_come_when_allowed_and_carry_the_resource_version() {
    let s = TestServer::builder()
        .custom_resource::<Toy>()
        .namespace(NS)
        .bookmark_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let api = toys(&s);
    let t = create_toy(&api, "a", 1).await;
    let rv = t.resource_version().unwrap();
    let mut stream = api.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    match next(&mut stream).await {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, rv),
        other => panic!("expected a bookmark, got {}", describe(&other)),
    }
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream() {
    let s = server().await;
    let api = toys(&s);
    let rv = list_rv(&api).await;
    let mut stream = api
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    let events = within("the watch to end at its timeout", async {
        let mut events = Vec::new();
        while let Some(e) = stream.next().await {
            events.push(describe(&e.unwrap()));
        }
        events
    })
    .await;
    // Nothing changed, so the only event is the bookmark sent as the timeout closes the stream.
    assert_eq!(events, vec![format!("BOOKMARK {rv}")]);
}

#[tokio::test]
async fn a_watch_from_a_compacted_resource_version_gets_410() {
    let s = server().await;
    let api = toys(&s);
    let old = create_toy(&api, "a", 1).await.resource_version().unwrap();
    create_toy(&api, "b", 1).await;
    s.compact();
    let mut stream = api.watch(&WatchParams::default(), &old).await.unwrap().boxed();
    match next(&mut stream).await {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected 410, got {}", describe(&other)),
    }
    assert!(within("the stream to end", stream.next()).await.is_none());
}

#[tokio::test]
async fn a_short_history_expires_old_resource_versions() {
    let s = TestServer::builder()
        .custom_resource::<Toy>()
        .namespace(NS)
        .history_limit(3)
        .start()
        .await
        .unwrap();
    let api = toys(&s);
    let first = create_toy(&api, "a", 1).await.resource_version().unwrap();
    for i in 0..5 {
        create_toy(&api, &format!("x{i}"), 1).await;
    }
    let mut stream = api.watch(&WatchParams::default(), &first).await.unwrap().boxed();
    assert!(matches!(next(&mut stream).await, WatchEvent::Error(e) if e.code == 410));
}

#[tokio::test]
async fn a_label_filtered_watch_sees_objects_enter_and_leave_the_selection() {
    let s = server().await;
    let api = toys(&s);
    let rv = list_rv(&api).await;
    let mut stream = api
        .watch(&WatchParams::default().labels("pick=yes"), &rv)
        .await
        .unwrap()
        .boxed();
    create_toy(&api, "a", 1).await;
    let label = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"pick": v}}}));
    api.patch("a", &PatchParams::default(), &label("yes")).await.unwrap();
    assert_eq!(describe(&next(&mut stream).await), "ADDED a");
    let unlabelled = api.patch("a", &PatchParams::default(), &label("no")).await.unwrap();
    match next(&mut stream).await {
        // The last state the watch was entitled to see, at the resourceVersion of the change.
        WatchEvent::Deleted(t) => {
            assert_eq!(t.labels()["pick"], "yes");
            assert_eq!(t.resource_version(), unlabelled.resource_version());
        }
        other => panic!("expected DELETED, got {}", describe(&other)),
    }
}

#[tokio::test]
async fn metadata_only_reads_and_watches() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    let meta = api.get_metadata("a").await.unwrap();
    assert_eq!(meta.metadata.name.as_deref(), Some("a"));
    assert_eq!(
        meta.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata"),
        "the server sent metadata only"
    );
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    // `Api<PartialObjectMeta<K>>` makes metadata-only requests (kube's metadata watcher).
    let meta_api: Api<kube::core::PartialObjectMeta<Toy>> = Api::namespaced(client(&s), NS);
    let mut stream = watcher(meta_api, watcher::Config::default()).applied_objects().boxed();
    let first = within("the first metadata object", stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("a"));
    assert_eq!(
        first.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );
    create_toy(&api, "b", 1).await;
    let second = within("the second metadata object", stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.metadata.name.as_deref(), Some("b"));
}

#[tokio::test]
async fn a_crd_created_over_the_api_becomes_established() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::runtime::wait::{await_condition, conditions};
    let s = TestServer::start().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client(&s));
    crds.create(&PostParams::default(), &Toy::crd()).await.unwrap();
    let established = within(
        "the CRD to be established",
        await_condition(crds, &toy_crd_name(), conditions::is_crd_established()),
    )
    .await
    .unwrap()
    .expect("the CRD exists");
    assert_eq!(
        established.status.unwrap().stored_versions,
        Some(vec!["v1".to_string()])
    );
}

#[tokio::test]
async fn kube_runtime_watcher_sees_the_initial_list_and_later_changes() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "before", 1).await;
    let mut objects = watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let first = within("the first object", objects.try_next()).await.unwrap().unwrap();
    assert_eq!(first.name_any(), "before");
    create_toy(&api, "after", 3).await;
    let second = within("the second object", objects.try_next()).await.unwrap().unwrap();
    assert_eq!((second.name_any().as_str(), second.spec.size), ("after", 3));
}

#[tokio::test]
async fn kube_runtime_watcher_with_streaming_lists() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    let mut events = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match within("streaming list", events.try_next()).await.unwrap().unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(t) => initial.push(t.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, vec!["a"]);
}

#[tokio::test]
async fn kube_runtime_watcher_recovers_from_410_by_relisting() {
    let s = server().await;
    let api = toys(&s);
    create_toy(&api, "a", 1).await;
    let mut events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut init_done = 0;
    while init_done == 0 {
        if let watcher::Event::InitDone = within("the first list", events.try_next()).await.unwrap().unwrap() {
            init_done += 1;
        }
    }
    assert_eq!(s.requests().count(egress_kube_testserver::Verb::List, "toys"), 1);
    // History is lost and the watch drops: resuming from its resourceVersion gets 410, so the
    // watcher must list again.
    create_toy(&api, "b", 1).await;
    s.compact();
    s.end_watches();
    let mut relisted = Vec::new();
    loop {
        match within("the re-list", events.try_next()).await {
            Ok(Some(watcher::Event::InitApply(t))) => relisted.push(t.name_any()),
            Ok(Some(watcher::Event::InitDone)) => break,
            Ok(Some(_)) | Err(_) => {}
            Ok(None) => panic!("the watcher stream ended"),
        }
    }
    assert_eq!(relisted, vec!["a", "b"]);
    assert_eq!(s.requests().count(egress_kube_testserver::Verb::List, "toys"), 2);
}

#[tokio::test]
async fn a_reflector_store_mirrors_the_server() {
    let s = server().await;
    let api = toys(&s);
    for i in 0..5 {
        create_toy(&api, &format!("t{i}"), 1).await;
    }
    let (reader, writer) = kube::runtime::reflector::store::<Toy>();
    let task = tokio::spawn(
        kube::runtime::reflector(writer, watcher(api.clone(), watcher::Config::default())).for_each(|_| async {}),
    );
    within("the reflector's first list", reader.wait_until_ready())
        .await
        .unwrap();
    assert_eq!(reader.state().len(), 5);
    task.abort();
}

/// A toy reconciler: copies the spec's generation into `.status.observedGeneration` and marks it ready.
async fn reconcile(toy: Arc<Toy>, api: Arc<Api<Toy>>) -> Result<kube::runtime::controller::Action, kube::Error> {
    let status = json!({"status": {"ready": true, "observedGeneration": toy.metadata.generation}});
    api.patch_status(&toy.name_any(), &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(kube::runtime::controller::Action::await_change())
}

fn on_error(_: Arc<Toy>, _: &kube::Error, _: Arc<Api<Toy>>) -> kube::runtime::controller::Action {
    kube::runtime::controller::Action::requeue(Duration::from_millis(100))
}

#[tokio::test]
async fn a_controller_reconciles_a_custom_resource_end_to_end() {
    let s = server().await;
    let api = toys(&s);
    let controller = kube::runtime::Controller::new(api.clone(), watcher::Config::default())
        .run(reconcile, on_error, Arc::new(api.clone()))
        .for_each(|_| async {});
    let task = tokio::spawn(controller);
    let observer = watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    create_toy(&api, "a", 1).await;
    let wait_for_generation = |mut stream: futures::stream::BoxStream<'static, Result<Toy, watcher::Error>>, g: i64| async move {
        loop {
            let t = stream.try_next().await.unwrap().unwrap();
            if t.status
                .as_ref()
                .is_some_and(|st| st.ready && st.observed_generation == Some(g))
            {
                return stream;
            }
        }
    };
    let observer = within(
        "the controller to reconcile generation 1",
        wait_for_generation(observer, 1),
    )
    .await;
    resize_toy(&api, "a", 4).await;
    let _ = within(
        "the controller to reconcile generation 2",
        wait_for_generation(observer, 2),
    )
    .await;
    // Steady state: the controller's status write changed nothing more, so it writes nothing more.
    let writes = s.requests().writes("toys/status");
    assert!(writes >= 2, "{writes}");
    task.abort();
}

#[tokio::test]
async fn a_watch_on_all_namespaces_sees_every_namespace() {
    let s = server().await;
    let all: Api<Toy> = Api::all(client(&s));
    let rv = list_rv(&all).await;
    let mut stream = all.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    create_toy(&toys(&s), "a", 1).await;
    Api::<Toy>::namespaced(client(&s), "default")
        .create(&PostParams::default(), &toy("b", 1))
        .await
        .unwrap();
    assert_eq!(describe(&next(&mut stream).await), "ADDED a");
    assert_eq!(describe(&next(&mut stream).await), "ADDED b");
}
