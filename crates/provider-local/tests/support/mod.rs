//! The local provider's conformance targets.
//!
//! Both put the suite's interceptor (call log, faults, gates, delays,
//! outage) in front of the machine the provider talks to:
//!
//! - `LocalTarget::simulated()`: records in memory and simulated processes,
//!   so the suite can put an instance in states a real tinyproxy cannot
//!   reach on cue (held pending, any address, an unknown process state);
//! - `LocalTarget::real()`: a real state directory and real tinyproxy
//!   processes; the hooks a real process cannot honour answer Unsupported,
//!   and the cases that need them skip.

#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_conformance::hooks::{BackendObject, HookResult, SeedManaged, SeedTime};
use egress_conformance::target::{
    AsyncOps, Budgets, BuildOptions, CallKinds, ChildSpans, ClassifyCase, CreateReturn, Credentials, DeleteReturn,
    GcMark, ListPartial, Logging, Profile, ProvisioningState, Quota, Timeouts,
};
use egress_conformance::{
    BackendHooks, CallKind, ConformanceTarget, Fault, Fixtures, Interceptor, NativeState, NotConfigured, SeedSpec,
    Unsupported,
};
use egress_provider::{
    BoxError, CreateRequest, ErrorClass, LABEL_MANAGED, LABEL_MANAGED_YES, LABEL_UID, Placement, Provider, ProviderId,
    name_from_uid,
};
use egress_provider_local::{
    BIND, CALL_BUDGET, CREATE, INSPECT, LAUNCH, LIST, Liveness, LocalProvider, LocalSettings, Machine, PREPARE, READ,
    REMOVE, Record, STOP, SystemMachine, WRITE, address_candidate, classify, drop_names, timestamp, tinyproxy_config,
};
use egress_testkit::ScratchDir;

/// The tinyproxy the real target runs (Debian's package, which `cargo xtask test` installs).
pub const TINYPROXY: &str = "/usr/bin/tinyproxy";

/// A fault of the suite as the I/O error a machine call would give.
pub fn io_error(fault: &Fault) -> io::Error {
    let kind = match fault {
        Fault::NotFound => io::ErrorKind::NotFound,
        Fault::AlreadyExists => io::ErrorKind::AlreadyExists,
        Fault::Quota => io::ErrorKind::StorageFull,
        Fault::RateLimit => io::ErrorKind::WouldBlock,
        Fault::Unauthenticated | Fault::PermissionDenied => io::ErrorKind::PermissionDenied,
        Fault::BadRequest => io::ErrorKind::InvalidInput,
        Fault::Timeout => io::ErrorKind::TimedOut,
        Fault::ConnectionReset => io::ErrorKind::ConnectionReset,
        Fault::Busy => io::ErrorKind::ResourceBusy,
        Fault::Server5xx => return io::Error::other("input/output error"),
        Fault::Raw(text) => return io::Error::other(text.clone()),
    };
    io::Error::from(kind)
}

/// Records and processes in memory; an instance without an entry in
/// `processes` was never started.
#[derive(Debug, Default)]
struct Sim {
    records: BTreeMap<String, Vec<u8>>,
    processes: HashMap<String, Liveness>,
    hold_pending: bool,
}

impl Sim {
    fn launch(&mut self, name: &str) {
        let liveness = if self.hold_pending {
            Liveness::Starting
        } else {
            Liveness::Listening
        };
        self.processes.insert(name.to_owned(), liveness);
    }
}

#[derive(Debug)]
enum World {
    Simulated(Mutex<Sim>),
    Real(SystemMachine),
}

#[derive(Debug)]
struct Inner {
    interceptor: Interceptor,
    world: World,
    /// Removed (after the processes in it are killed) when the last clone goes.
    dir: ScratchDir,
    unreadable: Mutex<BTreeSet<String>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if matches!(self.world, World::Real(_)) {
            kill_processes_under(self.dir.path());
        }
    }
}

