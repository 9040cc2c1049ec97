//! Proxy credentials: the Secret the operator keeps for a Proxy with `spec.credentials.type:
//! Generated`, and the credentials the probe and the lease answers use.
//!
//! - **Generated.** Before each create, [`prepare`] reads the Secret `<instance name>-credentials`
//!   in the Proxy's namespace ([`plan`] decides, without I/O): missing, or bound to an instance
//!   known to be gone (the annotation [`ANNOTATION_CREDENTIALS_INSTANCE`]), it is written anew
//!   with a fresh user and password; unbound, it is reused (a create retried after a failure must
//!   not leave the instance it may have made with credentials nobody has); bound to an instance
//!   not known to be gone, the reconciler asks the provider first, and keeps the credentials if
//!   that instance is still there (its status write was lost, and the create adopts it). After
//!   the create succeeds, [`bind`] records the instance on it. So each instance gets its own
//!   credentials, and a replacement rotates them. The Secret is labelled
//!   `crawl.example.com/proxy-credentials: generated` and owned by the Proxy (deleted with it).
//!   While the instance runs, [`check`] confirms the Secret still names it and holds a user and
//!   password; when it does not (deleted, or emptied by hand), the instance is replaced, since
//!   nobody can use it any more.
//! - **Secret.** An External proxy's credentials are in the user's Secret (`secretRef`), which
//!   must carry the label `crawl.example.com/proxy-credentials` too (only labelled Secrets are
//!   watched), and must name the Proxy in its annotation [`ANNOTATION_CREDENTIALS_PROXIES`]
//!   ([`may_serve`] decides). Whoever may write a Proxy but not read Secrets could otherwise
//!   point an External Proxy at a host of theirs and name another team's Secret: the probe
//!   would send them that login and lease answers would hand it out. A Secret that does not
//!   name the Proxy is [`Lookup::Refused`]: the Proxy is neither probed nor leased, and its
//!   status says why.
//!
//! The password is in the Secret and in lease answers, nowhere else: not in the Proxy's status,
//! events, logs, spans or metrics, and never in an error message from here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use egress_api::served::{self, Namespaces};
use egress_api::{
    ANNOTATION_CREDENTIALS_INSTANCE, ANNOTATION_CREDENTIALS_PROXIES, CredentialsType, LABEL_MANAGED_BY,
    LABEL_PROXY_CREDENTIALS, MANAGED_BY, MAX_CREDENTIALS_PROXIES, PROXY_CREDENTIALS_GENERATED, Proxy,
};
use egress_credentials::{Credentials, HTPASSWD_KEY, PASSWORD_KEY, USERNAME_KEY};
use egress_provider::{ProviderId, ProxyCredentials};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::observers::{Observer, Observers};
use crate::proxy::secret::SecretProblem;

/// The name of a Generated Proxy's credentials Secret: its instance name and `-credentials`
/// (fits any Proxy name, and a new Proxy of an old name gets a new Secret).
pub fn secret_name(uid: &str) -> String {
    format!("{}-credentials", egress_provider::name_from_uid(uid))
}

/// What to do with the credentials Secret before a create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The Secret holds credentials no instance was created with yet: use them.
    Reuse(ProxyCredentials),
    /// The Secret names this instance, which may still exist; `None`: its credentials were
    /// damaged (edited by hand), so the instance, if it exists, is of no use to anyone.
    Bound {
        instance: ProviderId,
        credentials: Option<ProxyCredentials>,
    },
    /// Write new credentials: create the Secret, or rewrite the one at this resourceVersion.
    Mint { replace: Option<String> },
    /// The name is taken by a Secret this Proxy does not own: touch nothing.
    Refuse(String),
}

/// The credentials [`prepare`] found for the next create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// Made for the next instance (new, or left by a create that did not finish).
    Ready(ProxyCredentials),
    /// Those of `instance`, which was created with them and is not known to be gone: if it still
    /// exists, the create adopts it and must keep them; if it is gone, [`prepare`] again with it
    /// as `gone`. `None`: the Secret no longer holds them intact, so an instance that still
    /// exists must be replaced first.
    Bound {
        instance: ProviderId,
        credentials: Option<ProxyCredentials>,
    },
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

fn owned_by(secret: &Secret, uid: &str) -> bool {
    secret
        .owner_references()
        .iter()
        .any(|o| o.uid == uid && o.kind == "Proxy")
}

fn bound_instance(secret: &Secret) -> Option<ProviderId> {
    secret
        .annotations()
        .get(ANNOTATION_CREDENTIALS_INSTANCE)
        .filter(|v| !v.is_empty())
        .map(|v| ProviderId::new(v.clone()))
}

