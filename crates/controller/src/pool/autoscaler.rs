//! The autoscaler's memory of each pool, and its look at one (docs/pools.md#autoscale): the
//! pool's load taken from its members' leases and the lease requests refused for it, and the
//! size the pure rules of [`crate::pool::autoscale`] give for that load. What it remembers
//! between looks (a low run, the last raise, when the pool was complete again) is this
//! leader's: a new leader starts afresh.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use egress_api::{PoolRole, Proxy, ProxyPool};
use egress_discovery::Refusals;
use kube::ResourceExt;

use crate::pool::autoscale::{Load, LowSince, Policy, recommend, scale};
use crate::pool::member::Member;

/// Refused requests of this window count towards a pool's size.
pub const REFUSAL_WINDOW: Duration = Duration::from_secs(10);

/// What the autoscaler remembers of a pool between looks. A new leader starts afresh: a
/// scale-down waits a whole delay again, a scale-up loses nothing.
#[derive(Debug, Default)]
struct AutoscaleMemory {
    low: Option<LowSince>,
    /// The last time the autoscaler raised the pool: refusals before it were answered by it.
    last_up: Option<Instant>,
    /// The look that found every member the pool asks for Ready after one that did not.
    complete_since: Option<Instant>,
    /// The last look found members the pool asks for not yet Ready.
    incomplete: bool,
}

/// What the autoscaler remembers of each pool, by pool UID.
#[derive(Debug, Default)]
pub(crate) struct Autoscaler(Mutex<HashMap<String, AutoscaleMemory>>);

impl Autoscaler {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, AutoscaleMemory>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The autoscaler's look at a pool: the number of members its load wants now, and the
    /// Event's note, when that differs from `spec.replicas`. Remembers the low run and the last
    /// raise. `refusals` are the lease requests refused, as the discovery API counts them.
    pub(crate) fn look(
        &self,
        pool: &ProxyPool,
        policy: &Policy,
        members: &[(&Proxy, Member)],
        leases: u64,
        refusals: Option<&Refusals>,
    ) -> Option<(u32, String)> {
        let uid = pool.uid().unwrap_or_default();
        let key = format!("{}/{}", pool.namespace().unwrap_or_default(), pool.name_any());
        let current = u32::try_from(pool.spec.replicas).unwrap_or(0);
        let now = Instant::now();
        let ready_actives = members
            .iter()
            .filter(|(_, m)| m.role == PoolRole::Active && m.ready && !m.failed)
            .count();
        let complete = ready_actives >= current as usize;
        let mut memory = self.lock();
        let memory = memory.entry(uid).or_default();
        if !complete {
            memory.incomplete = true;
        } else if std::mem::take(&mut memory.incomplete) {
            memory.complete_since = Some(now);
        }
        // Refusals count from the latest of: the window's start, the last raise (they made it),
        // and the look that found the pool complete again (those made while members were on
        // their way were waited out, not answered with more). While incomplete they do not count
        // at all (`Load::complete`).
        let window = now.checked_sub(REFUSAL_WINDOW).unwrap_or(now);
        let since = [memory.last_up, memory.complete_since]
            .into_iter()
            .flatten()
            .fold(window, Instant::max);
        let refusals = refusals.map_or(0, |r| r.count_since(&key, since));
        let load = Load {
            leases,
            per_member: u32::try_from(pool.spec.template.spec.effective_max_leases()).unwrap_or(0),
            refusals,
            complete,
        };
        let recommendation = recommend(policy, current, &load);
        let scaled = scale(policy, current, recommendation, memory.low, now);
        if scaled.replicas == current {
            memory.low = scaled.low;
            return None;
        }
        // A change is remembered once it is written ([`Autoscaler::written`]): a write that fails
        // (a conflict with a newer pool) leaves the next look the same refusals and the same low
        // run.
        let note = format!(
            "autoscale: {current} → {} members ({} active leases, {} each at most, target {}%; {} lease requests refused)",
            scaled.replicas, load.leases, load.per_member, policy.target_utilization, load.refusals
        );
        Some((scaled.replicas, note))
    }

    /// Forgets a pool's autoscale: its memory, and its refusals' count.
    pub(crate) fn forget(&self, uid: &str, key: &str, refusals: Option<&Refusals>) {
        self.lock().remove(uid);
        if let Some(r) = refusals {
            r.forget_pool(key);
        }
    }

    /// Remembers that the autoscaler wrote `replicas` over `before` (`now`): a low run ends, and
    /// a raise answers the refusals before it.
    pub(crate) fn written(&self, uid: &str, before: u32, replicas: u32, now: Instant) {
        let mut memory = self.lock();
        let memory = memory.entry(uid.to_owned()).or_default();
        memory.low = None;
        if replicas > before {
            memory.last_up = Some(now);
        }
    }
}
