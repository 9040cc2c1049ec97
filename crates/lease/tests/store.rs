//! The lease store suite (tests/suite) against the in-memory store.

mod suite;

use std::sync::Arc;

use egress_lease::{LeaseStore, ManualClock, MemoryStore};

struct Memory;

impl suite::Backend for Memory {
    fn store(&self, clock: ManualClock) -> Option<Arc<dyn LeaseStore>> {
        Some(Arc::new(MemoryStore::new(Arc::new(clock), suite::COOLDOWN)))
    }
}

lease_store_suite!(Memory);
