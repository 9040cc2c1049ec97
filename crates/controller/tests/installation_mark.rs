//! Marking instances with the operator's installation (issue 51), against the test API server and
//! the in-memory reference provider: an operator that runs as an installation marks the running
//! instance of each of its Proxies that carries no installation mark (an `InstallationMarked`
//! event, once), leaves one carrying another installation's mark as it is, and its orphan GC then
//! collects the instance it marked once the Proxy is gone, and only that one.

mod common;

use std::sync::Arc;
use std::time::Duration;

use egress_api::{ANNOTATION_SPEC_HASH, FINALIZER, Phase, Proxy};
use egress_conformance::memory::{DEFAULT_ZONE, INITIAL_TOKEN, LABEL, MemoryBackend};
use egress_conformance::{BackendHooks as _, SeedSpec};
use egress_controller::gc::OrphanGc;
use egress_controller::proxy::reconciler::reconcile;
use egress_provider::{LABEL_INSTALLATION, OpCtx, name_from_uid};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "crawl";
/// The installation the operator runs as.
const OURS: &str = "inst-a";
/// Another installation sharing the backend.
const THEIRS: &str = "inst-b";

/// A Proxy whose instance already runs in the backend, recorded in its status under this
/// operator's spec hash, as an operator without an installation left it. Its instance carries
/// installation mark `mark`, if any. Returns the instance's name.
async fn running_proxy(proxies: &Api<Proxy>, backend: &MemoryBackend, name: &str, mark: Option<&str>) -> String {
    let mut proxy = Proxy::new(name, common::mem_spec());
    proxy.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let created = proxies.create(&PostParams::default(), &proxy).await.unwrap();
    let uid = created.uid().unwrap();
    let instance = name_from_uid(&uid);
    backend
        .seed(SeedSpec::marked(instance.as_str(), uid.as_str()))
        .await
        .unwrap();
    if let Some(mark) = mark {
        backend
            .add_label(INITIAL_TOKEN, DEFAULT_ZONE, &instance, LABEL_INSTALLATION, mark)
            .await
            .unwrap();
    }
    // The hash of the spec as the server keeps it (defaults applied), as the reconciler reads it.
    let hash = egress_controller::proxy::spec_hash::spec_hash(&created.spec, b"");
    let params = PatchParams::default();
    let annotations = json!({"metadata": {"annotations": {ANNOTATION_SPEC_HASH: hash}}});
    proxies.patch(name, &params, &Patch::Merge(annotations)).await.unwrap();
    let status = json!({"status": {"providerID": format!("zones/{DEFAULT_ZONE}/instances/{instance}")}});
    proxies
        .patch_status(name, &params, &Patch::Merge(status))
        .await
        .unwrap();
    instance
}

/// The installation mark of instance `name` as the backend holds it.
async fn mark_of(backend: &MemoryBackend, name: &str) -> Option<String> {
    let inventory = backend.inventory().await.unwrap();
    let instance = inventory
        .iter()
        .find(|o| o.kind == "instance" && o.owner == name)
        .unwrap_or_else(|| panic!("no instance {name}: {inventory:?}"));
    instance.marks.get(LABEL_INSTALLATION).cloned()
}

/// The instances of the backend, by name.
async fn instances(backend: &MemoryBackend) -> Vec<String> {
    let inventory = backend.inventory().await.unwrap();
    inventory
        .into_iter()
        .filter(|o| o.kind == "instance")
        .map(|o| o.owner)
        .collect()
}

/// The names of the Proxies an `InstallationMarked` event was published for, one per event.
async fn marked_events(events: &Api<Event>) -> Vec<String> {
    let mut names: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("InstallationMarked"))
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn an_unmarked_instance_is_marked_and_another_installations_is_left_alone() {
    let common::MemWorld {
        server: _server,
        client,
        backend,
        ctx,
    } = common::mem_world_as(NS, Some(OURS)).await;
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), NS);
    let unmarked = running_proxy(&proxies, &backend, "unmarked", None).await;
    let foreign = running_proxy(&proxies, &backend, "foreign", Some(THEIRS)).await;
    // An orphan without a mark: no Proxy of this installation names it, so nobody marks it.
    let orphan = name_from_uid("a-proxy-long-gone");
    backend
        .seed(SeedSpec::marked(orphan.as_str(), "a-proxy-long-gone"))
        .await
        .unwrap();
    let calls_before = backend.call_log().await.unwrap().len();
    let pass = |name: &'static str| {
        let (proxies, ctx) = (proxies.clone(), ctx.clone());
        async move {
            reconcile(Arc::new(proxies.get(name).await.unwrap()), ctx)
                .await
                .unwrap();
            proxies.get(name).await.unwrap()
        }
    };

    for name in ["unmarked", "foreign"] {
        let p = pass(name).await;
        assert_eq!(p.status.unwrap().phase, Some(Phase::Running), "{name}");
    }
    assert_eq!(mark_of(&backend, &unmarked).await.as_deref(), Some(OURS));
    assert_eq!(mark_of(&backend, &foreign).await.as_deref(), Some(THEIRS));
    assert_eq!(mark_of(&backend, &orphan).await, None);
    let labelled = |calls: Vec<egress_conformance::hooks::BackendCall>| {
        calls[calls_before..]
            .iter()
            .filter(|c| c.kind == LABEL)
            .map(|c| c.target.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        labelled(backend.call_log().await.unwrap()),
        std::slice::from_ref(&unmarked)
    );
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    assert_eq!(marked_events(&events).await, ["unmarked"]);

    // Marked once: the next passes write nothing and say nothing more.
    for name in ["unmarked", "foreign"] {
        pass(name).await;
    }
    assert_eq!(
        labelled(backend.call_log().await.unwrap()),
        std::slice::from_ref(&unmarked)
    );
    assert_eq!(marked_events(&events).await, ["unmarked"]);

    // Both Proxies gone without their instances: this installation's GC collects the instance it
    // marked, and neither the other installation's nor the unmarked orphan.
    for name in ["unmarked", "foreign"] {
        let release = json!({"metadata": {"finalizers": null}});
        proxies
            .patch(name, &PatchParams::default(), &Patch::Merge(release))
            .await
            .unwrap();
        proxies.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let gc = OrphanGc {
        client,
        providers: ctx.providers.clone(),
        interval: Duration::from_secs(600),
        min_age: Duration::ZERO,
        installation: Some(OURS.to_owned()),
    };
    let report = gc.sweep(&OpCtx::background()).await;
    assert_eq!((report.swept, report.deleted), (true, 1), "{report:?}");
    let mut left = instances(&backend).await;
    left.sort();
    let mut want = vec![foreign, orphan];
    want.sort();
    assert_eq!(left, want);
}
