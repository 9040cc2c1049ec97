//! ProxyPools end to end: the shipped operator on the in-memory API server, with the local
//! provider (real tinyproxy processes) probed through a real TLS target.
//!
//! One pool of 5 with 1 standby lives through the whole test, in order:
//!
//! 1. It comes up: 5 active members and 1 standby, all Ready.
//! 2. An active member's tinyproxy is killed. A standby is promoted (its `Promoted` event comes
//!    before the new standby's `MemberCreated`), the dead member is drained and deleted, and one
//!    failure makes exactly one create.
//! 3. A template change rolls every member.
//! 4. `maxAge` rotates every member while a client holds and renews leases on the pool: every
//!    lease is granted, and every leased proxy carries a request until the client releases it.
//! 5. `kubectl scale ppool --replicas=3` (the scale subresource) drains two members.
//! 6. Deleting the pool drains and deletes its members, then the pool goes, and no tinyproxy is
//!    left.
//!
//! A second test runs a pool with `autoscale` from zero to its `max` and back.
//!
//! What the in-memory server does not cover: a real API server's garbage collector (the pool's
//! finalizer does the work here, so the difference does not show) and watch delays of a loaded
//! cluster.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{PATIENCE, cluster, start_probing};
use egress_api::{LABEL_POOL, LABEL_POOL_ROLE, LABEL_POOL_TEMPLATE_HASH, Proxy, ProxyPool};
use egress_testkit as support;
use futures::TryStreamExt as _;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use serde_json::json;
use tokio::sync::watch;

const POOL: &str = "fleet";
const TOKEN: &str = "crawler-token";

/// The pool's Events (reason, note), in the order they came, and a signal on each new one.
#[derive(Clone)]
struct PoolEvents {
    seen: Arc<Mutex<Vec<(String, String)>>>,
    changed: watch::Receiver<usize>,
}

impl PoolEvents {
    fn start(client: kube::Client) -> Self {
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let (tx, changed) = watch::channel(0);
        let kept = seen.clone();
        let api: Api<Event> = Api::namespaced(client, "default");
        tokio::spawn(async move {
            let stream = watcher(api, watcher::Config::default()).applied_objects();
            let mut stream = std::pin::pin!(stream);
            let mut names = std::collections::HashSet::new();
            while let Ok(Some(e)) = stream.try_next().await {
                let about_pool = e
                    .regarding
                    .as_ref()
                    .is_some_and(|r| r.kind.as_deref() == Some("ProxyPool"));
                if !about_pool || !names.insert(e.name_any()) {
                    continue;
                }
                let count = {
                    let mut list = kept.lock().unwrap();
                    list.push((e.reason.unwrap_or_default(), e.note.unwrap_or_default()));
                    list.len()
                };
                // Sent with the list unlocked: a waiter reads the list while it holds the
                // channel's value, so holding both here in the other order would deadlock.
                tx.send_replace(count);
            }
        });
        Self { seen, changed }
    }

    fn all(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits (at most [`PATIENCE`]) until `pred` holds for the events so far.
    async fn wait(&mut self, what: &str, pred: impl Fn(&[(String, String)]) -> bool) -> Vec<(String, String)> {
        self.wait_within(PATIENCE, what, pred).await
    }

    async fn wait_within(
        &mut self,
        patience: Duration,
        what: &str,
        pred: impl Fn(&[(String, String)]) -> bool,
    ) -> Vec<(String, String)> {
        let seen = self.seen.clone();
        let waited = tokio::time::timeout(patience, self.changed.wait_for(|_| pred(&seen.lock().unwrap())))
            .await
            .is_ok();
        assert!(waited, "{what}: not within {patience:?}; events: {:#?}", self.all());
        self.all()
    }
}

/// Waits (at most [`PATIENCE`]) until the pool is as `cond` says.
async fn wait_pool(api: &Api<ProxyPool>, what: &str, cond: impl Fn(&ProxyPool) -> bool + Send + 'static) -> ProxyPool {
    wait_pool_named(api, POOL, what, cond).await
}

/// As [`wait_pool`], for the pool `name`.
async fn wait_pool_named(
    api: &Api<ProxyPool>,
    name: &str,
    what: &str,
    cond: impl Fn(&ProxyPool) -> bool + Send + 'static,
) -> ProxyPool {
    let wait =
        kube::runtime::wait::await_condition(api.clone(), name, move |p: Option<&ProxyPool>| p.is_some_and(&cond));
    match tokio::time::timeout(PATIENCE, wait).await {
        Ok(found) => found.unwrap().unwrap(),
        Err(_) => panic!(
            "the pool is not {what} within {PATIENCE:?}: {:?}",
            api.get(name).await.map(|p| (p.spec.replicas, p.status))
        ),
    }
}

/// The pool at 5 active members and 1 standby, all Ready and of the current template, with no
/// member left draining, as a pass of the current generation saw it.
fn settled(p: &ProxyPool) -> bool {
    settled_at(p, 5)
}

/// As [`settled`], with `active` active members.
fn settled_at(p: &ProxyPool, active: i32) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.observed_generation == p.meta().generation
            && (s.replicas, s.available_replicas, s.standby_ready, s.updated_replicas)
                == (active, active, 1, active + 1)
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Progressing" && c.reason == "PoolSettled")
    })
}

