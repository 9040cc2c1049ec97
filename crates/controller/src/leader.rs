//! Leader election on a `coordination.k8s.io/v1` Lease (spec/core.md §10.3), as client-go does
//! it: acquire when the lease is free or its holder has not renewed within the lease duration
//! (measured on this process's clock, from when the record last changed, so clock skew between
//! replicas does not matter); renew every retry period; give up leadership when renewals fail
//! for longer than the renew deadline. The lease is not released on shutdown, so a new replica
//! waits for the old one's lease to run out.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The Lease the Go operator used, kept so the two never lead at once during a switch.
pub const LEASE_NAME: &str = "b47711d1.example.com";

/// Timings of the election (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectionTimings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for ElectionTimings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// One candidate.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timings: ElectionTimings,
    /// The holder and renew time last seen, and when this process saw them change.
    observed: Option<(Option<String>, Option<MicroTime>, Instant)>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Elector {
    /// A candidate. The timings must satisfy `lease_duration > renew_deadline > retry_period`,
    /// or a slow renewal could outlive the lease another replica is waiting on.
    pub fn new(api: Api<Lease>, name: &str, identity: &str, timings: ElectionTimings) -> Result<Self, String> {
        if !(timings.lease_duration > timings.renew_deadline && timings.renew_deadline > timings.retry_period) {
            return Err(format!(
                "leader election needs lease duration > renew deadline > retry period, got {:?} / {:?} / {:?}",
                timings.lease_duration, timings.renew_deadline, timings.retry_period
            ));
        }
        Ok(Self {
            api,
            name: name.into(),
            identity: identity.into(),
            timings,
            observed: None,
        })
    }

    fn spec(&self, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timings.lease_duration.as_secs())
                    .unwrap_or(i32::MAX)
                    .max(1),
            ),
            acquire_time: acquire,
            renew_time: Some(now_micro()),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to acquire or renew. `Ok(true)` when this candidate holds the lease now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            // A lease that vanished while another holder was renewing it is not free: wait out
            // the duration from when this process last saw that holder.
            if let Some((Some(holder), _, seen)) = &self.observed
                && *holder != self.identity
                && *seen + self.timings.lease_duration > Instant::now()
            {
                return Ok(false);
            }
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(Some(now_micro()), 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                // Another candidate created it first.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = (spec.holder_identity.clone(), spec.renew_time.clone());
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|(h, r, _)| (h, r) != (&record.0, &record.1));
        if changed {
            self.observed = Some((record.0.clone(), record.1.clone(), Instant::now()));
        }
        let observed_at = self.observed.as_ref().map_or_else(Instant::now, |(_, _, at)| *at);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.identity;
        let duration = spec
            .lease_duration_seconds
            .map_or(self.timings.lease_duration, |s| Duration::from_secs(s.max(0) as u64));
        let expired = holder.is_empty() || observed_at + duration <= Instant::now();
        if !mine && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        lease.spec = Some(if mine {
            self.spec(spec.acquire_time.clone(), transitions)
        } else {
            self.spec(Some(now_micro()), transitions + 1)
        });
        // The replace carries the resourceVersion read: of two candidates racing, one loses (409).
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(updated) => {
                let s = updated.spec.unwrap_or_default();
                self.observed = Some((s.holder_identity, s.renew_time, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Campaigns until `shutdown`: the returned channel says whether this candidate leads.
    ///
    /// While leading, every renewal must succeed before `last successful renewal + renew
    /// deadline`; each attempt is cut off at that deadline, and leadership is reported lost the
    /// moment it passes (before the lease, which is longer, can run out for the others). Lost
    /// leadership, or shutdown, ends the campaign with `false`: the process should stop its
    /// leader-only work and exit, as controller-runtime does.
    pub fn run(mut self, shutdown: CancellationToken) -> (tokio::task::JoinHandle<()>, watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut renew_by: Option<Instant> = None;
            loop {
                let attempt_started = Instant::now();
                // Not leading: an attempt may take up to the renew deadline. Leading: only until
                // the deadline of the current term.
                let cut_off = renew_by.unwrap_or(attempt_started + self.timings.renew_deadline);
                let attempt = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    r = tokio::time::timeout_at(cut_off, self.try_acquire_or_renew()) => r,
                };
                match attempt {
                    Ok(Ok(true)) => {
                        if renew_by.is_none() {
                            tracing::info!(lease = %self.name, identity = %self.identity, "successfully acquired lease");
                        }
                        // Measured from the start of the attempt that succeeded: its write may
                        // have landed any time after that.
                        renew_by = Some(attempt_started + self.timings.renew_deadline);
                        let _ = tx.send(true);
                    }
                    Ok(Ok(false)) if renew_by.is_some() => {
                        tracing::error!(lease = %self.name, "leader election lost: another holder has the lease");
                        break;
                    }
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => tracing::warn!(lease = %self.name, error = %e, "leader election attempt failed"),
                    Err(_) => tracing::warn!(lease = %self.name, "leader election attempt timed out"),
                }
                if renew_by.is_some_and(|deadline| Instant::now() >= deadline) {
                    tracing::error!(lease = %self.name, "leader election lost: the lease could not be renewed in time");
                    break;
                }
                let next = Instant::now() + self.timings.retry_period;
                let wake = renew_by.map_or(next, |deadline| next.min(deadline));
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep_until(wake) => {}
                }
            }
            let _ = tx.send(false);
        });
        (task, rx)
    }
}
