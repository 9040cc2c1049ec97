//! The seam between Proxies and the discovery API (which knows no Kubernetes): the proxies it
//! lists and leases, from the operator's cache, Proxies being deleted left out.
//!
//! The directory follows the Proxy watch and the credential Secrets' watch change by change
//! ([`LiveDirectory`]): a status write (a health verdict, a latency) recomputes that one Proxy's
//! view, a Secret's change recomputes the Proxies that take their credentials from it, and only
//! a re-list reads a whole store again. Requests never build or sort anything.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwap;
use egress_api::{ConditionStatus, Mode, PoolRole, Proxy};
use egress_discovery::{EXIT_ASN_KEY, EXIT_COUNTRY_KEY, ExitInfo, Fleet, IndexedKeys, ProxyDirectory, ProxyInfo};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::exit_policy::ExitPolicy;
use crate::proxy::credentials::{CredentialCache, Lookup};
use crate::proxy_cache::ProxyCache;

/// A Proxy's id in the API: `<namespace>/<name>`.
fn id_of(proxy: &Proxy) -> String {
    format!("{}/{}", proxy.namespace().unwrap_or_default(), proxy.name_any())
}

/// A Proxy as the discovery API shows it, with the credentials it demands; `None` while it is
/// being deleted. One that asks for credentials the cache cannot give is shown unhealthy, so
/// it is never leased: a lease without them would be refused by the proxy. One whose Secret
/// does not name it is not offered at all (no lease candidate), whatever its last verdict; nor,
/// under [`ExitPolicy::Enforce`], one whose exit was found Shared, the operator's or Unexpected.
/// A verified exit's country and ASN are selectable as `exit.country` and `exit.asn`.
pub fn info(proxy: &Proxy, credentials: Lookup, exit_policy: ExitPolicy) -> Option<ProxyInfo> {
    if proxy.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let (credentials, usable, refused) = match credentials {
        Lookup::Found(c) => (Some(c), true, false),
        Lookup::NotNeeded => (None, true, false),
        Lookup::Missing => (None, false, false),
        Lookup::Refused(_) => (None, false, true),
    };
    let status = proxy.status.clone().unwrap_or_default();
    let (ip, port) = match proxy.spec.mode {
        Mode::External => proxy.spec.external_address().unwrap_or_default(),
        Mode::Managed => (status.ip.clone(), proxy.spec.port),
    };
    let verdict = crate::proxy::status::last_verdict(&status);
    let membership = proxy.pool();
    let role = membership.map(|m| m.role);
    let exit_condition = proxy.condition(egress_api::conditions::EXIT_VERIFIED);
    let exit_verified = exit_condition.is_some_and(|c| c.status == ConditionStatus::True);
    Some(ProxyInfo {
        id: id_of(proxy),
        ip,
        port: u16::try_from(port).unwrap_or(0),
        attributes: with_exit_keys(&proxy.spec.attributes, status.exit.as_deref().filter(|_| exit_verified)),
        phase: status.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
        healthy: usable && verdict.is_some_and(|v| v.healthy),
        latency_millis: status.latency_millis.unwrap_or(0),
        max_leases: proxy.spec.effective_max_leases(),
        credentials,
        offered: !refused && role.is_none_or(PoolRole::offered) && !crate::exit_policy::refused(proxy, exit_policy),
        exit: status.exit.as_ref().map(|e| ExitInfo {
            address: e.address.clone(),
            verification: exit_condition.map(|c| c.reason.clone()).unwrap_or_default(),
            country: e.country.clone(),
            asn: e.asn,
            organization: e.organization.clone(),
        }),
        pool_role: role.map(PoolRole::as_str),
        pool: membership.map(|m| m.pool.to_owned()),
    })
}

/// A Proxy's attributes with its verified exit's country and ASN under the keys that select
/// them (a Proxy's own `exit.` attribute names are refused by the CRD).
fn with_exit_keys(
    attributes: &BTreeMap<String, String>,
    verified: Option<&egress_api::ExitStatus>,
) -> BTreeMap<String, String> {
    let mut all = attributes.clone();
    if let Some(exit) = verified {
        if let Some(country) = &exit.country {
            all.insert(EXIT_COUNTRY_KEY.to_owned(), country.clone());
        }
        if let Some(asn) = exit.asn {
            all.insert(EXIT_ASN_KEY.to_owned(), asn.to_string());
        }
    }
    all
}

