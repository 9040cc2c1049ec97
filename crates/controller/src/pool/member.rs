//! A pool's member as the pool's pure parts see it: its role and what its Proxy shows. The
//! decision ([`crate::pool::decide`]) plans with it, and remediation
//! ([`crate::pool::remediation`]) judges and counts it; neither needs the other for it.

use std::time::Duration;

/// What a member is to the pool: its role label.
pub use egress_api::PoolRole as Role;

/// One member as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub role: Role,
    /// Made from the pool's current template.
    pub current: bool,
    /// Since the member was created.
    pub age: Duration,
    /// Provisioned and Healthy, and not kept from leases for its exit.
    pub ready: bool,
    /// Judged failed: its instance lost or failed for good, failing its probes once it has
    /// been Ready or past its startup grace ([`crate::pool::remediation::judge`]), or kept
    /// from leases for its exit.
    pub failed: bool,
    /// Kept from leases for its exit ([`crate::exit_policy::refused`]): replaced as a failed
    /// member, and drained with its own reason.
    pub exit_refused: bool,
    /// Its active leases.
    pub leases: u32,
    /// How long it has been draining (draining members only).
    pub draining_for: Duration,
}
