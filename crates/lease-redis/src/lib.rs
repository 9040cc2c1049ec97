//! The lease store on Redis: every replica of the discovery API shares leases, capacity and
//! cooldowns, and a restart loses nothing that Redis kept.
//!
//! Each operation is one Lua script, run as a function of a library the store loads into
//! Redis (`functions.rs`), so Redis runs it atomically: acquire decides capacity,
//! cooldowns and the selection order inside Redis, and two replicas can never both take a
//! proxy's last slot. The scripts read Redis's own clock, so replicas agree on the time
//! whatever theirs say (tests inject a clock with [`RedisStore::with_clock`]).
//!
//! The state is in shards (`placement.rs`): each pool's, and the unpooled proxies' over
//! [`RedisStore::with_unpooled_shards`] shards. A shard's keys start with its hash tag,
//! `{<prefix>}` for shard 0 (the tag of the layout before shards) and `{<prefix>|s<n>}` for
//! shard `n` (default prefix [`DEFAULT_PREFIX`]), and each has a TTL so nothing outlives its
//! use. On a Redis Cluster every key of one shard is in one slot, so each script runs on one
//! node, and the shards spread over the masters. `route.rs` sends each call to its shards.
//!
//! | Key (in each shard) | Type | Holds | Lives |
//! |---|---|---|---|
//! | `lease:<id>` | string | `<expires (ms)>,<target digest>,<proxy>` | until one cooldown window (at least [`EXPIRY_GRACE`]) after its expiry, or until it is among the oldest beyond the newest [`MAX_ENDED`] ended leases |
//! | `active:<proxy>` | sorted set | the proxy's unreleased leases by expiry | [`EXPIRY_GRACE`] past its last lease's expiry |
//! | `all` | sorted set | every unreleased lease by expiry | [`EXPIRY_GRACE`] past the last lease's expiry |
//! | `ended` | list | leases released or found expired, oldest first | as long as the longest-lived record it names; at most [`MAX_ENDED`] entries |
//! | `cool:<proxy>` | hash | cooldown end (ms) by target digest (`""`: global); at most [`MAX_COOLDOWN_TARGETS`] targets | one cooldown window after the last report |
//! | `view` | hash | `healthy,latency,max,offered` and, after a NUL each, the indexes it is in, by proxy id, as published | [`VIEW_LIFETIME`] after the last publication |
//! | `count` | hash | the view's offered and unhealthy proxies, and its publication's token; per index `o:<name>`, `u:<name>` | as the view |
//! | `free` | sorted set | the installation's index: the view's offered, healthy proxies with room, by (active leases, latency, id) | as the view |
//! | `free:<key>=<value>` | sorted set | the same, of the proxies whose indexed attribute `key` is `value` | as the view |
//! | `indexes` | set | the names of the attribute indexes (what each publication keeps alive) | as the view |
//! | `session:<client>/<name>` | string | `<lease>,<proxy>`: the session's lease | [`EXPIRY_GRACE`] past its lease's expiry, or until the lease is released |
//! | `lsess:<lease>` | string | the session (`<client>/<name>`) the lease is of | as the lease's record |
//! | `sessions:<client>` | sorted set | the client's sessions by their lease's expiry; at most its cap live | [`EXPIRY_GRACE`] past the last lease's expiry |
//! | `session-clients` | set | the clients with sessions (the sweep counts each one's) | as the longest-lived `sessions:` |
//!
//! And under shard 0's tag, `shards` (a hash): the directory of the shards the published view
//! places proxies in (`directory.rs`), living as the view; and `pool:<name>` (a string): the
//! pool's shard, chosen once (`pools.rs`), living [`POOL_LIFETIME`](pools::POOL_LIFETIME)
//! past its last read.
//!
//! An acquire scoped to the installation ([`Scope::Installation`], an empty selector) is
//! answered from `free`: its head, passing over at most [`INDEX_LOOK`] proxies that cool down
//! for the request. One scoped to attribute indexes ([`Scope::Indexed`], a selector whose every
//! key is indexed) is answered the same way from the smallest of its indexes, passing over the
//! proxies that are not in the others too. Every script that grants or ends a lease, and every
//! publication, moves the proxies it touches in `free` and in their indexes, so an acquire, a
//! release, a report and the expiry of a lease each do a bounded amount of work whatever the
//! fleet's size (one step per index a proxy is in). Other selectors send their candidates (at
//! most [`BATCH`] at first, every one when those are busy).
//!
//! Those installation-wide acquires, and all releases, go to Redis in rounds (`gather.rs`,
//! `calls::Rounds`): the requests that arrive while a round is on its way go together in the
//! next, its releases in one call and its acquires in another, handed to Redis at once so that
//! one sync of its append-only file covers both; each script answers its requests in turn, as
//! if they had come one after another.
//!
//! Sessions and renewal (`session.rs`) extend a lease in place: its expiry in `all`, in its
//! proxy's set, in its record and in its session's keys.
//!
//! The scripts need Redis 7.0 or later (Functions, `PEXPIRE` with `GT`/`NX`, `LPOP` with a count).
//!
//! When Redis cannot be reached every call fails with [`StoreError`] within about two
//! [`CALL_BUDGET`]s (one waiting for a batch, one for its own call; the API answers 503) and
//! nothing is granted; the connection is made again
//! by itself at the next call once Redis is back.

