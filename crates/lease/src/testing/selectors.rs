//! The suite's cases for selectors whose every key is indexed ([`crate::Scope::Indexed`]): a
//! shared store answers them from its index of the view, and must decide as the candidates do.

use std::sync::Arc;

use super::{P, proxy, release, report, req};
use crate::{
    Candidate, Grant, LeaseRequest, LeaseStore, ManualClock, NoMatch, ReportResult, Scope, ViewEntry, index_name,
};

/// The index names of `selector`'s pairs.
pub fn index_names(selector: &[(&str, &str)]) -> Vec<String> {
    selector.iter().map(|(k, v)| index_name(k, v)).collect()
}

/// `fleet` as the view a leader publishes: every proxy offered, in the indexes of its
/// attributes.
pub fn view_of(fleet: &[P]) -> Vec<ViewEntry> {
    fleet
        .iter()
        .map(|p| ViewEntry {
            id: p.id.clone(),
            healthy: p.healthy,
            latency_millis: p.latency_millis,
            max_leases: p.max_leases,
            offered: true,
            indexed: p.attributes.iter().map(|(k, v)| index_name(k, v)).collect(),
            pool: p.pool().map(str::to_owned),
        })
        .collect()
}

/// Acquires among the proxies of `fleet` matching `selector`, as the API does for a selector
/// whose every key is indexed: `fleet` published as the view, the request scoped to the
/// selector's indexes, and the matching proxies as the candidates (what a store without an
/// index reads). An empty selector is a plain acquire.
pub async fn acquire_selected(
    s: &dyn LeaseStore,
    fleet: &[P],
    selector: &[(&str, &str)],
    r: &LeaseRequest,
) -> Result<Grant, NoMatch> {
    if selector.is_empty() {
        return super::acquire(s, fleet, r).await;
    }
    s.publish_view(&view_of(fleet)).await.expect("the store answers");
    let mut candidates: Vec<Candidate<'_>> = fleet.iter().filter(|p| p.matches(selector)).map(P::candidate).collect();
    candidates.sort_by(|a, b| a.order(b));
    let scoped = LeaseRequest {
        scope: Scope::Indexed(index_names(selector)),
        ..r.clone()
    };
    s.acquire(&mut candidates.into_iter(), &scoped)
        .await
        .expect("the store answers")
}

fn refused(considered: usize, at_capacity: usize, in_cooldown: usize, unhealthy: usize) -> NoMatch {
    NoMatch {
        considered,
        at_capacity,
        in_cooldown,
        unhealthy,
    }
}

pub async fn a_selector_chooses_within_its_indexes_only(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [
        proxy("ns/a", 10, 1).with("pool", "x").with("geo", "eu"),
        proxy("ns/b", 5, 1).with("pool", "x").with("geo", "us"),
        proxy("ns/c", 1, 1).with("pool", "y").with("geo", "eu"),
        proxy("ns/d", 0, 1),
    ];
    let fleet = &fleet;
    let pick = |selector: &'static [(&'static str, &'static str)]| async move {
        acquire_selected(s, fleet, selector, &req(None)).await
    };
    let g = pick(&[("pool", "x"), ("geo", "eu")]).await.unwrap();
    assert_eq!(g.proxy_id, "ns/a", "both indexes");
    assert_eq!(pick(&[("pool", "x")]).await.unwrap().proxy_id, "ns/b");
    assert_eq!(pick(&[("geo", "eu")]).await.unwrap().proxy_id, "ns/c");
    assert_eq!(pick(&[("pool", "x")]).await, Err(refused(2, 2, 0, 0)), "both full");
    assert_eq!(
        pick(&[("pool", "z")]).await,
        Err(NoMatch::default()),
        "an index of nobody"
    );
    assert_eq!(pick(&[("pool", "y"), ("geo", "us")]).await, Err(NoMatch::default()));
    release(s, &g.lease_id).await;
    assert_eq!(pick(&[("geo", "eu")]).await.unwrap().proxy_id, "ns/a", "freed");
}

pub async fn a_selector_passes_over_cooling_and_unhealthy_proxies_and_counts_them(
    s: Arc<dyn LeaseStore>,
    _c: ManualClock,
) {
    let s = s.as_ref();
    let mut fleet = vec![
        proxy("ns/a", 1, 3).with("pool", "x"),
        proxy("ns/b", 2, 2).with("pool", "x"),
        proxy("ns/c", 3, 2).with("pool", "x"),
        proxy("ns/d", 0, 2).with("pool", "y"),
    ];
    let x = [("pool", "x")];
    let on_a = acquire_selected(s, &fleet, &x, &req(Some("shop.example")))
        .await
        .unwrap();
    assert_eq!(on_a.proxy_id, "ns/a");
    report(s, &on_a.lease_id, ReportResult::Banned, None).await.unwrap();
    let g = acquire_selected(s, &fleet, &x, &req(Some("shop.example")))
        .await
        .unwrap();
    assert_eq!(g.proxy_id, "ns/b", "a cools down for the shop");
    fleet[1].healthy = false;
    let g = acquire_selected(s, &fleet, &x, &req(Some("shop.example")))
        .await
        .unwrap();
    assert_eq!(g.proxy_id, "ns/c", "b unhealthy");
    assert_eq!(
        acquire_selected(s, &fleet, &x, &req(None)).await.unwrap().proxy_id,
        "ns/a"
    );
    assert_eq!(
        acquire_selected(s, &fleet, &x, &req(Some("shop.example")))
            .await
            .unwrap()
            .proxy_id,
        "ns/c"
    );
    // a cooling (2 of 3), b unhealthy, c full.
    assert_eq!(
        acquire_selected(s, &fleet, &x, &req(Some("shop.example"))).await,
        Err(refused(3, 1, 1, 1))
    );
    assert_eq!(
        acquire_selected(s, &fleet, &x, &req(None)).await.unwrap().proxy_id,
        "ns/a",
        "the cooldown is the shop's only"
    );
}
