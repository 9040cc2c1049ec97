//! A fake Compute Engine API on loopback: the five instance calls (insert, get, delete,
//! aggregatedList, setLabels) and zonal operations of `compute/v1`, an OAuth token endpoint and a metadata server, with the real API's status
//! codes, error JSON and pagination, and response shapes taken from `fixtures/gcp/`.
//!
//! What it follows (each shape's API reference section is cited in `fixtures/gcp/README.md`):
//! - names, zones, machine types, networks, subnetworks, network tags, labels and request IDs
//!   are checked as the API checks them, with its answers: 400 `invalid` for a malformed value
//!   or an unknown zone, 404 `notFound` for a network, subnetwork or image that does not exist;
//! - an insert answers a zonal operation; the instance goes PROVISIONING, STAGING, then RUNNING
//!   with an external address, and the operation DONE, once the operation time has passed on
//!   the fake's clock;
//! - a delete answers an operation; the instance shows STOPPING, and once the operation time
//!   has passed it is gone with its auto-delete boot disk; a second delete while the first
//!   runs gets 400 `resourceNotReady`;
//! - a repeated insert with a seen `requestId` answers the first operation and creates nothing;
//! - every instance has a `labelFingerprint`, which changes whenever its labels do; a setLabels
//!   must send the current one (else 412 `conditionNotMet`), replaces every label with those it
//!   sends (checked as insert checks them, at most 64), and answers an operation: the labels
//!   change, with a new fingerprint, once the operation time has passed;
//! - aggregatedList filters on a label, pages with `maxResults`/`pageToken`, puts a
//!   `NO_RESULTS_ON_PAGE` warning in zones without results and, under `returnPartialSuccess`,
//!   names unreachable zones both in `unreachables` and with an `UNREACHABLE` warning;
//! - every call needs a bearer token that the token endpoint issued from a correctly signed
//!   service-account assertion (RS256, checked against the test key, from a key id not
//!   retired) or an authorized-user refresh token, or that the metadata server gave.
//!
//! The fake's clock is tokio's (so a test with a paused clock drives it) plus what
//! [`FakeCompute::advance`] added; state moves only when a request or a hook looks at it.
//! Every request, token and metadata ones included, is in the call log ([`WorldView::seen`])
//! and passes the suite's [`Interceptor`] (kinds `token` and `metadata` for those two).
//!
//! What it does not cover: quotas and capacity (only injected), images beyond a prefix check,
//! firewall rules, IAM beyond "a valid token", and real instance boot times (an operation takes
//! the configured time, 20 ms unless a test sets another). Of setLabels: the `requestId` query
//! (not read), how the API answers a setLabels sent while another one still runs with the same
//! fingerprint (accepted here; the last to finish wins), and the real fingerprint's derivation
//! (an opaque 8-byte value here, new on every change).