mod calls;
mod connection;
mod directory;
mod functions;
mod gather;
mod homes;
mod placement;
mod pools;
mod publish;
mod route;
mod session;
mod shard;
mod tls;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use egress_lease::{
    Candidate, Clock, Fit, Grant, LeaseRequest, LeaseStore, MAX_ENDED, Member, NoMatch, NotRenewed, ProxyRef,
    ReportResult, Session, SessionRefused, StoreError, Target, UnknownLease, ViewEntry,
};

use crate::calls::{Calls, Rounds};
pub use crate::connection::shown_url;
use crate::connection::{Current, split_wait};
use crate::directory::Directory;
use crate::functions::{Library, Op};
use crate::gather::Gather;
pub use crate::homes::ShardHome;
pub use crate::placement::{MAX_UNPOOLED_SHARDS, MAX_WALK, ShardId};
use crate::placement::{Placement, shard_of_lease, shard_tag};
pub use crate::publish::PUBLISH_CHUNK;
use crate::shard::Shard;
pub use crate::tls::{ClientIdentity, Tls, TlsRoots};

/// The key prefix unless told otherwise.
pub const DEFAULT_PREFIX: &str = "egress-proxy:";
/// The most one store call may take, connecting included.
pub const CALL_BUDGET: Duration = Duration::from_secs(3);
/// Candidates in an acquire's first script run. The first idle eligible candidate ends the
/// search, so on a fleet with free proxies that run is all it takes; otherwise a second run
/// gets every candidate.
pub const BATCH: usize = 64;
/// How long a published view stays without being published again.
pub const VIEW_LIFETIME: Duration = Duration::from_secs(300);
/// The proxies at the head of the installation's index an acquire looks at, at most: those
/// with room but cooling down for the request are passed over; beyond this many the caller's
/// candidates are read instead.
pub const INDEX_LOOK: usize = 128;
/// How long a grant waits for its replicas with the URL's `wait`, at most.
pub const WAIT_BUDGET: Duration = Duration::from_secs(1);
/// How long past its expiry a lease stays in the indexes and its record, at least (`GRACE` in
/// `lua/index.lua`): its expiry is noticed by reading them, by an acquire or by the sweep.
pub const EXPIRY_GRACE: Duration = Duration::from_secs(360);
/// Indexed acquire runs that may each move a thousand expired leases before the choice, at
/// most; past them the caller's candidates decide.
pub const EXPIRY_RUNS: usize = 4;
/// Shards a replica keeps its counts for, at most; a call for a shard beyond them
/// (a lease id someone made up names any) goes alone.
const MAX_KEPT_SHARDS: usize = 4096;

/// Milliseconds since the epoch.
fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn duration_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The scheme of a Redis Cluster's URL.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";
/// The scheme of a Redis Cluster's URL over TLS.
pub const TLS_CLUSTER_SCHEME: &str = "rediss+cluster://";

