//! The decorators and the registry, exercised over the reference provider:
//! CD-01 (metrics), CD-02 (tracing), CD-03 (checkers), CR-01 and CR-02
//! (registry) of spec/providers.md §2.5.

use std::sync::Arc;

use egress_conformance::BackendHooks as _;
use egress_conformance::capture::Capture;
use egress_conformance::memory::{LOOKUP, MemoryBackend, MemoryProvider, MemoryTarget};
use egress_conformance::{ConformanceTarget, Fault, Times};
use egress_provider::config::{ProviderConfig, ProvidersConfig, validators};
use egress_provider::decorate::{ProviderMetrics, decorate};
use egress_provider::{ErrorClass, Op, OpCtx, Provider, ProviderId, ProviderType, Registry};

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn memory(entry: &str, backend: &MemoryBackend) -> Arc<dyn Provider> {
    Arc::new(MemoryProvider::new(
        entry,
        MemoryTarget::config(backend),
        backend.clone(),
        vec![],
    ))
}

#[test]
fn every_call_is_counted_once_with_the_entry_name_and_its_result() {
    let backend = MemoryBackend::new();
    let metrics = ProviderMetrics::new();
    let p = decorate("gcp-eu", memory("gcp-eu", &backend), &metrics);
    let target = MemoryTarget::new();
    block_on(async {
        let cx = OpCtx::background();
        let id = p.create(&cx, &target.valid_request("cd01")).await.expect("create");
        p.get(&cx, &id).await.expect("get");
        let missing = target.id_for("proxy-aaaaaaaaaaaaaaaa");
        let e = p.get(&cx, &missing).await.expect_err("missing");
        // The inner error passes through unchanged.
        assert_eq!(e.class(), ErrorClass::NotFound);
        assert_eq!(e.provider(), "gcp-eu");
        backend.fail(LOOKUP, Fault::Quota, Times::Once).await.expect("hook");
        assert_eq!(
            p.get(&cx, &id).await.expect_err("quota").class(),
            ErrorClass::QuotaExceeded
        );
        p.list_by_tag(&cx).await.expect("list");
        p.delete(&cx, &id).await.expect("delete");
        p.get(&cx, &ProviderId::new("bad")).await.expect_err("malformed");
    });
    assert_eq!(metrics.requests("gcp-eu", Op::Create, "ok"), 1);
    assert_eq!(metrics.requests("gcp-eu", Op::Get, "ok"), 1);
    assert_eq!(metrics.requests("gcp-eu", Op::Get, "not_found"), 1);
    assert_eq!(metrics.requests("gcp-eu", Op::Get, "quota_exceeded"), 1);
    assert_eq!(metrics.requests("gcp-eu", Op::Get, "permanent"), 1);
    assert_eq!(metrics.requests("gcp-eu", Op::List, "ok"), 1);
    assert_eq!(metrics.requests("gcp-eu", Op::Delete, "ok"), 1);
    assert_eq!(metrics.requests("gcp-eu", Op::Delete, "transient"), 0);
}

