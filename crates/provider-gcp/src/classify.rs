//! What a failed call means (spec/providers.md §5.8) and what the health check calls it (§6.2).
//! Pure functions over [`RequestFailure`], the one error type the HTTP client produces.

use std::fmt;

use egress_provider::{
    ErrorClass, REASON_API_ERROR, REASON_FORBIDDEN, REASON_TIMEOUT, REASON_UNAUTHORIZED, REASON_UNREACHABLE,
};
use serde::Deserialize;

/// Which REST call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `instances.insert`.
    Insert,
    /// `instances.get`.
    Get,
    /// `instances.delete`.
    Delete,
    /// `instances.aggregatedList`.
    List,
    /// `zoneOperations.get`.
    Operation,
    /// `instances.setLabels`.
    SetLabels,
}

impl Call {
    /// The HTTP method of the call.
    pub fn method(self) -> reqwest::Method {
        match self {
            Self::Insert | Self::SetLabels => reqwest::Method::POST,
            Self::Delete => reqwest::Method::DELETE,
            Self::Get | Self::List | Self::Operation => reqwest::Method::GET,
        }
    }

    /// The name the call log, spans and wire records use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Insert => "insert",
            Self::Get => "get",
            Self::Delete => "delete",
            Self::List => "aggregatedList",
            Self::Operation => "operation",
            Self::SetLabels => "setLabels",
        }
    }
}

/// An error answer of the Compute API: its HTTP status, `error.errors[].reason` and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// Every `error.errors[].reason`.
    pub reasons: Vec<String>,
    /// `error.message` (cleaned of credentials), or the start of a body that was not the API's
    /// error JSON.
    pub message: String,
}

#[derive(Deserialize)]
struct Envelope {
    error: Body,
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    message: String,
    #[serde(default)]
    errors: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    reason: String,
}

/// The most of a non-JSON error body kept in a message.
const RAW_BODY_KEPT: usize = 256;

impl ApiError {
    /// Reads the Google API error JSON `{"error": {"code", "message", "errors": [{"reason"}]}}`;
    /// a body that is not that keeps its first bytes as the message.
    pub fn from_body(status: u16, body: &[u8]) -> Self {
        match serde_json::from_slice::<Envelope>(body) {
            Ok(e) => Self {
                status,
                reasons: e
                    .error
                    .errors
                    .into_iter()
                    .map(|i| i.reason)
                    .filter(|r| !r.is_empty())
                    .collect(),
                message: egress_provider::redact(&e.error.message),
            },
            Err(_) => {
                let text = String::from_utf8_lossy(body);
                let mut end = text.len().min(RAW_BODY_KEPT);
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                Self {
                    status,
                    reasons: Vec::new(),
                    message: egress_provider::redact(text[..end].trim()),
                }
            }
        }
    }

    fn has_reason(&self, wanted: &[&str]) -> bool {
        self.reasons.iter().any(|r| wanted.contains(&r.as_str()))
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {}", self.status)?;
        if !self.reasons.is_empty() {
            write!(f, " ({})", self.reasons.join(", "))?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestFailure {
    /// The API answered with an error status.
    Api(ApiError),
    /// No usable answer: DNS, connect, TLS, a reset, an undecodable body. `timed_out` when the
    /// client's own timeout ended it.
    Transport {
        /// What happened, without URLs' credentials.
        message: String,
        /// The transport timeout fired.
        timed_out: bool,
    },
    /// An answer that is not the API's: a body that does not decode, or is too large. Not
    /// retried.
    Undecodable(String),
    /// No access token could be had, so no request was sent.
    Token {
        /// What happened (never the key or a token).
        message: String,
        /// A credential file that is there but unusable (CRD2): retrying cannot help.
        permanent: bool,
    },
    /// The call's budget or the caller ran out.
    Interrupted(String),
}

impl fmt::Display for RequestFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Api(e) => e.fmt(f),
            Self::Transport { message, .. } => write!(f, "no answer: {message}"),
            Self::Undecodable(message) => write!(f, "unusable answer: {message}"),
            Self::Token { message, .. } => write!(f, "no access token: {message}"),
            Self::Interrupted(why) => f.write_str(why),
        }
    }
}