/// The lease store on one Redis server, or on a Redis Cluster: its state in shards, each in
/// one slot (`placement.rs`).
pub struct RedisStore {
    /// What every shard's calls share; its tag is shard 0's, which also holds the directory.
    calls: Calls,
    prefix: String,
    placement: Placement,
    /// The shards this replica has called, by id.
    shards: Mutex<HashMap<ShardId, Arc<Shard>>>,
    /// Every shard's indexed acquires and releases, sent to Redis in rounds.
    rounds: Arc<Gather<Rounds>>,
    directory: Directory,
    /// Each pool's shard, as stored.
    pools: pools::Pools,
    /// The walk each scope's acquires without a pool take, drawn anew every few milliseconds.
    walks: route::HeldWalks,
    /// The shards this replica's last publication placed proxies in; `None` before its first.
    published: tokio::sync::Mutex<Option<std::collections::BTreeSet<ShardId>>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("redis", &self.calls.shown)
            .field("keys", &self.calls.tag)
            .field("placement", &self.placement)
            .field("cooldown", &self.calls.cooldown)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on the Redis at `url` (`redis://[user:password@]host:port[/db]`, or
    /// `redis+cluster://[user:password@]host:port[,host:port…]` for a Redis Cluster; `rediss`
    /// for either over TLS, the server checked against the system's CA certificates), keys under
    /// `{<prefix>}` and `{<prefix>|s<shard>}`, with the cooldown window (and lease retention
    /// after expiry) `cooldown`, on Redis's clock, the unpooled proxies in one shard.
    /// Connects lazily: a Redis that is down at start only makes calls fail until it is up.
    /// Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The URL is not a Redis URL, or the prefix holds a brace (it would break the hash tag).
    pub fn new(url: &str, prefix: &str, cooldown: Duration) -> Result<Self, String> {
        Self::new_with_tls(url, prefix, cooldown, &Tls::default())
    }

    /// [`new`](Self::new), over TLS as `tls` says: what the server's certificate must chain
    /// to, and the certificate the store shows it. TLS uses rustls's process-wide crypto
    /// provider (the operator installs ring at start); a program that builds in more than one
    /// provider installs one before its first call.
    ///
    /// # Errors
    /// As [`new`](Self::new); also CA certificates or a client certificate given for a URL
    /// without TLS, and a URL fragment (the client library's `#insecure` would turn the check
    /// off).
    pub fn new_with_tls(url: &str, prefix: &str, cooldown: Duration, tls: &Tls) -> Result<Self, String> {
        Self::new_with_password(url, prefix, cooldown, tls, None)
    }

    /// [`new_with_tls`](Self::new_with_tls), with `password` (when given) as the credentials'
    /// password, which the URL must then not hold: the password kept out of the URL (a file
    /// the operator follows, never the process list).
    ///
    /// # Errors
    /// As [`new_with_tls`](Self::new_with_tls); also a password given both ways.
    pub fn new_with_password(
        url: &str,
        prefix: &str,
        cooldown: Duration,
        tls: &Tls,
        password: Option<&str>,
    ) -> Result<Self, String> {
        let shown = shown_url(url);
        check_prefix(prefix)?;
        let (url, wait_replicas) = split_wait(url).map_err(|e| format!("lease store {shown}: {e}"))?;
        let connection = Current::open(&url, tls, password).map_err(|e| format!("lease store {shown}: {e}"))?;
        let calls = Calls {
            connection: Arc::new(connection),
            library: Arc::new(Library::new()),
            tag: shard_tag(prefix, ShardId(0)),
            clock: None,
            cooldown,
            max_ended: MAX_ENDED,
            shown,
            wait_replicas,
        };
        Ok(Self::on(calls, prefix, Placement::new(1)?))
    }

    /// Makes the store's calls from now on go over a new connection made with `tls`: a renewed
    /// client certificate or a rotated CA takes effect without a new store (the operator
    /// re-reads its TLS files). Calls on their way end on the connection they started on;
    /// leases and everything else in Redis are untouched. Every store made from this one
    /// (`with_*`) shares its connection, and so the change.
    ///
    /// # Errors
    /// As [`new_with_tls`](Self::new_with_tls) for the store's URL; the connection in use
    /// then stays.
    pub fn use_tls(&self, tls: &Tls) -> Result<(), String> {
        self.calls
            .connection
            .replace(Some(tls), None)
            .map_err(|e| format!("lease store {}: {e}", self.calls.shown))
    }

    /// As [`use_tls`](Self::use_tls), for a changed password (one given apart from the URL):
    /// the store's calls from now on go over a connection that authenticates with it.
    ///
    /// # Errors
    /// The store's URL holds a password itself; the connection in use then stays.
    pub fn use_password(&self, password: &str) -> Result<(), String> {
        self.calls
            .connection
            .replace(None, Some(password))
            .map_err(|e| format!("lease store {}: {e}", self.calls.shown))
    }

    fn on(calls: Calls, prefix: &str, placement: Placement) -> Self {
        Self {
            calls,
            prefix: prefix.to_owned(),
            placement,
            shards: Mutex::default(),
            rounds: Arc::new(Gather::new(Arc::new(Rounds))),
            directory: Directory::new(),
            pools: pools::Pools::new(),
            walks: route::HeldWalks::new(route::WALK_HOLD),
            published: tokio::sync::Mutex::new(None),
        }
    }

    /// A store like this one (same connection), with `calls` changed by `change`.
    fn remade(self, change: impl FnOnce(&mut Calls)) -> Self {
        let mut calls = self.calls.clone();
        change(&mut calls);
        Self::on(calls, &self.prefix, self.placement)
    }

    /// Each operation's name (`acquire`, `acquire_indexed`, `release`, `report`, `active`,
    /// `sweep`, `publish`, `session`, `renew`) and its function's (what `FCALL` and Redis's
    /// slow log name it by), for benches and diagnostics that attribute Redis's time to the
    /// operations.
    pub fn function_names(&self) -> Vec<(&'static str, String)> {
        Op::ALL
            .iter()
            .map(|op| (op.name(), self.calls.library.function(*op)))
            .collect()
    }

    /// The same store keeping at most `max_ended` ended leases reportable in each shard (tests
    /// of the bound).
    #[must_use]
    pub fn with_max_ended(self, max_ended: usize) -> Self {
        self.remade(|c| c.max_ended = max_ended)
    }

    /// The same store (and connection) with its keys under `prefix`: a caller that checks the
    /// URL and TLS settings before it knows the prefix (the operator, before it has asked the
    /// cluster for its installation id).
    ///
    /// # Errors
    /// The prefix holds a brace (it would break the hash tag).
    pub fn with_prefix(self, prefix: &str) -> Result<Self, String> {
        check_prefix(prefix)?;
        let placement = self.placement;
        let mut calls = self.calls;
        calls.tag = shard_tag(prefix, ShardId(0));
        Ok(Self::on(calls, prefix, placement))
    }

    /// The same store with the unpooled proxies spread over `shards` shards (1 to
    /// [`MAX_UNPOOLED_SHARDS`]); every replica of an installation must be told the same.
    ///
    /// # Errors
    /// `shards` is out of that range.
    pub fn with_unpooled_shards(self, shards: u16) -> Result<Self, String> {
        let placement = Placement::new(shards)?;
        Ok(Self::on(self.calls, &self.prefix, placement))
    }

    /// The same store on `clock` instead of Redis's (tests that move time by hand).
    #[must_use]
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        self.remade(|c| c.clock = Some(clock))
    }

