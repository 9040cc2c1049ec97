//! What the engine found, as the reconciler reads it: per proxy its verdict and its last exit
//! check, each about one Proxy (UID) at one address; and which proxies share an exit.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use super::{ProxyKey, ProxyView, Record};
use crate::state::Verdict;

/// What the last exit check of a proxy found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitSeen {
    /// The echo named `ip`, in every check since `since`.
    Address { ip: IpAddr, since: SystemTime },
    /// The check failed; `why` is a short reason (never the echo's answer).
    Unknown { why: String },
}

impl ExitSeen {
    /// The address, when known.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Self::Address { ip, .. } => Some(*ip),
            Self::Unknown { .. } => None,
        }
    }
}

/// The current verdicts and exits, by proxy. Clones share them.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(Arc<RwLock<Inner>>);

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Arc<ProxyKey>, Entry>,
    /// The proxies whose last exit check named each address.
    exits: HashMap<IpAddr, HashSet<Arc<ProxyKey>>>,
}

/// A verdict, the last exit, and what they are about: the Proxy's UID and the address probed.
#[derive(Debug, Clone)]
struct Entry {
    uid: Arc<str>,
    host: Arc<str>,
    port: u16,
    verdict: Verdict,
    exit: Option<ExitSeen>,
    /// How many proxies shared its exit when it was last told about it.
    told_sharing: usize,
}

impl Entry {
    fn is_for(&self, view: &ProxyView) -> bool {
        *self.uid == *view.uid && *self.host == *view.host && self.port == view.port
    }
}

impl Snapshot {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The verdict for a proxy, if it has one.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Verdict> {
        // NB: the key is built for the lookup; verdicts are read once per reconcile, not per probe.
        self.read()
            .entries
            .get(&ProxyKey::new(namespace, name))
            .map(|e| e.verdict)
    }

    /// The verdict for this Proxy at this address: `None` when the verdict is about an earlier
    /// Proxy of the same name or another address (until the engine catches up with the change).
    pub fn get_for(&self, view: &ProxyView) -> Option<Verdict> {
        self.read()
            .entries
            .get(&view.key)
            .filter(|e| e.is_for(view))
            .map(|e| e.verdict)
    }

    /// The last exit check of this Proxy at this address, as [`Snapshot::get_for`] reads verdicts.
    pub fn exit_for(&self, view: &ProxyView) -> Option<ExitSeen> {
        self.read()
            .entries
            .get(&view.key)
            .filter(|e| e.is_for(view))
            .and_then(|e| e.exit.clone())
    }

    /// How many proxies' last exit check named `ip`.
    pub fn sharing(&self, ip: IpAddr) -> usize {
        self.read().exits.get(&ip).map_or(0, HashSet::len)
    }

    /// The proxies whose last exit check named `ip`.
    pub fn at(&self, ip: IpAddr) -> Vec<ProxyKey> {
        self.read()
            .exits
            .get(&ip)
            .map(|keys| keys.iter().map(|k| ProxyKey::clone(k)).collect())
            .unwrap_or_default()
    }

    /// Every proxy whose last exit check named an address.
    pub fn with_exit(&self) -> Vec<ProxyKey> {
        self.read()
            .exits
            .values()
            .flatten()
            .map(|k| ProxyKey::clone(k))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records a verdict; the exit found for the same Proxy at the same address stays.
    pub(super) fn set(&self, record: &Record, verdict: Verdict) {
        let mut inner = self.write();
        let same = |e: &Entry| *e.uid == *record.uid && *e.host == *record.host && e.port == record.port;
        let exit = inner
            .entries
            .get(&record.key)
            .filter(|e| same(e))
            .map(|e| (e.exit.clone(), e.told_sharing));
        let (exit, told_sharing) = exit.unwrap_or_default();
        let entry = Entry {
            uid: record.uid.clone(),
            host: record.host.clone(),
            port: record.port,
            verdict,
            exit,
            told_sharing,
        };
        inner.entries.insert(record.key.clone(), entry);
    }

    /// Records an exit check's finding for a proxy that has a verdict. Returns the proxies
    /// whose status may change: this one when its finding or the count sharing its exit
    /// changed since it was last told; and another proxy only when this one makes it shared or
    /// leaves it alone at its address. Others sharing an exit hear of a new count at their own
    /// next check, so N proxies at one exit cost O(N) notices, not O(N²).
    pub(super) fn set_exit(&self, key: &Arc<ProxyKey>, seen: ExitSeen) -> Vec<Arc<ProxyKey>> {
        let mut guard = self.write();
        let inner = &mut *guard;
        let Some(entry) = inner.entries.get(key) else {
            return Vec::new();
        };
        let old = entry.exit.as_ref().and_then(ExitSeen::ip);
        let unchanged = match (&entry.exit, &seen) {
            (Some(ExitSeen::Address { ip, .. }), ExitSeen::Address { ip: new, .. }) => ip == new,
            (Some(ExitSeen::Unknown { why }), ExitSeen::Unknown { why: new }) => why == new,
            _ => false,
        };
        let mut touched = Vec::new();
        if unchanged {
            if entry.told_sharing != sharing_of(&inner.exits, entry.exit.as_ref()) {
                touched.push(key.clone());
            }
        } else {
            touched.push(key.clone());
            if let Some(ip) = old {
                touched.extend(inner.leave(ip, key));
            }
            if let Some(ip) = seen.ip() {
                touched.extend(inner.join(ip, key));
            }
            if let Some(e) = inner.entries.get_mut(key) {
                e.exit = Some(seen);
            }
        }
        for other in &touched {
            if let Some(e) = inner.entries.get_mut(other) {
                e.told_sharing = sharing_of(&inner.exits, e.exit.as_ref());
            }
        }
        touched
    }

    /// Forgets a proxy. Returns `None` when it had no entry; else the proxy it leaves alone at
    /// its exit, if any (no longer shared).
    pub(super) fn remove(&self, key: &ProxyKey) -> Option<Vec<Arc<ProxyKey>>> {
        let mut guard = self.write();
        let inner = &mut *guard;
        let (key, entry) = inner.entries.remove_entry(key)?;
        let alone = match entry.exit.and_then(|e| e.ip()) {
            Some(ip) => inner.leave(ip, &key),
            None => Vec::new(),
        };
        for other in &alone {
            if let Some(e) = inner.entries.get_mut(other) {
                e.told_sharing = sharing_of(&inner.exits, e.exit.as_ref());
            }
        }
        Some(alone)
    }
}

impl Inner {
    /// Takes `key` out of the proxies at `ip`; returns the one left there, if it is alone now
    /// (no longer shared).
    fn leave(&mut self, ip: IpAddr, key: &Arc<ProxyKey>) -> Vec<Arc<ProxyKey>> {
        let Some(at) = self.exits.get_mut(&ip) else {
            return Vec::new();
        };
        at.remove(key);
        let alone: Vec<_> = if at.len() == 1 {
            at.iter().cloned().collect()
        } else {
            Vec::new()
        };
        if at.is_empty() {
            self.exits.remove(&ip);
        }
        alone
    }

