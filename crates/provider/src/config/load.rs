//! Reading and strictly parsing the file. (stub: being written)
/// A problem with the providers config file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    /// The file (or source name) the problem is in.
    pub file: String,
    /// One line naming the entry and the field.
    pub message: String,
}
