//! Which proxies an acquire reads, and whether a shared store may answer it from an index of
//! its own: an empty selector is the installation (every offered proxy); a selector whose every
//! key is indexed (`pool`, and `--lease-index-attributes`) reads the smallest of its values'
//! indexes; any other selector scans the fleet in lease order, at most [`MAX_SCAN`] proxies.
//! Pure functions of the selector and the fleet snapshot.

use std::collections::BTreeMap;

use egress_lease::{Scope, index_name};

use crate::fleet::Fleet;
use crate::proxy::ProxyInfo;

/// Proxies a selector on an attribute no index serves reads, at most, in lease order: the
/// matching proxies beyond them are not considered (nor counted in a refusal). Index the key
/// (`--lease-index-attributes`) for a fleet that large.
pub const MAX_SCAN: usize = 10_000;

/// Indexes a fleet may hold for a shared store to be told of them: a fleet with more (an
/// indexed key whose values are nearly all distinct) publishes none, and its selectors are
/// answered from the candidates this replica reads in its own indexes.
pub const MAX_PUBLISHED_INDEXES: usize = 4096;

/// A selector: every key's values must all be the proxy's attribute.
pub(crate) type Selector = BTreeMap<String, Vec<String>>;

/// What an acquire reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Every proxy in lease order (an empty selector).
    All,
    /// The proxies of the index `read` (the smallest of `names`, the selector's indexes).
    Index { read: String, names: Vec<String> },
    /// The first [`MAX_SCAN`] proxies in lease order.
    Scan,
}

/// How `fleet` serves `selector`.
pub(crate) fn plan(selector: &Selector, fleet: &Fleet) -> Plan {
    if selector.is_empty() {
        return Plan::All;
    }
    if !selector.keys().all(|k| fleet.indexed_keys().contains(k)) {
        return Plan::Scan;
    }
    let names: Vec<String> = selector
        .iter()
        .flat_map(|(k, values)| values.iter().map(move |v| index_name(k, v)))
        .collect();
    let read = names
        .iter()
        .min_by_key(|n| fleet.index_len(n))
        .cloned()
        .unwrap_or_default();
    Plan::Index { read, names }
}

/// The proxies `plan` reads in `fleet`, in lease order.
pub(crate) fn read<'a>(plan: &Plan, fleet: &'a Fleet) -> Box<dyn Iterator<Item = &'a ProxyInfo> + Send + 'a> {
    match plan {
        Plan::All => Box::new(fleet.in_lease_order()),
        Plan::Index { read, .. } => Box::new(fleet.in_index(read)),
        Plan::Scan => Box::new(fleet.in_lease_order().take(MAX_SCAN)),
    }
}

/// Which proxies a shared store may choose from. Its indexes know no client scopes, so a scoped
/// caller's candidates are always the listed ones; nor do they know a fleet's indexes beyond
/// [`MAX_PUBLISHED_INDEXES`].
pub(crate) fn store_scope(plan: &Plan, scoped: bool, fleet: &Fleet) -> Scope {
    match plan {
        _ if scoped => Scope::Listed,
        Plan::All => Scope::Installation,
        Plan::Index { names, .. } if fleet.index_count() <= MAX_PUBLISHED_INDEXES => Scope::Indexed(names.clone()),
        Plan::Index { .. } | Plan::Scan => Scope::Listed,
    }
}

/// The indexes a shared store is told `p` is in (none beyond [`MAX_PUBLISHED_INDEXES`]).
pub(crate) fn published_indexes(fleet: &Fleet, p: &ProxyInfo) -> Vec<String> {
    if fleet.index_count() > MAX_PUBLISHED_INDEXES {
        return Vec::new();
    }
    fleet.index_names_of(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::IndexedKeys;

    fn proxy(id: &str, attrs: &[(&str, &str)]) -> ProxyInfo {
        ProxyInfo {
            id: id.into(),
            ip: "10.0.0.1".into(),
            port: 3128,
            attributes: attrs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            phase: "Ready".into(),
            healthy: true,
            latency_millis: 1,
            max_leases: 1,
            credentials: None,
            offered: true,
            pool_role: None,
            pool: None,
            exit: None,
        }
    }

    fn selector(pairs: &[(&str, &str)]) -> Selector {
        let mut s = Selector::new();
        for (k, v) in pairs {
            s.entry((*k).into()).or_default().push((*v).into());
        }
        s
    }

    #[test]
    fn each_selector_is_read_from_its_smallest_index_or_scanned() {
        let mut fleet = Fleet::indexing(IndexedKeys::new(["geo"]));
        fleet.extend([
            proxy("ns/a", &[("geo", "eu"), ("pool", "x")]),
            proxy("ns/b", &[("geo", "eu"), ("purpose", "crawl")]),
            proxy("ns/c", &[("geo", "eu")]),
        ]);
        assert_eq!(plan(&selector(&[]), &fleet), Plan::All);
        assert_eq!(
            plan(&selector(&[("geo", "eu"), ("pool", "x")]), &fleet),
            Plan::Index {
                read: "pool=x".into(),
                names: vec!["geo=eu".into(), "pool=x".into()]
            },
            "the smaller index is read"
        );
        assert_eq!(
            plan(&selector(&[("geo", "eu"), ("purpose", "crawl")]), &fleet),
            Plan::Scan
        );
        let unknown = plan(&selector(&[("geo", "mars")]), &fleet);
        assert_eq!(read(&unknown, &fleet).count(), 0, "an index nobody is in");
        assert_eq!(read(&plan(&selector(&[("geo", "eu")]), &fleet), &fleet).count(), 3);
    }

    #[test]
    fn a_store_is_told_an_index_only_for_an_unscoped_caller_of_a_publishable_fleet() {
        let mut fleet = Fleet::default();
        fleet.upsert(proxy("ns/a", &[("geo", "eu")]));
        let geo = plan(&selector(&[("geo", "eu")]), &fleet);
        assert_eq!(store_scope(&geo, false, &fleet), Scope::Indexed(vec!["geo=eu".into()]));
        assert_eq!(
            store_scope(&geo, true, &fleet),
            Scope::Listed,
            "the index knows no scopes"
        );
        assert_eq!(store_scope(&Plan::All, false, &fleet), Scope::Installation);
        assert_eq!(store_scope(&Plan::All, true, &fleet), Scope::Listed);
        assert_eq!(store_scope(&Plan::Scan, false, &fleet), Scope::Listed);
        // One value per proxy: more indexes than a store is told of.
        fleet.extend((0..=MAX_PUBLISHED_INDEXES).map(|i| proxy(&format!("ns/u{i}"), &[("tier", &i.to_string())])));
        assert_eq!(store_scope(&geo, false, &fleet), Scope::Listed);
        assert_eq!(
            published_indexes(&fleet, fleet.get("ns/a").unwrap()),
            Vec::<String>::new()
        );
    }
}