/// The fleet of every Proxy in `proxies`, built from nothing: what the live directory must
/// always equal.
pub fn built(
    proxies: &Store<Proxy>,
    credentials: &CredentialCache,
    keys: &IndexedKeys,
    exit_policy: ExitPolicy,
) -> Fleet {
    let mut fleet = Fleet::indexing(keys.clone());
    fleet.extend(
        proxies
            .state()
            .iter()
            .filter_map(|p| info(p, credentials.lookup(p), exit_policy)),
    );
    fleet
}

/// A credentials Secret, as (namespace, name).
type SecretKey = (String, String);

/// Which Proxies take their credentials from which Secret, so that a Secret's change reaches
/// exactly those.
#[derive(Default)]
struct SecretUsers {
    users: HashMap<SecretKey, BTreeSet<String>>,
    uses: HashMap<String, SecretKey>,
}

impl SecretUsers {
    /// Records that Proxy `id` uses `secret` (or none).
    fn set(&mut self, id: &str, secret: Option<SecretKey>) {
        if self.uses.get(id) == secret.as_ref() {
            return;
        }
        if let Some(old) = self.uses.remove(id)
            && let Some(ids) = self.users.get_mut(&old)
        {
            ids.remove(id);
            if ids.is_empty() {
                self.users.remove(&old);
            }
        }
        if let Some(secret) = secret {
            self.users.entry(secret.clone()).or_default().insert(id.to_owned());
            self.uses.insert(id.to_owned(), secret);
        }
    }

    fn of(&self, secret: &SecretKey) -> Vec<String> {
        self.users
            .get(secret)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// What only the writer touches: its working copy of the fleet, and the Secret index.
struct Writer {
    fleet: Fleet,
    users: SecretUsers,
}

/// The operator's Proxy cache as the discovery API's directory, kept up to date change by
/// change. Readers take the current snapshot without a lock; the watches' observers apply each
/// change to a working copy under the writer's lock and publish it when it changed.
pub struct LiveDirectory {
    current: ArcSwap<Fleet>,
    writer: Mutex<Writer>,
    proxies: Store<Proxy>,
    credentials: CredentialCache,
    /// The attribute keys whose values the fleet indexes.
    keys: IndexedKeys,
    /// Whether Proxies with an exit found wanting are offered.
    exit_policy: ExitPolicy,
    /// Fires when a new snapshot is published.
    changed: tokio::sync::watch::Sender<()>,
}

impl std::fmt::Debug for LiveDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveDirectory")
            .field("proxies", &self.current.load().len())
            .finish_non_exhaustive()
    }
}

impl LiveDirectory {
    /// A directory that follows both caches from now on, indexing the values of `keys`, offering
    /// Proxies as `exit_policy` says.
    pub fn following(
        cache: &ProxyCache,
        credentials: &CredentialCache,
        keys: IndexedKeys,
        exit_policy: ExitPolicy,
    ) -> Arc<Self> {
        let directory = Self::over(cache.store(), credentials.clone(), keys, exit_policy);
        let weak = Arc::downgrade(&directory);
        cache.observe(Arc::new(move |event| {
            if let Some(d) = Weak::upgrade(&weak) {
                d.on_proxy_event(event);
            }
        }));
        let weak = Arc::downgrade(&directory);
        credentials.observe(Arc::new(move |event| {
            if let Some(d) = Weak::upgrade(&weak) {
                d.on_secret_event(event);
            }
        }));
        // Built after the observers are in: a change in between is applied twice, which
        // changes nothing, rather than not at all.
        directory.rebuild();
        directory
    }

    /// A directory over the two stores, built once; its owner tells it of each event
    /// ([`Self::on_proxy_event`], [`Self::on_secret_event`]).
    pub fn over(
        proxies: Store<Proxy>,
        credentials: CredentialCache,
        keys: IndexedKeys,
        exit_policy: ExitPolicy,
    ) -> Arc<Self> {
        let directory = Arc::new(Self {
            current: ArcSwap::from_pointee(Fleet::indexing(keys.clone())),
            writer: Mutex::new(Writer {
                fleet: Fleet::indexing(keys.clone()),
                users: SecretUsers::default(),
            }),
            proxies,
            credentials,
            keys,
            exit_policy,
            changed: tokio::sync::watch::Sender::new(()),
        });
        directory.rebuild();
        directory
    }

