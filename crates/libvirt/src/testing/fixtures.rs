//! What the suite needs to know of a libvirt provider beyond its profile: the ids and
//! placements it refuses, its error table, the health-check reasons of each fault, and the
//! libvirt calls behind each operation.

use egress_conformance::target::{CallKinds, ClassifyCase};
use egress_conformance::{CallKind, Fault, Fixtures};
use egress_provider::{ErrorClass, Op, Placement, ProviderId};

use super::request_in;
use crate::engine::check::REASON_LIBVIRT_ERROR;
use crate::engine::failure::OpFailure;
use crate::generation::Generation;
use crate::host::LibvirtError;

/// The fixtures of `generation` for hosts `hosts` (the first is the default location).
pub fn fixtures(generation: Generation, hosts: &[&str]) -> Fixtures {
    let with = |f: &dyn Fn(&mut Placement)| {
        let mut p = request_in("fixture", hosts[0]).placement;
        f(&mut p);
        p
    };
    Fixtures {
        malformed_ids: malformed_ids(),
        id_in_unconfigured_location: Some((
            ProviderId::new("hosts/elsewhere/domains/proxy-aaaaaaaaaaaaaaaa"),
            "elsewhere".to_owned(),
        )),
        invalid_placements: vec![
            (with(&|p| p.zone = "elsewhere".into()), "zone", "elsewhere".into()),
            (with(&|p| p.machine_type = "huge".into()), "machineType", "huge".into()),
            (with(&|p| p.image = "windows".into()), "image", "windows".into()),
        ],
        classify_cases: classify_cases(generation),
        check_targets: hosts.iter().map(|h| (*h).to_owned()).collect(),
        check_faults: check_faults(generation, hosts[0]),
        locations: hosts.iter().map(|h| (*h).to_owned()).collect(),
        secondary_kinds: vec!["overlay".to_owned(), "seed".to_owned()],
        shared_kinds: vec!["image".to_owned()],
        calls: call_kinds(),
        // The per-call budgets are the SSH transport's (tests in egress-libvirt-ssh); the fake
        // has none.
        budgets: None,
        insecure_switch: Some("insecureIgnoreHostKey"),
    }
}

/// Ids that are not `hosts/<host>/domains/<name>`.
fn malformed_ids() -> Vec<ProviderId> {
    [
        "",
        "proxy-x",
        "beelink/proxy-x",
        "hosts/beelink/proxy-x",
        "hosts//domains/x",
        "hosts/beelink/domains/",
        "hosts/beelink/domains/x/y",
        "nodes/beelink/domains/x",
    ]
    .into_iter()
    .map(ProviderId::from)
    .collect()
}

/// The generation's error table, row by row, with the pool-space precheck and an error that
/// is not libvirt's.
fn classify_cases(generation: Generation) -> Vec<ClassifyCase> {
    let daemon = |n: i32| LibvirtError::daemon(n, "x");
    let classify = |e: &LibvirtError, op: Op| generation.classify(e, op);
    // Where the two tables part: 84 (operation unsupported) is Permanent for kvm only.
    let unsupported = match generation {
        Generation::Kvm => ErrorClass::Permanent,
        Generation::Kvm2 => ErrorClass::Transient,
    };
    let mut classify_cases = ClassifyCase::rows([
        ("42 in get", classify(&daemon(42), Op::Get), ErrorClass::NotFound),
        ("42 in create", classify(&daemon(42), Op::Create), ErrorClass::Transient),
        ("50 in delete", classify(&daemon(50), Op::Delete), ErrorClass::NotFound),
        ("49", classify(&daemon(49), Op::Get), ErrorClass::Permanent),
        ("27", classify(&daemon(27), Op::Create), ErrorClass::Permanent),
        ("88", classify(&daemon(88), Op::Get), ErrorClass::Permanent),
        ("67 in create", classify(&daemon(67), Op::Create), ErrorClass::Permanent),
        ("84", classify(&daemon(84), Op::Get), unsupported),
        ("55", classify(&daemon(55), Op::Get), ErrorClass::Transient),
        ("1", classify(&daemon(1), Op::Get), ErrorClass::Transient),
        (
            "a dropped connection",
            classify(&LibvirtError::transport("connection reset"), Op::Get),
            ErrorClass::Transient,
        ),
        (
            "the pool-space precheck short of room",
            OpFailure::quota("storage pool default has 1 bytes available, 2 needed").class(Op::Create),
            ErrorClass::QuotaExceeded,
        ),
    ]);
    classify_cases.push(ClassifyCase::not_a_backend_error(
        "a bare error, not from libvirt",
        &std::fmt::Error,
    ));
    classify_cases
}

/// The reason the health check gives for each fault on host `first`.
fn check_faults(generation: Generation, first: &str) -> Vec<(Fault, String, &'static str)> {
    let (denied, failed) = match generation {
        Generation::Kvm => (REASON_LIBVIRT_ERROR, REASON_LIBVIRT_ERROR),
        Generation::Kvm2 => (egress_provider::REASON_FORBIDDEN, egress_provider::REASON_API_ERROR),
    };
    vec![
        (Fault::PermissionDenied, first.into(), denied),
        (Fault::Timeout, first.into(), egress_provider::REASON_TIMEOUT),
        (Fault::Server5xx, first.into(), failed),
        (
            Fault::ConnectionReset,
            first.into(),
            egress_provider::REASON_UNREACHABLE,
        ),
    ]
}

/// The libvirt calls behind each operation, as the fake's call log names them.
fn call_kinds() -> CallKinds {
    let kinds = |names: &[&'static str]| -> Vec<CallKind> { names.iter().copied().map(CallKind).collect() };
    CallKinds {
        create_steps: kinds(&[
            "DomainGetMetadata",
            "StorageVolGetPath",
            "StoragePoolRefresh",
            "StoragePoolGetInfo",
            "StorageVolCreateXML",
            "StorageVolDelete",
            "StorageVolUpload",
            "DomainDefineXML",
            "DomainGetState",
            "DomainCreate",
        ]),
        create_instance: CallKind("DomainDefineXML"),
        get: kinds(&["DomainGetMetadata", "DomainGetState", "DomainInterfaceAddresses"]),
        get_discovery: vec![CallKind("DomainInterfaceAddresses")],
        delete_frees_name: CallKind("DomainUndefineFlags"),
        delete: kinds(&[
            "DomainGetMetadata",
            "DomainDestroy",
            "DomainUndefineFlags",
            "StorageVolDelete",
        ]),
        list: CallKind("ConnectListAllDomains"),
        probe: Some(CallKind("ConnectGetLibVersion")),
    }
}
