//! The in-memory reference provider and its conformance target.
//!
//! It models a small compute API (zones, labelled instances with a boot
//! disk, bearer tokens) and a provider written against it the way the
//! contract asks: placement checked before any call, lookup-then-insert with
//! an adoption guard, every call bounded and cancellable, errors classified
//! and scrubbed, list failing whole per zone and skipping unreadable
//! instances with a log line. It passes the whole suite; its [`Defect`]s
//! break it on purpose.

mod backend;
mod provider;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use egress_provider::{BoxError, CreateRequest, ErrorClass, Placement, Provider, ProviderId, name_from_uid};

pub use backend::{
    BackendError, DEFAULT_ZONE, INITIAL_TOKEN, INSERT, InstanceView, LABEL, LIST, LOOKUP, MemoryBackend, REMOVE, ZONES,
    native, unix_seconds,
};
pub use provider::{Defect, MemoryConfig, MemoryProvider, classify, parse_id};

use crate::hooks::Fault;
use crate::target::{
    AsyncOps, Budgets, BuildOptions, CallKinds, ChildSpans, ClassifyCase, ConformanceTarget, CreateReturn, Credentials,
    DeleteReturn, Fixtures, GcMark, ListPartial, Logging, NotConfigured, Profile, ProvisioningState, Quota, Timeouts,
};

/// The budget of one backend call of the reference provider.
pub const CALL_BUDGET: Duration = Duration::from_millis(500);

/// The reference provider as a conformance target, optionally with defects.
#[derive(Clone, Debug, Default)]
pub struct MemoryTarget {
    defects: Vec<Defect>,
}

impl MemoryTarget {
    /// The correct reference provider.
    pub fn new() -> Self {
        Self::default()
    }

    /// The reference provider with `defect` switched on.
    pub fn broken(defect: Defect) -> Self {
        Self { defects: vec![defect] }
    }

    /// The entry settings the target builds with.
    pub fn config(backend: &MemoryBackend) -> MemoryConfig {
        MemoryConfig {
            zones: ZONES.iter().map(|z| (*z).to_owned()).collect(),
            machine_types: vec!["small".to_owned()],
            images: vec!["debian-13".to_owned()],
            token_file: backend.token_file(),
            call_budget: CALL_BUDGET,
        }
    }
}

#[async_trait]
impl ConformanceTarget for MemoryTarget {
    type Backend = MemoryBackend;

    async fn backend(&self) -> Result<MemoryBackend, NotConfigured> {
        Ok(MemoryBackend::new())
    }

    fn build(&self, backend: &MemoryBackend, options: &BuildOptions) -> Result<Arc<dyn Provider>, BoxError> {
        Ok(Arc::new(MemoryProvider::new(
            &options.entry_name,
            Self::config(backend),
            backend.clone(),
            self.defects.clone(),
        )))
    }

    fn profile(&self) -> Profile {
        Profile {
            create_return: CreateReturn::Submit,
            delete_return: DeleteReturn::Waits,
            gc_mark: GcMark::NativeLabels,
            list_partial: ListPartial::FailWhole,
            quota: Quota::Detected,
            async_ops: AsyncOps::BackendLock,
            provisioning_state: ProvisioningState::Native,
            timeouts: Timeouts::PerCall,
            logging: Logging::OutcomeOnly,
            child_spans: ChildSpans::SpanDecorator,
            credentials: Credentials::MountedFiles { rereads: true },
            ip_discovered: false,
            delivers_cloud_init: true,
            adoption_guard: true,
            key_value_marks: true,
            create_not_found_class: ErrorClass::Transient,
            readiness_budget: Duration::from_secs(5),
            delete_budget: Duration::from_secs(5),
        }
    }

    fn valid_request(&self, uid: &str) -> CreateRequest {
        self.request_in(uid, DEFAULT_ZONE)
    }

    fn request_in(&self, uid: &str, location: &str) -> CreateRequest {
        CreateRequest {
            name: name_from_uid(uid),
            uid: uid.to_owned(),
            namespace: "crawl".to_owned(),
            proxy_name: format!("proxy-for-{uid}"),
            placement: Placement {
                region: String::new(),
                zone: location.to_owned(),
                machine_type: "small".to_owned(),
                image: "debian-13".to_owned(),
            },
            cloud_init: b"#cloud-config\npackages: [squid]\n".to_vec(),
            port: 3128,
            installation: None,
            credentials: None,
            spread_group: None,
        }
    }

