//! Shared by the semantic tests: toy custom resources and a server with them installed.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use egress_kube_testserver::TestServer;
use kube::api::{Api, PostParams};
use kube::{Client, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A namespaced kind with a status subresource and schema bounds.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "toys.example.com",
    version = "v1",
    kind = "Toy",
    namespaced,
    status = "ToyStatus",
    shortname = "ty"
)]
#[kube(printcolumn = r#"{"name":"Size", "type":"integer", "jsonPath":".spec.size"}"#)]
#[serde(rename_all = "camelCase")]
pub struct ToySpec {
    #[schemars(range(min = 1, max = 10))]
    pub size: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToyStatus {
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A cluster-scoped kind without a status subresource.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(group = "toys.example.com", version = "v1", kind = "Gadget")]
pub struct GadgetSpec {
    pub mode: String,
}

pub const NS: &str = "tests";

pub async fn server() -> TestServer {
    TestServer::builder()
        .custom_resource::<Toy>()
        .custom_resource::<Gadget>()
        .namespace(NS)
        .start()
        .await
        .expect("the test server starts")
}

pub fn toys(server: &TestServer) -> Api<Toy> {
    Api::namespaced(server.client().expect("a client"), NS)
}

pub fn client(server: &TestServer) -> Client {
    server.client().expect("a client")
}

pub fn toy(name: &str, size: i32) -> Toy {
    Toy::new(name, ToySpec { size, color: None })
}

pub async fn create_toy(api: &Api<Toy>, name: &str, size: i32) -> Toy {
    api.create(&PostParams::default(), &toy(name, size))
        .await
        .expect("create")
}

/// Sets toy `name`'s size with a merge patch.
pub async fn resize_toy(api: &Api<Toy>, name: &str, size: i32) -> Toy {
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"size": size}})),
    )
    .await
    .expect("resize")
}

/// The resourceVersion of a fresh list: where a watch "from now" starts.
pub async fn list_rv<K>(api: &Api<K>) -> String
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
}

/// The code and reason of a failed call.
pub fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A bound on waiting for something the server must do promptly; a liveness bound, not a speed check.
pub const LIVENESS: Duration = Duration::from_secs(20);

pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(LIVENESS, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {LIVENESS:?}"))
}

pub fn toy_crd_name() -> String {
    Toy::crd_name().to_string()
}
