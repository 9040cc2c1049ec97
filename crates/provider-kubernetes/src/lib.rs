//! The kubernetes provider (spec/providers.md §4): one Squid Pod per Proxy, in the Proxy's
//! namespace of the operator's own cluster.
//!
//! Work in progress: the pure rules (the Squid config, the Pod, providerIDs, the state mapping,
//! the classify table) and the provider over a `kube::Client` with its checker. Its conformance
//! run against `egress-kube-testserver`, its constructor from a config entry and its
//! registration follow; until then the operator does not accept `type: kubernetes`.

pub mod classify;
pub mod id;
pub mod pod;
pub mod provider;
pub mod squid;
pub mod state;
