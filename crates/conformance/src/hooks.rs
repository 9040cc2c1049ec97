//! The backend hooks a provider's test backend offers the suite (H01-H18).
//!
//! Every hook has a default that answers [`Unsupported`], naming the hook; a
//! case that needs it is then skipped with that name in its output. In fake
//! mode the mandatory hooks (spec: H01-H09, H12, H16-H18, H13 for
//! `async-ops` other than `none`, H15 for providers that read credentials)
//! must be implemented; real-backend handles implement what they can.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::Interceptor;

/// A hook the backend does not offer; the string names it (e.g. `H08 freeze`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsupported(pub &'static str);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend hook {} is not supported", self.0)
    }
}

impl std::error::Error for Unsupported {}

/// A hook's result.
pub type HookResult<T = ()> = Result<T, Unsupported>;

/// A kind of backend call (an HTTP request, an RPC, a dial), as the
/// provider's backend names it: `insert`, `lookup`, `DomainDefineXML`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallKind(pub &'static str);

impl fmt::Display for CallKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// One recorded backend call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendCall {
    /// What kind of call.
    pub kind: CallKind,
    /// What it addressed (an instance name, a location, a host).
    pub target: String,
}

/// A fault to inject into matching backend calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The backend says the object does not exist.
    NotFound,
    /// The backend says the object already exists.
    AlreadyExists,
    /// Out of quota or capacity.
    Quota,
    /// Rate limited.
    RateLimit,
    /// Credentials rejected.
    Unauthenticated,
    /// Credentials lack a permission.
    PermissionDenied,
    /// The request is malformed.
    BadRequest,
    /// The backend failed internally.
    Server5xx,
    /// The call timed out.
    Timeout,
    /// The connection dropped.
    ConnectionReset,
    /// The object is busy (locked, an operation in flight).
    Busy,
    /// A raw backend error text, e.g. a captured response.
    Raw(String),
}

impl Fault {
    /// The faults that must never make `get` answer NotFound (CT-C03).
    pub fn never_not_found() -> Vec<Fault> {
        vec![
            Self::Timeout,
            Self::ConnectionReset,
            Self::Server5xx,
            Self::Busy,
            Self::Unauthenticated,
            Self::PermissionDenied,
        ]
    }
}

/// How many matching calls a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Times {
    /// The next matching call only.
    Once,
    /// This many matching calls.
    N(u32),
    /// Every matching call until the faults are cleared.
    Always,
}

/// The backend's own state for an instance, as a hook sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeState {
    /// Being created or started.
    Pending,
    /// Running.
    Running,
    /// Stopped, able to start again.
    Stopped,
    /// Gone for good but still visible.
    Terminated,
    /// A raw value the provider has never seen.
    Unknown(String),
}

/// A creation-time mark as seeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeedTime {
    /// A real time.
    Valid(SystemTime),
    /// No creation time recorded.
    Missing,
    /// A value that does not parse.
    Garbage,
}

/// The managed mark as seeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeedManaged {
    /// `proxy-operator-managed=true`.
    Yes,
    /// No managed mark.
    No,
    /// The key with another value (only where marks are key/value).
    Other(String),
}

/// An instance put straight into the backend (H01).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedSpec {
    /// Instance name.
    pub name: String,
    /// Location (zone, host, namespace); `None` for the default one.
    pub location: Option<String>,
    /// Backend state.
    pub state: NativeState,
    /// Address.
    pub ip: Option<IpAddr>,
    /// Managed mark.
    pub managed: SeedManaged,
    /// UID mark (`None`: no UID mark at all).
    pub uid: Option<String>,
    /// Creation time mark.
    pub created_at: SeedTime,
}

impl SeedSpec {
    /// A running, marked instance with a valid creation time of now.
    pub fn marked(name: impl Into<String>, uid: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            location: None,
            state: NativeState::Running,
            ip: Some(IpAddr::from([10, 9, 9, 9])),
            managed: SeedManaged::Yes,
            uid: Some(uid.into()),
            created_at: SeedTime::Valid(SystemTime::now()),
        }
    }

    /// The same seed in another location.
    pub fn in_location(mut self, location: impl Into<String>) -> Self {
        self.location = Some(location.into());
        self
    }

    /// The same seed with another managed mark.
    pub fn managed(mut self, managed: SeedManaged) -> Self {
        self.managed = managed;
        self
    }

    /// The same seed with another UID mark.
    pub fn uid(mut self, uid: Option<String>) -> Self {
        self.uid = uid;
        self
    }

    /// The same seed with another creation mark.
    pub fn created(mut self, at: SeedTime) -> Self {
        self.created_at = at;
        self
    }
}

/// One object in the backend's inventory (H05).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendObject {
    /// `instance`, or a secondary kind (`disk`, `volume`, `seed`, ...).
    pub kind: String,
    /// The instance name the object belongs to.
    pub owner: String,
    /// Marks as stored.
    pub marks: BTreeMap<String, String>,
    /// The user-data bytes delivered with it, if any.
    pub user_data: Option<Vec<u8>>,
}

/// Holds one backend call blocked until released (H08).
#[derive(Clone, Debug)]
pub struct Gate {
    entered: watch::Sender<bool>,
    released: watch::Sender<bool>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A gate nobody has entered yet.
    pub fn new() -> Self {
        Self {
            entered: watch::channel(false).0,
            released: watch::channel(false).0,
        }
    }

