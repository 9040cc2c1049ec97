//! The create budget of each provider entry (`createsPerMinute` in the providers config): the
//! most instance creates the whole operator asks of one entry per minute, whoever wants them
//! (standalone Proxies, pool members, standbys).
//!
//! It is the last guard against a create loop, whatever its cause: a pool whose probe target
//! was down once created and deleted instances 109 times in 45 s, a bill and a quota on gcp and
//! a thrashed disk on a hypervisor. Each entry has a token bucket of capacity N refilled at N
//! per minute, so a burst of up to N creates (a pool resized) goes at once and a loop settles at
//! N a minute. The reconciler asks for a token just before it calls `create`; without one it
//! does not call the provider, and the Proxy waits (`Provisioned=False`, reason
//! `CreateBudget`) until about when a token is due.
//!
//! ```text
//!  reconciler ── try_take(entry, proxy uid) ──► CreateBudgets ──► EntryBudget (one per entry)
//!      │                                            │               ├─ TokenBucket   (pure, `now` passed in)
//!      │◄── Ok: call create / Err(Deferral) ────────┘               └─ waiting Proxies and when each is due
//!      └── requeue after Deferral::wait
//! ```
//!
//! Waiting Proxies queue: the k-th one is told to come back when k tokens will be there, not
//! when the next one is, so a hundred waiters do not all wake for the same token. The queue is
//! a hint, not a reservation: whoever asks when a token is there takes it.
//!
//! The bucket and the queue take the time as an argument ([`TokenBucket`], [`EntryBudget`]);
//! [`CreateBudgets`] reads it from a [`Clock`], which tests freeze and advance
//! ([`ManualClock`]). The budget is per process: it lives in the leader's reconciler, the only
//! place creates are made, and a new leader starts with full buckets.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_http::TokenBucket;
use egress_provider::Providers;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// A waiter that has not asked again this long after it was due has gone (its Proxy deleted,
/// or moved to another entry): it no longer counts as waiting, nor holds a place in the queue.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// Where the budgets read the time. Monotonic: the budget measures intervals, not dates.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> Instant;
}

/// The process's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until told to move, for tests: with it frozen, a test can count
/// exactly how many creates a budget lets through.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<Instant>>);

impl Default for ManualClock {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Instant::now())))
    }
}

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What an entry's budget answers a create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A token was taken: create.
    Go,
    /// No token: ask again after `wait`. `started`: this Proxy was not waiting yet (the waits
    /// counter counts it once per wait, not once per pass).
    Wait { wait: Duration, started: bool },
}

/// One entry's bucket and the Proxies waiting for it, each with the time its turn is due.
/// Pure: every method takes the time.
#[derive(Debug, Clone)]
pub struct EntryBudget {
    per_minute: u32,
    bucket: TokenBucket,
    waiting: HashMap<String, Instant>,
}

impl EntryBudget {
    pub fn new(per_minute: u32, now: Instant) -> Self {
        Self {
            per_minute: per_minute.max(1),
            bucket: TokenBucket::per_minute(per_minute, now),
            waiting: HashMap::new(),
        }
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// A create for `waiter` (a Proxy's UID) at `now`: a token if there is one, else when to
    /// come back. A waiter asked again before its turn keeps its place; one whose turn came
    /// without a token goes to the back of the queue.
    pub fn ask(&mut self, waiter: &str, now: Instant) -> Answer {
        self.forget_gone(now);
        if self.bucket.try_take(now).is_ok() {
            self.waiting.remove(waiter);
            return Answer::Go;
        }
        let started = !self.waiting.contains_key(waiter);
        if let Some(due) = self.waiting.get(waiter).filter(|due| **due > now) {
            return Answer::Wait {
                wait: *due - now,
                started,
            };
        }
        let ahead = self
            .waiting
            .iter()
            .filter(|(w, due)| *w != waiter && **due > now)
            .count();
        // The k-th in the queue comes back when k tokens are there: one for each ahead, one
        // for itself.
        let wait = self.bucket.wait_for(ahead as f64 + 1.0, now);
        self.waiting.insert(waiter.to_owned(), now + wait);
        Answer::Wait { wait, started }
    }

    /// The Proxies waiting at `now`: told to wait, not created since, and not gone.
    pub fn waiting(&self, now: Instant) -> usize {
        self.waiting.values().filter(|due| !gone(**due, now)).count()
    }

    fn forget_gone(&mut self, now: Instant) {
        self.waiting.retain(|_, due| !gone(*due, now));
    }
}

fn gone(due: Instant, now: Instant) -> bool {
    now.saturating_duration_since(due) > FORGET_AFTER
}

/// Why a create did not happen in this pass: the entry's budget had no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deferral {
    /// When to ask again.
    pub wait: Duration,
    /// The entry's budget, for the message.
    pub per_minute: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

/// Every entry's budget, shared by the reconciler's passes (cheap to clone).
#[derive(Clone)]
pub struct CreateBudgets {
    clock: Arc<dyn Clock>,
    entries: Arc<BTreeMap<String, Mutex<EntryBudget>>>,
    /// `proxy_operator_provider_create_budget_waits_total{provider}`.
    waits: Family<ProviderLabel, Counter>,
}

impl std::fmt::Debug for CreateBudgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per_minute: BTreeMap<&str, u32> = self
            .entries
            .iter()
            .map(|(n, e)| (n.as_str(), lock(e).per_minute()))
            .collect();
        f.debug_struct("CreateBudgets")
            .field("per_minute", &per_minute)
            .finish_non_exhaustive()
    }
}

