//! The lease store's behaviour, written once and run against every backend (the in-memory
//! store here, Redis in `egress-lease-redis`): selection, capacity, release, expiry, cooldowns,
//! retention, the sweep, 64 concurrent clients, sessions and renewal (two replicas asking for
//! one session at once included), and invariants under random operation sequences.
//!
//! A backend supplies [`Backend::store_with_cooldown`]: a fresh, empty store over the given
//! clock, keeping at most [`MAX_ENDED`] ended leases reportable. Use
//! [`lease_store_suite!`](crate::lease_store_suite) to instantiate every case. Behind the
//! `testing` feature, for the store crates' own tests.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::{
    Candidate, Grant, LeaseRequest, LeaseStore, MAX_COOLDOWN_TARGETS, ManualClock, NoMatch, ProxyRef, ReportResult,
    Target, UnknownLease,
};
use proptest::prelude::*;

/// For [`lease_store_suite`](crate::lease_store_suite)'s expansion, so its callers need not
/// depend on proptest themselves.
pub use proptest;

mod hooked;
mod indexed;
mod invariants;
mod selectors;
mod sessions;
pub use hooked::{Hooked, Hooks};
pub use indexed::Indexed;
pub use invariants::*;
pub use selectors::*;
pub use sessions::*;

pub const COOLDOWN: Duration = Duration::from_secs(900);
/// The ended leases a suite store keeps reportable (small, so the bound is reached quickly).
pub const MAX_ENDED: usize = 256;

fn target(t: Option<&str>) -> Option<Target> {
    t.and_then(|t| Target::parse(t).expect("a target within the limit"))
}

/// Makes fresh stores.
pub trait Backend: Send + Sync + 'static {
    /// A fresh, empty store on `clock` with the cooldown window `cooldown`; `None` skips the
    /// case (the backend is not configured here).
    fn store_with_cooldown(&self, clock: ManualClock, cooldown: Duration) -> Option<Arc<dyn LeaseStore>>;

    /// A fresh, empty store on `clock` with the cooldown window [`COOLDOWN`].
    fn store(&self, clock: ManualClock) -> Option<Arc<dyn LeaseStore>> {
        self.store_with_cooldown(clock, COOLDOWN)
    }

    /// Two replicas of one fresh, empty store: for a shared store two stores on the same state,
    /// each as a replica of the API has it; for one that serves a single replica, itself twice.
    fn replicas(&self, clock: ManualClock) -> Option<[Arc<dyn LeaseStore>; 2]> {
        let one = self.store(clock)?;
        Some([one.clone(), one])
    }

    /// Whether the store keeps each pool's leases apart (a sharded store): an acquire without a
    /// pool then grants the best proxy of the pool it tries, not of the fleet.
    fn keeps_pools_apart(&self) -> bool {
        false
    }
}

pub fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// A proxy the test owns; candidates borrow from it.
#[derive(Debug, Clone)]
pub struct P {
    pub id: String,
    pub healthy: bool,
    pub latency_millis: i64,
    pub max_leases: i32,
    /// Its indexed attributes, `(key, value)`.
    pub attributes: Vec<(String, String)>,
}

pub fn proxy(id: &str, latency_millis: i64, max_leases: i32) -> P {
    P {
        id: id.into(),
        healthy: true,
        latency_millis,
        max_leases,
        attributes: Vec::new(),
    }
}

impl P {
    /// The proxy with the attribute `key` = `value` too.
    #[must_use]
    pub fn with(mut self, key: &str, value: &str) -> Self {
        self.attributes.push((key.into(), value.into()));
        self
    }

    /// Whether every pair of `selector` is one of its attributes.
    pub fn matches(&self, selector: &[(&str, &str)]) -> bool {
        selector
            .iter()
            .all(|(k, v)| self.attributes.iter().any(|(ak, av)| ak == k && av == v))
    }

