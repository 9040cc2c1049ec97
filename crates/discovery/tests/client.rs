//! The typed client against the real server.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{Fixed, info, serve_on_loopback};
use egress_discovery::Api;
use egress_discovery::client::{AcquireRequest, Client, ClientError, ListFilter, ReportResult};
use egress_lease::{MemoryStore, SystemClock};
use tokio_util::sync::DropGuard;

async fn start() -> (String, DropGuard) {
    serve_on_loopback(Api {
        directory: Arc::new(Fixed::new(vec![
            info("ns/eu", true, 5, 1, &[("geo", "eu")]),
            info("ns/us", false, 5, 1, &[("geo", "us")]),
        ])),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::Tokens(Arc::new(egress_discovery::TokenSet::new(vec!["tok".into()]))),
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
    assert_eq!(eu.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["ns/eu"]);

    let lease = api
        .acquire(&AcquireRequest {
            target: Some("example.com".into()),
            ttl_seconds: Some(60),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (lease.proxy.id.as_str(), lease.ttl_seconds, lease.proxy.active_leases),
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
