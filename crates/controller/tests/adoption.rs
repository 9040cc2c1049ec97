//! Taking over a Proxy another operator made (the Go one, whose spec hash is computed
//! differently), against the test API server and the in-memory reference provider: the instance
//! it recorded is already running in the backend. The reconciler adopts it (the annotation
//! rewritten, the other value kept, an `Adopted` event, no create or delete call), and a spec
//! change afterwards replaces it as any other.

mod common;

use std::sync::Arc;

use egress_api::{ANNOTATION_PREVIOUS_SPEC_HASH, ANNOTATION_SPEC_HASH, FINALIZER, Phase, Proxy};
use egress_conformance::memory::{INSERT, REMOVE};
use egress_conformance::{BackendHooks as _, SeedSpec};
use egress_controller::proxy::reconciler::reconcile;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "crawl";
/// A value of the other operator's form.
const GO_HASH: &str = "6c1f0e2b9d";

#[tokio::test]
async fn a_proxy_another_operator_made_is_adopted_and_a_later_spec_change_replaces_it() {
    let common::MemWorld {
        server: _server,
        client,
        backend,
        ctx,
    } = common::mem_world(NS).await;
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), NS);
    let mut proxy = Proxy::new("p", common::mem_spec());
    proxy.metadata.finalizers = Some(vec![FINALIZER.into()]);
    proxy.metadata.annotations = Some([(ANNOTATION_SPEC_HASH.to_owned(), GO_HASH.to_owned())].into());
    let created = proxies.create(&PostParams::default(), &proxy).await.unwrap();
    let uid = created.uid().unwrap();
    let name = egress_provider::name_from_uid(&uid);
    // The instance the other operator made, running, and the status it wrote.
    backend
        .seed(SeedSpec::marked(name.as_str(), uid.as_str()))
        .await
        .unwrap();
    let id = format!("zones/zone-a/instances/{name}");
    proxies
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Ready",
                "ip": "10.9.9.9",
                "providerID": id,
                "conditions": [{
                    "type": "Provisioned", "status": "True", "reason": "Running",
                    "message": "the instance is running", "observedGeneration": created.metadata.generation,
                    "lastTransitionTime": "2026-11-30T08:00:00Z",
                }],
            }})),
        )
        .await
        .unwrap();

    let pass = || async {
        reconcile(Arc::new(proxies.get("p").await.unwrap()), ctx.clone())
            .await
            .unwrap();
        proxies.get("p").await.unwrap()
    };
    let adopted = pass().await;
    let calls = backend.call_log().await.unwrap();
    assert!(
        !calls.iter().any(|c| c.kind == INSERT || c.kind == REMOVE),
        "a provider create or delete: {calls:?}"
    );
    let own = egress_controller::proxy::spec_hash::spec_hash(&adopted.spec, b"");
    assert_eq!(adopted.annotations()[ANNOTATION_SPEC_HASH], own);
    assert_eq!(adopted.annotations()[ANNOTATION_PREVIOUS_SPEC_HASH], GO_HASH);
    let status = adopted.status.clone().unwrap();
    assert_eq!(
        (status.provider_id.as_str(), status.ip.as_str(), status.phase),
        (id.as_str(), "10.9.9.9", Some(Phase::Running))
    );
    let events: Api<Event> = Api::namespaced(client, NS);
    let events = events.list(&ListParams::default()).await.unwrap().items;
    let adoption = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Adopted"))
        .unwrap_or_else(|| panic!("no Adopted event: {events:?}"));
    assert!(
        adoption.note.as_deref().unwrap_or_default().contains(&id),
        "{adoption:?}"
    );

    // A second pass finds its own hash: nothing more to do.
    pass().await;
    let calls = backend.call_log().await.unwrap();
    assert!(!calls.iter().any(|c| c.kind == INSERT || c.kind == REMOVE), "{calls:?}");

    // A spec change after the adoption replaces the instance as any other.
    common::change_port(&proxies, "p").await;
    let replacing = pass().await;
    let calls = backend.call_log().await.unwrap();
    assert_eq!(calls.iter().filter(|c| c.kind == REMOVE).count(), 1, "{calls:?}");
    assert_eq!(replacing.status.unwrap().phase, Some(Phase::Provisioning));
}
