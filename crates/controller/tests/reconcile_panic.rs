//! A reconcile that panics (here, a provider that panics on create) is caught: the reconcile
//! fails as any other (retried with backoff), the worker is freed, and controller-runtime's
//! families count it as an error and a panic.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use egress_api::{FINALIZER, Placement, Proxy, ProxySpec};
use egress_controller::proxy::context::Context;
use egress_controller::proxy::decide::Timings;
use egress_controller::proxy::reconciler::{ReconcileError, reconcile};
use egress_controller::runtime_metrics::ReconcileMetrics;
use egress_kube_testserver::TestServer;
use egress_provider::{CreateRequest, Instance, OpCtx, Provider, ProviderError, ProviderId};
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct Panicking;

#[async_trait]
impl Provider for Panicking {
    async fn create(&self, _: &OpCtx, _: &CreateRequest) -> Result<ProviderId, ProviderError> {
        panic!("a provider bug");
    }
    async fn get(&self, _: &OpCtx, _: &ProviderId) -> Result<Instance, ProviderError> {
        unreachable!("nothing was created")
    }
    async fn delete(&self, _: &OpCtx, _: &ProviderId) -> Result<(), ProviderError> {
        unreachable!("nothing was created")
    }
    async fn list_by_tag(&self, _: &OpCtx) -> Result<Vec<Instance>, ProviderError> {
        Ok(vec![])
    }
    async fn mark_installation(&self, _: &OpCtx, _: &ProviderId, _: &str) -> Result<(), ProviderError> {
        unreachable!("nothing was created")
    }
}

#[tokio::test]
async fn a_panicking_reconcile_is_a_counted_failure() {
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .namespace("crawl")
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let providers = common::one_provider("bug", Arc::new(Panicking));
    let metrics = ReconcileMetrics::new(3);
    let mut exposed = prometheus_client::registry::Registry::default();
    metrics.register(&mut exposed);
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            providers,
            Arc::new(common::NoVerdicts),
            Timings::default(),
            None,
            CancellationToken::new(),
        )
        .with_metrics(metrics),
    );
    let proxies: Api<Proxy> = Api::namespaced(client, "crawl");
    let mut proxy = Proxy::new(
        "p",
        ProxySpec {
            provider: "bug".into(),
            placement: Some(Placement {
                zone: "z".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    proxy.metadata.finalizers = Some(vec![FINALIZER.into()]);
    proxies.create(&PostParams::default(), &proxy).await.unwrap();

    let outcome = reconcile(Arc::new(proxies.get("p").await.unwrap()), ctx.clone()).await;
    assert!(
        matches!(&outcome, Err(ReconcileError::Panicked(what)) if what.contains("a provider bug")),
        "{outcome:?}"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &exposed).unwrap();
    for line in [
        r#"controller_runtime_reconcile_panics_total{controller="proxy"} 1"#,
        r#"controller_runtime_reconcile_errors_total{controller="proxy"} 1"#,
        r#"controller_runtime_reconcile_total{controller="proxy",result="error"} 1"#,
        r#"controller_runtime_active_workers{controller="proxy"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
}
