//! A pass that outlives its deadline (`Timings::pass_deadline`) is a reconcile timeout: the
//! provider call in flight is cut short, the reconcile fails and is retried, and
//! controller-runtime's `controller_runtime_reconcile_timeouts_total` counts it. A pass that ends
//! in time counts none.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use egress_api::{Placement, Proxy, ProxySpec};
use egress_controller::proxy::context::Context;
use egress_controller::proxy::decide::Timings;
use egress_controller::proxy::reconciler::{ReconcileError, reconcile};
use egress_controller::runtime_metrics::ReconcileMetrics;
use egress_kube_testserver::TestServer;
use egress_provider::{CreateRequest, ErrorScope, Instance, Op, OpCtx, Provider, ProviderError, ProviderId};
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

/// A provider whose create never answers by itself: only the caller's context ends it.
#[derive(Debug)]
struct Hanging;

#[async_trait]
impl Provider for Hanging {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let why = cx.done().await;
        Err(ErrorScope::new(Op::Create, "hang", &req.name).transient(why.to_string()))
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

fn timeouts(exposed: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, exposed).unwrap();
    text.lines()
        .find(|l| l.starts_with("controller_runtime_reconcile_timeouts_total{"))
        .unwrap_or_else(|| panic!("no timeouts series:\n{text}"))
        .to_owned()
}

#[tokio::test]
async fn a_pass_that_outlives_its_deadline_is_counted_as_a_reconcile_timeout() {
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .namespace("crawl")
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let providers = common::one_provider("slow", Arc::new(Hanging));
    let metrics = ReconcileMetrics::new(3);
    let mut exposed = prometheus_client::registry::Registry::default();
    metrics.register(&mut exposed);
    let timings = Timings {
        pass_deadline: Duration::from_millis(300),
        ..Timings::default()
    };
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            providers,
            Arc::new(common::NoVerdicts),
            timings,
            None,
            CancellationToken::new(),
        )
        .with_metrics(metrics),
    );
    let proxies: Api<Proxy> = Api::namespaced(client, "crawl");
    let proxy = Proxy::new(
        "p",
        ProxySpec {
            provider: "slow".into(),
            placement: Some(Placement {
                zone: "z".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    proxies.create(&PostParams::default(), &proxy).await.unwrap();

    // The first pass only puts the finalizer on: it ends in time.
    reconcile(Arc::new(proxies.get("p").await.unwrap()), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        timeouts(&exposed),
        r#"controller_runtime_reconcile_timeouts_total{controller="proxy"} 0"#
    );

    // The second creates, and the create hangs until the pass's deadline.
    let outcome = reconcile(Arc::new(proxies.get("p").await.unwrap()), ctx.clone()).await;
    assert!(
        matches!(&outcome, Err(ReconcileError::Backoff { why, .. }) if why.contains("deadline")),
        "{outcome:?}"
    );
    assert_eq!(
        timeouts(&exposed),
        r#"controller_runtime_reconcile_timeouts_total{controller="proxy"} 1"#
    );
}
