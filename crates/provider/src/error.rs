//! The one error type every provider method returns, and its classes.

use std::error::Error as StdError;
use std::fmt;

/// A boxed, thread-safe error: the backend cause a [`ProviderError`] wraps.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What the caller should do about a failure. The reconciler branches on
/// nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The instance does not exist (only when it is really gone).
    NotFound,
    /// Quota, rate limit or capacity: retry after the quota wait.
    QuotaExceeded,
    /// Network, timeouts, 5xx, cancellation, anything unclassified: retry.
    Transient,
    /// Needs a change to the Proxy spec or the provider config: do not retry.
    Permanent,
}

impl ErrorClass {
    /// Every class, in a fixed order (for tables and tests).
    pub const ALL: [ErrorClass; 4] = [Self::NotFound, Self::QuotaExceeded, Self::Transient, Self::Permanent];

    /// The bounded metric and span label for this class.
    pub fn label(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::QuotaExceeded => "quota_exceeded",
            Self::Transient => "transient",
            Self::Permanent => "permanent",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotFound => "not found",
            Self::QuotaExceeded => "quota exceeded",
            Self::Transient => "transient",
            Self::Permanent => "permanent",
        })
    }
}

/// The label for a call's outcome: `ok` or the error class's label.
pub fn result_label<T>(result: &Result<T, ProviderError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.class().label(),
    }
}

/// The provider operation an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `Provider::create`
    Create,
    /// `Provider::get`
    Get,
    /// `Provider::delete`
    Delete,
    /// `Provider::list_by_tag`
    List,
    /// `Provider::mark_installation`
    Mark,
}

impl Op {
    /// Every operation, in a fixed order.
    pub const ALL: [Op; 5] = [Self::Create, Self::Get, Self::Delete, Self::List, Self::Mark];

    /// `create`, `get`, `delete`, `list` or `mark`: the metric and span label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Get => "get",
            Self::Delete => "delete",
            Self::List => "list",
            Self::Mark => "mark",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified provider failure.
///
/// It records the class, the operation, the configured entry name (never the
/// type), the providerID when there is one, and the backend cause, reachable
/// through [`source`](StdError::source) so a caller can downcast it.
///
/// Its `Display` is `"{provider} {op} {id}: {class}: {cause}"` (the id is
/// left out when empty). Whoever builds one is responsible for a cause that
/// carries no secret: pass backend text through [`redact`](crate::redact)
/// and never put cloud-init or credentials into a message.
#[derive(Debug)]
pub struct ProviderError {
    class: ErrorClass,
    op: Op,
    provider: String,
    id: String,
    cause: Option<BoxError>,
}

impl ProviderError {
    /// A new error with no cause yet.
    pub fn new(class: ErrorClass, op: Op, provider: impl Into<String>, id: impl Into<String>) -> Self {
        Self {
            class,
            op,
            provider: provider.into(),
            id: id.into(),
            cause: None,
        }
    }

    /// Attaches the backend cause.
    pub fn with_cause(mut self, cause: impl Into<BoxError>) -> Self {
        self.cause = Some(cause.into());
        self
    }

    /// Attaches a plain message as the cause.
    pub fn with_message(self, message: impl Into<String>) -> Self {
        self.with_cause(Message(message.into()))
    }

    /// The class callers branch on.
    pub fn class(&self) -> ErrorClass {
        self.class
    }

    /// The operation that failed.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The configured provider entry name.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The providerID, or `""` (list, or create before an id existed).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The wrapped backend cause, if any.
    pub fn cause(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        self.cause.as_deref()
    }

