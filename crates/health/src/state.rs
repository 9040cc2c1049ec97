//! Per-proxy threshold state and the rule that folds one probe result into it (pure).
//!
//! - The first result of a record is a verdict at once (a new proxy does not wait for a
//!   threshold to get its `Healthy` condition).
//! - After that the verdict flips to healthy after `success_threshold` consecutive successes and
//!   to unhealthy after `failure_threshold` consecutive failures.
//! - While healthy, a new latency is reported only when it differs from the reported one by at
//!   least 50 % and at least 100 ms, so the status is not rewritten every second for jitter.

use std::time::Duration;

/// A verdict the reconciler reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub healthy: bool,
    /// The latency of the probe that set (or last materially changed) the verdict.
    pub latency: Duration,
    /// Unhealthy because the proxy refused the probe's credentials (or asked for some).
    pub auth_refused: bool,
}

/// Consecutive counts and the current verdict of one proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Thresholds {
    successes: u32,
    failures: u32,
    verdict: Option<Verdict>,
}

/// The smallest latency change worth a status write, absolute and relative.
pub const MATERIAL_ABSOLUTE: Duration = Duration::from_millis(100);

/// Whether `new` differs from `reported` enough to report (at least 50 % and at least 100 ms).
pub fn material(reported: Duration, new: Duration) -> bool {
    let diff = reported.abs_diff(new);
    diff >= MATERIAL_ABSOLUTE && diff * 2 >= reported
}

impl Thresholds {
    /// Counts that start from a verdict already known (recorded before this process): the first
    /// result then does not replace it at once; a flip needs its threshold.
    pub fn starting_from(known: Option<Verdict>) -> Self {
        Self {
            successes: 0,
            failures: 0,
            verdict: known,
        }
    }

    pub fn verdict(&self) -> Option<Verdict> {
        self.verdict
    }

    /// Folds one result in (`auth_refused`: it failed because the proxy refused the probe's
    /// credentials). Returns the new verdict when the result changes what the status should say
    /// (a first verdict, a flip, a material latency change, or an unhealthy proxy failing for the
    /// other kind of reason), else `None`.
    pub fn fold(
        &mut self,
        ok: bool,
        auth_refused: bool,
        latency: Duration,
        success_threshold: u32,
        failure_threshold: u32,
    ) -> Option<Verdict> {
        if ok {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
        }
        let auth_refused = !ok && auth_refused;
        let healthy = |latency| Verdict {
            healthy: true,
            latency,
            auth_refused: false,
        };
        let unhealthy = Verdict {
            healthy: false,
            latency,
            auth_refused,
        };
        let next = match self.verdict {
            None if ok => healthy(latency),
            None => unhealthy,
            Some(v) if !v.healthy && ok && self.successes >= success_threshold.max(1) => healthy(latency),
            Some(v) if v.healthy && !ok && self.failures >= failure_threshold.max(1) => unhealthy,
            Some(v) if !v.healthy && !ok && v.auth_refused != auth_refused => unhealthy,
            Some(v) if v.healthy && ok && material(v.latency, latency) => healthy(latency),
            Some(_) => return None,
        };
        self.verdict = Some(next);
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn run(results: &[(bool, u64)]) -> Vec<Option<(bool, u64)>> {
        let mut t = Thresholds::default();
        results
            .iter()
            .map(|(ok, ms)| {
                t.fold(*ok, false, MS(*ms), 2, 3)
                    .map(|v| (v.healthy, v.latency.as_millis() as u64))
            })
            .collect()
    }

    #[test]
    fn the_first_result_is_a_verdict_at_once() {
        assert_eq!(run(&[(true, 40)]), [Some((true, 40))]);
        assert_eq!(run(&[(false, 5000)]), [Some((false, 5000))]);
    }

    #[test]
    fn flips_need_their_thresholds_in_a_row() {
        // healthy; two failures are not enough; a success resets; three in a row flip.
        assert_eq!(
            run(&[
                (true, 40),
                (false, 1),
                (false, 1),
                (true, 40),
                (false, 1),
                (false, 1),
                (false, 7)
            ]),
            [Some((true, 40)), None, None, None, None, None, Some((false, 7))]
        );
        // unhealthy; one success is not enough; two in a row flip.
        assert_eq!(
            run(&[(false, 1), (true, 40), (false, 1), (true, 40), (true, 45)]),
            [Some((false, 1)), None, None, None, Some((true, 45))]
        );
    }

    #[test]
    fn latency_jitter_is_not_reported_but_a_material_change_is() {
        assert_eq!(
            run(&[
                (true, 40),
                (true, 120),
                (true, 139),
                (true, 140),
                (true, 400),
                (true, 200),
                (true, 150)
            ]),
            // 40 -> 120: +80 ms (< 100 ms); 40 -> 140: +100 ms and +250 %: reported.
            // 140 -> 400: reported; 400 -> 200: -200 ms, 50 %: reported; 200 -> 150: -50 ms: not.
            [
                Some((true, 40)),
                None,
                None,
                Some((true, 140)),
                Some((true, 400)),
                Some((true, 200)),
                None
            ]
        );
    }

    #[test]
    fn unhealthy_probes_do_not_report_latency() {
        assert_eq!(run(&[(false, 10), (false, 5000)]), [Some((false, 10)), None]);
    }

    #[test]
    fn materiality() {
        assert!(!material(MS(1000), MS(1400)));
        assert!(material(MS(1000), MS(1500)));
        assert!(!material(MS(10), MS(100)));
        assert!(material(MS(10), MS(110)));
        assert!(material(MS(0), MS(100)));
    }

    #[test]
    fn a_refusal_of_the_credentials_is_its_own_kind_of_unhealthy() {
        let mut t = Thresholds::default();
        let refused = t.fold(false, true, MS(3), 2, 3).unwrap();
        assert!(!refused.healthy && refused.auth_refused);
        // The same kind again: nothing new to say; the other kind: reported.
        assert_eq!(t.fold(false, true, MS(3), 2, 3), None);
        let timeout = t.fold(false, false, MS(5000), 2, 3).unwrap();
        assert!(!timeout.healthy && !timeout.auth_refused);
        assert!(t.fold(false, true, MS(3), 2, 3).unwrap().auth_refused);
        // A success never carries the flag.
        let mut t = Thresholds::default();
        assert!(!t.fold(true, true, MS(3), 2, 3).unwrap().auth_refused);
    }
}