impl RequestFailure {
    /// The API error, if the API answered.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Self::Api(e) => Some(e),
            _ => None,
        }
    }

    /// An insert answered 409: the instance exists (success, after the adoption guard).
    pub fn is_already_exists(&self) -> bool {
        self.api().is_some_and(|e| e.status == 409)
    }

    /// 400 `resourceNotReady`: another operation holds the resource (for a delete, often a
    /// delete already running).
    pub fn is_resource_not_ready(&self) -> bool {
        self.api()
            .is_some_and(|e| e.status == 400 && e.has_reason(&["resourceNotReady"]))
    }
}

/// The class of a failed call (§5.8, first match wins). An insert's 409 never gets here: it is
/// success.
pub fn classify(f: &RequestFailure, call: Call) -> ErrorClass {
    let e = match f {
        RequestFailure::Token { permanent: true, .. } => return ErrorClass::Permanent,
        RequestFailure::Api(e) => e,
        _ => return ErrorClass::Transient,
    };
    match e.status {
        // What insert looks up is the project, zone, machine type, image and network: a 404
        // there is a spec or config error, and create never answers NotFound.
        404 if call == Call::Insert => ErrorClass::Permanent,
        404 => ErrorClass::NotFound,
        429 => ErrorClass::QuotaExceeded,
        403 if e.has_reason(&["quotaExceeded", "rateLimitExceeded"]) => ErrorClass::QuotaExceeded,
        // Another operation holds the instance (a delete already running, say): it passes.
        400 if e.has_reason(&["resourceNotReady"]) => ErrorClass::Transient,
        400 | 401 | 403 => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// The health check's reason for a failed list (§6.2, first match wins). `round_over` when the
/// check's round was cancelled or its deadline passed.
pub fn check_reason(f: &RequestFailure, round_over: bool) -> &'static str {
    match f {
        _ if round_over => REASON_TIMEOUT,
        RequestFailure::Interrupted(_) | RequestFailure::Transport { timed_out: true, .. } => REASON_TIMEOUT,
        RequestFailure::Transport { .. } | RequestFailure::Token { .. } | RequestFailure::Undecodable(_) => {
            REASON_UNREACHABLE
        }
        RequestFailure::Api(e) if e.status == 401 => REASON_UNAUTHORIZED,
        RequestFailure::Api(e) if e.status == 403 => REASON_FORBIDDEN,
        RequestFailure::Api(_) => REASON_API_ERROR,
    }
}

/// The class of an insert that the API accepted and then failed: its operation's
/// `error.errors[].code` values and `httpErrorStatusCode`. Out of quota or out of capacity in
/// the zone is QuotaExceeded (the reconciler retries later); a server-side failure is
/// Transient; anything else (a missing image, an invalid field) is Permanent.
pub fn classify_operation_error(codes: &[String], http_status: Option<u16>) -> ErrorClass {
    let capacity = codes
        .iter()
        .any(|c| c.contains("QUOTA") || c.contains("EXHAUSTED") || c == "RATE_LIMIT_EXCEEDED");
    match http_status {
        _ if capacity => ErrorClass::QuotaExceeded,
        Some(429) => ErrorClass::QuotaExceeded,
        Some(s) if s >= 500 => ErrorClass::Transient,
        _ => ErrorClass::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, reasons: &[&str]) -> RequestFailure {
        RequestFailure::Api(ApiError {
            status,
            reasons: reasons.iter().map(|r| (*r).to_owned()).collect(),
            message: String::new(),
        })
    }

    #[test]
    fn the_classify_table() {
        use ErrorClass::*;
        let transport = RequestFailure::Transport {
            message: "connection refused".into(),
            timed_out: false,
        };
        for (f, call, want) in [
            (transport.clone(), Call::Get, Transient),
            (
                RequestFailure::Interrupted("caller's deadline exceeded".into()),
                Call::Get,
                Transient,
            ),
            (
                RequestFailure::Token {
                    message: "no key file".into(),
                    permanent: false,
                },
                Call::Insert,
                Transient,
            ),
            (
                RequestFailure::Token {
                    message: "unparsable key file".into(),
                    permanent: true,
                },
                Call::Insert,
                Permanent,
            ),
            (api(404, &["notFound"]), Call::Get, NotFound),
            (api(404, &["notFound"]), Call::Delete, NotFound),
            (api(404, &["notFound"]), Call::Insert, Permanent),
            (api(429, &["rateLimitExceeded"]), Call::Insert, QuotaExceeded),
            (api(403, &["quotaExceeded"]), Call::Insert, QuotaExceeded),
            (api(403, &["rateLimitExceeded"]), Call::List, QuotaExceeded),
            (api(403, &["forbidden"]), Call::Insert, Permanent),
            (api(403, &["accessNotConfigured"]), Call::Get, Permanent),
            (api(400, &["invalid"]), Call::Insert, Permanent),
            (api(400, &["resourceNotReady"]), Call::Delete, Transient),
            (api(401, &["authError"]), Call::Get, Permanent),
            (api(500, &["backendError"]), Call::Get, Transient),
            (api(503, &[]), Call::Insert, Transient),
            (api(409, &["alreadyExists"]), Call::Delete, Transient),
            (api(412, &["conditionNotMet"]), Call::Delete, Transient),
            // setLabels: a stale label fingerprint (the labels changed since the read) is read
            // again and retried; an instance gone since is NotFound; a bad label is Permanent.
            (api(412, &["conditionNotMet"]), Call::SetLabels, Transient),
            (api(404, &["notFound"]), Call::SetLabels, NotFound),
            (api(400, &["invalid"]), Call::SetLabels, Permanent),
            (api(400, &["resourceNotReady"]), Call::SetLabels, Transient),
        ] {
            assert_eq!(classify(&f, call), want, "{f} in {call:?}");
        }
        assert!(api(409, &["alreadyExists"]).is_already_exists());
    }

    #[test]
    fn the_check_reasons() {
        let refused = RequestFailure::Transport {
            message: "connection refused".into(),
            timed_out: false,
        };
        for (f, over, want) in [
            (api(401, &[]), false, REASON_UNAUTHORIZED),
            (api(403, &["forbidden"]), false, REASON_FORBIDDEN),
            (api(403, &["accessNotConfigured"]), false, REASON_FORBIDDEN),
            (api(500, &[]), false, REASON_API_ERROR),
            (api(429, &[]), false, REASON_API_ERROR),
            (
                RequestFailure::Transport {
                    message: "operation timed out".into(),
                    timed_out: true,
                },
                false,
                REASON_TIMEOUT,
            ),
            (refused.clone(), true, REASON_TIMEOUT),
            (refused, false, REASON_UNREACHABLE),
            (
                RequestFailure::Token {
                    message: "metadata server unreachable".into(),
                    permanent: false,
                },
                false,
                REASON_UNREACHABLE,
            ),
            (
                RequestFailure::Interrupted("call cancelled".into()),
                false,
                REASON_TIMEOUT,
            ),
        ] {
            assert_eq!(check_reason(&f, over), want, "{f}");
        }
    }

    #[test]
    fn error_bodies_are_read() {
        let body = br#"{"error":{"code":403,"message":"Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1.","errors":[{"message":"Quota 'CPUS' exceeded.","domain":"usageLimits","reason":"quotaExceeded"}]}}"#;
        let e = ApiError::from_body(403, body);
        assert_eq!(e.reasons, vec!["quotaExceeded".to_owned()]);
        assert!(e.message.starts_with("Quota 'CPUS' exceeded"));
        let e = ApiError::from_body(502, &[b'x'; 4000]);
        assert_eq!((e.status, e.message.len()), (502, RAW_BODY_KEPT));
        let e = ApiError::from_body(
            401,
            br#"{"error":{"code":401,"message":"Invalid Credentials: Bearer ya29.secret"}}"#,
        );
        assert!(!e.message.contains("ya29.secret"), "{}", e.message);
    }

    #[test]
    fn failed_insert_operations() {
        let codes = |c: &[&str]| c.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        use ErrorClass::*;
        assert_eq!(
            classify_operation_error(&codes(&["QUOTA_EXCEEDED"]), Some(403)),
            QuotaExceeded
        );
        assert_eq!(
            classify_operation_error(&codes(&["ZONE_RESOURCE_POOL_EXHAUSTED"]), Some(503)),
            QuotaExceeded
        );
        assert_eq!(
            classify_operation_error(&codes(&["RESOURCE_NOT_FOUND"]), Some(404)),
            Permanent
        );
        assert_eq!(
            classify_operation_error(&codes(&["INTERNAL_ERROR"]), Some(500)),
            Transient
        );
        assert_eq!(
            classify_operation_error(&codes(&["INVALID_FIELD_VALUE"]), None),
            Permanent
        );
    }
}
