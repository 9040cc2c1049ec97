//! Orphan GC's rule for one listed instance (spec/core.md §6.2), as a pure function.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use egress_provider::Instance;

/// Why an instance is kept, or that it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No UID mark: its owner cannot be told, so it is never collected.
    KeepUnmarked,
    /// Another installation's instance (it carries a different installation mark).
    KeepForeign,
    /// Its Proxy exists (a Proxy being deleted counts: its own reconciler cleans up).
    KeepLive,
    /// Younger than the minimum age (a future creation time is never old enough).
    KeepYoung,
    Delete,
}

/// The verdict for one instance, checks in this order: UID mark, installation, live UID, age.
/// The live check comes before the age, so a wrong creation time can never get a live Proxy's
/// instance deleted. A missing creation time counts as very old.
pub fn verdict(
    instance: &Instance,
    live_uids: &HashSet<String>,
    installation: Option<&str>,
    now: SystemTime,
    min_age: Duration,
) -> Verdict {
    if instance.uid.is_empty() {
        return Verdict::KeepUnmarked;
    }
    if let Some(ours) = installation
        && instance.installation.as_deref() != Some(ours)
    {
        return Verdict::KeepForeign;
    }
    if live_uids.contains(&instance.uid) {
        return Verdict::KeepLive;
    }
    match instance.created_at {
        None => Verdict::Delete,
        Some(created) => match now.duration_since(created) {
            Ok(age) if age >= min_age => Verdict::Delete,
            // Younger than the minimum, or created "in the future".
            _ => Verdict::KeepYoung,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_provider::{InstanceState, ProviderId};

    fn instance(uid: &str, created: Option<SystemTime>, installation: Option<&str>) -> Instance {
        Instance {
            id: ProviderId::new("i"),
            ip: None,
            state: InstanceState::Running,
            uid: uid.into(),
            created_at: created,
            installation: installation.map(str::to_string),
        }
    }

    #[test]
    fn the_checks_in_their_order() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000);
        let min = Duration::from_secs(600);
        let live: HashSet<String> = ["live".to_string()].into();
        let old = Some(now - Duration::from_secs(601));
        let young = Some(now - Duration::from_secs(599));
        let future = Some(now + Duration::from_secs(3600));
        let rows = [
            (instance("", old, None), None, Verdict::KeepUnmarked),
            (instance("live", old, None), None, Verdict::KeepLive),
            (instance("live", None, None), None, Verdict::KeepLive),
            (instance("gone", young, None), None, Verdict::KeepYoung),
            (instance("gone", future, None), None, Verdict::KeepYoung),
            (instance("gone", old, None), None, Verdict::Delete),
            (instance("gone", None, None), None, Verdict::Delete),
            (instance(" live", old, None), None, Verdict::Delete),
            (instance("gone", old, Some("other")), Some("ours"), Verdict::KeepForeign),
            (instance("gone", old, None), Some("ours"), Verdict::KeepForeign),
            (instance("gone", old, Some("ours")), Some("ours"), Verdict::Delete),
            (instance("", old, Some("ours")), Some("ours"), Verdict::KeepUnmarked),
        ];
        for (i, (inst, installation, want)) in rows.into_iter().enumerate() {
            assert_eq!(verdict(&inst, &live, installation, now, min), want, "row {i}");
        }
    }
}