#[test]
fn the_counter_is_exposed_under_its_wire_name() {
    let metrics = ProviderMetrics::new();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let backend = MemoryBackend::new();
    let p = decorate("kvm2-home", memory("kvm2-home", &backend), &metrics);
    block_on(async {
        p.list_by_tag(&OpCtx::background()).await.expect("list");
    });
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(
        text.contains(r#"proxy_operator_provider_requests_total{provider="kvm2-home",op="list",result="ok"} 1"#),
        "{text}"
    );
}

#[test]
fn each_call_gets_one_span_and_notfound_keeps_the_status_ok() {
    let (capture, _capturing) = Capture::start();
    let backend = MemoryBackend::new();
    let p = decorate("entry-a", memory("entry-a", &backend), &ProviderMetrics::new());
    let target = MemoryTarget::new();
    block_on(async {
        let cx = OpCtx::background();
        let id = p.create(&cx, &target.valid_request("cd02")).await.expect("create");
        p.get(&cx, &target.id_for("proxy-aaaaaaaaaaaaaaaa"))
            .await
            .expect_err("missing");
        p.get(&cx, &ProviderId::new("bad")).await.expect_err("malformed");
        p.list_by_tag(&cx).await.expect("list");
        p.delete(&cx, &id).await.expect("delete");
    });
    let spans: Vec<_> = capture
        .spans()
        .into_iter()
        .filter(|s| s.name.starts_with("provider."))
        .collect();
    let names: Vec<_> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "provider.create",
            "provider.get",
            "provider.get",
            "provider.list",
            "provider.delete"
        ]
    );
    for s in &spans {
        assert_eq!(s.field("provider.name"), Some("entry-a"));
        assert_eq!(s.field("otel.kind"), Some("client"));
    }
    let create = &spans[0];
    assert_eq!(create.field("provider.result"), Some("ok"));
    assert!(create.field("provider.id").is_some_and(|id| id.starts_with("zones/")));
    let missing = &spans[1];
    assert_eq!(missing.field("provider.result"), Some("not_found"));
    assert_eq!(
        missing.field("otel.status_code"),
        Some("ok"),
        "NotFound must keep the status ok"
    );
    let malformed = &spans[2];
    assert_eq!(malformed.field("provider.result"), Some("permanent"));
    assert_eq!(malformed.field("otel.status_code"), Some("error"));
    assert_eq!(spans[3].field("provider.id"), None, "list has no id");
    // The provider's own child spans sit under the operation span.
    let child = capture
        .spans()
        .into_iter()
        .find(|s| s.name == "memory.insert")
        .expect("a child span");
    assert_eq!(child.parent, Some(create.id));
}

fn registry() -> Registry {
    Registry::new()
        .with(ProviderType::new(
            "memory",
            validators::none,
            |entry: &ProviderConfig| {
                let backend = MemoryBackend::new();
                Ok(memory(&entry.name, &backend))
            },
        ))
        .with(ProviderType::new("refuses", validators::none, |_| {
            Err("the key file path is not absolute".into())
        }))
}

fn entry(name: &str, type_name: &str) -> ProviderConfig {
    ProviderConfig {
        name: name.to_owned(),
        type_name: type_name.to_owned(),
        ..ProviderConfig::default()
    }
}

#[test]
fn checkers_come_from_undecorated_providers_in_config_order() {
    let config = ProvidersConfig {
        providers: vec![entry("second", "memory"), entry("first", "memory")],
    };
    let built = registry().build(&config, &ProviderMetrics::new()).expect("build");
    let names: Vec<_> = built.entries().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["second", "first"]);
    for e in built.entries() {
        assert!(e.checker.is_some(), "{} lost its checker", e.name);
        assert!(
            e.provider.checker().is_none(),
            "a decorated provider must not offer a checker"
        );
    }
    assert!(built.get("first").is_some() && built.get("third").is_none());
}

#[test]
fn a_constructor_error_aborts_the_build_naming_the_entry() {
    let config = ProvidersConfig {
        providers: vec![entry("good", "memory"), entry("kvm-lab", "refuses")],
    };
    let e = registry()
        .build(&config, &ProviderMetrics::new())
        .expect_err("must fail");
    assert_eq!(
        e.to_string(),
        r#"provider "kvm-lab" (type refuses): the key file path is not absolute"#
    );
}

#[test]
fn the_loader_accepts_exactly_the_registered_types() {
    let reg = registry();
    let ok = ProvidersConfig::parse("providers:\n  - name: a\n    type: memory\n", "p.yaml", &reg)
        .expect("memory is registered");
    assert_eq!(ok.config.providers.len(), 1);
    let e = ProvidersConfig::parse("providers:\n  - name: a\n    type: gcp\n", "p.yaml", &reg).expect_err("gcp is not");
    assert_eq!(
        e.to_string(),
        r#"p.yaml: providers[0] "a": unknown provider type "gcp""#
    );
    assert_eq!(reg.type_names().collect::<Vec<_>>(), ["memory", "refuses"]);
}
