//! Publishing the leader's view to Redis (`lua/publish.lua`), in chunks of at most
//! [`PUBLISH_CHUNK`] proxies: a fleet of 100 000 published in one run held Redis for 1.4 s on
//! the bench machine, every lease call of every replica waiting behind it.
//!
//! A replica that published last sends only what changed since; otherwise (the first
//! publication, another replica published since, the view expired) it reads which proxies
//! Redis holds (`HSCAN`, a thousand at a time), and sends its whole view and the removal of the
//! rest. Only the leader publishes, but for a moment around a change of leader two replicas
//! may: the one whose changes no longer apply takes the view over at once, and one that finds
//! its whole publication taken over between two chunks, or the view holding proxies it has
//! not, leaves it be and publishes whole next time. Either way the view settles on the
//! publisher that goes on. Each chunk leaves the view, its counts and its index in step, so an acquire between two
//! chunks is answered from a view where each proxy is as one publication or the other has it.

use std::collections::{HashMap, HashSet};

use egress_lease::{StoreError, ViewEntry, lease_id};

use crate::functions::Op;
use crate::shard::Shard;
use crate::{VIEW_LIFETIME, duration_millis};

/// The most proxies (set or removed) one publication run carries.
pub const PUBLISH_CHUNK: usize = 1000;

/// `HSCAN` rounds while reading which proxies the view holds, at most (ten million proxies at
/// a thousand a round, far past any fleet's cap): a Redis that keeps answering with a cursor
/// cannot hold the publisher forever.
const MAX_SCAN_ROUNDS: usize = 10_000;

/// This replica's last publication of the view.
pub(crate) struct Published {
    /// Names it in Redis: changes apply only over it.
    token: String,
    /// Proxy id to its entry, as published.
    entries: HashMap<String, String>,
}

/// How a publication's first chunk applies.
#[derive(Clone, Copy)]
enum First<'a> {
    /// Only over the publication with this token.
    Changes(&'a str),
    /// Over whatever is there.
    Take,
}

impl Shard {
    /// Publishes the shard's part of the view.
    pub(crate) async fn publish(&self, view: &[&ViewEntry]) -> Result<(), StoreError> {
        let entries: HashMap<String, String> = view
            .iter()
            .map(|e| {
                let mut value = format!(
                    "{},{},{},{}",
                    u8::from(e.healthy),
                    e.latency_millis,
                    e.max_leases,
                    u8::from(e.offered)
                );
                // Each index after a NUL (`lua/index.lua`); a name holding one is left out.
                for name in e.indexed.iter().filter(|n| !n.is_empty() && !n.contains('\0')) {
                    value.push('\0');
                    value.push_str(name);
                }
                (e.id.clone(), value)
            })
            .collect();
        let token = lease_id();
        let mut published = self.published.lock().await;
        // What changed since this replica's last publication, when it has one: a fleet whose
        // latencies move costs Redis a step per proxy that moved, not per proxy.
        if let Some(last) = published.take() {
            let removed: Vec<&str> = last
                .entries
                .keys()
                .filter(|id| !entries.contains_key(*id))
                .map(String::as_str)
                .collect();
            let set: Vec<(&str, &str)> = entries
                .iter()
                .filter(|(id, value)| last.entries.get(*id) != Some(*value))
                .map(|(id, value)| (id.as_str(), value.as_str()))
                .collect();
            let size = self.chunks(First::Changes(&last.token), &token, &removed, &set).await?;
            // A view of another size holds proxies this one has not (another replica wrote
            // them while this one published): the next publication is whole, and removes them.
            if size == Some(entries.len()) {
                *published = Some(Published { token, entries });
                return Ok(());
            }
            if size.is_some() {
                return Ok(());
            }
            // Another replica published since: this one, the leader, takes the view back.
        }
        // The whole view, and the removal of every proxy Redis holds that it has not.
        let held = self.view_ids().await?;
        let removed: Vec<&str> = held
            .iter()
            .filter(|id| !entries.contains_key(*id))
            .map(String::as_str)
            .collect();
        let set: Vec<(&str, &str)> = entries.iter().map(|(id, v)| (id.as_str(), v.as_str())).collect();
        match self.chunks(First::Take, &token, &removed, &set).await? {
            Some(size) if size == entries.len() => *published = Some(Published { token, entries }),
            // Another replica took the view over between two chunks, or wrote proxies into it
            // after they were read: this replica publishes whole again next time.
            _ => tracing::debug!("another replica published the view while this one did"),
        }
        Ok(())
    }

    /// Sends a publication in chunks: the number of proxies in the view after the last, or
    /// `None` when a chunk did not apply (see `First`).
    async fn chunks(
        &self,
        first: First<'_>,
        token: &str,
        removed: &[&str],
        set: &[(&str, &str)],
    ) -> Result<Option<usize>, StoreError> {
        let whole = if matches!(first, First::Take) { "1" } else { "0" };
        let lifetime = duration_millis(VIEW_LIFETIME).to_string();
        let (mut removed, mut set) = (removed, set);
        let mut first = Some(first);
        loop {
            let take_removed = removed.len().min(PUBLISH_CHUNK);
            let take_set = set.len().min(PUBLISH_CHUNK - take_removed);
            let (mode, guard) = match first.take() {
                Some(First::Changes(last)) => ("changes", last),
                Some(First::Take) => ("take", ""),
                None => ("more", token),
            };
            let mut args = Vec::with_capacity(6 + take_removed + 2 * take_set);
            args.extend([
                lifetime.clone(),
                mode.to_owned(),
                guard.to_owned(),
                token.to_owned(),
                whole.to_owned(),
                take_removed.to_string(),
            ]);
            args.extend(removed[..take_removed].iter().map(|id| (*id).to_owned()));
            for (id, value) in &set[..take_set] {
                args.push((*id).to_owned());
                args.push((*value).to_owned());
            }
            let size: i64 = self.calls.run(Op::Publish, &args).await?;
            let Ok(size) = usize::try_from(size) else {
                return Ok(None);
            };
            (removed, set) = (&removed[take_removed..], &set[take_set..]);
            if removed.is_empty() && set.is_empty() {
                return Ok(Some(size));
            }
        }
    }

    /// The ids of the proxies the view in Redis holds.
    async fn view_ids(&self) -> Result<HashSet<String>, StoreError> {
        let key = format!("{}view", self.calls.tag);
        let (mut ids, mut cursor) = (HashSet::new(), 0u64);
        for _ in 0..MAX_SCAN_ROUNDS {
            let mut scan = redis::cmd("HSCAN");
            scan.arg(&key).arg(cursor).arg("COUNT").arg(PUBLISH_CHUNK);
            let (next, pairs): (u64, Vec<String>) = self.calls.query(&scan).await?;
            ids.extend(pairs.into_iter().step_by(2));
            if next == 0 {
                return Ok(ids);
            }
            cursor = next;
        }
        Err(StoreError(format!(
            "redis {}: the view did not scan to its end in {MAX_SCAN_ROUNDS} rounds",
            self.calls.shown
        )))
    }
}
