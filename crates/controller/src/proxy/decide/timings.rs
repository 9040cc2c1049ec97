//! How long the reconciler waits between passes, and how long one pass may take.

use std::time::Duration;

/// The reconciler's waits (spec/core.md §3.2). Tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// While an instance is being created or booting.
    pub provisioning_poll: Duration,
    /// While waiting for an instance to disappear.
    pub deletion_poll: Duration,
    /// Steady-state recheck of a running instance.
    pub drift_poll: Duration,
    /// A short follow-up, after adding the finalizer.
    pub requeue_now: Duration,
    /// After a quota error.
    pub quota_retry: Duration,
    /// The most one pass's provider calls may take together (spec/kvm.md item 55, decided): the
    /// pass's context carries this deadline, so a call or a lock wait that would outlive it
    /// returns Transient and the Proxy is requeued with backoff, freeing its worker. Longer than
    /// any provider's longest single operation (a kvm image transfer, 20 minutes, then the start).
    pub pass_deadline: Duration,
    /// How long a running instance may report no address (a guest-agent restart, say) before
    /// the Proxy shows it booting again (spec/kvm.md item 54): until then its last address and
    /// `Provisioned=True` stay, and it is polled at the provisioning period.
    pub address_grace: Duration,
    /// How long an instance may go without an address before it is replaced (`None`: never,
    /// as in the Go operator). Counted from the first pass that found it without one, so it
    /// covers a guest that never gets an address (no DHCP on its network, an image that never
    /// brings its network up) and one that lost its address for longer than the grace.
    pub address_budget: Option<Duration>,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            provisioning_poll: Duration::from_secs(10),
            deletion_poll: Duration::from_secs(10),
            drift_poll: Duration::from_secs(120),
            requeue_now: Duration::from_secs(1),
            quota_retry: Duration::from_secs(300),
            pass_deadline: Duration::from_secs(25 * 60),
            address_grace: Duration::from_secs(30),
            address_budget: Some(DEFAULT_ADDRESS_BUDGET),
        }
    }
}

/// [`Timings::address_budget`] unless `--provisioning-timeout` says otherwise: long enough for
/// a software-emulated guest's boot many times over, short enough that a guest that will never
/// get an address does not hold a Proxy's place for good.
pub const DEFAULT_ADDRESS_BUDGET: Duration = Duration::from_secs(15 * 60);
