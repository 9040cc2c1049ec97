//! A failure inside one operation, before it is wrapped for the reconciler: either a libvirt
//! call that failed (classified by the table of [`crate::classify`] for the operation), or a
//! verdict of the provider itself that carries its class from where it was decided.

use std::fmt;

use egress_libvirt::host::LibvirtError;
use egress_provider::{ErrorClass, Op, ProviderError};

use crate::classify::classify;

/// Why an operation failed.
#[derive(Clone, Debug)]
pub enum Failure {
    /// A libvirt call failed while doing `context`.
    Call {
        /// What was being done (`looking up domain proxy-x`).
        context: String,
        /// libvirt's (or the connection's) error.
        error: LibvirtError,
    },
    /// The provider's own verdict.
    Verdict {
        /// Its class, decided where the verdict was made.
        class: ErrorClass,
        /// What is wrong.
        message: String,
    },
}

impl Failure {
    /// A libvirt failure while doing `context`.
    pub fn call(context: impl Into<String>, error: LibvirtError) -> Self {
        Self::Call {
            context: context.into(),
            error,
        }
    }

    /// A verdict that no retry fixes.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::Verdict {
            class: ErrorClass::Permanent,
            message: message.into(),
        }
    }

    /// A verdict worth retrying.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::Verdict {
            class: ErrorClass::Transient,
            message: message.into(),
        }
    }

    /// Not enough room on the host: the reconciler waits its quota period.
    pub fn quota(message: impl Into<String>) -> Self {
        Self::Verdict {
            class: ErrorClass::QuotaExceeded,
            message: message.into(),
        }
    }

    /// The class for the reconciler, the failure met during `op`.
    pub fn class(&self, op: Op) -> ErrorClass {
        match self {
            Self::Call { error, .. } => classify(error, op),
            Self::Verdict { class, .. } => *class,
        }
    }

    /// libvirt's error, when a call failed.
    pub fn libvirt(&self) -> Option<&LibvirtError> {
        match self {
            Self::Call { error, .. } => Some(error),
            Self::Verdict { .. } => None,
        }
    }

    /// The error the provider returns: classified for `op`, naming entry `entry` and `id`.
    pub fn into_provider_error(self, op: Op, entry: &str, id: &str) -> ProviderError {
        ProviderError::new(self.class(op), op, entry, id).with_message(self.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Call { context, error } => write!(f, "{context}: {error}"),
            Self::Verdict { message, .. } => f.write_str(message),
        }
    }
}

/// Names what a libvirt call was doing when it failed.
pub trait Context<T> {
    /// The failure, described as doing `what`.
    ///
    /// # Errors
    /// [`Failure::Call`] when the call failed.
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, Failure>;
}

impl<T> Context<T> for Result<T, LibvirtError> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, Failure> {
        self.map_err(|error| Failure::call(what(), error))
    }
}

#[cfg(test)]
mod tests {
    use egress_libvirt::host::code;

    use super::*;

    #[test]
    fn calls_are_classified_for_their_operation_and_verdicts_keep_theirs() {
        let gone = Failure::call(
            "looking up domain vm",
            LibvirtError::daemon(code::NO_DOMAIN, "Domain not found"),
        );
        assert_eq!(gone.class(Op::Get), ErrorClass::NotFound);
        assert_eq!(gone.class(Op::Create), ErrorClass::Transient);
        assert_eq!(
            gone.to_string(),
            "looking up domain vm: Domain not found (libvirt error 42)"
        );
        let e = Failure::quota("storage pool default has 1 bytes available, 2 needed").into_provider_error(
            Op::Create,
            "kvm2-home",
            "",
        );
        assert_eq!(e.class(), ErrorClass::QuotaExceeded);
        assert_eq!(
            e.to_string(),
            "kvm2-home create: quota exceeded: storage pool default has 1 bytes available, 2 needed"
        );
    }
}