/// Kills (SIGKILL) every tinyproxy whose config lies below `dir`: what a test left running.
pub fn kill_processes_under(dir: &Path) {
    for (pid, _) in processes_under(dir) {
        if let Some(p) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
}

/// A machine with the suite's hooks. Clones share one backend.
#[derive(Clone, Debug)]
pub struct TestBackend {
    inner: Arc<Inner>,
}

impl TestBackend {
    fn new(real: bool) -> Self {
        let dir = ScratchDir::new("local");
        let world = if real {
            World::Real(SystemMachine::new(dir.path(), TINYPROXY))
        } else {
            World::Simulated(Mutex::new(Sim::default()))
        };
        Self {
            inner: Arc::new(Inner {
                interceptor: Interceptor::new(),
                world,
                dir,
                unreadable: Mutex::new(BTreeSet::new()),
            }),
        }
    }

    /// The state directory (real) or its stand-in (simulated).
    pub fn dir(&self) -> &Path {
        self.inner.dir.path()
    }

    fn sim(&self) -> Option<MutexGuard<'_, Sim>> {
        match &self.inner.world {
            World::Simulated(sim) => Some(sim.lock().unwrap_or_else(|p| p.into_inner())),
            World::Real(_) => None,
        }
    }

    fn real(&self) -> Option<&SystemMachine> {
        match &self.inner.world {
            World::Real(m) => Some(m),
            World::Simulated(_) => None,
        }
    }

    async fn enter(&self, kind: &'static str, target: &str) -> io::Result<()> {
        self.inner
            .interceptor
            .enter(CallKind(kind), target)
            .await
            .map_err(|f| io_error(&f))
    }

    /// Reads a record straight from the backend, past the interceptor.
    async fn record(&self, name: &str) -> HookResult<Record> {
        let bytes = match self.real() {
            Some(m) => m.read(name).await.ok(),
            None => self.sim().and_then(|s| s.records.get(name).cloned()),
        };
        let bytes = bytes.unwrap_or_else(|| panic!("hook: no record for {name}"));
        Ok(Record::from_bytes(&bytes).unwrap_or_else(|e| panic!("hook: {e}")))
    }

    /// Stores a record straight into the backend, past the interceptor.
    async fn store(&self, record: &Record) {
        match self.real() {
            Some(m) => m
                .write(&record.name, &record.to_bytes())
                .await
                .expect("hook: writing a record"),
            None => {
                if let Some(mut s) = self.sim() {
                    s.records.insert(record.name.clone(), record.to_bytes());
                }
            }
        }
    }

    /// Starts a real tinyproxy for `record` (real mode), past the interceptor.
    async fn launch_real(&self, m: &SystemMachine, record: &Record) {
        let rules = egress_provider_local::Rules {
            connect_ports: &[443],
            credentials: None,
        };
        let config = tinyproxy_config(record, &m.instance_dir(&record.name), drop_names(), &rules);
        m.launch(&record.name, &config).await.expect("hook: starting tinyproxy");
    }

    /// The pid a real launch recorded for `name`.
    fn real_pid(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.dir().join(name).join("launched.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    async fn edit(&self, name: &str, f: impl FnOnce(&mut Record)) -> HookResult {
        let mut record = self.record(name).await?;
        f(&mut record);
        self.store(&record).await;
        Ok(())
    }
}

#[async_trait]
impl Machine for TestBackend {
    async fn create(&self, name: &str, record: &[u8], config: &str) -> io::Result<()> {
        self.enter(CREATE, name).await?;
        if let Some(m) = self.real() {
            return m.create(name, record, config).await;
        }
        let mut s = self.sim().expect("simulated");
        if s.records.contains_key(name) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        s.records.insert(name.to_owned(), record.to_vec());
        s.launch(name);
        Ok(())
    }

    async fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        self.enter(READ, name).await?;
        if self.inner.unreadable.lock().unwrap().contains(name) {
            return Err(io::Error::other("input/output error"));
        }
        match self.real() {
            Some(m) => m.read(name).await,
            None => self
                .sim()
                .and_then(|s| s.records.get(name).cloned())
                .ok_or_else(|| io::ErrorKind::NotFound.into()),
        }
    }

    async fn write(&self, name: &str, record: &[u8]) -> io::Result<()> {
        self.enter(WRITE, name).await?;
        if let Some(m) = self.real() {
            return m.write(name, record).await;
        }
        self.sim()
            .expect("simulated")
            .records
            .insert(name.to_owned(), record.to_vec());
        Ok(())
    }

    async fn remove(&self, name: &str) -> io::Result<()> {
        self.enter(REMOVE, name).await?;
        if let Some(m) = self.real() {
            return m.remove(name).await;
        }
        self.sim().expect("simulated").records.remove(name);
        Ok(())
    }

    async fn names(&self) -> io::Result<Vec<String>> {
        self.enter(LIST, "").await?;
        match self.real() {
            Some(m) => m.names().await,
            None => Ok(self.sim().expect("simulated").records.keys().cloned().collect()),
        }
    }

    async fn launch(&self, name: &str, config: &str) -> io::Result<()> {
        self.enter(LAUNCH, name).await?;
        if let Some(m) = self.real() {
            return m.launch(name, config).await;
        }
        self.sim().expect("simulated").launch(name);
        Ok(())
    }

    async fn inspect(&self, name: &str, at: SocketAddr) -> io::Result<Liveness> {
        self.enter(INSPECT, name).await?;
        if let Some(m) = self.real() {
            return m.inspect(name, at).await;
        }
        let s = self.sim().expect("simulated");
        Ok(s.processes.get(name).copied().unwrap_or(Liveness::NotStarted))
    }

    async fn stop(&self, name: &str) -> io::Result<()> {
        self.enter(STOP, name).await?;
        if let Some(m) = self.real() {
            return m.stop(name).await;
        }
        if let Some(p) = self.sim().expect("simulated").processes.get_mut(name) {
            *p = Liveness::Gone;
        }
        Ok(())
    }

    async fn in_use(&self, at: SocketAddr) -> io::Result<bool> {
        self.enter(BIND, &at.to_string()).await?;
        match self.real() {
            Some(m) => m.in_use(at).await,
            None => Ok(false),
        }
    }

    async fn prepare(&self) -> io::Result<()> {
        self.enter(PREPARE, "").await?;
        match self.real() {
            Some(m) => m.prepare().await,
            None => Ok(()),
        }
    }

    async fn version(&self) -> io::Result<String> {
        self.enter(egress_provider_local::VERSION, "").await?;
        match self.real() {
            Some(m) => m.version().await,
            None => Ok("tinyproxy 1.11.1 (simulated)".to_owned()),
        }
    }

    fn instance_dir(&self, name: &str) -> PathBuf {
        self.inner.dir.path().join(name)
    }

    fn describe(&self) -> String {
        self.inner.dir.path().display().to_string()
    }
}

