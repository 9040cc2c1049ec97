//! The gcp provider (spec/providers.md §5, §6.2): create submits an insert and returns, get
//! reads the instance (and the insert's operation while the instance is not there yet),
//! delete submits a delete, list reads every zone at once, mark sets the labels (`mark.rs`), the
//! check lists at most one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use egress_provider::{
    Checker, CreateRequest, ErrorClass, Instance, InstanceState, LABEL_MANAGED, LABEL_MANAGED_YES, Op, OpCtx, Provider,
    ProviderError, ProviderId, TargetStatus, scrub,
};
use serde::Deserialize;
use serde_json::Value;

use crate::body::{insert_body, request_id};
use crate::classify::{Call, RequestFailure, check_reason, classify, classify_operation_error};
use crate::client::Client;
use crate::id;
use crate::settings::{Settings, placement};
use crate::state::ApiInstance;

mod mark;

pub use mark::{OPERATION_POLL, set_labels_body};

/// The budget of one create, get or delete, all its requests together (a token refresh and a
/// read's retries included), and of each page of a list.
pub const CALL_BUDGET: Duration = Duration::from_secs(60);
/// The list filter on the managed mark.
pub const MANAGED_FILTER: &str = "labels.proxy-operator-managed = true";
/// The most pages one listing reads (500 instances each).
pub const MAX_LIST_PAGES: usize = 1000;
/// The most insert operations remembered at once (one per Proxy being created); past it, the
/// requestId generations older than [`REQUEST_ID_MEMORY`] are dropped too.
pub const MAX_REMEMBERED_INSERTS: usize = 10_000;
/// How long the API remembers a requestId (about an hour), with a margin.
pub const REQUEST_ID_MEMORY: Duration = Duration::from_secs(2 * 3600);

/// An insert the API accepted, kept until get sees its instance, its failure is reported, or
/// the instance is deleted.
#[derive(Clone, Debug)]
struct Submitted {
    operation: String,
    at: Instant,
}

#[derive(Debug, Default)]
struct Memory {
    /// By providerID.
    inserts: HashMap<String, Submitted>,
    /// How many times each providerID's insert was superseded (deleted, failed or finished and
    /// gone), and when last: part of the requestId, so a new insert after a delete is not
    /// answered with the old operation. Forgotten once the API has forgotten the requestId.
    generations: HashMap<String, (u64, Instant)>,
}

struct Inner {
    entry: String,
    settings: Settings,
    client: Client,
    memory: Mutex<Memory>,
}

/// The gcp provider of one config entry.
#[derive(Clone)]
pub struct GcpProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for GcpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcpProvider")
            .field("entry", &self.inner.entry)
            .field("project", &self.inner.settings.project)
            .finish_non_exhaustive()
    }
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Operation {
    #[serde(default)]
    name: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    error: Option<OperationErrors>,
    #[serde(default)]
    http_error_status_code: Option<u16>,
}

#[derive(Deserialize)]
struct OperationErrors {
    #[serde(default)]
    errors: Vec<OperationError>,
}

#[derive(Deserialize)]
struct OperationError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AggregatedList {
    #[serde(default)]
    items: HashMap<String, Scope>,
    #[serde(default)]
    next_page_token: Option<String>,
    #[serde(default)]
    unreachables: Vec<String>,
}

#[derive(Deserialize)]
struct Scope {
    #[serde(default)]
    instances: Vec<ApiInstance>,
    #[serde(default)]
    warning: Option<ScopeWarning>,
}

#[derive(Deserialize)]
struct ScopeWarning {
    #[serde(default)]
    code: String,
}

/// The `warning.code` of a scope the API could not read (besides the top-level `unreachables`).
const UNREACHABLE: &str = "UNREACHABLE";

impl GcpProvider {
    /// The provider of entry `entry` over `client`. Contacts nothing.
    pub fn new(entry: &str, settings: Settings, client: Client) -> Self {
        Self {
            inner: Arc::new(Inner {
                entry: entry.to_owned(),
                settings,
                client,
                memory: Mutex::new(Memory::default()),
            }),
        }
    }