    /// Applies a Proxy watch event the store already holds.
    pub fn on_proxy_event(&self, event: &watcher::Event<Proxy>) {
        match event {
            watcher::Event::Apply(proxy) => self.change(|w| self.apply(w, &id_of(proxy), Some(proxy))),
            watcher::Event::Delete(proxy) => self.change(|w| self.apply(w, &id_of(proxy), None)),
            // A re-list is complete: anything may have come or gone meanwhile.
            watcher::Event::InitDone => self.rebuild(),
            // The store takes a re-list's objects only once it is complete.
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    /// Applies a credentials Secret watch event the store already holds.
    pub fn on_secret_event(&self, event: &watcher::Event<Secret>) {
        let secret = match event {
            watcher::Event::Apply(s) | watcher::Event::Delete(s) => s,
            watcher::Event::InitDone => return self.rebuild(),
            watcher::Event::Init | watcher::Event::InitApply(_) => return,
        };
        let key = (secret.namespace().unwrap_or_default(), secret.name_any());
        self.change(|w| {
            let mut changed = false;
            for id in w.users.of(&key) {
                let proxy = self.stored(&id);
                changed |= self.apply(w, &id, proxy.as_deref());
            }
            changed
        });
    }

    /// The Proxy with API id `id` in the store.
    fn stored(&self, id: &str) -> Option<Arc<Proxy>> {
        let (namespace, name) = id.split_once('/')?;
        self.proxies.get(&ObjectRef::new(name).within(namespace))
    }

    /// Puts `proxy`'s view (or its absence) in the working copy. Whether the fleet changed.
    fn apply(&self, w: &mut Writer, id: &str, proxy: Option<&Proxy>) -> bool {
        w.users.set(id, proxy.and_then(CredentialCache::secret_of));
        match proxy.and_then(|p| info(p, self.credentials.lookup(p), self.exit_policy)) {
            Some(view) => w.fleet.upsert(view),
            None => w.fleet.remove(id),
        }
    }

    /// Runs `f` on the working copy and publishes it when `f` says it changed.
    fn change(&self, f: impl FnOnce(&mut Writer) -> bool) {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if f(&mut writer) {
            self.current.store(Arc::new(writer.fleet.clone()));
            self.changed.send_replace(());
        }
    }

    /// Builds the fleet and the Secret index from the stores.
    fn rebuild(&self) {
        self.change(|w| {
            let mut users = SecretUsers::default();
            for proxy in self.proxies.state() {
                users.set(&id_of(&proxy), CredentialCache::secret_of(&proxy));
            }
            w.users = users;
            let fleet = built(&self.proxies, &self.credentials, &self.keys, self.exit_policy);
            let changed = fleet != w.fleet;
            w.fleet = fleet;
            changed
        });
    }
}

impl ProxyDirectory for LiveDirectory {
    fn proxies(&self) -> Result<Arc<Fleet>, String> {
        Ok(self.current.load_full())
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        Some(self.changed.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_api::{Condition, ConditionStatus, Endpoint, Phase, ProxySpec, ProxyStatus};

    #[test]
    fn the_view_of_a_proxy() {
        let mut p = Proxy::new(
            "out",
            ProxySpec {
                mode: Mode::External,
                endpoint: Some(Endpoint {
                    host: "proxy.example".into(),
                    port: None,
                }),
                attributes: [("geo".to_string(), "eu".to_string())].into(),
                max_leases: Some(0),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("ns".into());
        p.status = Some(ProxyStatus {
            phase: Some(Phase::Ready),
            latency_millis: Some(42),
            conditions: vec![condition("Healthy", ConditionStatus::True, "ProbeSucceeded")],
            ..Default::default()
        });
        let v = info(&p, Lookup::NotNeeded, ExitPolicy::Observe).unwrap();
        assert_eq!(
            (
                v.id.as_str(),
                v.ip.as_str(),
                v.port,
                v.phase.as_str(),
                v.healthy,
                v.latency_millis,
                v.max_leases
            ),
            ("ns/out", "proxy.example", 3128, "Ready", true, 42, 0)
        );
        assert_eq!(v.attributes["geo"], "eu");
        // Credentials asked for and not to be had: listed, never leased.
        let v = info(&p, Lookup::Missing, ExitPolicy::Observe).unwrap();
        assert_eq!((v.healthy, v.credentials), (false, None));
        let found = egress_credentials::Credentials::new("u", "p").unwrap();
        let v = info(&p, Lookup::Found(found.clone()), ExitPolicy::Observe).unwrap();
        assert_eq!((v.healthy, v.credentials), (true, Some(found)));
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(info(&p, Lookup::NotNeeded, ExitPolicy::Observe), None);
    }

    fn condition(type_: &str, status: ConditionStatus, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status,
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            reason: reason.into(),
            message: String::new(),
        }
    }

    #[test]
    fn only_a_verified_exit_is_selectable_and_only_enforce_keeps_a_refused_one_from_leases() {
        use egress_api::{ExitStatus, conditions, reasons};
        let mut p = Proxy::new("out", ProxySpec::default());
        p.metadata.namespace = Some("ns".into());
        let with_exit = |p: &mut Proxy, status: ConditionStatus, reason: &str| {
            p.status = Some(ProxyStatus {
                phase: Some(Phase::Ready),
                exit: Some(Box::new(ExitStatus {
                    address: "203.0.113.7".into(),
                    observed_at: "2026-12-07T00:00:00Z".into(),
                    country: Some("DE".into()),
                    asn: Some(64500),
                    organization: Some("Example".into()),
                })),
                conditions: vec![condition(conditions::EXIT_VERIFIED, status, reason)],
                ..Default::default()
            });
        };
        with_exit(&mut p, ConditionStatus::True, reasons::EXIT_VERIFIED);
        let v = info(&p, Lookup::NotNeeded, ExitPolicy::Enforce).unwrap();
        assert_eq!(v.attributes[EXIT_COUNTRY_KEY], "DE");
        assert_eq!(v.attributes[EXIT_ASN_KEY], "64500");
        assert!(v.offered);
        // Shared: listed with its exit and why, never selectable by it; leased under observe only.
        with_exit(&mut p, ConditionStatus::False, reasons::EXIT_SHARED);
        for policy in [ExitPolicy::Observe, ExitPolicy::Enforce] {
            let v = info(&p, Lookup::NotNeeded, policy).unwrap();
            assert!(!v.attributes.contains_key(EXIT_COUNTRY_KEY), "{policy:?}");
            assert!(!v.attributes.contains_key(EXIT_ASN_KEY), "{policy:?}");
            let exit = v.exit.expect("the exit is listed");
            assert_eq!(
                (exit.verification.as_str(), exit.country.as_deref()),
                ("Shared", Some("DE"))
            );
            assert_eq!(v.offered, policy == ExitPolicy::Observe, "{policy:?}");
        }
        // Unknown (the echo failed) keeps it offered under either policy, still not selectable.
        with_exit(&mut p, ConditionStatus::Unknown, reasons::EXIT_UNKNOWN);
        let v = info(&p, Lookup::NotNeeded, ExitPolicy::Enforce).unwrap();
        assert!(v.offered && !v.attributes.contains_key(EXIT_COUNTRY_KEY));
    }

    #[test]
    fn a_proxy_is_in_a_pool_by_its_owner_not_by_its_attribute() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let mut p = Proxy::new(
            "eu-1",
            ProxySpec {
                attributes: [(egress_api::ATTRIBUTE_POOL.to_string(), "eu".to_string())].into(),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("ns".into());
        let v = info(&p, Lookup::NotNeeded, ExitPolicy::Observe).unwrap();
        assert_eq!(
            (v.pool, v.pool_role),
            (None, None),
            "the attribute alone makes no member"
        );
        p.metadata.labels = Some([(egress_api::LABEL_POOL.to_string(), "eu".to_string())].into());
        let owner = |name: &str| OwnerReference {
            api_version: egress_api::API_VERSION.into(),
            kind: "ProxyPool".into(),
            name: name.into(),
            uid: "uid-1".into(),
            controller: Some(true),
            ..Default::default()
        };
        p.metadata.owner_references = Some(vec![owner("other")]);
        assert_eq!(
            info(&p, Lookup::NotNeeded, ExitPolicy::Observe).unwrap().pool,
            None,
            "owned by another pool"
        );
        p.metadata.owner_references = Some(vec![owner("eu")]);
        let v = info(&p, Lookup::NotNeeded, ExitPolicy::Observe).unwrap();
        assert_eq!((v.pool.as_deref(), v.pool_role), (Some("eu"), Some("standby")));
    }
}
