//! Which shards a call goes to (`placement.rs`, `directory.rs`).
//!
//! - A release, a renewal and a report go to the shard their lease id names.
//! - An acquire whose selector names a pool goes to the pool's shard (`pools.rs`; one that has
//!   none yet is chosen by the first acquire among the pool's members). One without a pool walks
//!   the shards the directory lists with an offered proxy (and, scoped to indexes, with a proxy
//!   in each), in a random order weighted by their healthy proxies, at most [`MAX_WALK`] of
//!   them, until one grants: each answers as the whole store did, among its own proxies. A
//!   refusal adds up what each shard tried counted.
//! - Candidates go each to its own shard, grouped: the first [`BATCH`] to the shards they are
//!   in, in order of their best candidate, for an idle one; then, when none had one, every
//!   candidate, shard by shard, for the best with room.
//! - A session lives in its lease's shard. Its shards are walked in an order fixed by the
//!   session's key (the same on every replica), so it is looked for, and started, alike.
//!
//! So with more than one shard the choice is the best within the shard that answers, not
//! across the fleet; capacity, cooldowns and sessions hold as before, each in its shard.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use egress_lease::{
    Candidate, Grant, LeaseRequest, Member, NoMatch, POOL_KEY, ProxyRef, Scope, Session, SessionRefused, StoreError,
    ViewEntry, index_name,
};
use futures::future::try_join_all;

use crate::calls::Answer;
use crate::directory::{Shards, listings};
use crate::placement::{MAX_WALK, Placement, ShardId, keyed_draw, random_draw, walk};
use crate::session::Step;
use crate::{BATCH, RedisStore};

/// Reads of a session in one acquire, at most: each further one follows another replica's
/// change to the session, and a session changes only when its lease starts, moves or ends.
const SESSION_READS: usize = 3;

/// The index names of an acquire scoped to indexes (none: the installation's).
fn index_names(scope: &Scope) -> Option<&[String]> {
    match scope {
        Scope::Listed => None,
        Scope::Installation => Some(&[]),
        Scope::Indexed(names) => Some(names),
    }
}

/// The pool an index scope names, if any.
fn pool_of(names: &[String]) -> Option<&str> {
    let prefix = index_name(POOL_KEY, "");
    names.iter().find_map(|n| n.strip_prefix(prefix.as_str()))
}

fn add(total: &mut NoMatch, n: NoMatch) {
    total.considered += n.considered;
    total.at_capacity += n.at_capacity;
    total.in_cooldown += n.in_cooldown;
    total.unhealthy += n.unhealthy;
}

/// Where one call's proxies are: the unpooled by the placement, the pooled by their pool's
/// stored shard.
pub(crate) struct Placed {
    placement: Placement,
    pools: HashMap<String, ShardId>,
}

impl Placed {
    /// The shard of the proxy `id` of `pool`; `None`: its pool has no shard yet.
    fn shard(&self, id: &str, pool: Option<&str>) -> Option<ShardId> {
        match pool {
            None => Some(self.placement.unpooled(id)),
            Some(pool) => self.pools.get(pool).copied(),
        }
    }
}

/// Each pool's members among `pools` (one entry per proxy; `None`: unpooled).
fn members<'p>(pools: impl Iterator<Item = Option<&'p str>>) -> BTreeMap<&'p str, u64> {
    let mut members = BTreeMap::new();
    for pool in pools.flatten() {
        *members.entry(pool).or_default() += 1;
    }
    members
}

