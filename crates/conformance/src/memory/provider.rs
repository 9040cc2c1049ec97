//! The reference provider over [`MemoryBackend`]: written the way a real
//! provider should be, so the suite has something that passes every case,
//! and with switchable [`Defect`]s, so the suite can be shown to catch the
//! mistakes real providers make.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use egress_provider::{
    Checker, CreateRequest, ErrorClass, ErrorScope, Instance, InstanceState, LABEL_INSTALLATION, LABEL_MANAGED,
    LABEL_MANAGED_YES, LABEL_UID, Marking, Op, OpCtx, Provider, ProviderError, ProviderId, REASON_API_ERROR,
    REASON_FORBIDDEN, REASON_TIMEOUT, REASON_UNAUTHORIZED, REASON_UNREACHABLE, TargetStatus, marking, redact,
};
use tracing::Instrument;

use super::backend::{BackendError, InstanceView, MemoryBackend, native};
use crate::hooks::Fault;

/// A deliberate contract violation, to prove the suite catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Defect {
    /// Reports NotFound when the backend merely failed.
    NotFoundOnTransientFault,
    /// Creates a second instance when the name is taken.
    CreateNotIdempotent,
    /// Lists instances without the managed mark.
    ListsUnmarked,
    /// Answers CreatedAt from what it remembers, not from the backend.
    CreatedAtFromMemory,
    /// Puts cloud-init into an error message.
    CloudInitInErrors,
    /// Does not stop when its call is cancelled.
    IgnoresCancellation,
    /// Reports Running without an address.
    RunningWithoutIp,
    /// Answers a mark with success without writing it.
    MarkNotWritten,
    /// Writes the mark without reading what the instance carries.
    MarksWithoutLooking,
}

/// The reference entry's settings.
#[derive(Clone, Debug)]
pub struct MemoryConfig {
    /// Zones instances may be created in (`placement.zone`).
    pub zones: Vec<String>,
    /// Machine catalogue (`placement.machineType`).
    pub machine_types: Vec<String>,
    /// Image catalogue (`placement.image`).
    pub images: Vec<String>,
    /// Credential file, re-read on every call.
    pub token_file: PathBuf,
    /// Budget of one backend call.
    pub call_budget: Duration,
}

/// The reference provider.
#[derive(Debug)]
pub struct MemoryProvider {
    entry: String,
    config: MemoryConfig,
    backend: MemoryBackend,
    defects: Vec<Defect>,
    /// Only used by the CreatedAtFromMemory defect.
    remembered: Mutex<HashMap<String, SystemTime>>,
    checker: Arc<MemoryChecker>,
}

impl MemoryProvider {
    /// A provider configured as `entry` over `backend`. Never calls the
    /// backend; a missing credential file is only warned about.
    pub fn new(entry: &str, config: MemoryConfig, backend: MemoryBackend, defects: Vec<Defect>) -> Self {
        if !config.token_file.exists() {
            tracing::warn!(
                path = %config.token_file.display(),
                "Credential file is not readable yet; every call fails until it is"
            );
        }
        let checker = Arc::new(MemoryChecker {
            entry: entry.to_owned(),
            config: config.clone(),
            backend: backend.clone(),
        });
        Self {
            entry: entry.to_owned(),
            config,
            backend,
            defects,
            remembered: Mutex::new(HashMap::new()),
            checker,
        }
    }

    fn has(&self, d: Defect) -> bool {
        self.defects.contains(&d)
    }

    fn scope(&self, op: Op, id: &str) -> ErrorScope {
        ErrorScope::new(op, self.entry.clone(), id)
    }

    /// Reads the token on every call, so a rotated file is picked up.
    fn token(&self, scope: &ErrorScope) -> Result<String, ProviderError> {
        read_token(&self.config.token_file).map_err(|(class, msg)| scope.message(class, msg))
    }

