//! A failure inside one operation, before it is wrapped for the reconciler: either a libvirt
//! call that failed (classified by the table of [`super::classify`] for the operation), or a
//! verdict of the provider itself that carries its class from where it was decided.

use std::fmt;

use crate::host::LibvirtError;
use egress_provider::{ErrorClass, Op, ProviderError, redact};

use crate::generation::Generation;

/// Why an operation failed.
#[derive(Clone, Debug)]
pub enum OpFailure {
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

impl OpFailure {
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

    /// The class for the reconciler, the failure met during `op`, by the kvm2 table.
    pub fn class(&self, op: Op) -> ErrorClass {
        self.class_in(Generation::Kvm2, op)
    }

    /// The class for the reconciler, the failure met during `op`, by `generation`'s table.
    pub fn class_in(&self, generation: Generation, op: Op) -> ErrorClass {
        match self {
            Self::Call { error, .. } => generation.classify(error, op),
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

    /// The error the provider returns: classified for `op`, naming entry `entry` and `id`,
    /// its text scrubbed (see [`OpFailure::shown`]).
    pub fn into_provider_error(
        self,
        generation: Generation,
        op: Op,
        entry: &str,
        id: &str,
        cloud_init: &[u8],
    ) -> ProviderError {
        ProviderError::new(self.class_in(generation, op), op, entry, id).with_message(self.shown(cloud_init))
    }

    /// The text as it may be shown (errors, logs): credentials a backend echoed are redacted,
    /// and so is any line of the request's cloud-init a backend quoted back.
    pub fn shown(&self, cloud_init: &[u8]) -> String {
        scrub(&redact(&self.to_string()), cloud_init)
    }
}

impl fmt::Display for OpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Call { context, error } => write!(f, "{context}: {error}"),
            Self::Verdict { message, .. } => f.write_str(message),
        }
    }
}

pub use egress_provider::scrub;

tokio::task_local! {
    /// The cloud-init of the create running in this task, so that every text shown on its way
    /// (call spans, log lines) can be scrubbed of it.
    static CLOUD_INIT: std::sync::Arc<Vec<u8>>;
}

/// Runs `work` with `cloud_init` as the text [`shown_here`] scrubs.
pub async fn guarding<F: std::future::Future>(cloud_init: &[u8], work: F) -> F::Output {
    CLOUD_INIT.scope(std::sync::Arc::new(cloud_init.to_vec()), work).await
}

/// `text` as it may be shown from inside [`guarding`]: credentials redacted, the guarded
/// cloud-init scrubbed (outside it, credentials only).
pub fn shown_here(text: &str) -> String {
    let redacted = redact(text);
    CLOUD_INIT.try_with(|ci| scrub(&redacted, ci)).unwrap_or(redacted)
}

/// Names what a libvirt call was doing when it failed.
pub trait Context<T> {
    /// The failure, described as doing `what`.
    ///
    /// # Errors
    /// [`OpFailure::Call`] when the call failed.
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, OpFailure>;
}

impl<T> Context<T> for Result<T, LibvirtError> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, OpFailure> {
        self.map_err(|error| OpFailure::call(what(), error))
    }
}

#[cfg(test)]
mod tests {
    use crate::host::code;

    use super::*;

    #[test]
    fn echoed_cloud_init_and_credentials_are_scrubbed() {
        let ci = b"#cloud-config\nwrite_files:\n  - content: TOP-SECRET-1\n    path: /etc/x\n";
        let f = OpFailure::call(
            "defining domain vm",
            LibvirtError::daemon(
                1,
                format!(
                    "bad user-data {:?} from https://x/?access_token=abc123 at line '  - content: TOP-SECRET-1'",
                    String::from_utf8_lossy(ci)
                ),
            ),
        );
        let shown = f.shown(ci);
        assert!(!shown.contains("TOP-SECRET-1") && !shown.contains("abc123"), "{shown}");
        assert!(shown.starts_with("defining domain vm: bad user-data "), "{shown}");
        assert_eq!(scrub("no echo here", ci), "no echo here");
        assert_eq!(scrub("anything", b""), "anything");
    }

    #[test]
    fn calls_are_classified_for_their_operation_and_verdicts_keep_theirs() {
        let gone = OpFailure::call(
            "looking up domain vm",
            LibvirtError::daemon(code::NO_DOMAIN, "Domain not found"),
        );
        assert_eq!(gone.class(Op::Get), ErrorClass::NotFound);
        assert_eq!(gone.class(Op::Create), ErrorClass::Transient);
        assert_eq!(
            gone.to_string(),
            "looking up domain vm: Domain not found (libvirt error 42)"
        );
        let e = OpFailure::quota("storage pool default has 1 bytes available, 2 needed").into_provider_error(
            Generation::Kvm2,
            Op::Create,
            "kvm2-home",
            "",
            b"",
        );
        assert_eq!(e.class(), ErrorClass::QuotaExceeded);
        assert_eq!(
            e.to_string(),
            "kvm2-home create: quota exceeded: storage pool default has 1 bytes available, 2 needed"
        );
    }
}
