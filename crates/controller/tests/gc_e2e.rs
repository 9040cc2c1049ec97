//! Orphan GC sweeps against egress-kube-testserver and the in-memory reference provider.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_api::{Proxy, ProxySpec};
use egress_conformance::memory::MemoryBackend;
use egress_conformance::{BackendHooks, CallKind, Fault, SeedSpec, SeedTime, Times};
use egress_controller::gc::{OrphanGc, SweepReport};
use egress_kube_testserver::{Fault as ApiFault, TestServer, Verb};
use egress_provider::{CreateRequest, OpCtx, Providers};
use kube::ResourceExt;
use kube::api::{Api, PostParams};

struct Setup {
    server: TestServer,
    backends: Vec<MemoryBackend>,
    providers: Arc<Providers>,
}

async fn setup(names: &[&str]) -> Setup {
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .namespace("a")
        .namespace("b")
        .start()
        .await
        .unwrap();
    let backends: Vec<MemoryBackend> = names.iter().map(|_| MemoryBackend::new()).collect();
    let named: Vec<(&str, &MemoryBackend)> = names.iter().copied().zip(backends.iter()).collect();
    let providers = common::memory_providers(&named);
    Setup {
        server,
        backends,
        providers,
    }
}

fn gc(s: &Setup, min_age: Duration, installation: Option<&str>) -> OrphanGc {
    OrphanGc {
        client: s.server.client().unwrap(),
        providers: s.providers.clone(),
        interval: Duration::from_secs(600),
        min_age,
        installation: installation.map(str::to_string),
    }
}

async fn live_proxy(s: &Setup, namespace: &str) -> String {
    let api: Api<Proxy> = Api::namespaced(s.server.client().unwrap(), namespace);
    let p = Proxy::new(
        "live",
        ProxySpec {
            provider: "mem1".into(),
            ..Default::default()
        },
    );
    api.create(&PostParams::default(), &p).await.unwrap().uid().unwrap()
}

async fn names(backend: &MemoryBackend) -> Vec<String> {
    let mut names: Vec<String> = backend
        .inventory()
        .await
        .unwrap()
        .into_iter()
        .filter(|o| o.kind == "instance")
        .map(|o| o.owner)
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_sweep_deletes_old_orphans_only() {
    let s = setup(&["mem1"]).await;
    // The live Proxy is in another namespace than any default: the live set is cluster-wide.
    let uid = live_proxy(&s, "b").await;
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let b = &s.backends[0];
    b.seed(SeedSpec {
        created_at: SeedTime::Valid(hour_ago),
        ..SeedSpec::marked("owned", uid)
    })
    .await
    .unwrap();
    b.seed(SeedSpec {
        created_at: SeedTime::Valid(hour_ago),
        ..SeedSpec::marked("orphan-old", "gone-1")
    })
    .await
    .unwrap();
    b.seed(SeedSpec {
        created_at: SeedTime::Missing,
        ..SeedSpec::marked("orphan-undated", "gone-2")
    })
    .await
    .unwrap();
    b.seed(SeedSpec::marked("orphan-young", "gone-3")).await.unwrap();
    b.seed(SeedSpec {
        uid: None,
        created_at: SeedTime::Valid(hour_ago),
        ..SeedSpec::marked("unmarked", "x")
    })
    .await
    .unwrap();
    let report = gc(&s, Duration::from_secs(600), None).sweep(&OpCtx::background()).await;
    assert_eq!(
        report,
        SweepReport {
            swept: true,
            deleted: 2,
            skipped: vec![]
        }
    );
    assert_eq!(names(b).await, vec!["orphan-young", "owned", "unmarked"]);
}

#[tokio::test]
async fn a_broken_provider_is_skipped_and_the_others_swept() {
    let s = setup(&["mem1", "mem2"]).await;
    let old = SystemTime::now() - Duration::from_secs(3600);
    for b in &s.backends {
        b.seed(SeedSpec {
            created_at: SeedTime::Valid(old),
            ..SeedSpec::marked("orphan", "gone")
        })
        .await
        .unwrap();
    }
    s.backends[1]
        .fail(CallKind("list"), Fault::Server5xx, Times::Always)
        .await
        .unwrap();
    let report = gc(&s, Duration::from_secs(600), None).sweep(&OpCtx::background()).await;
    assert_eq!(
        report,
        SweepReport {
            swept: true,
            deleted: 1,
            skipped: vec!["mem2".into()]
        }
    );
    assert!(names(&s.backends[0]).await.is_empty());
    s.backends[1].clear_faults().await.unwrap();
    assert_eq!(names(&s.backends[1]).await, vec!["orphan"]);
}

#[tokio::test]
async fn a_failed_proxy_list_skips_the_whole_sweep() {
    let s = setup(&["mem1"]).await;
    let old = SystemTime::now() - Duration::from_secs(3600);
    s.backends[0]
        .seed(SeedSpec {
            created_at: SeedTime::Valid(old),
            ..SeedSpec::marked("orphan", "gone")
        })
        .await
        .unwrap();
    s.server.faults().inject(ApiFault::fail(Verb::List, "proxies", 500));
    let report = gc(&s, Duration::from_secs(600), None).sweep(&OpCtx::background()).await;
    assert_eq!(
        report,
        SweepReport {
            swept: false,
            deleted: 0,
            skipped: vec![]
        }
    );
    assert_eq!(
        names(&s.backends[0]).await,
        vec!["orphan"],
        "never act on an empty live set"
    );
}

#[tokio::test]
async fn another_installations_instances_are_never_collected() {
    let s = setup(&["mem1"]).await;
    let provider = s.providers.get("mem1").unwrap().clone();
    let cx = OpCtx::background();
    for (name, installation) in [("ours", Some("blue")), ("theirs", Some("green")), ("unlabelled", None)] {
        let req = CreateRequest {
            name: name.into(),
            installation: installation.map(str::to_string),
            ..common::mem_request(&format!("gone-{name}"), "a", name)
        };
        provider.create(&cx, &req).await.unwrap();
    }
    let report = gc(&s, Duration::ZERO, Some("blue")).sweep(&cx).await;
    assert_eq!(report.deleted, 1);
    assert_eq!(names(&s.backends[0]).await, vec!["theirs", "unlabelled"]);
}
