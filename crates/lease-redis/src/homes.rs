//! Where the shards live on a Redis Cluster: each shard's slot (`CLUSTER KEYSLOT` of its hash
//! tag) and the master that serves it (`CLUSTER SLOTS`), for benches and diagnostics that show
//! how the load spreads, and for choosing a new pool's shard (`pools.rs`).

use egress_lease::StoreError;
use redis::Value;

use crate::RedisStore;
use crate::calls::Calls;
use crate::placement::ShardId;

/// One shard, where it lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardHome {
    pub shard: ShardId,
    /// The hash tag of its keys.
    pub tag: String,
    pub slot: u16,
    /// The master serving the slot, `host:port` as the cluster names it.
    pub master: String,
}

impl RedisStore {
    /// Where each shard this replica has used lives, in shard order.
    ///
    /// # Errors
    /// Redis cannot be reached, or is not a cluster.
    pub async fn shard_homes(&self) -> Result<Vec<ShardHome>, StoreError> {
        let masters = Masters::read(&self.calls).await?;
        let mut homes = Vec::new();
        for (shard, tag) in self.shard_tags() {
            let slot: u16 = self.calls.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(&tag)).await?;
            let master = masters
                .of(slot)
                .ok_or_else(|| StoreError(format!("no master serves slot {slot}")))?
                .to_owned();
            homes.push(ShardHome {
                shard,
                tag,
                slot,
                master,
            });
        }
        Ok(homes)
    }
}

/// A Redis Cluster's masters by the slots each serves, as `CLUSTER SLOTS` answered.
#[derive(Debug, Default)]
pub(crate) struct Masters(Vec<(u16, u16, String)>);

impl Masters {
    /// The cluster's masters now.
    pub(crate) async fn read(calls: &Calls) -> Result<Self, StoreError> {
        let raw: Vec<Value> = calls.query(redis::cmd("CLUSTER").arg("SLOTS")).await?;
        Ok(Self(slot_ranges(&raw)?))
    }

    /// The master serving `slot` (`host:port`).
    pub(crate) fn of(&self, slot: u16) -> Option<&str> {
        self.0
            .iter()
            .find(|(from, to, _)| (*from..=*to).contains(&slot))
            .map(|(_, _, m)| m.as_str())
    }

    /// Every master, each once.
    pub(crate) fn all(&self) -> std::collections::BTreeSet<&str> {
        self.0.iter().map(|(_, _, m)| m.as_str()).collect()
    }
}

/// `CLUSTER SLOTS`' answer as (first slot, last slot, master's `host:port`).
fn slot_ranges(raw: &[Value]) -> Result<Vec<(u16, u16, String)>, StoreError> {
    let bad = || StoreError("CLUSTER SLOTS answered an unexpected shape".to_owned());
    raw.iter()
        .map(|range| {
            let Value::Array(parts) = range else { return Err(bad()) };
            let slot = |v: Option<&Value>| match v {
                Some(Value::Int(n)) => u16::try_from(*n).map_err(|_| bad()),
                _ => Err(bad()),
            };
            let Some(Value::Array(master)) = parts.get(2) else {
                return Err(bad());
            };
            let host = match master.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => return Err(bad()),
            };
            let port = slot(master.get(1))?;
            Ok((slot(parts.first())?, slot(parts.get(1))?, format!("{host}:{port}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn slot_ranges_read_each_range_and_its_master() {
        let raw = vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![text("127.0.0.1"), Value::Int(7000), text("id-a")]),
                Value::Array(vec![text("127.0.0.1"), Value::Int(7003), text("id-r")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![text("10.0.0.2"), Value::Int(7001)]),
            ]),
        ];
        assert_eq!(
            slot_ranges(&raw).unwrap(),
            [
                (0, 5460, "127.0.0.1:7000".to_owned()),
                (5461, 16383, "10.0.0.2:7001".to_owned())
            ]
        );
        assert!(slot_ranges(&[Value::Int(1)]).is_err());
        assert!(slot_ranges(&[Value::Array(vec![Value::Int(0), Value::Int(1)])]).is_err());
    }
}