    fn memory(&self) -> MutexGuard<'_, Memory> {
        self.inner.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one call within [`CALL_BUDGET`] and the caller's context.
    async fn call(
        &self,
        cx: &OpCtx,
        call: Call,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
        sent_secret: &[u8],
    ) -> Result<Value, RequestFailure> {
        let client = &self.inner.client;
        match cx
            .run_within(CALL_BUDGET, client.call(call, path, query, body, sent_secret))
            .await
        {
            Ok(result) => result,
            Err(why) => Err(RequestFailure::Interrupted(why.to_string())),
        }
    }

    /// The error for a failed call, logged (status and reasons) as the API answered it.
    fn error(&self, op: Op, id: &str, call: Call, f: &RequestFailure) -> ProviderError {
        let class = classify(f, call);
        let (status, reasons) = f.api().map(|e| (e.status, e.reasons.join(","))).unwrap_or_default();
        tracing::debug!(
            provider = %self.inner.entry, call = call.as_str(), id, status, reasons, class = class.label(),
            error = %f, "gcp api call failed"
        );
        ProviderError::new(class, op, &self.inner.entry, id).with_message(format!("{}: {f}", call.as_str()))
    }

    fn permanent(&self, op: Op, id: &str, message: impl Into<String>) -> ProviderError {
        ProviderError::new(ErrorClass::Permanent, op, &self.inner.entry, id).with_message(message)
    }

    fn generation(&self, id: &str) -> u64 {
        self.memory().generations.get(id).map_or(0, |(g, _)| *g)
    }

    /// Forgets `id`'s insert and moves its requestId on.
    fn supersede(&self, id: &str) {
        let mut m = self.memory();
        m.inserts.remove(id);
        if m.generations.len() >= MAX_REMEMBERED_INSERTS {
            m.generations.retain(|_, (_, at)| at.elapsed() < REQUEST_ID_MEMORY);
        }
        let entry = m.generations.entry(id.to_owned()).or_insert((0, Instant::now()));
        *entry = (entry.0 + 1, Instant::now());
    }

    fn remember(&self, id: &str, operation: String) {
        let mut m = self.memory();
        if m.inserts.len() >= MAX_REMEMBERED_INSERTS
            && let Some(oldest) = m.inserts.iter().min_by_key(|(_, s)| s.at).map(|(k, _)| k.clone())
        {
            m.inserts.remove(&oldest);
        }
        m.inserts.insert(
            id.to_owned(),
            Submitted {
                operation,
                at: Instant::now(),
            },
        );
    }

    /// After a 409: the instance of this name is this Proxy's (managed, and of its UID or of
    /// none), or create fails Permanent.
    async fn adopt(&self, cx: &OpCtx, pid: &str, zone: &str, name: &str, uid: &str) -> Result<(), ProviderError> {
        let found = self
            .call(cx, Call::Get, &format!("zones/{zone}/instances/{name}"), &[], None, &[])
            .await
            .map_err(|f| {
                let e = self.error(Op::Create, pid, Call::Get, &f);
                if e.class() == ErrorClass::NotFound {
                    // Gone between the 409 and this read: create never answers NotFound.
                    ProviderError::new(ErrorClass::Transient, Op::Create, &self.inner.entry, pid)
                        .with_message(format!("the instance vanished while being adopted: {f}"))
                } else {
                    e
                }
            })?;
        let api: ApiInstance = serde_json::from_value(found).unwrap_or_default();
        if api.labels.get(LABEL_MANAGED).map(String::as_str) != Some(LABEL_MANAGED_YES) {
            return Err(self.permanent(
                Op::Create,
                pid,
                format!("instance {pid} exists but is not managed by this operator"),
            ));
        }
        let owner = api.labels.get(egress_provider::LABEL_UID).cloned().unwrap_or_default();
        if !owner.is_empty() && owner != uid {
            return Err(self.permanent(
                Op::Create,
                pid,
                format!("instance {pid} belongs to proxy uid {owner}, not {uid}"),
            ));
        }
        Ok(())
    }

