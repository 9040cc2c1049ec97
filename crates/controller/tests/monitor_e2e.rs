//! The provider-health monitor against egress-kube-testserver with the reference provider's
//! checker: objects created and patched, stale ones removed, checks-off cleanup.

mod common;

use std::sync::Arc;
use std::time::Duration;

use egress_api::{LABEL_MANAGED_BY, MANAGED_BY, ProviderHealth};
use egress_conformance::BackendHooks;
use egress_conformance::memory::MemoryBackend;
use egress_controller::provider_health::{Monitor, ProviderHealthSnapshot, Schedule};
use egress_kube_testserver::TestServer;
use egress_provider::Providers;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

fn providers(backend: &MemoryBackend, names: &[&str]) -> Arc<Providers> {
    common::memory_providers_on(backend, names)
}

fn schedule() -> Schedule {
    Schedule {
        interval: Duration::from_secs(60),
        timeout: Duration::from_secs(10),
    }
}

fn labelled(name: &str) -> ProviderHealth {
    let mut o = ProviderHealth::new(name, Default::default());
    o.metadata.labels = Some([(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string())].into());
    o
}

#[tokio::test]
async fn a_round_publishes_one_object_per_provider() {
    let server = TestServer::builder()
        .custom_resource::<ProviderHealth>()
        .start()
        .await
        .unwrap();
    let backend = MemoryBackend::new();
    let monitor = Monitor {
        client: server.client().unwrap(),
        providers: providers(&backend, &["mem-a", "Not_Valid"]),
        schedule: Some(schedule()),
        snapshot: ProviderHealthSnapshot::default(),
    };
    monitor.round(&schedule(), &CancellationToken::new()).await;
    let api: Api<ProviderHealth> = Api::all(server.client().unwrap());
    let object = api.get("mem-a").await.unwrap();
    assert_eq!(object.metadata.labels.unwrap()[LABEL_MANAGED_BY], MANAGED_BY);
    let status = object.status.unwrap();
    assert_eq!(status.type_, "memory");
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (format!("{:?}", ready.status), ready.reason.as_str()),
        ("True".to_string(), "AllTargetsReady")
    );
    assert!(!status.targets.is_empty());
    assert!(status.last_check_time.is_some());
    // An invalid name gets a snapshot entry (for its gauges) but no object.
    assert_eq!(monitor.snapshot.results().len(), 2);
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);

    // The backend goes away: the next round says so.
    backend.set_unreachable(true).await.unwrap();
    monitor.round(&schedule(), &CancellationToken::new()).await;
    let status = api.get("mem-a").await.unwrap().status.unwrap();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, "TargetsNotReady");
    assert!(status.targets.iter().all(|t| !t.ready));
}

#[tokio::test]
async fn cleanup_removes_only_the_operators_stale_objects() {
    let server = TestServer::builder()
        .custom_resource::<ProviderHealth>()
        .start()
        .await
        .unwrap();
    let api: Api<ProviderHealth> = Api::all(server.client().unwrap());
    for o in [
        labelled("mem-a"),
        labelled("gone"),
        ProviderHealth::new("someone-elses", Default::default()),
    ] {
        api.create(&PostParams::default(), &o).await.unwrap();
    }
    let backend = MemoryBackend::new();
    let mut monitor = Monitor {
        client: server.client().unwrap(),
        providers: providers(&backend, &["mem-a"]),
        schedule: Some(schedule()),
        snapshot: ProviderHealthSnapshot::default(),
    };
    assert_eq!(monitor.cleanup().await.unwrap(), 1);
    let mut names: Vec<String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.metadata.name.unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["mem-a", "someone-elses"]);
    // With checks off, every labelled object goes, so no stale Ready=True survives.
    monitor.schedule = None;
    assert_eq!(monitor.cleanup().await.unwrap(), 1);
    let names: Vec<String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.metadata.name.unwrap())
        .collect();
    assert_eq!(names, vec!["someone-elses"]);
}
