//! The one table of provider types: what the config loader accepts, how each
//! type's block is validated, and how each entry is constructed.
//!
//! A [`ProviderType`] cannot exist without both a validator and a
//! constructor, so a type the loader accepts is always a type the process
//! can build (the original kept two lists that drifted).

use std::fmt;
use std::sync::Arc;

use crate::config::{Block, ProviderConfig, ProvidersConfig};
use crate::decorate::{self, ProviderMetrics};
use crate::{BoxError, Checker, Provider};

/// Checks the type-specific part of an entry of a type without a block; returns the message tail
/// (the loader prefixes `providers[i] "name": `).
pub type Validator = fn(&ProviderConfig) -> Result<(), String>;

/// Builds a provider from a validated entry. Synchronous and never dials
/// the backend: a backend that is down at startup must not stop the others.
/// Anything the constructor needs from the process (a Kubernetes client,
/// flags) is captured by the closure in the composition root.
pub type Constructor = Box<dyn Fn(&ProviderConfig) -> Result<Arc<dyn Provider>, BoxError> + Send + Sync>;

/// Checks that a block has its type's shape; on failure, the path inside the
/// block (empty, or starting with `.` or `[`) and the problem.
pub type ShapeCheck = fn(&serde_json::Value) -> Result<(), (String, String)>;

/// Checks the entries of the types that share something outside the process (the storage
/// pools of one hypervisor, say) against each other: given each such entry with its index in
/// the file, the index of the entry at fault and the message tail.
pub type SharedCheck = fn(&[(usize, &ProviderConfig)]) -> Result<(), (usize, String)>;

/// One provider type: its `type:` value, its block's shape (if it has a
/// block), its validator, its constructor, and the check it shares with related types.
pub struct ProviderType {
    name: &'static str,
    shape: Option<ShapeCheck>,
    validate: Validator,
    construct: Constructor,
    shared: Option<(&'static str, SharedCheck)>,
}

impl fmt::Debug for ProviderType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderType")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ProviderType {
    /// A type accepted as `type: <name>`, without a settings block (an entry
    /// that sets a `<name>:` key is refused as an unknown key).
    pub fn new(
        name: &'static str,
        validate: Validator,
        construct: impl Fn(&ProviderConfig) -> Result<Arc<dyn Provider>, BoxError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            shape: None,
            validate,
            construct: Box::new(construct),
            shared: None,
        }
    }

    /// A type accepted as `type: <name>` whose settings are the block `<name>:`,
    /// of shape `B` and checked by `B`'s rules. The constructor reads the block
    /// with [`ProviderConfig::block`].
    pub fn with_block<B: Block>(
        name: &'static str,
        construct: impl Fn(&ProviderConfig) -> Result<Arc<dyn Provider>, BoxError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            shape: Some(|value| crate::config::decode_block::<B>(value).map(drop)),
            validate: |entry| {
                let block = entry.block::<B>()?;
                B::validate(&entry.type_name, block.as_ref())
            },
            construct: Box::new(construct),
            shared: None,
        }
    }

    /// Joins the types of `family` (`libvirt`, say): the loader runs `check` once over every
    /// entry of every type in the family. Types of one family register the same check.
    pub fn sharing(mut self, family: &'static str, check: SharedCheck) -> Self {
        self.shared = Some((family, check));
        self
    }

    /// The shape check of the type's block; `None` for a type without one.
    pub fn shape(&self) -> Option<ShapeCheck> {
        self.shape
    }

    /// The `type:` value.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs the type's validator on an entry.
    ///
    /// # Errors
    /// The message tail describing the first problem.
    pub fn validate(&self, entry: &ProviderConfig) -> Result<(), String> {
        (self.validate)(entry)
    }

    /// Runs the constructor on an entry.
    ///
    /// # Errors
    /// Whatever the constructor refused (config problems only).
    pub fn construct(&self, entry: &ProviderConfig) -> Result<Arc<dyn Provider>, BoxError> {
        (self.construct)(entry)
    }
}

