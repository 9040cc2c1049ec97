//! TokenReview and SubjectAccessReview: the two create-only review APIs a component uses to guard
//! its own endpoints (controller-runtime's secure metrics filter, and ours).
//!
//! The server knows the bearer tokens and the non-resource permissions a test registers
//! ([`crate::Builder::user`], [`crate::Builder::allow_path`]). An unknown token is answered as the
//! real server answers it: 201 with `status.authenticated: false`. Reviews are not stored and do
//! not appear in watches. Not covered: resource attributes in SubjectAccessReviews (always denied)
//! and RBAC objects (the permissions are the registered ones, not derived from Roles).

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};

use crate::status::ApiError;

/// One registered user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) groups: Vec<String>,
}

/// Who the server knows and what they may do outside resources.
#[derive(Debug, Clone, Default)]
pub(crate) struct Identities {
    pub(crate) tokens: HashMap<String, User>,
    /// (user, verb, path)
    pub(crate) allowed: BTreeSet<(String, String, String)>,
}

pub(crate) const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
pub(crate) const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

fn echo(review: &Value, api_version: &str, kind: &str) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut out = review
        .as_object()
        .cloned()
        .ok_or_else(|| ApiError::bad_request("the body is not an object"))?;
    let given = (
        out.get("apiVersion").and_then(Value::as_str),
        out.get("kind").and_then(Value::as_str),
    );
    if given != (Some(api_version), Some(kind)) {
        return Err(ApiError::bad_request(format!(
            "expected apiVersion {api_version} and kind {kind}"
        )));
    }
    out.entry("metadata").or_insert_with(|| json!({}));
    Ok(out)
}

impl Identities {
    /// Answers a TokenReview.
    pub(crate) fn token_review(&self, review: &Value) -> Result<Value, ApiError> {
        let mut out = echo(review, "authentication.k8s.io/v1", "TokenReview")?;
        let token = review
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(
                    "TokenReview",
                    "authentication.k8s.io",
                    "",
                    vec![crate::status::FieldCause::invalid(
                        "spec.token",
                        &Value::Null,
                        "Required value",
                    )],
                )
            })?;
        let status = match self.tokens.get(token) {
            Some(user) => json!({
                "authenticated": true,
                "user": {"username": user.name, "uid": format!("uid-{}", user.name), "groups": user.groups},
            }),
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        out.insert("status".into(), status);
        Ok(Value::Object(out))
    }

    /// Answers a SubjectAccessReview for a non-resource path.
    pub(crate) fn access_review(&self, review: &Value) -> Result<Value, ApiError> {
        let mut out = echo(review, "authorization.k8s.io/v1", "SubjectAccessReview")?;
        let user = review.pointer("/spec/user").and_then(Value::as_str).unwrap_or_default();
        let path = review
            .pointer("/spec/nonResourceAttributes/path")
            .and_then(Value::as_str);
        let verb = review
            .pointer("/spec/nonResourceAttributes/verb")
            .and_then(Value::as_str);
        let allowed = match (path, verb) {
            (Some(path), Some(verb)) => self.allowed.contains(&(user.into(), verb.into(), path.into())),
            _ => false,
        };
        let status = if allowed {
            json!({"allowed": true, "reason": "allowed by the test server's registered permissions"})
        } else {
            json!({"allowed": false})
        };
        out.insert("status".into(), status);
        Ok(Value::Object(out))
    }
}
