//! The create budget end to end: a kube `Controller` running `reconcile` against
//! egress-kube-testserver with two entries of the in-memory reference provider, one allowed 3
//! creates a minute and one the default, and the budgets' clock frozen, so exactly what the
//! budget lets through reaches each backend, whatever the order the Proxies are reconciled in.

mod common;

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use egress_api::{ANNOTATION_CREDENTIALS_INSTANCE, CredentialsType, Phase, Proxy, ProxySpec, reasons};
use egress_conformance::BackendHooks as _;
use egress_conformance::memory::{INSERT, MemoryBackend, MemoryProvider, MemoryTarget};
use egress_controller::create_budget::{CreateBudgets, ManualClock};
use egress_controller::proxy::context::Context;
use egress_controller::proxy::controller::{self, ControllerConfig};
use egress_controller::proxy::health::HealthVerdicts;
use egress_controller::proxy::status::Verdict;
use egress_kube_testserver::TestServer;
use egress_provider::config::{ProviderConfig, ProvidersConfig, validators};
use egress_provider::decorate::ProviderMetrics;
use egress_provider::{ProviderType, Providers, Registry};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

const NS: &str = "crawl";
const LIVENESS: Duration = Duration::from_secs(30);

/// No verdicts; counts the passes of each Proxy (one verdict read per pass), so a test can wait
/// for passes instead of sleeping.
struct CountingHealth {
    passes: tokio::sync::watch::Sender<HashMap<String, usize>>,
}

impl HealthVerdicts for CountingHealth {
    fn verdict(&self, _: &str, name: &str) -> Option<Verdict> {
        self.passes.send_modify(|m| *m.entry(name.to_owned()).or_default() += 1);
        None
    }
}

impl CountingHealth {
    fn passes(&self, name: &str) -> usize {
        self.passes.borrow().get(name).copied().unwrap_or(0)
    }

    async fn wait_passes(&self, name: &str, n: usize) {
        let mut rx = self.passes.subscribe();
        tokio::time::timeout(LIVENESS, rx.wait_for(|m| m.get(name).copied().unwrap_or(0) >= n))
            .await
            .unwrap_or_else(|_| panic!("{name} had no pass {n}"))
            .unwrap();
    }
}

/// Entries of the reference provider, each on its own backend and with its own
/// `createsPerMinute` (`None`: the default), built through the registry as the operator does.
fn providers(entries: &[(&str, &MemoryBackend, Option<u32>)]) -> Arc<Providers> {
    let mut registry = Registry::new();
    let mut config = ProvidersConfig::default();
    for (i, (name, backend, creates_per_minute)) in entries.iter().enumerate() {
        let backend = (*backend).clone();
        let type_name: &'static str = Box::leak(format!("memory{i}").into_boxed_str());
        registry = registry.with(ProviderType::new(
            type_name,
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
        config.providers.push(ProviderConfig {
            creates_per_minute: *creates_per_minute,
            ..ProviderConfig::new(*name, type_name)
        });
    }
    Arc::new(registry.build(&config, &ProviderMetrics::new()).unwrap())
}

/// A Managed Proxy with Generated credentials on `entry`.
fn proxy(name: &str, entry: &str) -> Proxy {
    Proxy::new(
        name,
        ProxySpec {
            provider: entry.into(),
            credentials: Some(egress_api::Credentials {
                type_: CredentialsType::Generated,
                secret_ref: None,
            }),
            ..common::mem_spec()
        },
    )
}

fn created(p: &Proxy) -> bool {
    p.status.as_ref().is_some_and(|s| !s.provider_id.is_empty())
}

fn waiting(p: &Proxy) -> bool {
    p.condition("Provisioned")
        .is_some_and(|c| c.reason == reasons::CREATE_BUDGET)
}

fn on<'p>(proxies: &'p [Arc<Proxy>], entry: &'p str) -> impl Iterator<Item = &'p Proxy> + 'p {
    proxies
        .iter()
        .map(AsRef::as_ref)
        .filter(move |p| p.spec.provider == entry)
}

/// Waits until the objects `api` lists satisfy `done`, watching them (no polling), and returns
/// them as they were then.
async fn wait_for_state<K>(api: &Api<K>, what: &str, done: impl Fn(&[Arc<K>]) -> bool) -> Vec<Arc<K>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let mut changes = Box::pin(watcher(api.clone(), watcher::Config::default()).reflect(writer));
    tokio::time::timeout(LIVENESS, async {
        while let Some(change) = changes.next().await {
            change.expect("the watch runs");
            let state = reader.state();
            if done(&state) {
                return state;
            }
        }
        panic!("the watch ended");
    })
    .await
    .unwrap_or_else(|_| panic!("never reached: {what}"))
}

async fn inserts(backend: &MemoryBackend) -> usize {
    let log = backend.call_log().await.unwrap();
    log.iter().filter(|c| c.kind == INSERT).count()
}

fn scrape(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.lines().any(|l| l == *line), "missing {line:?} in\n{text}");
    }
}

