//! How a body that cannot be decoded is answered: malformed (400), or carrying a field this
//! mapping does not carry (415, naming the field, so nothing is dropped without a word).

use crate::status::ApiError;

/// The media type.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// A field this mapping does not carry: the request is refused rather than stored without it.
fn unsupported(kind: &str, field: &str) -> ApiError {
    ApiError::new(
        415,
        "UnsupportedMediaType",
        format!(
            "{kind} field {field} is not decoded from {MEDIA_TYPE} by this test server: send the object as application/json"
        ),
    )
}

pub(super) fn malformed(kind: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!(
        "the object provided is unrecognized (must be of type {kind}): couldn't decode {MEDIA_TYPE}: {why}"
    ))
}

/// Refuses `field` of `kind` when it carries anything.
pub(super) fn refuse_if(set: bool, kind: &str, field: &str) -> Result<(), ApiError> {
    if set { Err(unsupported(kind, field)) } else { Ok(()) }
}

/// Refuses the first of `fields` (whether it is set, its path) that is set, as a field of `kind`.
pub(super) fn refuse_set(kind: &str, fields: &[(bool, &str)]) -> Result<(), ApiError> {
    for (set, field) in fields {
        refuse_if(*set, kind, field)?;
    }
    Ok(())
}
