//! What the connection tasks share: the state under its lock, the test controls, and the
//! tokens that end the server and its watches.

use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::faults::{Faults, Requests};
use crate::store::State;

/// What the connection tasks share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) faults: Faults,
    pub(crate) requests: Requests,
    pub(crate) bookmark_interval: Duration,
    pub(crate) shutdown: CancellationToken,
    /// Cancelled (and replaced) to end every open watch, as an API server restart does.
    pub(crate) watches: Mutex<CancellationToken>,
    pub(crate) address: String,
    pub(crate) identities: crate::reviews::Identities,
}

impl Shared {
    /// The state, locked.
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug in this crate. Serving on is more useful
        // to a test than hanging, though a panic in the middle of a cascade (namespace, CRD or
        // garbage-collection deletes) may have committed only part of it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
