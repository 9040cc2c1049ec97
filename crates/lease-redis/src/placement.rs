//! Where lease state lives: which shard a proxy's leases are in, the hash tag of a shard's
//! keys, how a lease id names its shard, and the order an acquire without a pool tries shards
//! in. Pure functions: every replica, of any version that shares this layout, places alike.
//!
//! A pool's members share a shard, one of the numbers drawn from the pool's name (which one is
//! chosen once, `pools.rs`); the installation's unpooled proxies are spread over [`RedisStore::with_unpooled_shards`](crate::RedisStore) shards by
//! their id. Each shard's keys carry a hash tag of their own, so on a Redis Cluster the shards
//! land in different slots and, as the cluster spreads slots, on different masters.

use std::hash::Hasher as _;

/// A shard of the lease state: the keys under one hash tag. Shards below
/// [`MAX_UNPOOLED_SHARDS`] hold unpooled proxies, the others pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub u16);

/// Shards the unpooled proxies may be spread over, at most.
pub const MAX_UNPOOLED_SHARDS: u16 = 256;

/// Shards one acquire without a pool tries, at most, before it answers that none had a proxy
/// for it. Beyond this many shards, one that was not tried may have had one.
pub const MAX_WALK: usize = 32;

/// Which shard a proxy's leases are in: its pool's, or one of the `unpooled` shards by its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    unpooled: u16,
}

impl Placement {
    /// Unpooled proxies over `unpooled` shards (at least 1, at most [`MAX_UNPOOLED_SHARDS`]).
    pub(crate) fn new(unpooled: u16) -> Result<Self, String> {
        if unpooled == 0 || unpooled > MAX_UNPOOLED_SHARDS {
            return Err(format!(
                "lease store shards for unpooled proxies: {unpooled}; from 1 to {MAX_UNPOOLED_SHARDS}"
            ));
        }
        Ok(Self { unpooled })
    }

    /// The unpooled proxies' shards.
    pub(crate) fn unpooled_shards(self) -> impl Iterator<Item = ShardId> {
        (0..self.unpooled).map(ShardId)
    }

    /// The shard of the unpooled proxy `id`. (A pool's shard is chosen once and stored:
    /// `pools.rs`.)
    pub(crate) fn unpooled(self, id: &str) -> ShardId {
        if self.unpooled == 1 {
            return ShardId(0);
        }
        let n = digest(id.as_bytes()) % u64::from(self.unpooled);
        ShardId(u16::try_from(n).unwrap_or(0))
    }
}

/// Shards a new pool may be given, at most: the first choice is [`pool_shard`], the others let
/// the pool go to the master of a Redis Cluster with the least load (`pools.rs`).
pub(crate) const MAX_CHOICES: u16 = 256;

/// The first choice of shard for the pool named `pool`: on one Redis, its shard unless another
/// pool took it first.
pub(crate) fn pool_shard(pool: &str) -> ShardId {
    pooled(digest(pool.as_bytes()))
}

/// The shards the pool named `pool` may be given, in order of preference: [`MAX_CHOICES`]
/// numbers drawn from its name, the first [`pool_shard`]'s.
pub(crate) fn pool_choices(pool: &str) -> impl Iterator<Item = ShardId> + '_ {
    (0..MAX_CHOICES).map(move |k| {
        if k == 0 {
            return pool_shard(pool);
        }
        let mut bytes = pool.as_bytes().to_vec();
        bytes.push(0);
        bytes.extend_from_slice(&k.to_be_bytes());
        pooled(digest(&bytes))
    })
}

/// The pools' shard numbered by `digest`: one above the unpooled ones.
fn pooled(digest: u64) -> ShardId {
    let span = u64::from(u16::MAX) + 1 - u64::from(MAX_UNPOOLED_SHARDS);
    let n = u64::from(MAX_UNPOOLED_SHARDS) + digest % span;
    ShardId(u16::try_from(n).unwrap_or(u16::MAX))
}

/// Hash slots of a Redis Cluster.
const SLOTS: u16 = 16_384;

/// The Redis Cluster slot of the keys under the hash tag `tag` (`{...}`): CRC16 (XMODEM) of what
/// the braces hold, modulo the slots, as the cluster computes it (`CLUSTER KEYSLOT`).
pub(crate) fn slot(tag: &str) -> u16 {
    let inside = tag.strip_prefix('{').and_then(|t| t.strip_suffix('}')).unwrap_or(tag);
    crc16::State::<crc16::XMODEM>::calculate(inside.as_bytes()) % SLOTS
}

/// The hash tag of `shard`'s keys under `prefix`. Shard 0 keeps the tag of the layout before
/// shards, `{<prefix>}`: on an installation without pools and with one unpooled shard, an
/// upgrade finds its leases, cooldowns and view where they were.
pub(crate) fn shard_tag(prefix: &str, shard: ShardId) -> String {
    if shard.0 == 0 {
        format!("{{{prefix}}}")
    } else {
        format!("{{{prefix}|s{}}}", shard.0)
    }
}