    /// One bounded backend call inside a `memory.<call>` child span.
    async fn call<T>(
        &self,
        cx: &OpCtx,
        scope: &ErrorScope,
        span: tracing::Span,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<Result<T, BackendError>, ProviderError> {
        let fut = fut.instrument(span);
        if self.has(Defect::IgnoresCancellation) {
            return Ok(fut.await);
        }
        cx.run_within(self.config.call_budget, fut)
            .await
            .map_err(|why| scope.interrupted(why))
    }

    /// Maps a backend error to its class (the provider's classify table).
    fn classify(&self, e: &BackendError) -> ErrorClass {
        let class = classify(&e.code);
        if self.has(Defect::NotFoundOnTransientFault) && class == ErrorClass::Transient {
            return ErrorClass::NotFound;
        }
        class
    }

    /// Wraps a backend error, scrubbed of credentials.
    fn wrap(&self, scope: &ErrorScope, e: &BackendError) -> ProviderError {
        scope.message(self.classify(e), redact(&e.text))
    }

    fn parse_id(&self, scope: &ErrorScope, id: &ProviderId) -> Result<(String, String), ProviderError> {
        parse_id(id.as_str()).ok_or_else(|| {
            scope.permanent(format!(
                "malformed id {:?}: want zones/<zone>/instances/<name>",
                id.as_str()
            ))
        })
    }

    fn zone_configured(&self, zone: &str) -> bool {
        self.config.zones.iter().any(|z| z == zone)
    }

    fn validate_placement(&self, scope: &ErrorScope, req: &CreateRequest) -> Result<(), ProviderError> {
        let p = &req.placement;
        let check = |field: &str, value: &str, known: &[String]| {
            if value.is_empty() {
                Err(scope.permanent(format!("placement.{field} is required")))
            } else if !known.iter().any(|k| k == value) {
                Err(scope.permanent(format!(
                    "placement.{field} {value:?} is not configured for this provider (known: {})",
                    known.join(", ")
                )))
            } else {
                Ok(())
            }
        };
        check("zone", &p.zone, &self.config.zones)?;
        check("machineType", &p.machine_type, &self.config.machine_types)?;
        check("image", &p.image, &self.config.images)
    }

    fn to_instance(&self, view: InstanceView) -> Instance {
        let created_at = if self.has(Defect::CreatedAtFromMemory) {
            self.remembered
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&view.name)
                .copied()
                .or_else(|| parse_created(&view.created))
        } else {
            parse_created(&view.created)
        };
        let state = match view.state.as_str() {
            native::PENDING => InstanceState::Provisioning,
            native::RUNNING => InstanceState::Running,
            native::STOPPED => InstanceState::Stopped,
            native::TERMINATED | native::DELETING => InstanceState::Terminated,
            _ => InstanceState::Stopped,
        };
        let instance = Instance {
            id: ProviderId::new(format!("zones/{}/instances/{}", view.zone, view.name)),
            ip: view.ip,
            state,
            uid: view.labels.get(LABEL_UID).cloned().unwrap_or_default(),
            created_at,
            installation: view.labels.get(LABEL_INSTALLATION).cloned(),
        };
        if self.has(Defect::RunningWithoutIp) {
            instance
        } else {
            instance.normalised()
        }
    }

    async fn lookup(
        &self,
        cx: &OpCtx,
        scope: &ErrorScope,
        token: &str,
        zone: &str,
        name: &str,
    ) -> Result<Result<InstanceView, BackendError>, ProviderError> {
        let span = tracing::debug_span!("memory.lookup", zone, name);
        self.call(cx, scope, span, self.backend.lookup(token, zone, name)).await
    }

    /// Whether instance `name` of `zone` is to be marked as `installation`'s, read from the
    /// backend: `false` when it carries that mark already; Permanent when it is not this
    /// operator's to mark ([`marking`]).
    async fn needs_mark(
        &self,
        cx: &OpCtx,
        scope: &ErrorScope,
        token: &str,
        (zone, name): (&str, &str),
        installation: &str,
    ) -> Result<bool, ProviderError> {
        let view = self
            .lookup(cx, scope, token, zone, name)
            .await?
            .map_err(|e| self.wrap(scope, &e))?;
        let managed = view.labels.get(LABEL_MANAGED).is_some_and(|v| v == LABEL_MANAGED_YES);
        let current = view.labels.get(LABEL_INSTALLATION).map(String::as_str);
        match marking(name, managed, current, installation) {
            Marking::AlreadyMarked => Ok(false),
            Marking::Write => Ok(true),
            Marking::Refused(why) => Err(scope.permanent(why)),
        }
    }

