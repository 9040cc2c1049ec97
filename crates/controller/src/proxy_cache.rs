//! The Proxy cache every replica keeps. The phase gauge reads it on every replica (as
//! controller-runtime's cache runs whether or not the replica leads), and the leader's controller
//! is fed from the same watch, so a leader keeps one copy of the Proxies, not two.

use std::sync::{Arc, Mutex};

use egress_api::Proxy;
use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Changed Proxies buffered per subscriber; a full buffer holds the watch back (nothing is lost).
const BUFFER: usize = 1024;

type Subscribers = Arc<Mutex<Vec<mpsc::Sender<Proxy>>>>;

/// A reader of the cache, and the subscription point for the controller.
#[derive(Clone)]
pub struct ProxyCache {
    store: Store<Proxy>,
    subscribers: Subscribers,
    generation: Arc<std::sync::atomic::AtomicU64>,
    /// Fires with every watch event the cache applies.
    changed: Arc<tokio::sync::watch::Sender<()>>,
}

impl std::fmt::Debug for ProxyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyCache")
            .field("proxies", &self.store.state().len())
            .finish_non_exhaustive()
    }
}

impl ProxyCache {
    /// The cache's contents.
    pub fn store(&self) -> Store<Proxy> {
        self.store.clone()
    }

    /// Changes with every watch event the cache applies (readers skip work on an unchanged cache).
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A signal that fires whenever the cache applies a watch event (a reader that must see a
    /// change at once, rather than on its own schedule).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Every Proxy now in the cache, then every Proxy the watch changes from here on.
    pub fn subscribe(&self) -> impl futures::Stream<Item = Result<Proxy, watcher::Error>> + Send + 'static {
        let (tx, rx) = mpsc::channel(BUFFER);
        // Registered before the snapshot is taken: a change in between arrives twice, which the
        // controller's queue folds into one reconcile.
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner()).push(tx);
        let now: Vec<Proxy> = self.store.state().iter().map(|p| p.as_ref().clone()).collect();
        futures::stream::iter(now)
            .chain(tokio_stream::wrappers::ReceiverStream::new(rx))
            .map(Ok)
    }
}

/// The cache and the future that keeps it (run it on every replica until `shutdown`).
/// `namespace` restricts it as `--proxy-namespace` does.
pub fn proxy_cache(
    client: kube::Client,
    namespace: Option<&str>,
    shutdown: CancellationToken,
) -> (ProxyCache, impl Future<Output = ()> + Send + 'static) {
    let api: Api<Proxy> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let (store, writer) = reflector::store();
    let subscribers: Subscribers = Arc::default();
    let generation = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let changed = Arc::new(tokio::sync::watch::Sender::new(()));
    let cache = ProxyCache {
        store,
        subscribers: subscribers.clone(),
        generation: generation.clone(),
        changed: changed.clone(),
    };
    let run = async move {
        let changes = watcher(api, watcher::Config::default())
            .default_backoff()
            // NB: managedFields and kubectl's last-applied copy are most of a Proxy's size and
            // nothing here reads them; dropping them keeps a large fleet within the manager's
            // memory. (Writes are merge patches computed from this copy, which never touch them.)
            .modify(|p| {
                p.metadata.managed_fields = None;
                if let Some(a) = p.metadata.annotations.as_mut() {
                    a.remove("kubectl.kubernetes.io/last-applied-configuration");
                }
            })
            .reflect(writer)
            .inspect(move |_| {
                generation.fetch_add(1, std::sync::atomic::Ordering::Release);
                changed.send_replace(());
            })
            .applied_objects();
        let mut changes = std::pin::pin!(changes.take_until(shutdown.cancelled_owned()));
        while let Some(change) = changes.next().await {
            match change {
                Ok(proxy) => {
                    let senders: Vec<_> = subscribers.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    for tx in senders {
                        if tx.send(proxy.clone()).await.is_err() {
                            subscribers
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .retain(|s| !s.same_channel(&tx));
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "watching Proxies failed; retrying with backoff"),
            }
        }
    };
    (cache, run)
}