    fn id_for(&self, name: &str) -> ProviderId {
        ProviderId::new(format!("zones/{DEFAULT_ZONE}/instances/{name}"))
    }

    fn fixtures(&self) -> Fixtures {
        let placement = self.valid_request("fixture").placement;
        let with = |f: &dyn Fn(&mut Placement)| {
            let mut p = placement.clone();
            f(&mut p);
            p
        };
        let classify_cases = classify_cases();
        Fixtures {
            malformed_ids: [
                "",
                "name-only",
                "zones/z/instances",
                "zones//instances/x",
                "regions/r/instances/x",
                "zones/z/instances/x/y",
                "zones/z/instances/",
                "z/x",
            ]
            .into_iter()
            .map(ProviderId::from)
            .collect(),
            id_in_unconfigured_location: Some((
                ProviderId::new("zones/zone-gone/instances/proxy-aaaaaaaaaaaaaaaa"),
                "zone-gone".to_owned(),
            )),
            invalid_placements: vec![
                (with(&|p| p.zone.clear()), "zone", String::new()),
                (with(&|p| p.zone = "zone-nowhere".into()), "zone", "zone-nowhere".into()),
                (with(&|p| p.machine_type = "huge".into()), "machineType", "huge".into()),
                (with(&|p| p.image.clear()), "image", String::new()),
                (with(&|p| p.image = "windows".into()), "image", "windows".into()),
            ],
            classify_cases,
            check_targets: ZONES.iter().map(|z| (*z).to_owned()).collect(),
            check_faults: vec![
                (
                    Fault::Unauthenticated,
                    "zone-a".into(),
                    egress_provider::REASON_UNAUTHORIZED,
                ),
                (
                    Fault::PermissionDenied,
                    "zone-a".into(),
                    egress_provider::REASON_FORBIDDEN,
                ),
                (
                    Fault::ConnectionReset,
                    "zone-a".into(),
                    egress_provider::REASON_UNREACHABLE,
                ),
                (Fault::Timeout, "zone-a".into(), egress_provider::REASON_TIMEOUT),
                (Fault::Server5xx, "zone-a".into(), egress_provider::REASON_API_ERROR),
            ],
            locations: ZONES.iter().map(|z| (*z).to_owned()).collect(),
            secondary_kinds: vec!["disk".to_owned()],
            shared_kinds: vec![],
            calls: CallKinds {
                create_steps: vec![LOOKUP, INSERT],
                create_instance: INSERT,
                get: vec![LOOKUP],
                get_discovery: vec![],
                delete_frees_name: REMOVE,
                delete: vec![REMOVE],
                list: LIST,
                probe: Some(LIST),
            },
            budgets: Some(Budgets { get: CALL_BUDGET }),
            insecure_switch: None,
        }
    }
}

/// The classify table's cases: each fault as the backend answers it, and an error that is not
/// the backend's.
fn classify_cases() -> Vec<ClassifyCase> {
    let classify_rows = [
        (Fault::NotFound, ErrorClass::NotFound),
        (Fault::Quota, ErrorClass::QuotaExceeded),
        (Fault::RateLimit, ErrorClass::QuotaExceeded),
        (Fault::Unauthenticated, ErrorClass::Permanent),
        (Fault::PermissionDenied, ErrorClass::Permanent),
        (Fault::BadRequest, ErrorClass::Permanent),
        (Fault::Server5xx, ErrorClass::Transient),
        (Fault::Timeout, ErrorClass::Transient),
        (Fault::ConnectionReset, ErrorClass::Transient),
        (Fault::Busy, ErrorClass::Transient),
        (Fault::Raw("unexpected answer".to_owned()), ErrorClass::Transient),
    ];
    let mut classify_cases = ClassifyCase::rows(
        classify_rows
            .into_iter()
            .map(|(fault, expected)| (format!("{fault:?}"), classify(&fault), expected)),
    );
    let io = std::io::Error::other("not from the backend");
    classify_cases.push(ClassifyCase::not_a_backend_error(
        "an io::Error, not a backend error",
        &io,
    ));
    classify_cases
}
