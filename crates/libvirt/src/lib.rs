//! What the two libvirt providers (`kvm`, `kvm2`) share, in one place.
//!
//! - [`domain`]: the document `virDomainDefineXML` takes, for either provider's flavour;
//! - [`volume`]: the document `virStorageVolCreateXML` takes (overlay, seed, base, marker);
//! - [`mark`]: the GC mark inside `<metadata>`, written and parsed by local name;
//! - [`seed`]: the NoCloud seed ISO (`cidata`: user-data byte for byte, meta-data, vendor-data
//!   with the guest-agent script);
//! - [`host`]: the seam: the calls the providers make on one hypervisor ([`Host`]); the real one
//!   is `egress-libvirt-ssh`'s, and [`fake`] (feature `fake`) is an in-memory one with fault
//!   injection for the providers' conformance suites.
//!
//! Apart from the fake, all of it is pure: no libvirt call, no I/O.

pub mod domain;
pub mod engine;
#[cfg(feature = "fake")]
pub mod fake;
pub mod host;
pub mod hypervisor_env;
pub mod mark;
pub mod seed;
pub mod volume;
mod xml;

pub use domain::{DomainError, DomainSpec, Flavour};
pub use host::{DialFailure, Host, LibvirtError, LvResult};
pub use hypervisor_env::HypervisorEnv;
pub use mark::{KVM_NAMESPACE, KVM2_NAMESPACE, Mark, MarkError, rfc3339};
pub use volume::{VolumeError, VolumeSpec};
pub use xml::XmlError;
