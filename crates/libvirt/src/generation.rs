//! Which of the two libvirt providers: the one choice that decides both the documents (their
//! form and metadata namespace) and the engine's behaviour (names, address sources, labels).

use crate::mark::{KVM_NAMESPACE, KVM2_NAMESPACE};
use crate::names;

/// Which provider's behaviour and documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Generation {
    /// The first-generation `kvm` provider: the Go operator's names and namespace kept, so its
    /// domains and cached images go on working; compact, unvalidated documents in the `.../kvm`
    /// namespace.
    Kvm,
    /// The second-generation `kvm2` provider: indented, validated documents in the `.../kvm2`
    /// namespace.
    Kvm2,
}

impl Generation {
    /// The metadata namespace of its marks.
    pub fn namespace(self) -> &'static str {
        match self {
            Self::Kvm => KVM_NAMESPACE,
            Self::Kvm2 => KVM2_NAMESPACE,
        }
    }

    /// The cached base image of catalogue key `key` (or a URL key) for entry `entry`.
    pub fn base_name(self, entry: &str, key: &str, format: &str) -> String {
        match self {
            Self::Kvm => names::base_kvm(key, format),
            Self::Kvm2 => names::base(entry, key, format),
        }
    }

    /// The key of an image given by URL.
    pub fn url_key(self, url: &str) -> String {
        match self {
            Self::Kvm => names::url_key_kvm(url),
            Self::Kvm2 => names::url_key(url),
        }
    }
}
