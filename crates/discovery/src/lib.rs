//! The discovery and lease API (spec/core.md §5): crawler clients list proxies, borrow one for a
//! time, give it back, and report when a site rate-limited or banned them through it.
//!
//! ```text
//! GET    /healthz                  200 ok (never authenticated)
//! GET    /v1/proxies               {"proxies": [view...], "count": n}
//! GET    /v1/whoami                {"client": name}
//! POST   /v1/leases                201 grant | 200 a session's | 409 no_match | 503 store_unavailable
//! DELETE /v1/leases/{id}           204, always
//! POST   /v1/leases/{id}/renew     200 | 404 unknown_lease | 409 not_renewable
//! POST   /v1/leases/{id}/report    204 | 404 unknown_lease
//! POST   /v1/sessions/{s}/report   204 | 404 unknown_session
//! ```
//!
//! It is served by the shared stack of `egress-http` (connection cap, header, body, write and
//! idle budgets, drain at shutdown). Every request passes, outermost first: recover (a panic is
//! a 500, never a dead server) → request log → bearer auth (before any byte of the body is
//! read; on by default, see [`Auth`]) → admission per client (see [`admission`]: served now,
//! after its turn, or 429 with `Retry-After`, still before the body is read) → body cap
//! (64 KiB) → the route. Bodies are JSON whatever their
//! `Content-Type` says (the documented `curl -d` examples send form encoding). Every error is
//! `{"error": "<code>", "message": "<text>"}`; no client mistake is a 500.
//!
//! The answers are encoded from the types of [`wire`], lending the directory's strings; the
//! typed [`client`] decodes them into the same types, owned, and the document of [`openapi`]
//! describes their fields (its tests hold the three together).
//!
//! Auth also says who is calling: each token belongs to one named client ([`ClientName`]; one
//! file per client in the token dir, followed by [`ClientFiles`]), and the name is put in the
//! request's extensions for what runs after auth, and in the response's for the request log.
//! A caller never sends its name: its token says it. With auth off, every caller is the client
//! `default`. A client's scope ([`scope`], from the clients config file) narrows the proxies it
//! lists and leases; a client without one (`default` among them) sees every proxy.
//!
//! The API knows no Kubernetes: it reads proxies through [`ProxyDirectory`] (a [`Fleet`]
//! snapshot) and leases through
//! [`egress_lease::LeaseStore`]. A store that lives elsewhere (Redis) and cannot be reached
//! makes the lease routes and the list answer `503 store_unavailable`, having changed nothing;
//! [`publish_view`] shares this replica's proxies with the other replicas through such a store.
//! Refused lease requests whose selector names a pool are counted in [`Refusals`], for the pool
//! autoscaler.

pub mod admission;
mod admission_metrics;
mod api;
mod auth;
pub mod client;
mod clients_config;
mod fleet;
pub mod openapi;
mod proxy;
pub mod refusals;
pub mod scope;
pub mod selection;
mod server;
pub mod view;
pub mod wire;

pub use admission::{Admission, Budget, Budgets};
pub use admission_metrics::AdmissionMetrics;
pub use api::{DEFAULT_MAX_SESSIONS, DiscoveryApi, ProxyDirectory};
pub use auth::{
    Auth, ClientFiles, ClientName, DEFAULT_REVOKE_GRACE, FileTokens, MAX_CLIENTS, MAX_TOKEN_BYTES, MAX_TOKENS,
    TokenError, TokenSet, parse_tokens, read_token_file,
};
pub use clients_config::{ClientsFile, MAX_FILE_BYTES as MAX_CLIENTS_CONFIG_BYTES, parse_clients_config};
pub use fleet::{DEFAULT_INDEXED_KEYS, EXIT_ASN_KEY, EXIT_COUNTRY_KEY, EXIT_KEYS, Fleet, IndexedKeys, POOL_KEY};
pub use proxy::{ExitInfo, ProxyInfo};
pub use refusals::Refusals;
pub use scope::{ClientScope, ScopeTable, Scopes};
pub use server::{MAX_BODY, router, serve, serve_tls};
pub use view::publish_view;
