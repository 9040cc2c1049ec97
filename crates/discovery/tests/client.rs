//! The typed client against the real server.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{Fixed, info, serve_on_loopback};
use egress_discovery::DiscoveryApi;
use egress_discovery::client::{AcquireRequest, Client, ClientError, ListFilter, ReportResult};
use egress_lease::{MemoryStore, SystemClock};
use tokio_util::sync::DropGuard;

async fn start() -> (String, DropGuard) {
    serve_on_loopback(DiscoveryApi {
        directory: Arc::new(Fixed::new(vec![
            info("ns/eu", true, 5, 1, &[("geo", "eu")]),
            info("ns/us", false, 5, 1, &[("geo", "us")]),
        ])),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::Tokens(Arc::new(egress_discovery::TokenSet::new(vec!["tok".into()]))),
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::default(),
    })
    .await
}

#[tokio::test]
async fn a_crawler_lists_borrows_reports_and_gives_back() {
    let (url, _stop) = start().await;
    let api = Client::new(&url, Some("tok".into())).unwrap();
    let all = api.list(&ListFilter::default()).await.unwrap();
    assert_eq!(all.len(), 2);
    let eu = api
        .list(&ListFilter {
            healthy: Some(true),
            attributes: BTreeMap::from([("geo".to_string(), "eu".to_string())]),
        })
        .await
        .unwrap();
    assert_eq!(eu.iter().map(|p| &*p.id).collect::<Vec<_>>(), ["ns/eu"]);

    let lease = api
        .acquire(&AcquireRequest {
            target: Some("example.com".into()),
            ttl_seconds: Some(60),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (&*lease.proxy.id, lease.ttl_seconds, lease.proxy.active_leases),
        ("ns/eu", 60, 1)
    );
    let Err(ClientError::NoMatch {
        considered,
        at_capacity,
        unhealthy,
        ..
    }) = api.acquire(&AcquireRequest::default()).await
    else {
        panic!("the only healthy proxy is taken")
    };
    assert_eq!((considered, at_capacity, unhealthy), (2, 1, 1));
    api.report(&lease.lease_id, ReportResult::RateLimited, None)
        .await
        .unwrap();
    api.release(&lease.lease_id).await.unwrap();
    api.release(&lease.lease_id).await.unwrap();
    // Free again, but cooling down for example.com.
    assert!(matches!(
        api.acquire(&AcquireRequest {
            target: Some("example.com".into()),
            ..Default::default()
        })
        .await,
        Err(ClientError::NoMatch { in_cooldown: 1, .. })
    ));
    assert!(api.acquire(&AcquireRequest::default()).await.is_ok());
}

#[tokio::test]
async fn errors_come_back_typed() {
    let (url, _stop) = start().await;
    let api = Client::new(&url, Some("tok".into())).unwrap();
    assert!(matches!(
        Client::new(&url, Some("wrong".into()))
            .unwrap()
            .list(&ListFilter::default())
            .await,
        Err(ClientError::Unauthorized(_))
    ));
    assert!(matches!(
        api.report("NOSUCHLEASE", ReportResult::Ok, None).await,
        Err(ClientError::UnknownLease(m)) if m == "no such lease"
    ));
    assert!(matches!(
        api.acquire(&AcquireRequest {
            ttl_seconds: Some(7200),
            ..Default::default()
        })
        .await,
        Err(ClientError::InvalidTtl(_))
    ));
    let nowhere = Client::with_timeout("http://127.0.0.1:1", None, Duration::from_secs(2)).unwrap();
    assert!(matches!(
        nowhere.list(&ListFilter::default()).await,
        Err(ClientError::Transport(_))
    ));
}

#[tokio::test]
async fn a_lease_hands_over_the_credentials_and_debug_hides_them() {
    let c = egress_credentials::Credentials::generate();
    let (url, _stop) = serve_on_loopback(DiscoveryApi {
        directory: Arc::new(Fixed::new(vec![
            egress_discovery::ProxyInfo {
                credentials: Some(c.clone()),
                offered: true,
                pool_role: None,
                pool: None,
                ..info("ns/locked", true, 5, 1, &[("geo", "eu")])
            },
            info("ns/open", true, 6, 1, &[("geo", "us")]),
        ])),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::None,
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::default(),
    })
    .await;
    let api = Client::new(&url, None).unwrap();
    let eu = |geo: &str| AcquireRequest {
        selector: BTreeMap::from([("geo".to_string(), geo.to_string())]),
        ..Default::default()
    };
    let locked = api.acquire(&eu("eu")).await.unwrap();
    assert_eq!(locked.proxy.username.as_deref(), Some(c.username()));
    assert_eq!(locked.proxy.password.as_deref(), Some(c.password()));
    assert_eq!(locked.proxy.proxy_url(), c.proxy_url("10.0.0.1", 3128));
    let shown = format!("{locked:?}");
    assert!(!shown.contains(c.password()), "{shown}");
    assert!(shown.contains(c.username()));
    let open = api.acquire(&eu("us")).await.unwrap();
    assert_eq!((open.proxy.username.as_ref(), open.proxy.url.as_ref()), (None, None));
    assert_eq!(open.proxy.proxy_url(), "http://10.0.0.1:3128");
}

/// A server that answers every request `429 rate_limited` with `Retry-After: <retry_after>`
/// until it has refused `refusals` of them, then lists no proxy. Counts the requests.
async fn refusing(refusals: usize, retry_after: u64) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    let app = axum::Router::new().fallback(move || {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < refusals {
                (
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", retry_after.to_string())],
                    r#"{"error":"rate_limited","message":"over budget"}"#,
                )
                    .into_response()
            } else {
                r#"{"count":0,"proxies":[]}"#.into_response()
            }
        }
    });
    use axum::response::IntoResponse as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

