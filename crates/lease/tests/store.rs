//! The lease store suite (`egress_lease::testing`) against the in-memory store.

use egress_lease::testing as suite;

use std::sync::Arc;
use std::time::Duration;

use egress_lease::{LeaseStore, ManualClock, MemoryStore};

struct Memory;

impl suite::Backend for Memory {
    fn store_with_cooldown(&self, clock: ManualClock, cooldown: Duration) -> Option<Arc<dyn LeaseStore>> {
        Some(Arc::new(
            MemoryStore::new(Arc::new(clock), cooldown).with_max_ended(suite::MAX_ENDED),
        ))
    }
}

egress_lease::lease_store_suite!(Memory);

/// The same cases through the wrapper the shared stores' indexed runs use: it must change no
/// decision of a store without an index.
mod indexed {
    egress_lease::lease_store_suite!(egress_lease::testing::Indexed(super::Memory));
}

/// Abuse: many distinct, maximal targets, acquire/release pairs and report spam. What the store
/// holds stays within its bounds: the ended leases kept, and 64 targets per proxy.
#[tokio::test]
async fn what_abuse_leaves_behind_is_bounded() {
    use egress_lease::{Candidate, LeaseRequest, MAX_COOLDOWN_TARGETS, MAX_TARGET_BYTES, ReportResult, Target};
    let clock = ManualClock::new(suite::start());
    let store = MemoryStore::new(Arc::new(clock.clone()), suite::COOLDOWN).with_max_ended(500);
    let fleet: Vec<String> = (0..10).map(|i| format!("ns/p{i}")).collect();
    let long = "x".repeat(MAX_TARGET_BYTES - 8);
    for round in 0..5_000u32 {
        let target = Target::parse(&format!("{round:08}{long}")).unwrap();
        let mut candidates = fleet.iter().map(|id| Candidate {
            id,
            healthy: true,
            latency_millis: 1,
            max_leases: 5,
            pool: None,
        });
        let request = LeaseRequest {
            ttl: std::time::Duration::from_secs(300),
            target,
            scope: egress_lease::Scope::Listed,
        };
        let Ok(Ok(grant)) = store.acquire(&mut candidates, &request).await else {
            panic!("a lease at round {round}");
        };
        store
            .report(&grant.lease_id, ReportResult::Banned, None)
            .await
            .unwrap()
            .unwrap();
        if round % 10 != 0 {
            store.release(&grant.lease_id).await.unwrap();
        }
        // Unreleased leases (one in ten) expire as the clock moves: at most 25 live at once.
        if round % 50 == 0 {
            clock.advance(std::time::Duration::from_secs(60));
        }
    }
    let (leases, cooldowns) = store.held();
    let active = store.active_total().await.unwrap();
    assert!(active <= 50, "{active} active on a fleet of capacity 50");
    assert!(leases <= active + 500, "{leases} leases held");
    assert!(
        cooldowns <= fleet.len() * MAX_COOLDOWN_TARGETS,
        "{cooldowns} cooldowns held"
    );
    assert!(store.cooldowns_dropped() > 0, "the cap was never reached");
}
