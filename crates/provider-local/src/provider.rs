//! The provider and its checker over a [`Machine`].

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use egress_provider::{
    Checker, CreateRequest, ErrorClass, ErrorScope, Instance, InstanceState, LABEL_INSTALLATION, LABEL_MANAGED,
    LABEL_MANAGED_YES, LABEL_UID, Marking, Op, OpCtx, Provider, ProviderError, ProviderId, REASON_API_ERROR,
    REASON_FORBIDDEN, REASON_TIMEOUT, REASON_UNREACHABLE, TargetStatus, marking, redact,
};
use tracing::Instrument;

use crate::machine::{self, Liveness, Machine};
use crate::record::{self, LOCATION, ParsedId, Record};

/// The budget of one file or process-table call.
pub const CALL_BUDGET: Duration = Duration::from_secs(5);
/// The budget of starting tinyproxy.
pub const LAUNCH_BUDGET: Duration = Duration::from_secs(10);
/// The budget of stopping tinyproxy (terminate, grace, kill, grace).
pub const STOP_BUDGET: Duration = Duration::from_secs(10);
/// How many address candidates create tries before giving up.
const ADDRESS_ATTEMPTS: u32 = 16;

/// Settings of one `local` entry, after defaults.
#[derive(Clone, Debug)]
pub struct LocalSettings {
    /// The configured entry name (in every error).
    pub entry: String,
    /// Salt for address candidates: the state directory, so two entries (or
    /// two test runs) on one machine pick different addresses.
    pub salt: String,
    /// The user and group tinyproxy drops to when started as root.
    pub drop_to: Option<(String, String)>,
    /// The ports a `CONNECT` may reach (`local.connectPorts`, default 443).
    pub connect_ports: Vec<u16>,
}

/// Proxies as tinyproxy processes on this machine.
#[derive(Debug)]
pub struct LocalProvider {
    settings: LocalSettings,
    machine: Arc<dyn Machine>,
    /// One lock per instance name, shared by create and delete, so a create
    /// never restarts a process a concurrent delete is stopping.
    names: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl LocalProvider {
    /// A provider over `machine`. Never touches the machine.
    pub fn new(settings: LocalSettings, machine: Arc<dyn Machine>) -> Self {
        Self {
            settings,
            machine,
            names: Mutex::new(HashMap::new()),
        }
    }

    fn scope(&self, op: Op, id: &str) -> ErrorScope {
        ErrorScope::new(op, self.settings.entry.clone(), id)
    }

    fn name_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(lock) = names.get(name).and_then(Weak::upgrade) {
            return lock;
        }
        names.retain(|_, w| w.strong_count() > 0);
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        names.insert(name.to_owned(), Arc::downgrade(&lock));
        lock
    }

    /// One machine call, bounded by `budget` and by `cx`, inside a
    /// `local.<kind>` span; the I/O result is handed back as is.
    async fn call_raw<T>(
        &self,
        cx: &OpCtx,
        scope: &ErrorScope,
        kind: &'static str,
        name: &str,
        budget: Duration,
        fut: impl Future<Output = io::Result<T>>,
    ) -> Result<io::Result<T>, ProviderError> {
        let span =
            tracing::debug_span!("local.call", otel.name = %format_args!("local.{kind}"), call = kind, instance = name);
        cx.run_within(budget, fut.instrument(span))
            .await
            .map_err(|why| scope.interrupted(why))
    }

    /// [`call_raw`](Self::call_raw) with the I/O error classified and wrapped.
    async fn call<T>(
        &self,
        cx: &OpCtx,
        scope: &ErrorScope,
        kind: &'static str,
        name: &str,
        budget: Duration,
        fut: impl Future<Output = io::Result<T>>,
    ) -> Result<T, ProviderError> {
        self.call_raw(cx, scope, kind, name, budget, fut).await?.map_err(|e| {
            let what = if name.is_empty() {
                kind.to_owned()
            } else {
                format!("{kind} {name}")
            };
            scope.message(classify(kind, &e), format!("{what}: {}", os_text(&e)))
        })
    }