    /// Adoption guard: only an instance marked with this request's UID is
    /// taken over.
    fn adopt(&self, scope: &ErrorScope, req: &CreateRequest, view: &InstanceView) -> Result<ProviderId, ProviderError> {
        let managed = view.labels.get(LABEL_MANAGED).is_some_and(|v| v == LABEL_MANAGED_YES);
        let uid = view.labels.get(LABEL_UID).map(String::as_str).unwrap_or("");
        if !managed {
            return Err(scope.permanent(format!(
                "instance {} exists but is not managed by this operator; refusing to adopt it",
                view.name
            )));
        }
        if uid != req.uid {
            return Err(scope.permanent(format!(
                "instance {} belongs to Proxy UID {uid:?}, not {:?}; refusing to adopt it",
                view.name, req.uid
            )));
        }
        Ok(ProviderId::new(format!("zones/{}/instances/{}", view.zone, view.name)))
    }
}

#[async_trait]
impl Provider for MemoryProvider {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let scope = self.scope(Op::Create, "");
        self.validate_placement(&scope, req)?;
        let token = self.token(&scope)?;
        let zone = req.placement.zone.as_str();
        if !self.has(Defect::CreateNotIdempotent) {
            match self.lookup(cx, &scope, &token, zone, &req.name).await? {
                Ok(view) => return self.adopt(&scope, req, &view),
                Err(e) if e.code == Fault::NotFound => {}
                // NB: a not-found answer is expected here; anything else is
                // classified, but never as NotFound (create must not say it).
                Err(e) => return Err(not_not_found(self.wrap(&scope, &e), &scope)),
            }
        }
        let mut labels = BTreeMap::from([
            (LABEL_MANAGED.to_owned(), LABEL_MANAGED_YES.to_owned()),
            (LABEL_UID.to_owned(), req.uid.clone()),
        ]);
        if let Some(inst) = &req.installation {
            labels.insert(LABEL_INSTALLATION.to_owned(), inst.clone());
        }
        let span = tracing::debug_span!("memory.insert", zone, name = %req.name);
        let inserted = self
            .call(
                cx,
                &scope,
                span,
                self.backend
                    .insert(&token, zone, &req.name, labels.clone(), &req.cloud_init),
            )
            .await?;
        let name = match inserted {
            Ok(()) => req.name.clone(),
            Err(e) if e.code == Fault::AlreadyExists && self.has(Defect::CreateNotIdempotent) => {
                let other = format!("{}-2", req.name);
                let span = tracing::debug_span!("memory.insert", zone, name = %other);
                self.call(
                    cx,
                    &scope,
                    span,
                    self.backend.insert(&token, zone, &other, labels, &req.cloud_init),
                )
                .await?
                .map_err(|e| self.wrap(&scope, &e))?;
                other
            }
            Err(e) if e.code == Fault::AlreadyExists => {
                // Lost a race with a concurrent create of the same name.
                let view = self
                    .lookup(cx, &scope, &token, zone, &req.name)
                    .await?
                    .map_err(|e| not_not_found(self.wrap(&scope, &e), &scope))?;
                return self.adopt(&scope, req, &view);
            }
            Err(e) => {
                // NB: an API may echo the request in its answer, and this
                // request carried user-data: quote only the code.
                let err = scope.message(
                    self.classify(&e),
                    format!(
                        "insert failed with {} (the response is not quoted: the request carried user-data)",
                        e.code_name()
                    ),
                );
                let err = not_not_found(err, &scope);
                if self.has(Defect::CloudInitInErrors) {
                    return Err(scope.message(
                        err.class(),
                        format!("{err} (user-data was {:?})", String::from_utf8_lossy(&req.cloud_init)),
                    ));
                }
                return Err(err);
            }
        };
        if self.has(Defect::CreatedAtFromMemory) {
            self.remembered
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.clone(), SystemTime::now());
        }
        let id = ProviderId::new(format!("zones/{zone}/instances/{name}"));
        tracing::debug!(id = %id, cloudInitBytes = req.cloud_init.len(), "Instance created");
        Ok(id)
    }

    async fn get(&self, cx: &OpCtx, id: &ProviderId) -> Result<Instance, ProviderError> {
        let scope = self.scope(Op::Get, id.as_str());
        let (zone, name) = self.parse_id(&scope, id)?;
        if !self.zone_configured(&zone) {
            return Err(scope.permanent(format!("zone {zone:?} is not configured for this provider")));
        }
        let token = self.token(&scope)?;
        let view = self
            .lookup(cx, &scope, &token, &zone, &name)
            .await?
            .map_err(|e| self.wrap(&scope, &e))?;
        let instance = self.to_instance(view);
        tracing::debug!(id = %id, state = %instance.state, "Instance read");
        Ok(instance)
    }

    async fn delete(&self, cx: &OpCtx, id: &ProviderId) -> Result<(), ProviderError> {
        let scope = self.scope(Op::Delete, id.as_str());
        let (zone, name) = self.parse_id(&scope, id)?;
        if !self.zone_configured(&zone) {
            tracing::info!(id = %id, zone = %zone, "Nothing deleted: the zone is no longer configured for this provider");
            return Ok(());
        }
        let token = self.token(&scope)?;
        let span = tracing::debug_span!("memory.remove", zone = %zone, name = %name);
        match self
            .call(cx, &scope, span, self.backend.remove(&token, &zone, &name))
            .await?
        {
            Ok(()) => {
                tracing::debug!(id = %id, "Instance deleted");
                Ok(())
            }
            Err(e) if e.code == Fault::NotFound => {
                tracing::debug!(id = %id, "Instance already gone");
                Ok(())
            }
            Err(e) => Err(self.wrap(&scope, &e)),
        }
    }

    async fn list_by_tag(&self, cx: &OpCtx) -> Result<Vec<Instance>, ProviderError> {
        let scope = self.scope(Op::List, "");
        let token = self.token(&scope)?;
        let filter = (!self.has(Defect::ListsUnmarked)).then_some((LABEL_MANAGED, LABEL_MANAGED_YES));
        let mut out = Vec::new();
        for zone in &self.config.zones {
            let span = tracing::debug_span!("memory.list", zone = %zone);
            let names = self
                .call(cx, &scope, span, self.backend.list(&token, zone, filter, None))
                .await?
                .map_err(|e| self.wrap(&scope, &e))?;
            for name in names {
                match self.lookup(cx, &scope, &token, zone, &name).await? {
                    Ok(view) => out.push(self.to_instance(view)),
                    // Gone between list and read: nothing to collect.
                    Err(e) if e.code == Fault::NotFound => {}
                    Err(e) => {
                        // Omitting is safe: GC never deletes what it does not see.
                        tracing::warn!(zone = %zone, instance = %name, error = %redact(&e.text), "Skipped an instance whose details could not be read");
                    }
                }
            }
        }
        tracing::debug!(count = out.len(), "Listed managed instances");
        Ok(out)
    }

    async fn mark_installation(&self, cx: &OpCtx, id: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        let scope = self.scope(Op::Mark, id.as_str());
        let (zone, name) = self.parse_id(&scope, id)?;
        if !self.zone_configured(&zone) {
            return Err(scope.permanent(format!("zone {zone:?} is not configured for this provider")));
        }
        let token = self.token(&scope)?;
        if self.has(Defect::MarkNotWritten) {
            return Ok(());
        }
        let write = self.has(Defect::MarksWithoutLooking)
            || self
                .needs_mark(cx, &scope, &token, (&zone, &name), installation)
                .await?;
        if !write {
            tracing::debug!(id = %id, installation, "Installation mark already there");
            return Ok(());
        }
        // NB: the backend adds the label only while the key is still absent, so a mark written
        // since the lookup is never overwritten: the conflict is Transient, and the next call
        // reads it.
        let span = tracing::debug_span!("memory.label", zone = %zone, name = %name);
        self.call(
            cx,
            &scope,
            span,
            self.backend
                .add_label(&token, &zone, &name, LABEL_INSTALLATION, installation),
        )
        .await?
        .map_err(|e| self.wrap(&scope, &e))?;
        tracing::debug!(id = %id, installation, "Installation mark written");
        Ok(())
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(self.checker.clone())
    }
}

