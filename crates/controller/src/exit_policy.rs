//! Whether a Proxy's exit keeps it from leases (`--exit-policy`): read by the discovery API,
//! which leaves such a Proxy out, and by the pool controller, which replaces it. The Proxy
//! controller writes the condition it reads ([`crate::proxy::exit`]).

use egress_api::{ConditionStatus, Proxy, conditions};

/// Whether a Proxy whose exit is not verified is still offered for leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExitPolicy {
    /// Offered all the same; the condition says what was found.
    #[default]
    Observe,
    /// Not offered while Shared, OperatorAddress or Unexpected.
    Enforce,
}

/// Whether `policy` keeps `proxy` from leases for its exit: under [`ExitPolicy::Enforce`],
/// while its `ExitVerified` condition is False (Shared, OperatorAddress or Unexpected).
pub fn refused(proxy: &Proxy, policy: ExitPolicy) -> bool {
    policy == ExitPolicy::Enforce
        && proxy
            .condition(conditions::EXIT_VERIFIED)
            .is_some_and(|c| c.status == ConditionStatus::False)
}