/// The Secret's user and password, when both are there.
fn user_and_password(secret: &Secret) -> Option<Credentials> {
    Credentials::new(text(secret, USERNAME_KEY)?, text(secret, PASSWORD_KEY)?).ok()
}

/// The Secret's credentials, when all three keys are there and agree with each other.
fn usable(secret: &Secret) -> Option<ProxyCredentials> {
    let credentials = Credentials::new(text(secret, USERNAME_KEY)?, text(secret, PASSWORD_KEY)?).ok()?;
    let htpasswd = text(secret, HTPASSWD_KEY)?;
    credentials.matches_htpasswd(&htpasswd).then(|| ProxyCredentials {
        credentials,
        htpasswd: htpasswd.trim_end().to_owned(),
        secret_name: secret.name_any(),
    })
}

/// The decision of [`prepare`], from the Secret as read (`None`: there is none) and the
/// instance this pass saw gone, if any.
pub fn plan(existing: Option<&Secret>, proxy_uid: &str, gone: Option<&ProviderId>) -> Plan {
    let Some(secret) = existing else {
        return Plan::Mint { replace: None };
    };
    if !owned_by(secret, proxy_uid) {
        return Plan::Refuse(format!(
            "Secret \"{}\" exists and is not owned by this Proxy; delete or rename it so the operator can keep this Proxy's credentials there",
            secret.name_any()
        ));
    }
    let replace = Plan::Mint {
        replace: secret.resource_version(),
    };
    // Damaged (edited by hand, say) and bound to none: new ones, as for a new instance.
    match (bound_instance(secret), usable(secret)) {
        (None, Some(credentials)) => Plan::Reuse(credentials),
        (None, None) => replace,
        (Some(instance), _) if gone == Some(&instance) => replace,
        (Some(instance), credentials) => Plan::Bound { instance, credentials },
    }
}

/// What the credentials Secret is to a running instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// It names the instance and holds a user and password.
    Yes,
    /// It holds intact credentials and names no instance: the ones minted for the create that
    /// made this one, whose bind did not land (a replacement keeps the id on name-based
    /// providers, so the status already named it). Bind them.
    Unbound,
    /// Missing, another Proxy's, naming another instance, or without a user and password.
    No,
}

/// What `secret` is to the Proxy `proxy_uid`'s running instance `id`. Cheap (no crypt): the
/// cache asks for every Proxy at each refresh. A hand edit that keeps both keys is not seen
/// here; the probe's `ProxyAuthRequired` shows it.
pub fn serving(secret: &Secret, proxy_uid: &str, id: &ProviderId) -> Serving {
    if !owned_by(secret, proxy_uid) {
        return Serving::No;
    }
    let keys = text(secret, USERNAME_KEY).is_some() && text(secret, PASSWORD_KEY).is_some();
    match bound_instance(secret) {
        Some(bound) if bound == *id && keys => Serving::Yes,
        None if usable(secret).is_some() => Serving::Unbound,
        _ => Serving::No,
    }
}

/// Why a user's credentials Secret may not serve a Proxy. Its `Display` is the message the
/// Proxy's condition and event show: it names the Secret and the annotation, never anything of
/// the Secret's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A Secret the operator generated for a Managed Proxy: its credentials belong to that
    /// Proxy's instance, whatever its annotations say.
    Generated { secret: String },
    /// The Secret names no Proxy: it lacks the annotation, or its value is empty.
    NoneNamed { secret: String, proxy: String },
    /// The Secret names other Proxies.
    NotNamed { secret: String, proxy: String },
    /// The annotation's value is not a list the operator accepts (too long, or a name that is
    /// not one): the Secret serves no Proxy until it is fixed.
    Malformed { secret: String, why: String },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = ANNOTATION_CREDENTIALS_PROXIES;
        match self {
            Self::Generated { secret } => write!(
                f,
                "Secret \"{secret}\" holds credentials the operator generated for a Managed Proxy; an External Proxy cannot use it"
            ),
            Self::NoneNamed { secret, proxy } => write!(
                f,
                "Secret \"{secret}\" names no Proxy in its annotation {key}, so its credentials are not used; annotate it with {key}: {proxy} (comma-separated, for several Proxies) to let this Proxy use them"
            ),
            Self::NotNamed { secret, proxy } => write!(
                f,
                "Secret \"{secret}\" does not name this Proxy in its annotation {key}, so its credentials are not used; add \"{proxy}\" to that comma-separated list to let this Proxy use them"
            ),
            Self::Malformed { secret, why } => write!(
                f,
                "the annotation {key} on Secret \"{secret}\" {why}, so the Secret serves no Proxy; list at most {MAX_CREDENTIALS_PROXIES} Proxy names, separated by commas"
            ),
        }
    }
}

