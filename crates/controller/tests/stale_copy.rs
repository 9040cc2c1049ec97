//! A pass that starts from a cached copy older than the reconciler's own last write (the cache
//! had not yet seen the status that recorded the instance) must not create the instance again:
//! the pass proves its copy current before a create, and a stale copy ends in the routine 409.
//! Found by the flake hunt: the operator's OTLP test saw two `provider.create` spans, one an
//! adoption, under load. With Generated credentials the proof comes before the credentials are
//! prepared: a stale pass once rotated the credentials of the instance just made (found by
//! `cargo xtask dev --smoke`: a proxy that stayed Unhealthy on 407s).

mod common;

use std::sync::Arc;

use egress_api::{Proxy, ProxySpec};
use egress_conformance::BackendHooks as _;
use egress_controller::proxy::reconciler::{ReconcileError, reconcile};
use kube::api::{Api, PostParams};

const NS: &str = "crawl";

#[tokio::test]
async fn a_pass_on_a_stale_copy_does_not_create_again() {
    stale_pass(false).await;
}

#[tokio::test]
async fn a_pass_on_a_stale_copy_does_not_rotate_the_new_instances_credentials() {
    stale_pass(true).await;
}

async fn stale_pass(generated: bool) {
    let common::MemWorld {
        server: _server,
        client,
        backend,
        ctx,
    } = common::mem_world(NS).await;
    let api: Api<Proxy> = Api::namespaced(client.clone(), NS);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client, NS);
    let proxy = Proxy::new(
        "p",
        ProxySpec {
            credentials: generated.then_some(egress_api::Credentials {
                type_: egress_api::CredentialsType::Generated,
                secret_ref: None,
            }),
            ..common::mem_spec()
        },
    );
    api.create(&PostParams::default(), &proxy).await.unwrap();

    // Pass 1 adds the finalizer; pass 2 writes the spec hash, creates, records the instance.
    reconcile(Arc::new(api.get("p").await.unwrap()), ctx.clone())
        .await
        .unwrap();
    let before_create = api.get("p").await.unwrap();
    reconcile(Arc::new(before_create.clone()), ctx.clone()).await.unwrap();
    let recorded = api.get("p").await.unwrap();
    assert!(
        recorded.status.as_ref().is_some_and(|s| !s.provider_id.is_empty()),
        "{recorded:?}"
    );
    // The copy a stale cache holds: the annotation written, the instance not yet recorded (an
    // older resourceVersion than the object's now).
    let mut stale = recorded.clone();
    stale.status = None;
    stale.metadata.resource_version = before_create.metadata.resource_version.clone();

    let secret_name = egress_controller::proxy::credentials::secret_name(&recorded.metadata.uid.clone().unwrap());
    let credentials_before = secrets.get_opt(&secret_name).await.unwrap().map(|s| s.data);
    assert_eq!(credentials_before.is_some(), generated);
    let calls_before = backend.call_log().await.unwrap().len();
    let outcome = reconcile(Arc::new(stale), ctx.clone()).await;
    assert!(
        matches!(&outcome, Err(ReconcileError::Kube { source: kube::Error::Api(s), .. }) if s.code == 409),
        "{outcome:?}"
    );
    assert_eq!(
        backend.call_log().await.unwrap().len(),
        calls_before,
        "the stale pass reached the backend"
    );
    assert_eq!(
        secrets.get_opt(&secret_name).await.unwrap().map(|s| s.data),
        credentials_before,
        "the stale pass rewrote the credentials"
    );
    // A pass on the current copy goes on from the recorded instance.
    reconcile(Arc::new(api.get("p").await.unwrap()), ctx).await.unwrap();
    let after = api.get("p").await.unwrap();
    assert_eq!(after.status.unwrap().provider_id, recorded.status.unwrap().provider_id);
}