#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use egress_conformance::{CallKind, Fault, Interceptor};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// The project the fake serves.
pub const PROJECT: &str = "egress-test";
/// Its zones.
pub const ZONES: [&str; 2] = ["europe-west1-b", "us-central1-a"];
/// Machine types every zone has.
pub const MACHINE_TYPES: [&str; 3] = ["e2-micro", "e2-small", "n2-standard-2"];
/// Image projects the fake knows; any other image is "not found".
pub const IMAGE_PREFIXES: [&str; 2] = ["projects/ubuntu-os-cloud/", "projects/debian-cloud/"];
/// Networks: (name, custom mode). An auto-mode network takes a NIC without a subnetwork; a
/// custom-mode one needs one.
pub const NETWORKS: [(&str, bool); 2] = [("default", false), ("custom-vpc", true)];
/// Subnetworks: (region, name, network).
pub const SUBNETWORKS: [(&str, &str, &str); 3] = [
    ("europe-west1", "proxies", "custom-vpc"),
    ("us-central1", "proxies", "custom-vpc"),
    ("europe-west1", "default", "default"),
];
/// How long an insert or a delete takes on the fake's clock unless a test sets another time.
pub const DEFAULT_OPERATION_TIME: Duration = Duration::from_millis(20);
/// The service account the test key belongs to.
pub const SERVICE_ACCOUNT: &str = "egress-operator@egress-test.iam.gserviceaccount.com";
/// The test key (fixtures/gcp/test-key.pem).
pub const TEST_KEY: &str = include_str!("../../../../fixtures/gcp/test-key.pem");
const API: &str = "https://www.googleapis.com/compute/v1";
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// A fixture file's text.
pub fn fixture(name: &str) -> String {
    let path = format!("{}/../../fixtures/gcp/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

/// One request the fake received: a compute call, or a token or metadata request (their bodies
/// are not kept: they carry credentials).
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub authorization: Option<String>,
    pub body: Option<Value>,
}

/// An instance.
#[derive(Clone, Debug)]
pub struct Vm {
    pub name: String,
    pub zone: String,
    pub id: u64,
    pub status: String,
    pub nat_ip: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// `creationTimestamp`, as the API shows it; empty leaves the field out (which no real
    /// instance does: the suite's C10 seeds it, with garbage too).
    pub created: String,
    /// `labelFingerprint`: new whenever `labels` change.
    pub label_fingerprint: String,
    /// Metadata items.
    pub metadata: BTreeMap<String, String>,
    pub machine_type: String,
    pub image: String,
    pub disk_size_gb: String,
    pub network: String,
    pub tags: Vec<String>,
    /// Made by an insert: the fake's clock moves it to RUNNING.
    advancing: bool,
    /// When its insert or delete started (on the fake's clock).
    since: Instant,
    /// A delete is in progress.
    pub deleting: bool,
    /// H12: the delete does not finish until released.
    hold_delete: bool,
    /// H10: shown with a field of the wrong type, which no reader can decode.
    pub unreadable: bool,
}

/// An operation and what it does when it completes.
#[derive(Clone, Debug)]
struct Op {
    body: Value,
    /// When it started (on the fake's clock).
    started: Instant,
    /// Fails with (code, message, HTTP status) instead of creating.
    fails: Option<(String, String, u16)>,
    /// The instance an insert makes when it completes (a stalled or failing insert).
    vm: Option<Vm>,
    /// The labels a setLabels gives instance (zone, name) when it completes.
    relabel: Option<((String, String), BTreeMap<String, String>)>,
}

#[derive(Debug, Default)]
struct World {
    instances: BTreeMap<(String, String), Vm>,
    /// Boot disks: (zone, name) -> owning instance.
    disks: BTreeMap<(String, String), String>,
    operations: BTreeMap<String, Op>,
    request_ids: HashMap<String, String>,
    /// Valid tokens: who they were issued to, and the key id (service accounts) they came from.
    tokens: HashMap<String, (String, String)>,
    /// Key ids whose assertions (and the tokens issued for them) are no longer accepted.
    retired_keys: BTreeSet<String>,
    /// What [`FakeCompute::advance`] added to tokio's clock.
    skew: Duration,
    /// How long an insert or a delete takes.
    operation_time: Duration,
    issued: u64,
    serial: u64,
    next_ip: u32,
    unreachable_zones: BTreeSet<String>,
    hold_pending: bool,
    /// The next inserts are accepted and then fail: (code, message, HTTP status).
    insert_failures: VecDeque<(String, String, u16)>,
    /// The next inserts are accepted but their operation stays RUNNING and no instance appears
    /// until released.
    stall_inserts: bool,
    locked: BTreeSet<String>,
    /// Answers given instead of carrying out the next call of a kind: (kind, status, body).
    scripted: Vec<(String, u16, Value)>,
    /// The next compute calls are carried out but their answers are lost (the connection drops).
    lose_answers: u32,
    /// Service accounts whose assertions are accepted.
    accounts: BTreeSet<String>,
    /// Authorized users: client_id -> (secret, refresh token).
    users: HashMap<String, (String, String)>,
    seen: Vec<Seen>,
    token_requests: u64,
    metadata_requests: u64,
    /// Unreachable zones are not named in the list's top-level `unreachables`, only by their
    /// `UNREACHABLE` warning (the API may answer either way).
    unreachables_unlisted: bool,
}

struct Shared {
    world: Mutex<World>,
    interceptor: Interceptor,
    public_key: Vec<u8>,
    token_url: String,
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The running fake. Clones share it; it stops when the last is dropped.
#[derive(Clone)]
pub struct FakeCompute {
    shared: Arc<Shared>,
    addr: SocketAddr,
    _server: Arc<AbortOnDrop>,
}

impl std::fmt::Debug for FakeCompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCompute")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The DER of the PEM's first block.
fn pem_der(pem: &str) -> Vec<u8> {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    data_encoding::BASE64.decode(b64.as_bytes()).expect("a PEM body")
}

/// A label fingerprint: opaque, 8 bytes in base64, as the API shows it.
fn fingerprint(serial: u64) -> String {
    data_encoding::BASE64.encode(&(serial ^ 0x7c3e_a5d1_0b2f_9e44).to_be_bytes())
}

fn now_rfc3339() -> String {
    let offset = jiff::tz::TimeZone::fixed(jiff::tz::offset(-7));
    jiff::Timestamp::now()
        .to_zoned(offset)
        .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
        .to_string()
}

/// An error answer from `fixtures/gcp/errors/<file>.json` about `resource`.
pub fn error_fixture(file: &str, resource: &str) -> (u16, Value) {
    let text = fixture(&format!("errors/{file}.json")).replace("{resource}", resource);
    let v: Value = serde_json::from_str(&text).expect("an error fixture");
    let code = v["error"]["code"].as_u64().expect("a code") as u16;
    (code, v)
}

/// The API's answer to an injected suite fault; `None` drops the connection.
pub fn fault_answer(fault: &Fault, resource: &str) -> Option<(u16, Value)> {
    Some(match fault {
        Fault::NotFound => error_fixture("404-notFound", resource),
        Fault::AlreadyExists => error_fixture("409-alreadyExists", resource),
        Fault::Quota => error_fixture("403-quotaExceeded", resource),
        Fault::RateLimit => error_fixture("429-rateLimitExceeded", resource),
        Fault::Unauthenticated => error_fixture("401-authError", resource),
        Fault::PermissionDenied => error_fixture("403-forbidden", resource),
        Fault::BadRequest => error_fixture("400-invalid", resource),
        Fault::Server5xx => error_fixture("503-backendError", resource),
        Fault::Timeout => (
            504,
            json!({"error": {"code": 504, "message": "Deadline exceeded", "status": "DEADLINE_EXCEEDED"}}),
        ),
        Fault::ConnectionReset => return None,
        Fault::Busy => error_fixture("400-resourceNotReady", resource),
        // A backend that echoes what it was sent, in an error.
        Fault::Raw(text) => (
            400,
            json!({"error": {"code": 400, "message": text, "errors": [{"message": text, "domain": "global", "reason": "invalid"}]}}),
        ),
    })
}

/// The API's name rule, written here again on purpose: the fake checks what the provider sends
/// by its own reading of the API, so a mistake in the provider's checks cannot hide in both.
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !name.ends_with('-')
}

fn valid_label(key: &str, value: &str) -> bool {
    let ok = |s: &str| {
        s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_')
    };
    !key.is_empty()
        && key.len() <= 63
        && key.as_bytes()[0].is_ascii_lowercase()
        && ok(key)
        && value.len() <= 63
        && ok(value)
}

fn valid_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts.iter().all(|p| p.bytes().all(|c| c.is_ascii_hexdigit()))
        && s.bytes().any(|c| c != b'0' && c != b'-')
}

type Answer = Option<(u16, Value)>;

