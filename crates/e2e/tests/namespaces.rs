//! The shipped binary serves only the namespaces `--proxy-namespace` names: a Proxy in another
//! namespace is never reconciled (no status, no finalizer) and never listed or leased, while
//! the Proxies of every namespace named are, from one cache over all of them.

mod common;

use common::{PATIENCE, cluster, external_spec, start_probing, wait_for_proxy};
use egress_api::Proxy;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};

async fn make_namespace(server: &egress_kube_testserver::TestServer, name: &str) -> Api<Proxy> {
    let namespaces: Api<Namespace> = Api::all(server.client().unwrap());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(name.into());
    namespaces.create(&PostParams::default(), &namespace).await.unwrap();
    Api::namespaced(server.client().unwrap(), name)
}

/// The ids the discovery API lists.
async fn listed(discovery: &str) -> Vec<String> {
    let answer = common::proxy_list(discovery, "crawler-token").await;
    let mut ids: Vec<String> = answer["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_outside_the_namespaces_served_are_ignored() {
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = proxy.local_addr().unwrap().port();
    let cluster = cluster("namespaces", "providers: []\n").await;
    let (team_a, team_b, team_c) = (
        make_namespace(&cluster.server, "team-a").await,
        make_namespace(&cluster.server, "team-b").await,
        make_namespace(&cluster.server, "team-c").await,
    );
    // The one outside is there first, so it would be handled first were it served.
    team_c
        .create(&PostParams::default(), &Proxy::new("outside", external_spec(port)))
        .await
        .unwrap();
    let (mut op, discovery) = start_probing(
        &cluster,
        &egress_testkit::pki().ca_pem,
        "https://www.example.com/",
        &["--proxy-namespace=team-a,team-b", "--external-proxy-namespaces=*"],
        &[],
    );
    for api in [&team_a, &team_b] {
        api.create(&PostParams::default(), &Proxy::new("inside", external_spec(port)))
            .await
            .unwrap();
    }
    for api in [&team_a, &team_b] {
        wait_for_proxy(api, "inside", "a status", PATIENCE, |p| p.status.is_some()).await;
    }
    let outside = team_c.get("outside").await.unwrap();
    assert!(outside.status.is_none(), "{:?}", outside.status);
    assert!(
        outside.metadata.finalizers.is_none(),
        "{:?}",
        outside.metadata.finalizers
    );
    assert_eq!(listed(&discovery).await, ["team-a/inside", "team-b/inside"]);
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}
