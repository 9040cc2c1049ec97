//! What the two libvirt providers (`kvm`, `kvm2`) share, in one place.
//!
//! - [`config`]: the `kvm:` and `kvm2:` block of the providers file (one shape) and its rules;
//! - [`domain`]: the document `virDomainDefineXML` takes, for either provider's flavour;
//! - [`volume`]: the document `virStorageVolCreateXML` takes (overlay, seed, base, marker);
//! - [`mark`]: the GC mark inside `<metadata>`, written and parsed by local name;
//! - [`seed`]: the NoCloud seed ISO (`cidata`: user-data byte for byte, meta-data, vendor-data
//!   with the guest-agent script);
//! - [`host`]: the seam: the calls the providers make on one hypervisor ([`Host`]); the real one
//!   is `egress-libvirt-ssh`'s, and [`fake`] (feature `fake`) is an in-memory one with fault
//!   injection for the providers' conformance suites;
//! - [`engine`]: the provider itself, which `egress-provider-kvm` and `egress-provider-kvm2` run
//!   as its two generations: create, get, delete, list and the health check over [`Host`], the
//!   base-image cache (which downloads images over HTTP) and the per-name locks;
//! - [`names`]: the names of the volumes in a host's pool (overlay, seed, cached base, marker);
//! - `hypervisor_env` (feature `testing`): reading the file that describes a test hypervisor
//!   (`EGRESS_HV_ENV`), for the tests and conformance runs against a real one;
//! - `testing` (feature `testing`): both providers as conformance targets over [`fake`], with
//!   the profile and fixtures every libvirt target shares.
//!
//! The documents, the mark and the seed are pure (no libvirt call, no I/O). The engine does I/O
//! only through [`Host`] and its HTTP client for images, so it runs the same over the fake.

pub mod budget;
pub mod config;
pub mod domain;
pub mod engine;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod generation;
pub mod host;
#[cfg(feature = "testing")]
pub mod hypervisor_env;
pub mod mark;
pub mod names;
pub mod seed;
#[cfg(feature = "testing")]
pub mod testing;
pub mod volume;
mod xml;

pub use budget::transfer_budget;
pub use config::{KvmConfig, KvmHost, KvmImage, KvmMachineType};
pub use domain::{DomainError, DomainSpec};
pub use generation::Generation;
pub use host::{DialFailure, Host, LibvirtError, LvResult};
#[cfg(feature = "testing")]
pub use hypervisor_env::HypervisorEnv;
pub use mark::{KVM_NAMESPACE, KVM2_NAMESPACE, Mark, MarkError, rfc3339};
pub use volume::{VolumeError, VolumeSpec};
pub use xml::XmlError;