    /// The hash tag of each shard this replica has called, by shard (benches that show where
    /// the shards live).
    pub fn shard_tags(&self) -> Vec<(ShardId, String)> {
        let mut tags: Vec<(ShardId, String)> = self.kept().iter().map(|s| (s.id, s.calls.tag.clone())).collect();
        tags.sort();
        tags
    }

    /// The shard `id`, made on first use.
    fn shard(&self, id: ShardId) -> Arc<Shard> {
        let mut shards = self.shards.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(shard) = shards.get(&id) {
            return shard.clone();
        }
        let shard = Arc::new(self.new_shard(id));
        if shards.len() < MAX_KEPT_SHARDS {
            shards.insert(id, shard.clone());
        }
        shard
    }

    /// The shards this replica keeps.
    fn kept(&self) -> Vec<Arc<Shard>> {
        let shards = self.shards.lock().unwrap_or_else(PoisonError::into_inner);
        shards.values().cloned().collect()
    }

    /// The shard of the lease `lease_id`. A shard this replica has not used is not kept for
    /// it: anyone may make up an id naming any shard.
    fn lease_shard(&self, lease_id: &str) -> Arc<Shard> {
        let id = shard_of_lease(lease_id);
        let kept = self
            .shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned();
        kept.unwrap_or_else(|| Arc::new(self.new_shard(id)))
    }

    fn new_shard(&self, id: ShardId) -> Shard {
        Shard::new(
            id,
            Calls {
                tag: shard_tag(&self.prefix, id),
                ..self.calls.clone()
            },
            self.rounds.clone(),
        )
    }
}

