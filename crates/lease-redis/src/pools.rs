//! Which shard each pool's leases are in. A pool's shard is chosen once, by the first replica
//! that needs it (the publisher placing the view, or an acquire among the pool's members), and
//! stored under shard 0's tag as `pool:<name>`; every replica reads it from there, so all place
//! the pool alike whatever each knew when it chose.
//!
//! The choice spreads the load over a Redis Cluster's masters: a new pool takes the first of its
//! choices (`placement::pool_choices`) that no other pool holds, on the master that carries the
//! fewest offered proxies (the directory's shards, and the pools chosen before it in the same
//! pass, the heaviest first). Pools that come together so split evenly over the masters, where
//! numbering shards from the names alone put half of sixteen pools on one master now and then.
//! On one Redis every shard has the same home, and a pool takes its first free choice.
//!
//! A stored shard lives [`POOL_LIFETIME`] past the last publication or acquire that read it. A
//! pool gone from the view that long and then back may be given another shard; its leases from
//! before are then counted apart until they end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use egress_lease::StoreError;

use crate::calls::Calls;
use crate::directory::{REFRESH, Shards};
use crate::duration_millis;
use crate::homes::Masters;
use crate::placement::{MAX_UNPOOLED_SHARDS, ShardId, pool_choices, shard_tag, slot};

/// How long a pool's stored shard stays after the last read of it.
pub(crate) const POOL_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// Pools a replica keeps its reads of, at most.
const MAX_CACHED_POOLS: usize = 4096;
/// How old a replica's copy of the cluster's masters may be when it chooses a shard.
const MASTERS_REFRESH: Duration = Duration::from_secs(60);

/// A replica's reads of the pools' shards, and of the cluster's masters to choose new ones by.
pub(crate) struct Pools {
    /// Each pool's stored shard (`None`: none was stored) and when it was read.
    read: Mutex<HashMap<String, (Instant, Option<ShardId>)>>,
    /// The cluster's masters and when they were read.
    masters: tokio::sync::Mutex<Option<(Instant, Arc<Masters>)>>,
}

impl Pools {
    pub(crate) fn new() -> Self {
        Self {
            read: Mutex::default(),
            masters: tokio::sync::Mutex::new(None),
        }
    }

    /// The shard this replica last read for `pool`, however long ago.
    pub(crate) fn last_read(&self, pool: &str) -> Option<ShardId> {
        let read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
        read.get(pool).and_then(|(_, shard)| *shard)
    }

    /// The stored shard of each of `pools` that has one: as read within [`REFRESH`], or read
    /// now (which keeps it another [`POOL_LIFETIME`]).
    pub(crate) async fn stored<'p>(
        &self,
        calls: &Calls,
        pools: impl Iterator<Item = &'p str>,
    ) -> Result<HashMap<String, ShardId>, StoreError> {
        let mut known = HashMap::new();
        let mut unread = Vec::new();
        {
            let read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
            for pool in pools {
                match read.get(pool) {
                    Some((at, shard)) if at.elapsed() < REFRESH => known.extend(shard.map(|s| (pool.to_owned(), s))),
                    _ => unread.push(pool),
                }
            }
        }
        if unread.is_empty() {
            return Ok(known);
        }
        let mut pipe = redis::pipe();
        for pool in &unread {
            pipe.cmd("GETEX").arg(key(calls, pool)).arg("PX").arg(lifetime());
        }
        let answers: Vec<Option<String>> = calls.query_pipe(&pipe).await?;
        let found: Vec<(&str, Option<ShardId>)> = unread
            .into_iter()
            .zip(answers.iter().map(|a| parse(a.as_deref())))
            .collect();
        self.note(&found);
        known.extend(found.into_iter().filter_map(|(p, s)| Some((p.to_owned(), s?))));
        Ok(known)
    }

    /// Shards for the `new` pools (each with its weight, its members), chosen against the
    /// `directory`'s load and the shards `known` pools hold, and stored unless another replica
    /// stored one first (which is then theirs).
    pub(crate) async fn choose(
        &self,
        calls: &Calls,
        prefix: &str,
        new: &[(&str, u64)],
        directory: &Shards,
        known: &HashMap<String, ShardId>,
    ) -> Result<HashMap<String, ShardId>, StoreError> {
        let masters = self.masters(calls).await?;
        let home_of = |s: ShardId| masters.of(slot(&shard_tag(prefix, s))).unwrap_or("");
        let mut loads: BTreeMap<&str, u64> = masters.all().into_iter().map(|m| (m, 0)).collect();
        if loads.is_empty() {
            loads.insert("", 0);
        }
        for (shard, listing) in directory {
            *loads.entry(home_of(*shard)).or_default() += listing.offered;
        }
        let mut taken: BTreeSet<ShardId> = directory.keys().chain(known.values()).copied().collect();
        let mut order = new.to_vec();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut pipe = redis::pipe();
        let mut ours = Vec::new();
        for (pool, weight) in order {
            let shard = choose(pool_choices(pool), &taken, &loads, home_of);
            taken.insert(shard);
            *loads.entry(home_of(shard)).or_default() += weight;
            let set = pipe.cmd("SET").arg(key(calls, pool)).arg(shard.0);
            set.arg("NX").arg("GET").arg("PX").arg(lifetime());
            ours.push((pool, shard));
        }
        let before: Vec<Option<String>> = calls.query_pipe(&pipe).await?;
        let stored: Vec<(&str, Option<ShardId>)> = ours
            .iter()
            .zip(&before)
            .map(|((pool, shard), before)| (*pool, Some(parse(before.as_deref()).unwrap_or(*shard))))
            .collect();
        self.note(&stored);
        Ok(stored
            .into_iter()
            .filter_map(|(p, s)| Some((p.to_owned(), s?)))
            .collect())
    }

    fn note(&self, found: &[(&str, Option<ShardId>)]) {
        let mut read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
        if read.len() + found.len() > MAX_CACHED_POOLS {
            read.clear();
        }
        let now = Instant::now();
        read.extend(found.iter().map(|(p, s)| ((*p).to_owned(), (now, *s))));
    }

    /// The cluster's masters, read again when older than [`MASTERS_REFRESH`]; none on one Redis.
    async fn masters(&self, calls: &Calls) -> Result<Arc<Masters>, StoreError> {
        if !calls.connection.on_cluster() {
            return Ok(Arc::default());
        }
        let mut masters = self.masters.lock().await;
        match &*masters {
            Some((at, m)) if at.elapsed() < MASTERS_REFRESH => Ok(m.clone()),
            _ => {
                let m = Arc::new(Masters::read(calls).await?);
                *masters = Some((Instant::now(), m.clone()));
                Ok(m)
            }
        }
    }
}

