//! The exit check's part of the engine: its setting, the reserve of workers it keeps, and its
//! jobs (built, started on a worker, and folded into the snapshot).

use std::cmp::Reverse;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Done, Engine, ExitSeen, Outcome, Pool, ProbeSettings, Prober, Report, Schedule, request};
use crate::exit::EchoError;
use crate::probe::ProbeRequest;

/// The exit check: where the echo is, and how often each proxy's exit is checked again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitCheck {
    pub url: String,
    pub interval: Duration,
}

/// The workers exit checks may take while probes wait: one in sixteen, at least one. Exit checks
/// are rare (one per proxy per interval), so the reserve is idle most of the time and probes
/// use it; it matters only when probes are always overdue.
pub fn exit_reserve(workers: usize) -> usize {
    (workers / 16).max(1)
}

/// How often a proxy's exit is checked again, unless told otherwise (`--exit-check-interval`).
pub const DEFAULT_EXIT_INTERVAL: Duration = Duration::from_secs(600);

impl<P: Prober> Engine<P> {
    /// The exit check of a proxy at `host:port`: the probe's request with the echo URL.
    pub(super) fn exit_request(&self, host: &str, port: u16, settings: &ProbeSettings) -> Option<Arc<ProbeRequest>> {
        let check = self.config.exit.as_ref()?;
        let mut req = request(host, port, settings);
        req.url.clone_from(&check.url);
        Some(Arc::new(req))
    }

    /// Starts the due exit checks there are workers for, oldest due first, while fewer than
    /// `limit` run.
    pub(super) fn dispatch_exits(
        &self,
        s: &mut Schedule,
        now: Instant,
        pool: &Arc<Pool>,
        done_tx: &Arc<mpsc::UnboundedSender<Done>>,
        limit: usize,
    ) {
        while let Some(Reverse((due, _))) = s.exit_due.peek() {
            if *due > now || pool.running.load(Ordering::Acquire) >= pool.workers || s.exits_running >= limit {
                return;
            }
            let Some(Reverse((due, id))) = s.exit_due.pop() else {
                return;
            };
            let Some(record) = s.records.get_mut(&id) else {
                continue; // pruned
            };
            let Some(req) = record.exit_request.clone() else {
                continue;
            };
            if record.exit_in_flight || record.exit_next != Some(due) {
                continue; // outdated
            }
            record.exit_in_flight = true;
            s.exits_running += 1;
            pool.running.fetch_add(1, Ordering::AcqRel);
            let prober = self.prober.clone();
            let (pool, tx) = (pool.clone(), done_tx.clone());
            tokio::spawn(async move {
                // Reports even if the prober panics, so the worker and the record are freed.
                let mut report = Report::new(pool, tx, id, Outcome::Exit(Err(panicked())));
                report.outcome = Some(Outcome::Exit(prober.exit(req).await));
            });
        }
    }

    /// Records an exit check's finding, and queues the next one an interval from now.
    pub(super) fn finish_exit(&self, s: &mut Schedule, id: u64, found: Result<IpAddr, EchoError>, now: Instant) {
        let (Some(record), Some(check)) = (s.records.get_mut(&id), self.config.exit.as_ref()) else {
            return;
        };
        record.exit_in_flight = false;
        let next = now + check.interval;
        record.exit_next = Some(next);
        s.exit_due.push(Reverse((next, id)));
        let seen = match found {
            Ok(ip) => ExitSeen::Address {
                ip,
                since: SystemTime::now(),
            },
            Err(e) => {
                tracing::debug!(proxy = %record.key, reason = %e, "exit check failed");
                ExitSeen::Unknown { why: e.to_string() }
            }
        };
        let key = record.key.clone();
        for touched in self.snapshot.set_exit(&key, seen) {
            self.notify(&touched, &mut s.unsent);
        }
    }
}

fn panicked() -> EchoError {
    EchoError::Fetch(crate::probe::ProbeError::Io("the exit check panicked".into()))
}