#[async_trait::async_trait]
impl LeaseStore for RedisStore {
    async fn acquire<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        req: &LeaseRequest,
    ) -> Result<Result<Grant, NoMatch>, StoreError> {
        self.acquire_routed(candidates, req).await
    }

    async fn acquire_session<'c>(
        &self,
        candidates: &mut (dyn Iterator<Item = Candidate<'c>> + Send),
        member: &Member<'c>,
        req: &LeaseRequest,
        session: &Session<'_>,
    ) -> Result<Result<Grant, SessionRefused>, StoreError> {
        self.in_session(candidates, member, req, session).await
    }

    async fn renew(
        &self,
        lease_id: &str,
        ttl: Duration,
        fit: &Fit<'_>,
    ) -> Result<Result<Grant, NotRenewed>, StoreError> {
        self.lease_shard(lease_id).renew_lease(lease_id, ttl, fit).await
    }

    async fn session_leases(&self, key: &str) -> Result<Vec<String>, StoreError> {
        self.leases_of_session(key).await
    }

    fn sessions_now(&self) -> Vec<(String, usize)> {
        let mut by_client = std::collections::BTreeMap::<String, usize>::new();
        for shard in self.kept() {
            let sessions = shard.sessions.lock().unwrap_or_else(PoisonError::into_inner);
            for (client, n) in sessions.iter() {
                *by_client.entry(client.clone()).or_default() += n;
            }
        }
        by_client.into_iter().collect()
    }

    async fn release(&self, lease_id: &str) -> Result<(), StoreError> {
        self.lease_shard(lease_id).release(lease_id).await
    }

    async fn report(
        &self,
        lease_id: &str,
        result: ReportResult,
        target: Option<Target>,
    ) -> Result<Result<(), UnknownLease>, StoreError> {
        self.lease_shard(lease_id).report(lease_id, result, target).await
    }

    fn cooldowns_dropped(&self) -> u64 {
        self.kept().iter().map(|s| s.dropped()).sum()
    }

    async fn active_leases(&self, proxies: &[ProxyRef<'_>]) -> Result<Vec<usize>, StoreError> {
        self.active_by_shard(proxies).await
    }

    async fn active_total(&self) -> Result<usize, StoreError> {
        let listed = self.listed_shards().await?;
        let totals = futures::future::try_join_all(
            listed
                .iter()
                .map(|s| async move { self.shard(*s).active(&[]).await.map(|(_, total)| total) }),
        )
        .await?;
        Ok(totals.into_iter().sum())
    }

    fn active_total_now(&self) -> usize {
        self.kept().iter().map(|s| s.total_now()).sum()
    }

    async fn sweep(&self) -> Result<(), StoreError> {
        let listed = self.listed_shards().await?;
        futures::future::try_join_all(listed.iter().map(|s| async move { self.shard(*s).sweep().await })).await?;
        Ok(())
    }

    async fn publish_view(&self, view: &[ViewEntry]) -> Result<(), StoreError> {
        self.publish(view).await
    }
}

/// Refuses a prefix that would break the hash tags.
fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.contains(['{', '}']) {
        return Err(format!("lease store key prefix {prefix:?}: braces are not allowed"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_with_a_brace_or_a_cluster_url_without_nodes_is_refused_at_once() {
        for (url, prefix, why) in [
            ("redis://h:1", "a{b}:", "braces"),
            ("redis+cluster://,", "p:", "no cluster node"),
        ] {
            let e = RedisStore::new(url, prefix, Duration::from_secs(1)).expect_err(why);
            assert!(e.contains(why), "{e}");
        }
    }

    #[tokio::test]
    async fn a_prefix_given_later_is_checked_alike() {
        // Contacts nothing: the connection is made on the first call.
        let store = RedisStore::new("redis://h:1", DEFAULT_PREFIX, Duration::from_secs(1)).unwrap();
        let Err(e) = store.with_prefix("a{b}:") else {
            panic!("a prefix with braces was taken");
        };
        assert!(e.contains("braces"), "{e}");
    }

    #[test]
    fn a_url_that_is_not_redis_is_refused_at_once() {
        let e = RedisStore::new("http://x", DEFAULT_PREFIX, Duration::from_secs(1)).expect_err("not redis");
        assert!(e.contains("http://x"), "{e}");
    }
}
