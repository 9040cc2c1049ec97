//! The providers config file (`providers.yaml`): its model, the strict
//! loader and the validation rules.
//!
//! ```text
//!  bytes ──► strict YAML parse ──► per-entry checks ──► type validator ──► ProvidersConfig
//!            (unknown or dup keys)  (name, type, blocks)  (from the Registry)
//! ```
//!
//! Loading is fail-fast and happens once per process: the first problem
//! aborts with one line naming the file, the entry and the field. The list
//! of accepted `type` values, and each type's block validator, come from the
//! [`Registry`](crate::Registry) that also constructs the providers, so the
//! two cannot drift.
//!
//! Maps are ordered (`BTreeMap`) so that, with several bad keys, the one
//! reported is always the first in sorted order.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

mod load;
mod validate;

pub(crate) use load::decode_block;
pub use load::{ConfigError, Loaded};
pub use validate::{go_quote, validators};

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProvidersConfig {
    /// Entries, validated and built in file order.
    pub providers: Vec<ProviderConfig>,
}

/// One configured provider ("entry"): a name, a type, and at most the one
/// block named by the type.
///
/// The contract does not know any block's shape: a block is kept as the
/// YAML tree it was written as, and the backend crate that registered the
/// type decodes it into its own [`Block`] type (with [`ProviderConfig::block`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderConfig {
    /// What `Proxy.spec.provider` refers to; a lowercase DNS-1123 label,
    /// unique in the file.
    pub name: String,
    /// The provider type (`kubernetes`, `gcp`, `kvm`, `kvm2`, `local`, ...).
    /// A plain string so the validator, not the parser, reports unknown types.
    pub type_name: String,
    /// The non-null settings blocks the entry sets, by block key (the name of
    /// the type that registered a block of that key), undecoded. The loader
    /// has already checked each one's shape.
    pub blocks: BTreeMap<String, Value>,
    /// `createsPerMinute`: the most instance creates the whole operator asks of
    /// this entry per minute, as a burst or spread out (`None`: the default,
    /// [`DEFAULT_CREATES_PER_MINUTE`]). Read it with
    /// [`ProviderConfig::creates_per_minute`].
    pub creates_per_minute: Option<u32>,
}

/// The create budget of an entry that does not set `createsPerMinute`: a
/// burst of a whole pool's worth of creates goes at once, while a loop that
/// creates and deletes without end is held to one create a second.
pub const DEFAULT_CREATES_PER_MINUTE: u32 = 60;

/// The largest `createsPerMinute` accepted: beyond it the budget no longer
/// guards anything, and a typo (an extra zero or three) is likelier than intent.
pub const MAX_CREATES_PER_MINUTE: u32 = 10_000;

/// The settings block of a provider type: its typed shape (decoded with the
/// Go operator's rules, see `egress-go-decode`) and its rules.
///
/// A backend crate implements this for its block type and registers it with
/// [`ProviderType::with_block`](crate::ProviderType::with_block); the block key is the type name.
pub trait Block: DeserializeOwned + Serialize + 'static {
    /// Checks the decoded block of an entry of type `type_name` (`None`: the
    /// entry has no block) and returns the message tail of the first problem;
    /// the loader adds `providers[<i>] "<name>": `. Types that share one
    /// shape (`kvm`, `kvm2`) name the block after `type_name`.
    ///
    /// # Errors
    /// The first rule the block breaks.
    fn validate(type_name: &str, block: Option<&Self>) -> Result<(), String>;
}

impl ProviderConfig {
    /// An entry without blocks.
    pub fn new(name: impl Into<String>, type_name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            type_name: type_name.into(),
            blocks: BTreeMap::new(),
            creates_per_minute: None,
        }
    }

    /// The entry's create budget per minute: `createsPerMinute`, or
    /// [`DEFAULT_CREATES_PER_MINUTE`] when the file does not set it.
    pub fn creates_per_minute(&self) -> u32 {
        self.creates_per_minute.unwrap_or(DEFAULT_CREATES_PER_MINUTE)
    }

    /// This entry with `block` as the block named by its type, as a file would
    /// give it (for tools and tests that build entries in code).
    ///
    /// # Panics
    /// When `block` does not serialise to a YAML-like tree (a map with
    /// non-string keys); no [`Block`] type of the workspace does that.
    #[must_use]
    pub fn with_block(mut self, block: &impl Serialize) -> Self {
        let value = serde_json::to_value(block).expect("a config block serialises to a tree");
        self.blocks.insert(self.type_name.clone(), value);
        self
    }

    /// The keys of the blocks the entry sets, in sorted order.
    pub fn blocks_present(&self) -> Vec<&str> {
        self.blocks.keys().map(String::as_str).collect()
    }

    /// The block named by the entry's type, decoded as `B` (`None` when the
    /// entry has none).
    ///
    /// # Errors
    /// A block that does not have `B`'s shape, as `<type>.<path>: <problem>`;
    /// the loader has refused such an entry already, so only hand-built
    /// entries get this.
    pub fn block<B: DeserializeOwned>(&self) -> Result<Option<B>, String> {
        self.blocks
            .get(&self.type_name)
            .map(|value| {
                load::decode_block(value).map_err(|(path, message)| format!("{}{path}: {message}", self.type_name))
            })
            .transpose()
    }
}