/// The Proxy names an annotation [`ANNOTATION_CREDENTIALS_PROXIES`] value lists: separated by
/// commas, whitespace around each ignored; an empty (or blank) value lists none.
///
/// # Errors
/// What is wrong with the value, as the end of a sentence about it: more than
/// [`MAX_CREDENTIALS_PROXIES`] names, or one that is not a Kubernetes object name (an empty one
/// between two commas included).
pub fn named_proxies(value: &str) -> Result<Vec<&str>, String> {
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    // NB: an annotation may be large; a list too long is refused without reading it all.
    let names: Vec<&str> = value
        .split(',')
        .take(MAX_CREDENTIALS_PROXIES + 1)
        .map(str::trim)
        .collect();
    if names.len() > MAX_CREDENTIALS_PROXIES {
        let count = value.split(',').count();
        return Err(format!("lists {count} names, more than {MAX_CREDENTIALS_PROXIES}"));
    }
    if let Some(bad) = names.iter().find(|n| !egress_provider::is_dns1123_subdomain(n)) {
        if bad.is_empty() {
            return Err("lists an empty name (two commas in a row, or one at an end)".into());
        }
        // An annotation is no secret, but may be long: enough of the name to find it.
        let mut shown: String = bad.chars().take(64).collect();
        if shown.len() < bad.len() {
            shown.push_str("...");
        }
        return Err(format!(
            "lists {shown:?}, which is not a valid Kubernetes object name (lower-case letters, digits, '-' and '.')"
        ));
    }
    Ok(names)
}

/// Whether the user's credentials Secret `secret` may serve the Proxy named `proxy` (of its
/// namespace): the one decision every reader of a user's credentials goes through
/// ([`CredentialCache::lookup`]). Only for `spec.credentials.type: Secret`; a Generated Proxy's
/// own Secret is bound to it by its owner reference instead ([`serving`]).
///
/// # Errors
/// Why not: the operator's own generated Secret, no Proxy named, not this one, or an
/// annotation the operator does not accept.
pub fn may_serve(secret: &Secret, proxy: &str) -> Result<(), Refusal> {
    let name = secret.name_any();
    if secret.labels().get(LABEL_PROXY_CREDENTIALS).map(String::as_str) == Some(PROXY_CREDENTIALS_GENERATED) {
        return Err(Refusal::Generated { secret: name });
    }
    let value = secret
        .annotations()
        .get(ANNOTATION_CREDENTIALS_PROXIES)
        .map_or("", String::as_str);
    let names = named_proxies(value).map_err(|why| Refusal::Malformed {
        secret: name.clone(),
        why,
    })?;
    if names.is_empty() {
        return Err(Refusal::NoneNamed {
            secret: name,
            proxy: proxy.to_owned(),
        });
    }
    if !names.contains(&proxy) {
        return Err(Refusal::NotNamed {
            secret: name,
            proxy: proxy.to_owned(),
        });
    }
    Ok(())
}

