//! Admission over HTTP: work is shared between clients, not connections. A store that holds
//! each call until the test lets it go shows which request the server serves next.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fixed, info, serve_on_loopback};
use egress_discovery::{Admission, AdmissionMetrics, Auth, Budget, Budgets, ClientName, DiscoveryApi, TokenSet};
use egress_lease::testing::{Hooked, Hooks};
use egress_lease::{MemoryStore, SystemClock};
use tokio::sync::{Semaphore, watch};

const PATIENCE: Duration = Duration::from_secs(30);

/// Each `active_leases` (the list route's store call) waits for a permit of `gate`; the ids
/// each call asked for are recorded in the order calls arrive.
struct Gate {
    gate: Semaphore,
    calls: Mutex<Vec<Vec<String>>>,
    arrived: watch::Sender<usize>,
}

#[async_trait::async_trait]
impl Hooks for Gate {
    async fn reading_active(&self, proxies: &[egress_lease::ProxyRef<'_>]) {
        self.calls
            .lock()
            .unwrap()
            .push(proxies.iter().map(|p| p.id.to_owned()).collect());
        self.arrived.send_modify(|n| *n += 1);
        self.gate.acquire().await.expect("the gate stays open").forget();
    }
}

/// Waits until `rx` holds a value for which `pred` holds.
async fn until<T>(rx: &mut watch::Receiver<T>, pred: impl FnMut(&T) -> bool) {
    tokio::time::timeout(PATIENCE, rx.wait_for(pred))
        .await
        .expect("in time")
        .expect("the sender lives");
}

/// Polls `check` until it holds, within [`PATIENCE`], yielding to the server's tasks between
/// looks (no sleep: the runtime's other worker serves while this one yields).
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "{what} within {PATIENCE:?}");
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_slot_goes_to_the_client_with_fewer_requests_not_to_the_longest_queue() {
    let (arrived, mut arrivals) = watch::channel(0);
    let store = Arc::new(Hooked {
        inner: MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900)),
        hooks: Gate {
            gate: Semaphore::new(0),
            calls: Mutex::default(),
            arrived,
        },
    });
    let clients = BTreeMap::from([
        (ClientName::parse("abuse").unwrap(), vec!["abuse-token".to_owned()]),
        (ClientName::parse("polite").unwrap(), vec!["polite-token".to_owned()]),
    ]);
    // Two requests served at once, whoever sends them; each client could take both.
    let budget = Budget {
        requests_per_second: 1000,
        burst: 1000,
        concurrency: 16,
    };
    let metrics = AdmissionMetrics::default();
    let (url, _stop) = serve_on_loopback(DiscoveryApi {
        directory: Arc::new(Fixed::new(vec![
            info("ns/a", true, 1, 1, &[("team", "abuse")]),
            info("ns/b", true, 1, 1, &[("team", "polite")]),
        ])),
        store: store.clone(),
        max_ttl: Duration::from_secs(3600),
        auth: Auth::Tokens(Arc::new(TokenSet::of_clients(&clients))),
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: Admission::new(Budgets::uniform(budget), 2, metrics.clone()),
    })
    .await;
    let list = |token: &'static str, team: &'static str| {
        let url = format!("{url}/v1/proxies?attr.team={team}");
        tokio::spawn(async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    // Six connections of one client: two reach the store, four wait their turn.
    let abusive: Vec<_> = (0..6).map(|_| list("abuse-token", "abuse")).collect();
    until(&mut arrivals, |n| *n == 2).await;
    eventually("four abusive requests waiting", || metrics.waiting("abuse") == 4).await;
    // One connection of another client, after all of them.
    let polite = list("polite-token", "polite");
    eventually("the polite request waiting", || metrics.waiting("polite") == 1).await;
    // One slot frees: it goes to the client with none in flight.
    store.hooks.gate.add_permits(1);
    until(&mut arrivals, |n| *n == 3).await;
    assert_eq!(
        store.hooks.calls.lock().unwrap()[2],
        ["ns/b"],
        "the polite request is served third"
    );
    store.hooks.gate.add_permits(100);
    assert_eq!(polite.await.unwrap().unwrap(), 200);
    for a in abusive {
        assert_eq!(a.await.unwrap().unwrap(), 200);
    }
    assert_eq!(store.hooks.calls.lock().unwrap().len(), 7);
    assert_eq!((metrics.answers("abuse", 200), metrics.answers("polite", 200)), (6, 1));
    assert_eq!((metrics.in_flight("abuse"), metrics.waiting("abuse")), (0, 0));
}

#[tokio::test]
async fn over_its_budget_a_client_is_refused_before_its_body_is_read_and_others_are_served() {
    let clients = BTreeMap::from([
        (ClientName::parse("team-a").unwrap(), vec!["a-token".to_owned()]),
        (ClientName::parse("team-b").unwrap(), vec!["b-token".to_owned()]),
    ]);
    let small = Budget {
        requests_per_second: 1,
        burst: 1,
        concurrency: 16,
    };
    let metrics = AdmissionMetrics::default();
    let (url, _stop) = serve_on_loopback(DiscoveryApi {
        directory: Arc::new(Fixed::new(vec![info("ns/a", true, 1, 100, &[])])),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: Auth::Tokens(Arc::new(TokenSet::of_clients(&clients))),
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: Admission::new(Budgets::uniform(small), 16, metrics.clone()),
    })
    .await;
    let http = reqwest::Client::new();
    let acquire = |token: &str, body: &str| {
        http.post(format!("{url}/v1/leases"))
            .bearer_auth(token)
            .body(body.to_owned())
            .send()
    };
    assert_eq!(acquire("a-token", "{}").await.unwrap().status(), 201);
    // Over the budget: refused at once, though the body it announces never comes (reading
    // it would wait for the body's budget, then answer 400), and the connection is closed.
    let addr = url.trim_start_matches("http://");
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/leases HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer a-token\r\nContent-Length: 1000\r\n\r\n"
    );
    tokio::io::AsyncWriteExt::write_all(&mut raw, head.as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(PATIENCE, tokio::io::AsyncReadExt::read_to_string(&mut raw, &mut answer))
        .await
        .expect("answered and closed")
        .unwrap();
    let lower = answer.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 429"), "{answer}");
    assert!(lower.contains("retry-after: 1\r\n"), "{answer}");
    assert!(lower.contains("connection: close\r\n"), "{answer}");
    assert!(answer.contains(r#""error":"rate_limited""#), "{answer}");
    // Another client's budget is its own.
    assert_eq!(acquire("b-token", "{}").await.unwrap().status(), 201);
    assert_eq!(metrics.refusals("team-a", "rate"), 1);
    assert_eq!(
        (
            metrics.answers("team-a", 201),
            metrics.answers("team-a", 429),
            metrics.answers("team-b", 201)
        ),
        (1, 1, 1)
    );
}
