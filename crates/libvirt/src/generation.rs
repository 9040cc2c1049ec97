//! Which of the two libvirt providers: the one choice that decides both the documents (their
//! form and metadata namespace) and the engine's behaviour (names, address sources, labels).

use crate::mark::{KVM_NAMESPACE, KVM2_NAMESPACE};

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
}