/// The Secret that holds `credentials` for `proxy`: labelled, owned by the Proxy (not blocking
/// its deletion), no instance bound yet.
pub fn build_secret(proxy: &Proxy, credentials: &ProxyCredentials, resource_version: Option<String>) -> Secret {
    let owner = OwnerReference {
        api_version: Proxy::api_version(&()).into_owned(),
        kind: Proxy::kind(&()).into_owned(),
        name: proxy.name_any(),
        uid: proxy.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    };
    let data = BTreeMap::from([
        (
            USERNAME_KEY.to_owned(),
            ByteString(credentials.credentials.username().as_bytes().to_vec()),
        ),
        (
            PASSWORD_KEY.to_owned(),
            ByteString(credentials.credentials.password().as_bytes().to_vec()),
        ),
        (
            HTPASSWD_KEY.to_owned(),
            ByteString(format!("{}\n", credentials.htpasswd).into_bytes()),
        ),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(credentials.secret_name.clone()),
            namespace: proxy.namespace(),
            labels: Some(BTreeMap::from([
                (
                    LABEL_PROXY_CREDENTIALS.to_owned(),
                    PROXY_CREDENTIALS_GENERATED.to_owned(),
                ),
                (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
            ])),
            owner_references: Some(vec![owner]),
            resource_version,
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// An API error on the Secret. A refusal that asking again will not change (400 Bad Request,
/// 403 Forbidden, 422 Invalid, ...) is `Unusable`, and the Proxy says so; anything else (no
/// answer, 401 with a token about to be renewed, 404 for a Secret deleted since it was read,
/// 409, 429, 5xx) is `Unavailable`, retried with backoff.
fn problem(what: &str, name: &str, e: &kube::Error) -> SecretProblem {
    // A Secret's contents never appear in an API error (the server does not echo them back).
    let message = format!("{what} Secret \"{name}\": {e}");
    match e {
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 405 | 413 | 415 | 422) => SecretProblem::Unusable(message),
        _ => SecretProblem::Unavailable(message),
    }
}

/// The credentials for the next create of `proxy` (Generated), written to its Secret first
/// when new ones are needed. `gone` is the instance this pass saw gone, whose credentials are
/// not kept.
///
/// # Errors
/// `Unusable` when the name is taken by a Secret the Proxy does not own, or the API server
/// refuses for good (403, 422); `Unavailable` when it does not answer, throttles or conflicts
/// (the next pass reads again).
pub async fn prepare(
    client: &kube::Client,
    proxy: &Proxy,
    gone: Option<&ProviderId>,
) -> Result<Prepared, SecretProblem> {
    let namespace = proxy.namespace().unwrap_or_default();
    let uid = proxy.uid().unwrap_or_default();
    let name = secret_name(&uid);
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let existing = api.get_opt(&name).await.map_err(|e| problem("reading", &name, &e))?;
    match plan(existing.as_ref(), &uid, gone) {
        Plan::Reuse(credentials) => Ok(Prepared::Ready(credentials)),
        Plan::Bound { instance, credentials } => Ok(Prepared::Bound { instance, credentials }),
        Plan::Refuse(why) => Err(SecretProblem::Unusable(why)),
        Plan::Mint { replace } => {
            let credentials = ProxyCredentials::new(Credentials::generate(), name.clone());
            let result = match &replace {
                None => {
                    api.create(&PostParams::default(), &build_secret(proxy, &credentials, None))
                        .await
                }
                // A patch, not an update (the RBAC grants no update): the new data, the instance
                // annotation removed, and the resourceVersion read, so a concurrent change
                // fails with a conflict instead of being overwritten.
                Some(rv) => {
                    let fresh = build_secret(proxy, &credentials, None);
                    let patch = serde_json::json!({
                        "metadata": {
                            "resourceVersion": rv,
                            "annotations": {ANNOTATION_CREDENTIALS_INSTANCE: null},
                            "labels": fresh.metadata.labels,
                        },
                        "data": fresh.data,
                    });
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await
                }
            };
            result.map_err(|e| problem("writing", &name, &e))?;
            Ok(Prepared::Ready(credentials))
        }
    }
}

/// What the Secret of `proxy` (Generated) is to its running instance `id`, read from the API
/// server (the cache may lag behind a bind just made).
///
/// # Errors
/// As [`prepare`].
pub async fn check(client: &kube::Client, proxy: &Proxy, id: &ProviderId) -> Result<Serving, SecretProblem> {
    let namespace = proxy.namespace().unwrap_or_default();
    let uid = proxy.uid().unwrap_or_default();
    let name = secret_name(&uid);
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = api.get_opt(&name).await.map_err(|e| problem("reading", &name, &e))?;
    Ok(secret.map_or(Serving::No, |s| serving(&s, &uid, id)))
}

/// Records on the Secret that the instance `id` was created with its credentials.
///
/// # Errors
/// `Unavailable` when the API server does not answer or refuses.
pub async fn bind(client: &kube::Client, proxy: &Proxy, id: &ProviderId) -> Result<(), SecretProblem> {
    let namespace = proxy.namespace().unwrap_or_default();
    let name = secret_name(&proxy.uid().unwrap_or_default());
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION_CREDENTIALS_INSTANCE: id.as_str()}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| problem("annotating", &name, &e))
}

/// The labelled credential Secrets, as every replica keeps them, for the probe and the
/// discovery API.
#[derive(Clone)]
pub struct CredentialCache {
    store: Store<Secret>,
    generation: Arc<AtomicU64>,
    observers: Observers<Secret>,
}

impl std::fmt::Debug for CredentialCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialCache")
            .field("secrets", &self.store.state().len())
            .finish_non_exhaustive()
    }
}

impl CredentialCache {
    /// A cache over `store` (tests fill one by hand).
    pub fn from_store(store: Store<Secret>) -> Self {
        Self {
            store,
            generation: Arc::default(),
            observers: Observers::default(),
        }
    }

