//! The fence around a base image being filled (docs/providers/kvm2.md, "The image cache's
//! fence"): before a writer deletes what is left of a base or starts filling it, it holds a
//! fill lease, a one-byte volume named `<base>.fill-<deadline>-<writer>` beside the base.
//!
//! libvirt can neither rename a volume nor compare-and-delete one, so everything a lease says
//! is in its name, which never changes: who holds it (a random id per provider instance) and
//! the Unix second by which its writer has given up whatever happens (its transfer budget and
//! cleanup have run out). A lease is never rewritten; a writer that died leaves one whose
//! deadline passes, and whoever comes next removes it.
//!
//! The rules are pure functions here; the calls that list, create and delete leases are in
//! `image.rs`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How far past a lease's deadline another writer waits before taking it for dead: the clocks
/// of two replicas (or two operators) may disagree by this much.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(5 * 60);

/// The name of the lease `writer` holds on `base` until `deadline` (Unix seconds).
pub fn lease_name(base: &str, deadline: u64, writer: &str) -> String {
    format!("{base}.fill-{deadline}-{writer}")
}

/// A fill lease read back from its volume name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The volume's name.
    pub volume: String,
    /// The Unix second by which its writer has given up.
    pub deadline: u64,
    /// Who holds it.
    pub writer: String,
}

/// The lease `volume` names on `base`, if it is one: the prefix, a decimal deadline, a dash and
/// a writer id of lowercase hex.
pub fn parse_lease(base: &str, volume: &str) -> Option<Lease> {
    let rest = volume.strip_prefix(base)?.strip_prefix(".fill-")?;
    let (deadline, writer) = rest.split_once('-')?;
    let deadline = deadline.parse().ok()?;
    let hex = !writer.is_empty() && writer.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex.then(|| Lease {
        volume: volume.to_owned(),
        deadline,
        writer: writer.to_owned(),
    })
}

/// What a writer makes of the leases on a base it is about to fill.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Leases whose writers are gone: to be removed.
    pub dead: Vec<Lease>,
    /// Leases of writers that may still be filling the base: nothing may be touched meanwhile.
    pub live: Vec<Lease>,
}

/// Sorts `leases` on one base for writer `me` at Unix second `now`. A lease of `me` is dead:
/// one writer fills one base at a time (the in-process image lock), so a lease of its own that
/// it meets is one an earlier attempt failed to remove. Another writer's lease is live until
/// its deadline plus [`CLOCK_MARGIN`].
pub fn judge(leases: Vec<Lease>, me: &str, now: u64) -> Verdict {
    let margin = CLOCK_MARGIN.as_secs();
    let (dead, live) = leases
        .into_iter()
        .partition(|l| l.writer == me || now > l.deadline.saturating_add(margin));
    Verdict { dead, live }
}

/// Every lease on `base` among a pool's volume names.
pub fn leases_among(base: &str, volumes: &[String]) -> Vec<Lease> {
    volumes.iter().filter_map(|v| parse_lease(base, v)).collect()
}

/// Unix seconds of `at` (0 before the epoch).
pub fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A new writer id: 16 random hex digits.
pub fn new_writer_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "base-kvm2-home-debian-13.qcow2";

    #[test]
    fn a_lease_name_reads_back_and_nothing_else_does() {
        let name = lease_name(BASE, 1_800_000_000, "00ff12ab34cd56ef");
        assert_eq!(name, "base-kvm2-home-debian-13.qcow2.fill-1800000000-00ff12ab34cd56ef");
        assert_eq!(
            parse_lease(BASE, &name),
            Some(Lease {
                volume: name.clone(),
                deadline: 1_800_000_000,
                writer: "00ff12ab34cd56ef".into()
            })
        );
        for other in [
            BASE.to_owned(),
            format!("{BASE}.sha256"),
            format!("{BASE}.fill-"),
            format!("{BASE}.fill-12"),
            format!("{BASE}.fill-x-ab"),
            format!("{BASE}.fill-12-"),
            format!("{BASE}.fill-12-AB"),
            format!("{BASE}.fill-12-ab.qcow2"),
            // Another base's lease.
            lease_name("base-kvm2-home-debian-12.qcow2", 1, "ab"),
        ] {
            assert_eq!(parse_lease(BASE, &other), None, "{other}");
        }
        let names = vec![name.clone(), format!("{BASE}.sha256"), BASE.to_owned()];
        assert_eq!(leases_among(BASE, &names).len(), 1);
    }

    #[test]
    fn own_and_expired_leases_are_dead_the_others_live() {
        let lease = |deadline, writer: &str| Lease {
            volume: lease_name(BASE, deadline, writer),
            deadline,
            writer: writer.into(),
        };
        let now = 10_000;
        let margin = CLOCK_MARGIN.as_secs();
        let verdict = judge(
            vec![
                // Mine, however far its deadline: an earlier attempt of mine that failed.
                lease(now + 3_600, "aa"),
                // Another writer's, within its deadline, and within the margin past it.
                lease(now + 60, "bb"),
                lease(now - margin, "cc"),
                // Past the margin: its writer is gone.
                lease(now - margin - 1, "dd"),
            ],
            "aa",
            now,
        );
        let writers = |l: &[Lease]| l.iter().map(|l| l.writer.clone()).collect::<Vec<_>>();
        assert_eq!(writers(&verdict.dead), ["aa", "dd"]);
        assert_eq!(writers(&verdict.live), ["bb", "cc"]);
        assert_eq!(new_writer_id().len(), 16);
        assert_ne!(new_writer_id(), new_writer_id());
    }
}