/// The password in Proxy `p`'s credentials Secret.
async fn password(secrets: &Api<Secret>, p: &Proxy) -> Vec<u8> {
    let name = egress_controller::proxy::credentials::secret_name(&p.uid().unwrap());
    let secret = secrets.get(&name).await.unwrap();
    secret.data.unwrap()[egress_credentials::PASSWORD_KEY].0.clone()
}

/// The reconciler running on `providers` with create budgets on a frozen clock.
struct Running {
    clock: ManualClock,
    /// The budgets' metrics.
    metrics: prometheus_client::registry::Registry,
    health: Arc<CountingHealth>,
    /// Asks for a pass of a Proxy (as a health event does).
    poke: Box<dyn Fn(&str)>,
    cache: egress_controller::proxy_cache::ProxyCache,
    shutdown: CancellationToken,
}

fn start(client: &kube::Client, providers: Arc<Providers>) -> Running {
    let clock = ManualClock::new();
    let budgets = CreateBudgets::for_providers(&providers, Arc::new(clock.clone()));
    let mut metrics = prometheus_client::registry::Registry::default();
    budgets.register(&mut metrics);
    let health = Arc::new(CountingHealth {
        passes: tokio::sync::watch::channel(HashMap::new()).0,
    });
    let shutdown = CancellationToken::new();
    let ctx = Context::new(
        client.clone(),
        providers,
        health.clone(),
        common::fast_timings(),
        None,
        shutdown.clone(),
    )
    .with_create_budgets(budgets);
    let (pokes, health_events) = futures::channel::mpsc::unbounded::<ObjectRef<Proxy>>();
    let (cache, keep_cache) = egress_controller::proxy_cache::proxy_cache(
        client.clone(),
        &egress_api::served::Namespaces::All,
        shutdown.clone(),
    );
    tokio::spawn(keep_cache);
    tokio::spawn(controller::run(
        Arc::new(ctx),
        ControllerConfig::default(),
        cache.clone(),
        health_events,
        shutdown.clone(),
    ));
    Running {
        clock,
        metrics,
        health,
        poke: Box::new(move |name| pokes.unbounded_send(ObjectRef::new(name).within(NS)).unwrap()),
        cache,
        shutdown,
    }
}