/// Inside create a not-found from the backend is never reported as NotFound
/// (rule CR12): it is a transient inconsistency.
fn not_not_found(e: ProviderError, scope: &ErrorScope) -> ProviderError {
    if e.is_not_found() {
        scope.transient(format!(
            "backend reported not found during create: {}",
            e.cause().map(|c| c.to_string()).unwrap_or_default()
        ))
    } else {
        e
    }
}

/// The classify table of the reference provider.
pub fn classify(code: &Fault) -> ErrorClass {
    match code {
        Fault::NotFound => ErrorClass::NotFound,
        Fault::Quota | Fault::RateLimit => ErrorClass::QuotaExceeded,
        Fault::Unauthenticated | Fault::PermissionDenied | Fault::BadRequest => ErrorClass::Permanent,
        Fault::AlreadyExists
        | Fault::Server5xx
        | Fault::Timeout
        | Fault::ConnectionReset
        | Fault::Busy
        | Fault::Raw(_) => ErrorClass::Transient,
    }
}

/// Parses `zones/<zone>/instances/<name>`, with non-empty zone and name.
pub fn parse_id(id: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = id.split('/').collect();
    match parts.as_slice() {
        ["zones", zone, "instances", name] if !zone.is_empty() && !name.is_empty() => {
            Some(((*zone).to_owned(), (*name).to_owned()))
        }
        _ => None,
    }
}

