//! The gcp provider as a conformance target, over the fake Compute server in [`fake`]: the
//! real client, auth, classify and wire-log code run against it, and its state and fault
//! injection serve as the backend hooks. The API never sends an instance it cannot describe,
//! so H10 shows one with a field of the wrong type: the provider must fail the list (or skip
//! the instance), never guess.

#![allow(dead_code, unreachable_pub)]

pub mod fake;
pub mod real;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_conformance::hooks::{BackendObject, HookResult, SeedManaged, SeedTime};
use egress_conformance::target::{
    AsyncOps, Budgets, CallKinds, ChildSpans, ClassifyCase, CreateReturn, Credentials, DeleteReturn, GcMark,
    ListPartial, Logging, ProvisioningState, Quota, Timeouts,
};
use egress_conformance::{
    BackendHooks, BuildOptions, CallKind, ConformanceTarget, Fault, Fixtures, Interceptor, NativeState, NotConfigured,
    Profile, SeedSpec, Unsupported,
};
use egress_provider::{
    BoxError, CreateRequest, ErrorClass, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_UID, Placement, Provider, ProviderId,
    name_from_uid,
};
use egress_provider_gcp::classify::{ApiError, Call, RequestFailure, classify};
use egress_provider_gcp::{CredentialSource, Settings, WireOptions};
use egress_testkit::ScratchDir;

pub use fake::{FakeCompute, PROJECT, SERVICE_ACCOUNT, ZONES};

/// The zone requests go to unless a case asks for another.
pub const ZONE: &str = ZONES[0];
/// The image every request boots.
pub const IMAGE: &str = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64";

/// The fake server and the key file the provider reads.
#[derive(Clone, Debug)]
pub struct GcpBackend {
    pub fake: FakeCompute,
    pub dir: Arc<ScratchDir>,
}

impl GcpBackend {
    /// A fresh fake with a valid service-account key file.
    pub async fn new() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let fake = FakeCompute::start().await;
        let dir = Arc::new(ScratchDir::new("gcp"));
        let backend = Self { fake, dir };
        std::fs::write(
            backend.key_path(),
            backend.fake.service_account_json("test-key-1", SERVICE_ACCOUNT),
        )
        .expect("write the key file");
        backend
    }

    /// The key file.
    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join("key.json")
    }

    /// A provider of entry `name` over this fake, with `options` for the wire log.
    pub fn provider(&self, name: &str, wire: WireOptions) -> egress_provider_gcp::GcpProvider {
        self.provider_with(name, Settings::for_project(PROJECT), wire)
    }

    /// [`Self::provider`] with `settings` of the test's (ones a load would refuse, say).
    pub fn provider_with(&self, name: &str, settings: Settings, wire: WireOptions) -> egress_provider_gcp::GcpProvider {
        egress_provider_gcp::build(
            name,
            settings,
            CredentialSource::KeyFile(self.key_path()),
            &self.fake.base_url(),
            wire,
        )
        .expect("a provider")
    }
}

fn status_of(state: &NativeState) -> String {
    match state {
        NativeState::Pending => "PROVISIONING".to_owned(),
        NativeState::Running => "RUNNING".to_owned(),
        NativeState::Stopped => "STOPPED".to_owned(),
        NativeState::Terminated => "TERMINATED".to_owned(),
        NativeState::Unknown(raw) => raw.clone(),
    }
}

/// `t` as the API shows times (RFC 3339, milliseconds, Pacific offset).
pub fn api_time(t: SystemTime) -> Result<String, Unsupported> {
    let ts = jiff::Timestamp::try_from(t).map_err(|_| Unsupported("a time the API cannot show"))?;
    Ok(ts
        .to_zoned(jiff::tz::TimeZone::fixed(jiff::tz::offset(-7)))
        .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
        .to_string())
}

#[async_trait]
impl BackendHooks for GcpBackend {
    fn interceptor(&self) -> Option<&Interceptor> {
        Some(self.fake.interceptor())
    }