    /// The record of `name`, or `None` when the machine has none.
    async fn read_record(&self, cx: &OpCtx, scope: &ErrorScope, name: &str) -> Result<Option<Record>, ProviderError> {
        let bytes = match self
            .call(cx, scope, machine::READ, name, CALL_BUDGET, self.machine.read(name))
            .await
        {
            Ok(bytes) => bytes,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        // NB: a record that does not parse is not "gone": it is a state
        // directory problem someone must look at.
        Record::from_bytes(&bytes)
            .map(Some)
            .map_err(|why| scope.transient(format!("{name}: {why}")))
    }

    async fn write_record(&self, cx: &OpCtx, scope: &ErrorScope, record: &Record) -> Result<(), ProviderError> {
        let bytes = record.to_bytes();
        self.call(
            cx,
            scope,
            machine::WRITE,
            &record.name,
            CALL_BUDGET,
            self.machine.write(&record.name, &bytes),
        )
        .await
    }

    /// What the process of `record` is doing now.
    async fn liveness(&self, cx: &OpCtx, scope: &ErrorScope, record: &Record) -> Result<Liveness, ProviderError> {
        self.call(
            cx,
            scope,
            machine::INSPECT,
            &record.name,
            CALL_BUDGET,
            self.machine.inspect(&record.name, record.listen_addr()),
        )
        .await
    }

    /// The instance a record describes, with the process state read now.
    async fn instance(&self, cx: &OpCtx, scope: &ErrorScope, record: &Record) -> Result<Instance, ProviderError> {
        let liveness = self.liveness(cx, scope, record).await?;
        let state = match liveness {
            // A delete stopped part way (its process, or its files, already gone).
            Liveness::NotStarted | Liveness::Gone if record.deleting => InstanceState::Terminated,
            // Recorded but never started: still being created.
            Liveness::NotStarted | Liveness::Starting => InstanceState::Provisioning,
            Liveness::Gone | Liveness::Suspended => InstanceState::Stopped,
            Liveness::Listening => InstanceState::Running,
        };
        Ok(Instance::new(record::id_of(&record.name), state)
            .with_ip((state == InstanceState::Running).then_some(IpAddr::V4(record.address)))
            .with_uid(record.uid())
            .with_created_at(record.created())
            .with_installation(record.marks.get(LABEL_INSTALLATION).cloned()))
    }

    /// The tinyproxy config of `record`, taking the credentials of `req`.
    fn config_of(&self, record: &Record, req: &CreateRequest) -> String {
        let dir = self.machine.instance_dir(&record.name);
        let drop_to = self.settings.drop_to.as_ref().map(|(u, g)| (u.as_str(), g.as_str()));
        let rules = record::Rules {
            connect_ports: &self.settings.connect_ports,
            credentials: req.credentials.as_ref().map(|c| &c.credentials),
        };
        record::tinyproxy_config(record, &dir, drop_to, &rules)
    }

    /// tinyproxy's `BasicAuth` line has no quoting: only plain credentials fit it.
    fn credentials_ok(&self, scope: &ErrorScope, req: &CreateRequest) -> Result<(), ProviderError> {
        match &req.credentials {
            Some(c) if !c.credentials.is_plain() => Err(scope.permanent(
                "tinyproxy takes only letters and digits in a user name and password (generated credentials are)",
            )),
            _ => Ok(()),
        }
    }

    fn placement_ok(&self, scope: &ErrorScope, req: &CreateRequest) -> Result<(), ProviderError> {
        let p = &req.placement;
        if !p.zone.is_empty() && p.zone != LOCATION {
            return Err(scope.permanent(format!(
                "placement.zone {:?} is not served by this provider (leave it empty or use {LOCATION:?})",
                p.zone
            )));
        }
        for (field, value) in [
            ("region", &p.region),
            ("machineType", &p.machine_type),
            ("image", &p.image),
        ] {
            if !value.is_empty() {
                return Err(scope.permanent(format!(
                    "placement.{field} {value:?} is not supported: a local proxy is a tinyproxy process"
                )));
            }
        }
        Ok(())
    }

    /// Adoption guard: only a managed record with this request's UID is taken over.
    fn adopt(&self, scope: &ErrorScope, req: &CreateRequest, record: &Record) -> Result<(), ProviderError> {
        if !record.is_managed() {
            return Err(scope.permanent(format!(
                "instance {} exists but is not managed by this operator; refusing to adopt it",
                record.name
            )));
        }
        if record.uid() != req.uid {
            return Err(scope.permanent(format!(
                "instance {} belongs to Proxy UID {:?}, not {:?}; refusing to adopt it",
                record.name,
                record.uid(),
                req.uid
            )));
        }
        if record.deleting {
            return Err(scope.transient(format!("instance {} is being deleted", record.name)));
        }
        Ok(())
    }

    /// A fresh record for `req`, at the first free address candidate.
    async fn new_record(&self, cx: &OpCtx, scope: &ErrorScope, req: &CreateRequest) -> Result<Record, ProviderError> {
        let mut marks = std::collections::BTreeMap::from([
            (LABEL_MANAGED.to_owned(), LABEL_MANAGED_YES.to_owned()),
            (LABEL_UID.to_owned(), req.uid.clone()),
        ]);
        if let Some(installation) = &req.installation {
            marks.insert(LABEL_INSTALLATION.to_owned(), installation.clone());
        }
        for attempt in 0..ADDRESS_ATTEMPTS {
            let address = record::address_candidate(&self.settings.salt, &req.name, attempt);
            let at = std::net::SocketAddr::from((address, req.port));
            let taken = self
                .call(
                    cx,
                    scope,
                    machine::BIND,
                    &req.name,
                    CALL_BUDGET,
                    self.machine.in_use(at),
                )
                .await?;
            if !taken {
                return Ok(Record {
                    name: req.name.clone(),
                    marks,
                    created_at: record::timestamp(SystemTime::now()),
                    address,
                    port: req.port,
                    deleting: false,
                });
            }
        }
        Err(scope.quota(format!(
            "no free loopback address for port {} after {ADDRESS_ATTEMPTS} candidates",
            req.port
        )))
    }

    /// Create found a record: adopt it if it is ours, and start its process
    /// if an earlier create stopped before doing so.
    async fn resume(
        &self,
        cx: &OpCtx,
        scope: &ErrorScope,
        req: &CreateRequest,
        record: &Record,
    ) -> Result<(), ProviderError> {
        self.adopt(scope, req, record)?;
        let liveness = self.liveness(cx, scope, record).await?;
        if liveness == Liveness::NotStarted {
            let config = self.config_of(record, req);
            self.call(
                cx,
                scope,
                machine::LAUNCH,
                &record.name,
                LAUNCH_BUDGET,
                self.machine.launch(&record.name, &config),
            )
            .await?;
        }
        Ok(())
    }

    fn parse(&self, scope: &ErrorScope, id: &ProviderId) -> Result<ParsedId, ProviderError> {
        record::parse_id(id.as_str()).ok_or_else(|| {
            scope.permanent(format!(
                "malformed id {:?}: want {LOCATION}/<instance name>",
                id.as_str()
            ))
        })
    }
}

/// Whether an error's text was written by the system or by this crate.
fn is_own(e: &io::Error) -> bool {
    e.raw_os_error().is_some() || e.get_ref().is_some_and(|inner| inner.is::<machine::MachineMessage>())
}

/// The text of a machine error that may be shown: the system's own message
/// for an OS error or our own; anything else may echo what it was given, so it is
/// scrubbed of credentials.
fn os_text(e: &io::Error) -> String {
    if is_own(e) {
        e.to_string()
    } else {
        redact(&e.to_string())
    }
}

/// Inside create a not-found is never reported as NotFound.
fn not_not_found(e: ProviderError, scope: &ErrorScope) -> ProviderError {
    if e.is_not_found() {
        scope.transient(e.to_string())
    } else {
        e
    }
}

#[async_trait]
impl Provider for LocalProvider {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        let scope = self.scope(Op::Create, "");
        self.placement_ok(&scope, req)?;
        self.credentials_ok(&scope, req)?;
        let lock = self.name_lock(&req.name);
        let _held = cx.run(lock.lock()).await.map_err(|why| scope.interrupted(why))?;
        let id = ProviderId::new(record::id_of(&req.name));
        let result = async {
            if let Some(existing) = self.read_record(cx, &scope, &req.name).await? {
                return self.resume(cx, &scope, req, &existing).await;
            }
            let fresh = self.new_record(cx, &scope, req).await?;
            let (bytes, config) = (fresh.to_bytes(), self.config_of(&fresh, req));
            let created = self
                .call_raw(
                    cx,
                    &scope,
                    machine::CREATE,
                    &req.name,
                    LAUNCH_BUDGET,
                    self.machine.create(&req.name, &bytes, &config),
                )
                .await?;
            match created {
                Ok(()) => Ok(()),
                // Another process created it in between: adopt what it wrote.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    match self.read_record(cx, &scope, &req.name).await? {
                        Some(existing) => self.resume(cx, &scope, req, &existing).await,
                        None => Err(scope.transient(format!("{} appeared and vanished during create", req.name))),
                    }
                }
                // NB: only the system's messages and our own are quoted for
                // the creating call: other text might echo what it was given.
                Err(e) => {
                    let text = if is_own(&e) {
                        e.to_string()
                    } else {
                        e.kind().to_string()
                    };
                    Err(scope.message(
                        classify(machine::CREATE, &e),
                        format!("create {} failed: {text}", req.name),
                    ))
                }
            }
        }
        .await;
        result.map_err(|e| not_not_found(e, &scope))?;
        tracing::debug!(id = %id, cloudInitBytes = req.cloud_init.len(), "Instance created (cloud-init is not used by local proxies)");
        Ok(id)
    }

    async fn get(&self, cx: &OpCtx, id: &ProviderId) -> Result<Instance, ProviderError> {
        let scope = self.scope(Op::Get, id.as_str());
        let name = match self.parse(&scope, id)? {
            ParsedId::Here(name) => name,
            ParsedId::Elsewhere(location) => {
                return Err(scope.permanent(format!("location {location:?} is not this provider's ({LOCATION:?})")));
            }
        };
        let Some(record) = self.read_record(cx, &scope, &name).await? else {
            return Err(scope.not_found(format!("no record for {name}")));
        };
        let instance = self.instance(cx, &scope, &record).await?;
        tracing::debug!(id = %id, state = %instance.state, "Instance read");
        Ok(instance)
    }

    async fn delete(&self, cx: &OpCtx, id: &ProviderId) -> Result<(), ProviderError> {
        let scope = self.scope(Op::Delete, id.as_str());
        let name = match self.parse(&scope, id)? {
            ParsedId::Here(name) => name,
            ParsedId::Elsewhere(location) => {
                tracing::info!(id = %id, location = %location, "Nothing deleted: the instance belongs to another location");
                return Ok(());
            }
        };
        let lock = self.name_lock(&name);
        let _held = cx.run(lock.lock()).await.map_err(|why| scope.interrupted(why))?;
        let Some(mut record) = self.read_record(cx, &scope, &name).await? else {
            tracing::debug!(id = %id, "Instance already gone");
            return Ok(());
        };
        if !record.deleting {
            record.deleting = true;
            self.write_record(cx, &scope, &record).await?;
        }
        self.call(cx, &scope, machine::STOP, &name, STOP_BUDGET, self.machine.stop(&name))
            .await?;
        self.call(
            cx,
            &scope,
            machine::REMOVE,
            &name,
            CALL_BUDGET,
            self.machine.remove(&name),
        )
        .await?;
        tracing::debug!(id = %id, "Instance deleted");
        Ok(())
    }

    async fn list_by_tag(&self, cx: &OpCtx) -> Result<Vec<Instance>, ProviderError> {
        let scope = self.scope(Op::List, "");
        let names = self
            .call(cx, &scope, machine::LIST, "", CALL_BUDGET, self.machine.names())
            .await?;
        let mut out = Vec::new();
        for name in names {
            let read = async {
                match self.read_record(cx, &scope, &name).await? {
                    Some(record) if record.is_managed() => self.instance(cx, &scope, &record).await.map(Some),
                    // Gone since the listing, or not ours.
                    _ => Ok(None),
                }
            };
            match read.await {
                Ok(Some(instance)) => out.push(instance),
                Ok(None) => {}
                // Cancellation ends the whole list: a partial list must not look complete.
                Err(e) if cx.interrupted().is_some() => return Err(e),
                Err(e) => {
                    // Omitting is safe: GC never deletes what it does not see.
                    tracing::warn!(instance = %name, error = %e, "Skipped an instance whose record or process could not be read");
                }
            }
        }
        tracing::debug!(count = out.len(), "Listed managed instances");
        Ok(out)
    }

    async fn mark_installation(&self, cx: &OpCtx, id: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        let scope = self.scope(Op::Mark, id.as_str());
        let name = match self.parse(&scope, id)? {
            ParsedId::Here(name) => name,
            ParsedId::Elsewhere(location) => {
                return Err(scope.permanent(format!("location {location:?} is not this provider's ({LOCATION:?})")));
            }
        };
        // The record is read and written back under the name's lock, which create and delete
        // take too: neither can remove or rewrite it in between.
        let lock = self.name_lock(&name);
        let _held = cx.run(lock.lock()).await.map_err(|why| scope.interrupted(why))?;
        let Some(mut record) = self.read_record(cx, &scope, &name).await? else {
            return Err(scope.not_found(format!("no record for {name}")));
        };
        let current = record.marks.get(LABEL_INSTALLATION).map(String::as_str);
        match marking(&name, record.is_managed(), current, installation) {
            Marking::AlreadyMarked => {
                tracing::debug!(id = %id, installation, "Installation mark already there");
                return Ok(());
            }
            Marking::Refused(why) => return Err(scope.permanent(why)),
            Marking::Write => {}
        }
        record
            .marks
            .insert(LABEL_INSTALLATION.to_owned(), installation.to_owned());
        self.write_record(cx, &scope, &record).await?;
        tracing::debug!(id = %id, installation, "Installation mark written");
        Ok(())
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(LocalChecker {
            entry: self.settings.entry.clone(),
            machine: self.machine.clone(),
        }))
    }
}