impl FakeCompute {
    /// A fake with no instances, serving on a free loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        let addr = listener.local_addr().expect("an address");
        let der = pem_der(TEST_KEY);
        let pair = ring::signature::RsaKeyPair::from_pkcs8(&der).expect("the test key");
        let public_key = ring::signature::KeyPair::public_key(&pair).as_ref().to_vec();
        let shared = Arc::new(Shared {
            world: Mutex::new(World {
                next_ip: 10,
                operation_time: DEFAULT_OPERATION_TIME,
                ..World::default()
            }),
            interceptor: Interceptor::new(),
            public_key,
            token_url: format!("http://{addr}/token"),
        });
        shared.world().accounts.insert(SERVICE_ACCOUNT.to_owned());
        let server = {
            let shared = shared.clone();
            AbortOnDrop(tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req| {
                            let shared = shared.clone();
                            async move { shared.handle(req).await }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }))
        };
        Self {
            shared,
            addr,
            _server: Arc::new(server),
        }
    }

    /// Inserts and deletes take `time` from now on (on the fake's clock).
    pub fn set_operation_time(&self, time: Duration) {
        self.shared.world().operation_time = time;
    }

    /// Moves the fake's clock on by `by`, as if that much time had passed for the API.
    pub fn advance(&self, by: Duration) {
        self.shared.world().skew += by;
    }

    /// The `compute/v1` base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/compute/v1", self.addr)
    }

    /// The token endpoint.
    pub fn token_url(&self) -> String {
        self.shared.token_url.clone()
    }

    /// `host:port` of the metadata server.
    pub fn metadata_host(&self) -> String {
        self.addr.to_string()
    }

    /// The shared call log and fault injection.
    pub fn interceptor(&self) -> &Interceptor {
        &self.shared.interceptor
    }

    /// H16: every request, token and metadata ones included, loses its connection.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.shared.interceptor.set_unreachable(unreachable);
    }

    /// The world, for hooks and assertions.
    pub fn with<T>(&self, f: impl FnOnce(&mut WorldView<'_>) -> T) -> T {
        let mut w = self.shared.world();
        w.settle();
        f(&mut WorldView(&mut w))
    }

    /// A service-account key file whose `private_key_id` is `key_id`, for the test key.
    pub fn service_account_json(&self, key_id: &str, email: &str) -> String {
        json!({
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": key_id,
            "private_key": TEST_KEY,
            "client_email": email,
            "client_id": "104293877012345678901",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.token_url(),
        })
        .to_string()
    }

    /// Registers an authorized user and returns its key file.
    pub fn authorized_user_json(&self, client_id: &str, secret: &str, refresh: &str) -> String {
        self.shared
            .world()
            .users
            .insert(client_id.to_owned(), (secret.to_owned(), refresh.to_owned()));
        json!({
            "type": "authorized_user",
            "client_id": client_id,
            "client_secret": secret,
            "refresh_token": refresh,
        })
        .to_string()
    }
}

/// Access to the fake's state from tests and hooks.
pub struct WorldView<'a>(&'a mut World);

impl Vm {
    /// The bytes the guest's cloud-init would read: `user-data`, decoded when
    /// `user-data-encoding` says base64.
    pub fn user_data_bytes(&self) -> Option<Vec<u8>> {
        let value = self.metadata.get("user-data")?;
        match self.metadata.get("user-data-encoding").map(String::as_str) {
            Some("base64") => data_encoding::BASE64.decode(value.as_bytes()).ok(),
            _ => Some(value.clone().into_bytes()),
        }
    }
}

impl WorldView<'_> {
    pub fn vm(&mut self, name: &str) -> Option<&mut Vm> {
        self.0.instances.values_mut().find(|v| v.name == name)
    }
    pub fn vms(&self) -> Vec<Vm> {
        self.0.instances.values().cloned().collect()
    }
    pub fn disks(&self) -> Vec<(String, String)> {
        self.0.disks.keys().cloned().collect()
    }
    pub fn disk_owner(&self, zone: &str, name: &str) -> Option<String> {
        self.0.disks.get(&(zone.to_owned(), name.to_owned())).cloned()
    }
    pub fn seen(&self) -> Vec<Seen> {
        self.0.seen.clone()
    }
    pub fn token_requests(&self) -> u64 {
        self.0.token_requests
    }
    pub fn metadata_requests(&self) -> u64 {
        self.0.metadata_requests
    }
    pub fn seed(&mut self, vm: Vm) {
        self.0.disks.insert((vm.zone.clone(), vm.name.clone()), vm.name.clone());
        self.0.instances.insert((vm.zone.clone(), vm.name.clone()), vm);
    }
    pub fn new_vm(&mut self, name: &str, zone: &str) -> Vm {
        self.0.serial += 1;
        let since = self.0.now();
        Vm {
            name: name.to_owned(),
            zone: zone.to_owned(),
            id: 5_914_832_215_734_925_000 + self.0.serial,
            status: "PROVISIONING".to_owned(),
            nat_ip: None,
            labels: BTreeMap::new(),
            created: now_rfc3339(),
            label_fingerprint: fingerprint(self.0.serial),
            metadata: BTreeMap::new(),
            machine_type: "e2-micro".to_owned(),
            image: "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".to_owned(),
            disk_size_gb: "10".to_owned(),
            network: "global/networks/default".to_owned(),
            tags: Vec::new(),
            advancing: false,
            since,
            deleting: false,
            hold_delete: false,
            unreadable: false,
        }
    }
    /// Labels of `name` changed out of band (a hook): a new fingerprint, as the API gives.
    pub fn relabelled(&mut self, name: &str) {
        self.0.serial += 1;
        let next = fingerprint(self.0.serial);
        if let Some(vm) = self.vm(name) {
            vm.label_fingerprint = next;
        }
    }
    pub fn next_ip(&mut self) -> String {
        self.0.next_ip += 1;
        format!("34.76.{}.{}", self.0.next_ip / 250, self.0.next_ip % 250 + 2)
    }
    pub fn set_hold_pending(&mut self, hold: bool) {
        self.0.hold_pending = hold;
    }
    pub fn hold_delete(&mut self, name: &str) -> bool {
        let now = self.0.now();
        let Some(vm) = self.vm(name) else { return false };
        vm.hold_delete = true;
        vm.deleting = true;
        vm.since = now;
        vm.status = "STOPPING".to_owned();
        true
    }
    /// Whether the list names unreachable zones only by their per-zone `UNREACHABLE` warning,
    /// leaving the top-level `unreachables` out.
    pub fn unreachables_unlisted(&mut self, unlisted: bool) {
        self.0.unreachables_unlisted = unlisted;
    }
    pub fn release_delete(&mut self, name: &str) {
        if let Some(vm) = self.vm(name) {
            vm.hold_delete = false;
        }
    }
    pub fn set_zone_unreachable(&mut self, zone: &str) {
        self.0.unreachable_zones.insert(zone.to_owned());
    }
    pub fn fail_next_insert(&mut self, code: &str, message: &str, status: u16) {
        self.0
            .insert_failures
            .push_back((code.to_owned(), message.to_owned(), status));
    }
    pub fn stall_inserts(&mut self, stall: bool) {
        self.0.stall_inserts = stall;
    }
    /// The next compute call is carried out and its answer lost, as when a timeout or a reset
    /// cuts a request the API already accepted.
    pub fn lose_next_answer(&mut self) {
        self.0.lose_answers += 1;
    }
    /// The next call of `kind` is answered with `status` and `body` (an error fixture, say).
    pub fn script(&mut self, kind: &str, status: u16, body: Value) {
        self.0.scripted.push((kind.to_owned(), status, body));
    }
    pub fn lock(&mut self, name: &str) {
        self.0.locked.insert(name.to_owned());
    }
    pub fn unlock(&mut self, name: &str) {
        self.0.locked.remove(name);
    }
    /// Every token issued so far stops working (as a revoked key's would).
    pub fn revoke_tokens(&mut self) {
        self.0.tokens.clear();
    }
    /// A key rotation's end: every service-account key used so far is deleted, so its
    /// assertions are refused and the tokens issued for it stop working. A key id not used yet
    /// (the rotated file's) stays good.
    pub fn retire_used_keys(&mut self) {
        // User and metadata tokens come from no key (an empty key id): nothing to retire.
        let used: Vec<String> = self
            .0
            .tokens
            .values()
            .map(|(_, kid)| kid.clone())
            .filter(|kid| !kid.is_empty())
            .collect();
        self.0.retired_keys.extend(used);
        let retired = self.0.retired_keys.clone();
        self.0.tokens.retain(|_, (_, kid)| !retired.contains(kid));
    }
    /// Assertions signed for `email` are refused from now on.
    pub fn disable_account(&mut self, email: &str) {
        self.0.accounts.remove(email);
    }
    pub fn enable_account(&mut self, email: &str) {
        self.0.accounts.insert(email.to_owned());
    }
    /// Who each valid token was issued to.
    pub fn token_owners(&self) -> Vec<String> {
        self.0.tokens.values().map(|(owner, _)| owner.clone()).collect()
    }
    /// The key ids of the valid tokens (service accounts'; others have none).
    pub fn token_keys(&self) -> Vec<String> {
        self.0.tokens.values().map(|(_, kid)| kid.clone()).collect()
    }
}