/// The pool's members, those being deleted (their instance going) left out.
async fn members(api: &Api<Proxy>) -> Vec<Proxy> {
    let mut all = api
        .list(&ListParams::default().labels(&format!("{LABEL_POOL}={POOL}")))
        .await
        .unwrap()
        .items;
    all.retain(|p| p.metadata.deletion_timestamp.is_none());
    all
}

fn role(p: &Proxy) -> &str {
    p.labels().get(LABEL_POOL_ROLE).map_or("", String::as_str)
}

fn count(events: &[(String, String)], reason: &str) -> usize {
    events.iter().filter(|(r, _)| r == reason).count()
}

/// Kills the tinyproxy of a local instance (`local/<name>`) under `state`.
fn kill_instance(state: &std::path::Path, provider_id: &str) {
    let name = provider_id.strip_prefix("local/").expect("a local provider id");
    let pid: u32 = std::fs::read_to_string(state.join(name).join("launched.pid"))
        .expect("the instance's pid file")
        .trim()
        .parse()
        .unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -KILL {pid}");
}

/// An operator with the local provider on a test cluster of its own, probing through a real TLS
/// target, with its discovery API and metrics served.
struct Setup {
    pki: support::Pki,
    target: std::net::SocketAddr,
    /// The local provider's state directory.
    state: std::path::PathBuf,
    cluster: common::Cluster,
    op: common::Operator,
    discovery: String,
    metrics: String,
    client: kube::Client,
}

async fn setup(name: &str) -> Setup {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = support::pki();
    let (target, _) = support::tls_target(&pki).await;
    setup_probing(name, pki, target).await
}