/// Every tinyproxy process started with a config under `dir`, with the
/// instance name its config path names.
pub fn processes_under(dir: &Path) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    let prefix = format!("{}/", dir.display());
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        for arg in cmdline.split(|b| *b == 0) {
            let arg = String::from_utf8_lossy(arg);
            if let Some(rest) = arg.strip_prefix(&prefix)
                && let Some(name) = rest.strip_suffix("/tinyproxy.conf")
            {
                out.push((pid, name.to_owned()));
            }
        }
    }
    out
}

/// The state letter of process `pid` (`None` once it is gone).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|b| *b == b')')?;
    stat[close + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .map(|b| char::from(*b))
}

/// Waits, up to 10 s, until process `pid` is in a state `done` accepts.
async fn wait_for_state(pid: Option<u32>, done: impl Fn(Option<char>) -> bool) {
    let Some(pid) = pid else { return };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done(process_state(pid)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "process {pid} did not change state within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn signal(pid: Option<u32>, signal: rustix::process::Signal) {
    if let Some(p) = pid
        .and_then(|pid| i32::try_from(pid).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(p, signal);
    }
}

#[async_trait]
impl BackendHooks for TestBackend {
    fn interceptor(&self) -> Option<&Interceptor> {
        Some(&self.inner.interceptor)
    }

    async fn seed(&self, spec: SeedSpec) -> HookResult {
        if spec
            .location
            .as_deref()
            .is_some_and(|l| l != egress_provider_local::LOCATION)
        {
            return Err(Unsupported("H01 seed (only the local location exists)"));
        }
        let mut marks = BTreeMap::new();
        match &spec.managed {
            SeedManaged::Yes => {
                marks.insert(LABEL_MANAGED.to_owned(), LABEL_MANAGED_YES.to_owned());
            }
            SeedManaged::No => {}
            SeedManaged::Other(v) => {
                marks.insert(LABEL_MANAGED.to_owned(), v.clone());
            }
        }
        if let Some(uid) = &spec.uid {
            marks.insert(LABEL_UID.to_owned(), uid.clone());
        }
        let address = match (spec.ip, self.real()) {
            (Some(IpAddr::V4(ip)), None) => ip,
            _ => address_candidate(&self.dir().display().to_string(), &spec.name, 0),
        };
        let record = Record {
            name: spec.name.clone(),
            marks,
            created_at: match spec.created_at {
                SeedTime::Valid(at) => timestamp(at),
                SeedTime::Missing => String::new(),
                SeedTime::Garbage => "the day before yesterday".to_owned(),
            },
            address,
            port: 3128,
            deleting: false,
        };
        self.store(&record).await;
        match self.real() {
            Some(m) => match spec.state {
                NativeState::Running | NativeState::Pending => self.launch_real(m, &record).await,
                NativeState::Stopped | NativeState::Terminated => {
                    self.launch_real(m, &record).await;
                    m.stop(&record.name).await.expect("hook: stopping");
                }
                NativeState::Unknown(_) => {
                    self.launch_real(m, &record).await;
                    let pid = self.real_pid(&record.name);
                    signal(pid, rustix::process::Signal::STOP);
                    wait_for_state(pid, |s| matches!(s, Some('T' | 't'))).await;
                }
            },
            None => {
                let liveness = match spec.state {
                    NativeState::Pending => Liveness::Starting,
                    NativeState::Running if spec.ip.is_some() => Liveness::Listening,
                    NativeState::Running => Liveness::Starting,
                    NativeState::Stopped | NativeState::Terminated => Liveness::Gone,
                    NativeState::Unknown(_) => Liveness::Suspended,
                };
                self.sim()
                    .expect("simulated")
                    .processes
                    .insert(spec.name.clone(), liveness);
            }
        }
        Ok(())
    }

    async fn set_native_state(&self, name: &str, state: NativeState) -> HookResult {
        if self.real().is_some() {
            let pid = self.real_pid(name);
            // Signals land asynchronously: wait (bounded) until the process shows the new state.
            match state {
                NativeState::Stopped | NativeState::Terminated => {
                    signal(pid, rustix::process::Signal::KILL);
                    wait_for_state(pid, |s| matches!(s, None | Some('Z' | 'X'))).await;
                }
                NativeState::Unknown(_) => {
                    signal(pid, rustix::process::Signal::STOP);
                    wait_for_state(pid, |s| matches!(s, Some('T' | 't'))).await;
                }
                NativeState::Running => {
                    signal(pid, rustix::process::Signal::CONT);
                    wait_for_state(pid, |s| !matches!(s, Some('T' | 't'))).await;
                }
                NativeState::Pending => return Err(Unsupported("H02 set_native_state(Pending) on a real process")),
            }
            return Ok(());
        }
        let liveness = match state {
            NativeState::Pending => Liveness::Starting,
            NativeState::Running => Liveness::Listening,
            NativeState::Stopped | NativeState::Terminated => Liveness::Gone,
            NativeState::Unknown(_) => Liveness::Suspended,
        };
        self.sim()
            .expect("simulated")
            .processes
            .insert(name.to_owned(), liveness);
        Ok(())
    }

    async fn hold_new_instances_pending(&self, hold: bool) -> HookResult {
        let mut s = self.sim().ok_or(Unsupported(
            "H02 hold_new_instances_pending (a real tinyproxy listens at once)",
        ))?;
        s.hold_pending = hold;
        Ok(())
    }

    async fn set_address(&self, name: &str, ip: Option<IpAddr>) -> HookResult {
        if self.real().is_some() {
            return Err(Unsupported(
                "H03 set_address (a real tinyproxy listens where it was told)",
            ));
        }
        match ip {
            None => {
                self.sim()
                    .expect("simulated")
                    .processes
                    .insert(name.to_owned(), Liveness::Starting);
                Ok(())
            }
            Some(IpAddr::V4(ip)) => {
                self.sim()
                    .expect("simulated")
                    .processes
                    .insert(name.to_owned(), Liveness::Listening);
                self.edit(name, |r| r.address = ip).await
            }
            Some(IpAddr::V6(_)) => Err(Unsupported("H03 set_address (IPv6: local proxies listen on 127/8)")),
        }
    }

    async fn rewrite_marks(&self, name: &str, uid: &str, created_at: SystemTime) -> HookResult {
        self.edit(name, |r| {
            r.marks.insert(LABEL_UID.to_owned(), uid.to_owned());
            r.created_at = timestamp(created_at);
        })
        .await
    }

    async fn strip_marks(&self, name: &str) -> HookResult {
        self.edit(name, |r| {
            r.marks.remove(LABEL_MANAGED);
            r.marks.remove(LABEL_UID);
        })
        .await
    }

    async fn inventory(&self) -> HookResult<Vec<BackendObject>> {
        let mut out = Vec::new();
        let records: Vec<Record> = match self.real() {
            Some(m) => {
                let mut records = Vec::new();
                for name in m.names().await.unwrap_or_default() {
                    if let Ok(bytes) = m.read(&name).await
                        && let Ok(r) = Record::from_bytes(&bytes)
                    {
                        records.push(r);
                    }
                }
                records
            }
            None => self
                .sim()
                .expect("simulated")
                .records
                .values()
                .filter_map(|b| Record::from_bytes(b).ok())
                .collect(),
        };
        for r in records {
            out.push(BackendObject {
                kind: "instance".to_owned(),
                owner: r.name.clone(),
                marks: r.marks.clone(),
                user_data: None,
            });
        }
        let object = |kind: &str, owner: String| BackendObject {
            kind: kind.to_owned(),
            owner,
            marks: BTreeMap::new(),
            user_data: None,
        };
        match self.real() {
            Some(_) => {
                for (_, name) in processes_under(self.dir()) {
                    out.push(object("process", name));
                }
                if let Ok(entries) = std::fs::read_dir(self.dir()) {
                    for e in entries.flatten() {
                        if e.path().is_dir() {
                            out.push(object("directory", e.file_name().to_string_lossy().into_owned()));
                        }
                    }
                }
            }
            None => {
                let s = self.sim().expect("simulated");
                for (name, liveness) in &s.processes {
                    if !matches!(liveness, Liveness::Gone | Liveness::NotStarted) {
                        out.push(object("process", name.clone()));
                    }
                }
            }
        }
        Ok(out)
    }

    async fn make_unreadable(&self, name: &str) -> HookResult {
        self.inner.unreadable.lock().unwrap().insert(name.to_owned());
        Ok(())
    }

    async fn begin_backend_delete(&self, name: &str) -> HookResult {
        self.edit(name, |r| r.deleting = true).await
    }

    async fn finish_delete(&self, name: &str) -> HookResult {
        match self.real() {
            Some(m) => {
                m.stop(name).await.expect("hook: stopping");
                m.remove(name).await.expect("hook: removing");
            }
            None => {
                let mut s = self.sim().expect("simulated");
                s.processes.remove(name);
                s.records.remove(name);
            }
        }
        Ok(())
    }
}

/// The local provider as a conformance target.
#[derive(Clone, Copy, Debug)]
pub struct LocalTarget {
    real: bool,
}

impl LocalTarget {
    /// Simulated records and processes.
    pub fn simulated() -> Self {
        Self { real: false }
    }

    /// A real state directory and real tinyproxy processes.
    pub fn real() -> Self {
        Self { real: true }
    }
}

#[async_trait]
impl ConformanceTarget for LocalTarget {
    type Backend = TestBackend;

    async fn backend(&self) -> Result<TestBackend, NotConfigured> {
        if self.real && !Path::new(TINYPROXY).exists() {
            return Err(NotConfigured(format!(
                "{TINYPROXY} is not installed (cargo xtask test installs it)"
            )));
        }
        Ok(TestBackend::new(self.real))
    }

    fn build(&self, backend: &TestBackend, options: &BuildOptions) -> Result<Arc<dyn Provider>, BoxError> {
        let settings = LocalSettings {
            entry: options.entry_name.clone(),
            salt: backend.dir().display().to_string(),
            drop_to: drop_names().map(|(u, g)| (u.to_owned(), g.to_owned())),
            connect_ports: vec![443],
        };
        Ok(Arc::new(LocalProvider::new(settings, Arc::new(backend.clone()))))
    }

    fn profile(&self) -> Profile {
        Profile {
            create_return: CreateReturn::Submit,
            delete_return: DeleteReturn::Waits,
            gc_mark: GcMark::WrittenMetadata,
            list_partial: ListPartial::FailWhole,
            quota: Quota::Detected,
            async_ops: AsyncOps::None,
            provisioning_state: ProvisioningState::Native,
            timeouts: Timeouts::PerCall,
            logging: Logging::OutcomeOnly,
            child_spans: ChildSpans::SpanDecorator,
            credentials: Credentials::WorkloadIdentity,
            ip_discovered: false,
            delivers_cloud_init: false,
            adoption_guard: true,
            key_value_marks: true,
            create_not_found_class: ErrorClass::Transient,
            readiness_budget: Duration::from_secs(10),
            delete_budget: Duration::from_secs(10),
        }
    }

    fn valid_request(&self, uid: &str) -> CreateRequest {
        self.request_in(uid, egress_provider_local::LOCATION)
    }

    fn request_in(&self, uid: &str, location: &str) -> CreateRequest {
        CreateRequest {
            name: name_from_uid(uid),
            uid: uid.to_owned(),
            namespace: "crawl".to_owned(),
            proxy_name: format!("proxy-for-{uid}"),
            placement: Placement {
                zone: location.to_owned(),
                ..Placement::default()
            },
            cloud_init: b"#cloud-config\n".to_vec(),
            port: 3128,
            installation: None,
            credentials: None,
            spread_group: None,
        }
    }

    fn id_for(&self, name: &str) -> ProviderId {
        ProviderId::new(egress_provider_local::id_of(name))
    }

    fn is_real(&self) -> bool {
        self.real
    }

    fn fixtures(&self) -> Fixtures {
        let with = |f: &dyn Fn(&mut Placement)| {
            let mut p = self.valid_request("fixture").placement;
            f(&mut p);
            p
        };
        let rows = [
            (Fault::AlreadyExists, ErrorClass::Transient),
            (Fault::Quota, ErrorClass::QuotaExceeded),
            (Fault::RateLimit, ErrorClass::QuotaExceeded),
            (Fault::Unauthenticated, ErrorClass::Permanent),
            (Fault::PermissionDenied, ErrorClass::Permanent),
            (Fault::BadRequest, ErrorClass::Permanent),
            (Fault::Server5xx, ErrorClass::Transient),
            (Fault::Timeout, ErrorClass::Transient),
            (Fault::ConnectionReset, ErrorClass::Transient),
            (Fault::Busy, ErrorClass::Transient),
            (Fault::Raw("exec format error".to_owned()), ErrorClass::Transient),
        ];
        let mut classify_cases = ClassifyCase::rows(
            rows.into_iter()
                .map(|(fault, expected)| (format!("{fault:?}"), classify(WRITE, &io_error(&fault)), expected)),
        );
        // Only a missing record is a missing instance.
        classify_cases.extend(ClassifyCase::rows(
            [
                (READ, ErrorClass::NotFound),
                (LAUNCH, ErrorClass::Transient),
                (CREATE, ErrorClass::Transient),
            ]
            .map(|(call, expected)| {
                (
                    format!("NotFound from {call}"),
                    classify(call, &io_error(&Fault::NotFound)),
                    expected,
                )
            }),
        ));
        classify_cases.push(ClassifyCase::not_a_backend_error(
            "a bare error, not from the machine",
            &std::fmt::Error,
        ));
        let local = egress_provider_local::LOCATION;
        Fixtures {
            malformed_ids: [
                "",
                "proxy-a",
                "local/a/b",
                "/proxy-a",
                "local/",
                "local/../etc",
                "local/Proxy",
            ]
            .into_iter()
            .map(ProviderId::from)
            .collect(),
            id_in_unconfigured_location: Some((
                ProviderId::new("elsewhere/proxy-aaaaaaaaaaaaaaaa"),
                "elsewhere".to_owned(),
            )),
            invalid_placements: vec![
                (with(&|p| p.zone = "elsewhere".into()), "zone", "elsewhere".into()),
                (with(&|p| p.region = "eu".into()), "region", "eu".into()),
                (
                    with(&|p| p.machine_type = "small".into()),
                    "machineType",
                    "small".into(),
                ),
                (with(&|p| p.image = "debian-13".into()), "image", "debian-13".into()),
            ],
            classify_cases,
            check_targets: vec![local.to_owned()],
            check_faults: vec![
                (Fault::PermissionDenied, local.into(), egress_provider::REASON_FORBIDDEN),
                (Fault::NotFound, local.into(), egress_provider::REASON_UNREACHABLE),
                (Fault::Timeout, local.into(), egress_provider::REASON_TIMEOUT),
                (Fault::Server5xx, local.into(), egress_provider::REASON_API_ERROR),
            ],
            locations: vec![local.to_owned()],
            secondary_kinds: if self.real {
                vec!["process".to_owned(), "directory".to_owned()]
            } else {
                vec!["process".to_owned()]
            },
            shared_kinds: vec![],
            calls: CallKinds {
                create_steps: vec![CallKind(READ), CallKind(BIND), CallKind(CREATE)],
                create_instance: CallKind(CREATE),
                get: vec![CallKind(READ), CallKind(INSPECT)],
                get_discovery: vec![],
                delete_frees_name: CallKind(REMOVE),
                delete: vec![CallKind(READ), CallKind(WRITE), CallKind(STOP), CallKind(REMOVE)],
                list: CallKind(LIST),
                probe: Some(CallKind(PREPARE)),
            },
            budgets: Some(Budgets { get: CALL_BUDGET }),
            insecure_switch: None,
        }
    }
}