/// Candidates by shard, each group in the caller's order, the groups in order of their first
/// (a candidate whose pool has no shard is left out).
fn grouped<'c>(placed: &Placed, candidates: &[Candidate<'c>]) -> Vec<(ShardId, Vec<Candidate<'c>>)> {
    let mut groups: Vec<(ShardId, Vec<Candidate<'c>>)> = Vec::new();
    let mut at: BTreeMap<ShardId, usize> = BTreeMap::new();
    for c in candidates {
        let Some(shard) = placed.shard(c.id, c.pool) else {
            continue;
        };
        let i = *at.entry(shard).or_insert_with(|| {
            groups.push((shard, Vec::new()));
            groups.len() - 1
        });
        groups[i].1.push(*c);
    }
    groups
}

/// How long the walk drawn for a scope is used again: the acquires of one scope that arrive
/// together then start at the same shard and go in one call of a round, where each drawing
/// its own sent a call per shard (on one Redis with 16 pools, two requests a call instead of
/// eighteen, and a third more of Redis's time per request). Over a second, some two hundred
/// draws still share the acquires among the shards by weight.
pub(crate) const WALK_HOLD: Duration = Duration::from_millis(5);
/// Scopes whose walk is held, at most (as many as selectors of indexed keys clients send).
const MAX_HELD_WALKS: usize = 256;

/// The walk last drawn for each scope (its index names), when, and from which copy of the
/// directory.
pub(crate) struct HeldWalks {
    hold: Duration,
    held: Mutex<HashMap<Vec<String>, Held>>,
}

struct Held {
    at: Instant,
    from: Arc<Shards>,
    order: Arc<Vec<ShardId>>,
}

impl HeldWalks {
    pub(crate) fn new(hold: Duration) -> Self {
        Self {
            hold,
            held: Mutex::default(),
        }
    }

    /// The walk held for `names` drawn from `directory`, or one `draw`n from it now (and held
    /// unless it is empty: a directory that lists no shard yet soon may).
    fn held_or_drawn(
        &self,
        names: &[String],
        directory: &Arc<Shards>,
        draw: impl FnOnce() -> Vec<ShardId>,
    ) -> Arc<Vec<ShardId>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.get(names)
            && h.at.elapsed() < self.hold
            && Arc::ptr_eq(&h.from, directory)
        {
            return h.order.clone();
        }
        let order = Arc::new(draw());
        if order.is_empty() {
            return order;
        }
        if held.len() >= MAX_HELD_WALKS {
            held.clear();
        }
        let h = Held {
            at: Instant::now(),
            from: directory.clone(),
            order: order.clone(),
        };
        held.insert(names.to_vec(), h);
        order
    }
}

/// A session acquire's candidates, read and grouped by shard only when needed: a session
/// that resumes its lease needs none.
struct SessionCandidates<'a, 'c> {
    unread: Option<&'a mut (dyn Iterator<Item = Candidate<'c>> + Send)>,
    groups: BTreeMap<ShardId, Vec<Candidate<'c>>>,
}

impl<'c> SessionCandidates<'_, 'c> {
    async fn groups(&mut self, store: &RedisStore) -> Result<&BTreeMap<ShardId, Vec<Candidate<'c>>>, StoreError> {
        if let Some(unread) = self.unread.take() {
            let all: Vec<Candidate<'c>> = unread.collect();
            let placed = store.placed(members(all.iter().map(|c| c.pool)), true).await?;
            self.groups = grouped(&placed, &all).into_iter().collect();
        }
        Ok(&self.groups)
    }
}

/// How a session's start went.
enum Started {
    /// Another replica gave the session a lease meanwhile: read it again.
    Changed,
    Done(Result<Grant, SessionRefused>),
}

impl RedisStore {
    /// Where the proxies of `pools` (each with its members) are. A pool without a stored shard
    /// gets one chosen now when `choose` (the pool's members are the caller's own proxies),
    /// else has none.
    pub(crate) async fn placed(&self, pools: BTreeMap<&str, u64>, choose: bool) -> Result<Placed, StoreError> {
        let mut known = self.pools.stored(&self.calls, pools.keys().copied()).await?;
        let new: Vec<(&str, u64)> = pools
            .iter()
            .filter(|(p, _)| !known.contains_key(**p))
            .map(|(p, n)| (*p, *n))
            .collect();
        if choose && !new.is_empty() {
            let directory = self.directory.now(&self.calls).await?;
            let chosen = self
                .pools
                .choose(&self.calls, &self.prefix, &new, &directory, &known)
                .await?;
            known.extend(chosen);
        }
        Ok(Placed {
            placement: self.placement,
            pools: known,
        })
    }