    /// Tells `observer` of every watch event the cache applies from now on, once the store
    /// holds it.
    pub fn observe(&self, observer: Observer<Secret>) {
        self.observers.add(observer);
    }

    /// The Secret `proxy` takes its credentials from, as (namespace, name): its generated one,
    /// the one its spec names, or none.
    pub fn secret_of(proxy: &Proxy) -> Option<(String, String)> {
        let spec = proxy.spec.credentials.as_ref()?;
        let name = match spec.type_ {
            CredentialsType::None => return None,
            CredentialsType::Generated => secret_name(&proxy.uid().unwrap_or_default()),
            CredentialsType::Secret => spec.secret_ref.as_ref()?.name.clone(),
        };
        Some((proxy.namespace().unwrap_or_default(), name))
    }

    /// Changes with every watch event the cache applies.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The credentials clients of `proxy` must show: none asked, found, or asked and not to be
    /// had. A Generated Proxy's are found only while its Secret names the instance its status
    /// records: never a password meant for an instance still to come, or one gone.
    pub fn lookup(&self, proxy: &Proxy) -> Lookup {
        let Some(spec) = proxy.spec.credentials.as_ref() else {
            return Lookup::NotNeeded;
        };
        let secret = Self::secret_of(proxy)
            .and_then(|(namespace, name)| self.store.get(&reflector::ObjectRef::new(&name).within(&namespace)));
        let found = match spec.type_ {
            CredentialsType::None => return Lookup::NotNeeded,
            CredentialsType::Generated => {
                let uid = proxy.uid().unwrap_or_default();
                let id = ProviderId::new(proxy.status.as_ref().map(|s| s.provider_id.clone()).unwrap_or_default());
                secret
                    .filter(|s| serving(s, &uid, &id) == Serving::Yes)
                    .and_then(|s| user_and_password(&s))
            }
            // A user's Secret that names this Proxy, never one the operator generated for some
            // Proxy: an External Proxy pointed at a host of its author's must not be handed
            // another proxy's password.
            CredentialsType::Secret => match secret {
                Some(s) => match may_serve(&s, &proxy.name_any()) {
                    Err(refusal) => return Lookup::Refused(refusal),
                    Ok(()) => user_and_password(&s),
                },
                None => None,
            },
        };
        found.map_or(Lookup::Missing, Lookup::Found)
    }

    /// The credentials of `proxy`, when it has them and they can be read.
    pub fn for_proxy(&self, proxy: &Proxy) -> Option<Credentials> {
        match self.lookup(proxy) {
            Lookup::Found(c) => Some(c),
            Lookup::NotNeeded | Lookup::Missing | Lookup::Refused(_) => None,
        }
    }
}

/// What the cache knows of the credentials a Proxy asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The Proxy takes clients without credentials.
    NotNeeded,
    Found(Credentials),
    /// It asks for credentials the cache cannot give: its Secret is missing, incomplete, or not
    /// (yet) bound to its instance. It is never leased meanwhile (and a Generated Proxy is not
    /// probed either).
    Missing,
    /// Its Secret is there but may not serve it ([`may_serve`]): its credentials are never used
    /// for it, and it is neither probed nor leased until the Secret names it.
    Refused(Refusal),
}

/// The cache and the future that keeps it (run on every replica until `shutdown`).
/// It holds the labelled Secrets of `namespaces` (`--proxy-namespace`).
pub fn credential_cache(
    client: kube::Client,
    namespaces: &Namespaces,
    shutdown: CancellationToken,
) -> (CredentialCache, impl Future<Output = ()> + Send + 'static) {
    let namespaces = namespaces.clone();
    let (store, writer) = reflector::store();
    let cache = CredentialCache::from_store(store);
    let generation = cache.generation.clone();
    let observers = cache.observers.clone();
    let run = async move {
        let config = watcher::Config::default().labels(LABEL_PROXY_CREDENTIALS);
        let changes = served::watch(client, &namespaces, config, |s: &mut Secret| {
            s.metadata.managed_fields = None
        })
        .reflect(writer)
        .inspect(move |event| {
            generation.fetch_add(1, Ordering::Release);
            if let Ok(event) = event {
                observers.tell(event);
            }
        })
        .applied_objects();
        let mut changes = std::pin::pin!(changes.take_until(shutdown.cancelled_owned()));
        while let Some(change) = changes.next().await {
            if let Err(e) = change {
                tracing::warn!(error = %e, "watching credential Secrets failed; retrying with backoff");
            }
        }
    };
    (cache, run)
}

#[cfg(test)]
mod tests;
