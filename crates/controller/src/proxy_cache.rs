//! The Proxy cache every replica keeps. The phase gauge reads it on every replica (as
//! controller-runtime's cache runs whether or not the replica leads), and the leader's controller
//! is fed from the same watch, so a leader keeps one copy of the Proxies, not two.

use std::sync::{Arc, Mutex};

use egress_api::Proxy;
use egress_api::served::{self, Namespaces};
use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::observers::{Observer, Observers};

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
    observers: Observers<Proxy>,
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

    /// Tells `observer` of every watch event the cache applies from now on, once the store
    /// holds it.
    pub fn observe(&self, observer: Observer<Proxy>) {
        self.observers.add(observer);
    }

    /// Every Proxy now in the cache, then every Proxy the watch changes from here on.
    pub fn subscribe(&self) -> impl futures::Stream<Item = Result<Proxy, watcher::Error>> + Send + 'static {
        let (tx, rx) = mpsc::channel(BUFFER);
        // Registered before the snapshot is taken: a change in between arrives twice, which the
        // controller's queue folds into one reconcile. Nothing passed on before is missing from
        // the snapshot: `pass_on` hands out only what the store already holds (a list's objects
        // once the whole list is in, not one by one as the list is read).
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner()).push(tx);
        let now: Vec<Proxy> = self.store.state().iter().map(|p| p.as_ref().clone()).collect();
        futures::stream::iter(now)
            .chain(tokio_stream::wrappers::ReceiverStream::new(rx))
            .map(Ok)
    }
}

/// The cache and the future that keeps it (run it on every replica until `shutdown`).
/// It holds the Proxies of `namespaces` (`--proxy-namespace`).
pub fn proxy_cache(
    client: kube::Client,
    namespaces: &Namespaces,
    shutdown: CancellationToken,
) -> (ProxyCache, impl Future<Output = ()> + Send + 'static) {
    let namespaces = namespaces.clone();
    let (store, writer) = reflector::store();
    let subscribers: Subscribers = Arc::default();
    let reader = store.clone();
    let generation = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let changed = Arc::new(tokio::sync::watch::Sender::new(()));
    let observers = Observers::default();
    let cache = ProxyCache {
        store,
        subscribers: subscribers.clone(),
        generation: generation.clone(),
        changed: changed.clone(),
        observers: observers.clone(),
    };
    let run = async move {
        let changes = served::watch(client, &namespaces, watcher::Config::default(), trim)
            .reflect(writer)
            .inspect(move |event| {
                generation.fetch_add(1, std::sync::atomic::Ordering::Release);
                if let Ok(event) = event {
                    observers.tell(event);
                }
                changed.send_replace(());
            });
        let mut changes = std::pin::pin!(changes.take_until(shutdown.cancelled_owned()));
        while let Some(change) = changes.next().await {
            match change {
                Ok(event) => pass_on(&event, &reader, &subscribers).await,
                Err(e) => tracing::warn!(error = %e, "watching Proxies failed; retrying with backoff"),
            }
        }
    };
    (cache, run)
}

/// Hands the Proxies a watch event applied (the reflector has put it in `store` already) to
/// every subscriber. A list's objects go out together once the list is complete, from the
/// store: while it is read they are not in the store yet, so a subscriber arriving in the
/// middle would miss the ones passed on before it and find none of them in its snapshot.
async fn pass_on(event: &watcher::Event<Proxy>, store: &Store<Proxy>, subscribers: &Subscribers) {
    let proxies: Vec<Proxy> = match event {
        watcher::Event::Apply(proxy) => vec![proxy.clone()],
        watcher::Event::InitDone => store.state().iter().map(|p| p.as_ref().clone()).collect(),
        watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::Delete(_) => return,
    };
    let senders: Vec<_> = subscribers.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for tx in senders {
        for proxy in &proxies {
            if tx.send(proxy.clone()).await.is_err() {
                subscribers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|s| !s.same_channel(&tx));
                break;
            }
        }
    }
}

/// Drops what nothing here reads from a Proxy as it arrives: managedFields and kubectl's
/// last-applied copy are most of its size, and dropping them keeps a large fleet within the
/// manager's memory. (Writes are merge patches computed from this copy, which never touch them.)
fn trim(proxy: &mut Proxy) {
    proxy.metadata.managed_fields = None;
    if let Some(a) = proxy.metadata.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(name: &str) -> Proxy {
        let mut p = Proxy::new(name, egress_api::ProxySpec::default());
        p.metadata.namespace = Some("ns".into());
        p
    }

    /// A cache fed by hand: each event is applied to the store, as the reflector does, then
    /// passed on.
    struct Fed {
        cache: ProxyCache,
        writer: reflector::store::Writer<Proxy>,
    }

    impl Fed {
        fn new() -> Self {
            let (store, writer) = reflector::store();
            let cache = ProxyCache {
                store,
                subscribers: Arc::default(),
                generation: Arc::default(),
                changed: Arc::new(tokio::sync::watch::Sender::new(())),
                observers: Observers::default(),
            };
            Self { cache, writer }
        }

        async fn feed(&mut self, event: watcher::Event<Proxy>) {
            self.writer.apply_watcher_event(&event);
            pass_on(&event, &self.cache.store, &self.cache.subscribers).await;
        }

        /// The names a subscription got, once no more can come.
        async fn names(&self, subscription: impl futures::Stream<Item = Result<Proxy, watcher::Error>>) -> Vec<String> {
            self.cache.subscribers.lock().unwrap().clear();
            let mut names: Vec<String> = subscription
                .map(|p| p.expect("a proxy").metadata.name.unwrap_or_default())
                .collect()
                .await;
            names.sort();
            names.dedup();
            names
        }
    }

    #[tokio::test]
    async fn a_subscriber_that_arrives_while_the_first_list_is_read_gets_every_proxy() {
        let mut fed = Fed::new();
        fed.feed(watcher::Event::Init).await;
        fed.feed(watcher::Event::InitApply(proxy("a"))).await;
        let early = fed.cache.subscribe();
        fed.feed(watcher::Event::InitApply(proxy("b"))).await;
        fed.feed(watcher::Event::InitDone).await;
        let late = fed.cache.subscribe();
        fed.feed(watcher::Event::Apply(proxy("c"))).await;
        assert_eq!(fed.names(early).await, ["a", "b", "c"]);
        assert_eq!(fed.names(late).await, ["a", "b", "c"]);
    }

    #[tokio::test]
    async fn a_subscriber_that_arrives_while_a_list_is_read_again_gets_every_proxy() {
        let mut fed = Fed::new();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(proxy("a")),
            watcher::Event::InitDone,
            // A re-list (after 410 Gone): `a` went meanwhile, `d` came.
            watcher::Event::Init,
            watcher::Event::InitApply(proxy("d")),
        ] {
            fed.feed(event).await;
        }
        let during = fed.cache.subscribe();
        fed.feed(watcher::Event::InitApply(proxy("e"))).await;
        fed.feed(watcher::Event::InitDone).await;
        // `a` was in the snapshot the store still held; the controller finds it gone and lets be.
        assert_eq!(fed.names(during).await, ["a", "d", "e"]);
    }
}