    /// Resolves once a call is blocked in the gate.
    pub async fn entered(&self) {
        let mut rx = self.entered.subscribe();
        // The sender lives in self, so wait_for cannot fail.
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Lets the blocked call (and any later one) through.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// Backend side: block here until released. Marks the gate entered.
    pub async fn pass(&self) {
        self.entered.send_replace(true);
        let mut rx = self.released.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Whether a call has entered.
    pub fn was_entered(&self) -> bool {
        *self.entered.borrow()
    }
}

/// What a test backend lets the suite do to it. Each method defaults to
/// [`Unsupported`].
#[async_trait]
#[allow(unused_variables)]
pub trait BackendHooks: Send + Sync + 'static {
    /// H01: put an instance straight into the backend.
    async fn seed(&self, spec: SeedSpec) -> HookResult {
        Err(Unsupported("H01 seed"))
    }
    /// H02: change an instance's backend state.
    async fn set_native_state(&self, name: &str, state: NativeState) -> HookResult {
        Err(Unsupported("H02 set_native_state"))
    }
    /// H02: keep newly created instances pending until told otherwise.
    async fn hold_new_instances_pending(&self, hold: bool) -> HookResult {
        Err(Unsupported("H02 hold_new_instances_pending"))
    }
    /// H03: set or clear the address the backend reports.
    async fn set_address(&self, name: &str, ip: Option<IpAddr>) -> HookResult {
        Err(Unsupported("H03 set_address"))
    }
    /// H04: change the UID and creation marks out of band.
    async fn rewrite_marks(&self, name: &str, uid: &str, created_at: SystemTime) -> HookResult {
        Err(Unsupported("H04 rewrite_marks"))
    }
    /// H04: remove the managed and UID marks out of band.
    async fn strip_marks(&self, name: &str) -> HookResult {
        Err(Unsupported("H04 strip_marks"))
    }
    /// H05: every instance and secondary object.
    async fn inventory(&self) -> HookResult<Vec<BackendObject>> {
        Err(Unsupported("H05 inventory"))
    }
    /// The interceptor every backend call passes, when the backend has one: H06, H07, H08, H09
    /// and H16 then work through it unless overridden.
    fn interceptor(&self) -> Option<&Interceptor> {
        None
    }
    /// H06: every backend call so far, in order.
    async fn call_log(&self) -> HookResult<Vec<BackendCall>> {
        let i = self.interceptor().ok_or(Unsupported("H06 call_log"))?;
        Ok(i.call_log())
    }
    /// H07: make matching calls fail.
    async fn fail(&self, kind: CallKind, fault: Fault, times: Times) -> HookResult {
        let i = self.interceptor().ok_or(Unsupported("H07 fail"))?;
        i.fail(kind, fault, times);
        Ok(())
    }
    /// H07: remove every injected fault.
    async fn clear_faults(&self) -> HookResult {
        let i = self.interceptor().ok_or(Unsupported("H07 clear_faults"))?;
        i.clear_faults();
        Ok(())
    }
    /// H08: block the next matching call until the gate is released.
    async fn freeze(&self, kind: CallKind) -> HookResult<Gate> {
        let i = self.interceptor().ok_or(Unsupported("H08 freeze"))?;
        Ok(i.freeze(kind))
    }
    /// H09: slow matching calls down.
    async fn delay(&self, kind: CallKind, by: Duration) -> HookResult {
        let i = self.interceptor().ok_or(Unsupported("H09 delay"))?;
        i.delay(kind, by);
        Ok(())
    }
    /// H10: the instance stays enumerable but its details cannot be read.
    async fn make_unreadable(&self, name: &str) -> HookResult {
        Err(Unsupported("H10 make_unreadable"))
    }
    /// H11: a whole location fails.
    async fn make_scope_unreachable(&self, location: &str) -> HookResult {
        Err(Unsupported("H11 make_scope_unreachable"))
    }
    /// H12: keep the instance in a deleting state.
    async fn begin_backend_delete(&self, name: &str) -> HookResult {
        Err(Unsupported("H12 begin_backend_delete"))
    }
    /// H12: let a deleting instance go.
    async fn finish_delete(&self, name: &str) -> HookResult {
        Err(Unsupported("H12 finish_delete"))
    }
    /// H13: a backend lock or async task holds the instance.
    async fn lock(&self, name: &str) -> HookResult {
        Err(Unsupported("H13 lock"))
    }
    /// H13: release the lock.
    async fn unlock(&self, name: &str) -> HookResult {
        Err(Unsupported("H13 unlock"))
    }
    /// H14: reads lag writes.
    async fn read_lag(&self, by: Duration) -> HookResult {
        Err(Unsupported("H14 read_lag"))
    }
    /// H15: the file the provider reads its credential from.
    async fn credential_path(&self) -> HookResult<PathBuf> {
        Err(Unsupported("H15 credential_path"))
    }
    /// H15: the content of a credential the backend accepts, containing
    /// `sentinel` (the backend is told to accept it).
    async fn valid_credential(&self, sentinel: &str) -> HookResult<String> {
        Err(Unsupported("H15 valid_credential"))
    }
    /// H15: the end of a key rotation: every credential the provider has used so far (and
    /// anything the backend issued for it, such as access tokens) is no longer accepted; a
    /// credential from `valid_credential` not used yet stays good.
    async fn retire_credentials(&self) -> HookResult {
        Err(Unsupported("H15 retire_credentials"))
    }
    /// H16: every dial or request fails (and is still recorded in H06).
    async fn set_unreachable(&self, unreachable: bool) -> HookResult {
        let i = self.interceptor().ok_or(Unsupported("H16 set_unreachable"))?;
        i.set_unreachable(unreachable);
        Ok(())
    }
}

/// A handle the suite can share between tasks.
pub type SharedHooks = Arc<dyn BackendHooks>;