/// The classify table: what an I/O error of machine call `call` means.
///
/// | error | class |
/// |---|---|
/// | `read` finds no record | NotFound |
/// | no space left, disk quota, no more processes (`EAGAIN` from fork) | QuotaExceeded |
/// | permission denied, invalid input or data (a bad path or binary) | Permanent |
/// | anything else (timeouts, a missing directory or binary, busy) | Transient |
///
/// Only a missing record means "instance gone": a missing file anywhere
/// else (the binary, the directory) is Transient.
pub fn classify(call: &str, e: &io::Error) -> ErrorClass {
    match e.kind() {
        io::ErrorKind::NotFound if call == machine::READ => ErrorClass::NotFound,
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::WouldBlock => {
            ErrorClass::QuotaExceeded
        }
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => {
            ErrorClass::Permanent
        }
        _ => ErrorClass::Transient,
    }
}

/// The checker: one target (`local`), ready when the state directory is
/// writable and the tinyproxy binary runs.
#[derive(Debug)]
struct LocalChecker {
    entry: String,
    machine: Arc<dyn Machine>,
}

#[async_trait]
impl Checker for LocalChecker {
    async fn check(&self, cx: &OpCtx) -> Vec<TargetStatus> {
        let start = Instant::now();
        let address = self.machine.describe();
        let span = tracing::debug_span!("local.check", entry = %self.entry);
        let probe = async {
            self.machine.prepare().await?;
            self.machine.version().await
        };
        let status = match cx.run_within(CALL_BUDGET, probe.instrument(span)).await {
            Ok(Ok(version)) => {
                let mut ok = TargetStatus::reachable(LOCATION, address, start.elapsed().max(Duration::from_nanos(1)));
                ok.details.insert("tinyproxy".to_owned(), version);
                ok
            }
            Ok(Err(e)) => {
                let reason = match e.kind() {
                    io::ErrorKind::PermissionDenied => REASON_FORBIDDEN,
                    io::ErrorKind::NotFound => REASON_UNREACHABLE,
                    io::ErrorKind::TimedOut => REASON_TIMEOUT,
                    _ => REASON_API_ERROR,
                };
                TargetStatus::failed(LOCATION, address, reason, e.to_string(), start.elapsed())
            }
            Err(why) => TargetStatus::failed(LOCATION, address, REASON_TIMEOUT, why.to_string(), start.elapsed()),
        };
        vec![status]
    }
}
