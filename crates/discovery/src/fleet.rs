//! The fleet as the routes read it: every proxy once, in the two orders they need (lease order,
//! (latency, id), for acquires; id order for the list), as one immutable snapshot.
//!
//! A change costs what it touches, never the fleet's size: both orders are persistent maps
//! (`imbl::OrdMap`), so a copy shares everything but the path to the changed entry, and a
//! directory that follows its proxies change by change hands each reader a consistent snapshot
//! without ever sorting, and without a reader holding up a writer.

use std::sync::Arc;

use imbl::OrdMap;

use crate::proxy::ProxyInfo;

/// One snapshot of the fleet. Cloning is cheap (the maps are shared until one is changed).
#[derive(Clone, Default)]
pub struct Fleet {
    by_id: OrdMap<Arc<str>, Arc<ProxyInfo>>,
    /// The same entries keyed by (latency, id): the order leases are chosen in.
    by_lease_order: OrdMap<(i64, Arc<str>), Arc<ProxyInfo>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fleet({} proxies)", self.len())
    }
}

impl PartialEq for Fleet {
    /// The same proxies with the same contents (both orders follow from them).
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.in_id_order().eq(other.in_id_order())
    }
}

impl Eq for Fleet {}

impl FromIterator<ProxyInfo> for Fleet {
    /// A fleet of `proxies`; of two with one id, the later stays.
    fn from_iter<I: IntoIterator<Item = ProxyInfo>>(proxies: I) -> Self {
        let mut fleet = Self::default();
        for p in proxies {
            fleet.upsert(p);
        }
        fleet
    }
}

impl Fleet {
    /// How many proxies it holds.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The proxy with this id.
    pub fn get(&self, id: &str) -> Option<&ProxyInfo> {
        self.by_id.get(id).map(AsRef::as_ref)
    }

    /// Every proxy in ascending (latency, id) order: the order leases are chosen in.
    pub fn in_lease_order(&self) -> impl Iterator<Item = &ProxyInfo> + '_ {
        self.by_lease_order.values().map(AsRef::as_ref)
    }

    /// Every proxy in ascending id order: the order the list answers in.
    pub fn in_id_order(&self) -> impl Iterator<Item = &ProxyInfo> + '_ {
        self.by_id.values().map(AsRef::as_ref)
    }

    /// Puts `proxy` in place of the one with its id, if any. `false` when that one was the
    /// same already (nothing changed).
    pub fn upsert(&mut self, proxy: ProxyInfo) -> bool {
        if self.get(&proxy.id) == Some(&proxy) {
            return false;
        }
        self.remove(&proxy.id);
        let id: Arc<str> = Arc::from(proxy.id.as_str());
        let latency = proxy.latency_millis;
        let proxy = Arc::new(proxy);
        self.by_lease_order.insert((latency, id.clone()), proxy.clone());
        self.by_id.insert(id, proxy);
        true
    }

    /// Removes the proxy with this id. `false` when there was none.
    pub fn remove(&mut self, id: &str) -> bool {
        let Some((id, gone)) = self.by_id.remove_with_key(id) else {
            return false;
        };
        self.by_lease_order.remove(&(gone.latency_millis, id));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(id: &str, latency: i64) -> ProxyInfo {
        ProxyInfo {
            id: id.into(),
            ip: "10.0.0.1".into(),
            port: 3128,
            attributes: Default::default(),
            phase: "Ready".into(),
            healthy: true,
            latency_millis: latency,
            max_leases: 1,
            credentials: None,
            offered: true,
            pool_role: None,
            pool: None,
        }
    }

    fn ids<'a>(it: impl Iterator<Item = &'a ProxyInfo>) -> Vec<&'a str> {
        it.map(|p| p.id.as_str()).collect()
    }

    #[test]
    fn both_orders_follow_every_change() {
        let mut fleet: Fleet = [proxy("ns/b", 5), proxy("ns/a", 9), proxy("ns/c", 5)]
            .into_iter()
            .collect();
        assert_eq!(ids(fleet.in_lease_order()), ["ns/b", "ns/c", "ns/a"]);
        assert_eq!(ids(fleet.in_id_order()), ["ns/a", "ns/b", "ns/c"]);
        // A latency change moves the proxy in lease order only.
        assert!(fleet.upsert(proxy("ns/a", 1)));
        assert_eq!(ids(fleet.in_lease_order()), ["ns/a", "ns/b", "ns/c"]);
        assert_eq!(fleet.len(), 3);
        assert!(fleet.remove("ns/b"));
        assert!(!fleet.remove("ns/b"));
        assert_eq!(ids(fleet.in_lease_order()), ["ns/a", "ns/c"]);
        assert_eq!(ids(fleet.in_id_order()), ["ns/a", "ns/c"]);
        assert_eq!(fleet.get("ns/a").map(|p| p.latency_millis), Some(1));
    }

    #[test]
    fn an_unchanged_proxy_changes_nothing_and_a_snapshot_never_moves() {
        let mut fleet: Fleet = [proxy("ns/a", 1)].into_iter().collect();
        let before = fleet.clone();
        assert!(!fleet.upsert(proxy("ns/a", 1)));
        let mut unhealthy = proxy("ns/a", 1);
        unhealthy.healthy = false;
        assert!(fleet.upsert(unhealthy));
        assert_ne!(fleet, before);
        assert!(
            before.get("ns/a").is_some_and(|p| p.healthy),
            "the old snapshot is untouched"
        );
    }
}