    /// Whether this is the NotFound class.
    pub fn is_not_found(&self) -> bool {
        self.class == ErrorClass::NotFound
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.provider, self.op)?;
        if !self.id.is_empty() {
            write!(f, " {}", self.id)?;
        }
        write!(f, ": {}", self.class)?;
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl StdError for ProviderError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.cause.as_deref().map(|c| c as &(dyn StdError + 'static))
    }
}

/// The class of any error: the class of the first [`ProviderError`] in its
/// source chain, and Transient for anything else (unclassified means retry).
pub fn class_of(err: &(dyn StdError + 'static)) -> ErrorClass {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(pe) = e.downcast_ref::<ProviderError>() {
            return pe.class;
        }
        next = e.source();
    }
    ErrorClass::Transient
}

/// A cause that is only a message (a validation failure, a refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message(pub String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}

/// Builds the errors of one call: it remembers the operation, the entry
/// name and the id, so each failure site names only its class and cause.
#[derive(Clone, Debug)]
pub struct ErrorScope {
    op: Op,
    provider: String,
    id: String,
}

impl ErrorScope {
    /// A scope for `op` on the configured entry `provider`, about `id` (may be empty).
    pub fn new(op: Op, provider: impl Into<String>, id: impl Into<String>) -> Self {
        Self {
            op,
            provider: provider.into(),
            id: id.into(),
        }
    }

    /// The same scope about another id (create learns its id half-way).
    pub fn with_id(&self, id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            ..self.clone()
        }
    }

    /// An error of `class` caused by `cause`.
    pub fn error(&self, class: ErrorClass, cause: impl Into<BoxError>) -> ProviderError {
        ProviderError::new(class, self.op, self.provider.clone(), self.id.clone()).with_cause(cause)
    }

    /// An error of `class` with a plain message.
    pub fn message(&self, class: ErrorClass, message: impl Into<String>) -> ProviderError {
        self.error(class, Message(message.into()))
    }

    /// NotFound with a message.
    pub fn not_found(&self, message: impl Into<String>) -> ProviderError {
        self.message(ErrorClass::NotFound, message)
    }

    /// Transient with a message.
    pub fn transient(&self, message: impl Into<String>) -> ProviderError {
        self.message(ErrorClass::Transient, message)
    }

    /// Permanent with a message.
    pub fn permanent(&self, message: impl Into<String>) -> ProviderError {
        self.message(ErrorClass::Permanent, message)
    }

    /// QuotaExceeded with a message.
    pub fn quota(&self, message: impl Into<String>) -> ProviderError {
        self.message(ErrorClass::QuotaExceeded, message)
    }

    /// The Transient error for a call cut short by cancellation, its
    /// deadline or its own budget.
    pub fn interrupted(&self, why: crate::Interrupted) -> ProviderError {
        self.error(ErrorClass::Transient, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_entry_op_id_class_and_cause() {
        let e = ErrorScope::new(Op::Get, "kvm2-home", "hosts/a/domains/b").permanent("bad id");
        assert_eq!(e.to_string(), "kvm2-home get hosts/a/domains/b: permanent: bad id");
        let e = ErrorScope::new(Op::List, "gcp-eu", "").transient("zone down");
        assert_eq!(e.to_string(), "gcp-eu list: transient: zone down");
    }

    #[test]
    fn class_of_walks_the_source_chain_and_defaults_to_transient() {
        #[derive(Debug)]
        struct Outer(ProviderError);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("outer")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let quota = ErrorScope::new(Op::Create, "p", "").quota("full");
        assert_eq!(class_of(&Outer(quota)), ErrorClass::QuotaExceeded);
        assert_eq!(class_of(&Message("plain".into())), ErrorClass::Transient);
    }

    #[test]
    fn the_backend_cause_stays_downcastable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let e = ErrorScope::new(Op::Delete, "p", "x").error(ErrorClass::Transient, io);
        let src = e.source().expect("a source");
        assert_eq!(
            src.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::ConnectionReset)
        );
    }

    #[test]
    fn labels_are_bounded_and_distinct() {
        let labels: std::collections::HashSet<_> = ErrorClass::ALL.iter().map(|c| c.label()).collect();
        assert_eq!(labels.len(), 4);
        assert_eq!(result_label::<()>(&Ok(())), "ok");
    }
}
