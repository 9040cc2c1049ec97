//! An in-memory Kubernetes API server with real REST semantics, for tests and local runs.
//!
//! **Not a cluster, and never a production component.** It speaks the Kubernetes REST API over
//! plain HTTP on 127.0.0.1 so that the real `kube` client, `kube::runtime::watcher`,
//! `Controller` and `kubectl` run against it unmodified. What it covers and what it does not
//! (authentication, RBAC, admission webhooks, protobuf beyond five kinds, conversion) is in
//! docs/testing.md.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use egress_kube_testserver::{TestServer, Fault, Verb};
//! let server = TestServer::builder().namespace("tests").start().await?;
//! let client: kube::Client = server.client()?;
//! server.faults().inject(Fault::fail(Verb::Update, "pods", 500).times(2));
//! // ... run the code under test with `client` ...
//! assert_eq!(server.requests().writes("pods"), 0);
//! # Ok(()) }
//! ```

mod discovery;
mod faults;
mod fields;
mod patch;
mod protobuf;
mod resources;
mod reviews;
mod scale;
mod schema;
mod selectors;
mod server;
mod status;
mod store;
mod views;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use faults::{Fault, FaultAction, Faults, HookVerdict, HookedRequest, RequestHook, Requests, Verb};
pub use status::ApiError;

use crate::server::Shared;
use crate::store::State;

/// How a server starts.
#[derive(Debug, Clone)]
pub struct Builder {
    crds: Vec<Value>,
    namespaces: Vec<String>,
    history_limit: usize,
    bookmark_interval: Duration,
    port: u16,
    identities: reviews::Identities,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            crds: Vec::new(),
            namespaces: Vec::new(),
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(60),
            port: 0,
            identities: reviews::Identities::default(),
        }
    }
}

/// A server that could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("binding 127.0.0.1:{port}: {source}")]
    Bind { port: u16, source: std::io::Error },
    #[error("installing CustomResourceDefinition {name}: {message}")]
    Crd { name: String, message: String },
    #[error("creating namespace {name}: {message}")]
    Namespace { name: String, message: String },
}

impl Builder {
    /// Serve the custom resource `K` (its CRD from `kube::CustomResourceExt`).
    pub fn custom_resource<K: kube::CustomResourceExt>(self) -> Self {
        let crd = serde_json::to_value(K::crd()).expect("a CustomResourceDefinition serialises");
        self.crd_json(crd)
    }

    /// Serve the kind a CustomResourceDefinition defines.
    pub fn crd(
        self,
        crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) -> Self {
        let crd = serde_json::to_value(crd).expect("a CustomResourceDefinition serialises");
        self.crd_json(crd)
    }

    /// Serve the kind a CustomResourceDefinition (as JSON) defines.
    pub fn crd_json(mut self, crd: Value) -> Self {
        self.crds.push(crd);
        self
    }

    /// Create this namespace at start (`default`, `kube-system`, `kube-public` and
    /// `kube-node-lease` always exist).
    pub fn namespace(mut self, name: &str) -> Self {
        self.namespaces.push(name.to_string());
        self
    }

    /// How many changes the watch history keeps; a watch from an older resourceVersion gets
    /// 410 Gone. Default 10 000.
    pub fn history_limit(mut self, changes: usize) -> Self {
        self.history_limit = changes;
        self
    }

    /// How often a watch that allows bookmarks gets one. Default 60 s, as the real server.
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// A user TokenReviews authenticate by `token`, with its groups.
    pub fn user(mut self, token: &str, name: &str, groups: &[&str]) -> Self {
        self.identities.tokens.insert(
            token.into(),
            reviews::User {
                name: name.into(),
                groups: groups.iter().map(|g| (*g).to_string()).collect(),
            },
        );
        self
    }

    /// Lets `user` use `verb` on the non-resource `path` (answered by SubjectAccessReviews).
    pub fn allow_path(mut self, user: &str, verb: &str, path: &str) -> Self {
        self.identities.allowed.insert((user.into(), verb.into(), path.into()));
        self
    }

