//! Generated credentials through the faults of a Proxy's life, against the test API server and
//! the in-memory reference provider, one pass at a time:
//!
//! - the status write after a create is lost (or a new leader takes over before it lands): the
//!   next pass adopts the instance and keeps the credentials it was made with, rather than
//!   minting ones the instance does not know (it would answer 407 to every leaseholder);
//! - the credentials Secret is deleted while the instance runs: nobody can use that instance
//!   any more, so it is replaced, and its successor gets new credentials.

mod common;

use std::sync::Arc;

use egress_api::{ANNOTATION_CREDENTIALS_INSTANCE, Phase, Proxy, ProxySpec, conditions};
use egress_conformance::BackendHooks as _;
use egress_conformance::memory::{INSERT, MemoryBackend, REMOVE};
use egress_controller::proxy::context::Context;
use egress_controller::proxy::reconciler::reconcile;
use egress_kube_testserver::TestServer;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "crawl";

struct World {
    proxies: Api<Proxy>,
    secrets: Api<Secret>,
    backend: MemoryBackend,
    ctx: Arc<Context>,
    _server: TestServer,
}

impl World {
    async fn new() -> Self {
        let common::MemWorld {
            server,
            client,
            backend,
            ctx,
        } = common::mem_world(NS).await;
        let proxies: Api<Proxy> = Api::namespaced(client.clone(), NS);
        let spec = ProxySpec {
            credentials: Some(egress_api::Credentials {
                type_: egress_api::CredentialsType::Generated,
                secret_ref: None,
            }),
            ..common::mem_spec()
        };
        proxies
            .create(&PostParams::default(), &Proxy::new("p", spec))
            .await
            .unwrap();
        Self {
            proxies,
            secrets: Api::namespaced(client, NS),
            backend,
            ctx,
            _server: server,
        }
    }

    /// One pass on the Proxy as the API server has it now.
    async fn pass(&self) -> Proxy {
        let current = self.proxies.get("p").await.unwrap();
        reconcile(Arc::new(current), self.ctx.clone()).await.unwrap();
        self.proxies.get("p").await.unwrap()
    }

    async fn secret(&self, proxy: &Proxy) -> Option<Secret> {
        let name = egress_controller::proxy::credentials::secret_name(&proxy.uid().unwrap());
        self.secrets.get_opt(&name).await.unwrap()
    }

    async fn calls(&self, kind: egress_conformance::CallKind) -> usize {
        let log = self.backend.call_log().await.unwrap();
        log.iter().filter(|c| c.kind == kind).count()
    }
}

fn provider_id(p: &Proxy) -> String {
    p.status.as_ref().map(|s| s.provider_id.clone()).unwrap_or_default()
}

fn bound(secret: &Secret) -> Option<String> {
    secret.annotations().get(ANNOTATION_CREDENTIALS_INSTANCE).cloned()
}

#[tokio::test]
async fn a_lost_status_write_keeps_the_credentials_the_instance_was_made_with() {
    let w = World::new().await;
    w.pass().await; // the finalizer
    let recorded = w.pass().await; // the hash, the credentials, the create, the bind
    let id = provider_id(&recorded);
    assert!(!id.is_empty(), "{recorded:?}");
    let secret = w.secret(&recorded).await.unwrap();
    assert_eq!(bound(&secret).as_deref(), Some(id.as_str()));

    // The instance exists, but the status that recorded it never landed.
    w.proxies
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"providerID": null}})),
        )
        .await
        .unwrap();
    assert_eq!(
        provider_id(&w.proxies.get("p").await.unwrap()),
        "",
        "the status still records it"
    );
    let after = w.pass().await;
    assert_eq!(provider_id(&after), id, "the instance was adopted");
    assert_eq!(w.calls(INSERT).await, 1, "no second instance was made");
    let kept = w.secret(&after).await.unwrap();
    assert_eq!(
        kept.data, secret.data,
        "the credentials were rotated under the instance"
    );
    assert_eq!(bound(&kept).as_deref(), Some(id.as_str()));
}

#[tokio::test]
async fn a_running_instance_whose_credentials_secret_was_deleted_is_replaced_with_new_ones() {
    let w = World::new().await;
    w.pass().await;
    w.pass().await;
    // The memory backend starts an instance on its second read.
    let mut running = w.pass().await;
    for _ in 0..3 {
        if running.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running) {
            break;
        }
        running = w.pass().await;
    }
    assert_eq!(
        running.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Running),
        "{running:?}"
    );
    let old = w.secret(&running).await.unwrap();
    let name = old.name_any();
    w.secrets.delete(&name, &DeleteParams::default()).await.unwrap();

    let replacing = w.pass().await;
    assert_eq!(w.calls(REMOVE).await, 1, "the instance nobody can use was not deleted");
    let status = replacing.status.clone().unwrap();
    let provisioned = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::PROVISIONED)
        .unwrap();
    assert!(provisioned.message.contains("credentials Secret"), "{provisioned:?}");
    assert_eq!((status.phase, status.ip.as_str()), (Some(Phase::Provisioning), ""));

    // The next pass finds it gone and builds it again, with new credentials.
    let rebuilt = w.pass().await;
    assert_eq!(w.calls(INSERT).await, 2);
    let new = w.secret(&rebuilt).await.expect("no new credentials Secret");
    assert_ne!(new.data, old.data);
    assert_eq!(bound(&new), Some(provider_id(&rebuilt)));
}