impl World {
    /// The fake's clock.
    fn now(&self) -> Instant {
        Instant::now() + self.skew
    }

    /// Brings the state up to the fake's clock: instances move on, deletes finish, operations
    /// complete. Called before anything reads or changes the state.
    fn settle(&mut self) {
        let (now, time, hold) = (self.now(), self.operation_time, self.hold_pending);
        let mut gone = Vec::new();
        let mut ips = Vec::new();
        for (key, vm) in &mut self.instances {
            if vm.deleting {
                if !vm.hold_delete && now >= vm.since + time {
                    gone.push(key.clone());
                }
                continue;
            }
            if !vm.advancing {
                continue;
            }
            if hold {
                // Held instances wait; their time starts again once released.
                vm.since = now;
                continue;
            }
            match vm.status.as_str() {
                "PROVISIONING" | "STAGING" if now >= vm.since + time => {
                    vm.status = "RUNNING".to_owned();
                    vm.advancing = false;
                    if vm.nat_ip.is_none() {
                        ips.push(key.clone());
                    }
                }
                "PROVISIONING" if now >= vm.since + time / 2 => vm.status = "STAGING".to_owned(),
                "PROVISIONING" | "STAGING" => {}
                // A hook set another status: the instance stays in it.
                _ => vm.advancing = false,
            }
        }
        for key in ips {
            let ip = WorldView(self).next_ip();
            if let Some(vm) = self.instances.get_mut(&key) {
                vm.nat_ip = Some(ip);
            }
        }
        for key in gone {
            self.instances.remove(&key);
            self.disks.retain(|_, owner| *owner != key.1);
        }
        let stall = self.stall_inserts;
        let mut made = Vec::new();
        let mut relabelled = Vec::new();
        for op in self.operations.values_mut() {
            if op.body["status"] == "DONE" || (stall && op.body["operationType"] == "insert") || now < op.started + time
            {
                continue;
            }
            op.body["status"] = json!("DONE");
            op.body["progress"] = json!(100);
            op.body["endTime"] = json!(now_rfc3339());
            if let Some((code, message, status)) = &op.fails {
                op.body["error"] = json!({"errors": [{"code": code, "message": message}]});
                op.body["httpErrorStatusCode"] = json!(status);
                let phrase = StatusCode::from_u16(*status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("ERROR");
                op.body["httpErrorMessage"] = json!(phrase.to_uppercase());
            } else if let Some(mut vm) = op.vm.take() {
                vm.since = now;
                made.push(vm);
            } else if let Some(relabel) = op.relabel.take() {
                relabelled.push(relabel);
            }
        }
        for vm in made {
            WorldView(self).seed(vm);
        }
        for (key, labels) in relabelled {
            self.serial += 1;
            let next = fingerprint(self.serial);
            // An instance deleted meanwhile keeps nothing.
            if let Some(vm) = self.instances.get_mut(&key) {
                vm.labels = labels;
                vm.label_fingerprint = next;
            }
        }
    }
}

impl Shared {
    fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let method = req.method().as_str().to_owned();
        let uri = req.uri().clone();
        let path = uri.path().to_owned();
        let query: BTreeMap<String, String> = reqwest::Url::parse(&format!("http://x{uri}"))
            .map(|u| u.query_pairs().into_owned().collect())
            .unwrap_or_default();
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let authorization = header("authorization");
        let metadata_flavor = header("metadata-flavor");
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let answer = if path == "/token" && method == "POST" {
            self.credential_request(CallKind("token"), &method, &path, || self.token(&body))
                .await
        } else if path == "/computeMetadata/v1/instance/service-accounts/default/token" {
            self.credential_request(CallKind("metadata"), &method, &path, || {
                self.metadata(metadata_flavor.as_deref())
            })
            .await
        } else if let Some(rest) = path.strip_prefix(&format!("/compute/v1/projects/{PROJECT}/")) {
            self.compute(&method, rest, &query, authorization, &body).await
        } else {
            Some(error_fixture("404-notFound", &path))
        };
        let Some((status, value)) = answer else {
            // An error from the service closes the connection without an answer.
            return Err(std::io::Error::other("connection reset by the fake"));
        };
        let mut r = Response::new(Full::new(Bytes::from(value.to_string())));
        *r.status_mut() = StatusCode::from_u16(status).expect("a status");
        r.headers_mut().insert(
            "content-type",
            "application/json; charset=UTF-8".parse().expect("a header"),
        );
        Ok(r)
    }

