//! The reconciler's span topology (spec/core.md §9.3), captured from direct calls of
//! `reconcile` on one thread: `Reconcile Proxy` → `reconcile.managed` → `provider.create`;
//! `status.patch` on every pass; `reconcile.replaceInstance` → `provider.delete`;
//! `reconcile.delete` → `provider.delete`.

mod common;

use std::sync::Arc;

use egress_api::{Phase, Placement, Proxy, ProxySpec};
use egress_conformance::capture::{Capture, CapturedSpan};
use egress_conformance::memory::MemoryBackend;
use egress_controller::proxy::context::Context;
use egress_controller::proxy::decide::Timings;
use egress_controller::proxy::reconciler::reconcile;
use egress_kube_testserver::TestServer;
use kube::api::{Api, DeleteParams, PostParams};
use tokio_util::sync::CancellationToken;

async fn context(server: &TestServer) -> Arc<Context> {
    let backend = MemoryBackend::new();
    let providers = common::memory_providers(&[("mem", &backend)]);
    Arc::new(Context::new(
        server.client().unwrap(),
        providers,
        Arc::new(common::NoVerdicts),
        Timings::default(),
        None,
        CancellationToken::new(),
    ))
}

/// One reconcile of the Proxy as it is now; the spans it produced.
async fn pass(api: &Api<Proxy>, ctx: &Arc<Context>, capture: &Capture) -> Vec<CapturedSpan> {
    let mark = capture.span_mark();
    let proxy = api.get("p").await.unwrap();
    let _ = reconcile(Arc::new(proxy), ctx.clone()).await;
    capture.spans_since(mark)
}

fn find<'a>(spans: &'a [CapturedSpan], name: &str) -> &'a CapturedSpan {
    spans.iter().find(|s| s.name == name).unwrap_or_else(|| {
        panic!(
            "no {name} span in {:?}",
            spans.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()
        )
    })
}

#[tokio::test]
async fn the_reconciler_span_topology() {
    let (capture, _guard) = Capture::start();
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .namespace("ns")
        .start()
        .await
        .unwrap();
    let ctx = context(&server).await;
    let api: Api<Proxy> = Api::namespaced(server.client().unwrap(), "ns");
    let placement = Placement {
        zone: "zone-a".into(),
        machine_type: "small".into(),
        image: "debian-13".into(),
        ..Default::default()
    };
    let spec = ProxySpec {
        provider: "mem".into(),
        placement: Some(placement),
        ..Default::default()
    };
    api.create(&PostParams::default(), &Proxy::new("p", spec))
        .await
        .unwrap();

    // Pass 1 adds the finalizer; pass 2 creates.
    pass(&api, &ctx, &capture).await;
    let spans = pass(&api, &ctx, &capture).await;
    let root = find(&spans, "Reconcile Proxy");
    assert_eq!(root.parent, None, "each reconcile is its own trace");
    assert_eq!(root.field("k8s.object.name"), Some("p"));
    assert_eq!(root.field("k8s.namespace.name"), Some("ns"));
    assert!(root.field("reconcile.id").is_some());
    let managed = find(&spans, "reconcile.managed");
    assert_eq!(managed.parent, Some(root.id));
    let create = find(&spans, "provider.create");
    assert!(
        capture.descends_from(create.id, managed.id),
        "provider.create under reconcile.managed"
    );
    assert_eq!(find(&spans, "status.patch").parent, Some(root.id));

    // Let it run, then change the spec: the replacement's calls sit under reconcile.replaceInstance.
    for _ in 0..10 {
        if api.get("p").await.unwrap().status.and_then(|s| s.phase) == Some(Phase::Running) {
            break;
        }
        pass(&api, &ctx, &capture).await;
    }
    common::change_port(&api, "p").await;
    let spans = pass(&api, &ctx, &capture).await;
    let root = find(&spans, "Reconcile Proxy");
    let replace = find(&spans, "reconcile.replaceInstance");
    assert_eq!(replace.parent, Some(root.id));
    let delete = find(&spans, "provider.delete");
    assert!(
        capture.descends_from(delete.id, replace.id),
        "provider.delete under reconcile.replaceInstance"
    );

    // Deletion.
    api.delete("p", &DeleteParams::default()).await.unwrap();
    let spans = pass(&api, &ctx, &capture).await;
    let root = find(&spans, "Reconcile Proxy");
    let deleting = find(&spans, "reconcile.delete");
    assert_eq!(deleting.parent, Some(root.id));
    assert!(
        spans
            .iter()
            .any(|s| s.name.starts_with("provider.") && capture.descends_from(s.id, deleting.id))
    );
    assert!(
        spans.iter().any(|s| s.name == "status.patch"),
        "status.patch on every reconcile"
    );
}