    /// What the remembered insert of `pid` says now that its instance is not found, if this
    /// provider submitted one. A failed or finished insert is forgotten and its requestId moved
    /// on (the API would answer a new insert with the old operation for about an hour).
    /// A delete answered 400 `resourceNotReady` (spec §5.4.3): another operation holds the
    /// instance. When that is a delete already under way this one has nothing left to do and
    /// succeeds: a read shows the instance `STOPPING` (an insert cannot make it again: it has
    /// made it), or gone with no insert of ours still running. Otherwise (an insert still
    /// running that would make it after this "success", or the instance in another state) it
    /// stays Transient and is retried, so no VM is left behind.
    async fn delete_while_busy(
        &self,
        cx: &OpCtx,
        pid: &ProviderId,
        zone: &str,
        path: &str,
        busy: &RequestFailure,
    ) -> Result<(), ProviderError> {
        let op = Op::Delete;
        let retry = || self.error(op, pid.as_str(), Call::Delete, busy);
        let under_way = match self.call(cx, Call::Get, path, &[], None, &[]).await {
            Ok(v) => v.get("status").and_then(Value::as_str) == Some("STOPPING"),
            Err(f) if classify(&f, Call::Get) == ErrorClass::NotFound => !matches!(
                self.remembered_insert(cx, op, pid.as_str(), zone).await?,
                Submission::Pending
            ),
            Err(_) => false,
        };
        if !under_way {
            return Err(retry());
        }
        self.supersede(pid.as_str());
        tracing::debug!(provider = %self.inner.entry, id = %pid, "gcp delete already under way");
        Ok(())
    }

    async fn remembered_insert(&self, cx: &OpCtx, op: Op, pid: &str, zone: &str) -> Result<Submission, ProviderError> {
        let submitted = self.memory().inserts.get(pid).cloned();
        let Some(submitted) = submitted else {
            return Ok(Submission::Unknown);
        };
        let path = format!("zones/{zone}/operations/{}", submitted.operation);
        let operation = match self.call(cx, Call::Operation, &path, &[], None, &[]).await {
            Ok(v) => serde_json::from_value::<Operation>(v).ok(),
            // The operation is gone (operations expire): nothing more to learn.
            Err(f) if classify(&f, Call::Operation) == ErrorClass::NotFound => None,
            Err(f) => {
                let e = self.error(op, pid, Call::Operation, &f);
                return Err(ProviderError::new(ErrorClass::Transient, op, &self.inner.entry, pid)
                    .with_message(format!("instance not found and its insert operation unreadable: {e}")));
            }
        };
        match operation {
            Some(o) if o.status != "DONE" => {
                tracing::debug!(provider = %self.inner.entry, id = pid, operation = %o.name, status = %o.status, "gcp insert still in progress");
                Ok(Submission::Pending)
            }
            Some(Operation {
                error: Some(errors),
                http_error_status_code,
                name,
                ..
            }) if !errors.errors.is_empty() => {
                self.supersede(pid);
                let codes: Vec<String> = errors.errors.iter().map(|e| e.code.clone()).collect();
                let class = classify_operation_error(&codes, http_error_status_code);
                let detail = errors
                    .errors
                    .iter()
                    .map(|e| format!("{}: {}", e.code, egress_provider::redact(&e.message)))
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::debug!(provider = %self.inner.entry, id = pid, operation = %name, class = class.label(), error = %detail, "gcp insert failed after it was accepted");
                Ok(Submission::Failed(class, detail))
            }
            _ => {
                // Done without error, or forgotten by the API: the instance was made and is gone.
                self.supersede(pid);
                Ok(Submission::Gone)
            }
        }
    }
}

/// What a remembered insert says about an instance that is not found.
enum Submission {
    /// This provider submitted no insert for it (or has forgotten it).
    Unknown,
    /// The insert is still running: the instance is on its way.
    Pending,
    /// The insert failed after it was accepted: its class and the operation's errors.
    Failed(ErrorClass, String),
    /// The insert finished: the instance was made and is gone again.
    Gone,
}

