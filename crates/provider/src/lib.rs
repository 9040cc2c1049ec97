//! The provider contract of the egress-proxy operator.
//!
//! Every compute backend (Kubernetes pods, Compute Engine VMs, libvirt
//! domains, local processes) is a [`Provider`]: five operations over an
//! instance addressed by an opaque [`ProviderId`], and an optional
//! [`Checker`]. This crate owns that contract and what every provider and
//! every caller shares:
//!
//! - the types ([`CreateRequest`], [`Placement`], [`Instance`],
//!   [`InstanceState`]) and the call context [`OpCtx`];
//! - [`ProviderError`] and its four classes; callers branch on the class only;
//! - instance naming ([`name_from_uid`]) and the GC marks, with the rule for marking an
//!   instance with an installation after its create ([`marking`]);
//! - the providers config file ([`config`]) and the [`Registry`] of provider
//!   types that both validates and constructs entries;
//! - the metrics and tracing decorators ([`decorate`]).
//!
//! ```text
//!  providers.yaml ─► config::ProvidersConfig::load(registry) ─► Registry::build
//!                                                                   │
//!        reconciler, GC ◄── tracing(metrics(provider)) ◄────────────┤
//!        health monitor ◄── provider.checker() (undecorated) ◄──────┘
//! ```
//!
//! It deliberately knows nothing of Kubernetes: the controller translates
//! Proxy objects into these types, and a tool that reuses a provider crate
//! pulls no Kubernetes dependency through this one.

mod ctx;
mod error;
mod naming;
mod provider;
mod redact;
mod registry;
mod types;

pub mod config;
pub mod decorate;

pub use ctx::{Interrupted, OpCtx};
pub use egress_credentials::Credentials;
pub use egress_credentials::redact;
pub use error::{BoxError, ErrorClass, ErrorScope, Message, Op, ProviderError, class_of, result_label};
pub use naming::{
    LABEL_INSTALLATION, LABEL_MANAGED, LABEL_MANAGED_YES, LABEL_UID, Marking, NAME_PREFIX, is_dns1123_label,
    is_dns1123_subdomain, is_identifier, marking, name_from_uid, uuid_text,
};
pub use provider::{
    Checker, Provider, REASON_API_ERROR, REASON_FORBIDDEN, REASON_REACHABLE, REASON_TIMEOUT, REASON_UNAUTHORIZED,
    REASON_UNREACHABLE, TargetStatus,
};
pub use redact::scrub;
pub use registry::{
    BuildError, BuiltProvider, Constructor, ProviderType, Providers, Registry, ShapeCheck, SharedCheck, Validator,
};
pub use types::{CreateRequest, Instance, InstanceState, Placement, ProviderId, ProxyCredentials};

/// Re-exported so providers and tests name one version of it.
pub use async_trait::async_trait;
pub use tokio_util::sync::CancellationToken;
