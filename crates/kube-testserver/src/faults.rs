//! Test controls: fault injection and request counting.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A request's verb, as RBAC and audit logs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    /// The verbs that change state.
    pub const WRITES: [Verb; 5] = [
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::DeleteCollection,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }

    pub fn is_write(self) -> bool {
        Self::WRITES.contains(&self)
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an injected fault does to a matching request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer with this HTTP status and a `Status` body carrying the matching reason.
    Fail(u16),
    /// Hold the request this long, then serve it normally.
    Delay(Duration),
}

/// A rule: the next `times` requests with this verb (any verb when `None`) on this resource
/// (`proxies`, `proxies/status`, or `*` for any) get `action`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub verb: Option<Verb>,
    pub resource: String,
    pub action: FaultAction,
    pub times: usize,
}

impl Fault {
    /// The next matching request fails with `status` (use `.times(n)` for more).
    pub fn fail(verb: Verb, resource: &str, status: u16) -> Self {
        Self {
            verb: Some(verb),
            resource: resource.into(),
            action: FaultAction::Fail(status),
            times: 1,
        }
    }

    /// The next matching request is held for `delay` before it is served.
    pub fn delay(verb: Verb, resource: &str, delay: Duration) -> Self {
        Self {
            verb: Some(verb),
            resource: resource.into(),
            action: FaultAction::Delay(delay),
            times: 1,
        }
    }

    pub fn times(mut self, times: usize) -> Self {
        self.times = times;
        self
    }

    /// Match every verb.
    pub fn any_verb(mut self) -> Self {
        self.verb = None;
        self
    }

    fn matches(&self, verb: Verb, resource: &str) -> bool {
        self.times > 0 && self.verb.is_none_or(|v| v == verb) && (self.resource == "*" || self.resource == resource)
    }
}

/// A resource request as a [`RequestHook`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookedRequest {
    pub verb: Verb,
    /// `pods`, `pods/status`...
    pub resource: String,
    pub namespace: Option<String>,
    /// The object's name, for requests on one object.
    pub name: Option<String>,
    /// The client's name, for clients made with [`crate::TestServer::client_named`].
    pub client: Option<String>,
    /// The query string as sent (`labelSelector=...&limit=1`).
    pub query: Option<String>,
}

/// What a hook makes of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookVerdict {
    /// Serve it (after whatever the hook awaited: a delay, a gate).
    Serve,
    /// Answer with this status code and a `Status` body (the code's usual reason, or `reason`).
    Fail {
        code: u16,
        reason: Option<&'static str>,
        message: String,
    },
    /// Close the connection without an answer (a connection reset, for the client).
    Reset,
}

/// Decides about each resource request before it is served: for test backends that log calls,
/// hold them, slow them or fail them by rules of their own (a provider's conformance hooks).
pub type RequestHook = Arc<
    dyn Fn(HookedRequest) -> std::pin::Pin<Box<dyn std::future::Future<Output = HookVerdict> + Send>> + Send + Sync,
>;

/// The injected faults of one server. Cloning shares them.
#[derive(Clone, Default)]
pub struct Faults {
    rules: Arc<Mutex<Vec<Fault>>>,
    hook: Arc<Mutex<Option<RequestHook>>>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faults")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl Faults {
    pub fn inject(&self, fault: Fault) {
        self.rules.lock().expect("fault list lock").push(fault);
    }

    /// Removes every rule not yet used up.
    pub fn clear(&self) {
        self.rules.lock().expect("fault list lock").clear();
    }

    /// Rules not yet used up.
    pub fn pending(&self) -> usize {
        self.rules
            .lock()
            .expect("fault list lock")
            .iter()
            .map(|f| f.times)
            .sum()
    }

    /// Sets (or, with `None`, removes) the hook every resource request passes first.
    pub fn set_hook(&self, hook: Option<RequestHook>) {
        *self.hook.lock().expect("hook lock") = hook;
    }

    pub(crate) fn hook(&self) -> Option<RequestHook> {
        self.hook.lock().expect("hook lock").clone()
    }

    /// The action for this request, using up one count of the first matching rule.
    pub(crate) fn take(&self, verb: Verb, resource: &str) -> Option<FaultAction> {
        let mut rules = self.rules.lock().expect("fault list lock");
        let rule = rules.iter_mut().find(|f| f.matches(verb, resource))?;
        rule.times -= 1;
        let action = rule.action.clone();
        rules.retain(|f| f.times > 0);
        Some(action)
    }
}

/// Requests served, by verb and resource (`proxies`, `proxies/status`), and by client for clients
/// made with [`crate::TestServer::client_named`]. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct Requests(Arc<Mutex<Counts>>);

#[derive(Debug, Default)]
struct Counts {
    all: BTreeMap<(Verb, String), u64>,
    by_client: BTreeMap<String, BTreeMap<(Verb, String), u64>>,
}

/// The header a named client sends, so its requests can be told apart.
pub(crate) const CLIENT_HEADER: &str = "x-kube-testserver-client";

impl Requests {
    pub(crate) fn record(&self, verb: Verb, resource: &str, client: Option<&str>) {
        let mut counts = self.0.lock().expect("request counter lock");
        *counts.all.entry((verb, resource.to_string())).or_default() += 1;
        if let Some(client) = client {
            *counts
                .by_client
                .entry(client.to_string())
                .or_default()
                .entry((verb, resource.to_string()))
                .or_default() += 1;
        }
    }

    /// Requests with this verb on this resource (`*` counts every resource).
    pub fn count(&self, verb: Verb, resource: &str) -> u64 {
        let counts = self.0.lock().expect("request counter lock");
        counts
            .all
            .iter()
            .filter(|((v, r), _)| *v == verb && (resource == "*" || r == resource))
            .map(|(_, n)| *n)
            .sum()
    }

    /// Requests that could change state (create, update, patch, delete, deletecollection) on this
    /// resource (`*` for all).
    pub fn writes(&self, resource: &str) -> u64 {
        Verb::WRITES.iter().map(|v| self.count(*v, resource)).sum()
    }

    pub fn snapshot(&self) -> BTreeMap<(Verb, String), u64> {
        self.0.lock().expect("request counter lock").all.clone()
    }

    /// What one named client asked for (see [`crate::TestServer::client_named`]).
    pub fn by_client(&self, client: &str) -> BTreeMap<(Verb, String), u64> {
        self.0
            .lock()
            .expect("request counter lock")
            .by_client
            .get(client)
            .cloned()
            .unwrap_or_default()
    }

    pub fn reset(&self) {
        let mut counts = self.0.lock().expect("request counter lock");
        counts.all.clear();
        counts.by_client.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_is_used_up() {
        let f = Faults::default();
        f.inject(Fault::fail(Verb::Update, "proxies", 500).times(2));
        assert_eq!(f.take(Verb::Get, "proxies"), None);
        assert_eq!(f.take(Verb::Update, "pods"), None);
        assert_eq!(f.take(Verb::Update, "proxies"), Some(FaultAction::Fail(500)));
        assert_eq!(f.take(Verb::Update, "proxies"), Some(FaultAction::Fail(500)));
        assert_eq!(f.take(Verb::Update, "proxies"), None);
        f.inject(Fault::fail(Verb::Get, "*", 503).any_verb());
        assert_eq!(f.take(Verb::Watch, "leases"), Some(FaultAction::Fail(503)));
        assert_eq!(f.pending(), 0);
    }
}