#[async_trait]
impl Provider for GcpProvider {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let op = Op::Create;
        let budgeted = cx.clone().with_timeout(CALL_BUDGET);
        let cx = &budgeted;
        let at = placement(&req.placement).map_err(|m| self.permanent(op, "", m))?;
        let pid = id::format(at.zone, &req.name);
        let settings = &self.inner.settings;
        let body = insert_body(req, &at, settings).map_err(|m| self.permanent(op, &pid, m))?;
        tracing::trace!(
            provider = %self.inner.entry, name = %req.name, zone = at.zone, machine_type = at.machine_type,
            image = at.image, disk_size_gb = settings.disk_size_gb, network = %settings.network,
            tag = %settings.network_tag, labels = %body["labels"], cloudInitBytes = req.cloud_init.len(),
            "gcp insert request"
        );
        let rid = request_id(&req.uid, at.zone, &req.name, self.generation(&pid));
        let path = format!("zones/{}/instances", at.zone);
        match self
            .call(
                cx,
                Call::Insert,
                &path,
                &[("requestId", &rid)],
                Some(&body),
                &req.cloud_init,
            )
            .await
        {
            Ok(answer) => {
                let operation = answer
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                tracing::debug!(provider = %self.inner.entry, id = %pid, operation = %operation, "gcp insert accepted");
                if !operation.is_empty() {
                    self.remember(&pid, operation);
                }
            }
            Err(f) if f.is_already_exists() => {
                self.adopt(cx, &pid, at.zone, &req.name, &req.uid).await?;
                tracing::debug!(provider = %self.inner.entry, id = %pid, "gcp instance already exists; adopted");
            }
            Err(mut f) => {
                // An API message may quote what it was sent.
                if let RequestFailure::Api(e) = &mut f {
                    e.message = scrub(&e.message, &req.cloud_init);
                }
                return Err(self.error(op, &pid, Call::Insert, &f));
            }
        }
        Ok(ProviderId::new(pid))
    }

    async fn get(&self, cx: &OpCtx, pid: &ProviderId) -> Result<Instance, ProviderError> {
        let op = Op::Get;
        let budgeted = cx.clone().with_timeout(CALL_BUDGET);
        let cx = &budgeted;
        let (zone, name) = id::parse(pid.as_str()).map_err(|m| self.permanent(op, pid.as_str(), m))?;
        let path = format!("zones/{zone}/instances/{name}");
        match self.call(cx, Call::Get, &path, &[], None, &[]).await {
            Ok(v) => {
                let api: ApiInstance = serde_json::from_value(v).map_err(|e| {
                    ProviderError::new(ErrorClass::Transient, op, &self.inner.entry, pid.as_str())
                        .with_message(format!("get: undecodable instance: {e}"))
                })?;
                self.memory().inserts.remove(pid.as_str());
                let instance = api.to_instance(pid.as_str().to_owned());
                tracing::debug!(provider = %self.inner.entry, id = %pid, status = %api.status, state = ?instance.state, "gcp instance fetched");
                Ok(instance)
            }
            Err(f) if classify(&f, Call::Get) == ErrorClass::NotFound => {
                match self.remembered_insert(cx, op, pid.as_str(), zone).await? {
                    // Not NotFound while the insert runs, or the reconciler would create again.
                    Submission::Pending => Ok(Instance::new(pid.clone(), InstanceState::Provisioning)),
                    Submission::Failed(class, detail) => {
                        Err(ProviderError::new(class, op, &self.inner.entry, pid.as_str())
                            .with_message(format!("the insert failed after it was accepted: {detail}")))
                    }
                    Submission::Unknown | Submission::Gone => {
                        // Gone: a create from now on is a new request, not a retry.
                        self.supersede(pid.as_str());
                        Err(self.error(op, pid.as_str(), Call::Get, &f))
                    }
                }
            }
            Err(f) => Err(self.error(op, pid.as_str(), Call::Get, &f)),
        }
    }

    async fn delete(&self, cx: &OpCtx, pid: &ProviderId) -> Result<(), ProviderError> {
        let op = Op::Delete;
        let budgeted = cx.clone().with_timeout(CALL_BUDGET);
        let cx = &budgeted;
        let (zone, name) = id::parse(pid.as_str()).map_err(|m| self.permanent(op, pid.as_str(), m))?;
        let path = format!("zones/{zone}/instances/{name}");
        let result = self.call(cx, Call::Delete, &path, &[], None, &[]).await;
        match result {
            Ok(answer) => {
                self.supersede(pid.as_str());
                let operation = answer.get("name").and_then(Value::as_str).unwrap_or_default();
                tracing::debug!(provider = %self.inner.entry, id = %pid, operation, "gcp delete accepted");
                Ok(())
            }
            Err(f) if classify(&f, Call::Delete) == ErrorClass::NotFound => {
                // An insert still running would make the instance after this "success".
                if let Submission::Pending = self.remembered_insert(cx, op, pid.as_str(), zone).await? {
                    return Err(
                        ProviderError::new(ErrorClass::Transient, op, &self.inner.entry, pid.as_str()).with_message(
                            "the instance's insert is still running; delete again once it has made the instance",
                        ),
                    );
                }
                self.supersede(pid.as_str());
                tracing::debug!(provider = %self.inner.entry, id = %pid, "gcp instance already gone");
                Ok(())
            }
            Err(f) if f.is_resource_not_ready() => self.delete_while_busy(cx, pid, zone, &path, &f).await,
            Err(f) => Err(self.error(op, pid.as_str(), Call::Delete, &f)),
        }
    }

    async fn list_by_tag(&self, cx: &OpCtx) -> Result<Vec<Instance>, ProviderError> {
        let op = Op::List;
        let mut found = Vec::new();
        // A set: every page repeats the same scopes.
        let mut unreachable = std::collections::BTreeSet::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut query = vec![("filter", MANAGED_FILTER), ("returnPartialSuccess", "true")];
            if let Some(t) = &token {
                query.push(("pageToken", t));
            }
            let page = self
                .call(cx, Call::List, "aggregated/instances", &query, None, &[])
                .await
                .map_err(|f| self.error(op, "", Call::List, &f))?;
            let page: AggregatedList = serde_json::from_value(page).map_err(|e| {
                ProviderError::new(ErrorClass::Transient, op, &self.inner.entry, "")
                    .with_message(format!("aggregatedList: undecodable page: {e}"))
            })?;
            for instance in page.items.values().flat_map(|s| s.instances.iter()) {
                let i = instance.to_listed_instance();
                tracing::trace!(provider = %self.inner.entry, id = %i.id, status = %instance.status, "gcp instance listed");
                found.push(i);
            }
            // The API names a scope it could not read in `unreachables`, or with a per-scope
            // `UNREACHABLE` warning in `items`, or both.
            unreachable.extend(page.unreachables);
            unreachable.extend(
                page.items
                    .iter()
                    .filter(|(_, s)| s.warning.as_ref().is_some_and(|w| w.code == UNREACHABLE))
                    .map(|(scope, _)| scope.clone()),
            );
            token = page.next_page_token.filter(|t| !t.is_empty());
            if token.is_none() {
                if !unreachable.is_empty() {
                    // GC cannot collect there during this sweep: say so once.
                    tracing::warn!(provider = %self.inner.entry, scopes = ?unreachable, "gcp list omitted unreachable scopes");
                }
                tracing::debug!(provider = %self.inner.entry, filter = MANAGED_FILTER, count = found.len(), "gcp instances listed");
                return Ok(found);
            }
        }
        Err(ProviderError::new(ErrorClass::Transient, op, &self.inner.entry, "")
            .with_message(format!("aggregatedList: more than {MAX_LIST_PAGES} pages")))
    }

    async fn mark_installation(&self, cx: &OpCtx, pid: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        self.mark(cx, pid, installation).await
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(self.clone()))
    }
}

