//! Health of egress proxies, proved through each one: a probe opens a `CONNECT` tunnel through
//! the proxy and fetches a target over TLS (or forwards a plain `http://` request), and the
//! engine runs that probe for every proxy about once per interval.
//!
//! - [`probe`]: one probe, bounded by one deadline, sending no identifying header.
//! - [`exit`]: the exit check: an echo URL fetched through a proxy (or directly) names the
//!   address a target sees.
//! - [`state`]: the pure threshold rule (first verdict, flips, material latency).
//! - [`engine`]: scheduling, a bounded worker pool, the verdict snapshot, the event channel to
//!   the reconciler, and pruning.
//! - [`metrics`]: `healthcheck_duration_seconds{proxy}` and `healthcheck_failures_total{proxy}`.
//!
//! No Kubernetes here: the engine reads proxies through [`engine::ProxySource`], and the
//! operator translates Proxies into [`engine::ProxyView`]s.

pub mod engine;
pub mod exit;
pub mod metrics;
pub mod probe;
pub mod state;

pub use engine::{
    ConnectProber, DEFAULT_EXIT_INTERVAL, Engine, EngineConfig, ExitCheck, ExitSeen, ProbeSettings, Prober, ProxyKey,
    ProxySource, ProxyView, Snapshot,
};
pub use exit::{EchoError, exit_through, own_exit, parse_echo};
pub use metrics::HealthMetrics;
pub use probe::{ProbeError, ProbeOutcome, ProbeRequest, ProbeTls, check_url, fetch_directly, probe, target_host};
pub use state::Verdict;