/// Characters of a lease id that names its shard: two more than the 26 of the layout before
/// shards, whose ids so never read as naming one.
const SHARDED_ID_LEN: usize = 28;

/// A new lease id in `shard`: [`SHARDED_ID_LEN`] base32 characters of 15 random bytes and the
/// shard's number, so a release, a renewal or a report goes straight to the lease's shard.
pub(crate) fn lease_id_in(shard: ShardId) -> String {
    let mut bytes = [0u8; 17];
    bytes[..15].copy_from_slice(&rand::random::<[u8; 15]>());
    bytes[15..].copy_from_slice(&shard.0.to_be_bytes());
    data_encoding::BASE32_NOPAD.encode(&bytes)
}

/// The shard a lease id names. Any other string is taken to be a lease of the layout before
/// shards, whose keys are shard 0's (or an id nobody made, which no shard knows).
pub(crate) fn shard_of_lease(lease_id: &str) -> ShardId {
    if lease_id.len() != SHARDED_ID_LEN {
        return ShardId(0);
    }
    let Ok(bytes) = data_encoding::BASE32_NOPAD.decode(lease_id.as_bytes()) else {
        return ShardId(0);
    };
    bytes
        .get(15..17)
        .and_then(|b| <[u8; 2]>::try_from(b).ok())
        .map_or(ShardId(0), |b| ShardId(u16::from_be_bytes(b)))
}

/// The order to try `shards` in, each with its weight (its healthy offered proxies), at most
/// [`MAX_WALK`]: a weighted random order (each next shard drawn with odds in proportion to its
/// weight among those left; those of no weight last, in number order), drawn with `draw`,
/// which gives each shard a number in (0, 1].
pub(crate) fn walk(shards: &[(ShardId, u64)], draw: impl Fn(ShardId) -> f64) -> Vec<ShardId> {
    // Efraimidis and Spirakis: ordering by u^(1/w), highest first, draws a weighted sample
    // without replacement; ln(u)/w orders alike without overflow.
    let mut keyed: Vec<(f64, ShardId)> = shards
        .iter()
        .map(|(s, w)| {
            let key = if *w == 0 {
                f64::NEG_INFINITY
            } else {
                draw(*s).ln() / *w as f64
            };
            (key, *s)
        })
        .collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().take(MAX_WALK).map(|(_, s)| s).collect()
}

/// A random number in (0, 1], for a walk of its own.
pub(crate) fn random_draw(_: ShardId) -> f64 {
    1.0 - rand::random::<f64>()
}

/// A number in (0, 1] fixed by `key` and the shard: a session's walk, the same on every replica
/// while the shards and their weights stay.
pub(crate) fn keyed_draw(key: &str) -> impl Fn(ShardId) -> f64 + '_ {
    move |shard| {
        let mut h = Fnv::default();
        h.write(key.as_bytes());
        h.write(&shard.0.to_be_bytes());
        // The top 53 bits, as a fraction, then moved off 0.
        (h.finish() >> 11) as f64 / (1u64 << 53) as f64 + f64::EPSILON
    }
}

