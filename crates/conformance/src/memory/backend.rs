//! A simulated compute API kept in memory: zones of named instances with
//! labels, a boot disk per instance, a backend-recorded creation time, and
//! bearer-token authentication. Every call passes through an interceptor
//! that records it and applies the suite's injected faults, gates, delays
//! and outages.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::hooks::{
    BackendHooks, BackendObject, CallKind, Fault, HookResult, NativeState, SeedManaged, SeedSpec, SeedTime,
};
use crate::intercept::Interceptor;

/// Call kinds of the simulated API.
pub const INSERT: CallKind = CallKind("insert");
/// Reads one instance.
pub const LOOKUP: CallKind = CallKind("lookup");
/// Deletes one instance (and its disk).
pub const REMOVE: CallKind = CallKind("remove");
/// Lists instance names in a zone, optionally filtered by a label.
pub const LIST: CallKind = CallKind("list");
/// Adds one label to an instance, unless the key holds another value.
pub const LABEL: CallKind = CallKind("label");

/// The zone a request lands in when the suite does not name one.
pub const DEFAULT_ZONE: &str = "zone-a";
/// The zones the reference entry is configured with.
pub const ZONES: [&str; 2] = ["zone-a", "zone-b"];

/// Native state strings of the simulated API.
pub mod native {
    /// Being created.
    pub const PENDING: &str = "PENDING";
    /// Running.
    pub const RUNNING: &str = "RUNNING";
    /// Stopped.
    pub const STOPPED: &str = "STOPPED";
    /// Terminated.
    pub const TERMINATED: &str = "TERMINATED";
    /// Being deleted.
    pub const DELETING: &str = "DELETING";
}

/// An error as the simulated API reports it: a code and a text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendError {
    /// The error code.
    pub code: Fault,
    /// The text the API sends back (may echo the request).
    pub text: String,
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for BackendError {}

impl BackendError {
    /// The error code alone, without the API's text.
    pub fn code_name(&self) -> &'static str {
        match self.code {
            Fault::NotFound => "NOT_FOUND",
            Fault::AlreadyExists => "ALREADY_EXISTS",
            Fault::Quota => "QUOTA_EXCEEDED",
            Fault::RateLimit => "RATE_LIMITED",
            Fault::Unauthenticated => "UNAUTHENTICATED",
            Fault::PermissionDenied => "PERMISSION_DENIED",
            Fault::BadRequest => "BAD_REQUEST",
            Fault::Server5xx => "UNAVAILABLE",
            Fault::Timeout => "TIMEOUT",
            Fault::ConnectionReset => "CONNECTION_RESET",
            Fault::Busy => "BUSY",
            Fault::Raw(_) => "UNKNOWN",
        }
    }

    fn new(code: Fault, text: impl Into<String>) -> Self {
        Self {
            code,
            text: text.into(),
        }
    }
}

/// An instance as `lookup` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceView {
    /// Zone.
    pub zone: String,
    /// Name.
    pub name: String,
    /// Raw state string.
    pub state: String,
    /// Address, if any.
    pub ip: Option<IpAddr>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Creation time as the API records it: Unix seconds as a decimal string.
    pub created: String,
}

#[derive(Clone, Debug)]
struct Obj {
    view: InstanceView,
    user_data: Vec<u8>,
    unreadable: bool,
    locked: bool,
    /// Starts by itself: Running with an address on its second lookup.
    auto_start: bool,
    lookups: u32,
}