#[tokio::test]
async fn the_create_budget_holds_across_the_proxies_of_an_entry_and_is_separate_per_entry() {
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .namespace(NS)
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let (tight, roomy) = (MemoryBackend::new(), MemoryBackend::new());
    let providers = providers(&[("tight", &tight, Some(3)), ("roomy", &roomy, None)]);
    let Running {
        clock,
        metrics,
        health,
        poke,
        shutdown,
        ..
    } = start(&client, providers);
    let _stop = shutdown.drop_guard();

    let proxies: Api<Proxy> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    for (name, entry) in [
        ("t1", "tight"),
        ("t2", "tight"),
        ("t3", "tight"),
        ("t4", "tight"),
        ("t5", "tight"),
        ("r1", "roomy"),
        ("r2", "roomy"),
    ] {
        proxies
            .create(&PostParams::default(), &proxy(name, entry))
            .await
            .unwrap();
    }

    // With the clock frozen, three of tight's five are created and two wait; roomy's two, a
    // burst well within its default budget, are created without waiting.
    let state = wait_for_state(&proxies, "3 created and 2 waiting on tight, 2 created on roomy", |ps| {
        on(ps, "tight").filter(|p| created(p)).count() == 3
            && on(ps, "tight").filter(|p| waiting(p)).count() == 2
            && on(ps, "roomy").filter(|p| created(p)).count() == 2
    })
    .await;
    assert_eq!(inserts(&tight).await, 3, "exactly the budget reached tight's backend");
    assert_eq!(inserts(&roomy).await, 2);
    let waiters: Vec<Proxy> = on(&state, "tight").filter(|p| waiting(p)).cloned().collect();
    for p in &waiters {
        let condition = p.condition("Provisioned").unwrap();
        assert!(
            condition
                .message
                .starts_with(r#"waiting for provider entry "tight"'s create budget (3 per minute); about "#),
            "{}",
            condition.message
        );
        assert_eq!(p.status.as_ref().unwrap().phase, Some(Phase::Pending));
    }

    // More passes of the waiting ones while the clock stands still: no create, no new Event,
    // and their credentials are kept, not minted again.
    let mut kept = Vec::new();
    for p in &waiters {
        let name = p.name_any();
        kept.push(password(&secrets, p).await);
        for _ in 0..2 {
            let next = health.passes(&name) + 1;
            poke(&name);
            health.wait_passes(&name, next).await;
        }
        // One pass more: the one before it has published its Events.
        let next = health.passes(&name) + 1;
        poke(&name);
        health.wait_passes(&name, next).await;
    }
    assert_eq!(inserts(&tight).await, 3);
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let delayed = wait_for_state(&events, "2 CreateDelayed events", |es| {
        es.iter()
            .filter(|e| e.reason.as_deref() == Some("CreateDelayed"))
            .count()
            >= 2
    })
    .await;
    let mut delayed_for: Vec<String> = delayed
        .iter()
        .filter(|e| e.reason.as_deref() == Some("CreateDelayed"))
        .map(|e| e.regarding.as_ref().and_then(|r| r.name.clone()).unwrap_or_default())
        .collect();
    delayed_for.sort();
    let mut waiter_names: Vec<String> = waiters.iter().map(ResourceExt::name_any).collect();
    waiter_names.sort();
    assert_eq!(delayed_for, waiter_names, "one CreateDelayed Event per waiting Proxy");
    assert!(
        delayed
            .iter()
            .filter(|e| e.reason.as_deref() == Some("CreateDelayed"))
            .all(|e| e.type_.as_deref() == Some("Normal"))
    );
    assert_lines(
        &scrape(&metrics),
        &[
            r#"proxy_operator_provider_create_budget_waits_total{provider="tight"} 2"#,
            r#"proxy_operator_provider_create_budget_waits_total{provider="roomy"} 0"#,
            r#"proxy_operator_provider_create_budget_waiting{provider="tight"} 2"#,
            r#"proxy_operator_provider_create_budget_waiting{provider="roomy"} 0"#,
        ],
    );

    // A minute later the bucket is full again: the two waiting ones are created.
    clock.advance(Duration::from_secs(60));
    for p in &waiters {
        poke(&p.name_any());
    }
    let state = wait_for_state(&proxies, "all 5 created on tight", |ps| {
        on(ps, "tight").filter(|p| created(p)).count() == 5
    })
    .await;
    assert_eq!(inserts(&tight).await, 5);
    for (p, before) in waiters.iter().zip(&kept) {
        let now = state.iter().find(|s| s.name_any() == p.name_any()).unwrap();
        let name = egress_controller::proxy::credentials::secret_name(&now.uid().unwrap());
        let bound = secrets
            .get(&name)
            .await
            .unwrap()
            .annotations()
            .get(ANNOTATION_CREDENTIALS_INSTANCE)
            .cloned();
        assert_eq!(
            bound.as_deref(),
            Some(now.status.as_ref().unwrap().provider_id.as_str())
        );
        assert_eq!(
            &password(&secrets, now).await,
            before,
            "{}: the instance was made with the credentials prepared before the wait",
            p.name_any()
        );
    }
    assert_lines(
        &scrape(&metrics),
        &[
            r#"proxy_operator_provider_create_budget_waits_total{provider="tight"} 2"#,
            r#"proxy_operator_provider_create_budget_waiting{provider="tight"} 0"#,
        ],
    );
}

#[tokio::test]
async fn the_create_budget_holds_across_two_pools_on_one_entry() {
    let server = TestServer::builder()
        .custom_resource::<Proxy>()
        .custom_resource::<egress_api::ProxyPool>()
        .namespace(NS)
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let shared = MemoryBackend::new();
    let providers = providers(&[("shared", &shared, Some(3))]);
    let Running {
        clock,
        poke,
        cache,
        shutdown,
        ..
    } = start(&client, providers);
    let _stop = shutdown.clone().drop_guard();
    let store: Arc<dyn egress_lease::LeaseStore> = Arc::new(egress_lease::MemoryStore::new(
        Arc::new(egress_lease::SystemClock),
        Duration::from_secs(60),
    ));
    let pools_ctx = Arc::new(egress_controller::pool::pass::PoolContext::new(
        client.clone(),
        cache,
        store,
        egress_controller::pool::metrics::PoolMetrics::new(),
        None,
    ));
    tokio::spawn(egress_controller::pool::controller::run(
        pools_ctx,
        egress_api::served::Namespaces::All,
        shutdown.clone(),
    ));

    // Two pools of 2 + 1 on the one entry: six members, a budget of three.
    let pools: Api<egress_api::ProxyPool> = Api::namespaced(client.clone(), NS);
    for name in ["east", "west"] {
        let pool: egress_api::ProxyPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": name},
            "spec": {"replicas": 2, "standby": 1, "template": {"spec": {"provider": "shared",
                "placement": {"zone": "zone-a", "machineType": "small", "image": "debian-13"}}}}
        }))
        .unwrap();
        pools.create(&PostParams::default(), &pool).await.unwrap();
    }
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), NS);
    let of_pool =
        |ps: &[Arc<Proxy>], pool: &str| ps.iter().filter(|p| p.pool().is_some_and(|m| m.pool == pool)).count();
    let state = wait_for_state(&proxies, "6 members, 3 created and 3 waiting", |ps| {
        of_pool(ps, "east") == 3
            && of_pool(ps, "west") == 3
            && on(ps, "shared").filter(|p| created(p)).count() == 3
            && on(ps, "shared").filter(|p| waiting(p)).count() == 3
    })
    .await;
    assert_eq!(inserts(&shared).await, 3, "one budget for both pools");

    // A minute on, the three waiting members are created.
    clock.advance(Duration::from_secs(60));
    for p in on(&state, "shared").filter(|p| waiting(p)) {
        poke(&p.name_any());
    }
    wait_for_state(&proxies, "all 6 created", |ps| {
        on(ps, "shared").filter(|p| created(p)).count() == 6
    })
    .await;
    assert_eq!(inserts(&shared).await, 6);
}
