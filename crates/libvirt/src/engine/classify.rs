//! The kvm2 classify table (spec/kvm.md §8): what a libvirt answer, or a connection that could
//! not be made, means for the reconciler. Anything not in the table is Transient ("unknown
//! means retry").

use crate::host::{DialFailure, LibvirtError};
use egress_provider::{ErrorClass, Op};

/// libvirt error numbers the table names (beyond those of [`crate::host::code`]).
mod number {
    pub(super) const NO_SUPPORT: i32 = 3;
    pub(super) const INVALID_ARG: i32 = 8;
    pub(super) const XML_ERROR: i32 = 27;
    pub(super) const NO_DOMAIN: i32 = 42;
    pub(super) const AUTH_FAILED: i32 = 45;
    pub(super) const NO_STORAGE_POOL: i32 = 49;
    pub(super) const NO_STORAGE_VOL: i32 = 50;
    pub(super) const CONFIG_UNSUPPORTED: i32 = 67;
    pub(super) const ACCESS_DENIED: i32 = 88;
}

/// The class of `e`, met during `op`.
pub fn classify(e: &LibvirtError, op: Op) -> ErrorClass {
    if let Some(failure) = e.dial {
        return match failure {
            // A key that does not parse, a host key that does not match, a key the host
            // refuses: no retry fixes those. A file that is not there yet may appear (its
            // Secret mounted later).
            DialFailure::KeyInvalid | DialFailure::KnownHostsInvalid | DialFailure::HostKey | DialFailure::Auth => {
                ErrorClass::Permanent
            }
            DialFailure::KeyUnreadable
            | DialFailure::KnownHostsUnreadable
            | DialFailure::Timeout
            | DialFailure::Network
            | DialFailure::Socket
            | DialFailure::Libvirt => ErrorClass::Transient,
        };
    }
    if e.transport {
        return ErrorClass::Transient;
    }
    match e.code {
        // Gone; but inside create, a domain or volume vanishing between steps is a race.
        number::NO_DOMAIN | number::NO_STORAGE_VOL if op == Op::Create => ErrorClass::Transient,
        number::NO_DOMAIN | number::NO_STORAGE_VOL => ErrorClass::NotFound,
        // Review M7: the host cannot run the domain as configured (no usable KVM, an unknown
        // machine type); retrying never helps.
        number::CONFIG_UNSUPPORTED if op == Op::Create => ErrorClass::Permanent,
        number::NO_STORAGE_POOL
        | number::XML_ERROR
        | number::NO_SUPPORT
        | number::INVALID_ARG
        | number::AUTH_FAILED
        | number::ACCESS_DENIED => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// The first-generation table (spec/kvm.md §8.1, kvm column): more of libvirt's refusals are
/// Permanent. Two of its defects are not kept (review T1): a libvirt "not found" inside create
/// is Transient, not NotFound (something vanished between steps, the instance is not gone); and
/// an SSH key the host refuses or a host key that does not match is Permanent, as in kvm2,
/// rather than retried forever.
pub fn classify_kvm(e: &LibvirtError, op: Op) -> ErrorClass {
    if e.dial.is_some() || e.transport {
        return classify(e, op);
    }
    match e.code {
        number::NO_DOMAIN | number::NO_STORAGE_VOL if op == Op::Create => ErrorClass::Transient,
        number::NO_DOMAIN | number::NO_STORAGE_VOL => ErrorClass::NotFound,
        number::NO_STORAGE_POOL
        | number::XML_ERROR
        | kvm_number::XML_DETAIL
        | kvm_number::XML_INVALID_SCHEMA
        | number::CONFIG_UNSUPPORTED
        | number::NO_SUPPORT
        | kvm_number::OPERATION_UNSUPPORTED
        | kvm_number::ARGUMENT_UNSUPPORTED
        | number::INVALID_ARG
        | number::AUTH_FAILED
        | number::ACCESS_DENIED
        | kvm_number::OPERATION_DENIED => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// The numbers only the first-generation table names.
mod kvm_number {
    pub(super) const OPERATION_DENIED: i32 = 29;
    pub(super) const XML_DETAIL: i32 = 35;
    pub(super) const ARGUMENT_UNSUPPORTED: i32 = 74;
    pub(super) const OPERATION_UNSUPPORTED: i32 = 84;
    pub(super) const XML_INVALID_SCHEMA: i32 = 92;
}

#[cfg(test)]
mod tests {
    use crate::host::code;

    use super::*;

    #[test]
    fn the_table() {
        let daemon = |n: i32| LibvirtError::daemon(n, "x");
        for (n, get, create) in [
            (42, ErrorClass::NotFound, ErrorClass::Transient),
            (50, ErrorClass::NotFound, ErrorClass::Transient),
            (49, ErrorClass::Permanent, ErrorClass::Permanent),
            (27, ErrorClass::Permanent, ErrorClass::Permanent),
            (3, ErrorClass::Permanent, ErrorClass::Permanent),
            (8, ErrorClass::Permanent, ErrorClass::Permanent),
            (45, ErrorClass::Permanent, ErrorClass::Permanent),
            (88, ErrorClass::Permanent, ErrorClass::Permanent),
            // Unmapped in kvm2: Transient.
            (35, ErrorClass::Transient, ErrorClass::Transient),
            (92, ErrorClass::Transient, ErrorClass::Transient),
            // Review M7: Permanent in create.
            (67, ErrorClass::Transient, ErrorClass::Permanent),
            (84, ErrorClass::Transient, ErrorClass::Transient),
            (74, ErrorClass::Transient, ErrorClass::Transient),
            (29, ErrorClass::Transient, ErrorClass::Transient),
            (code::OPERATION_INVALID, ErrorClass::Transient, ErrorClass::Transient),
            (code::STORAGE_VOL_EXIST, ErrorClass::Transient, ErrorClass::Transient),
            (code::AGENT_UNRESPONSIVE, ErrorClass::Transient, ErrorClass::Transient),
            (1, ErrorClass::Transient, ErrorClass::Transient),
            (9, ErrorClass::Transient, ErrorClass::Transient),
            (38, ErrorClass::Transient, ErrorClass::Transient),
            (87, ErrorClass::Transient, ErrorClass::Transient),
        ] {
            assert_eq!(classify(&daemon(n), Op::Get), get, "code {n} in get");
            assert_eq!(classify(&daemon(n), Op::Create), create, "code {n} in create");
        }
    }

    #[test]
    fn the_first_generation_table() {
        let daemon = |n: i32| LibvirtError::daemon(n, "x");
        for n in [49, 27, 35, 92, 67, 3, 84, 74, 8, 45, 88, 29] {
            assert_eq!(classify_kvm(&daemon(n), Op::Get), ErrorClass::Permanent, "code {n}");
        }
        for n in [1, 9, 38, 55, 86, 87, 90] {
            assert_eq!(classify_kvm(&daemon(n), Op::Get), ErrorClass::Transient, "code {n}");
        }
        assert_eq!(classify_kvm(&daemon(42), Op::Get), ErrorClass::NotFound);
        assert_eq!(classify_kvm(&daemon(50), Op::Delete), ErrorClass::NotFound);
        // Not kept from the original: NotFound inside create.
        assert_eq!(classify_kvm(&daemon(42), Op::Create), ErrorClass::Transient);
        assert_eq!(
            classify_kvm(&LibvirtError::dial(DialFailure::Auth, "refused"), Op::Get),
            ErrorClass::Permanent
        );
    }

    #[test]
    fn connections_that_fail() {
        assert_eq!(
            classify(
                &LibvirtError::transport("libvirt call X exceeded its 30s budget"),
                Op::Get
            ),
            ErrorClass::Transient
        );
        for (failure, class) in [
            (DialFailure::KeyUnreadable, ErrorClass::Transient),
            (DialFailure::KeyInvalid, ErrorClass::Permanent),
            (DialFailure::KnownHostsUnreadable, ErrorClass::Transient),
            (DialFailure::KnownHostsInvalid, ErrorClass::Permanent),
            (DialFailure::HostKey, ErrorClass::Permanent),
            (DialFailure::Auth, ErrorClass::Permanent),
            (DialFailure::Timeout, ErrorClass::Transient),
            (DialFailure::Network, ErrorClass::Transient),
            (DialFailure::Socket, ErrorClass::Transient),
            (DialFailure::Libvirt, ErrorClass::Transient),
        ] {
            assert_eq!(
                classify(&LibvirtError::dial(failure, "dialing"), Op::Delete),
                class,
                "{failure:?}"
            );
        }
    }
}