#[tokio::test]
async fn a_429_is_sent_again_after_retry_after_at_most_three_times() {
    use std::sync::atomic::Ordering;
    // Two refusals, then an answer: the call succeeds on its third request.
    let (url, seen) = refusing(2, 1).await;
    let client = Client::new(&url, Some("tok".into())).unwrap();
    assert_eq!(client.list(&ListFilter::default()).await, Ok(Vec::new()));
    assert_eq!(seen.load(Ordering::SeqCst), 3);
    // Refused for good: the first request and three more, then the refusal.
    let (url, seen) = refusing(usize::MAX, 1).await;
    let client = Client::new(&url, Some("tok".into())).unwrap();
    match client.list(&ListFilter::default()).await {
        Err(ClientError::RateLimited { retry_after, message }) => {
            assert_eq!((retry_after, message.as_str()), (Duration::from_secs(1), "over budget"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(seen.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_retry_after_beyond_the_call_s_budget_is_not_waited_for() {
    use std::sync::atomic::Ordering;
    let (url, seen) = refusing(usize::MAX, 30).await;
    let client = Client::with_timeout(&url, Some("tok".into()), Duration::from_secs(10)).unwrap();
    match client.list(&ListFilter::default()).await {
        Err(ClientError::RateLimited { retry_after, .. }) => assert_eq!(retry_after, Duration::from_secs(30)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "waiting 30 s would pass the 10 s budget"
    );
}

/// The keys of a JSON object, sorted.
fn fields(object: &serde_json::Value) -> Vec<String> {
    let mut keys: Vec<String> = object.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn the_server_s_answers_round_trip_through_the_client_s_types_whole() {
    // A proxy with every optional field: attributes, a pool role, credentials, an exit.
    let c = egress_credentials::Credentials::generate();
    let (url, _stop) = serve_on_loopback(DiscoveryApi {
        directory: Arc::new(Fixed::new(vec![egress_discovery::ProxyInfo {
            credentials: Some(c.clone()),
            offered: true,
            pool_role: Some("active"),
            pool: Some("eu-pool".into()),
            exit: Some(egress_discovery::ExitInfo {
                address: "203.0.113.7".into(),
                verification: "Verified".into(),
                country: Some("DE".into()),
                asn: Some(64500),
                organization: Some("Example Networks".into()),
            }),
            ..info("ns/full", true, 7, 3, &[("geo", "eu"), ("tier", "gold")])
        }])),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::None,
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::default(),
    })
    .await;
    let http = reqwest::Client::new();
    let lease: serde_json::Value = http
        .post(format!("{url}/v1/leases"))
        .body(r#"{"target": "example.com"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let list: serde_json::Value = http
        .get(format!("{url}/v1/proxies"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    // Each answer carries every field the API has, so that none can be lost unseen below.
    let doc = egress_discovery::openapi::document();
    let documented = |schema: &str| fields(&doc["components"]["schemas"][schema]["properties"]);
    assert_eq!(fields(&lease["proxy"]), documented("LeasedProxy"), "{lease}");
    assert_eq!(fields(&list["proxies"][0]), documented("Proxy"), "{list}");

    // Through the client's types and back: the same JSON, nothing dropped or changed.
    let read: egress_discovery::client::Lease = serde_json::from_value(lease.clone()).unwrap();
    assert_eq!(serde_json::to_value(&read).unwrap(), lease);
    assert_eq!(read.proxy.pool_role.as_deref(), Some("active"));
    assert_eq!(read.proxy.password.as_deref(), Some(c.password()));
    let read: egress_discovery::wire::ProxyList<'static> = serde_json::from_value(list.clone()).unwrap();
    assert_eq!(serde_json::to_value(&read).unwrap(), list);

    // And the client's calls return the same values.
    let api = Client::new(&url, None).unwrap();
    let listed = api.list(&ListFilter::default()).await.unwrap();
    assert_eq!(listed, read.proxies);
    assert_eq!(listed[0].pool_role.as_deref(), Some("active"));
    assert_eq!(listed[0].attributes.len(), 2);
}

#[tokio::test]
async fn whoami_names_the_tokens_client_and_refuses_a_stranger() {
    let (url, _stop) = start().await;
    let known = Client::new(&url, Some("tok".into())).unwrap();
    assert_eq!(known.whoami().await.unwrap(), "default");
    let stranger = known.for_token("not-a-token");
    assert!(matches!(stranger.whoami().await, Err(ClientError::Unauthorized(_))));
    assert_eq!(
        known.whoami().await.unwrap(),
        "default",
        "for_token left the original alone"
    );
}