    fn candidate(&self) -> Candidate<'_> {
        Candidate {
            id: &self.id,
            healthy: self.healthy,
            latency_millis: self.latency_millis,
            max_leases: self.max_leases,
            pool: self.pool(),
        }
    }

    /// Where a store finds its leases.
    pub fn placed(&self) -> ProxyRef<'_> {
        ProxyRef {
            id: &self.id,
            pool: self.pool(),
        }
    }

    /// Its pool: the value of its `pool` attribute.
    pub fn pool(&self) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == crate::POOL_KEY)
            .map(|(_, v)| v.as_str())
    }
}

/// Acquires over `fleet`, handing the store its candidates in the order it wants.
pub async fn acquire(s: &dyn LeaseStore, fleet: &[P], r: &LeaseRequest) -> Result<Grant, NoMatch> {
    let mut candidates: Vec<Candidate<'_>> = fleet.iter().map(P::candidate).collect();
    candidates.sort_by(|a, b| a.order(b));
    s.acquire(&mut candidates.into_iter(), r)
        .await
        .expect("the store answers")
}

pub fn req(target: Option<&str>) -> LeaseRequest {
    LeaseRequest {
        ttl: Duration::from_secs(300),
        target: self::target(target),
        scope: crate::Scope::Listed,
    }
}

async fn release(s: &dyn LeaseStore, id: &str) {
    s.release(id).await.expect("the store answers");
}

async fn report(s: &dyn LeaseStore, id: &str, r: ReportResult, target: Option<&str>) -> Result<(), UnknownLease> {
    s.report(id, r, self::target(target)).await.expect("the store answers")
}

async fn total(s: &dyn LeaseStore) -> usize {
    s.active_total().await.expect("the store answers")
}

async fn sweep(s: &dyn LeaseStore) {
    s.sweep().await.expect("the store answers");
}

/// Whether a request for `target` is refused on the one-proxy `fleet` because of a cooldown.
async fn cooling(s: &dyn LeaseStore, fleet: &[P], target: Option<&str>) -> bool {
    match acquire(s, fleet, &req(target)).await {
        Ok(g) => {
            release(s, &g.lease_id).await;
            false
        }
        Err(n) => n.in_cooldown == 1,
    }
}

pub async fn selection_prefers_fewest_leases_then_latency_then_id(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/c", 10, 5), proxy("ns/b", 10, 5), proxy("ns/a", 50, 5)];
    // All idle: the lowest latency wins, and between equal latencies the smaller id.
    assert_eq!(acquire(s, &fleet, &req(None)).await.unwrap().proxy_id, "ns/b");
    assert_eq!(acquire(s, &fleet, &req(None)).await.unwrap().proxy_id, "ns/c");
    // b and c have one lease each: a (idle) wins despite its latency.
    let g = acquire(s, &fleet, &req(None)).await.unwrap();
    assert_eq!((g.proxy_id.as_str(), g.active_leases), ("ns/a", 1));
    assert_eq!(
        s.active_leases(&["ns/a", "ns/b", "ns/c", "ns/none"].map(ProxyRef::unpooled))
            .await
            .unwrap(),
        [1, 1, 1, 0]
    );
    assert_eq!(total(s).await, 3);
    assert_eq!(s.active_total_now(), 3);
}

pub async fn capacity_zero_and_unhealthy_proxies_are_never_leased_and_counted_once(
    s: Arc<dyn LeaseStore>,
    _c: ManualClock,
) {
    let s = s.as_ref();
    let mut sick = proxy("ns/sick", 1, 5);
    sick.healthy = false;
    let mut sick_and_full = proxy("ns/sick-full", 1, 0);
    sick_and_full.healthy = false;
    let fleet = [sick, sick_and_full, proxy("ns/zero", 1, 0), proxy("ns/one", 1, 1)];
    assert_eq!(acquire(s, &fleet, &req(None)).await.unwrap().proxy_id, "ns/one");
    assert_eq!(
        acquire(s, &fleet, &req(None)).await,
        Err(NoMatch {
            considered: 4,
            at_capacity: 2,
            in_cooldown: 0,
            unhealthy: 2
        })
    );
    assert_eq!(
        acquire(s, &[], &req(None)).await,
        Err(NoMatch::default()),
        "nothing matched the selector"
    );
}