    async fn seed(&self, spec: SeedSpec) -> HookResult {
        // The API always shows a valid creationTimestamp; the fake can leave it out or garble
        // it, so the provider's reading of both is proven (C10).
        let created = match spec.created_at {
            SeedTime::Valid(created) => api_time(created)?,
            SeedTime::Missing => String::new(),
            SeedTime::Garbage => "yesterday-ish".to_owned(),
        };
        let zone = spec.location.clone().unwrap_or_else(|| ZONE.to_owned());
        self.fake.with(|w| {
            let mut vm = w.new_vm(&spec.name, &zone);
            vm.status = status_of(&spec.state);
            vm.nat_ip = spec.ip.map(|ip| ip.to_string());
            match &spec.managed {
                SeedManaged::Yes => {
                    vm.labels.insert(LABEL_MANAGED.to_owned(), "true".to_owned());
                }
                SeedManaged::No => {}
                SeedManaged::Other(v) => {
                    vm.labels.insert(LABEL_MANAGED.to_owned(), v.clone());
                }
            }
            if let Some(uid) = &spec.uid {
                vm.labels.insert(LABEL_UID.to_owned(), uid.clone());
            }
            vm.created = created;
            w.seed(vm);
        });
        Ok(())
    }

    async fn set_native_state(&self, name: &str, state: NativeState) -> HookResult {
        self.fake.with(|w| match w.vm(name) {
            Some(vm) => {
                vm.status = status_of(&state);
                Ok(())
            }
            None => Err(Unsupported("H02 on an instance the fake does not hold")),
        })
    }

    async fn hold_new_instances_pending(&self, hold: bool) -> HookResult {
        self.fake.with(|w| w.set_hold_pending(hold));
        Ok(())
    }

    async fn set_address(&self, name: &str, ip: Option<IpAddr>) -> HookResult {
        self.fake.with(|w| match w.vm(name) {
            Some(vm) => {
                vm.nat_ip = ip.map(|ip| ip.to_string());
                Ok(())
            }
            None => Err(Unsupported("H03 on an instance the fake does not hold")),
        })
    }

    async fn rewrite_marks(&self, name: &str, uid: &str, created_at: SystemTime) -> HookResult {
        let created = api_time(created_at)?;
        self.fake.with(|w| match w.vm(name) {
            Some(vm) => {
                vm.labels.insert(LABEL_UID.to_owned(), uid.to_owned());
                vm.created = created;
                w.relabelled(name);
                Ok(())
            }
            None => Err(Unsupported("H04 on an instance the fake does not hold")),
        })
    }

    async fn strip_marks(&self, name: &str) -> HookResult {
        self.fake.with(|w| match w.vm(name) {
            Some(vm) => {
                vm.labels.remove(LABEL_MANAGED);
                vm.labels.remove(LABEL_UID);
                w.relabelled(name);
                Ok(())
            }
            None => Err(Unsupported("H04 on an instance the fake does not hold")),
        })
    }

    async fn inventory(&self) -> HookResult<Vec<BackendObject>> {
        Ok(self.fake.with(|w| {
            let mut out: Vec<BackendObject> = w
                .vms()
                .into_iter()
                .map(|vm| BackendObject {
                    kind: "instance".to_owned(),
                    owner: vm.name.clone(),
                    marks: [LABEL_MANAGED, LABEL_UID, LABEL_INSTALLATION]
                        .into_iter()
                        .filter_map(|k| vm.labels.get(k).map(|v| (k.to_owned(), v.clone())))
                        .collect(),
                    user_data: vm.user_data_bytes(),
                })
                .collect();
            for (zone, name) in w.disks() {
                out.push(BackendObject {
                    kind: "disk".to_owned(),
                    owner: w.disk_owner(&zone, &name).unwrap_or_default(),
                    marks: Default::default(),
                    user_data: None,
                });
            }
            out
        }))
    }

    async fn make_unreadable(&self, name: &str) -> HookResult {
        self.fake.with(|w| match w.vm(name) {
            Some(vm) => {
                vm.unreadable = true;
                Ok(())
            }
            None => Err(Unsupported("H10 on an instance the fake does not hold")),
        })
    }

    async fn make_scope_unreachable(&self, location: &str) -> HookResult {
        self.fake.with(|w| w.set_zone_unreachable(location));
        Ok(())
    }

    async fn begin_backend_delete(&self, name: &str) -> HookResult {
        if self.fake.with(|w| w.hold_delete(name)) {
            Ok(())
        } else {
            Err(Unsupported("H12 on an instance the fake does not hold"))
        }
    }

    async fn finish_delete(&self, name: &str) -> HookResult {
        self.fake.with(|w| w.release_delete(name));
        Ok(())
    }

    async fn lock(&self, name: &str) -> HookResult {
        self.fake.with(|w| w.lock(name));
        Ok(())
    }

    async fn unlock(&self, name: &str) -> HookResult {
        self.fake.with(|w| w.unlock(name));
        Ok(())
    }

    async fn credential_path(&self) -> HookResult<PathBuf> {
        Ok(self.key_path())
    }