    /// Listen on this port of 127.0.0.1 (default 0: a free port).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    pub async fn start(self) -> Result<TestServer, StartError> {
        let listener = TcpListener::bind(("127.0.0.1", self.port))
            .await
            .map_err(|source| StartError::Bind {
                port: self.port,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            port: self.port,
            source,
        })?;
        let mut state = State::new(self.history_limit);
        for crd in self.crds {
            install_crd(&mut state, crd)?;
        }
        for ns in &self.namespaces {
            create_namespace(&mut state, ns)?;
        }
        let shutdown = CancellationToken::new();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            faults: Faults::default(),
            requests: Requests::default(),
            bookmark_interval: self.bookmark_interval,
            shutdown: shutdown.clone(),
            watches: Mutex::new(CancellationToken::new()),
            address: addr.to_string(),
            identities: self.identities,
        });
        let task = tokio::spawn(server::serve(listener, shared.clone()));
        Ok(TestServer {
            shared,
            addr,
            shutdown,
            task: Some(task),
        })
    }
}

fn system_target(state: &State, group: &str, plural: &str) -> store::Target {
    let rt = state
        .types
        .get(group, "v1", plural)
        .cloned()
        .expect("built-in kinds are always served");
    store::Target {
        rt,
        namespace: None,
        name: None,
        subresource: None,
    }
}

fn install_crd(state: &mut State, crd: Value) -> Result<(), StartError> {
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let t = system_target(state, "apiextensions.k8s.io", "customresourcedefinitions");
    let opts = store::WriteOptions {
        manager: "kube-testserver".into(),
        ..Default::default()
    };
    state.create(&t, crd, &opts).map(drop).map_err(|e| StartError::Crd {
        name,
        message: e.message,
    })
}

fn create_namespace(state: &mut State, name: &str) -> Result<(), StartError> {
    let t = system_target(state, "", "namespaces");
    let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    let opts = store::WriteOptions {
        manager: "kube-testserver".into(),
        ..Default::default()
    };
    match state.create(&t, body, &opts) {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => Ok(()),
        Err(e) => Err(StartError::Namespace {
            name: name.into(),
            message: e.message,
        }),
    }
}

/// A running server. Dropping it stops it.
#[derive(Debug)]
pub struct TestServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A server with the defaults and no custom resources.
    pub async fn start() -> Result<Self, StartError> {
        Builder::default().start().await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A `kube::Config` for this server, with `default` as its namespace: for a client built
    /// elsewhere (inside another runtime, or with layers of its own).
    pub fn config(&self) -> kube::Config {
        let uri: http::Uri = self.url().parse().expect("a valid URL");
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        config
    }

    /// A `kube::Client` for this server, with `default` as its namespace.
    pub fn client(&self) -> Result<kube::Client, kube::Error> {
        kube::Client::try_from(self.config())
    }

    /// A client whose requests are also counted under `name` ([`Requests::by_client`]), to tell
    /// the code under test from the test's own calls.
    pub fn client_named(&self, name: &str) -> Result<kube::Client, kube::Error> {
        let mut config = self.config();
        let value = http::HeaderValue::from_str(name).map_err(|e| kube::Error::Service(Box::new(e)))?;
        config
            .headers
            .push((http::HeaderName::from_static(faults::CLIENT_HEADER), value));
        kube::Client::try_from(config)
    }

    /// A kubeconfig (YAML) for `kubectl` and any client that reads one.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: egress-kube-testserver\n  cluster:\n    server: {url}\n\
             contexts:\n- name: egress-kube-testserver\n  context:\n    cluster: egress-kube-testserver\n    user: tester\n    namespace: default\n\
             current-context: egress-kube-testserver\nusers:\n- name: tester\n  user: {{}}\npreferences: {{}}\n",
            url = self.url()
        )
    }

    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    /// Fault injection for the requests that follow.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Requests served so far, by verb and resource.
    pub fn requests(&self) -> &Requests {
        &self.shared.requests
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .resource_version()
    }

    /// Sets the `creationTimestamp` (RFC 3339) of object `name` in `namespace` (`""` for a
    /// cluster-scoped one) of resource `plural` in API group `group` (`""` for the core group):
    /// a test control for objects "made earlier", which no client can write. False when there is
    /// no such object.
    pub fn backdate(&self, group: &str, plural: &str, namespace: &str, name: &str, at: &str) -> bool {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .backdate(group, plural, namespace, name, at)
    }

    /// Forgets the change history, as an etcd compaction does: a watch that resumes from any
    /// earlier resourceVersion gets 410 Gone and must re-list.
    pub fn compact(&self) {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner()).compact();
    }

    /// Ends every open watch stream (cleanly, as when an API server restarts); clients re-watch
    /// from their last resourceVersion.
    pub fn end_watches(&self) {
        let mut token = self.shared.watches.lock().unwrap_or_else(|p| p.into_inner());
        token.cancel();
        *token = CancellationToken::new();
    }

    /// Stops accepting, ends every watch and closes every connection.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
