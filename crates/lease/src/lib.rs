//! Leases of egress proxies to crawler clients (spec/core.md §5).
//!
//! A client asks for a proxy, optionally naming the site it will crawl (the *target*) and
//! attributes the proxy must have; it gets the least loaded healthy proxy with free capacity
//! that is not cooling down for that target, for a time (the TTL). A client that was rate
//! limited or banned through a proxy reports it, and the proxy then cools down for that target
//! (or for everything, when no target is known) for one cooldown window.
//!
//! - [`store`]: the [`LeaseStore`] trait and what it takes and answers.
//! - [`memory`]: the in-memory store (one mutex; selection and the new lease are one atomic
//!   step, so concurrent acquisitions never exceed a capacity).
//! - [`session`]: sticky sessions and renewal.
//! - [`target`]: a target reduced to `host[:port]` and kept as a digest.
//! - [`clock`]: the injectable clock.
//! - [`ttl`]: the TTL rule of lease requests.
//!
//! No Kubernetes and no HTTP here: the caller passes the proxies that match a request
//! ([`Candidate`]s), and the discovery API serves the store.

pub mod clock;
pub mod memory;
pub mod session;
pub mod store;
pub mod target;
#[cfg(feature = "testing")]
pub mod testing;
pub mod ttl;

pub use clock::{Clock, ManualClock, SystemClock};
pub use memory::MemoryStore;
pub use session::{InvalidSession, MAX_SESSION_NAME, NotRenewed, Session, SessionName, SessionRefused};
pub use store::{
    Candidate, Fit, Grant, LeaseRequest, LeaseStore, MAX_COOLDOWN_TARGETS, MAX_ENDED, Member, NoMatch, POOL_KEY,
    ProxyRef, ReportResult, Scope, StoreError, UnknownLease, ViewEntry, index_name, lease_id,
};
pub use target::{MAX_TARGET_BYTES, Target, TargetTooLong, host_port};
pub use ttl::{DEFAULT_TTL, TtlError, effective_ttl};