/// As [`setup`], probing through the TLS target at `target`, made with `pki`.
async fn setup_probing(name: &str, pki: support::Pki, target: std::net::SocketAddr) -> Setup {
    let state = support::scratch_dir(&format!("operator-{name}-state")).join("state");
    let providers = format!(
        "providers:\n  - name: local\n    type: local\n    local:\n      stateDir: {}\n      connectPorts: [{}]\n",
        state.display(),
        target.port()
    );
    let cluster = cluster(name, &providers).await;
    let health_url = format!("https://127.0.0.1:{}/204", target.port());
    let (mut op, discovery) = start_probing(
        &cluster,
        &pki.ca_pem,
        &health_url,
        &["--metrics-bind-address=127.0.0.1:0", "--metrics-secure=false"],
        &[],
    );
    let metrics = op.wait_msg("Serving metrics")["address"].as_str().unwrap().to_string();
    let client = cluster.server.client().unwrap();
    Setup {
        pki,
        target,
        state,
        cluster,
        op,
        discovery,
        metrics,
        client,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_replaces_rolls_and_rotates_its_members_without_cutting_a_lease() {
    if !support::tinyproxy_available() {
        return;
    }
    let Setup {
        pki,
        target,
        state,
        cluster,
        mut op,
        discovery,
        metrics,
        client,
    } = setup("pool-e2e").await;
    let mut events = PoolEvents::start(client.clone());
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), "default");
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");

    // 1. Up: 5 + 1.
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": POOL},
        "spec": {
            "replicas": 5, "standby": 1,
            "template": {
                "metadata": {"labels": {"rev": "1"}},
                "spec": {
                    "provider": "local", "maxLeases": 2,
                    "attributes": {"geo": "eu"},
                    "credentials": {"type": "Generated"},
                    "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 2}
                }
            }
        }
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    wait_pool(&pools, "up at 5 + 1", settled).await;
    let first = members(&proxies).await;
    assert_eq!(first.iter().filter(|p| role(p) == "active").count(), 5);
    assert_eq!(first.iter().filter(|p| role(p) == "standby").count(), 1);
    for m in &first {
        assert_eq!(m.spec.attributes["pool"], POOL, "a lease selector can name the pool");
        assert_eq!(m.spec.attributes["geo"], "eu");
        assert_eq!(m.labels()["rev"], "1");
        let owner = &m.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("ProxyPool", POOL));
    }
    // The standby is listed, and held back from leases.
    let standby = first.iter().find(|p| role(p) == "standby").unwrap().name_any();
    let listed = pool_list(&reqwest::Client::new(), &discovery).await;
    assert_eq!(listed["count"], 6, "{listed}");
    let shown = listed["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == format!("default/{standby}"))
        .unwrap();
    assert_eq!(shown["poolRole"], "standby");
    let creates_before = count(&events.all(), "MemberCreated");
    assert_eq!(creates_before, 6);

    // 2. A member's proxy dies: a standby takes its place, and one new standby is made.
    let victim = first.iter().find(|p| role(p) == "active").unwrap();
    let victim_name = victim.name_any();
    kill_instance(&state, &victim.status.as_ref().unwrap().provider_id);
    let seen = events
        .wait("the standby promoted and a new standby made", |e| {
            e.iter().any(|(r, _)| r == "Promoted") && count(e, "MemberCreated") > creates_before
        })
        .await;
    let promoted = seen.iter().position(|(r, _)| r == "Promoted").unwrap();
    let created = seen
        .iter()
        .enumerate()
        .filter(|(_, (r, _))| r == "MemberCreated")
        .nth(creates_before)
        .map(|(i, _)| i)
        .unwrap();
    assert!(promoted < created, "the promotion waits for no create: {seen:#?}");
    assert!(seen[promoted].1.contains(&standby), "{:?}", seen[promoted]);
    let gone = events
        .wait("the dead member deleted", |e| {
            e.iter().any(|(r, n)| r == "MemberDeleted" && n.contains(&victim_name))
        })
        .await;
    assert!(
        gone.iter()
            .any(|(r, n)| r == "Draining" && n.contains(&victim_name) && n.contains("failed")),
        "{gone:#?}"
    );
    wait_pool(&pools, "back at 5 + 1", settled).await;
    assert_eq!(
        count(&events.all(), "MemberCreated"),
        creates_before + 1,
        "one failure, one create: {:#?}",
        events.all()
    );

    // 3. A template change rolls every member.
    let old_hash = first[0].labels()[LABEL_POOL_TEMPLATE_HASH].clone();
    pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"metadata": {"labels": {"rev": "2"}}}}})),
        )
        .await
        .unwrap();
    wait_pool(&pools, "rolled", settled).await;
    let rolled = members(&proxies).await;
    assert!(
        rolled
            .iter()
            .all(|m| m.labels()[LABEL_POOL_TEMPLATE_HASH] != old_hash && m.labels()["rev"] == "2"),
        "{:?}",
        rolled
            .iter()
            .map(|m| (m.name_any(), m.labels().clone()))
            .collect::<Vec<_>>()
    );

    // 4. Rotation by age under a client that holds and renews leases.
    let originals: Vec<String> = rolled.iter().map(|m| m.name_any()).collect();
    let stop = tokio_util::sync::CancellationToken::new();
    let crawler = tokio::spawn(renewing_client(
        discovery.clone(),
        pki.ca_pem.clone(),
        target,
        stop.clone(),
    ));
    pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxAge": "20s"}})),
        )
        .await
        .unwrap();
    // A liveness bound for six replacements, each a create, a probe and a drain.
    events
        .wait_within(3 * PATIENCE, "every member of the rollout rotated away", |e| {
            originals.iter().all(|n| {
                e.iter()
                    .any(|(r, note)| r == "MemberDeleted" && note.contains(n.as_str()))
            })
        })
        .await;
    stop.cancel();
    let run = tokio::time::timeout(PATIENCE, crawler)
        .await
        .expect("the client stops")
        .unwrap();
    assert_eq!(
        run.refused,
        Vec::<String>::new(),
        "lease requests refused during rotation"
    );
    assert_eq!(
        run.cut,
        Vec::<String>::new(),
        "leased proxies that stopped carrying traffic"
    );
    assert!(
        run.leases >= 2,
        "the client renewed off a draining member: {} leases, {} requests",
        run.leases,
        run.requests
    );
    eprintln!(
        "the client took {} leases and sent {} requests",
        run.leases, run.requests
    );
    let rotations = count(&events.all(), "Draining");
    assert!(rotations >= originals.len(), "{rotations}");
    pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxAge": null}})),
        )
        .await
        .unwrap();

    // `kubectl scale`, through the scale subresource: two members drain and go.
    if let Some(kubectl) = egress_testkit::on_path("kubectl", "kubectl scale of a pool") {
        let out = std::process::Command::new(kubectl)
            .args(["scale", "ppool", POOL, "--replicas=3", "--request-timeout=20s"])
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("HOME", &cluster.dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let scaled = wait_pool(&pools, "scaled to 3 + 1", |p| p.spec.replicas == 3 && settled_at(p, 3)).await;
        assert_eq!(scaled.status.unwrap().selector, format!("{LABEL_POOL}={POOL}"));
        events
            .wait("two members drained for the scale-down", |e| {
                e.iter()
                    .filter(|(r, n)| r == "Draining" && n.contains("scale down"))
                    .count()
                    == 2
            })
            .await;
        // The pool's families, as a scrape sees them now.
        let scraped = scrape(&metrics).await;
        let line = |prefix: &str| metric(&scraped, prefix);
        let labels = format!(r#"namespace="default",pool="{POOL}""#);
        assert_eq!(
            line(&format!(
                r#"proxy_operator_pool_members{{{labels},role="active",ready="true"}}"#
            )),
            3.0
        );
        assert_eq!(
            line(&format!(
                r#"proxy_operator_pool_members{{{labels},role="standby",ready="true"}}"#
            )),
            1.0
        );
        assert!(line(&format!("proxy_operator_pool_promotions_total{{{labels}}}")) >= 1.0);
        assert_eq!(
            line(&format!(
                r#"proxy_operator_pool_drains_total{{{labels},reason="failed"}}"#
            )),
            1.0
        );
        assert_eq!(
            line(&format!(
                r#"proxy_operator_pool_drains_total{{{labels},reason="scale_down"}}"#
            )),
            2.0
        );
        assert_eq!(line(&format!("proxy_operator_pool_leases{{{labels}}}")), 0.0);
        assert_eq!(
            line(&format!("proxy_operator_pool_lease_capacity{{{labels}}}")),
            6.0,
            "3 members of 2"
        );
    }

    // 6. Deleting the pool drains and deletes its members, then the pool goes.
    delete_and_wait(&pools, POOL).await;
    let left = proxies
        .list(&ListParams::default().labels(&format!("{LABEL_POOL}={POOL}")))
        .await
        .unwrap()
        .items;
    assert_eq!(left.len(), 0, "members outlived their pool");
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    assert_no_instance_left(&state);
}

/// Deletes the pool `name` and waits until it is gone, which it is only once its members are.
async fn delete_and_wait(pools: &Api<ProxyPool>, name: &str) {
    let uid = pools.get(name).await.unwrap().uid().unwrap();
    pools.delete(name, &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        PATIENCE,
        kube::runtime::wait::await_condition(pools.clone(), name, kube::runtime::wait::conditions::is_deleted(&uid)),
    )
    .await
    .expect("the pool goes once its members are gone")
    .unwrap();
}

/// Every instance the local provider made under `state` is gone (its tinyproxy stopped with it).
fn assert_no_instance_left(state: &std::path::Path) {
    let left: Vec<_> = std::fs::read_dir(state)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "instances left in the state directory: {left:?}");
}

