//! A pool pass's writes: each step of its plan as one write to the API server (a new member, a
//! role label, a delete), at most [`MAX_WRITES`] of them, and what the cache should show after
//! them ([`Expected`]): the next pass plans only once it does, or once it has waited long
//! enough, so a pass on a cache that has not yet seen a promotion does not promote a second
//! standby.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use egress_api::{ANNOTATION_DRAINING_SINCE, LABEL_POOL_ROLE, PoolRole, Proxy, ProxyPool};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::events::Event;
use crate::identity::FIELD_MANAGER;
use crate::pool::decide::{Desired, Step};
use crate::pool::member::Member;
use crate::pool::metrics::{CreateLabels, DrainLabels, PoolLabels, PoolMetrics};
use crate::pool::view::{drain_reason, new_member};

/// Writes one pass performs at most; the rest is the next pass's.
pub const MAX_WRITES: usize = 64;

/// A pass that failed; the queue retries it with backoff.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("writing {what}: {source}")]
    Kube {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

pub(crate) fn kube_error(what: &'static str) -> impl FnOnce(kube::Error) -> PoolError {
    move |source| PoolError::Kube { what, source }
}

/// What a pass wrote and waits to see in the cache, per pool UID.
#[derive(Debug, Default)]
pub(crate) struct Expected {
    /// Members made (their names as the API server gave them).
    pub(crate) created: Vec<String>,
    /// Members whose role was changed, and to what.
    pub(crate) roles: Vec<(String, PoolRole)>,
    pub(crate) deleted: Vec<String>,
    /// The pool's generation after the autoscaler wrote its `replicas`: a pass on an older
    /// copy of the pool would plan for the old number (and drain what was just made for the
    /// new one).
    pub(crate) pool_generation: Option<i64>,
    /// When the pass that wrote it ended.
    pub(crate) since: Option<Instant>,
}

impl Expected {
    /// Whether the cache shows all of it: `pool` as cached, and its `members` by name.
    pub(crate) fn seen_in(&self, pool: &ProxyPool, members: &HashMap<String, &Proxy>) -> bool {
        self.pool_generation
            .is_none_or(|g| pool.metadata.generation.is_some_and(|seen| seen >= g))
            && self.created.iter().all(|n| members.contains_key(n))
            && self
                .deleted
                .iter()
                .all(|n| members.get(n).is_none_or(|p| p.metadata.deletion_timestamp.is_some()))
            && self
                .roles
                .iter()
                .all(|(n, role)| members.get(n).is_none_or(|p| p.pool().map(|m| m.role) == Some(*role)))
    }
}

/// The last create that failed, per pool UID, until a create succeeds: the pool's
/// `ReplicaFailure` condition says it.
#[derive(Debug, Default)]
pub(crate) struct CreateFailures(Mutex<HashMap<String, String>>);

impl CreateFailures {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the last create for the pool `uid` failed, if it did.
    pub(crate) fn get(&self, uid: &str) -> Option<String> {
        self.lock().get(uid).cloned()
    }

    fn set(&self, uid: String, why: String) {
        self.lock().insert(uid, why);
    }

    /// A create succeeded, or the pool is gone.
    pub(crate) fn clear(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

/// What a pass's steps are written with: each step is one write to the API server.
pub(crate) struct Writer<'a> {
    pub(crate) metrics: &'a PoolMetrics,
    pub(crate) failures: &'a CreateFailures,
    pub(crate) pool: &'a ProxyPool,
    pub(crate) proxies: &'a Api<Proxy>,
    pub(crate) hash: &'a str,
    pub(crate) labels: &'a PoolLabels,
    /// The members as planned on, by name.
    pub(crate) members: HashMap<&'a str, &'a Member>,
    pub(crate) desired: &'a Desired,
    pub(crate) deleting: bool,
    pub(crate) now: Timestamp,
}

impl Writer<'_> {
    /// Performs the first [`MAX_WRITES`] of `steps`, noting in `wrote` what the cache should show
    /// next and in `events` what happened. A create the API server refuses is kept for
    /// `ReplicaFailure` and the other steps go on (a promotion must not wait for it).
    pub(crate) async fn perform(
        &self,
        steps: &[Step],
        wrote: &mut Expected,
        events: &mut Vec<Event>,
    ) -> Result<(), PoolError> {
        let mut create_failed = false;
        for step in steps.iter().take(MAX_WRITES) {
            match step {
                Step::Create(role) => match self.create(*role).await {
                    Ok((name, event)) => {
                        events.push(event);
                        wrote.created.push(name);
                    }
                    Err(why) => {
                        if !create_failed {
                            events.push(Event::warning("MemberCreateFailed", why));
                        }
                        create_failed = true;
                    }
                },
                Step::Promote(member) => {
                    if let Some(event) = self.promote(member).await? {
                        events.push(event);
                        wrote.roles.push((member.clone(), PoolRole::Active));
                    }
                }
                Step::Drain(member) => {
                    if let Some(event) = self.drain(member).await? {
                        events.push(event);
                        wrote.roles.push((member.clone(), PoolRole::Draining));
                    }
                }
                Step::Delete(member) => {
                    events.push(self.delete(member).await?);
                    wrote.deleted.push(member.clone());
                }
            }
        }
        Ok(())
    }

    /// A new member in `role`: its name and Event, or why the API server refused it.
    async fn create(&self, role: PoolRole) -> Result<(String, Event), String> {
        let uid = self.pool.uid().unwrap_or_default();
        match self
            .proxies
            .create(&post_params(), &new_member(self.pool, role, self.hash))
            .await
        {
            Ok(made) => {
                self.failures.clear(&uid);
                self.metrics
                    .creates
                    .get_or_create(&CreateLabels {
                        namespace: self.labels.namespace.clone(),
                        pool: self.labels.pool.clone(),
                        role: role.as_str(),
                    })
                    .inc();
                let note = format!("created {} member {}", role.as_str(), made.name_any());
                Ok((made.name_any(), Event::normal("MemberCreated", note)))
            }
            Err(e) => {
                let why = format!("creating a member: {e}");
                self.failures.set(uid, why.clone());
                Err(why)
            }
        }
    }

    /// A standby made active; its Event, none when it is gone already.
    async fn promote(&self, member: &str) -> Result<Option<Event>, PoolError> {
        let patch = json!({"metadata": {
            "labels": {LABEL_POOL_ROLE: PoolRole::Active.as_str()},
            "annotations": {ANNOTATION_DRAINING_SINCE: null}}});
        if !patch_member(self.proxies, member, patch).await? {
            return Ok(None);
        }
        self.metrics.promotions.get_or_create(self.labels).inc();
        Ok(Some(Event::normal(
            "Promoted",
            format!("standby {member} now takes leases"),
        )))
    }

    /// A member drained; its Event, none when it is gone already.
    async fn drain(&self, member: &str) -> Result<Option<Event>, PoolError> {
        let reason = self
            .members
            .get(member)
            .map_or("scale_down", |m| drain_reason(m, self.desired, self.deleting));
        let patch = json!({"metadata": {
            "labels": {LABEL_POOL_ROLE: PoolRole::Draining.as_str()},
            "annotations": {ANNOTATION_DRAINING_SINCE: self.now.to_string()}}});
        if !patch_member(self.proxies, member, patch).await? {
            return Ok(None);
        }
        self.metrics
            .drains
            .get_or_create(&DrainLabels {
                namespace: self.labels.namespace.clone(),
                pool: self.labels.pool.clone(),
                reason,
            })
            .inc();
        let note = format!(
            "{member} gets no new leases ({}); it goes when its leases end, at most {}s from now",
            reason.replace('_', " "),
            self.desired.drain_timeout.as_secs()
        );
        Ok(Some(Event::normal("Draining", note)))
    }

    /// A member deleted (or gone already); its Event, with why a draining one went.
    async fn delete(&self, member: &str) -> Result<Event, PoolError> {
        match self.proxies.delete(member, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(PoolError::Kube {
                    what: "a member's delete",
                    source,
                });
            }
        }
        let why = match self.members.get(member) {
            Some(m) if m.role == PoolRole::Draining && m.leases == 0 => " (its leases ended)",
            Some(m) if m.role == PoolRole::Draining => " (its drain timeout passed)",
            _ => "",
        };
        Ok(Event::normal("MemberDeleted", format!("deleted member {member}{why}")))
    }
}

pub(crate) fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Patches a member's metadata; `false` when it is gone already.
async fn patch_member(api: &Api<Proxy>, name: &str, patch: serde_json::Value) -> Result<bool, PoolError> {
    match api.patch(name, &params(), &Patch::Merge(patch)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(source) => Err(PoolError::Kube {
            what: "a member's role",
            source,
        }),
    }
}
