//! Lease requests the API refused, counted for the pools that asked to know, for the pool
//! autoscaler (docs/pools.md#autoscale). Demand that found no proxy does not show in
//! utilisation (a pool scaled to zero has no capacity to use), so the API counts, for the last
//! minute, the refusals of requests that asked for a watched pool.
//!
//! A pool is watched by its controller ([`Refusals::watch_pool`]) with its name and its
//! members' attributes; a refused request counts for it when its selector names the pool and
//! asks for nothing else its members lack ([`concerns`]). What clients send never adds an
//! entry: counts exist only for watched pools (at most [`MAX_POOLS`]), sixty one-second
//! counters each, so no client can crowd a pool out or grow the memory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How far back counts reach.
pub const HORIZON: Duration = Duration::from_secs(BUCKETS as u64);
/// One counter per second of [`HORIZON`].
const BUCKETS: usize = 60;
/// Pools watched at once; one more is not watched (and a warning says so).
pub const MAX_POOLS: usize = 4096;

/// A selector as the request sent it, or a pool's attributes.
pub type Selector = BTreeMap<String, String>;

/// Whether a refused request's `selector` asked for the pool `name` whose members carry
/// `attributes`: it names the pool under `attribute`, and every other pair it asks for is one
/// the members have. A selector no member could ever match does not count.
pub fn concerns(attribute: &str, name: &str, attributes: &Selector, selector: &Selector) -> bool {
    selector.get(attribute).map(String::as_str) == Some(name)
        && selector
            .iter()
            .all(|(k, v)| k == attribute || attributes.get(k) == Some(v))
}

/// The refusals of the last [`HORIZON`] for each watched pool.
#[derive(Debug)]
pub struct Refusals {
    attribute: String,
    epoch: Instant,
    inner: Mutex<Inner>,
    notice: watch::Sender<()>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Watched pools by name (the value a selector names); pools of one name in several
    /// namespaces share the entry's list.
    by_name: HashMap<String, Vec<Watched>>,
    watched: usize,
    /// Keys of the pools refused since the last [`Refusals::take_refused`].
    refused: BTreeSet<String>,
}

#[derive(Debug)]
struct Watched {
    key: String,
    attributes: Selector,
    counts: Counts,
}

/// Refusals per second, in a ring: `buckets[s % BUCKETS]` counts second `s` for the seconds
/// `last - BUCKETS + 1 ..= last`.
#[derive(Debug)]
struct Counts {
    buckets: [u32; BUCKETS],
    /// The second of the latest refusal.
    last: u64,
}

impl Counts {
    fn new() -> Self {
        Self {
            buckets: [0; BUCKETS],
            last: 0,
        }
    }

    fn add(&mut self, second: u64) {
        if second > self.last {
            // The seconds in between had no refusal; their buckets held seconds a minute old.
            for s in (self.last + 1..=second).rev().take(BUCKETS) {
                self.buckets[slot(s)] = 0;
            }
            self.last = second;
        }
        // A second before `last` (a clock read before another thread's) counts as `last`.
        let bucket = &mut self.buckets[slot(self.last)];
        *bucket = bucket.saturating_add(1);
    }

    /// Refusals in the seconds `from ..= now`, no further back than [`HORIZON`] (from `now`,
    /// or from `last` when a refusal came in after `now` was read).
    fn since(&self, from: u64, now: u64) -> u64 {
        let window = BUCKETS as u64 - 1;
        let oldest = from
            .max(now.saturating_sub(window))
            .max(self.last.saturating_sub(window));
        (oldest..=self.last.min(now))
            .map(|s| u64::from(self.buckets[slot(s)]))
            .sum()
    }
}

fn slot(second: u64) -> usize {
    usize::try_from(second % BUCKETS as u64).unwrap_or_default()
}

impl Refusals {
    /// Counts refusals of selectors that name a pool under `attribute`.
    pub fn new(attribute: impl Into<String>) -> Self {
        Self {
            attribute: attribute.into(),
            epoch: Instant::now(),
            inner: Mutex::default(),
            notice: watch::Sender::new(()),
        }
    }

    /// Starts (or goes on) counting the refusals for the pool `key` (`namespace/name`), named
    /// `name` in selectors, whose members carry `attributes`. Its counts are kept across calls.
    pub fn watch_pool(&self, key: &str, name: &str, attributes: &Selector) {
        let mut inner = self.lock();
        if let Some(w) = inner
            .by_name
            .get_mut(name)
            .and_then(|list| list.iter_mut().find(|w| w.key == key))
        {
            w.attributes.clone_from(attributes);
            return;
        }
        if inner.watched >= MAX_POOLS {
            tracing::warn!(
                pool = key,
                "{MAX_POOLS} pools already watched for refused leases; not this one"
            );
            return;
        }
        inner.watched += 1;
        inner.by_name.entry(name.to_owned()).or_default().push(Watched {
            key: key.to_owned(),
            attributes: attributes.clone(),
            counts: Counts::new(),
        });
    }

