//! The kubernetes provider over a `kube::Client` (spec/providers.md §4, §6.1): create, get,
//! delete, list and mark (label) Pods, and the health check's one list call. Every call has its own budget.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use egress_provider::{
    Checker, CreateRequest, ErrorClass, Instance, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_MANAGED_YES, LABEL_UID,
    Marking, Op, OpCtx, Provider, ProviderError, ProviderId, REASON_API_ERROR, REASON_FORBIDDEN, REASON_TIMEOUT,
    REASON_UNAUTHORIZED, REASON_UNREACHABLE, TargetStatus, marking, redact, scrub,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};

use crate::classify::{CallFailure, classify, is_already_exists};
use crate::pod::{PodSettings, build_pod, is_label_value};
use crate::{id, state};

/// The budget of one API call.
pub const CALL_BUDGET: Duration = Duration::from_secs(30);
/// The health check's one target.
pub const TARGET: &str = "apiserver";

/// The kubernetes provider of one config entry.
#[derive(Clone)]
pub struct KubernetesProvider {
    entry: String,
    client: kube::Client,
    /// The API server's URL, as the health check reports it.
    api_host: String,
    settings: PodSettings,
    /// Where Pods may be when the entry names no namespace: the namespaces the operator serves
    /// (`None`: every namespace).
    served: Option<Vec<String>>,
}

impl std::fmt::Debug for KubernetesProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesProvider")
            .field("entry", &self.entry)
            .field("api_host", &self.api_host)
            .finish_non_exhaustive()
    }
}

/// A call that failed: the API's answer, or none.
#[derive(Debug)]
struct Failed {
    class_source: Source,
    message: String,
}

#[derive(Debug)]
enum Source {
    Api {
        reason: String,
        code: u16,
    },
    Transport,
    /// The call's budget or its caller ran out.
    Interrupted,
}

impl Failed {
    fn from_kube(e: &kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => Self {
                class_source: Source::Api {
                    reason: status.reason.clone(),
                    code: status.code,
                },
                message: redact(&format!("{} ({} {})", status.message, status.code, status.reason)),
            },
            other => Self {
                class_source: Source::Transport,
                message: redact(&other.to_string()),
            },
        }
    }

    fn failure(&self) -> CallFailure<'_> {
        match &self.class_source {
            Source::Api { reason, code } => CallFailure::Api { reason, code: *code },
            Source::Transport | Source::Interrupted => CallFailure::Transport,
        }
    }
}

impl KubernetesProvider {
    /// The provider of entry `entry`, calling the API server at `api_host` through `client`.
    /// Contacts nothing.
    pub fn new(entry: &str, client: kube::Client, api_host: impl Into<String>, settings: PodSettings) -> Self {
        Self {
            entry: entry.to_owned(),
            client,
            api_host: api_host.into(),
            settings,
            served: None,
        }
    }

    /// Restricted to the namespaces the operator serves (`None`: every one), for an entry that
    /// names no namespace of its own: Pods elsewhere are refused, and listed in those alone.
    #[must_use]
    pub fn serving(mut self, namespaces: Option<Vec<String>>) -> Self {
        self.served = namespaces;
        self
    }

    /// Runs one API call within [`CALL_BUDGET`] and the caller's context.
    async fn call<T>(
        &self,
        cx: &OpCtx,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Failed> {
        match cx.run_within(CALL_BUDGET, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                let mut f = Failed::from_kube(&e);
                f.message = format!("{what}: {}", f.message);
                Err(f)
            }
            Err(why) => Err(Failed {
                class_source: Source::Interrupted,
                message: format!("{what}: {why}"),
            }),
        }
    }

    fn error(&self, op: Op, id: &str, f: &Failed) -> ProviderError {
        let class = classify(f.failure(), op);
        tracing::debug!(provider = %self.entry, op = op.as_str(), id, class = class.label(), error = %f.message, "kubernetes call failed");
        ProviderError::new(class, op, &self.entry, id).with_message(f.message.clone())
    }

    fn permanent(&self, op: Op, id: &str, message: String) -> ProviderError {
        ProviderError::new(ErrorClass::Permanent, op, &self.entry, id).with_message(message)
    }