pub async fn release_frees_capacity_at_once_and_is_idempotent(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 1)];
    let g = acquire(s, &fleet, &req(None)).await.unwrap();
    assert!(acquire(s, &fleet, &req(None)).await.is_err());
    release(s, &g.lease_id).await;
    release(s, &g.lease_id).await;
    release(s, "NEVERISSUED").await;
    assert_eq!(total(s).await, 0);
    assert!(acquire(s, &fleet, &req(None)).await.is_ok());
    assert_eq!(total(s).await, 1, "a double release freed nothing extra");
}

pub async fn expiry_frees_capacity_whenever_the_sweep_runs(s: Arc<dyn LeaseStore>, clock: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 1)];
    let g = acquire(s, &fleet, &req(None)).await.unwrap();
    assert_eq!(g.expires_at, start() + Duration::from_secs(300));
    clock.advance(Duration::from_secs(299));
    assert!(acquire(s, &fleet, &req(None)).await.is_err());
    clock.advance(Duration::from_secs(1));
    assert_eq!(total(s).await, 0, "expired at expiresAt, no sweep needed");
    assert!(acquire(s, &fleet, &req(None)).await.is_ok());
}

pub async fn a_targeted_cooldown_blocks_only_that_target(s: Arc<dyn LeaseStore>, clock: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(s, &fleet, &req(Some("example.com"))).await.unwrap();
    report(s, &g.lease_id, ReportResult::RateLimited, None).await.unwrap();
    let refused = acquire(s, &fleet, &req(Some("example.com"))).await.unwrap_err();
    assert_eq!((refused.considered, refused.in_cooldown), (1, 1));
    assert!(
        acquire(s, &fleet, &req(Some("other.org"))).await.is_ok(),
        "another target"
    );
    assert!(acquire(s, &fleet, &req(None)).await.is_ok(), "no target");
    clock.advance(COOLDOWN);
    assert!(
        acquire(s, &fleet, &req(Some("example.com"))).await.is_ok(),
        "the window is over"
    );
}

pub async fn the_reports_target_wins_over_the_leases(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(s, &fleet, &req(Some("example.com"))).await.unwrap();
    report(s, &g.lease_id, ReportResult::Banned, Some("shop.example"))
        .await
        .unwrap();
    assert!(cooling(s, &fleet, Some("shop.example")).await);
    assert!(!cooling(s, &fleet, Some("example.com")).await);
}

pub async fn a_global_cooldown_blocks_every_request(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5), proxy("ns/b", 9, 5)];
    let g = acquire(s, &fleet, &req(None)).await.unwrap();
    assert_eq!(g.proxy_id, "ns/a");
    report(s, &g.lease_id, ReportResult::Banned, Some("")).await.unwrap();
    for target in [None, Some("example.com"), Some("")] {
        assert_eq!(
            acquire(s, &fleet, &req(target)).await.unwrap().proxy_id,
            "ns/b",
            "{target:?}"
        );
    }
}

pub async fn an_ok_report_records_nothing(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(s, &fleet, &req(Some("example.com"))).await.unwrap();
    report(s, &g.lease_id, ReportResult::Ok, None).await.unwrap();
    assert!(!cooling(s, &fleet, Some("example.com")).await);
}