    /// Stops counting for the pool `key`.
    pub fn forget_pool(&self, key: &str) {
        let mut inner = self.lock();
        let mut found = false;
        inner.by_name.retain(|_, list| {
            let before = list.len();
            list.retain(|w| w.key != key);
            found |= list.len() != before;
            !list.is_empty()
        });
        if found {
            inner.watched -= 1;
        }
        inner.refused.remove(key);
    }

    /// Notes that a request with `selector` was refused (`409 no_match`).
    pub fn record(&self, selector: &Selector) {
        self.record_at(selector, Instant::now(), |_| true);
    }

    /// As [`Refusals::record`], counting only for the watched pools whose key `counts` accepts
    /// (a scoped client's refusal counts for the pools in its scope only).
    pub fn record_where(&self, selector: &Selector, counts: impl Fn(&str) -> bool) {
        self.record_at(selector, Instant::now(), counts);
    }

    /// How many refusals for the pool `key` came after `since`, counted in whole seconds:
    /// those of the seconds after the one `since` falls in, no further back than [`HORIZON`].
    /// So none made before `since` is counted (a few just after it may not be: the autoscaler
    /// asks for those since it last grew a pool, and must not count the ones that made it).
    pub fn count_since(&self, key: &str, since: Instant) -> u64 {
        self.count_at(key, since, Instant::now())
    }