/// Of `choices`, the first that is not `taken` on a home of the least load of all (`loads`, by
/// home); when none of them is on such a home, the first free one on the least loaded home
/// among theirs; when every one is taken, the first (two pools then share a shard, which is
/// correct, only not spread).
pub(crate) fn choose<'h>(
    choices: impl Iterator<Item = ShardId>,
    taken: &BTreeSet<ShardId>,
    loads: &BTreeMap<&'h str, u64>,
    home_of: impl Fn(ShardId) -> &'h str,
) -> ShardId {
    let least = loads.values().copied().min().unwrap_or(0);
    let (mut first, mut best) = (None, None::<(u64, ShardId)>);
    for shard in choices {
        first.get_or_insert(shard);
        if taken.contains(&shard) {
            continue;
        }
        let load = loads.get(home_of(shard)).copied().unwrap_or(0);
        if load <= least {
            return shard;
        }
        if best.is_none_or(|(l, _)| load < l) {
            best = Some((load, shard));
        }
    }
    best.map(|(_, s)| s).or(first).unwrap_or(ShardId(MAX_UNPOOLED_SHARDS))
}

fn key(calls: &Calls, pool: &str) -> String {
    format!("{}pool:{pool}", calls.tag)
}

fn lifetime() -> u64 {
    duration_millis(POOL_LIFETIME)
}

/// A stored shard number; anything else reads as none.
fn parse(stored: Option<&str>) -> Option<ShardId> {
    stored.and_then(|s| s.parse().ok()).map(ShardId)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Homes by shard number: even on "a", odd on "b".
    fn parity(s: ShardId) -> &'static str {
        if s.0.is_multiple_of(2) { "a" } else { "b" }
    }

    #[test]
    fn a_new_pool_takes_its_first_free_choice_on_the_least_loaded_home() {
        let choices = || [10, 12, 13, 15].into_iter().map(ShardId);
        let loads = |a: u64, b: u64| BTreeMap::from([("a", a), ("b", b)]);
        let none = BTreeSet::new();
        assert_eq!(choose(choices(), &none, &loads(0, 0), parity), ShardId(10));
        assert_eq!(choose(choices(), &none, &loads(5, 1), parity), ShardId(13));
        let taken = BTreeSet::from([ShardId(13)]);
        assert_eq!(choose(choices(), &taken, &loads(5, 1), parity), ShardId(15));
        // No choice on the least loaded home ("c"): the least loaded among theirs.
        let three = BTreeMap::from([("a", 5), ("b", 3), ("c", 0)]);
        assert_eq!(choose(choices(), &none, &three, parity), ShardId(13));
        let all = choices().collect();
        assert_eq!(
            choose(choices(), &all, &loads(0, 0), parity),
            ShardId(10),
            "all taken: the first"
        );
    }

    #[test]
    fn on_one_home_a_pool_takes_its_first_choice_unless_another_pool_has_it() {
        let one = BTreeMap::from([("", 7)]);
        let home = |_| "";
        assert_eq!(
            choose(pool_choices("blue"), &BTreeSet::new(), &one, home),
            crate::placement::pool_shard("blue")
        );
        let taken = BTreeSet::from([crate::placement::pool_shard("blue")]);
        assert_eq!(
            choose(pool_choices("blue"), &taken, &one, home),
            pool_choices("blue").nth(1).unwrap()
        );
    }

    #[test]
    fn sixteen_pools_chosen_in_turn_split_evenly_over_three_homes() {
        // The homes by slot range, as a three-master cluster splits the slots.
        let home = |s: ShardId| match slot(&shard_tag("egress-proxy:", s)) {
            0..=5460 => "a",
            5461..=10922 => "b",
            _ => "c",
        };
        let mut loads = BTreeMap::from([("a", 0), ("b", 0), ("c", 0)]);
        let mut taken = BTreeSet::new();
        for i in 0..16 {
            let shard = choose(pool_choices(&format!("pool-{i:02}")), &taken, &loads, home);
            taken.insert(shard);
            *loads.get_mut(home(shard)).unwrap() += 1;
        }
        assert_eq!(taken.len(), 16);
        let mut counts: Vec<u64> = loads.into_values().collect();
        counts.sort_unstable();
        assert_eq!(counts, [5, 5, 6]);
    }

    #[test]
    fn a_stored_shard_reads_as_its_number_and_anything_else_as_none() {
        assert_eq!(parse(Some("4268")), Some(ShardId(4268)));
        for bad in [None, Some(""), Some("x"), Some("70000"), Some("-1")] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
