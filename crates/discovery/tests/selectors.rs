//! Selectors over real HTTP: one whose every key is indexed finds its proxies wherever they are
//! in the fleet, one on another key reads at most `MAX_SCAN` proxies, and the store is told
//! which index to answer from.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fixed, info, serve_on_loopback};
use egress_discovery::DiscoveryApi;
use egress_discovery::selection::MAX_SCAN;
use egress_lease::testing::{Hooked, Hooks};
use egress_lease::{Candidate, LeaseRequest, MemoryStore, Scope, SystemClock};
use serde_json::{Value, json};

/// Remembers the scope of each acquire.
#[derive(Default)]
struct Scopes(Mutex<Vec<Scope>>);

impl Hooks for Scopes {
    fn acquiring(&self, req: &LeaseRequest) -> Option<Candidate<'static>> {
        self.0.lock().unwrap().push(req.scope.clone());
        None
    }
}

/// `MAX_SCAN` fast proxies, then the slowest: in `geo=eu` and with `purpose=rare`.
async fn start() -> (String, Arc<Hooked<Scopes>>, tokio_util::sync::DropGuard) {
    let mut fleet: Vec<_> = (0..MAX_SCAN)
        .map(|i| info(&format!("ns/p{i:05}"), true, 1, 1, &[("geo", "us")]))
        .collect();
    fleet.push(info("ns/last", true, 99, 1, &[("geo", "eu"), ("purpose", "rare")]));
    let store = Arc::new(Hooked {
        inner: MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900)),
        hooks: Scopes::default(),
    });
    let (url, stop) = serve_on_loopback(DiscoveryApi {
        directory: Arc::new(Fixed::new(fleet)),
        store: store.clone(),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::None,
        refusals: None,
        admission: egress_discovery::Admission::default(),
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
    })
    .await;
    (url, store, stop)
}

async fn lease(url: &str, selector: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/leases"))
        .json(&json!({ "selector": selector }))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn an_indexed_selector_finds_its_proxy_anywhere_and_another_reads_a_capped_scan() {
    let (url, store, _stop) = start().await;
    let (status, granted) = lease(&url, json!({"geo": "eu"})).await;
    assert_eq!((status, &granted["proxy"]["id"]), (201, &json!("ns/last")), "{granted}");
    let (status, refused) = lease(&url, json!({"purpose": "rare"})).await;
    assert_eq!(
        (status, &refused["considered"]),
        (409, &json!(0)),
        "beyond the scan: {refused}"
    );
    let (status, granted) = lease(&url, json!({"geo": "us", "pool": "none"})).await;
    assert_eq!(
        (status, &granted["considered"]),
        (409, &json!(0)),
        "an index nobody is in: {granted}"
    );
    assert_eq!(
        *store.hooks.0.lock().unwrap(),
        [
            Scope::Indexed(vec!["geo=eu".into()]),
            Scope::Listed,
            Scope::Indexed(vec!["geo=us".into(), "pool=none".into()]),
        ]
    );
}