    async fn valid_credential(&self, sentinel: &str) -> HookResult<String> {
        // The key id travels in the assertion's header, and the fake puts it in the token.
        Ok(self.fake.service_account_json(sentinel, SERVICE_ACCOUNT))
    }

    async fn retire_credentials(&self) -> HookResult {
        self.fake.with(|w| w.retire_used_keys());
        Ok(())
    }

    async fn set_unreachable(&self, unreachable: bool) -> HookResult {
        self.fake.set_unreachable(unreachable);
        Ok(())
    }
}

/// The gcp provider over the fake.
#[derive(Clone, Copy, Debug)]
pub struct GcpTarget;

/// A request for Proxy `uid` in zone `zone`.
pub fn request_in(uid: &str, zone: &str) -> CreateRequest {
    CreateRequest {
        name: name_from_uid(uid),
        uid: uid.to_owned(),
        namespace: "crawl".to_owned(),
        proxy_name: format!("proxy-{}", &name_from_uid(uid)[6..]),
        placement: Placement {
            region: String::new(),
            zone: zone.to_owned(),
            machine_type: "e2-micro".to_owned(),
            image: IMAGE.to_owned(),
        },
        cloud_init: b"#cloud-config\npackages: [squid]\n".to_vec(),
        port: 3128,
        installation: None,
        credentials: None,
        spread_group: None,
    }
}

/// An API error as the fake answers it.
fn api_row(file: &str, call: Call) -> ErrorClass {
    let body = fake::fixture(&format!("errors/{file}.json"));
    let status: u16 = file[..3].parse().expect("a status prefix");
    classify(&RequestFailure::Api(ApiError::from_body(status, body.as_bytes())), call)
}

#[async_trait]
impl ConformanceTarget for GcpTarget {
    type Backend = GcpBackend;

    async fn backend(&self) -> Result<GcpBackend, NotConfigured> {
        Ok(GcpBackend::new().await)
    }

    fn build(&self, backend: &GcpBackend, options: &BuildOptions) -> Result<Arc<dyn Provider>, BoxError> {
        Ok(Arc::new(backend.provider(&options.entry_name, WireOptions::default())))
    }

    fn profile(&self) -> Profile {
        Profile {
            create_return: CreateReturn::Submit,
            delete_return: DeleteReturn::ReturnsEarly,
            gc_mark: GcMark::NativeLabels,
            list_partial: ListPartial::OmitUnreachable,
            quota: Quota::Detected,
            async_ops: AsyncOps::TaskHandle,
            provisioning_state: ProvisioningState::Native,
            timeouts: Timeouts::PerCall,
            logging: Logging::Tiered,
            child_spans: ChildSpans::TransportWrapper,
            credentials: Credentials::Environment,
            ip_discovered: false,
            delivers_cloud_init: true,
            adoption_guard: true,
            key_value_marks: true,
            create_not_found_class: ErrorClass::Permanent,
            readiness_budget: Duration::from_secs(10),
            delete_budget: Duration::from_secs(10),
        }
    }

    fn valid_request(&self, uid: &str) -> CreateRequest {
        request_in(uid, ZONE)
    }

    fn request_in(&self, uid: &str, location: &str) -> CreateRequest {
        request_in(uid, location)
    }

    fn id_for(&self, name: &str) -> ProviderId {
        ProviderId::new(format!("zones/{ZONE}/instances/{name}"))
    }

