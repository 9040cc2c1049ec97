//! Time as the store sees it: the system's, or one a test moves by hand.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Where the store reads the time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// The system's wall clock (lease expiry times are wall times: clients read `expiresAt`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told; clones share it.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<SystemTime>>);

impl ManualClock {
    pub fn new(start: SystemTime) -> Self {
        Self(Arc::new(Mutex::new(start)))
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
