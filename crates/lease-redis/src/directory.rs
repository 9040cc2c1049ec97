//! The directory of shards: which shards the published view placed proxies in, and for each
//! its offered proxies, the healthy ones among them and the indexes they are in. The publisher
//! writes it whole with each publication to `{<prefix>}shards` (a hash: shard number to
//! [`Listing`]); every replica reads it at most once per [`REFRESH`], and an acquire without a
//! pool walks the shards it lists.
//!
//! A replica whose copy is a moment old may miss a shard that just got its first proxy (its
//! acquires without a pool find it at the next read) or try one that just lost its last (which
//! answers that it has nothing).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_lease::{StoreError, ViewEntry};

use crate::calls::Calls;
use crate::placement::ShardId;
use crate::{VIEW_LIFETIME, duration_millis};

/// How old a replica's copy of the directory may be before an acquire reads it again.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);
/// Indexes a shard's listing names, at most: a shard with more is listed as having any.
pub(crate) const MAX_LISTED_INDEXES: usize = 64;

/// One shard as the directory lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Listing {
    /// Its offered proxies.
    pub(crate) offered: u64,
    /// Of those, the healthy: what an acquire's walk weighs it by.
    pub(crate) healthy: u64,
    /// The indexes its offered proxies are in; `None`: more than [`MAX_LISTED_INDEXES`].
    pub(crate) indexes: Option<BTreeSet<String>>,
}

pub(crate) type Shards = BTreeMap<ShardId, Listing>;

impl Listing {
    /// Whether an acquire scoped to the indexes `names` may find a proxy here.
    pub(crate) fn may_have(&self, names: &[String]) -> bool {
        self.indexes
            .as_ref()
            .is_none_or(|listed| names.iter().all(|n| listed.contains(n)))
    }

    /// `<offered>,<healthy>` and each index after a NUL (`*` for any).
    fn encode(&self) -> String {
        let mut out = format!("{},{}", self.offered, self.healthy);
        match &self.indexes {
            Some(names) => {
                for name in names {
                    out.push('\0');
                    out.push_str(name);
                }
            }
            None => out.push_str("\0*"),
        }
        out
    }

    fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split('\0');
        let (offered, healthy) = parts.next()?.split_once(',')?;
        let names: Vec<&str> = parts.collect();
        Some(Self {
            offered: offered.parse().ok()?,
            healthy: healthy.parse().ok()?,
            indexes: (names != ["*"]).then(|| names.into_iter().map(str::to_owned).collect()),
        })
    }
}

/// Each shard's listing, of the view's proxies placed in it (`by_shard`).
pub(crate) fn listings(by_shard: &BTreeMap<ShardId, Vec<&ViewEntry>>) -> Shards {
    by_shard.iter().map(|(s, entries)| (*s, listing(entries))).collect()
}

fn listing(entries: &[&ViewEntry]) -> Listing {
    let mut listing = Listing {
        indexes: Some(BTreeSet::new()),
        ..Listing::default()
    };
    for e in entries.iter().filter(|e| e.offered) {
        listing.offered += 1;
        listing.healthy += u64::from(e.healthy);
        if let Some(names) = &mut listing.indexes {
            names.extend(e.indexed.iter().cloned());
            if names.len() > MAX_LISTED_INDEXES {
                listing.indexes = None;
            }
        }
    }
    listing
}

/// A replica's copy of the directory.
pub(crate) struct Directory {
    /// When it was read (or written by this replica), and what it held.
    copy: tokio::sync::Mutex<(Option<Instant>, Arc<Shards>)>,
}

impl Directory {
    pub(crate) fn new() -> Self {
        Self {
            copy: tokio::sync::Mutex::new((None, Arc::default())),
        }
    }

    /// The directory, read again when this replica's copy is older than [`REFRESH`].
    pub(crate) async fn now(&self, calls: &Calls) -> Result<Arc<Shards>, StoreError> {
        // Held while reading: the acquires that find the copy old meanwhile wait for this read.
        let mut copy = self.copy.lock().await;
        if copy.0.is_none_or(|at| at.elapsed() >= REFRESH) {
            *copy = (Some(Instant::now()), Arc::new(read(calls).await?));
        }
        Ok(copy.1.clone())
    }