    fn fixtures(&self) -> Fixtures {
        let mut classify_cases = ClassifyCase::rows([
            (
                "404 notFound in get",
                api_row("404-notFound", Call::Get),
                ErrorClass::NotFound,
            ),
            (
                "404 notFound in delete",
                api_row("404-notFound", Call::Delete),
                ErrorClass::NotFound,
            ),
            (
                "404 notFound in setLabels (gone since the read)",
                api_row("404-notFound", Call::SetLabels),
                ErrorClass::NotFound,
            ),
            (
                "412 conditionNotMet in setLabels (labels changed since the read)",
                api_row("412-conditionNotMet", Call::SetLabels),
                ErrorClass::Transient,
            ),
            (
                "404 notFound in insert (an image, a zone)",
                api_row("404-notFound", Call::Insert),
                ErrorClass::Permanent,
            ),
            (
                "429 rateLimitExceeded",
                api_row("429-rateLimitExceeded", Call::Insert),
                ErrorClass::QuotaExceeded,
            ),
            (
                "403 quotaExceeded",
                api_row("403-quotaExceeded", Call::Insert),
                ErrorClass::QuotaExceeded,
            ),
            (
                "403 rateLimitExceeded",
                api_row("403-rateLimitExceeded", Call::List),
                ErrorClass::QuotaExceeded,
            ),
            (
                "403 forbidden",
                api_row("403-forbidden", Call::Insert),
                ErrorClass::Permanent,
            ),
            (
                "403 accessNotConfigured",
                api_row("403-accessNotConfigured", Call::Get),
                ErrorClass::Permanent,
            ),
            (
                "400 invalid",
                api_row("400-invalid", Call::Insert),
                ErrorClass::Permanent,
            ),
            (
                "401 authError",
                api_row("401-authError", Call::Get),
                ErrorClass::Permanent,
            ),
            (
                "500 backendError",
                api_row("500-backendError", Call::Get),
                ErrorClass::Transient,
            ),
            (
                "503 backendError",
                api_row("503-backendError", Call::Insert),
                ErrorClass::Transient,
            ),
            (
                "400 resourceNotReady in delete",
                api_row("400-resourceNotReady", Call::Delete),
                ErrorClass::Transient,
            ),
            (
                "409 alreadyExists outside insert",
                api_row("409-alreadyExists", Call::Delete),
                ErrorClass::Transient,
            ),
        ]);
        for (what, f) in [
            (
                "connection refused",
                RequestFailure::Transport {
                    message: "connection refused".into(),
                    timed_out: false,
                },
            ),
            (
                "no token",
                RequestFailure::Token {
                    message: "token endpoint unreachable".into(),
                    permanent: false,
                },
            ),
        ] {
            classify_cases.push(ClassifyCase::transient_without_answer(what, classify(&f, Call::Get)));
        }
        let kinds = |names: &[&'static str]| names.iter().map(|n| CallKind(n)).collect::<Vec<_>>();
        let bad = |zone: &str, mt: &str, image: &str| Placement {
            region: String::new(),
            zone: zone.to_owned(),
            machine_type: mt.to_owned(),
            image: image.to_owned(),
        };
        Fixtures {
            // spec §2.4's list, and a few more of the same kinds.
            malformed_ids: [
                "",
                "zones/z/instances",
                "zones//instances/x",
                "regions/r/instances/x",
                "zones/z/instances/x/y",
                "z/x",
                "proxy-x",
                "zones/europe-west1-b/instances/",
                "zones/europe-west1-b/instance/proxy-x",
            ]
            .into_iter()
            .map(ProviderId::from)
            .collect(),
            // Zones are not configured: every zone is in scope.
            id_in_unconfigured_location: None,
            invalid_placements: vec![
                (bad("", "e2-micro", IMAGE), "zone", String::new()),
                (bad(ZONE, "", IMAGE), "machineType", String::new()),
                (bad(ZONE, "e2-micro", ""), "image", String::new()),
                (
                    bad("zones/europe-west1-b", "e2-micro", IMAGE),
                    "zone",
                    "zones/europe-west1-b".to_owned(),
                ),
            ],
            classify_cases,
            check_targets: vec![PROJECT.to_owned()],
            check_faults: vec![
                (
                    Fault::PermissionDenied,
                    PROJECT.into(),
                    egress_provider::REASON_FORBIDDEN,
                ),
                (
                    Fault::Unauthenticated,
                    PROJECT.into(),
                    egress_provider::REASON_UNAUTHORIZED,
                ),
                (Fault::Server5xx, PROJECT.into(), egress_provider::REASON_API_ERROR),
                (Fault::RateLimit, PROJECT.into(), egress_provider::REASON_API_ERROR),
                (
                    Fault::ConnectionReset,
                    PROJECT.into(),
                    egress_provider::REASON_UNREACHABLE,
                ),
            ],
            locations: ZONES.iter().map(|z| (*z).to_owned()).collect(),
            secondary_kinds: vec!["disk".to_owned()],
            shared_kinds: Vec::new(),
            calls: CallKinds {
                create_steps: kinds(&["insert"]),
                create_instance: CallKind("insert"),
                get: kinds(&["get"]),
                get_discovery: Vec::new(),
                delete_frees_name: CallKind("delete"),
                delete: kinds(&["delete"]),
                list: CallKind("aggregatedList"),
                probe: Some(CallKind("aggregatedList")),
            },
            budgets: Some(Budgets {
                get: egress_provider_gcp::provider::CALL_BUDGET,
            }),
            insecure_switch: None,
        }
    }
}