/// FNV-1a, 64 bits: a hash every build and platform computes alike (std's is not promised to).
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// FNV-1a, then SplitMix64's finalizer: names that differ in their last character (`pool-00`,
/// `pool-01`, ...) land far apart, where FNV alone gives them numbers a constant step apart.
fn digest(bytes: &[u8]) -> u64 {
    let mut h = Fnv::default();
    h.write(bytes);
    let mut z = h.finish();
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_pools_choices_are_pooled_shards_and_unpooled_proxies_spread_over_theirs() {
        let p = Placement::new(4).unwrap();
        let choices: Vec<ShardId> = pool_choices("blue").collect();
        assert_eq!(choices.len(), usize::from(MAX_CHOICES));
        assert_eq!(choices[0], pool_shard("blue"));
        assert!(choices.iter().all(|s| s.0 >= MAX_UNPOOLED_SHARDS), "{choices:?}");
        let distinct: std::collections::BTreeSet<&ShardId> = choices.iter().collect();
        assert!(distinct.len() > 250, "{} distinct choices", distinct.len());
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..100 {
            let s = p.unpooled(&format!("ns/p{i}"));
            assert!(s.0 < 4, "{s:?}");
            seen.insert(s);
        }
        assert_eq!(seen.len(), 4, "every unpooled shard is used");
        let one = Placement::new(1).unwrap();
        assert_eq!(one.unpooled("ns/anything"), ShardId(0));
    }

    #[test]
    fn shard_counts_outside_the_range_are_refused() {
        assert!(Placement::new(0).is_err());
        assert!(Placement::new(MAX_UNPOOLED_SHARDS + 1).is_err());
        assert!(Placement::new(MAX_UNPOOLED_SHARDS).is_ok());
    }

    /// `pool-00`'s shard under this layout; a change here moves every pool's leases.
    const PINNED_POOL_00: u16 = 4268;

    #[test]
    fn the_placement_does_not_change_between_builds() {
        // Replicas of different builds must place alike: these numbers are the layout.
        let fnv = |b: &[u8]| {
            let mut h = Fnv::default();
            h.write(b);
            h.finish()
        };
        assert_eq!(fnv(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(pool_shard("pool-00"), ShardId(PINNED_POOL_00));
        assert_eq!(pool_shard("pool-00"), pool_shard("pool-00"));
        assert_eq!(
            Placement::new(3).unwrap().unpooled("ns/x").0,
            (digest(b"ns/x") % 3) as u16
        );
    }

    #[test]
    fn a_tags_slot_is_the_clusters() {
        // The examples of the Redis Cluster specification: CRC16 of "123456789" is 0x31C3, and
        // a key's hash tag alone decides its slot.
        assert_eq!(slot("{123456789}"), 0x31C3);
        assert_eq!(slot("{user1000}"), slot("user1000"));
        assert!(slot("{egress-proxy:|s300}") < SLOTS);
    }

    #[test]
    fn shard_zero_keeps_the_one_slot_tag_and_the_others_have_their_own() {
        assert_eq!(shard_tag("egress-proxy:", ShardId(0)), "{egress-proxy:}");
        assert_eq!(shard_tag("egress-proxy:", ShardId(300)), "{egress-proxy:|s300}");
    }

    #[test]
    fn a_lease_id_names_its_shard_and_any_other_id_is_shard_zeros() {
        for shard in [ShardId(0), ShardId(7), ShardId(40_000), ShardId(u16::MAX)] {
            let id = lease_id_in(shard);
            assert_eq!(id.len(), 28);
            assert!(
                id.bytes().all(|c| c.is_ascii_uppercase() || (b'2'..=b'7').contains(&c)),
                "{id}"
            );
            assert_eq!(shard_of_lease(&id), shard);
        }
        assert_ne!(lease_id_in(ShardId(1)), lease_id_in(ShardId(1)));
        // The one-slot layout's ids (26 characters), and strings no store made.
        let before_shards = egress_lease::lease_id();
        for other in ["", "old-live", &before_shards, &"1".repeat(28), &"A".repeat(27)] {
            assert_eq!(shard_of_lease(other), ShardId(0), "{other}");
        }
    }

    #[test]
    fn a_walk_puts_empty_shards_last_is_bounded_and_favours_the_heavy() {
        let shards: Vec<(ShardId, u64)> = (0..20).map(|i| (ShardId(i), u64::from(i % 2))).collect();
        let order = walk(&shards, random_draw);
        assert_eq!(order.len(), 20);
        assert!(order[..10].iter().all(|s| s.0 % 2 == 1), "{order:?}");
        assert_eq!(order[10..], (0..10).map(|i| ShardId(i * 2)).collect::<Vec<_>>()[..]);
        let many: Vec<(ShardId, u64)> = (0..100).map(|i| (ShardId(i), 1)).collect();
        assert_eq!(walk(&many, random_draw).len(), MAX_WALK);
        // A shard nine times as heavy comes first about nine times in ten.
        let pair = [(ShardId(1), 9), (ShardId(2), 1)];
        let mut first: HashMap<ShardId, usize> = HashMap::new();
        for _ in 0..10_000 {
            *first.entry(walk(&pair, random_draw)[0]).or_default() += 1;
        }
        let heavy = first[&ShardId(1)];
        assert!((8_500..9_500).contains(&heavy), "{heavy} of 10 000");
    }

    #[test]
    fn a_keyed_walk_is_the_same_every_time_and_differs_between_keys() {
        let shards: Vec<(ShardId, u64)> = (0..8).map(|i| (ShardId(i), 3)).collect();
        let a = walk(&shards, keyed_draw("client/one"));
        assert_eq!(a, walk(&shards, keyed_draw("client/one")));
        let firsts: std::collections::BTreeSet<ShardId> = (0..50)
            .map(|i| walk(&shards, keyed_draw(&format!("client/{i}")))[0])
            .collect();
        assert!(firsts.len() > 4, "sessions start in different shards: {firsts:?}");
        // Dropping a shard keeps the others' order.
        let fewer: Vec<(ShardId, u64)> = shards.iter().copied().filter(|(s, _)| *s != a[0]).collect();
        assert_eq!(walk(&fewer, keyed_draw("client/one")), a[1..].to_vec());
    }
}
