//! Client scopes: which proxies a client may see and lease. A client's scope, from the clients
//! config file, lists namespaces, pools or both; a proxy is in it when it is in one of the
//! namespaces (every namespace the operator serves when none are listed) and, when pools are
//! listed, a member of one of them. A client without a scope (the client `default`, every
//! caller under `--discovery-auth=none`) has no filter at all: its requests take the same path
//! as before scopes existed.
//!
//! Pool membership is the proxy's owner (a ProxyPool that made it, [`ProxyInfo::pool`]), never
//! the `pool` attribute: any Proxy author may write that attribute, and a scope that trusted it
//! would let them into another team's scope. Pool names are matched within the scope's
//! namespaces, as a ProxyPool is named within its namespace.
//!
//! Every decision here is a pure function of the scope and the proxy (or pool), with no
//! allocation: binary searches over at most [`MAX_NAMESPACES`] and [`MAX_POOLS`] sorted names.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::auth::is_dns_label;
use crate::proxy::ProxyInfo;

/// The most namespaces a scope lists.
pub const MAX_NAMESPACES: usize = 32;
/// The most pools a scope lists.
pub const MAX_POOLS: usize = 64;
/// The longest pool name (a DNS-1123 subdomain).
const MAX_POOL_NAME: usize = 253;

/// What one client may see and lease. `None` for a list: not narrowed by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientScope {
    /// Sorted, without duplicates.
    namespaces: Option<Box<[String]>>,
    /// Sorted, without duplicates.
    pools: Option<Box<[String]>>,
}

impl ClientScope {
    /// The scope of these lists (`None`: not given).
    ///
    /// # Errors
    /// Why the lists cannot make a scope: neither given, one empty, too long, a name that is
    /// not a namespace or pool name, a name listed twice. Quotes only the names.
    pub fn new(namespaces: Option<Vec<String>>, pools: Option<Vec<String>>) -> Result<Self, String> {
        if namespaces.is_none() && pools.is_none() {
            // Written to narrow, and narrowing nothing: more likely a slip than a wish.
            return Err("scope lists neither namespaces nor pools (leave scope out for every proxy)".to_owned());
        }
        let namespaces = namespaces
            .map(|list| checked("namespaces", list, MAX_NAMESPACES, is_dns_label, NAMESPACE_RULE))
            .transpose()?;
        let pools = pools
            .map(|list| checked("pools", list, MAX_POOLS, is_pool_name, POOL_RULE))
            .transpose()?;
        Ok(Self { namespaces, pools })
    }

    /// Whether `proxy` is in the scope: in a listed namespace (any, unlisted) and, when pools
    /// are listed, a member of one of them.
    pub fn allows(&self, proxy: &ProxyInfo) -> bool {
        self.allows_namespace(namespace_of(&proxy.id))
            && self
                .pools
                .as_deref()
                .is_none_or(|pools| proxy.pool.as_deref().is_some_and(|p| listed(pools, p)))
    }

    /// Whether the pool `key` (`<namespace>/<name>`) is in the scope: its members would be.
    pub fn allows_pool(&self, key: &str) -> bool {
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        self.allows_namespace(namespace) && self.pools.as_deref().is_none_or(|pools| listed(pools, name))
    }

    fn allows_namespace(&self, namespace: &str) -> bool {
        self.namespaces.as_deref().is_none_or(|list| listed(list, namespace))
    }
}

/// The namespace of a proxy id (`<namespace>/<name>`).
fn namespace_of(id: &str) -> &str {
    id.split_once('/').map_or("", |(namespace, _)| namespace)
}

fn listed(sorted: &[String], name: &str) -> bool {
    sorted.binary_search_by(|n| n.as_str().cmp(name)).is_ok()
}

const NAMESPACE_RULE: &str = "a namespace name (a DNS label: 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit)";
const POOL_RULE: &str = "a pool name (1-253 lowercase letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit)";

/// A ProxyPool's name: a DNS-1123 subdomain.
fn is_pool_name(name: &str) -> bool {
    name.len() <= MAX_POOL_NAME && name.split('.').all(is_dns_label)
}

/// `list` (the scope's `field`) sorted, once it is found to be 1 to `max` names that `valid`
/// accepts, none twice.
fn checked(
    field: &str,
    mut list: Vec<String>,
    max: usize,
    valid: fn(&str) -> bool,
    rule: &str,
) -> Result<Box<[String]>, String> {
    if list.is_empty() {
        return Err(format!(
            "scope.{field} is empty (leave it out for every one; an empty list would match nothing)"
        ));
    }
    if list.len() > max {
        return Err(format!(
            "scope.{field} lists {} names; at most {max} may be",
            list.len()
        ));
    }
    if let Some(bad) = list.iter().find(|n| !valid(n)) {
        return Err(format!("scope.{field}: {bad:?} is not {rule}"));
    }
    list.sort_unstable();
    if let Some(twice) = list.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("scope.{field} lists {:?} twice", twice[0]));
    }
    Ok(list.into_boxed_slice())
}

/// Every client's scope, by client name; a client not in it is not narrowed.
pub type ScopeTable = BTreeMap<String, Arc<ClientScope>>;

/// The scopes in force, shared by the API and whoever follows the clients config file. Readers
/// never wait (and never allocate) for it: a request of a client without a scope costs one
/// lock-free load and a lookup.
#[derive(Clone, Default)]
pub struct Scopes(Arc<ArcSwap<ScopeTable>>);

impl std::fmt::Debug for Scopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scopes({} clients scoped)", self.0.load().len())
    }
}

impl Scopes {
    /// Puts `table` in force, whole.
    pub fn set(&self, table: ScopeTable) {
        self.0.store(Arc::new(table));
    }

    /// The scope of `client`; `None`: it sees every proxy.
    pub fn of(&self, client: &str) -> Option<Arc<ClientScope>> {
        let table = self.0.load();
        if table.is_empty() {
            return None;
        }
        table.get(client).cloned()
    }

    /// The scopes in force.
    pub fn table(&self) -> Arc<ScopeTable> {
        self.0.load_full()
    }
}

#[cfg(test)]
mod tests;