    /// The stored shard of the pool named `pool` (a selector's: none is chosen for it).
    async fn pool_shard(&self, pool: &str) -> Result<Option<ShardId>, StoreError> {
        let stored = self.pools.stored(&self.calls, std::iter::once(pool)).await?;
        Ok(stored.get(pool).copied())
    }

    /// The shard of the proxy `id` of `pool` as this replica last read it, if it has.
    fn last_placed(&self, id: &str, pool: Option<&str>) -> Option<ShardId> {
        match pool {
            None => Some(self.placement.unpooled(id)),
            Some(pool) => self.pools.last_read(pool),
        }
    }

    /// The shards a sweep and the count of all leases visit: the directory's, the unpooled
    /// ones, and those this replica has used.
    pub(crate) async fn listed_shards(&self) -> Result<BTreeSet<ShardId>, StoreError> {
        let mut shards: BTreeSet<ShardId> = self.directory.now(&self.calls).await?.keys().copied().collect();
        shards.extend(self.placement.unpooled_shards());
        shards.extend(self.kept().iter().map(|s| s.id));
        Ok(shards)
    }

    /// [`egress_lease::LeaseStore::active_leases`]: each shard asked for its proxies at once.
    pub(crate) async fn active_by_shard(&self, proxies: &[ProxyRef<'_>]) -> Result<Vec<usize>, StoreError> {
        let placed = self.placed(members(proxies.iter().map(|p| p.pool)), false).await?;
        let mut by_shard: BTreeMap<ShardId, Vec<usize>> = BTreeMap::new();
        for (i, p) in proxies.iter().enumerate() {
            // A pool without a shard has no leases.
            if let Some(shard) = placed.shard(p.id, p.pool) {
                by_shard.entry(shard).or_default().push(i);
            }
        }
        let counts = try_join_all(by_shard.iter().map(|(shard, at)| async move {
            let ids: Vec<&str> = at.iter().map(|i| proxies[*i].id).collect();
            self.shard(*shard).active(&ids).await.map(|(counts, _)| counts)
        }))
        .await?;
        let mut out = vec![0; proxies.len()];
        for ((_, at), counts) in by_shard.iter().zip(counts) {
            for (i, n) in at.iter().zip(counts) {
                out[*i] = n;
            }
        }
        Ok(out)
    }

    /// [`egress_lease::LeaseStore::acquire`].
    pub(crate) async fn acquire_routed<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
    ) -> Result<Result<Grant, NoMatch>, StoreError> {
        let mut refused = NoMatch::default();
        // The shards whose candidates decide; `None`: every shard's.
        let mut only = None;
        if let Some(names) = index_names(&req.scope) {
            let order = self.index_walk(names).await?;
            if !order.is_empty() {
                let mut unanswered = BTreeSet::new();
                for shard in order {
                    match self.shard(shard).acquire_indexed(req, names).await? {
                        Some(Ok(grant)) => return Ok(Ok(grant)),
                        Some(Err(n)) => add(&mut refused, n),
                        None => {
                            unanswered.insert(shard);
                        }
                    }
                }
                if unanswered.is_empty() {
                    return Ok(Err(refused));
                }
                only = Some(unanswered);
            }
        }
        // A candidate of a pool this replica has not read the shard of yet goes too.
        let mut kept = candidates.filter(|c| {
            only.as_ref()
                .is_none_or(|o| self.last_placed(c.id, c.pool).is_none_or(|s| o.contains(&s)))
        });
        self.acquire_listed(&mut kept, req, refused).await
    }