    /// A token or metadata request: logged (without its body), passed through the suite's
    /// interceptor, then answered by `answer`.
    async fn credential_request(
        &self,
        kind: CallKind,
        method: &str,
        path: &str,
        answer: impl FnOnce() -> (u16, Value),
    ) -> Answer {
        self.world().seen.push(Seen {
            method: method.to_owned(),
            path: path.to_owned(),
            query: BTreeMap::new(),
            authorization: None,
            body: None,
        });
        if let Err(fault) = self.interceptor.enter(kind, "").await {
            return fault_answer(&fault, path);
        }
        Some(answer())
    }

    fn issue(&self, w: &mut World, owner: &str, hint: &str) -> (u16, Value) {
        w.issued += 1;
        let token = format!("ya29.fake{}.{hint}", w.issued);
        let kid = if hint == "user" || hint == "gce" {
            String::new()
        } else {
            hint.to_owned()
        };
        w.tokens.insert(token.clone(), (owner.to_owned(), kid));
        (
            200,
            json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"}),
        )
    }

    fn token(&self, body: &[u8]) -> (u16, Value) {
        let form: HashMap<String, String> =
            reqwest::Url::parse(&format!("http://x/?{}", String::from_utf8_lossy(body)))
                .map(|u| u.query_pairs().into_owned().collect())
                .unwrap_or_default();
        let mut w = self.world();
        w.token_requests += 1;
        let refuse = |why: &str| (400, json!({"error": "invalid_grant", "error_description": why}));
        match form.get("grant_type").map(String::as_str) {
            Some("urn:ietf:params:oauth:grant-type:jwt-bearer") => {
                let Some(assertion) = form.get("assertion") else {
                    return refuse("no assertion");
                };
                let parts: Vec<&str> = assertion.split('.').collect();
                let [h, c, s] = parts.as_slice() else {
                    return refuse("Invalid JWT");
                };
                let decode = |p: &str| data_encoding::BASE64URL_NOPAD.decode(p.as_bytes()).ok();
                let (Some(header), Some(claims), Some(sig)) = (decode(h), decode(c), decode(s)) else {
                    return refuse("Invalid JWT encoding");
                };
                let key = ring::signature::UnparsedPublicKey::new(
                    &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                    &self.public_key,
                );
                if key.verify(format!("{h}.{c}").as_bytes(), &sig).is_err() {
                    return refuse("Invalid JWT Signature.");
                }
                let (Ok(header), Ok(claims)) = (
                    serde_json::from_slice::<Value>(&header),
                    serde_json::from_slice::<Value>(&claims),
                ) else {
                    return refuse("Invalid JWT JSON");
                };
                let (iat, exp) = (claims["iat"].as_u64().unwrap_or(0), claims["exp"].as_u64().unwrap_or(0));
                if header["alg"] != "RS256"
                    || claims["aud"] != self.token_url.as_str()
                    || claims["scope"] != SCOPE
                    || exp.saturating_sub(iat) != 3600
                {
                    return refuse("Invalid JWT claims");
                }
                let email = claims["iss"].as_str().unwrap_or_default().to_owned();
                if !w.accounts.contains(&email) {
                    return refuse("Invalid grant: account not found");
                }
                let kid = header["kid"].as_str().unwrap_or_default().to_owned();
                if w.retired_keys.contains(&kid) {
                    return refuse("Invalid JWT Signature.");
                }
                self.issue(&mut w, &email, &kid)
            }
            Some("refresh_token") => {
                let id = form.get("client_id").cloned().unwrap_or_default();
                let ok = w.users.get(&id).is_some_and(|(secret, refresh)| {
                    form.get("client_secret") == Some(secret) && form.get("refresh_token") == Some(refresh)
                });
                if !ok {
                    return refuse("Bad Request");
                }
                self.issue(&mut w, &id, "user")
            }
            _ => (
                400,
                json!({"error": "unsupported_grant_type", "error_description": "Invalid grant_type"}),
            ),
        }
    }

    fn metadata(&self, flavor: Option<&str>) -> (u16, Value) {
        let mut w = self.world();
        w.metadata_requests += 1;
        if flavor != Some("Google") {
            return (403, json!({"error": "Missing Metadata-Flavor:Google header."}));
        }
        self.issue(&mut w, "metadata", "gce")
    }

    async fn compute(
        &self,
        method: &str,
        rest: &str,
        query: &BTreeMap<String, String>,
        authorization: Option<String>,
        body: &[u8],
    ) -> Answer {
        let segments: Vec<&str> = rest.split('/').collect();
        let (kind, zone, name) = match (method, segments.as_slice()) {
            ("POST", ["zones", zone, "instances"]) => ("insert", *zone, None),
            ("GET", ["zones", zone, "instances", name]) => ("get", *zone, Some(*name)),
            ("DELETE", ["zones", zone, "instances", name]) => ("delete", *zone, Some(*name)),
            ("POST", ["zones", zone, "instances", name, "setLabels"]) => ("setLabels", *zone, Some(*name)),
            ("GET", ["aggregated", "instances"]) => ("aggregatedList", "", None),
            ("GET", ["zones", zone, "operations", op]) => ("operation", *zone, Some(*op)),
            _ => return Some(error_fixture("404-notFound", rest)),
        };
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let target = match kind {
            "insert" => parsed
                .as_ref()
                .and_then(|b| b["name"].as_str())
                .unwrap_or_default()
                .to_owned(),
            "aggregatedList" => PROJECT.to_owned(),
            _ => name.unwrap_or_default().to_owned(),
        };
        self.world().seen.push(Seen {
            method: method.to_owned(),
            path: format!("/compute/v1/projects/{PROJECT}/{rest}"),
            query: query.clone(),
            authorization: authorization.clone(),
            body: parsed.clone(),
        });
        let resource = format!("projects/{PROJECT}/{rest}");
        if let Err(fault) = self.interceptor.enter(CallKind(kind), &target).await {
            return fault_answer(&fault, &resource);
        }
        let mut w = self.world();
        w.settle();
        if let Some(i) = w.scripted.iter().position(|(k, _, _)| k == kind) {
            let (_, status, body) = w.scripted.remove(i);
            return Some((status, body));
        }
        let token_ok = authorization
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "))
            .is_some_and(|t| w.tokens.contains_key(t));
        if !token_ok {
            return Some(error_fixture("401-authError", &resource));
        }
        if !zone.is_empty() && !ZONES.contains(&zone) {
            return Some(invalid(&format!(
                "Invalid value for field 'zone': '{zone}'. Unknown zone."
            )));
        }
        if w.unreachable_zones.contains(zone) {
            return Some(error_fixture("503-backendError", &resource));
        }
        let answer = match kind {
            "insert" => insert(&mut w, zone, query, parsed),
            "get" => get(&w, zone, name.unwrap_or_default()),
            "delete" => delete(&mut w, zone, name.unwrap_or_default()),
            "setLabels" => set_labels(&mut w, zone, name.unwrap_or_default(), parsed),
            "operation" => match w.operations.get(name.unwrap_or_default()) {
                Some(op)
                    if op.body["zone"]
                        .as_str()
                        .is_some_and(|z| z.ends_with(&format!("/{zone}"))) =>
                {
                    (200, op.body.clone())
                }
                _ => error_fixture("404-notFound", &resource),
            },
            _ => list(&w, query),
        };
        if w.lose_answers > 0 {
            w.lose_answers -= 1;
            return None;
        }
        Some(answer)
    }
}

