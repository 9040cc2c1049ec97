//! The kubernetes provider (spec/providers.md §4): one Squid Pod per Proxy, in the Proxy's
//! namespace of the operator's own cluster.
//!
//! Work in progress: this crate holds the provider's pure rules so far (the Squid config, the
//! Pod, providerIDs, the state mapping and the classify table). The provider itself over a kube
//! client, its checker and its registration follow; until then the operator does not accept
//! `type: kubernetes`.

pub mod classify;
pub mod id;
pub mod pod;
pub mod squid;
pub mod state;
