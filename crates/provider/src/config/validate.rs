//! Validation rules. (stub: being written)
/// Block validators for the registry.
pub mod validators {}
