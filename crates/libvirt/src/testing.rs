//! The libvirt providers (kvm2, or kvm: the test files choose the generation) as conformance
//! targets over the in-memory libvirt fake ([`crate::fake`]): two hosts sharing one call log and
//! fault table, a DHCP that gives started guests an address, the SSH key file read on every call
//! as a dial would, with the base image served by a local HTTP server. The profile, fixtures
//! and requests here are every libvirt target's: `egress-libvirt-ssh`'s real-hypervisor target
//! (its `testing` feature) runs with them too.
//!
//! What the fake does not cover: libvirt's own behaviour (checked against the real daemon by
//! `egress-libvirt-ssh`'s `tests/seam.rs`), the SSH transport and its per-call budgets (its own
//! tests), a guest that really boots (the real-mode run).
//!
//! Behind the `testing` feature, for the tests of `egress-provider-kvm` and
//! `egress-provider-kvm2`; never in a production build.

mod backend;
mod fixtures;

use std::collections::BTreeMap;
use std::time::Duration;

use egress_conformance::Profile;
use egress_conformance::hooks::BackendObject;
use egress_conformance::target::{
    AsyncOps, ChildSpans, CreateReturn, Credentials, DeleteReturn, GcMark, ListPartial, Logging, ProvisioningState,
    Quota, Timeouts,
};
use egress_provider::{
    CreateRequest, ErrorClass, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_UID, Placement, name_from_uid,
};
use egress_testkit::ScratchDir;
use sha2::{Digest as _, Sha256};

pub use backend::{FakeBackend, FakeTarget};
pub use fixtures::fixtures;

use crate::config::{KvmConfig, KvmHost, KvmImage, KvmMachineType};
use crate::generation::Generation;
use crate::{Mark, rfc3339};

/// The hosts of the fake entry; the first is the default location.
pub const HOSTS: [&str; 2] = ["hv-a", "hv-b"];
/// The pool on every host.
pub const POOL: &str = "default";
/// The image key of the entry.
pub const IMAGE_KEY: &str = "test-image";
/// What each fake pool holds: room for a few overlays.
pub const POOL_BYTES: u64 = 200 << 30;

/// A small stand-in image (its bytes only matter to the digest).
pub fn image_bytes() -> Vec<u8> {
    (0..256 * 1024u32).map(|i| (i % 251) as u8).collect()
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A key file the fake accepts.
pub const FAKE_KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nZmFrZQ==\n-----END OPENSSH PRIVATE KEY-----\n";

/// The entry's block: every host of `hosts`, the image at `url` with its digest.
pub fn config(hosts: &[&str], url: &str, sha256: Option<String>, files: &ScratchDir) -> KvmConfig {
    KvmConfig {
        ssh_key_file: files.path().join("id_ed25519").display().to_string(),
        known_hosts_file: files.path().join("known_hosts").display().to_string(),
        domain_type: Some("qemu".to_owned()),
        images: BTreeMap::from([(
            IMAGE_KEY.to_owned(),
            KvmImage {
                url: url.to_owned(),
                sha256: sha256.unwrap_or_default(),
                ..KvmImage::default()
            },
        )]),
        machine_types: BTreeMap::from([(
            "small".to_owned(),
            KvmMachineType {
                vcpus: 1,
                memory_mib: 1024,
            },
        )]),
        hosts: hosts
            .iter()
            .map(|h| KvmHost {
                name: (*h).to_owned(),
                address: format!("{h}:22"),
                user: "virt".to_owned(),
                bridge: "br0".to_owned(),
                ..KvmHost::default()
            })
            .collect(),
        ..KvmConfig::default()
    }
}

/// The marks of a domain as the inventory shows them.
pub fn marks_of(metadata: Option<&String>) -> BTreeMap<String, String> {
    let mut marks = BTreeMap::new();
    if let Some(mark) = metadata.and_then(|m| Mark::parse(m).ok()) {
        if mark.managed {
            marks.insert(LABEL_MANAGED.to_owned(), "true".to_owned());
        }
        if !mark.uid.is_empty() {
            marks.insert(LABEL_UID.to_owned(), mark.uid);
        }
        if let Some(at) = mark.created_at {
            marks.insert("createdAt".to_owned(), rfc3339(at));
        }
        if let Some(i) = mark.installation {
            marks.insert(LABEL_INSTALLATION.to_owned(), i);
        }
    }
    marks
}

/// A volume as the inventory shows it: an overlay or seed belongs to its domain; base images
/// and their markers are shared.
pub fn volume_object(name: &str) -> BackendObject {
    let (kind, owner) = if let Some(owner) = name.strip_suffix("-seed.iso") {
        ("seed", owner.to_owned())
    } else if name.starts_with("base-") {
        ("image", String::new())
    } else if let Some(owner) = name.strip_suffix(".qcow2") {
        ("overlay", owner.to_owned())
    } else {
        ("volume", String::new())
    };
    BackendObject {
        kind: kind.to_owned(),
        owner,
        marks: BTreeMap::new(),
        user_data: None,
    }
}

/// The profile of a libvirt provider, whatever the backend.
pub fn profile(generation: Generation) -> Profile {
    Profile {
        create_return: CreateReturn::Blocking,
        delete_return: DeleteReturn::Waits,
        gc_mark: GcMark::WrittenMetadata,
        list_partial: ListPartial::FailWhole,
        // libvirt reports no quota through a call's error (a full disk is an I/O error, which
        // the table retries); the pool-space precheck's QuotaExceeded is covered in
        // tests/provider.rs.
        quota: Quota::Absent(ErrorClass::Transient),
        async_ops: AsyncOps::None,
        provisioning_state: ProvisioningState::CreateBlocks,
        timeouts: Timeouts::PerCall,
        logging: Logging::Tiered,
        // kvm has no child spans (as the Go provider had none).
        child_spans: match generation {
            Generation::Kvm => ChildSpans::None,
            Generation::Kvm2 => ChildSpans::SpanDecorator,
        },
        // kvm keeps the key once it loaded (a rotated Secret needs a restart); kvm2 reads it
        // on every connection.
        credentials: Credentials::MountedFiles {
            rereads: generation == Generation::Kvm2,
        },
        ip_discovered: true,
        delivers_cloud_init: true,
        adoption_guard: true,
        key_value_marks: true,
        create_not_found_class: ErrorClass::Transient,
        readiness_budget: Duration::from_secs(10),
        delete_budget: Duration::from_secs(10),
    }
}

/// A request for Proxy `uid` on host `location`.
pub fn request_in(uid: &str, location: &str) -> CreateRequest {
    CreateRequest {
        name: name_from_uid(uid),
        uid: uid.to_owned(),
        namespace: "crawl".to_owned(),
        proxy_name: format!("proxy-for-{uid}"),
        placement: Placement {
            region: String::new(),
            zone: location.to_owned(),
            machine_type: "small".to_owned(),
            image: IMAGE_KEY.to_owned(),
        },
        cloud_init: b"#cloud-config\nruncmd: [echo kvm2]\n".to_vec(),
        port: 3128,
        installation: None,
        credentials: None,
        spread_group: None,
    }
}