/// The provider types this process knows.
#[derive(Debug, Default)]
pub struct Registry {
    types: Vec<ProviderType>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a type.
    ///
    /// # Panics
    /// When a type of that name is already registered: two constructors for
    /// one `type:` value is a wiring mistake in the composition root.
    pub fn with(mut self, provider_type: ProviderType) -> Self {
        assert!(
            self.get(provider_type.name).is_none(),
            "provider type {:?} registered twice",
            provider_type.name
        );
        self.types.push(provider_type);
        self
    }

    /// The type registered as `name`.
    pub fn get(&self, name: &str) -> Option<&ProviderType> {
        self.types.iter().find(|t| t.name == name)
    }

    /// The block keys the loader accepts (the names of the types that have a
    /// block), in registration order.
    pub fn block_keys(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.types.iter().filter(|t| t.shape.is_some()).map(|t| t.name)
    }

    /// Per family of types that share a check ([`ProviderType::sharing`]): the check and the
    /// family's type names, in registration order.
    pub fn shared_checks(&self) -> Vec<(SharedCheck, Vec<&'static str>)> {
        let mut families: Vec<(&'static str, SharedCheck, Vec<&'static str>)> = Vec::new();
        for t in &self.types {
            let Some((family, check)) = t.shared else { continue };
            match families.iter_mut().find(|(f, _, _)| *f == family) {
                Some((_, _, names)) => names.push(t.name),
                None => families.push((family, check, vec![t.name])),
            }
        }
        families.into_iter().map(|(_, check, names)| (check, names)).collect()
    }

    /// The registered type names, in registration order.
    pub fn type_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.types.iter().map(|t| t.name)
    }

    /// Builds every entry of a loaded config, in file order, and wraps each as
    /// `tracing(metrics(p))`. The checkers are taken from the undecorated
    /// providers first.
    ///
    /// # Errors
    /// The first constructor failure, naming the entry: building is
    /// all-or-nothing.
    pub fn build(&self, config: &ProvidersConfig, metrics: &ProviderMetrics) -> Result<Providers, BuildError> {
        let mut entries = Vec::with_capacity(config.providers.len());
        for entry in &config.providers {
            let fail = |message: String| BuildError {
                entry: entry.name.clone(),
                type_name: entry.type_name.clone(),
                message,
            };
            let provider_type = self
                .get(&entry.type_name)
                .ok_or_else(|| fail("no constructor is registered for this type".to_owned()))?;
            let raw = provider_type.construct(entry).map_err(|e| fail(e.to_string()))?;
            let checker = raw.checker();
            entries.push(BuiltProvider {
                name: entry.name.clone(),
                type_name: entry.type_name.clone(),
                provider: decorate::decorate(&entry.name, raw, metrics),
                checker,
                creates_per_minute: entry.creates_per_minute(),
            });
        }
        Ok(Providers { entries })
    }
}

/// A constructor refused an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("provider {entry:?} (type {type_name}): {message}")]
pub struct BuildError {
    /// The entry name.
    pub entry: String,
    /// The entry's type.
    pub type_name: String,
    /// What the constructor said.
    pub message: String,
}

/// One built entry.
#[derive(Debug, Clone)]
pub struct BuiltProvider {
    /// The configured entry name.
    pub name: String,
    /// The entry's type.
    pub type_name: String,
    /// The decorated provider (`tracing(metrics(p))`).
    pub provider: Arc<dyn Provider>,
    /// The undecorated provider's checker, if it has one.
    pub checker: Option<Arc<dyn Checker>>,
    /// The entry's create budget: the most creates per minute the operator asks of it
    /// (`createsPerMinute`, or its default). The controller keeps the budget; the provider
    /// itself does not know it.
    pub creates_per_minute: u32,
}

/// Every built entry, in config order.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    entries: Vec<BuiltProvider>,
}

impl Providers {
    /// The decorated provider configured as `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Provider>> {
        self.entries.iter().find(|e| e.name == name).map(|e| &e.provider)
    }

    /// All entries, in config order (checkers included).
    pub fn entries(&self) -> &[BuiltProvider] {
        &self.entries
    }

    /// Whether no provider is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
