//! Shared by the controller's end-to-end tests: providers built from the conformance crate's
//! in-memory reference provider, and short reconciler timings.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use egress_conformance::memory::{MemoryBackend, MemoryProvider, MemoryTarget};
use egress_controller::proxy::decide::Timings;
use egress_provider::config::{ProviderConfig, ProvidersConfig, validators};
use egress_provider::decorate::ProviderMetrics;
use egress_provider::{ProviderType, Providers, Registry};

/// One configured entry `entry` of a type made for the test, whose every instance is `provider`,
/// built through the registry (so it is decorated as in the operator).
pub fn one_provider(entry: &str, provider: Arc<dyn egress_provider::Provider>) -> Arc<Providers> {
    let registry = Registry::new().with(ProviderType::new(
        "test",
        validators::none,
        move |_: &ProviderConfig| Ok(provider.clone()),
    ));
    let config = ProvidersConfig {
        providers: vec![ProviderConfig {
            name: entry.into(),
            type_name: "test".into(),
            ..Default::default()
        }],
    };
    Arc::new(registry.build(&config, &ProviderMetrics::new()).unwrap())
}

/// Configured providers, each a reference provider on its own backend, built through the
/// registry (so they are decorated as in the operator).
pub fn memory_providers(entries: &[(&str, &MemoryBackend)]) -> Arc<Providers> {
    memory_providers_with_budget(entries, egress_conformance::memory::CALL_BUDGET)
}

/// [`memory_providers`] whose backend calls each give up after `call_budget` (the reference
/// provider's own bound on one call; an hour stands for a provider that never gives up).
pub fn memory_providers_with_budget(entries: &[(&str, &MemoryBackend)], call_budget: Duration) -> Arc<Providers> {
    let mut registry = Registry::new();
    let mut config = ProvidersConfig::default();
    for (i, (name, backend)) in entries.iter().enumerate() {
        let backend = (*backend).clone();
        let type_name: &'static str = Box::leak(format!("memory{i}").into_boxed_str());
        registry = registry.with(ProviderType::new(
            type_name,
            validators::none,
            move |entry: &ProviderConfig| {
                let config = egress_conformance::memory::MemoryConfig {
                    call_budget,
                    ..MemoryTarget::config(&backend)
                };
                let p: Arc<dyn egress_provider::Provider> =
                    Arc::new(MemoryProvider::new(&entry.name, config, backend.clone(), vec![]));
                Ok(p)
            },
        ));
        config.providers.push(ProviderConfig {
            name: (*name).into(),
            type_name: type_name.into(),
            ..Default::default()
        });
    }
    Arc::new(registry.build(&config, &ProviderMetrics::new()).unwrap())
}

/// Configured providers sharing one backend and one provider type, `memory`.
pub fn memory_providers_on(backend: &MemoryBackend, names: &[&str]) -> Arc<Providers> {
    let backend = backend.clone();
    let registry = Registry::new().with(ProviderType::new(
        "memory",
        validators::none,
        move |entry: &ProviderConfig| {
            let p: Arc<dyn egress_provider::Provider> = Arc::new(MemoryProvider::new(
                &entry.name,
                MemoryTarget::config(&backend),
                backend.clone(),
                vec![],
            ));
            Ok(p)
        },
    ));
    let config = ProvidersConfig {
        providers: names
            .iter()
            .map(|n| ProviderConfig {
                name: (*n).into(),
                type_name: "memory".into(),
                ..Default::default()
            })
            .collect(),
    };
    Arc::new(registry.build(&config, &ProviderMetrics::new()).unwrap())
}

/// Short waits, so passes follow each other quickly; correctness never depends on them.
pub fn fast_timings() -> Timings {
    Timings {
        provisioning_poll: Duration::from_millis(50),
        deletion_poll: Duration::from_millis(50),
        drift_poll: Duration::from_millis(100),
        requeue_now: Duration::from_millis(10),
        quota_retry: Duration::from_millis(200),
        pass_deadline: Duration::from_secs(60),
        // Longer than any test runs: an address lost in a test stays lost only if it says so.
        address_grace: Duration::from_secs(60),
        // Tests that replace an instance without an address set their own.
        address_budget: None,
    }
}

/// Health verdicts that never have one: a pass decides from the Proxy and the provider alone.
pub struct NoVerdicts;

impl egress_controller::proxy::health::HealthVerdicts for NoVerdicts {
    fn verdict(&self, _: &str, _: &str) -> Option<egress_controller::proxy::status::Verdict> {
        None
    }
}

/// A test API server with the Proxy CRD and namespace `ns`, one reference backend configured as
/// entry `mem`, and the reconciler's context over them (no health verdicts, default timings).
pub struct MemWorld {
    pub server: egress_kube_testserver::TestServer,
    pub client: kube::Client,
    pub backend: MemoryBackend,
    pub ctx: Arc<egress_controller::proxy::context::Context>,
}

pub async fn mem_world(ns: &str) -> MemWorld {
    mem_world_as(ns, None).await
}

/// [`mem_world`] for an operator that runs as `installation`.
pub async fn mem_world_as(ns: &str, installation: Option<&str>) -> MemWorld {
    let server = egress_kube_testserver::TestServer::builder()
        .custom_resource::<egress_api::Proxy>()
        .namespace(ns)
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let backend = MemoryBackend::new();
    let ctx = Arc::new(egress_controller::proxy::context::Context::new(
        client.clone(),
        memory_providers(&[("mem", &backend)]),
        Arc::new(NoVerdicts),
        Timings::default(),
        installation.map(str::to_owned),
        tokio_util::sync::CancellationToken::new(),
    ));
    MemWorld {
        server,
        client,
        backend,
        ctx,
    }
}

/// A Managed Proxy spec on entry `mem`, in a zone, machine type and image its catalogue has.
pub fn mem_spec() -> egress_api::ProxySpec {
    egress_api::ProxySpec {
        provider: "mem".into(),
        placement: Some(egress_api::Placement {
            zone: "zone-a".into(),
            machine_type: "small".into(),
            image: "debian-13".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the reconciler would ask the memory backend to create for Proxy `proxy_name` (UID
/// `uid`) in `namespace` with [`mem_spec`]: for tests that put an instance there themselves.
pub fn mem_request(uid: &str, namespace: &str, proxy_name: &str) -> egress_provider::CreateRequest {
    egress_provider::CreateRequest {
        name: egress_provider::name_from_uid(uid),
        uid: uid.to_owned(),
        namespace: namespace.to_owned(),
        proxy_name: proxy_name.to_owned(),
        placement: egress_provider::Placement {
            zone: "zone-a".into(),
            machine_type: "small".into(),
            image: "debian-13".into(),
            ..Default::default()
        },
        cloud_init: Vec::new(),
        port: 3128,
        installation: None,
        credentials: None,
        spread_group: None,
    }
}

/// Changes Proxy `name`'s `spec.port` to 8080 (a merge patch): the simplest spec change, which
/// makes the reconciler replace the instance.
pub async fn change_port(proxies: &kube::Api<egress_api::Proxy>, name: &str) {
    proxies
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"port": 8080}})),
        )
        .await
        .expect("patching the Proxy's port");
}
