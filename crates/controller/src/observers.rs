//! Code told of every watch event a cache applies, in the watch's own task, right after the
//! cache's store has taken it: a reader that keeps its own view of the cache (the discovery
//! directory) follows it change by change instead of reading the whole store again.

use std::sync::{Arc, RwLock};

use kube::runtime::watcher;

/// One observer: it must be quick (it holds up the watch) and must not panic.
pub type Observer<K> = Arc<dyn Fn(&watcher::Event<K>) + Send + Sync>;

/// The observers of one cache.
pub struct Observers<K>(Arc<RwLock<Vec<Observer<K>>>>);

impl<K> std::fmt::Debug for Observers<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.read().unwrap_or_else(|p| p.into_inner()).len();
        write!(f, "Observers({n})")
    }
}

impl<K> Clone for Observers<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K> Default for Observers<K> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<K> Observers<K> {
    /// Tells `observer` of every event from now on.
    pub fn add(&self, observer: Observer<K>) {
        self.0.write().unwrap_or_else(|p| p.into_inner()).push(observer);
    }

    /// Tells every observer of `event`.
    pub fn tell(&self, event: &watcher::Event<K>) {
        let observers = self.0.read().unwrap_or_else(|p| p.into_inner()).clone();
        for observer in observers {
            observer(event);
        }
    }
}
