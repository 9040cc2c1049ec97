//! Client scopes through the shipped binary, on the test API server: two ProxyPools of real
//! tinyproxy members (the local provider) and an External Proxy that carries the attribute
//! `pool: pool-a` without being a member, all in one namespace. team-a, scoped to pool-a by the
//! clients config file (a ConfigMap volume, followed), lists and leases only pool-a's members,
//! however often it asks and whatever selector it sends, and a selector naming pool-b matches
//! nothing; team-b, with no scope, gets members of both pools. A scope changed in the file is
//! in force once the manager says so; a file that cannot be used keeps it.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{PATIENCE, cluster, start_probing, wait_for_proxy};
use egress_api::{LABEL_POOL, Phase, Proxy, ProxyPool};
use egress_testkit as support;
use egress_testkit::secret_volume::Volume;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Resource as _, ResourceExt as _};
use serde_json::{Value, json};

const TEAM_A: &str = "team-a-token-value";
const TEAM_B: &str = "team-b-token-value";
/// Members of each pool.
const MEMBERS: usize = 2;
/// Leases each proxy takes.
const CAPACITY: usize = 4;

fn pool(name: &str) -> ProxyPool {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": name},
        "spec": {
            "replicas": MEMBERS,
            "template": {"spec": {
                "provider": "local", "maxLeases": CAPACITY,
                "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 2}
            }}
        }
    }))
    .unwrap()
}

/// Waits (at most [`PATIENCE`]) until pool `name` has all its members available.
async fn wait_up(pools: &Api<ProxyPool>, name: &str) {
    let up = kube::runtime::wait::await_condition(pools.clone(), name, |p: Option<&ProxyPool>| {
        p.is_some_and(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.observed_generation == p.meta().generation
                    && (s.replicas, s.available_replicas) == (MEMBERS as i32, MEMBERS as i32)
            })
        })
    });
    tokio::time::timeout(PATIENCE, up)
        .await
        .unwrap_or_else(|_| panic!("{name} not up within {PATIENCE:?}"))
        .unwrap();
}

/// The API ids of pool `name`'s members, sorted.
async fn member_ids(proxies: &Api<Proxy>, name: &str) -> Vec<String> {
    let listed = proxies
        .list(&ListParams::default().labels(&format!("{LABEL_POOL}={name}")))
        .await
        .unwrap();
    let mut ids: Vec<String> = listed
        .items
        .iter()
        .map(|p| format!("default/{}", p.name_any()))
        .collect();
    ids.sort();
    ids
}

/// The discovery API, called as one client or another.
struct Discovery {
    http: reqwest::Client,
    base: String,
}

