//! The operator's controllers. This is the one crate that turns Kubernetes objects into provider
//! contract types and back.
//!
//! Two controllers, each in its folder, decide with pure functions and act in a thin I/O shell:
//!
//! - [`proxy`]: the Proxy reconciler. Given what is known about one Proxy, its decision names the
//!   next action or the end of the pass; the shell performs the actions with kube and the
//!   provider and feeds the results back.
//! - [`pool`]: the ProxyPool controller, which keeps a pool's member Proxies at the number and
//!   roles its spec asks for (the Proxy reconciler provisions each member).
//!
//! Beside them, what the operator runs once for both, or for neither: the Proxy cache every
//! replica keeps ([`proxy_cache`]), leader election ([`leader`]), orphan GC ([`gc`]), the
//! provider-health monitor ([`provider_health`]), the create budgets of the provider entries
//! ([`create_budget`]), the discovery API's directory ([`discovery`]), the discovery token
//! Secret ([`token_secret`]), the installation id ([`installation`]), the probe target fetched
//! directly ([`probe_target`]), whether an exit keeps a Proxy from leases ([`exit_policy`]) and
//! the metrics ([`metrics`], [`runtime_metrics`], [`exit_metrics`]). The building
//! blocks both controllers write with: [`conditions`], [`merge`], [`events`] and [`identity`].
//!
//! No module of one controller uses the other's, and the shared ones use neither, except the
//! seams that read Proxies as the Proxy controller leaves them ([`discovery`]).

pub mod conditions;
pub mod create_budget;
pub mod discovery;
pub mod events;
pub mod exit_metrics;
pub mod exit_policy;
pub mod gc;
pub mod identity;
pub mod installation;
pub mod leader;
pub mod merge;
pub mod metrics;
pub mod observers;
pub mod pool;
pub mod probe_target;
pub mod provider_health;
pub mod proxy;
pub mod proxy_cache;
pub mod runtime_metrics;
pub mod tls_secret;
pub mod token_secret;
