//! Lease requests the API refused, counted per selector, for the pool autoscaler
//! (docs/pools.md#autoscale). Demand that found no proxy does not show in utilisation (a pool
//! scaled to zero has no capacity to use), so the API remembers, for the last minute, how many
//! requests each selector naming a pool was refused; the autoscaler asks how many of them concern
//! its pool.
//!
//! Bounded whatever clients send: at most [`MAX_SELECTORS`] selectors of at most
//! [`MAX_SELECTOR_BYTES`] each, sixty one-second counters per selector, and subscribers told at
//! most once per [`NOTICE_GAP`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How far back counts reach.
pub const HORIZON: Duration = Duration::from_secs(BUCKETS as u64);
/// One counter per second of [`HORIZON`].
const BUCKETS: usize = 60;
/// Selectors remembered at once. A new one finds room by taking the place of one refused
/// nothing within [`HORIZON`]; with none such, it is not counted (and a debug line says so).
pub const MAX_SELECTORS: usize = 1024;
/// A selector whose keys and values are longer than this together is not counted.
pub const MAX_SELECTOR_BYTES: usize = 1024;
/// Subscribers are told of refusals at most this often.
pub const NOTICE_GAP: Duration = Duration::from_secs(1);

/// A selector as the request sent it.
pub type Selector = BTreeMap<String, String>;

/// The refused requests of the last [`HORIZON`], by selector. Only selectors that carry the
/// attribute it was made for (`pool`) are counted.
#[derive(Debug)]
pub struct Refusals {
    attribute: String,
    epoch: Instant,
    inner: Mutex<Inner>,
    notice: watch::Sender<()>,
}

#[derive(Debug, Default)]
struct Inner {
    by_selector: HashMap<Selector, Counts>,
    last_notice: Option<Instant>,
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
    fn new(second: u64) -> Self {
        Self {
            buckets: [0; BUCKETS],
            last: second,
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

    /// Refusals in the seconds `from ..= now`, no further back than [`HORIZON`].
    fn since(&self, from: u64, now: u64) -> u64 {
        let oldest = from.max(now.saturating_sub(BUCKETS as u64 - 1));
        (oldest..=self.last.min(now))
            .map(|s| u64::from(self.buckets[slot(s)]))
            .sum()
    }
}

fn slot(second: u64) -> usize {
    usize::try_from(second % BUCKETS as u64).unwrap_or_default()
}

impl Refusals {
    /// Counts refusals of selectors that carry `attribute`.
    pub fn new(attribute: impl Into<String>) -> Self {
        Self {
            attribute: attribute.into(),
            epoch: Instant::now(),
            inner: Mutex::default(),
            notice: watch::Sender::new(()),
        }
    }

    /// Notes that a request with `selector` was refused (`409 no_match`).
    pub fn record(&self, selector: &Selector) {
        self.record_at(selector, Instant::now());
    }

    /// How many refusals after `since` had a selector for which `concerns` holds, counted in
    /// whole seconds: those of the seconds after the one `since` falls in, no further back
    /// than [`HORIZON`]. So none made before `since` is counted (a few just after it may not
    /// be: the autoscaler asks for those since it last grew a pool, and must not count the
    /// ones that made it grow).
    pub fn count_since(&self, since: Instant, concerns: impl Fn(&Selector) -> bool) -> u64 {
        self.count_at(since, Instant::now(), concerns)
    }

    /// Fires (coalesced, at most once per [`NOTICE_GAP`]) when a refusal was counted.
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.notice.subscribe()
    }

    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_secs()
    }

    fn record_at(&self, selector: &Selector, now: Instant) {
        if !selector.contains_key(&self.attribute) {
            return;
        }
        let bytes: usize = selector.iter().map(|(k, v)| k.len() + v.len()).sum();
        if bytes > MAX_SELECTOR_BYTES {
            tracing::debug!(bytes, "a refused selector too long to count");
            return;
        }
        let second = self.second(now);
        let notify = {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(counts) = inner.by_selector.get_mut(selector) {
                counts.add(second);
            } else {
                if inner.by_selector.len() >= MAX_SELECTORS {
                    let stale = inner
                        .by_selector
                        .iter()
                        .find(|(_, c)| c.last + (BUCKETS as u64) <= second)
                        .map(|(s, _)| s.clone());
                    let Some(stale) = stale else {
                        tracing::debug!("{MAX_SELECTORS} selectors refused within a minute; not counting another");
                        return;
                    };
                    inner.by_selector.remove(&stale);
                }
                let mut counts = Counts::new(second);
                counts.add(second);
                inner.by_selector.insert(selector.clone(), counts);
            }
            let due = inner
                .last_notice
                .is_none_or(|n| now.saturating_duration_since(n) >= NOTICE_GAP);
            if due {
                inner.last_notice = Some(now);
            }
            due
        };
        if notify {
            self.notice.send_replace(());
        }
    }

