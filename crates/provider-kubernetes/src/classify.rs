//! The classify table of the kubernetes provider (spec/providers.md §4.10): an API status by its
//! reason first, its code only when the reason is not one the API defines (as Go's predicates
//! did), with two exceptions: 429 is "too many requests" whatever the reason, and a server
//! timeout is known by its reason only (500 alone is too generic).

use egress_provider::{ErrorClass, Op};

/// A failed call, as far as classification goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallFailure<'a> {
    /// The API server answered with a Status.
    Api {
        /// `status.reason` (may be empty).
        reason: &'a str,
        /// `status.code`.
        code: u16,
    },
    /// No answer: connection, TLS, DNS, credentials (kubeconfig, exec plugin).
    Transport,
}

/// The reasons the API defines (`metav1.StatusReason`).
const KNOWN_REASONS: [&str; 17] = [
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Gone",
    "Invalid",
    "ServerTimeout",
    "Timeout",
    "TooManyRequests",
    "BadRequest",
    "MethodNotAllowed",
    "NotAcceptable",
    "RequestEntityTooLarge",
    "UnsupportedMediaType",
    "InternalError",
    "ServiceUnavailable",
];

/// The reason a status stands for: its own when the API defines it, else the one its code
/// implies (none for codes that imply none).
fn effective_reason(reason: &str, code: u16) -> &str {
    if KNOWN_REASONS.contains(&reason) {
        return reason;
    }
    match code {
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Gone",
        422 => "Invalid",
        400 => "BadRequest",
        504 => "Timeout",
        _ => "",
    }
}

/// Whether the answer to a create says the Pod exists already (idempotency: success).
pub fn is_already_exists(f: CallFailure<'_>) -> bool {
    matches!(f, CallFailure::Api { reason, code } if effective_reason(reason, code) == "AlreadyExists")
}

/// The class of `f`, met during `op`.
pub fn classify(f: CallFailure<'_>, op: Op) -> ErrorClass {
    let CallFailure::Api { reason, code } = f else {
        return ErrorClass::Transient;
    };
    if code == 429 {
        return ErrorClass::Transient;
    }
    match effective_reason(reason, code) {
        // Inside create a 404 means the Proxy's namespace is gone (a race with its deletion):
        // create never answers NotFound.
        "NotFound" if op == Op::Create => ErrorClass::Transient,
        "NotFound" => ErrorClass::NotFound,
        // An RBAC or admission denial and an exhausted ResourceQuota look alike (403): no
        // retry fixes the first, so neither is retried.
        "Forbidden" | "Invalid" | "BadRequest" | "Unauthorized" => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(reason: &str, code: u16) -> CallFailure<'_> {
        CallFailure::Api { reason, code }
    }

    #[test]
    fn the_table() {
        use ErrorClass::{NotFound, Permanent, Transient};
        for (reason, code, get, create) in [
            ("NotFound", 404, NotFound, Transient),
            ("", 404, NotFound, Transient),
            ("TooManyRequests", 429, Transient, Transient),
            ("Forbidden", 429, Transient, Transient),
            ("ServerTimeout", 500, Transient, Transient),
            ("Timeout", 504, Transient, Transient),
            ("", 504, Transient, Transient),
            ("Forbidden", 403, Permanent, Permanent),
            ("", 403, Permanent, Permanent),
            ("Invalid", 422, Permanent, Permanent),
            ("BadRequest", 400, Permanent, Permanent),
            ("Unauthorized", 401, Permanent, Permanent),
            ("InternalError", 500, Transient, Transient),
            ("", 500, Transient, Transient),
            ("Conflict", 409, Transient, Transient),
            // An unknown reason falls back on the code.
            ("SomethingNew", 403, Permanent, Permanent),
            ("Unknown", 404, NotFound, Transient),
        ] {
            assert_eq!(classify(api(reason, code), Op::Get), get, "{reason} {code} in get");
            assert_eq!(
                classify(api(reason, code), Op::Create),
                create,
                "{reason} {code} in create"
            );
        }
        assert_eq!(classify(CallFailure::Transport, Op::Delete), Transient);
    }

    #[test]
    fn already_exists_is_known_by_its_reason() {
        assert!(is_already_exists(api("AlreadyExists", 409)));
        assert!(!is_already_exists(api("Conflict", 409)));
        assert!(!is_already_exists(api("", 409)));
        assert!(!is_already_exists(CallFailure::Transport));
    }
}