/// `autoscale` on the shipped operator (local provider, real tinyproxy). A pool of `min: 0`
/// starts at zero; the first lease request naming it is refused with the documented answer and
/// wakes it, and the client's retries while its member comes up grow it no further; leases held
/// past the target utilisation grow it up to `max`; once they are released and the scale-down
/// delay (an hour until then, so no step depends on how fast the machine is) is made short, it
/// drains back to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaled_pool_wakes_on_demand_grows_with_its_leases_and_goes_back_to_zero() {
    const AUTO: &str = "burst";
    if !support::tinyproxy_available() {
        return;
    }
    // The cluster is bound so that it lives to the end of the test.
    let Setup {
        cluster: _cluster,
        mut op,
        discovery,
        metrics,
        client,
        ..
    } = setup("pool-autoscale").await;
    let mut events = PoolEvents::start(client.clone());
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), "default");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    // Members of 2 leases, sized for 50 % of that: every leased member wants another.
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": AUTO},
        "spec": {
            "replicas": 0,
            "autoscale": {"min": 0, "max": 3, "targetUtilization": 50, "scaleDownDelay": "1h"},
            "template": {"spec": {
                "provider": "local", "maxLeases": 2,
                "attributes": {"geo": "eu"},
                "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 2}
            }}
        }
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    wait_pool_named(&pools, AUTO, "looked at, at zero", at_size(0)).await;

    // 1. At zero: the first request is refused as documented, and wakes the pool.
    let (status, refused) = lease(&http, &discovery, AUTO).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(
        (&refused["error"], &refused["considered"]),
        (&json!("no_match"), &json!(0))
    );
    let woke = events
        .wait("woken by the refusal", |e| e.iter().any(|(r, _)| r == "Scaled"))
        .await;
    let scaled: Vec<&String> = woke.iter().filter(|(r, _)| r == "Scaled").map(|(_, n)| n).collect();
    assert!(
        scaled[0].contains("0 → 1") && scaled[0].contains("1 lease requests refused"),
        "{scaled:?}"
    );
    // The client retries, as a crawler does on `no_match`, until its member is up. These
    // refusals come while the member the pool asked for is on its way: they must not grow it
    // again (step 2's `1 → 2` is the leases', and the steps are checked at the end).
    let mut retries = tokio::time::interval(Duration::from_millis(200));
    let first = tokio::time::timeout(PATIENCE, async {
        loop {
            retries.tick().await;
            let (status, grant) = lease(&http, &discovery, AUTO).await;
            match status {
                201 => break grant,
                409 => {}
                _ => panic!("{status}: {grant}"),
            }
        }
    })
    .await
    .expect("a lease once the woken member is Ready");
    wait_pool_named(&pools, AUTO, "at 1, Ready", at_size(1)).await;

    // 2. Two leases fill the member: 100 % of its capacity wants 2 members.
    let mut leases = vec![first["leaseID"].as_str().unwrap().to_owned()];
    leases.push(granted(&http, &discovery, AUTO).await);
    scaled_to(&mut events, &pools, AUTO, "1 → 2", 2).await;

    // 3. Four leases want 4 members; `max` holds it at 3.
    for _ in 0..2 {
        leases.push(granted(&http, &discovery, AUTO).await);
    }
    scaled_to(&mut events, &pools, AUTO, "2 → 3", 3).await;

    // 4. Every lease released, and the delay made short: the pool drains to zero, no member
    // left.
    for id in leases {
        let released = http
            .delete(format!("http://{discovery}/v1/leases/{id}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(released.status(), 204);
    }
    pools
        .patch(
            AUTO,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoscale": {"scaleDownDelay": "2s"}}})),
        )
        .await
        .unwrap();
    // (A look between two of the releases may make it two steps down, say 3 → 2 → 0.)
    events
        .wait("back to zero", |e| {
            e.iter().any(|(r, n)| r == "Scaled" && n.contains(" → 0 members"))
        })
        .await;
    wait_pool_named(&pools, AUTO, "at zero, members gone", at_size(0)).await;
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    tokio::time::timeout(PATIENCE, async {
        loop {
            let left = proxies
                .list(&ListParams::default().labels(&format!("{LABEL_POOL}={AUTO}")))
                .await
                .unwrap()
                .items;
            if left.is_empty() {
                break;
            }
            // The members go one delete at a time; their removal is watched, not slept on.
            let (name, uid) = (left[0].name_any(), left[0].uid().unwrap());
            let gone = kube::runtime::wait::conditions::is_deleted(&uid);
            kube::runtime::wait::await_condition(proxies.clone(), &name, gone)
                .await
                .unwrap();
        }
    })
    .await
    .expect("the scaled-down members go");
    let all = events.all();
    let steps: Vec<&str> = all
        .iter()
        .filter(|(r, _)| r == "Scaled")
        .filter_map(|(_, n)| n.split(" members").next())
        .collect();
    assert_eq!(
        steps[..3],
        ["autoscale: 0 → 1", "autoscale: 1 → 2", "autoscale: 2 → 3"],
        "{all:#?}"
    );
    assert_eq!(
        all.iter()
            .filter(|(r, n)| r == "Draining" && n.contains("scale down"))
            .count(),
        3,
        "{all:#?}"
    );
    let scraped = scrape(&metrics).await;
    let changes = |direction: &str| {
        metric(
            &scraped,
            &format!(
                r#"proxy_operator_pool_autoscaled_total{{namespace="default",pool="{AUTO}",direction="{direction}"}}"#
            ),
        )
    };
    assert_eq!(changes("up"), 3.0);
    assert!(changes("down") >= 1.0);

    pools.delete(AUTO, &DeleteParams::default()).await.unwrap();
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}

/// The pool whose probe target is down from its start.
const DARK: &str = "dark";

/// How long the pool with its probe target down is watched making nothing: the issue's "next
/// two minutes". Its members' grace is 4 s, so a pool that replaced them would make new ones
/// many times over in this window.
const QUIET: Duration = Duration::from_secs(120);

/// The pool's `RemediationAllowed` condition: (reason, message).
fn remediation_message(p: &ProxyPool) -> (String, String) {
    let c = p
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "RemediationAllowed")
        .unwrap();
    (c.reason.clone(), c.message.clone())
}