#[derive(Default, Debug)]
struct State {
    objects: BTreeMap<(String, String), Obj>,
    unreachable_zones: BTreeSet<String>,
    hold_pending: bool,
    tokens: BTreeSet<String>,
    next_ip: u32,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    interceptor: Interceptor,
    dir: PathBuf,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The simulated API and its test hooks. Clones share one backend.
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

/// The token a fresh backend accepts (and writes into its credential file).
pub const INITIAL_TOKEN: &str = "initial-token";

impl MemoryBackend {
    /// An empty backend with a credential file holding a valid token.
    ///
    /// # Panics
    /// When the temporary directory for the credential file cannot be made.
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "egress-conformance-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        std::fs::write(dir.join("token"), format!("token:{INITIAL_TOKEN}\n")).expect("a credential file");
        let mut state = State::default();
        state.tokens.insert(INITIAL_TOKEN.to_owned());
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                interceptor: Interceptor::new(),
                dir,
            }),
        }
    }

    /// The credential file providers over this backend read.
    pub fn token_file(&self) -> PathBuf {
        self.inner.dir.join("token")
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every call passes here first: the interceptor records it and applies
    /// the outage switch, gates, delays and injected faults; then a zone
    /// outage and authentication apply, in that order.
    async fn enter(&self, kind: CallKind, zone: &str, target: &str, token: &str) -> Result<(), BackendError> {
        match self.inner.interceptor.enter(kind, target).await {
            Err(Fault::ConnectionReset) | Ok(()) if self.lock().unreachable_zones.contains(zone) => {
                return Err(BackendError::new(
                    Fault::ConnectionReset,
                    format!("dial {zone}.compute.invalid:443: connection refused"),
                ));
            }
            Ok(()) => {}
            Err(fault) => return Err(fault_error(fault, kind, target, token)),
        }
        if !self.lock().tokens.contains(token) {
            return Err(BackendError::new(
                Fault::Unauthenticated,
                format!(
                    "401 Unauthorized: request {kind} {target} with header Authorization: Bearer {token} was rejected"
                ),
            ));
        }
        Ok(())
    }

    /// Creates an instance and its boot disk in one call, with its labels
    /// and user-data; refuses a name already taken in the zone.
    ///
    /// # Errors
    /// `AlreadyExists`, or whatever the interceptor injects.
    pub async fn insert(
        &self,
        token: &str,
        zone: &str,
        name: &str,
        labels: BTreeMap<String, String>,
        user_data: &[u8],
    ) -> Result<(), BackendError> {
        self.enter(INSERT, zone, name, token).await?;
        let mut st = self.lock();
        let key = (zone.to_owned(), name.to_owned());
        if st.objects.contains_key(&key) {
            return Err(BackendError::new(
                Fault::AlreadyExists,
                format!("409 Conflict: instance {zone}/{name} already exists"),
            ));
        }
        let auto_start = !st.hold_pending;
        st.objects.insert(
            key,
            Obj {
                view: InstanceView {
                    zone: zone.to_owned(),
                    name: name.to_owned(),
                    state: native::PENDING.to_owned(),
                    ip: None,
                    labels,
                    created: unix_seconds(SystemTime::now()),
                },
                user_data: user_data.to_vec(),
                unreadable: false,
                locked: false,
                auto_start,
                lookups: 0,
            },
        );
        Ok(())
    }

    /// Reads one instance.
    ///
    /// # Errors
    /// `NotFound`, `Busy` while locked, `Server5xx` when unreadable.
    pub async fn lookup(&self, token: &str, zone: &str, name: &str) -> Result<InstanceView, BackendError> {
        self.enter(LOOKUP, zone, name, token).await?;
        let mut st = self.lock();
        let next_ip = st.next_ip;
        let Some(obj) = st.objects.get_mut(&(zone.to_owned(), name.to_owned())) else {
            return Err(BackendError::new(
                Fault::NotFound,
                format!("404 Not Found: instance {zone}/{name}"),
            ));
        };
        if obj.locked {
            return Err(BackendError::new(Fault::Busy, format!("409 instance {name} is busy")));
        }
        if obj.unreadable {
            return Err(BackendError::new(
                Fault::Server5xx,
                format!("500 cannot read instance {name}"),
            ));
        }
        obj.lookups += 1;
        let mut took_ip = false;
        if obj.auto_start && obj.lookups >= 2 && obj.view.state == native::PENDING {
            obj.view.state = native::RUNNING.to_owned();
            obj.view.ip = Some(IpAddr::from([10, 0, (next_ip >> 8) as u8, next_ip as u8]));
            took_ip = true;
        }
        let view = obj.view.clone();
        if took_ip {
            st.next_ip += 1;
        }
        Ok(view)
    }

    /// Deletes an instance and its disk. An instance already being deleted
    /// is success.
    ///
    /// # Errors
    /// `NotFound`, `Busy` while locked.
    pub async fn remove(&self, token: &str, zone: &str, name: &str) -> Result<(), BackendError> {
        self.enter(REMOVE, zone, name, token).await?;
        let mut st = self.lock();
        let key = (zone.to_owned(), name.to_owned());
        match st.objects.get(&key) {
            None => Err(BackendError::new(
                Fault::NotFound,
                format!("404 Not Found: instance {zone}/{name}"),
            )),
            Some(o) if o.locked => Err(BackendError::new(Fault::Busy, format!("409 instance {name} is busy"))),
            Some(o) if o.view.state == native::DELETING => Ok(()),
            Some(_) => {
                st.objects.remove(&key);
                Ok(())
            }
        }
    }

    /// Adds label `key=value` to an instance whose `key` label is absent (or already `value`):
    /// one conditional write, as the real APIs' fingerprinted or versioned writes are, so a
    /// caller that read the labels before cannot overwrite a value written since.
    ///
    /// # Errors
    /// `NotFound`, `Busy` while locked, `AlreadyExists` when `key` holds another value.
    pub async fn add_label(
        &self,
        token: &str,
        zone: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), BackendError> {
        self.enter(LABEL, zone, name, token).await?;
        let mut st = self.lock();
        let Some(obj) = st.objects.get_mut(&(zone.to_owned(), name.to_owned())) else {
            return Err(BackendError::new(
                Fault::NotFound,
                format!("404 Not Found: instance {zone}/{name}"),
            ));
        };
        if obj.locked {
            return Err(BackendError::new(Fault::Busy, format!("409 instance {name} is busy")));
        }
        match obj.view.labels.get(key) {
            Some(held) if held != value => Err(BackendError::new(
                Fault::AlreadyExists,
                format!("409 Conflict: label {key} of instance {zone}/{name} is already set"),
            )),
            _ => {
                obj.view.labels.insert(key.to_owned(), value.to_owned());
                Ok(())
            }
        }
    }

    /// Names of the instances in a zone whose label `filter.0` equals
    /// `filter.1` (all of them without a filter), at most `limit`.
    ///
    /// # Errors
    /// Whatever the interceptor injects.
    pub async fn list(
        &self,
        token: &str,
        zone: &str,
        filter: Option<(&str, &str)>,
        limit: Option<usize>,
    ) -> Result<Vec<String>, BackendError> {
        self.enter(LIST, zone, zone, token).await?;
        let st = self.lock();
        Ok(st
            .objects
            .values()
            .filter(|o| o.view.zone == zone)
            .filter(|o| filter.is_none_or(|(k, v)| o.view.labels.get(k).is_some_and(|x| x == v)))
            .map(|o| o.view.name.clone())
            .take(limit.unwrap_or(usize::MAX))
            .collect())
    }

    fn with_obj(&self, name: &str, f: impl FnOnce(&mut Obj)) -> HookResult {
        let mut st = self.lock();
        if let Some(o) = st.objects.values_mut().find(|o| o.view.name == name) {
            f(o);
        }
        Ok(())
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

fn fault_error(fault: Fault, kind: CallKind, target: &str, token: &str) -> BackendError {
    let text = match &fault {
        Fault::NotFound => format!("404 Not Found: {kind} {target}"),
        Fault::AlreadyExists => format!("409 Conflict: {target} already exists"),
        Fault::Quota => "403 quotaExceeded: CPUS quota exceeded in region".to_owned(),
        Fault::RateLimit => "429 rateLimitExceeded".to_owned(),
        // NB: a realistic API echoes the credential it rejected; the provider
        // must scrub it.
        Fault::Unauthenticated => format!("401 Unauthorized: Authorization: Bearer {token} rejected"),
        Fault::PermissionDenied => format!("403 Forbidden: caller lacks permission for {kind}"),
        Fault::BadRequest => format!("400 Bad Request: {kind} {target}"),
        Fault::Server5xx => "503 Service Unavailable".to_owned(),
        Fault::Timeout => "request timed out".to_owned(),
        Fault::ConnectionReset => "connection reset by peer".to_owned(),
        Fault::Busy => format!("409 {target} is busy"),
        Fault::Raw(text) => text.clone(),
    };
    BackendError::new(fault, text)
}

/// Unix seconds as the API writes creation times.
pub fn unix_seconds(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()).to_string()
}

fn native_state(state: &NativeState) -> String {
    match state {
        NativeState::Pending => native::PENDING.to_owned(),
        NativeState::Running => native::RUNNING.to_owned(),
        NativeState::Stopped => native::STOPPED.to_owned(),
        NativeState::Terminated => native::TERMINATED.to_owned(),
        NativeState::Unknown(raw) => raw.clone(),
    }
}

#[async_trait]
impl BackendHooks for MemoryBackend {
    fn interceptor(&self) -> Option<&Interceptor> {
        Some(&self.inner.interceptor)
    }

    async fn seed(&self, spec: SeedSpec) -> HookResult {
        let zone = spec.location.unwrap_or_else(|| DEFAULT_ZONE.to_owned());
        let mut labels = BTreeMap::new();
        match spec.managed {
            SeedManaged::Yes => {
                labels.insert(egress_provider::LABEL_MANAGED.to_owned(), "true".to_owned());
            }
            SeedManaged::No => {}
            SeedManaged::Other(v) => {
                labels.insert(egress_provider::LABEL_MANAGED.to_owned(), v);
            }
        }
        if let Some(uid) = spec.uid {
            labels.insert(egress_provider::LABEL_UID.to_owned(), uid);
        }
        let created = match spec.created_at {
            SeedTime::Valid(t) => unix_seconds(t),
            SeedTime::Missing => String::new(),
            SeedTime::Garbage => "yesterday-ish".to_owned(),
        };
        let view = InstanceView {
            zone: zone.clone(),
            name: spec.name.clone(),
            state: native_state(&spec.state),
            ip: spec.ip,
            labels,
            created,
        };
        self.lock().objects.insert(
            (zone, spec.name),
            Obj {
                view,
                user_data: Vec::new(),
                unreadable: false,
                locked: false,
                auto_start: false,
                lookups: 0,
            },
        );
        Ok(())
    }

    async fn set_native_state(&self, name: &str, state: NativeState) -> HookResult {
        self.with_obj(name, |o| {
            o.auto_start = false;
            o.view.state = native_state(&state);
        })
    }

    async fn hold_new_instances_pending(&self, hold: bool) -> HookResult {
        self.lock().hold_pending = hold;
        Ok(())
    }

    async fn set_address(&self, name: &str, ip: Option<IpAddr>) -> HookResult {
        self.with_obj(name, |o| {
            o.auto_start = false;
            o.view.ip = ip;
        })
    }

    async fn rewrite_marks(&self, name: &str, uid: &str, created_at: SystemTime) -> HookResult {
        self.with_obj(name, |o| {
            o.view
                .labels
                .insert(egress_provider::LABEL_UID.to_owned(), uid.to_owned());
            o.view.created = unix_seconds(created_at);
        })
    }

    async fn strip_marks(&self, name: &str) -> HookResult {
        self.with_obj(name, |o| {
            o.view.labels.remove(egress_provider::LABEL_MANAGED);
            o.view.labels.remove(egress_provider::LABEL_UID);
        })
    }

    async fn inventory(&self) -> HookResult<Vec<BackendObject>> {
        let st = self.lock();
        let mut out = Vec::new();
        for o in st.objects.values() {
            out.push(BackendObject {
                kind: "instance".to_owned(),
                owner: o.view.name.clone(),
                marks: o.view.labels.clone(),
                user_data: Some(o.user_data.clone()),
            });
            out.push(BackendObject {
                kind: "disk".to_owned(),
                owner: o.view.name.clone(),
                marks: BTreeMap::new(),
                user_data: None,
            });
        }
        Ok(out)
    }

    async fn make_unreadable(&self, name: &str) -> HookResult {
        self.with_obj(name, |o| o.unreadable = true)
    }

    async fn make_scope_unreachable(&self, location: &str) -> HookResult {
        self.lock().unreachable_zones.insert(location.to_owned());
        Ok(())
    }

    async fn begin_backend_delete(&self, name: &str) -> HookResult {
        self.with_obj(name, |o| {
            o.auto_start = false;
            o.view.state = native::DELETING.to_owned();
        })
    }

    async fn finish_delete(&self, name: &str) -> HookResult {
        self.lock().objects.retain(|_, o| o.view.name != name);
        Ok(())
    }

    async fn lock(&self, name: &str) -> HookResult {
        self.with_obj(name, |o| o.locked = true)
    }

    async fn unlock(&self, name: &str) -> HookResult {
        self.with_obj(name, |o| o.locked = false)
    }

    async fn credential_path(&self) -> HookResult<PathBuf> {
        Ok(self.token_file())
    }

    async fn valid_credential(&self, sentinel: &str) -> HookResult<String> {
        let token = format!("tok-{sentinel}");
        // Only the new credential is accepted from now on, so a provider
        // that cached the old one is caught.
        let mut st = self.lock();
        st.tokens.clear();
        st.tokens.insert(token.clone());
        Ok(format!("token:{token}\n"))
    }
}
