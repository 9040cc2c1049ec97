//! The fleet as the routes read it: every proxy once, in the two orders they need (lease order,
//! (latency, id), for acquires; id order for the list), and in lease order again within each
//! index of an indexed attribute's value, as one immutable snapshot.
//!
//! A change costs what it touches, never the fleet's size: both orders are persistent maps
//! (`imbl::OrdMap`), so a copy shares everything but the path to the changed entry, and a
//! directory that follows its proxies change by change hands each reader a consistent snapshot
//! without ever sorting, and without a reader holding up a writer.

use std::collections::BTreeSet;
use std::sync::Arc;

use imbl::OrdMap;

use crate::proxy::ProxyInfo;

pub use egress_lease::POOL_KEY;
/// Indexed attribute keys unless told otherwise (`--lease-index-attributes`), beside `pool`.
pub const DEFAULT_INDEXED_KEYS: [&str; 2] = ["geo", "tier"];

/// The keys that select on a proxy's verified exit (its country and its autonomous system),
/// always indexed, as `pool` is. Proxies never carry them as attributes of their own: a Proxy's
/// `exit.` attribute names are refused, and these are filled from its verified exit.
pub const EXIT_KEYS: [&str; 2] = [EXIT_COUNTRY_KEY, EXIT_ASN_KEY];
/// The verified exit's country (ISO 3166-1 alpha-2).
pub const EXIT_COUNTRY_KEY: &str = "exit.country";
/// The verified exit's autonomous system number, in decimal.
pub const EXIT_ASN_KEY: &str = "exit.asn";

/// The attribute keys whose values a fleet indexes: `pool` and the [`EXIT_KEYS`], and those the
/// operator is told to index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedKeys(Arc<BTreeSet<String>>);

impl IndexedKeys {
    /// `keys`, `pool` and the [`EXIT_KEYS`].
    pub fn new<S: Into<String>>(keys: impl IntoIterator<Item = S>) -> Self {
        let mut set: BTreeSet<String> = keys.into_iter().map(Into::into).collect();
        set.insert(POOL_KEY.to_owned());
        set.extend(EXIT_KEYS.map(str::to_owned));
        Self(Arc::new(set))
    }

    pub fn contains(&self, key: &str) -> bool {
        self.0.contains(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

impl Default for IndexedKeys {
    /// [`DEFAULT_INDEXED_KEYS`] and `pool`.
    fn default() -> Self {
        Self::new(DEFAULT_INDEXED_KEYS)
    }
}

/// Proxies in lease order, keyed by (latency, id).
type LeaseOrder = OrdMap<(i64, Arc<str>), Arc<ProxyInfo>>;

/// One snapshot of the fleet. Cloning is cheap (the maps are shared until one is changed).
#[derive(Clone, Default)]
pub struct Fleet {
    by_id: OrdMap<Arc<str>, Arc<ProxyInfo>>,
    /// The same entries keyed by (latency, id): the order leases are chosen in.
    by_lease_order: LeaseOrder,
    keys: IndexedKeys,
    /// For each value of an indexed key ([`egress_lease::index_name`], `key=value`), its
    /// proxies in lease order; an index without proxies is dropped.
    by_index: OrdMap<Arc<str>, LeaseOrder>,
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
    /// A fleet of `proxies` indexing the default keys; of two with one id, the later stays.
    fn from_iter<I: IntoIterator<Item = ProxyInfo>>(proxies: I) -> Self {
        let mut fleet = Self::default();
        fleet.extend(proxies);
        fleet
    }
}

impl Extend<ProxyInfo> for Fleet {
    /// Puts each of `proxies` in; of two with one id, the later stays.
    fn extend<I: IntoIterator<Item = ProxyInfo>>(&mut self, proxies: I) {
        for p in proxies {
            self.upsert(p);
        }
    }
}

impl Fleet {
    /// An empty fleet indexing the values of `keys`.
    pub fn indexing(keys: IndexedKeys) -> Self {
        Self {
            keys,
            ..Self::default()
        }
    }

    /// The keys whose values it indexes.
    pub fn indexed_keys(&self) -> &IndexedKeys {
        &self.keys
    }

    /// The proxies of the index `name` (`key=value`) in lease order; none for an index it does
    /// not hold.
    pub fn in_index<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a ProxyInfo> + use<'a> {
        self.by_index
            .get(name)
            .into_iter()
            .flat_map(|order| order.values().map(AsRef::as_ref))
    }

    /// How many proxies the index `name` holds.
    pub fn index_len(&self, name: &str) -> usize {
        self.by_index.get(name).map_or(0, OrdMap::len)
    }

    /// How many indexes it holds (values of indexed keys that some proxy has).
    pub fn index_count(&self) -> usize {
        self.by_index.len()
    }

    /// The indexes `p` is in: one per indexed key among its attributes.
    pub fn index_names_of(&self, p: &ProxyInfo) -> Vec<String> {
        p.attributes
            .iter()
            .filter(|(k, _)| self.keys.contains(k))
            .map(|(k, v)| egress_lease::index_name(k, v))
            .collect()
    }

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
        for name in self.index_names_of(&proxy) {
            self.by_index
                .entry(Arc::from(name))
                .or_default()
                .insert((latency, id.clone()), proxy.clone());
        }
        self.by_lease_order.insert((latency, id.clone()), proxy.clone());
        self.by_id.insert(id, proxy);
        true
    }

    /// Removes the proxy with this id. `false` when there was none.
    pub fn remove(&mut self, id: &str) -> bool {
        let Some((id, gone)) = self.by_id.remove_with_key(id) else {
            return false;
        };
        let key = (gone.latency_millis, id);
        for name in self.index_names_of(&gone) {
            if let Some(order) = self.by_index.get_mut(name.as_str()) {
                order.remove(&key);
                if order.is_empty() {
                    self.by_index.remove(name.as_str());
                }
            }
        }
        self.by_lease_order.remove(&key);
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
            exit: None,
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

    fn with(mut p: ProxyInfo, key: &str, value: &str) -> ProxyInfo {
        p.attributes.insert(key.into(), value.into());
        p
    }

    #[test]
    fn each_indexed_value_holds_its_proxies_in_lease_order() {
        let mut fleet = Fleet::indexing(IndexedKeys::new(["geo"]));
        for p in [
            with(with(proxy("ns/a", 9), "geo", "eu"), "pool", "x"),
            with(proxy("ns/b", 5), "geo", "eu"),
            with(with(proxy("ns/c", 1), "geo", "us"), "purpose", "crawl"),
        ] {
            fleet.upsert(p);
        }
        assert_eq!(ids(fleet.in_index("geo=eu")), ["ns/b", "ns/a"]);
        assert_eq!(ids(fleet.in_index("pool=x")), ["ns/a"], "pool is always indexed");
        assert_eq!(
            ids(fleet.in_index("purpose=crawl")),
            Vec::<&str>::new(),
            "not an indexed key"
        );
        assert_eq!(fleet.index_count(), 3);
        // A proxy whose value changes moves between indexes; an empty index goes.
        fleet.upsert(with(proxy("ns/c", 1), "geo", "eu"));
        assert_eq!(ids(fleet.in_index("geo=eu")), ["ns/c", "ns/b", "ns/a"]);
        assert_eq!(fleet.index_len("geo=us"), 0);
        fleet.remove("ns/a");
        assert_eq!((fleet.index_len("geo=eu"), fleet.index_len("pool=x")), (2, 0));
        assert_eq!(fleet.index_count(), 1);
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