    fn count_at(&self, since: Instant, now: Instant, concerns: impl Fn(&Selector) -> bool) -> u64 {
        // An instant before the epoch is before every refusal.
        let from = if since < self.epoch { 0 } else { self.second(since) + 1 };
        let now = self.second(now);
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .by_selector
            .iter()
            .filter(|(s, _)| concerns(s))
            .map(|(_, c)| c.since(from, now))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(pairs: &[(&str, &str)]) -> Selector {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn pool(name: &str) -> impl Fn(&Selector) -> bool + '_ {
        move |s| s.get("pool").map(String::as_str) == Some(name)
    }

    #[test]
    fn counts_refusals_by_selector_within_the_window_asked() {
        let r = Refusals::new("pool");
        let t0 = r.epoch;
        let at = |s: u64| t0 + Duration::from_secs(s);
        for s in [0, 0, 5, 9] {
            r.record_at(&selector(&[("pool", "a")]), at(s));
        }
        r.record_at(&selector(&[("pool", "a"), ("geo", "eu")]), at(9));
        r.record_at(&selector(&[("pool", "b")]), at(9));
        // Not about a pool: not counted at all.
        r.record_at(&selector(&[("geo", "eu")]), at(9));
        assert_eq!(r.inner.lock().unwrap().by_selector.len(), 3);

        // From before the first (an instant before the epoch's first second is its own).
        let start = r.epoch.checked_sub(Duration::from_secs(1)).unwrap();
        assert_eq!(r.count_at(start, at(9), pool("a")), 5);
        // Those after a second: not those of that second.
        assert_eq!(r.count_at(at(4), at(9), pool("a")), 3);
        assert_eq!(r.count_at(at(5), at(9), pool("a")), 2);
        assert_eq!(r.count_at(at(0), at(9), pool("a")), 3);
        assert_eq!(r.count_at(start, at(9), pool("b")), 1);
        assert_eq!(r.count_at(start, at(9), pool("c")), 0);
        // A minute on, the first second has left the window; later ones have not.
        assert_eq!(r.count_at(start, at(60), pool("a")), 3);
        assert_eq!(r.count_at(start, at(68), pool("a")), 2);
        assert_eq!(r.count_at(start, at(69), pool("a")), 0);
    }

    #[test]
    fn a_ring_reused_after_a_quiet_minute_forgets_the_old_counts() {
        let r = Refusals::new("pool");
        let at = |s: u64| r.epoch + Duration::from_secs(s);
        let a = selector(&[("pool", "a")]);
        r.record_at(&a, at(3));
        r.record_at(&a, at(3));
        // Second 63 shares second 3's slot; second 200 is minutes later.
        r.record_at(&a, at(63));
        assert_eq!(r.count_at(at(0), at(63), pool("a")), 1);
        r.record_at(&a, at(200));
        assert_eq!(r.count_at(at(0), at(200), pool("a")), 1);
        assert_eq!(r.count_at(at(0), at(201), pool("a")), 1);
    }

    #[test]
    fn what_it_keeps_is_bounded() {
        let r = Refusals::new("pool");
        let at = |s: u64| r.epoch + Duration::from_secs(s);
        let long = "x".repeat(MAX_SELECTOR_BYTES);
        r.record_at(&selector(&[("pool", &long)]), at(0));
        assert_eq!(r.inner.lock().unwrap().by_selector.len(), 0, "too long");
        for i in 0..MAX_SELECTORS {
            r.record_at(&selector(&[("pool", &i.to_string())]), at(0));
        }
        // Full, and all of them recent: a new selector is not counted.
        r.record_at(&selector(&[("pool", "new")]), at(30));
        assert_eq!(r.count_at(at(0), at(30), pool("new")), 0);
        // A minute later the old ones are stale: a new one takes the place of one.
        r.record_at(&selector(&[("pool", "new")]), at(60));
        assert_eq!(r.count_at(at(0), at(60), pool("new")), 1);
        assert_eq!(r.inner.lock().unwrap().by_selector.len(), MAX_SELECTORS);
    }

    #[test]
    fn subscribers_are_told_at_most_once_per_gap() {
        let r = Refusals::new("pool");
        let mut rx = r.subscribe();
        let a = selector(&[("pool", "a")]);
        let t0 = r.epoch;
        r.record_at(&a, t0);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        r.record_at(&a, t0 + NOTICE_GAP / 2);
        assert!(!rx.has_changed().unwrap(), "within the gap");
        r.record_at(&selector(&[("geo", "eu")]), t0 + NOTICE_GAP * 2);
        assert!(!rx.has_changed().unwrap(), "not counted, not told");
        r.record_at(&a, t0 + NOTICE_GAP);
        assert!(rx.has_changed().unwrap());
    }
}