    /// Refuses a Pod outside `kubernetes.namespace`, when the entry names one, else outside
    /// the namespaces the operator serves.
    fn in_scope(&self, op: Op, id: &str, namespace: &str) -> Result<(), ProviderError> {
        match (&self.settings.namespace, &self.served) {
            (Some(only), _) if only != namespace => Err(self.permanent(
                op,
                id,
                format!("this kubernetes entry places Pods only in namespace {only}, not {namespace}"),
            )),
            (None, Some(served)) if !served.iter().any(|s| s == namespace) => Err(self.permanent(
                op,
                id,
                format!(
                    "the operator serves only the namespaces {} (--proxy-namespace), not {namespace}",
                    served.join(", ")
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The Pods this entry may see, one list per namespace: those of `kubernetes.namespace`,
    /// else of each namespace served, else of every namespace at once.
    fn scoped_pods(&self) -> Vec<Api<Pod>> {
        match (&self.settings.namespace, &self.served) {
            (Some(only), _) => vec![Api::namespaced(self.client.clone(), only)],
            (None, Some(served)) => served
                .iter()
                .map(|ns| Api::namespaced(self.client.clone(), ns))
                .collect(),
            (None, None) => vec![Api::all(self.client.clone())],
        }
    }
}

/// The instance a Pod stands for.
pub fn instance_of(pod: &Pod) -> Instance {
    let meta = &pod.metadata;
    let (namespace, name) = (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    );
    let status = pod.status.as_ref();
    let (state, ip) = state::map(
        status.and_then(|s| s.phase.as_deref()),
        status.and_then(|s| s.pod_ip.as_deref()),
        meta.deletion_timestamp.is_some(),
    );
    let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).cloned();
    Instance::new(id::format(&namespace, &name), state)
        .with_ip(ip)
        .with_uid(label(LABEL_UID).unwrap_or_default())
        .with_created_at(meta.creation_timestamp.as_ref().map(|t| SystemTime::from(t.0)))
        .with_installation(label(LABEL_INSTALLATION))
}

#[async_trait]
impl Provider for KubernetesProvider {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let op = Op::Create;
        let id = id::format(&req.namespace, &req.name);
        self.in_scope(op, &id, &req.namespace)?;
        if let Some(group) = req.spread_group.as_deref().filter(|g| !is_label_value(g)) {
            return Err(self.permanent(
                op,
                &id,
                format!("spread group {group:?} is not a label value (at most 63 letters, digits, '-', '_', '.')"),
            ));
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &req.namespace);
        let pod = build_pod(req, &self.settings);
        match self
            .call(cx, "creating the pod", pods.create(&PostParams::default(), &pod))
            .await
        {
            Ok(_) => {}
            Err(f) if is_already_exists(f.failure()) => {
                // Idempotent by name, but only for this Proxy's Pod.
                let existing = self
                    .call(cx, "reading the existing pod", pods.get(&req.name))
                    .await
                    .map_err(|f| self.error(op, &id, &f))?;
                let found = instance_of(&existing);
                let managed = existing
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_MANAGED))
                    .is_some_and(|v| v == "true");
                if !managed {
                    return Err(self.permanent(
                        op,
                        &id,
                        format!("pod {id} exists but is not managed by this operator"),
                    ));
                }
                if !found.uid.is_empty() && found.uid != req.uid {
                    return Err(self.permanent(
                        op,
                        &id,
                        format!("pod {id} belongs to proxy uid {}, not {}", found.uid, req.uid),
                    ));
                }
            }
            Err(mut f) => {
                // The Pod carries no cloud-init, but an API answer may quote a request: never
                // let it through.
                f.message = scrub(&f.message, &req.cloud_init);
                return Err(self.error(op, &id, &f));
            }
        }
        tracing::debug!(provider = %self.entry, namespace = %req.namespace, name = %req.name, "kubernetes pod created");
        Ok(ProviderId::new(id))
    }

    async fn get(&self, cx: &OpCtx, pid: &ProviderId) -> Result<Instance, ProviderError> {
        let op = Op::Get;
        let (namespace, name) = id::parse(pid.as_str()).map_err(|m| self.permanent(op, pid.as_str(), m))?;
        self.in_scope(op, pid.as_str(), namespace)?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = self
            .call(cx, "reading the pod", pods.get(name))
            .await
            .map_err(|f| self.error(op, pid.as_str(), &f))?;
        let instance = instance_of(&pod);
        tracing::debug!(provider = %self.entry, namespace, name, state = ?instance.state, "kubernetes pod fetched");
        Ok(instance)
    }

    async fn delete(&self, cx: &OpCtx, pid: &ProviderId) -> Result<(), ProviderError> {
        let op = Op::Delete;
        let (namespace, name) = id::parse(pid.as_str()).map_err(|m| self.permanent(op, pid.as_str(), m))?;
        self.in_scope(op, pid.as_str(), namespace)?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match self
            .call(cx, "deleting the pod", pods.delete(name, &DeleteParams::default()))
            .await
        {
            Ok(_) => {}
            Err(f) if classify(f.failure(), op) == ErrorClass::NotFound => {}
            Err(f) => return Err(self.error(op, pid.as_str(), &f)),
        }
        tracing::debug!(provider = %self.entry, namespace, name, "kubernetes pod deleted");
        Ok(())
    }

    async fn list_by_tag(&self, cx: &OpCtx) -> Result<Vec<Instance>, ProviderError> {
        let params = ListParams::default().labels(&format!("{LABEL_MANAGED}=true"));
        let mut found = Vec::new();
        // A namespace that cannot be listed fails the whole list: GC must never act on part.
        for pods in self.scoped_pods() {
            let list = self
                .call(cx, "listing managed pods", pods.list(&params))
                .await
                .map_err(|f| self.error(Op::List, "", &f))?;
            found.extend(list.items.iter().map(instance_of));
        }
        tracing::debug!(provider = %self.entry, managed = found.len(), "kubernetes pods listed");
        Ok(found)
    }

    async fn mark_installation(&self, cx: &OpCtx, pid: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        let op = Op::Mark;
        let (namespace, name) = id::parse(pid.as_str()).map_err(|m| self.permanent(op, pid.as_str(), m))?;
        self.in_scope(op, pid.as_str(), namespace)?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = self
            .call(cx, "reading the pod", pods.get(name))
            .await
            .map_err(|f| self.error(op, pid.as_str(), &f))?;
        let label = |key: &str| {
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(key))
                .map(String::as_str)
        };
        let managed = label(LABEL_MANAGED) == Some(LABEL_MANAGED_YES);
        match marking(pid.as_str(), managed, label(LABEL_INSTALLATION), installation) {
            Marking::AlreadyMarked => {
                tracing::debug!(provider = %self.entry, namespace, name, installation, "kubernetes pod already marked");
                return Ok(());
            }
            Marking::Refused(why) => return Err(self.permanent(op, pid.as_str(), why)),
            Marking::Write => {}
        }
        // The patch names the resourceVersion read above: a Pod changed since (a mark written by
        // someone else, say) answers 409 Conflict, Transient, and the next call reads it again.
        let patch = Pod {
            metadata: ObjectMeta {
                resource_version: pod.metadata.resource_version.clone(),
                labels: Some(BTreeMap::from([(
                    LABEL_INSTALLATION.to_owned(),
                    installation.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        self.call(
            cx,
            "labelling the pod",
            pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map_err(|f| self.error(op, pid.as_str(), &f))?;
        tracing::debug!(provider = %self.entry, namespace, name, installation, "kubernetes pod marked");
        Ok(())
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(self.clone()))
    }
}

/// The check's reason for a failed list (§6.1, first match wins).
fn check_reason(f: &Failed, round_over: bool) -> &'static str {
    match &f.class_source {
        _ if round_over => REASON_TIMEOUT,
        Source::Interrupted => REASON_TIMEOUT,
        Source::Api { reason, code } if reason == "Timeout" || reason == "ServerTimeout" || *code == 504 => {
            REASON_TIMEOUT
        }
        Source::Api { code: 401, .. } => REASON_UNAUTHORIZED,
        Source::Api { code: 403, .. } => REASON_FORBIDDEN,
        Source::Api { .. } => REASON_API_ERROR,
        Source::Transport => REASON_UNREACHABLE,
    }
}

#[async_trait]
impl Checker for KubernetesProvider {
    async fn check(&self, cx: &OpCtx) -> Vec<TargetStatus> {
        let started = Instant::now();
        let params = ListParams::default().labels(&format!("{LABEL_MANAGED}=true")).limit(1);
        // Every namespace is asked, so a grant missing in one of them shows.
        let mut listed = Ok(());
        for pods in self.scoped_pods() {
            listed = self
                .call(cx, "listing managed pods", pods.list(&params))
                .await
                .map(drop);
            if listed.is_err() {
                break;
            }
        }
        let latency = started.elapsed().max(Duration::from_nanos(1));
        let mut status = match listed {
            Ok(_) => TargetStatus::reachable(TARGET, &self.api_host, latency),
            Err(f) => TargetStatus::failed(
                TARGET,
                &self.api_host,
                check_reason(&f, cx.interrupted().is_some()),
                f.message.clone(),
                latency,
            ),
        };
        if status.ready
            && let Ok(Ok(info)) = cx.run_within(CALL_BUDGET, self.client.apiserver_version()).await
        {
            status.details = BTreeMap::from([("version".to_owned(), info.git_version)]);
        }
        tracing::debug!(provider = %self.entry, ready = status.ready, reason = %status.reason, "kubernetes apiserver checked");
        vec![status]
    }
}