    /// Puts `key` among the proxies at `ip`; returns the one that was there alone, if any (it
    /// is shared now).
    fn join(&mut self, ip: IpAddr, key: &Arc<ProxyKey>) -> Vec<Arc<ProxyKey>> {
        let at = self.exits.entry(ip).or_default();
        let alone: Vec<_> = if at.len() == 1 {
            at.iter().cloned().collect()
        } else {
            Vec::new()
        };
        at.insert(key.clone());
        alone
    }
}

/// How many proxies share the exit `seen` names (0 when it names none).
fn sharing_of(exits: &HashMap<IpAddr, HashSet<Arc<ProxyKey>>>, seen: Option<&ExitSeen>) -> usize {
    seen.and_then(ExitSeen::ip)
        .map_or(0, |ip| exits.get(&ip).map_or(0, HashSet::len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot with a verdict for each of `names` and no exit yet.
    fn with(names: &[&str]) -> (Snapshot, Vec<Arc<ProxyKey>>) {
        let s = Snapshot::default();
        let keys: Vec<_> = names.iter().map(|n| Arc::new(ProxyKey::new("ns", n))).collect();
        for key in &keys {
            let entry = Entry {
                uid: "uid".into(),
                host: "10.0.0.1".into(),
                port: 3128,
                verdict: Verdict {
                    healthy: true,
                    latency: std::time::Duration::ZERO,
                    auth_refused: false,
                },
                exit: None,
                told_sharing: 0,
            };
            s.write().entries.insert(key.clone(), entry);
        }
        (s, keys)
    }

    fn names(keys: Vec<Arc<ProxyKey>>) -> Vec<String> {
        let mut names: Vec<String> = keys.iter().map(|k| k.name.clone()).collect();
        names.sort();
        names
    }

    fn at(ip: &str) -> ExitSeen {
        ExitSeen::Address {
            ip: ip.parse().unwrap(),
            since: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn proxies_at_one_exit_are_told_in_a_notice_each_not_one_per_pair() {
        let (s, k) = with(&["a", "b", "c"]);
        let one = "203.0.113.1";
        assert_eq!(names(s.set_exit(&k[0], at(one))), ["a"]);
        assert_eq!(names(s.set_exit(&k[1], at(one))), ["a", "b"], "a is shared now");
        assert_eq!(names(s.set_exit(&k[2], at(one))), ["c"], "a and b were shared already");
        // Their next checks find the same exit: a and b hear of the new count; c knows it.
        assert_eq!(names(s.set_exit(&k[0], at(one))), ["a"]);
        assert_eq!(names(s.set_exit(&k[1], at(one))), ["b"]);
        assert!(s.set_exit(&k[2], at(one)).is_empty());
        assert!(s.set_exit(&k[0], at(one)).is_empty(), "told once per count");
        // c leaves: a and b still share. b joins c: a is alone, c is shared.
        assert_eq!(names(s.set_exit(&k[2], at("203.0.113.2"))), ["c"]);
        assert_eq!(names(s.set_exit(&k[1], at("203.0.113.2"))), ["a", "b", "c"]);
        assert_eq!(s.sharing(one.parse().unwrap()), 1);
        // c gone: b is alone, and told so once.
        assert_eq!(names(s.remove(&k[2]).unwrap()), ["b"]);
        assert!(s.set_exit(&k[1], at("203.0.113.2")).is_empty());
        assert_eq!(s.with_exit().len(), 2);
    }
}