/// The pool's `RemediationAllowed` condition: (status, reason).
fn remediation(p: &ProxyPool) -> Option<(String, String)> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "RemediationAllowed")?;
    Some((format!("{:?}", c.status), c.reason.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_probe_target_is_down_stops_replacing_and_recovers_without_a_create() {
    if !support::tinyproxy_available() {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = support::pki();
    let mut target = support::StoppableTlsTarget::start(&pki).await;
    let addr = target.addr();
    target.stop().await;
    let Setup {
        mut op,
        metrics,
        client,
        state,
        cluster: _cluster,
        ..
    } = setup_probing("pool-dark", pki, addr).await;
    let mut events = PoolEvents::start(client.clone());
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), "default");

    // 5 + 1 with the target down from the start: every member fails its probes.
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": DARK},
        "spec": {
            "replicas": 5, "standby": 1, "startupGrace": "4s",
            "template": {"spec": {
                "provider": "local",
                "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 2}
            }}
        }
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let stopped = wait_pool_named(&pools, DARK, "holding its failed members", |p| {
        remediation(p).is_some_and(|(_, reason)| reason == "TooManyUnhealthy")
    })
    .await;
    let status = stopped.status.clone().unwrap();
    assert!(status.failed_members > 2, "more than 40 % of 6: {status:?}");
    let (_, said) = remediation_message(&stopped);
    assert!(
        said.contains("does not answer the operator directly either"),
        "the operator fetched the target itself: {said}"
    );
    let made = count(&events.all(), "MemberCreated");
    assert!(
        made <= 5 + 1 + 1,
        "at most replicas + standby + maxSurge: {:#?}",
        events.all()
    );
    let scraped = scrape(&metrics).await;
    let allowed = format!(r#"proxy_operator_pool_remediation_allowed{{namespace="default",pool="{DARK}"}}"#);
    assert_eq!(metric(&scraped, &allowed), 0.0);
    assert_eq!(metric(&scraped, "proxy_operator_probe_target_reachable "), 0.0);

    // Nothing more is made while the target stays down.
    let seen = events.seen.clone();
    let more = tokio::time::timeout(
        QUIET,
        events
            .changed
            .wait_for(|_| count(&seen.lock().unwrap(), "MemberCreated") > made),
    )
    .await
    .is_ok();
    assert!(
        !more,
        "a member was made while the target was down: {:#?}",
        events.all()
    );
    let all = events.all();
    assert_eq!(
        count(&all, "RemediationStopped"),
        1,
        "one Warning, not one per pass: {all:#?}"
    );
    let warning = all.iter().find(|(r, _)| r == "RemediationStopped").unwrap();
    assert!(warning.1.contains("more than maxUnhealthy 40%"), "{warning:?}");

    // The target comes back: the same members turn Ready, and none is replaced.
    target.resume().await;
    wait_pool_named(&pools, DARK, "Ready again with the same members", |p| {
        p.status.as_ref().is_some_and(|s| {
            (s.replicas, s.available_replicas, s.standby_ready) == (5, 5, 1)
                && s.failed_members == 0
                && remediation(p).is_some_and(|(status, _)| status == "True")
        })
    })
    .await;
    let all = events.all();
    assert_eq!(count(&all, "MemberCreated"), made, "no replacement: {all:#?}");
    assert_eq!(count(&all, "RemediationResumed"), 1, "{all:#?}");
    let scraped = scrape(&metrics).await;
    assert_eq!(metric(&scraped, &allowed), 1.0);

    // Its members go with it before the operator stops: their tinyproxies with them.
    delete_and_wait(&pools, DARK).await;
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    assert_no_instance_left(&state);
}

/// The operator's metrics page, as a scrape sees it now.
async fn scrape(metrics: &str) -> String {
    reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the sample in `scraped` whose line starts with `prefix`.
fn metric(scraped: &str, prefix: &str) -> f64 {
    let found = scraped.lines().find(|l| l.starts_with(prefix));
    let found = found.unwrap_or_else(|| panic!("no {prefix} in\n{scraped}"));
    found.rsplit(' ').next().unwrap().parse().unwrap()
}

/// A lease on `pool`, which must be granted: its id.
async fn granted(http: &reqwest::Client, discovery: &str, pool: &str) -> String {
    let (status, grant) = lease(http, discovery, pool).await;
    assert_eq!(status, 201, "{grant}");
    grant["leaseID"].as_str().unwrap().to_owned()
}

/// Waits for the autoscaler's `step` (`"1 → 2"`) on `pool`, then for its `n` members Ready.
async fn scaled_to(events: &mut PoolEvents, pools: &Api<ProxyPool>, pool: &str, step: &str, n: i32) {
    events
        .wait(&format!("scaled {step}"), |e| {
            e.iter().any(|(r, note)| r == "Scaled" && note.contains(step))
        })
        .await;
    wait_pool_named(pools, pool, &format!("at {n}, Ready"), at_size(n)).await;
}

/// The pool asks for `n` members and has them all leasable, as a pass of its current
/// generation saw it.
fn at_size(n: i32) -> impl Fn(&ProxyPool) -> bool + Send + 'static {
    move |p| {
        p.spec.replicas == n
            && p.status.as_ref().is_some_and(|s| {
                s.observed_generation == p.meta().generation && s.available_replicas == n && s.replicas == n
            })
    }
}

/// A lease request naming `pool`: the status and the answer.
async fn lease(http: &reqwest::Client, discovery: &str, pool: &str) -> (u16, serde_json::Value) {
    let answer = http
        .post(format!("http://{discovery}/v1/leases"))
        .bearer_auth(TOKEN)
        .body(format!(r#"{{"selector": {{"pool": "{pool}"}}, "ttlSeconds": 300}}"#))
        .send()
        .await
        .expect("the discovery API answers");
    let status = answer.status().as_u16();
    (status, answer.json().await.expect("a JSON answer"))
}

/// The discovery API's list of the pool's members.
async fn pool_list(http: &reqwest::Client, discovery: &str) -> serde_json::Value {
    http.get(format!("http://{discovery}/v1/proxies?attr.pool={POOL}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// What the renewing client saw.
struct ClientRun {
    /// Leases taken.
    leases: usize,
    /// Requests sent through a held lease.
    requests: usize,
    /// Lease requests answered with anything but 201.
    refused: Vec<String>,
    /// Requests through a held lease that failed: its proxy stopped before the lease ended.
    cut: Vec<String>,
}

/// How long the client keeps using a lease once its proxy is draining: longer than the pool
/// would wait (its settle time, then its poll) to delete a member it believed free, so a drain
/// that did not wait for the lease would break the client's requests.
const HOLD_WHILE_DRAINING: Duration = Duration::from_secs(10);

/// A crawler on the pool: sends request after request through the proxy it leased. When the
/// list shows that proxy draining, it keeps using it for [`HOLD_WHILE_DRAINING`], then renews:
/// takes the next lease and releases the old one. Until `stop`.
async fn renewing_client(
    discovery: String,
    ca_pem: String,
    target: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
) -> ClientRun {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut run = ClientRun {
        leases: 0,
        requests: 0,
        refused: Vec::new(),
        cut: Vec::new(),
    };
    let acquire = |http: reqwest::Client| {
        let discovery = discovery.clone();
        async move {
            let answer = http
                .post(format!("http://{discovery}/v1/leases"))
                .bearer_auth(TOKEN)
                .body(format!(r#"{{"selector": {{"pool": "{POOL}"}}, "ttlSeconds": 300}}"#))
                .send()
                .await
                .expect("the discovery API answers");
            let status = answer.status().as_u16();
            let grant: serde_json::Value = answer.json().await.expect("a JSON answer");
            (status == 201)
                .then(|| {
                    (
                        grant["leaseID"].as_str().unwrap().to_owned(),
                        grant["proxy"]["id"].as_str().unwrap().to_owned(),
                        grant["proxy"]["url"].as_str().unwrap().to_owned(),
                    )
                })
                .ok_or_else(|| grant.to_string())
        }
    };
    let release = |http: reqwest::Client, lease: String| {
        let discovery = discovery.clone();
        async move {
            let released = http
                .delete(format!("http://{discovery}/v1/leases/{lease}"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap();
            assert_eq!(released.status(), 204);
        }
    };
    let mut held = match acquire(http.clone()).await {
        Ok(l) => l,
        Err(refused) => {
            run.refused.push(refused);
            return run;
        }
    };
    run.leases += 1;
    let mut draining_since: Option<std::time::Instant> = None;
    while !stop.is_cancelled() {
        let (lease, proxy, url) = &held;
        let through = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(url).unwrap())
            .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let answer = through
            .get(format!("https://127.0.0.1:{}/204", target.port()))
            .send()
            .await;
        run.requests += 1;
        if !answer.as_ref().is_ok_and(|a| a.status() == 204) {
            run.cut.push(format!("{proxy}: {answer:?}"));
            if run.cut.len() >= 10 {
                break;
            }
        }
        let listed = pool_list(&http, &discovery).await;
        let role = listed["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == proxy.as_str())
            .map_or("gone", |p| p["poolRole"].as_str().unwrap_or(""));
        if role == "gone" {
            run.cut
                .push(format!("{proxy} left the list while its lease {lease} was held"));
            break;
        }
        if role != "draining" {
            continue;
        }
        let since = *draining_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < HOLD_WHILE_DRAINING {
            continue;
        }
        match acquire(http.clone()).await {
            Ok(next) => {
                run.leases += 1;
                let (old, _, _) = std::mem::replace(&mut held, next);
                release(http.clone(), old).await;
                draining_since = None;
            }
            Err(refused) => {
                run.refused.push(refused);
                if run.refused.len() >= 10 {
                    break;
                }
            }
        }
    }
    // The last lease goes too: a lease held on would hold its member's drain.
    release(http, held.0).await;
    run
}
