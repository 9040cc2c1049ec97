//! What the decision knows: about the Proxy before the pass starts ([`Input`]), and what the
//! pass has done and learned so far ([`Facts`]). An instance whose own mark names another
//! Proxy is read as a Permanent failure of its lookup ([`foreign_owner`]).

use egress_api::Proxy;
use egress_provider::{ErrorClass, Instance, ProviderId};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::create_budget::Deferral;
use crate::proxy::credentials::{Prepared, Refusal, Serving};
use crate::proxy::secret::SecretProblem;
use crate::proxy::status::Verdict;

/// A failed provider call, as the decision needs it: its class and its (already redacted) text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderFailure {
    pub class: ErrorClass,
    pub message: String,
}

/// What is known about the Proxy before the pass starts.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// The Proxy as fetched (the base the status patch is computed against).
    pub proxy: &'a Proxy,
    /// Whether `spec.provider` names a configured provider.
    pub provider_configured: bool,
    /// The configured providers' names, for the message when `spec.provider` is not one.
    pub configured_providers: &'a [String],
    /// The health engine's verdict for this Proxy, if it has one.
    pub verdict: Option<Verdict>,
    /// What the exit checks found for it.
    pub exit: crate::proxy::exit_findings::ExitFinding,
    /// Whether the credential cache already shows the Generated Proxy's Secret serving the
    /// instance its status records; when it does not, the running instance's Secret is read
    /// from the API server before the instance is trusted.
    pub credentials_cached: bool,
    /// Why the user's credentials Secret of an External Proxy may not serve it (it does not
    /// name the Proxy, say), as the credential cache decides; `None` when it may, or when the
    /// cache does not have it.
    pub credentials_refused: Option<Refusal>,
    /// Since when the passes before this one have found the Proxy's instance without an
    /// address (kept in memory by the reconciler); `None` when the last one found it with one.
    pub address_missing_since: Option<Time>,
    /// Why an External Proxy is refused: its namespace, or an internal destination
    /// ([`crate::proxy::destinations::ExternalRules::refusal`]); `None` when it is not.
    pub external_refused: Option<crate::proxy::destinations::Refused>,
    /// The installation the operator runs as, if any: the Proxy's running instance that carries
    /// no installation mark is marked as this one's (`Action::MarkInstallation`).
    pub installation: Option<&'a str>,
    pub now: Time,
}

/// What this pass has done and learned so far. Its `Debug` shows the cloud-init size only.
#[derive(Clone, Default)]
pub struct Facts {
    pub finalizer_added: bool,
    pub finalizer_removed: bool,
    /// The spec hash written into the annotation in this pass.
    pub spec_hash_written: Option<String>,
    /// The other operator's spec hash this pass adopted the instance from.
    pub adopted_from: Option<String>,
    /// The cloud-init text from the Secret, or why it could not be read.
    pub secret: Option<Result<Vec<u8>, SecretProblem>>,
    pub get: Option<Result<Instance, ProviderFailure>>,
    pub create: Option<Result<ProviderId, ProviderFailure>>,
    pub delete: Option<Result<(), ProviderFailure>>,
    /// The credentials for the create (Generated), or why there are none.
    pub credentials: Option<Result<Prepared, SecretProblem>>,
    /// The instance the credentials Secret names, as the provider answered for it.
    pub bound_instance: Option<(ProviderId, Result<Instance, ProviderFailure>)>,
    /// Whether the created instance was recorded on the credentials Secret.
    pub credentials_bound: Option<Result<(), SecretProblem>>,
    /// What the credentials Secret is to the running instance.
    pub credentials_checked: Option<Result<Serving, SecretProblem>>,
    /// The create was not made: the provider entry's create budget had no room.
    pub create_deferred: Option<Deferral>,
    /// What the provider answered to marking the instance with the installation.
    pub marked: Option<Result<(), ProviderFailure>>,
}

impl std::fmt::Debug for Facts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = self.secret.as_ref().map(|r| match r {
            Ok(text) => format!("Ok(<{} bytes>)", text.len()),
            Err(e) => format!("Err({e:?})"),
        });
        f.debug_struct("Facts")
            .field("finalizer_added", &self.finalizer_added)
            .field("finalizer_removed", &self.finalizer_removed)
            .field("spec_hash_written", &self.spec_hash_written)
            .field("secret", &secret)
            .field("get", &self.get)
            .field("create", &self.create)
            .field("delete", &self.delete)
            .field("credentials", &self.credentials)
            .field("bound_instance", &self.bound_instance)
            .field("credentials_bound", &self.credentials_bound)
            .field("credentials_checked", &self.credentials_checked)
            .field("create_deferred", &self.create_deferred)
            .field("marked", &self.marked)
            .finish()
    }
}

/// Review M2: the Proxy UID an instance's own mark names, when it is not this Proxy's. A
/// provider that records no UID (an empty one) names nobody.
pub fn foreign_owner<'i>(proxy: &Proxy, instance: &'i Instance) -> Option<&'i str> {
    let ours = proxy.metadata.uid.as_deref().unwrap_or_default();
    let theirs = instance.uid.as_str();
    (!theirs.is_empty() && !ours.is_empty() && !theirs.eq_ignore_ascii_case(ours)).then_some(theirs)
}

/// `facts` with every instance another Proxy's mark names read as a Permanent failure of its
/// lookup: such an instance is neither used, adopted, replaced nor deleted.
pub(super) fn owned_facts(proxy: &Proxy, facts: &Facts) -> Facts {
    let refuse = |answer: &Result<Instance, ProviderFailure>| match answer {
        Ok(instance) => match foreign_owner(proxy, instance) {
            Some(owner) => Err(ProviderFailure {
                class: ErrorClass::Permanent,
                message: format!(
                    "instance {} is marked as Proxy UID {owner}'s, not this Proxy's ({}); it is neither used \
                     nor deleted",
                    instance.id.as_str(),
                    proxy.metadata.uid.as_deref().unwrap_or_default()
                ),
            }),
            None => Ok(instance.clone()),
        },
        Err(f) => Err(f.clone()),
    };
    let mut owned = facts.clone();
    owned.get = facts.get.as_ref().map(refuse);
    owned.bound_instance = facts
        .bound_instance
        .as_ref()
        .map(|(id, answer)| (id.clone(), refuse(answer)));
    owned
}