/// Unix seconds to a time; missing or garbage is `None` (very old), never now.
fn parse_created(raw: &str) -> Option<SystemTime> {
    raw.parse::<u64>().ok().map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

/// Reads `token:<value>` from the file. A missing file is Transient (it may
/// appear, e.g. an optional Secret mount); a file that is not a token file
/// is Permanent. Neither message quotes the content.
fn read_token(path: &std::path::Path) -> Result<String, (ErrorClass, String)> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        (
            ErrorClass::Transient,
            format!("credential file {} is not readable: {}", path.display(), e.kind()),
        )
    })?;
    let line = text.trim_end_matches('\n');
    match line.strip_prefix("token:") {
        Some(t) if !t.is_empty() && !t.contains(char::is_whitespace) => Ok(t.to_owned()),
        _ => Err((
            ErrorClass::Permanent,
            format!(
                "credential file {} does not hold a token (want one line token:<value>)",
                path.display()
            ),
        )),
    }
}

/// The reference checker: one `list` of at most one instance per zone.
#[derive(Debug)]
struct MemoryChecker {
    entry: String,
    config: MemoryConfig,
    backend: MemoryBackend,
}

#[async_trait]
impl Checker for MemoryChecker {
    async fn check(&self, cx: &OpCtx) -> Vec<TargetStatus> {
        let mut out = Vec::with_capacity(self.config.zones.len());
        for zone in &self.config.zones {
            let start = Instant::now();
            let address = format!("{zone}.compute.invalid");
            let token = match read_token(&self.config.token_file) {
                Ok(t) => t,
                Err((_, msg)) => {
                    out.push(TargetStatus::failed(
                        zone,
                        address,
                        REASON_UNAUTHORIZED,
                        msg,
                        start.elapsed(),
                    ));
                    continue;
                }
            };
            let span = tracing::debug_span!("memory.list", zone = %zone, entry = %self.entry);
            let call = self
                .backend
                .list(&token, zone, Some((LABEL_MANAGED, LABEL_MANAGED_YES)), Some(1))
                .instrument(span);
            let status = match cx.run_within(self.config.call_budget, call).await {
                Ok(Ok(_)) => TargetStatus::reachable(zone, address, start.elapsed().max(Duration::from_nanos(1))),
                Ok(Err(e)) => {
                    let reason = match e.code {
                        Fault::Unauthenticated => REASON_UNAUTHORIZED,
                        Fault::PermissionDenied => REASON_FORBIDDEN,
                        Fault::ConnectionReset => REASON_UNREACHABLE,
                        Fault::Timeout => REASON_TIMEOUT,
                        _ => REASON_API_ERROR,
                    };
                    TargetStatus::failed(zone, address, reason, redact(&e.text), start.elapsed())
                }
                Err(why) => TargetStatus::failed(zone, address, REASON_TIMEOUT, why.to_string(), start.elapsed()),
            };
            out.push(status);
        }
        out
    }
}