pub async fn overlapping_cooldowns_keep_the_later_end(s: Arc<dyn LeaseStore>, clock: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(s, &fleet, &req(Some("t"))).await.unwrap();
    report(s, &g.lease_id, ReportResult::RateLimited, None).await.unwrap();
    clock.advance(Duration::from_secs(600));
    report(s, &g.lease_id, ReportResult::RateLimited, None).await.unwrap();
    clock.advance(Duration::from_secs(600));
    assert!(
        cooling(s, &fleet, Some("t")).await,
        "the second report's window runs to 1500 s"
    );
    clock.advance(Duration::from_secs(300));
    assert!(!cooling(s, &fleet, Some("t")).await);
}

/// A window of zero (`--lease-cooldown=0`): reports are taken and rest nothing, and a lease is
/// reportable until it expires.
pub async fn a_zero_window_rests_nothing(backend: &dyn Backend) {
    let clock = ManualClock::new(start());
    let Some(s) = backend.store_with_cooldown(clock.clone(), Duration::ZERO) else {
        return;
    };
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(s, &fleet, &req(Some("example.com"))).await.unwrap();
    report(s, &g.lease_id, ReportResult::RateLimited, None).await.unwrap();
    report(s, &g.lease_id, ReportResult::Banned, Some("")).await.unwrap();
    for target in [Some("example.com"), None] {
        assert!(!cooling(s, &fleet, target).await, "{target:?}");
    }
    release(s, &g.lease_id).await;
    assert_eq!(
        report(s, &g.lease_id, ReportResult::Banned, None).await,
        Ok(()),
        "before its expiry"
    );
    assert!(!cooling(s, &fleet, Some("example.com")).await);
    clock.advance(Duration::from_secs(300));
    assert_eq!(
        report(s, &g.lease_id, ReportResult::Ok, None).await,
        Err(UnknownLease),
        "expired"
    );
}

pub async fn an_expired_or_released_lease_stays_reportable_for_one_window(s: Arc<dyn LeaseStore>, clock: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(s, &fleet, &req(Some("t"))).await.unwrap();
    release(s, &g.lease_id).await;
    clock.advance(Duration::from_secs(300) + COOLDOWN - Duration::from_secs(1));
    sweep(s).await;
    assert_eq!(
        report(s, &g.lease_id, ReportResult::RateLimited, None).await,
        Ok(()),
        "a late report lands"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        report(s, &g.lease_id, ReportResult::Ok, None).await,
        Err(UnknownLease),
        "aged out, even unswept"
    );
    sweep(s).await;
    assert_eq!(report(s, &g.lease_id, ReportResult::Ok, None).await, Err(UnknownLease));
    assert_eq!(
        report(s, "NEVERISSUED", ReportResult::Ok, None).await,
        Err(UnknownLease)
    );
}

pub async fn the_sweep_forgets_ended_cooldowns_and_old_leases_only(s: Arc<dyn LeaseStore>, clock: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let old = acquire(s, &fleet, &req(Some("t"))).await.unwrap();
    report(s, &old.lease_id, ReportResult::RateLimited, None).await.unwrap();
    clock.advance(COOLDOWN);
    let young = acquire(s, &fleet, &req(Some("t"))).await.unwrap();
    sweep(s).await;
    assert!(
        report(s, &old.lease_id, ReportResult::Ok, None).await.is_ok(),
        "within its retention"
    );
    assert!(report(s, &young.lease_id, ReportResult::Ok, None).await.is_ok());
    clock.advance(Duration::from_secs(300));
    sweep(s).await;
    assert_eq!(
        report(s, &old.lease_id, ReportResult::Ok, None).await,
        Err(UnknownLease)
    );
    assert!(report(s, &young.lease_id, ReportResult::Ok, None).await.is_ok());
}