fn lock(entry: &Mutex<EntryBudget>) -> std::sync::MutexGuard<'_, EntryBudget> {
    entry.lock().unwrap_or_else(|p| p.into_inner())
}

impl CreateBudgets {
    /// Full budgets for `entries` (entry name, creates per minute), timed by `clock`.
    pub fn new(entries: impl IntoIterator<Item = (String, u32)>, clock: Arc<dyn Clock>) -> Self {
        let now = clock.now();
        let entries: BTreeMap<String, Mutex<EntryBudget>> = entries
            .into_iter()
            .map(|(name, per_minute)| (name, Mutex::new(EntryBudget::new(per_minute, now))))
            .collect();
        let waits = Family::<ProviderLabel, Counter>::default();
        // Every entry's series from the start, at 0: a rate over a quiet entry is 0, not absent.
        for name in entries.keys() {
            let _ = waits.get_or_create(&ProviderLabel { provider: name.clone() });
        }
        Self {
            clock,
            entries: Arc::new(entries),
            waits,
        }
    }

    /// The budgets of the configured entries, as `createsPerMinute` set them.
    pub fn for_providers(providers: &Providers, clock: Arc<dyn Clock>) -> Self {
        Self::new(
            providers
                .entries()
                .iter()
                .map(|e| (e.name.clone(), e.creates_per_minute)),
            clock,
        )
    }

    /// Takes a token of `entry`'s budget for the create of Proxy `proxy_uid`. An entry it does
    /// not know has no budget (the reconciler creates only on configured entries).
    ///
    /// # Errors
    /// The [`Deferral`] when the budget has no token: do not create, ask again after its wait.
    pub fn try_take(&self, entry: &str, proxy_uid: &str) -> Result<(), Deferral> {
        let Some(budget) = self.entries.get(entry) else {
            return Ok(());
        };
        let mut budget = lock(budget);
        match budget.ask(proxy_uid, self.clock.now()) {
            Answer::Go => Ok(()),
            Answer::Wait { wait, started } => {
                if started {
                    self.waits
                        .get_or_create(&ProviderLabel {
                            provider: entry.to_owned(),
                        })
                        .inc();
                }
                Err(Deferral {
                    wait,
                    per_minute: budget.per_minute(),
                })
            }
        }
    }

    /// The Proxies waiting for `entry`'s budget now (0 for an entry it does not know).
    pub fn waiting(&self, entry: &str) -> usize {
        self.entries
            .get(entry)
            .map_or(0, |budget| lock(budget).waiting(self.clock.now()))
    }

    /// Registers `proxy_operator_provider_create_budget_waits_total{provider}` and
    /// `proxy_operator_provider_create_budget_waiting{provider}` (read at scrape time).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "proxy_operator_provider_create_budget_waits",
            "Instance creates that had to wait for their provider entry's create budget (createsPerMinute), counted once per wait.",
            self.waits.clone(),
        );
        registry.register_collector(Box::new(WaitingGauge(self.clone())));
    }
}