    /// The shards an acquire scoped to the indexes `names` tries, in order: a pool's own; else
    /// those the directory lists that may hold a proxy of every index (none without a
    /// directory, or for a pool without a shard: the candidates then decide).
    async fn index_walk(&self, names: &[String]) -> Result<Vec<ShardId>, StoreError> {
        if let Some(pool) = pool_of(names) {
            return Ok(self.pool_shard(pool).await?.into_iter().collect());
        }
        let directory = self.directory.now(&self.calls).await?;
        let order = self.walks.held_or_drawn(names, &directory, || {
            let weighted: Vec<(ShardId, u64)> = directory
                .iter()
                .filter(|(_, l)| l.offered > 0 && l.may_have(names))
                .map(|(s, l)| (*s, l.healthy))
                .collect();
            walk(&weighted, random_draw)
        });
        Ok(order.to_vec())
    }

    /// An acquire among the candidates, each sent to its shard.
    async fn acquire_listed<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
        mut refused: NoMatch,
    ) -> Result<Result<Grant, NoMatch>, StoreError> {
        let mut all: Vec<Candidate<'c>> = (&mut *candidates).take(BATCH).collect();
        let next = candidates.next();
        let groups = grouped(&self.placed(members(all.iter().map(|c| c.pool)), true).await?, &all);
        // One shard with every candidate: its run is the last.
        let last = next.is_none() && groups.len() == 1;
        let mut answered = BTreeSet::new();
        for (shard, group) in groups.iter().take(MAX_WALK) {
            match self.shard(*shard).acquire_listed(group, last, req).await? {
                Some(Ok(grant)) => return Ok(Ok(grant)),
                Some(Err(n)) => {
                    add(&mut refused, n);
                    answered.insert(*shard);
                }
                None => {}
            }
        }
        all.extend(next);
        all.extend(candidates);
        let placed = self.placed(members(all.iter().map(|c| c.pool)), true).await?;
        for (shard, group) in grouped(&placed, &all).iter().take(MAX_WALK) {
            if answered.contains(shard) {
                continue;
            }
            match self.shard(*shard).acquire_listed(group, true, req).await? {
                Some(Ok(grant)) => return Ok(Ok(grant)),
                Some(Err(n)) => add(&mut refused, n),
                None => return Err(StoreError("the final acquire run asked for more".to_owned())),
            }
        }
        Ok(Err(refused))
    }

    /// [`egress_lease::LeaseStore::acquire_session`]: the session looked for in its shards,
    /// resumed or moved; started when it has no live lease.
    pub(crate) async fn in_session<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        member: &Member<'c>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Result<Grant, SessionRefused>, StoreError> {
        let key = session.key();
        let mut listed = SessionCandidates {
            unread: Some(candidates),
            groups: BTreeMap::new(),
        };
        let order = self.session_walk(req, &key, &mut listed).await?;
        for _ in 0..SESSION_READS {
            if let Some((shard, lease, proxy)) = self.find_session(&order, &key).await? {
                let fit = member(&proxy).is_some_and(|c| c.healthy);
                match self.shard(shard).session_step(session, &key, &lease, fit, req).await? {
                    Step::Changed => continue,
                    Step::Resumed(grant) => return Ok(Ok(grant)),
                    Step::Free => {}
                }
            }
            match self
                .start_session(&order, listed.groups(self).await?, req, session)
                .await?
            {
                Started::Changed => continue,
                Started::Done(answer) => return Ok(answer),
            }
        }
        Err(StoreError(format!(
            "session {key}: changed by other replicas {SESSION_READS} times while this one asked for it"
        )))
    }

    /// The shards a session lives in, in its order: its pool's; else the directory's that may
    /// hold its proxies; without a directory (or a shard for its pool yet), those of its
    /// candidates.
    async fn session_walk(
        &self,
        req: &LeaseRequest,
        key: &str,
        listed: &mut SessionCandidates<'_, '_>,
    ) -> Result<Vec<ShardId>, StoreError> {
        let names = index_names(&req.scope).unwrap_or_default();
        let mut weighted: Vec<(ShardId, u64)> = Vec::new();
        if let Some(pool) = pool_of(names) {
            if let Some(shard) = self.pool_shard(pool).await? {
                return Ok(vec![shard]);
            }
        } else {
            let directory = self.directory.now(&self.calls).await?;
            weighted = directory
                .iter()
                .filter(|(_, l)| l.offered > 0 && l.may_have(names))
                .map(|(s, l)| (*s, l.offered))
                .collect();
        }
        if weighted.is_empty() {
            weighted = listed
                .groups(self)
                .await?
                .iter()
                .map(|(s, g)| (*s, g.len() as u64))
                .collect();
        }
        Ok(walk(&weighted, keyed_draw(key)))
    }

    /// [`egress_lease::LeaseStore::session_leases`]: the session looked for in every shard
    /// the directory lists and every unpooled shard, at once. A report on a session (rare: a
    /// ban seen inside a tunnel) has no selector to say which; the shards are bounded by the
    /// placement's choices.
    pub(crate) async fn leases_of_session(&self, key: &str) -> Result<Vec<String>, StoreError> {
        let directory = self.directory.now(&self.calls).await?;
        let shards: BTreeSet<ShardId> = directory
            .keys()
            .copied()
            .chain(self.placement.unpooled_shards())
            .collect();
        let found = try_join_all(
            shards
                .iter()
                .map(|s| async move { self.shard(*s).read_session(key).await }),
        )
        .await?;
        Ok(found.into_iter().flatten().map(|(lease, _)| lease).collect())
    }

    /// The session's lease and proxy, and its shard: the first of `order` that has one.
    async fn find_session(
        &self,
        order: &[ShardId],
        key: &str,
    ) -> Result<Option<(ShardId, String, String)>, StoreError> {
        let found = try_join_all(
            order
                .iter()
                .map(|s| async move { self.shard(*s).read_session(key).await }),
        )
        .await?;
        Ok(order
            .iter()
            .zip(found)
            .find_map(|(s, held)| held.map(|(lease, proxy)| (*s, lease, proxy))))
    }

    /// A new lease for the session from its candidates, shard by shard in its order.
    async fn start_session(
        &self,
        order: &[ShardId],
        groups: &BTreeMap<ShardId, Vec<Candidate<'_>>>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Started, StoreError> {
        let key = session.key();
        let bind = Some((key.as_str(), session.cap));
        let mut refused = NoMatch::default();
        for shard in order {
            let Some(group) = groups.get(shard) else { continue };
            let shard = self.shard(*shard);
            let first = &group[..group.len().min(BATCH)];
            let mut answer = shard.run_listed(first, group.len() <= BATCH, req, bind).await?;
            if answer == Answer::Candidates {
                answer = shard.run_listed(group, true, req, bind).await?;
            }
            match answer {
                Answer::SessionChanged => return Ok(Started::Changed),
                Answer::TooManySessions { held } => {
                    return Ok(Started::Done(Err(SessionRefused::TooMany { held, cap: session.cap })));
                }
                Answer::NoMatch(n) => add(&mut refused, n),
                Answer::Granted { sessions, .. } => {
                    if let Some(n) = sessions {
                        shard.note_sessions(session.client, n);
                    }
                    return match shard.answer(answer, req) {
                        Some(Ok(grant)) => Ok(Started::Done(Ok(grant))),
                        _ => Err(StoreError("a grant did not read as one".to_owned())),
                    };
                }
                Answer::Candidates | Answer::Taken { .. } => {
                    return Err(StoreError("the final acquire run asked for more".to_owned()));
                }
            }
        }
        Ok(Started::Done(Err(SessionRefused::NoMatch(refused))))
    }

    /// [`egress_lease::LeaseStore::publish_view`]: each shard's part of the view to its shard
    /// (nothing to a shard the last publication placed proxies in and this one does not, which
    /// empties its view), then the directory.
    pub(crate) async fn publish(&self, view: &[ViewEntry]) -> Result<(), StoreError> {
        let mut published = self.published.lock().await;
        let placed = self
            .placed(members(view.iter().map(|e| e.pool.as_deref())), true)
            .await?;
        let mut by_shard: BTreeMap<ShardId, Vec<&ViewEntry>> = BTreeMap::new();
        for e in view {
            if let Some(shard) = placed.shard(&e.id, e.pool.as_deref()) {
                by_shard.entry(shard).or_default().push(e);
            }
        }
        // The shards a publication before this one placed proxies in: this replica's last, or
        // on its first, the directory's (another replica's, or this one's before a restart).
        let before = match published.take() {
            Some(before) => before,
            None => self.directory.held(&self.calls).await?,
        };
        for gone in before.iter().filter(|s| !by_shard.contains_key(s)) {
            self.shard(*gone).publish(&[]).await?;
        }
        for (shard, entries) in &by_shard {
            self.shard(*shard).publish(entries).await?;
        }
        self.directory.write(&self.calls, &before, listings(&by_shard)).await?;
        *published = Some(by_shard.into_keys().collect());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_count_each_pools_proxies() {
        let pools = [Some("x"), None, Some("y"), Some("x")];
        assert_eq!(members(pools.into_iter()), BTreeMap::from([("x", 2), ("y", 1)]));
    }

    #[test]
    fn a_scope_names_a_pool_only_with_a_pool_index() {
        let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(pool_of(&names(&["geo=eu", "pool=blue"])), Some("blue"));
        assert_eq!(pool_of(&names(&["geo=eu"])), None);
        assert_eq!(pool_of(&names(&["pooled=x"])), None);
        assert_eq!(index_names(&Scope::Listed), None);
        assert_eq!(index_names(&Scope::Installation), Some(&[][..]));
    }

    #[test]
    fn a_scopes_walk_is_held_for_the_hold_and_drawn_again_after() {
        let names = vec!["geo=eu".to_owned()];
        let draws = std::cell::Cell::new(0u16);
        let draw = || {
            draws.set(draws.get() + 1);
            vec![ShardId(draws.get())]
        };
        let (one, other) = (Arc::new(Shards::new()), Arc::new(Shards::new()));
        let held = HeldWalks::new(Duration::from_secs(3600));
        assert_eq!(*held.held_or_drawn(&names, &one, draw), [ShardId(1)]);
        assert_eq!(*held.held_or_drawn(&names, &one, draw), [ShardId(1)], "held");
        assert_eq!(
            *held.held_or_drawn(&[], &one, draw),
            [ShardId(2)],
            "another scope draws its own"
        );
        assert_eq!(
            *held.held_or_drawn(&names, &other, draw),
            [ShardId(3)],
            "another directory too"
        );
        let never = HeldWalks::new(Duration::ZERO);
        assert_eq!(*never.held_or_drawn(&names, &one, draw), [ShardId(4)]);
        assert_eq!(*never.held_or_drawn(&names, &one, draw), [ShardId(5)], "drawn again");
        let tier = ["tier=x".to_owned()];
        assert!(held.held_or_drawn(&tier, &one, Vec::new).is_empty());
        assert_eq!(
            *held.held_or_drawn(&tier, &one, draw),
            [ShardId(6)],
            "an empty walk is not held"
        );
    }

    #[test]
    fn candidates_group_by_shard_in_order_of_their_first() {
        let placed = Placed {
            placement: Placement::new(1).unwrap(),
            pools: HashMap::from([("x".to_owned(), ShardId(300)), ("y".to_owned(), ShardId(301))]),
        };
        let c = |id: &'static str, pool: Option<&'static str>| Candidate {
            id,
            healthy: true,
            latency_millis: 1,
            max_leases: 1,
            pool,
        };
        let listed = [
            c("ns/a", Some("x")),
            c("ns/b", None),
            c("ns/c", Some("x")),
            c("ns/d", Some("y")),
            c("ns/e", Some("no shard yet")),
        ];
        let groups = grouped(&placed, &listed);
        let shape: Vec<(ShardId, Vec<&str>)> = groups
            .iter()
            .map(|(s, g)| (*s, g.iter().map(|c| c.id).collect()))
            .collect();
        assert_eq!(
            shape,
            [
                (ShardId(300), vec!["ns/a", "ns/c"]),
                (ShardId(0), vec!["ns/b"]),
                (ShardId(301), vec!["ns/d"]),
            ]
        );
    }
}