    /// Writes `shards` as the whole directory (`held`: the shards it held before), and keeps
    /// them as this replica's copy. The new listings go in before the gone are taken out, so a
    /// replica reading in between sees every shard of both.
    pub(crate) async fn write(
        &self,
        calls: &Calls,
        held: &BTreeSet<ShardId>,
        shards: Shards,
    ) -> Result<(), StoreError> {
        let key = key(calls);
        let mut pipe = redis::pipe();
        if !shards.is_empty() {
            let fields: Vec<(String, String)> = shards.iter().map(|(s, l)| (s.0.to_string(), l.encode())).collect();
            pipe.hset_multiple(&key, &fields).ignore();
        }
        let gone: Vec<String> = held
            .iter()
            .filter(|s| !shards.contains_key(s))
            .map(|s| s.0.to_string())
            .collect();
        if !gone.is_empty() {
            pipe.hdel(&key, gone).ignore();
        }
        pipe.pexpire(&key, i64::try_from(duration_millis(VIEW_LIFETIME)).unwrap_or(i64::MAX))
            .ignore();
        calls.query_pipe::<()>(&pipe).await?;
        *self.copy.lock().await = (Some(Instant::now()), Arc::new(shards));
        Ok(())
    }

    /// The shards the directory in Redis lists now, read afresh.
    pub(crate) async fn held(&self, calls: &Calls) -> Result<BTreeSet<ShardId>, StoreError> {
        Ok(read(calls).await?.into_keys().collect())
    }
}

fn key(calls: &Calls) -> String {
    format!("{}shards", calls.tag)
}

/// The directory as Redis holds it; a field that does not read as a listing is left out.
async fn read(calls: &Calls) -> Result<Shards, StoreError> {
    let mut get = redis::cmd("HGETALL");
    get.arg(key(calls));
    let fields: BTreeMap<String, String> = calls.query(&get).await?;
    Ok(fields
        .iter()
        .filter_map(|(shard, listing)| Some((ShardId(shard.parse().ok()?), Listing::decode(listing)?)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, healthy: bool, offered: bool, indexed: &[&str]) -> ViewEntry {
        ViewEntry {
            id: id.into(),
            healthy,
            latency_millis: 1,
            max_leases: 1,
            offered,
            indexed: indexed.iter().map(|n| (*n).to_owned()).collect(),
            pool: None,
        }
    }

    #[test]
    fn a_shard_is_listed_with_its_offered_healthy_proxies_and_indexes() {
        let (a, b, c) = (
            entry("ns/a", true, true, &["geo=de"]),
            entry("ns/b", false, true, &["geo=fr"]),
            entry("ns/c", true, false, &["geo=us"]),
        );
        let m = entry("ns/m", true, true, &["pool=blue"]);
        let by_shard = BTreeMap::from([(ShardId(0), vec![&a, &b, &c]), (ShardId(300), vec![&m])]);
        let shards = listings(&by_shard);
        let unpooled = &shards[&ShardId(0)];
        assert_eq!((unpooled.offered, unpooled.healthy), (2, 1));
        assert!(unpooled.may_have(&["geo=de".into()]) && unpooled.may_have(&["geo=fr".into()]));
        assert!(!unpooled.may_have(&["geo=us".into()]), "not offered: not listed");
        let blue = &shards[&ShardId(300)];
        assert_eq!((blue.offered, blue.healthy), (1, 1));
        assert!(!blue.may_have(&["geo=de".into()]));
    }

    #[test]
    fn a_shard_with_many_indexes_is_listed_as_having_any() {
        let view: Vec<ViewEntry> = (0..=MAX_LISTED_INDEXES)
            .map(|i| entry(&format!("ns/{i}"), true, true, &[&format!("geo=g{i}")]))
            .collect();
        let listed = listing(&view.iter().collect::<Vec<_>>());
        assert_eq!(listed.indexes, None);
        assert!(listed.may_have(&["tier=anything".into()]));
    }

    #[test]
    fn listings_read_back_as_written() {
        let some = Listing {
            offered: 5,
            healthy: 3,
            indexes: Some(["geo=de".to_owned(), "pool=blue".to_owned()].into()),
        };
        let none = Listing {
            indexes: None,
            ..some.clone()
        };
        let empty = Listing {
            indexes: Some(BTreeSet::new()),
            ..some.clone()
        };
        for l in [some, none, empty] {
            assert_eq!(Listing::decode(&l.encode()), Some(l.clone()), "{:?}", l.encode());
        }
        for bad in ["", "5", "x,1", "1,y\0geo=de"] {
            assert_eq!(Listing::decode(bad), None, "{bad:?}");
        }
    }
}