/// `proxy_operator_provider_create_budget_waiting{provider}`, one series per entry.
#[derive(Debug)]
struct WaitingGauge(CreateBudgets);

impl Collector for WaitingGauge {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "proxy_operator_provider_create_budget_waiting",
            "Proxies whose create waits for their provider entry's create budget now.",
            None,
            MetricType::Gauge,
        )?;
        for name in self.0.entries.keys() {
            let n = i64::try_from(self.0.waiting(name)).unwrap_or(i64::MAX);
            let labels = [("provider", name.as_str())];
            ConstGauge::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn start() -> Instant {
        Instant::now()
    }

    #[test]
    fn waiters_queue_instead_of_all_waking_for_one_token() {
        let t0 = start();
        let mut budget = EntryBudget::new(3, t0);
        for p in ["a", "b", "c"] {
            assert_eq!(budget.ask(p, t0), Answer::Go);
        }
        let wait = |wait, started| Answer::Wait { wait, started };
        assert_eq!(budget.ask("d", t0), wait(20 * SEC, true));
        assert_eq!(budget.ask("e", t0), wait(40 * SEC, true));
        assert_eq!(budget.waiting(t0), 2);
        // Asked again early: the same place, not a new wait.
        assert_eq!(budget.ask("e", t0 + 5 * SEC), wait(35 * SEC, false));
        assert_eq!(budget.ask("d", t0 + 20 * SEC), Answer::Go);
        assert_eq!(budget.waiting(t0 + 20 * SEC), 1);
        assert_eq!(budget.ask("e", t0 + 40 * SEC), Answer::Go);
        assert_eq!(budget.waiting(t0 + 40 * SEC), 0);
    }

    #[test]
    fn a_waiter_whose_turn_was_taken_queues_again_without_starting_a_new_wait() {
        let t0 = start();
        let mut budget = EntryBudget::new(1, t0);
        assert_eq!(budget.ask("a", t0), Answer::Go);
        assert_eq!(
            budget.ask("b", t0),
            Answer::Wait {
                wait: 60 * SEC,
                started: true
            }
        );
        // A newcomer takes the token that came for b.
        assert_eq!(budget.ask("c", t0 + 60 * SEC), Answer::Go);
        assert_eq!(
            budget.ask("b", t0 + 60 * SEC),
            Answer::Wait {
                wait: 60 * SEC,
                started: false
            }
        );
    }

    #[test]
    fn a_waiter_that_never_comes_back_is_forgotten() {
        let t0 = start();
        let mut budget = EntryBudget::new(1, t0);
        budget.ask("a", t0);
        budget.ask("gone", t0);
        assert_eq!(budget.waiting(t0 + 60 * SEC), 1);
        assert_eq!(budget.waiting(t0 + 60 * SEC + FORGET_AFTER + SEC), 0);
    }

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn budgets_are_per_entry_and_counted_in_the_metrics() {
        let clock = ManualClock::new();
        let budgets = CreateBudgets::new(
            [("small".to_owned(), 1), ("big".to_owned(), 60)],
            Arc::new(clock.clone()),
        );
        let mut registry = Registry::default();
        budgets.register(&mut registry);
        assert_eq!(budgets.try_take("small", "a"), Ok(()));
        let deferral = budgets.try_take("small", "b").unwrap_err();
        assert_eq!((deferral.wait, deferral.per_minute), (60 * SEC, 1));
        budgets.try_take("small", "b").unwrap_err();
        assert_eq!(
            budgets.try_take("big", "c"),
            Ok(()),
            "another entry's budget is its own"
        );
        assert_eq!(budgets.try_take("unknown", "d"), Ok(()), "an entry without a budget");
        let text = scrape(&registry);
        for line in [
            r#"proxy_operator_provider_create_budget_waits_total{provider="small"} 1"#,
            r#"proxy_operator_provider_create_budget_waits_total{provider="big"} 0"#,
            r#"proxy_operator_provider_create_budget_waiting{provider="small"} 1"#,
            r#"proxy_operator_provider_create_budget_waiting{provider="big"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        clock.advance(60 * SEC);
        assert_eq!(budgets.try_take("small", "b"), Ok(()));
        assert_eq!(budgets.waiting("small"), 0);
    }
}