fn operation(w: &mut World, zone: &str, kind: &str, target: &str, target_id: u64) -> Value {
    w.serial += 1;
    let name = format!(
        "operation-{}-63ef0a1b{:05x}-5e6f7a8b-9c0d1e2f",
        1_789_556_706_789u64 + w.serial,
        w.serial
    );
    let mut op: Value = serde_json::from_str(&fixture("operation.json")).expect("the operation fixture");
    let zone_url = format!("{API}/projects/{PROJECT}/zones/{zone}");
    op["id"] = json!((2_741_983_321_597_318_000u64 + w.serial).to_string());
    op["name"] = json!(name);
    op["zone"] = json!(zone_url);
    op["operationType"] = json!(kind);
    op["targetLink"] = json!(format!("{zone_url}/instances/{target}"));
    op["targetId"] = json!(target_id.to_string());
    op["insertTime"] = json!(now_rfc3339());
    op["startTime"] = json!(now_rfc3339());
    op["selfLink"] = json!(format!("{zone_url}/operations/{name}"));
    op
}

fn invalid(message: &str) -> (u16, Value) {
    (
        400,
        json!({"error": {"code": 400, "message": message, "errors": [{"message": message, "domain": "global", "reason": "invalid"}]}}),
    )
}

fn insert(w: &mut World, zone: &str, query: &BTreeMap<String, String>, body: Option<Value>) -> (u16, Value) {
    let Some(body) = body else {
        return invalid("Invalid JSON payload received.");
    };
    if let Some(rid) = query.get("requestId") {
        if !valid_uuid(rid) {
            return invalid(&format!(
                "Invalid value for field 'requestId': '{rid}'. Must be a UUID."
            ));
        }
        if let Some(op) = w.request_ids.get(rid).and_then(|n| w.operations.get(n)) {
            return (200, op.body.clone());
        }
    }
    let name = body["name"].as_str().unwrap_or_default().to_owned();
    if !valid_name(&name) {
        return invalid(&format!(
            "Invalid value for field 'resource.name': '{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'"
        ));
    }
    let mt = body["machineType"].as_str().unwrap_or_default();
    let mt_name = mt.strip_prefix(&format!("zones/{zone}/machineTypes/")).unwrap_or("");
    if !MACHINE_TYPES.contains(&mt_name) {
        return invalid(&format!(
            "Invalid value for field 'resource.machineType': '{mt}'. Machine type with name '{mt_name}' does not exist in zone '{zone}'."
        ));
    }
    let disk = &body["disks"][0];
    let image = disk["initializeParams"]["sourceImage"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if disk["boot"] != true || image.is_empty() {
        return invalid("Invalid value for field 'resource.disks[0]': a boot disk with a source image is required.");
    }
    if !IMAGE_PREFIXES.iter().any(|p| image.starts_with(p)) {
        return error_fixture("404-notFound", &image);
    }
    let mut labels = BTreeMap::new();
    for (k, v) in body["labels"].as_object().cloned().unwrap_or_default() {
        let v = v.as_str().unwrap_or_default().to_owned();
        if !valid_label(&k, &v) {
            return invalid(&format!(
                "Invalid value for field 'resource.labels': '{k}'. Label keys and values must be lowercase letters, digits, '-' or '_', at most 63 characters."
            ));
        }
        labels.insert(k, v);
    }
    let nic = &body["networkInterfaces"][0];
    let network = match nic_network(zone, nic) {
        Ok(network) => network,
        Err(answer) => return answer,
    };
    let mut tags = Vec::new();
    for (i, tag) in body["tags"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let tag = tag.as_str().unwrap_or_default();
        if !valid_name(tag) {
            return invalid(&format!(
                "Invalid value for field 'resource.tags.items[{i}]': '{tag}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'"
            ));
        }
        tags.push(tag.to_owned());
    }
    let mut metadata = BTreeMap::new();
    for item in body["metadata"]["items"].as_array().cloned().unwrap_or_default() {
        let value = item["value"].as_str().unwrap_or_default();
        if value.len() > 256 * 1024 {
            return invalid("Invalid value for field 'resource.metadata': metadata value exceeds 262144 bytes.");
        }
        let key = item["key"].as_str().unwrap_or_default().to_owned();
        if metadata.insert(key.clone(), value.to_owned()).is_some() {
            return invalid(&format!(
                "Invalid value for field 'resource.metadata': duplicate key '{key}'."
            ));
        }
    }
    // A name is taken from the insert on, not only once the instance shows.
    let pending = w
        .operations
        .values()
        .any(|op| op.vm.as_ref().is_some_and(|vm| vm.name == name && vm.zone == zone) && op.body["status"] != "DONE");
    if pending || w.instances.contains_key(&(zone.to_owned(), name.clone())) {
        return error_fixture(
            "409-alreadyExists",
            &format!("projects/{PROJECT}/zones/{zone}/instances/{name}"),
        );
    }
    let mut vm = WorldView(w).new_vm(&name, zone);
    vm.labels = labels;
    vm.metadata = metadata;
    vm.machine_type = mt_name.to_owned();
    vm.image = image;
    vm.disk_size_gb = disk["initializeParams"]["diskSizeGb"]
        .as_str()
        .unwrap_or("10")
        .to_owned();
    vm.network = network;
    vm.tags = tags;
    vm.advancing = true;
    let op_body = operation(w, zone, "insert", &name, vm.id);
    let op_name = op_body["name"].as_str().unwrap_or_default().to_owned();
    let fails = w.insert_failures.pop_front();
    let later = if fails.is_some() || w.stall_inserts {
        Some(vm)
    } else {
        WorldView(w).seed(vm);
        None
    };
    let started = w.now();
    w.operations.insert(
        op_name.clone(),
        Op {
            body: op_body.clone(),
            started,
            fails,
            vm: later,
            relabel: None,
        },
    );
    if let Some(rid) = query.get("requestId") {
        w.request_ids.insert(rid.clone(), op_name);
    }
    (200, op_body)
}

/// The `<what>s/<name>` path's parts of a reference in any form the API takes (a name, a
/// relative path, `projects/<p>/…`, a full URL), or `None` when it is none of them. `scope` is
/// what comes before `<what>s` (`global`, or `regions/<r>`).
fn reference<'a>(value: &'a str, what: &str) -> Option<(Option<&'a str>, &'a str)> {
    let path = value
        .strip_prefix(API)
        .or_else(|| value.strip_prefix("https://compute.googleapis.com/compute/v1"))
        .map_or(value, |p| p.trim_start_matches('/'));
    let path = match path.strip_prefix("projects/") {
        Some(rest) => {
            let (project, rest) = rest.split_once('/')?;
            (project == PROJECT).then_some(rest)?
        }
        None => path,
    };
    let parts: Vec<&str> = path.split('/').collect();
    match (what, parts.as_slice()) {
        ("network", ["global", "networks", name]) => Some((None, name)),
        ("subnetwork", ["regions", region, "subnetworks", name]) => Some((Some(region), name)),
        _ => None,
    }
}