    /// The keys of the pools refused since the last call.
    pub fn take_refused(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().refused).into_iter().collect()
    }

    /// Fires (coalesced) when a watched pool was refused; [`Refusals::take_refused`] says
    /// which.
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.notice.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_secs()
    }

    fn record_at(&self, selector: &Selector, now: Instant, counts: impl Fn(&str) -> bool) {
        let Some(name) = selector.get(&self.attribute) else {
            return;
        };
        let second = self.second(now);
        let counted = {
            let mut inner = self.lock();
            let Inner { by_name, refused, .. } = &mut *inner;
            let mut counted = false;
            for w in by_name.get_mut(name).into_iter().flatten() {
                if concerns(&self.attribute, name, &w.attributes, selector) && counts(&w.key) {
                    w.counts.add(second);
                    refused.insert(w.key.clone());
                    counted = true;
                }
            }
            counted
        };
        if counted {
            self.notice.send_replace(());
        }
    }

    fn count_at(&self, key: &str, since: Instant, now: Instant) -> u64 {
        // An instant before the epoch is before every refusal.
        let from = if since < self.epoch { 0 } else { self.second(since) + 1 };
        let now = self.second(now);
        let inner = self.lock();
        inner
            .by_name
            .values()
            .flatten()
            .find(|w| w.key == key)
            .map_or(0, |w| w.counts.since(from, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(pairs: &[(&str, &str)]) -> Selector {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn a_refusal_concerns_the_pool_it_names_when_its_members_could_match() {
        let attrs = selector(&[("geo", "eu")]);
        assert!(concerns("pool", "fleet", &attrs, &selector(&[("pool", "fleet")])));
        assert!(concerns(
            "pool",
            "fleet",
            &attrs,
            &selector(&[("pool", "fleet"), ("geo", "eu")])
        ));
        assert!(!concerns(
            "pool",
            "fleet",
            &attrs,
            &selector(&[("pool", "fleet"), ("geo", "us")])
        ));
        assert!(!concerns("pool", "fleet", &attrs, &selector(&[("pool", "other")])));
        assert!(
            !concerns("pool", "fleet", &attrs, &selector(&[("geo", "eu")])),
            "asked for by name"
        );
        // A template attribute named `pool` is overwritten on members: the name is what counts.
        let named = selector(&[("pool", "x")]);
        assert!(concerns("pool", "fleet", &named, &selector(&[("pool", "fleet")])));
    }

    #[test]
    fn counts_the_refusals_of_watched_pools_within_the_window_asked() {
        let r = Refusals::new("pool");
        let at = |s: u64| r.epoch + Duration::from_secs(s);
        r.watch_pool("ns/a", "a", &selector(&[("geo", "eu")]));
        r.watch_pool("other/a", "a", &Selector::new());
        r.watch_pool("ns/b", "b", &Selector::new());
        for s in [0, 0, 5, 9] {
            r.record_at(&selector(&[("pool", "a")]), at(s), |_| true);
        }
        // Only ns/a's members have geo=eu; nobody watches c; no pool named: nothing.
        r.record_at(&selector(&[("pool", "a"), ("geo", "eu")]), at(9), |_| true);
        r.record_at(&selector(&[("pool", "c")]), at(9), |_| true);
        r.record_at(&selector(&[("geo", "eu")]), at(9), |_| true);
        assert_eq!(r.take_refused(), ["ns/a", "other/a"]);
        assert_eq!(r.take_refused(), Vec::<String>::new());

        // From before the first (an instant before the epoch is before its first second).
        let start = r.epoch.checked_sub(Duration::from_secs(1)).unwrap();
        assert_eq!(r.count_at("ns/a", start, at(9)), 5);
        assert_eq!(r.count_at("other/a", start, at(9)), 4);
        assert_eq!(r.count_at("ns/b", start, at(9)), 0);
        assert_eq!(r.count_at("ns/c", start, at(9)), 0);
        // Those after a second: not those of that second.
        assert_eq!(r.count_at("ns/a", at(4), at(9)), 3);
        assert_eq!(r.count_at("ns/a", at(5), at(9)), 2);
        assert_eq!(r.count_at("ns/a", at(0), at(9)), 3);
        // A minute on, the first second has left the window; later ones have not.
        assert_eq!(r.count_at("ns/a", start, at(60)), 3);
        assert_eq!(r.count_at("ns/a", start, at(68)), 2);
        assert_eq!(r.count_at("ns/a", start, at(69)), 0);
        // A refusal recorded after `now` was read does not stretch the window back.
        r.record_at(&selector(&[("pool", "b")]), at(3), |_| true);
        r.record_at(&selector(&[("pool", "b")]), at(70), |_| true);
        assert_eq!(r.count_at("ns/b", start, at(69)), 0);
    }

    #[test]
    fn a_ring_reused_after_a_quiet_minute_forgets_the_old_counts() {
        let r = Refusals::new("pool");
        let at = |s: u64| r.epoch + Duration::from_secs(s);
        r.watch_pool("ns/a", "a", &Selector::new());
        let a = selector(&[("pool", "a")]);
        r.record_at(&a, at(3), |_| true);
        r.record_at(&a, at(3), |_| true);
        // Second 63 shares second 3's slot; second 200 is minutes later.
        r.record_at(&a, at(63), |_| true);
        assert_eq!(r.count_at("ns/a", at(0), at(63)), 1);
        r.record_at(&a, at(200), |_| true);
        assert_eq!(r.count_at("ns/a", at(0), at(200)), 1);
        assert_eq!(r.count_at("ns/a", at(0), at(201)), 1);
    }

    #[test]
    fn watching_is_bounded_kept_across_updates_and_forgotten() {
        let r = Refusals::new("pool");
        let at = |s: u64| r.epoch + Duration::from_secs(s);
        r.watch_pool("ns/a", "a", &Selector::new());
        r.record_at(&selector(&[("pool", "a")]), at(1), |_| true);
        // The template changed: the counts stay, the attributes follow.
        r.watch_pool("ns/a", "a", &selector(&[("geo", "us")]));
        r.record_at(&selector(&[("pool", "a"), ("geo", "us")]), at(2), |_| true);
        assert_eq!(r.count_at("ns/a", at(0), at(2)), 2);
        r.forget_pool("ns/a");
        r.record_at(&selector(&[("pool", "a")]), at(3), |_| true);
        assert_eq!(r.count_at("ns/a", at(0), at(3)), 0);
        assert_eq!(r.lock().watched, 0);
        assert!(r.lock().by_name.is_empty());
        for i in 0..MAX_POOLS + 10 {
            r.watch_pool(&format!("ns/p{i}"), &format!("p{i}"), &Selector::new());
        }
        assert_eq!(r.lock().watched, MAX_POOLS);
        r.record_at(&selector(&[("pool", &format!("p{}", MAX_POOLS + 1))]), at(4), |_| true);
        assert_eq!(r.take_refused(), Vec::<String>::new(), "not watched, not counted");
    }

    #[test]
    fn a_refusal_counts_only_for_the_pools_its_filter_accepts() {
        let r = Refusals::new("pool");
        let at = |s: u64| r.epoch + Duration::from_secs(s);
        r.watch_pool("crawlers/a", "a", &Selector::new());
        r.watch_pool("team-b/a", "a", &Selector::new());
        // A client scoped to the namespace crawlers asks for a pool named a.
        r.record_at(&selector(&[("pool", "a")]), at(1), |key| key.starts_with("crawlers/"));
        let start = r.epoch.checked_sub(Duration::from_secs(1)).unwrap();
        assert_eq!(r.count_at("crawlers/a", start, at(1)), 1);
        assert_eq!(
            r.count_at("team-b/a", start, at(1)),
            0,
            "another team's pool is not grown"
        );
        assert_eq!(r.take_refused(), ["crawlers/a"]);
        let rx = r.subscribe();
        r.record_at(&selector(&[("pool", "a")]), at(2), |_| false);
        assert!(!rx.has_changed().unwrap(), "nothing counted: nobody told");
    }

    #[test]
    fn subscribers_are_told_of_counted_refusals_only() {
        let r = Refusals::new("pool");
        r.watch_pool("ns/a", "a", &Selector::new());
        let mut rx = r.subscribe();
        r.record_at(&selector(&[("pool", "b")]), r.epoch, |_| true);
        assert!(!rx.has_changed().unwrap(), "no watched pool: not told");
        r.record_at(&selector(&[("pool", "a")]), r.epoch, |_| true);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        r.record_at(&selector(&[("pool", "a")]), r.epoch, |_| true);
        assert!(rx.has_changed().unwrap());
    }
}