#[async_trait]
impl Checker for GcpProvider {
    async fn check(&self, cx: &OpCtx) -> Vec<TargetStatus> {
        let (project, address) = (&self.inner.settings.project, self.inner.client.host());
        let started = Instant::now();
        // Exactly one request: one page of at most one instance, whatever nextPageToken says.
        let query = [
            ("filter", MANAGED_FILTER),
            ("maxResults", "1"),
            ("returnPartialSuccess", "true"),
        ];
        let listed = match cx
            .run_within(
                CALL_BUDGET,
                self.inner.client.call_once(Call::List, "aggregated/instances", &query),
            )
            .await
        {
            Ok(r) => r,
            Err(why) => Err(RequestFailure::Interrupted(why.to_string())),
        };
        let latency = started.elapsed().max(Duration::from_nanos(1));
        let status = match listed {
            Ok(_) => TargetStatus::reachable(project, &address, latency),
            Err(f) => {
                let reason = check_reason(&f, cx.interrupted().is_some());
                if let Some(e) = f.api() {
                    tracing::debug!(provider = %self.inner.entry, status = e.status, reasons = %e.reasons.join(","), error = %f, "gcp api call failed");
                }
                TargetStatus::failed(project, &address, reason, f.to_string(), latency)
            }
        };
        tracing::debug!(provider = %self.inner.entry, ready = status.ready, reason = %status.reason, "gcp project checked");
        vec![status]
    }
}
