//! The operator's controllers. This is the one crate that turns Kubernetes objects into provider
//! contract types and back.
//!
//! The reconciler's decisions are pure functions ([`decide`]): given what is known about one
//! Proxy, they name the next action or the end of the pass. A thin layer performs the actions
//! with kube and the provider and feeds the results back.

pub mod create_budget;
pub mod credentials;
pub mod decide;
pub mod destinations;
pub mod discovery;
pub mod events;
pub mod gc;
pub mod health;
pub mod installation;
pub mod leader;
pub mod merge;
pub mod metrics;
pub mod observers;
pub mod pool;
pub mod probe_target;
pub mod provider_health;
pub mod proxy_cache;
pub mod reconciler;
pub mod runtime_metrics;
pub mod spec_hash;
pub mod status;
pub mod token_secret;