pub async fn sixty_four_clients_never_exceed_any_capacity(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let fleet: Arc<Vec<P>> = Arc::new((0..8).map(|i| proxy(&format!("ns/p{i}"), i, 3)).collect());
    let mut tasks = Vec::new();
    for t in 0..64 {
        let (s, fleet) = (s.clone(), fleet.clone());
        tasks.push(tokio::spawn(async move {
            let ids: Vec<ProxyRef<'_>> = fleet.iter().map(P::placed).collect();
            for round in 0..50 {
                let target = (round % 3 == 0).then(|| format!("site{}", t % 4));
                if let Ok(g) = acquire(s.as_ref(), &fleet, &req(target.as_deref())).await {
                    assert!(g.active_leases <= 3, "{g:?}");
                    for n in s.active_leases(&ids).await.unwrap() {
                        assert!(n <= 3, "a proxy over capacity: {n}");
                    }
                    release(s.as_ref(), &g.lease_id).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("a client");
    }
    assert_eq!(total(s.as_ref()).await, 0);
}

pub async fn a_target_names_a_site_whatever_its_spelling(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(s, &fleet, &req(Some("https://Shop.Example/cart?id=1")))
        .await
        .unwrap();
    report(s, &g.lease_id, ReportResult::Banned, None).await.unwrap();
    assert!(cooling(s, &fleet, Some("shop.example")).await);
    assert!(cooling(s, &fleet, Some("http://user@SHOP.example/")).await);
    assert!(!cooling(s, &fleet, Some("shop.example:8443")).await);
    assert!(!cooling(s, &fleet, Some("other.example")).await);
}

pub async fn a_proxy_cools_down_for_at_most_64_targets(s: Arc<dyn LeaseStore>, c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let g = acquire(s, &fleet, &req(None)).await.unwrap();
    let before = s.cooldowns_dropped();
    for i in 0..=MAX_COOLDOWN_TARGETS {
        report(
            s,
            &g.lease_id,
            ReportResult::RateLimited,
            Some(&format!("site{i}.example")),
        )
        .await
        .unwrap();
        // Each cooldown ends a second after the one before: site0 ends soonest.
        c.advance(Duration::from_secs(1));
    }
    assert_eq!(
        s.cooldowns_dropped() - before,
        1,
        "one cooldown dropped for the 65th target"
    );
    assert!(
        !cooling(s, &fleet, Some("site0.example")).await,
        "the soonest-ending one went"
    );
    for i in 1..=MAX_COOLDOWN_TARGETS {
        assert!(cooling(s, &fleet, Some(&format!("site{i}.example"))).await, "site{i}");
    }
    // Extending a cooldown already held drops nothing; a global one is never dropped.
    report(s, &g.lease_id, ReportResult::RateLimited, Some("site1.example"))
        .await
        .unwrap();
    release(s, &g.lease_id).await;
    let other = acquire(s, &fleet, &req(None)).await.unwrap();
    report(s, &other.lease_id, ReportResult::Banned, Some(""))
        .await
        .unwrap();
    assert_eq!(s.cooldowns_dropped() - before, 1);
    assert!(cooling(s, &fleet, None).await, "the global cooldown is in force");
}

pub async fn only_the_newest_ended_leases_stay_reportable(s: Arc<dyn LeaseStore>, _c: ManualClock) {
    let s = s.as_ref();
    let fleet = [proxy("ns/a", 1, 5)];
    let mut ended = Vec::new();
    for _ in 0..MAX_ENDED + 10 {
        let g = acquire(s, &fleet, &req(None)).await.unwrap();
        release(s, &g.lease_id).await;
        ended.push(g.lease_id);
    }
    let active = acquire(s, &fleet, &req(None)).await.unwrap();
    for old in &ended[..10] {
        assert_eq!(
            report(s, old, ReportResult::Ok, None).await,
            Err(UnknownLease),
            "an ended lease beyond the newest {MAX_ENDED} is forgotten"
        );
    }
    for kept in &ended[10..] {
        assert_eq!(report(s, kept, ReportResult::Ok, None).await, Ok(()));
    }
    assert_eq!(
        report(s, &active.lease_id, ReportResult::Ok, None).await,
        Ok(()),
        "an active lease is kept"
    );
}

/// One `#[tokio::test]` per case over `$backend` (an expression implementing [`Backend`]). The
/// calling crate needs `tokio` (with `macros`, `rt-multi-thread`) among its dev-dependencies:
/// the expansion names it (proptest comes through this module).
///
/// `lease_store_suite!(sharded: $backend)` runs only the cases whose rules hold whatever shard
/// the store tries first: capacity, cooldowns, expiry, retention, sessions' uniqueness and the
/// invariants. It leaves out those that name which proxy of the fleet is chosen, and the
/// session cap, which a sharded store keeps in each shard.
#[macro_export]
macro_rules! lease_store_suite {
    (sharded: $backend:expr) => {
        $crate::lease_store_suite!(@cases $backend;
            capacity_zero_and_unhealthy_proxies_are_never_leased_and_counted_once,
            release_frees_capacity_at_once_and_is_idempotent,
            expiry_frees_capacity_whenever_the_sweep_runs,
            a_targeted_cooldown_blocks_only_that_target,
            the_reports_target_wins_over_the_leases,
            an_ok_report_records_nothing,
            overlapping_cooldowns_keep_the_later_end,
            an_expired_or_released_lease_stays_reportable_for_one_window,
            the_sweep_forgets_ended_cooldowns_and_old_leases_only,
            a_target_names_a_site_whatever_its_spelling,
            a_proxy_cools_down_for_at_most_64_targets,
            only_the_newest_ended_leases_stay_reportable,
            a_session_ends_with_its_lease,
            a_session_names_its_lease_for_reports,
            a_held_lease_is_renewed_while_its_proxy_is_fit,
            a_selector_chooses_within_its_indexes_only,
            a_selector_passes_over_cooling_and_unhealthy_proxies_and_counts_them,
        );

        #[tokio::test]
        async fn a_zero_window_rests_nothing() {
            $crate::testing::a_zero_window_rests_nothing(&$backend).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn sixty_four_clients_never_exceed_any_capacity() {
            let clock = $crate::ManualClock::new($crate::testing::start());
            let Some(store) = $crate::testing::Backend::store(&$backend, clock.clone()) else { return };
            $crate::testing::sixty_four_clients_never_exceed_any_capacity(store, clock).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn two_replicas_asking_for_one_session_get_one_lease() {
            let clock = $crate::ManualClock::new($crate::testing::start());
            let Some(replicas) = $crate::testing::Backend::replicas(&$backend, clock) else { return };
            $crate::testing::two_replicas_asking_for_one_session_get_one_lease(replicas).await;
        }

        $crate::testing::proptest::proptest! {
            #![proptest_config($crate::testing::proptest::prelude::ProptestConfig::with_cases(200))]

            #[test]
            fn invariants_hold_for_any_sequence(ops in $crate::testing::proptest::collection::vec($crate::testing::op(), 1..80)) {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
                // A store may need the runtime from its first moment (a lazy connection).
                let _inside = runtime.enter();
                let clock = $crate::ManualClock::new($crate::testing::start());
                if let Some(store) = $crate::testing::Backend::store(&$backend, clock.clone()) {
                    let apart = $crate::testing::Backend::keeps_pools_apart(&$backend);
                    runtime.block_on($crate::testing::invariants_hold(store, clock, ops, apart))?;
                }
            }
        }
    };
    ($backend:expr) => {
        $crate::lease_store_suite!(sharded: $backend);
        $crate::lease_store_suite!(@cases $backend;
            selection_prefers_fewest_leases_then_latency_then_id,
            a_global_cooldown_blocks_every_request,
            a_session_keeps_its_lease_and_extends_it,
            a_session_moves_when_its_proxy_is_unfit,
            a_client_s_sessions_are_capped_but_resuming_never_is,
        );
    };
    (@cases $backend:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let clock = $crate::ManualClock::new($crate::testing::start());
                let Some(store) = $crate::testing::Backend::store(&$backend, clock.clone()) else { return };
                $crate::testing::$case(store, clock).await;
            }
        )*
    };
}
