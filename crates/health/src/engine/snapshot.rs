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
            .and_then(|e| e.exit.clone());
        let entry = Entry {
            uid: record.uid.clone(),
            host: record.host.clone(),
            port: record.port,
            verdict,
            exit,
        };
        inner.entries.insert(record.key.clone(), entry);
    }

    /// Records an exit check's finding for a proxy that has a verdict. Returns the proxies
    /// whose status may change: none when the finding is the one recorded; else this one and
    /// every other at the old or the new address (they now share it with one fewer or more).
    pub(super) fn set_exit(&self, key: &Arc<ProxyKey>, seen: ExitSeen) -> Vec<Arc<ProxyKey>> {
        let mut inner = self.write();
        let Some(entry) = inner.entries.get_mut(key) else {
            return Vec::new();
        };
        let old = entry.exit.as_ref().and_then(ExitSeen::ip);
        let unchanged = match (&entry.exit, &seen) {
            (Some(ExitSeen::Address { ip, .. }), ExitSeen::Address { ip: new, .. }) => ip == new,
            (Some(ExitSeen::Unknown { why }), ExitSeen::Unknown { why: new }) => why == new,
            _ => false,
        };
        if unchanged {
            return Vec::new();
        }
        let new = seen.ip();
        entry.exit = Some(seen);
        let mut touched = vec![key.clone()];
        if let Some(ip) = old {
            touched.extend(inner.leave(ip, key));
        }
        if let Some(ip) = new {
            let at = inner.exits.entry(ip).or_default();
            touched.extend(at.iter().cloned());
            at.insert(key.clone());
        }
        touched
    }

    /// Forgets a proxy. Returns `None` when it had no entry; else the other proxies that shared
    /// its exit (they now share it with one fewer).
    pub(super) fn remove(&self, key: &ProxyKey) -> Option<Vec<Arc<ProxyKey>>> {
        let mut inner = self.write();
        let (key, entry) = inner.entries.remove_entry(key)?;
        Some(match entry.exit.and_then(|e| e.ip()) {
            Some(ip) => inner.leave(ip, &key),
            None => Vec::new(),
        })
    }
}

impl Inner {
    /// Takes `key` out of the proxies at `ip`; returns the others there.
    fn leave(&mut self, ip: IpAddr, key: &Arc<ProxyKey>) -> Vec<Arc<ProxyKey>> {
        let Some(at) = self.exits.get_mut(&ip) else {
            return Vec::new();
        };
        at.remove(key);
        let others: Vec<_> = at.iter().cloned().collect();
        if at.is_empty() {
            self.exits.remove(&ip);
        }
        others
    }
}