impl Discovery {
    async fn call(&self, token: &str, method: reqwest::Method, path: &str, body: &str) -> (u16, Value) {
        let r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The ids the list shows `token`'s client, checked against its count.
    async fn listed(&self, token: &str, query: &str) -> Vec<String> {
        let (status, body) = self
            .call(token, reqwest::Method::GET, &format!("/v1/proxies{query}"), "")
            .await;
        assert_eq!(status, 200, "{body}");
        let ids: Vec<String> = body["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(body["count"], ids.len(), "{body}");
        ids
    }

    async fn lease(&self, token: &str, body: &str) -> (u16, Value) {
        self.call(token, reqwest::Method::POST, "/v1/leases", body).await
    }

    async fn release(&self, token: &str, lease: &str) {
        let path = format!("/v1/leases/{lease}");
        assert_eq!(self.call(token, reqwest::Method::DELETE, &path, "").await.0, 204);
    }

    /// Waits (at most [`PATIENCE`]) until `token`'s client lists exactly `ids` as healthy. The
    /// API's view follows the operator's cache, which no watch shows a test: it is asked again
    /// every 200 ms.
    async fn wait_healthy(&self, token: &str, ids: &[String]) {
        let mut again = tokio::time::interval(Duration::from_millis(200));
        let seen = tokio::time::timeout(PATIENCE, async {
            loop {
                again.tick().await;
                if self.listed(token, "?healthy=true").await == ids {
                    return;
                }
            }
        })
        .await;
        assert!(seen.is_ok(), "{ids:?} not all healthy in the API within {PATIENCE:?}");
    }
}

/// Stops, when dropped, the tinyproxies of the local instances under a state directory: a test
/// that fails before its pools are deleted leaves none behind (they outlive the operator).
struct Instances(std::path::PathBuf);

impl Drop for Instances {
    fn drop(&mut self) {
        let Ok(dir) = std::fs::read_dir(&self.0) else { return };
        for instance in dir.flatten() {
            if let Ok(pid) = std::fs::read_to_string(instance.path().join("launched.pid")) {
                let _ = std::process::Command::new("kill").arg(pid.trim()).status();
            }
        }
    }
}

/// `count` leases for `token`'s client, alternating `bodies`: the proxies granted, and the
/// leases to release.
async fn leases(api: &Discovery, token: &str, bodies: &[&str], count: usize) -> (Vec<String>, Vec<String>) {
    let (mut granted, mut held) = (Vec::new(), Vec::new());
    for body in bodies.iter().cycle().take(count) {
        let (status, answer) = api.lease(token, body).await;
        assert_eq!(status, 201, "{body}: {answer}");
        granted.push(answer["proxy"]["id"].as_str().unwrap().to_owned());
        held.push(answer["leaseID"].as_str().unwrap().to_owned());
    }
    (granted, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_scoped_to_pool_a_never_gets_a_proxy_of_pool_b() {
    if !support::tinyproxy_available() {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = support::pki();
    let (target, _) = support::tls_target(&pki).await;
    let state = support::scratch_dir("operator-client-scopes-state").join("state");
    let _instances = Instances(state.clone());
    let providers = format!(
        "providers:\n  - name: local\n    type: local\n    local:\n      stateDir: {}\n      connectPorts: [{}]\n",
        state.display(),
        target.port()
    );
    let cluster = cluster("client-scopes", &providers).await;
    let tokens = Volume::with_keys(
        "scopes-tokens",
        &[("team-a", &format!("{TEAM_A}\n")), ("team-b", &format!("{TEAM_B}\n"))],
    );
    let mut config = Volume::with_keys(
        "scopes-config",
        &[(
            "clients.yaml",
            "clients:\n  team-a:\n    scope:\n      namespaces: [default]\n      pools: [pool-a]\n  team-b:\n    concurrency: 8\n",
        )],
    );
    let token_dir = format!(
        "--discovery-token-dir={}",
        tokens.file("team-a").parent().unwrap().display()
    );
    let config_flag = format!("--discovery-clients-config={}", config.file("clients.yaml").display());
    let health_url = format!("https://127.0.0.1:{}/204", target.port());
    let (mut op, discovery) = start_probing(&cluster, &pki.ca_pem, &health_url, &[&token_dir, &config_flag], &[]);
    let read = op.wait_msg("Discovery clients config read");
    assert_eq!(
        (read["clients"].as_u64(), read["scoped"].as_u64()),
        (Some(2), Some(1)),
        "{read}"
    );
    let api = Discovery {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        base: format!("http://{discovery}"),
    };

    // Two pools, and a Proxy that only says it is pool-a's: anyone who may create a Proxy
    // can write that attribute.
    let client = cluster.server.client().unwrap();
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), "default");
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    for name in ["pool-a", "pool-b"] {
        pools.create(&PostParams::default(), &pool(name)).await.unwrap();
    }
    let spoof_backend = support::Tinyproxy::start(&[]);
    let mut spoof = common::external_spec(spoof_backend.port);
    spoof.attributes.insert("pool".into(), "pool-a".into());
    spoof.max_leases = Some(CAPACITY as i32);
    proxies
        .create(&PostParams::default(), &Proxy::new("spoof", spoof))
        .await
        .unwrap();
    for name in ["pool-a", "pool-b"] {
        wait_up(&pools, name).await;
    }
    wait_for_proxy(&proxies, "spoof", "Ready", PATIENCE, |p| {
        p.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Ready))
    })
    .await;
    let (pool_a, pool_b) = (
        member_ids(&proxies, "pool-a").await,
        member_ids(&proxies, "pool-b").await,
    );
    assert_eq!((pool_a.len(), pool_b.len()), (MEMBERS, MEMBERS));
    let mut everything: Vec<String> = pool_a.iter().chain(&pool_b).cloned().collect();
    everything.push("default/spoof".into());
    everything.sort();
    api.wait_healthy(TEAM_B, &everything).await;

    // The list: only pool-a's members for team-a, whatever it filters on.
    assert_eq!(api.listed(TEAM_A, "").await, pool_a);
    assert_eq!(api.listed(TEAM_A, "?attr.pool=pool-a").await, pool_a, "not the spoof");
    assert_eq!(api.listed(TEAM_A, "?attr.pool=pool-b").await, Vec::<String>::new());
    assert_eq!(api.listed(TEAM_B, "").await, everything, "no scope: every proxy");

    // Leases: team-a fills pool-a, lease after lease, and never gets anything else.
    let bodies = [
        "{}",
        r#"{"selector": {"pool": "pool-a"}}"#,
        r#"{"target": "shop.example"}"#,
    ];
    let (granted, held) = leases(&api, TEAM_A, &bodies, MEMBERS * CAPACITY).await;
    let outside: Vec<&String> = granted.iter().filter(|id| !pool_a.contains(id)).collect();
    assert!(outside.is_empty(), "team-a was granted {outside:?}, outside pool-a");
    assert_eq!(
        granted.iter().collect::<BTreeSet<_>>().len(),
        MEMBERS,
        "both members leased"
    );
    // Full: refused with pool-a's counts alone, though three other proxies have room.
    for body in bodies {
        let (status, refused) = api.lease(TEAM_A, body).await;
        assert_eq!(status, 409, "{body}: {refused}");
        assert_eq!(
            (&refused["considered"], &refused["atCapacity"]),
            (&json!(2), &json!(2)),
            "{refused}"
        );
    }
    // Another pool matches nothing, as a pool that does not exist.
    let (status, refused) = api.lease(TEAM_A, r#"{"selector": {"pool": "pool-b"}}"#).await;
    assert_eq!((status, &refused["considered"]), (409, &json!(0)), "{refused}");
    for lease in &held {
        api.release(TEAM_A, lease).await;
    }

    // team-b, with no scope, is granted members of both pools (every lease held, so each goes
    // to a proxy with the fewest).
    let (granted, held) = leases(&api, TEAM_B, &["{}"], 2 * everything.len()).await;
    assert!(granted.iter().any(|id| pool_a.contains(id)), "{granted:?}");
    assert!(granted.iter().any(|id| pool_b.contains(id)), "{granted:?}");
    for lease in &held {
        api.release(TEAM_B, lease).await;
    }

    // The file changes team-a's scope to pool-b: in force once the manager says so.
    config.update_keys(&[(
        "clients.yaml",
        "clients:\n  team-a:\n    scope:\n      pools: [pool-b]\n",
    )]);
    op.wait_msg("Discovery clients config changed; the new budgets and scopes are in force");
    assert_eq!(api.listed(TEAM_A, "").await, pool_b);
    let (granted, held) = leases(
        &api,
        TEAM_A,
        &["{}", r#"{"target": "shop.example"}"#],
        MEMBERS * CAPACITY,
    )
    .await;
    assert!(granted.iter().all(|id| pool_b.contains(id)), "{granted:?}");
    for lease in &held {
        api.release(TEAM_A, lease).await;
    }
    // A file that cannot be used keeps that scope.
    config.update_keys(&[("clients.yaml", "clients:\n  team-a:\n    scope:\n      pools: []\n")]);
    let kept = op.wait_msg("WARNING: Discovery clients config cannot be used; the budgets and scopes in force stay");
    let problem = kept["problem"].as_str().unwrap_or_default();
    assert!(problem.contains(r#"client "team-a": scope.pools is empty"#), "{kept}");
    assert_eq!(api.listed(TEAM_A, "").await, pool_b);

    // The pools go with their members (their tinyproxies outlive the operator otherwise).
    for name in ["pool-a", "pool-b"] {
        let uid = pools.get(name).await.unwrap().uid().unwrap();
        pools.delete(name, &DeleteParams::default()).await.unwrap();
        let gone = kube::runtime::wait::await_condition(
            pools.clone(),
            name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        tokio::time::timeout(PATIENCE, gone)
            .await
            .expect("the pool goes once its members are gone")
            .unwrap();
    }
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    assert!(!op.output().contains("token-value"), "a token reached the log");
    let left: Vec<_> = std::fs::read_dir(&state)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "instances left in the state directory: {left:?}");
}
