//! The probe target itself, fetched by the operator with no proxy (docs/health.md#the-probe-target-itself):
//! when every member of a pool fails its probes, whether the target answers the operator tells a
//! person "the target is down" from "the proxies are down". It informs the pool's condition; it
//! decides nothing, since an operator whose network reaches the internet only through its
//! proxies finds the target unreachable whatever the proxies do.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use egress_health::ConnectProber;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

/// How often the target is fetched.
pub const CHECK_PERIOD: Duration = Duration::from_secs(30);
/// The budget of one fetch, a probe's default timeout.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// The status the default target answers (`generate_204`), as probes expect it.
pub const EXPECTED_STATUS: u16 = 204;

/// What the last fetch found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not fetched yet.
    Unknown,
    Reachable,
    /// Why not (the probe's short reason; it never carries a body).
    Unreachable(String),
}

/// The operator's default probe target (`--health-check-url`) and what fetching it directly
/// last found. Clones share it.
#[derive(Clone, Debug)]
pub struct ProbeTarget {
    url: String,
    seen: Arc<RwLock<Seen>>,
    /// `proxy_operator_probe_target_reachable`: no series until the first fetch.
    reachable: Family<Vec<(String, String)>, Gauge>,
}

impl ProbeTarget {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            seen: Arc::new(RwLock::new(Seen::Unknown)),
            reachable: Family::default(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn seen(&self) -> Seen {
        self.seen
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Registers `proxy_operator_probe_target_reachable`.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "proxy_operator_probe_target_reachable",
            "1 when the operator's last direct fetch (no proxy) of its default probe target (--health-check-url) got the expected status, 0 when it did not; absent before the first fetch.",
            self.reachable.clone(),
        );
    }

    /// Records a fetch's result, and logs a change.
    pub fn record(&self, now: Seen) {
        let before = std::mem::replace(
            &mut *self.seen.write().unwrap_or_else(std::sync::PoisonError::into_inner),
            now.clone(),
        );
        let up = now == Seen::Reachable;
        self.reachable.get_or_create(&Vec::new()).set(i64::from(up));
        if before != now {
            match &now {
                Seen::Reachable => tracing::info!(url = %self.url, "the probe target answers the operator directly"),
                Seen::Unreachable(why) => {
                    tracing::info!(url = %self.url, reason = %why, "the probe target does not answer the operator directly");
                }
                Seen::Unknown => {}
            }
        }
    }

    /// Fetches the target every [`CHECK_PERIOD`] with what `prober` trusts, until `shutdown`.
    pub async fn run(self, prober: ConnectProber, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(CHECK_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let outcome = tokio::select! {
                () = shutdown.cancelled() => return,
                o = prober.fetch_directly(&self.url, EXPECTED_STATUS, CHECK_TIMEOUT) => o,
            };
            self.record(match outcome.result {
                Ok(()) => Seen::Reachable,
                Err(why) => Seen::Unreachable(why.to_string()),
            });
        }
    }

    /// What to add to a pool's `TooManyUnhealthy` message when its members probe `url`.
    pub fn note_for(&self, url: &str) -> Option<String> {
        if url != self.url {
            return None;
        }
        match self.seen() {
            Seen::Unknown => None,
            Seen::Reachable => Some(format!(
                "; {url} answers the operator directly, so the members or the path through them fail"
            )),
            Seen::Unreachable(why) => Some(format!(
                "; {url} does not answer the operator directly either ({why}): the target or the network is likely down, not the members"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_only_for_pools_probing_the_same_url_once_it_is_known() {
        let target = ProbeTarget::new("https://t.test/generate_204");
        assert_eq!(target.note_for("https://t.test/generate_204"), None, "not fetched yet");
        target.record(Seen::Unreachable("the proxy is unreachable: refused".into()));
        let note = target.note_for("https://t.test/generate_204").unwrap();
        assert!(note.contains("does not answer the operator directly either"), "{note}");
        assert_eq!(target.note_for("https://other.test/204"), None);
        target.record(Seen::Reachable);
        let note = target.note_for("https://t.test/generate_204").unwrap();
        assert!(note.contains("answers the operator directly"), "{note}");
    }

    #[test]
    fn the_gauge_appears_with_the_first_fetch_and_follows_it() {
        let target = ProbeTarget::new("https://t.test/204");
        let mut registry = prometheus_client::registry::Registry::default();
        target.register(&mut registry);
        let text = |registry: &prometheus_client::registry::Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
            out
        };
        assert!(!text(&registry).contains("proxy_operator_probe_target_reachable "));
        target.record(Seen::Unreachable("x".into()));
        assert!(text(&registry).contains("proxy_operator_probe_target_reachable 0"));
        target.record(Seen::Reachable);
        assert!(text(&registry).contains("proxy_operator_probe_target_reachable 1"));
    }
}
