//! What the two libvirt providers (`kvm`, `kvm2`) share, in one place.
//!
//! - [`domain`]: the document `virDomainDefineXML` takes, for either provider's flavour;
//! - [`volume`]: the document `virStorageVolCreateXML` takes (overlay, seed, base, marker);
//! - [`mark`]: the GC mark inside `<metadata>`, written and parsed by local name;
//! - [`seed`]: the NoCloud seed ISO (`cidata`: user-data byte for byte, meta-data, vendor-data
//!   with the guest-agent script).
//!
//! All of it is pure: no libvirt call, no I/O.

pub mod domain;
pub mod mark;
pub mod seed;
pub mod volume;
mod xml;

pub use domain::{DomainError, DomainSpec, Flavour};
pub use mark::{KVM_NAMESPACE, KVM2_NAMESPACE, Mark, MarkError, rfc3339};
pub use volume::{VolumeError, VolumeSpec};
pub use xml::XmlError;
