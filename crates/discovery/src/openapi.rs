//! The API's OpenAPI 3.1 document (docs/discovery-openapi.json), served at `GET /openapi.json`.
//! Its tests check it against what the server really answers.

use std::sync::LazyLock;

use serde_json::Value;

/// The committed document's text.
pub const TEXT: &str = include_str!("../../../docs/discovery-openapi.json");

static DOCUMENT: LazyLock<Value> = LazyLock::new(|| {
    serde_json::from_str(TEXT).unwrap_or_else(|e| panic!("docs/discovery-openapi.json is not JSON: {e}"))
});

/// The document, parsed once.
pub fn document() -> &'static Value {
    &DOCUMENT
}
