//! What a step of the decision answers ([`Next`]): an [`Action`] to perform, or the end of the
//! pass ([`Outcome`]): the status to flush, when to come back ([`Requeue`]), and what a person
//! wants to know ([`Note`], [`Marked`]).

use std::time::Duration;

use egress_api::{ProxyStatus, SecretRef};
use egress_provider::{ProviderId, ProxyCredentials};

/// The next thing to do. Its `Debug` shows the cloud-init size only: it may hold secrets.
#[derive(Clone, PartialEq, Eq)]
pub enum Action {
    AddFinalizer,
    RemoveFinalizer,
    /// Write this value into the `crawl.example.com/spec-hash` annotation.
    WriteSpecHash(String),
    /// Adopt the recorded instance: write `hash` into the spec-hash annotation and keep the
    /// other operator's value in `crawl.example.com/previous-spec-hash`.
    AdoptInstance {
        hash: String,
        previous: String,
    },
    /// Read the cloud-init Secret (labelled Secrets only).
    ReadSecret(SecretRef),
    Get(ProviderId),
    /// Read or write the credentials Secret of a Generated Proxy for the next create; `gone` is
    /// the instance this pass saw gone, whose credentials must not be reused.
    PrepareCredentials {
        gone: Option<ProviderId>,
    },
    /// Ask the provider for the instance the credentials Secret names.
    GetBound(ProviderId),
    /// Record on the credentials Secret the instance made with them.
    BindCredentials(ProviderId),
    /// Read the credentials Secret: does it still serve this running instance?
    CheckCredentials(ProviderId),
    /// Create the instance from the spec with this cloud-init and these credentials, if the
    /// provider entry's create budget has room (else the create is deferred).
    Create {
        cloud_init: Vec<u8>,
        credentials: Option<ProxyCredentials>,
    },
    Delete(ProviderId),
    /// Write the installation mark on the instance, which carries none: so this installation's
    /// orphan GC may collect it once its Proxy is gone.
    MarkInstallation {
        id: ProviderId,
        installation: String,
    },
}

impl std::fmt::Debug for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AddFinalizer => f.write_str("AddFinalizer"),
            Self::RemoveFinalizer => f.write_str("RemoveFinalizer"),
            Self::WriteSpecHash(h) => f.debug_tuple("WriteSpecHash").field(h).finish(),
            Self::AdoptInstance { hash, previous } => f
                .debug_struct("AdoptInstance")
                .field("hash", hash)
                .field("previous", previous)
                .finish(),
            Self::ReadSecret(r) => f.debug_tuple("ReadSecret").field(r).finish(),
            Self::Get(id) => f.debug_tuple("Get").field(id).finish(),
            Self::PrepareCredentials { gone } => f.debug_struct("PrepareCredentials").field("gone", gone).finish(),
            Self::GetBound(id) => f.debug_tuple("GetBound").field(id).finish(),
            Self::BindCredentials(id) => f.debug_tuple("BindCredentials").field(id).finish(),
            Self::CheckCredentials(id) => f.debug_tuple("CheckCredentials").field(id).finish(),
            Self::Create {
                cloud_init,
                credentials,
            } => write!(
                f,
                "Create {{ cloud_init: <{} bytes>, credentials: {credentials:?} }}",
                cloud_init.len()
            ),
            Self::Delete(id) => f.debug_tuple("Delete").field(id).finish(),
            Self::MarkInstallation { id, installation } => f
                .debug_struct("MarkInstallation")
                .field("id", id)
                .field("installation", installation)
                .finish(),
        }
    }
}

/// When the Proxy is reconciled again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    After(Duration),
    /// Only when something changes (a watch event, a health event, the periodic resync).
    Never,
    /// A failure for the workqueue's exponential backoff.
    Error(String),
}

/// Something a person wants to know about, logged (and later recorded as an Event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Deletion released the Proxy without provider cleanup because of the annotation.
    SkipCleanup { provider_id: String },
    /// `Get` failed permanently during deletion, but `Delete` succeeded.
    UnreachableButCleaned { provider_id: String, get_error: String },
    /// The instance was adopted from another operator's spec hash, not replaced.
    Adopted { provider_id: String, previous: String },
    /// Deletion released the Proxy without deleting its recorded instance: the instance's own
    /// mark names another Proxy (review M2).
    LeftToItsOwner { provider_id: String, owner: String },
}

/// The end of a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The status to flush (written only if it differs from the fetched one).
    pub status: ProxyStatus,
    pub requeue: Requeue,
    pub note: Option<Note>,
    /// The instance this pass marked with the installation, if it did (an event says so).
    pub marked: Option<Marked>,
}

/// An instance a pass marked with the operator's installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marked {
    pub provider_id: String,
    pub installation: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Do(Action),
    Done(Outcome),
}