/// The network (as `global/networks/<name>`) of an insert's NIC in `zone`, checked as the
/// API checks it: the network exists; a custom-mode one needs a subnetwork; a subnetwork
/// exists, in the zone's region and the NIC's network.
fn nic_network(zone: &str, nic: &Value) -> Result<String, (u16, Value)> {
    let given = nic["network"].as_str().unwrap_or("global/networks/default");
    let Some((_, name)) = reference(given, "network") else {
        return Err(invalid(&format!(
            "Invalid value for field 'resource.networkInterfaces[0].network': '{given}'. The URL is malformed."
        )));
    };
    let Some((_, custom)) = NETWORKS.iter().find(|(n, _)| *n == name) else {
        return Err(error_fixture(
            "404-notFound",
            &format!("projects/{PROJECT}/global/networks/{name}"),
        ));
    };
    let region = zone.rsplit_once('-').map_or(zone, |(r, _)| r);
    match nic["subnetwork"].as_str() {
        None if *custom => Err(invalid(&format!(
            "Invalid value for field 'resource.networkInterfaces[0]': ''. Subnetwork should be specified for custom subnetmode network '{name}'."
        ))),
        None => Ok(format!("global/networks/{name}")),
        Some(sub) => {
            let Some((Some(sub_region), sub_name)) = reference(sub, "subnetwork") else {
                return Err(invalid(&format!(
                    "Invalid value for field 'resource.networkInterfaces[0].subnetwork': '{sub}'. The URL is malformed."
                )));
            };
            let Some((_, _, sub_network)) = SUBNETWORKS.iter().find(|(r, n, _)| *r == sub_region && *n == sub_name)
            else {
                return Err(error_fixture(
                    "404-notFound",
                    &format!("projects/{PROJECT}/regions/{sub_region}/subnetworks/{sub_name}"),
                ));
            };
            if sub_region != region {
                return Err(invalid(&format!(
                    "Invalid value for field 'resource.networkInterfaces[0].subnetwork': '{sub}'. Subnetwork must be in the same region as the instance."
                )));
            }
            if *sub_network != name {
                return Err(invalid(&format!(
                    "Invalid value for field 'resource.networkInterfaces[0].subnetwork': '{sub}'. Subnetwork does not belong to network '{name}'."
                )));
            }
            Ok(format!("global/networks/{name}"))
        }
    }
}

/// The Instance resource for `vm`, from the fixture.
pub fn instance_json(vm: &Vm) -> Value {
    let mut v: Value = serde_json::from_str(&fixture("instance.json")).expect("the instance fixture");
    let zone_url = format!("{API}/projects/{PROJECT}/zones/{}", vm.zone);
    v["id"] = json!(vm.id.to_string());
    v["creationTimestamp"] = json!(vm.created);
    if vm.created.is_empty()
        && let Some(o) = v.as_object_mut()
    {
        o.remove("creationTimestamp");
    }
    v["name"] = json!(vm.name);
    v["tags"]["items"] = json!(vm.tags);
    v["machineType"] = json!(format!("{zone_url}/machineTypes/{}", vm.machine_type));
    v["status"] = json!(vm.status);
    v["zone"] = json!(zone_url);
    v["networkInterfaces"][0]["network"] = json!(format!("{API}/projects/{PROJECT}/{}", vm.network));
    match &vm.nat_ip {
        Some(ip) => v["networkInterfaces"][0]["accessConfigs"][0]["natIP"] = json!(ip),
        None => {
            if let Some(ac) = v["networkInterfaces"][0]["accessConfigs"][0].as_object_mut() {
                ac.remove("natIP");
            }
        }
    }
    v["disks"][0]["source"] = json!(format!("{zone_url}/disks/{}", vm.name));
    v["disks"][0]["diskSizeGb"] = json!(vm.disk_size_gb);
    if vm.metadata.is_empty() {
        if let Some(m) = v["metadata"].as_object_mut() {
            m.remove("items");
        }
    } else {
        v["metadata"]["items"] = vm
            .metadata
            .iter()
            .map(|(k, val)| json!({"key": k, "value": val}))
            .collect();
    }
    v["selfLink"] = json!(format!("{zone_url}/instances/{}", vm.name));
    v["labels"] = json!(vm.labels);
    v["labelFingerprint"] = json!(vm.label_fingerprint);
    if vm.unreadable {
        v["status"] = json!(7);
    }
    v
}

fn get(w: &World, zone: &str, name: &str) -> (u16, Value) {
    match w.instances.get(&(zone.to_owned(), name.to_owned())) {
        Some(vm) => (200, instance_json(vm)),
        None => error_fixture(
            "404-notFound",
            &format!("projects/{PROJECT}/zones/{zone}/instances/{name}"),
        ),
    }
}

fn delete(w: &mut World, zone: &str, name: &str) -> (u16, Value) {
    let resource = format!("projects/{PROJECT}/zones/{zone}/instances/{name}");
    if w.locked.contains(name) {
        return error_fixture("400-resourceNotReady", &resource);
    }
    let Some(vm) = w.instances.get_mut(&(zone.to_owned(), name.to_owned())) else {
        return error_fixture("404-notFound", &resource);
    };
    // The API refuses a second delete while the first runs.
    if vm.deleting {
        return error_fixture("400-resourceNotReady", &resource);
    }
    vm.deleting = true;
    vm.status = "STOPPING".to_owned();
    let id = vm.id;
    let started = w.now();
    if let Some(vm) = w.instances.get_mut(&(zone.to_owned(), name.to_owned())) {
        vm.since = started;
    }
    let op = operation(w, zone, "delete", name, id);
    let op_name = op["name"].as_str().unwrap_or_default().to_owned();
    w.operations.insert(
        op_name,
        Op {
            body: op.clone(),
            started,
            fails: None,
            vm: None,
            relabel: None,
        },
    );
    (200, op)
}

/// `instances.setLabels`: the labels sent replace every label of the instance once the
/// operation completes, if the fingerprint sent is the instance's current one (else 412
/// `conditionNotMet`). Labels are checked as insert checks them.
fn set_labels(w: &mut World, zone: &str, name: &str, body: Option<Value>) -> (u16, Value) {
    let resource = format!("projects/{PROJECT}/zones/{zone}/instances/{name}");
    let Some(body) = body else {
        return invalid("Invalid JSON payload received.");
    };
    if w.locked.contains(name) {
        return error_fixture("400-resourceNotReady", &resource);
    }
    let Some(vm) = w.instances.get(&(zone.to_owned(), name.to_owned())) else {
        return error_fixture("404-notFound", &resource);
    };
    if vm.deleting {
        return error_fixture("400-resourceNotReady", &resource);
    }
    if body["labelFingerprint"].as_str() != Some(vm.label_fingerprint.as_str()) {
        return error_fixture("412-conditionNotMet", &resource);
    }
    let id = vm.id;
    let mut labels = BTreeMap::new();
    for (k, v) in body["labels"].as_object().cloned().unwrap_or_default() {
        let v = v.as_str().unwrap_or_default().to_owned();
        if !valid_label(&k, &v) {
            return invalid(&format!(
                "Invalid value for field 'labels': '{k}'. Label keys and values must be lowercase letters, digits, '-' or '_', at most 63 characters."
            ));
        }
        labels.insert(k, v);
    }
    if labels.len() > 64 {
        return invalid("Invalid value for field 'labels': at most 64 labels are allowed.");
    }
    let op = operation(w, zone, "setLabels", name, id);
    let started = w.now();
    w.operations.insert(
        op["name"].as_str().unwrap_or_default().to_owned(),
        Op {
            body: op.clone(),
            started,
            fails: None,
            vm: None,
            relabel: Some(((zone.to_owned(), name.to_owned()), labels)),
        },
    );
    (200, op)
}

/// `labels.<key> = <value>` (spaces and quotes optional), the one filter form the fake reads.
fn label_filter(filter: &str) -> Option<(String, String)> {
    let (lhs, rhs) = filter.split_once('=')?;
    let key = lhs.trim().strip_prefix("labels.")?;
    let value = rhs.trim().trim_matches('"');
    Some((key.to_owned(), value.to_owned()))
}

fn list(w: &World, query: &BTreeMap<String, String>) -> (u16, Value) {
    let filter = match query.get("filter") {
        Some(f) => match label_filter(f) {
            Some(kv) => Some(kv),
            None => return invalid(&format!("Invalid list filter expression '{f}'.")),
        },
        None => None,
    };
    let partial = query.get("returnPartialSuccess").is_some_and(|v| v == "true");
    if !partial && !w.unreachable_zones.is_empty() {
        return error_fixture("503-backendError", &format!("projects/{PROJECT}/aggregated/instances"));
    }
    let page_size = query
        .get("maxResults")
        .and_then(|m| m.parse::<usize>().ok())
        .unwrap_or(500)
        .clamp(1, 500);
    let offset = query
        .get("pageToken")
        .and_then(|t| data_encoding::BASE64URL_NOPAD.decode(t.as_bytes()).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.strip_prefix("offset:").and_then(|n| n.parse::<usize>().ok()));
    let offset = match (query.get("pageToken"), offset) {
        (None, _) => 0,
        (Some(_), Some(o)) => o,
        (Some(t), None) => return invalid(&format!("Invalid value for field 'pageToken': '{t}'.")),
    };
    let matching: Vec<&Vm> = w
        .instances
        .values()
        .filter(|vm| !w.unreachable_zones.contains(&vm.zone))
        .filter(|vm| filter.as_ref().is_none_or(|(k, v)| vm.labels.get(k) == Some(v)))
        .collect();
    let page: Vec<&Vm> = matching.iter().skip(offset).take(page_size).copied().collect();
    let mut v: Value = serde_json::from_str(&fixture("aggregated-list.json")).expect("the list fixture");
    let mut items = serde_json::Map::new();
    for zone in ZONES {
        let scope = format!("zones/{zone}");
        if w.unreachable_zones.contains(zone) {
            items.insert(
                scope.clone(),
                json!({"warning": {"code": "UNREACHABLE",
                    "message": format!("Scope '{scope}' is unreachable; results for it are missing."),
                    "data": [{"key": "scope", "value": scope}]}}),
            );
            continue;
        }
        let here: Vec<Value> = page
            .iter()
            .filter(|vm| vm.zone == zone)
            .map(|vm| instance_json(vm))
            .collect();
        if here.is_empty() {
            items.insert(
                scope.clone(),
                json!({"warning": {"code": "NO_RESULTS_ON_PAGE",
                    "message": format!("There are no results for scope '{scope}' on this page."),
                    "data": [{"key": "scope", "value": scope}]}}),
            );
        } else {
            items.insert(scope, json!({"instances": here}));
        }
    }
    v["items"] = Value::Object(items);
    let obj = v.as_object_mut().expect("an object");
    if offset + page_size < matching.len() {
        obj.insert(
            "nextPageToken".to_owned(),
            json!(data_encoding::BASE64URL_NOPAD.encode(format!("offset:{}", offset + page_size).as_bytes())),
        );
    }
    if partial && !w.unreachable_zones.is_empty() && !w.unreachables_unlisted {
        obj.insert(
            "unreachables".to_owned(),
            json!(
                w.unreachable_zones
                    .iter()
                    .map(|z| format!("zones/{z}"))
                    .collect::<Vec<_>>()
            ),
        );
    } else {
        obj.remove("unreachables");
    }
    (200, v)
}
