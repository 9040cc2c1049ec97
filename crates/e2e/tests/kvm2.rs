//! The shipped binary with a kvm2 entry on the local hypervisor (`cargo xtask hypervisor up`),
//! end to end: a Managed Proxy gets a real domain booting the test guest (the image downloaded
//! by the operator from a server in this test and uploaded over SSH), the health engine proves
//! it with a CONNECT through the guest to a TLS target on the host, the discovery API leases it,
//! a request through the lease's ip:port reaches a target through the guest, and deleting the
//! Proxy removes the domain and its volumes (the cached base stays).
//!
//! A pool of 1 with 1 standby on the same host: the member's domain destroyed and undefined
//! behind the operator's back leaves a leasable proxy with no backend create on the path (the
//! standby's promotion comes before the new standby's create, in the order of the pool's Events;
//! `cargo xtask bench` times it).
//!
//! Skips without a hypervisor; fails under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1).

mod common;

use egress_testkit as support;

use egress_testkit::image_server;

use std::sync::Arc;
use std::time::Duration;

use common::{cluster, start_probing, wait_for_proxy};
use egress_api::{HealthCheckSpec, Phase, Proxy};
use egress_libvirt::HypervisorEnv;
use egress_libvirt::host::{Host, UNDEFINE_FLAGS};
use egress_libvirt_ssh::{DialOptions, Dialer, HostKeys, HostTarget, Pool, RemoteHost};
use egress_provider::OpCtx;
use futures::TryStreamExt as _;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt as _, watcher};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

/// A software-emulated guest boots in about half a minute; the first create also downloads and
/// uploads the image.
const BOOT_PATIENCE: Duration = Duration::from_secs(240);

fn seam(env: &HypervisorEnv) -> RemoteHost {
    let options = DialOptions::new(&env.ssh_key, HostKeys::KnownHosts(env.known_hosts.clone()));
    RemoteHost::new(
        HostTarget {
            name: "hv".into(),
            address: env.ssh_address.clone(),
            user: env.ssh_user.clone(),
            socket: env.libvirt_socket.clone(),
        },
        Arc::new(Pool::new(Arc::new(Dialer::new(options)))),
    )
}

/// [`common::kvm2_providers_file`] with the hypervisor's own SSH files.
fn providers_file(env: &HypervisorEnv, entry: &str, url: &str, digest: &str, bridge: &str) -> String {
    common::kvm2_providers_file(env, entry, (&env.ssh_key, &env.known_hosts), (url, digest), bridge)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kvm2_proxy_boots_is_leased_carries_traffic_and_is_removed() {
    let Some(env) = HypervisorEnv::for_test() else { return };
    let image = std::fs::read(&env.guest_image).unwrap();
    let digest: String = Sha256::digest(&image).iter().map(|b| format!("{b:02x}")).collect();
    let mirror = image_server::ImageServer::start(image, "127.0.0.1:0").await;
    // Targets the guest reaches on its bridge's host address.
    let pki = support::pki_for(&[&env.gateway]);
    let (probe_target, probe_seen) = support::tls_target_at(&pki, &env.gateway).await;
    let (target, target_seen) = support::http_target_at(&env.gateway).await;

    let entry = "kvm2-e2e";
    let providers = providers_file(&env, entry, &mirror.url(), &digest, &env.bridge);
    let cluster = cluster("kvm2-e2e", &providers).await;
    let health_url = format!("https://{}:{}/204", env.gateway, probe_target.port());
    let (mut op, discovery) = start_probing(&cluster, &pki.ca_pem, &health_url, &[], &[]);
    let server = &cluster.server;

    let api: Api<Proxy> = Api::namespaced(server.client().unwrap(), "default");
    let proxy = common::vm_proxy("vm-1", entry);
    api.create(&PostParams::default(), &proxy).await.unwrap();
    let ready = wait_for_proxy(&api, "vm-1", "Ready", BOOT_PATIENCE, |p| {
        p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready)
    })
    .await;
    let status = ready.status.clone().unwrap();
    let ip = status.ip.clone();
    assert!(!ip.is_empty(), "a Ready proxy has an address");
    let provider_id = status.provider_id.clone();
    assert!(provider_id.starts_with("hosts/hv/domains/proxy-"), "{provider_id}");
    assert!(
        !probe_seen.lock().unwrap().is_empty(),
        "the health probe never reached its target"
    );

    // Leased through the discovery API.
    let (_, grant) = common::lease(&discovery, "crawler-token", r#"{"target": "example.com"}"#).await;
    assert_eq!(grant["proxy"]["id"], "default/vm-1", "{grant}");
    assert_eq!(grant["proxy"]["ip"], ip.as_str(), "{grant}");
    let port = grant["proxy"]["port"].as_u64().unwrap();

    // A request through the lease's ip:port reaches the target through the guest.
    let tcp = tokio::net::TcpStream::connect((ip.as_str(), u16::try_from(port).unwrap()))
        .await
        .unwrap();
    let mut tunnel = BufReader::new(tcp);
    tunnel
        .get_mut()
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut line = String::new();
    tunnel.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "CONNECT answered {line:?}");
    line.clear();
    tunnel.read_line(&mut line).await.unwrap();
    tunnel
        .get_mut()
        .write_all(format!("GET /via-lease/204 HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    tunnel.read_line(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 204"), "the target answered {answer:?}");
    assert!(
        target_seen
            .lock()
            .unwrap()
            .iter()
            .any(|(l, _)| l.starts_with("GET /via-lease/204")),
        "the target never saw the request"
    );

    // Deleting the Proxy removes the domain and its volumes; the cached base stays.
    api.delete("vm-1", &DeleteParams::default()).await.unwrap();
    let gone = await_condition(api.clone(), "vm-1", |p: Option<&Proxy>| p.is_none());
    tokio::time::timeout(BOOT_PATIENCE, gone)
        .await
        .expect("the Proxy is not gone")
        .unwrap();
    let host = seam(&env);
    let cx = OpCtx::background().with_timeout(Duration::from_secs(60));
    let name = provider_id.rsplit('/').next().unwrap();
    let domains = host.domain_names(&cx).await.unwrap();
    assert!(!domains.iter().any(|d| d == name), "the domain is still defined");
    let volumes = host.volume_names(&cx, &env.pool).await.unwrap();
    assert!(
        !volumes.iter().any(|v| v.starts_with(name)),
        "volumes left: {volumes:?}"
    );
    assert!(
        volumes.contains(&format!("base-{entry}-test-image.qcow2")),
        "{volumes:?}"
    );
    assert!(
        volumes.contains(&format!("base-{entry}-test-image.qcow2.sha256")),
        "{volumes:?}"
    );

    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}

/// A bridge of the hypervisor's with nothing on it: no DHCP server, so a guest on it never gets
/// an address. Removed on drop.
struct BareBridge(String);

impl BareBridge {
    fn new() -> Self {
        // Linux allows 15 bytes in an interface name.
        let name = format!("egnd{}", std::process::id() % 100_000);
        let bridge = Self(name);
        ip(&["link", "add", &bridge.0, "type", "bridge"]);
        ip(&["link", "set", &bridge.0, "up"]);
        bridge
    }
}

impl Drop for BareBridge {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A guest that never gets an address (its bridge has no DHCP server) stays Provisioning until
/// `--provisioning-timeout`, then the operator deletes it and creates it again, saying why on
/// the Proxy and in a `Replacing` event (docs/controller.md); deleting the Proxy removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kvm2_guest_that_never_gets_an_address_is_replaced_at_the_provisioning_timeout() {
    let Some(env) = HypervisorEnv::for_test() else { return };
    let bridge = BareBridge::new();
    let image = std::fs::read(&env.guest_image).unwrap();
    let digest: String = Sha256::digest(&image).iter().map(|b| format!("{b:02x}")).collect();
    let mirror = image_server::ImageServer::start(image, "127.0.0.1:0").await;
    let pki = support::pki_for(&[&env.gateway]);
    let (probe_target, _) = support::tls_target_at(&pki, &env.gateway).await;
    let entry = "kvm2-noaddr";
    let providers = providers_file(&env, entry, &mirror.url(), &digest, &bridge.0);
    let cluster = cluster("kvm2-noaddr", &providers).await;
    let health_url = format!("https://{}:{}/204", env.gateway, probe_target.port());
    let (mut op, _) = start_probing(&cluster, &pki.ca_pem, &health_url, &["--provisioning-timeout=30s"], &[]);
    let client = cluster.server.client().unwrap();
    let api: Api<Proxy> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &common::vm_proxy("vm-dark", entry))
        .await
        .unwrap();

    let message = |p: &Proxy| -> String {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Provisioned"))
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    const REPLACED: &str = "the instance has had no address for 30s (the provisioning timeout); replacing it";
    let booting = wait_for_proxy(&api, "vm-dark", "created", BOOT_PATIENCE, |p| {
        p.status.as_ref().is_some_and(|s| !s.provider_id.is_empty())
    })
    .await;
    let provider_id = booting.status.unwrap().provider_id;
    let name = provider_id.rsplit('/').next().unwrap().to_owned();
    let replaced = wait_for_proxy(&api, "vm-dark", "replaced", BOOT_PATIENCE, move |p| {
        message(p) == REPLACED
    })
    .await;
    let status = replaced.status.unwrap();
    assert_eq!((status.phase, status.ip.as_str()), (Some(Phase::Provisioning), ""));
    // Deleted, then created again under the same name: booting once more.
    wait_for_proxy(&api, "vm-dark", "created again", BOOT_PATIENCE, move |p| {
        message(p) == "waiting for the instance to run"
    })
    .await;
    let host = seam(&env);
    let cx = OpCtx::background().with_timeout(Duration::from_secs(60));
    assert!(
        host.domain_names(&cx).await.unwrap().contains(&name),
        "the new domain is defined"
    );
    // The event says why.
    let events: Api<Event> = Api::namespaced(client, "default");
    let mut stream = Box::pin(watcher(events, watcher::Config::default()).applied_objects());
    tokio::time::timeout(BOOT_PATIENCE, async {
        while let Some(e) = stream.try_next().await.unwrap() {
            if e.reason.as_deref() == Some("Replacing") && e.note.as_deref() == Some(REPLACED) {
                return;
            }
        }
    })
    .await
    .expect("no Replacing event");

    api.delete("vm-dark", &DeleteParams::default()).await.unwrap();
    let gone = await_condition(api.clone(), "vm-dark", |p: Option<&Proxy>| p.is_none());
    tokio::time::timeout(BOOT_PATIENCE, gone)
        .await
        .expect("the Proxy is not gone")
        .unwrap();
    assert!(!host.domain_names(&cx).await.unwrap().contains(&name));
    let volumes = host.volume_names(&cx, &env.pool).await.unwrap();
    assert!(
        !volumes.iter().any(|v| v.starts_with(&name)),
        "volumes left: {volumes:?}"
    );
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    // The entry's cache goes with the test.
    for volume in [
        format!("base-{entry}-test-image.qcow2.sha256"),
        format!("base-{entry}-test-image.qcow2"),
    ] {
        host.delete_volume(&cx, &env.pool, &volume).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kvm2_pool_member_lost_behind_the_operators_back_is_replaced_by_its_standby() {
    let Some(env) = HypervisorEnv::for_test() else { return };
    let image = std::fs::read(&env.guest_image).unwrap();
    let digest: String = Sha256::digest(&image).iter().map(|b| format!("{b:02x}")).collect();
    let mirror = image_server::ImageServer::start(image, "127.0.0.1:0").await;
    let pki = support::pki_for(&[&env.gateway]);
    let (probe_target, _) = support::tls_target_at(&pki, &env.gateway).await;

    let entry = "kvm2-pool";
    let providers = providers_file(&env, entry, &mirror.url(), &digest, &env.bridge);
    let cluster = cluster("kvm2-pool", &providers).await;
    let health_url = format!("https://{}:{}/204", env.gateway, probe_target.port());
    let (mut op, discovery) = start_probing(&cluster, &pki.ca_pem, &health_url, &[], &[]);
    let client = cluster.server.client().unwrap();
    let pools: Api<egress_api::ProxyPool> = Api::namespaced(client.clone(), "default");
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client, "default");
    let pool_events = watcher(events, watcher::Config::default()).applied_objects();
    let mut pool_events = std::pin::pin!(pool_events);

    let mut spec = common::vm_proxy("template", entry).spec;
    // Probed often, so the loss shows in seconds rather than the default minute and a half.
    spec.health_check = Some(HealthCheckSpec {
        interval_seconds: Some(2),
        failure_threshold: Some(2),
        ..HealthCheckSpec::default()
    });
    let pool: egress_api::ProxyPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "vms"},
        "spec": {"replicas": 1, "standby": 1, "template": {"spec": spec}}
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let up = await_condition(pools.clone(), "vms", |p: Option<&egress_api::ProxyPool>| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.available_replicas == 1 && s.standby_ready == 1)
    });
    tokio::time::timeout(BOOT_PATIENCE, up)
        .await
        .expect("the pool's two VMs are not Ready")
        .unwrap();
    let members = proxies
        .list(&kube::api::ListParams::default().labels("crawl.example.com/pool=vms"))
        .await
        .unwrap()
        .items;
    let role = |p: &Proxy, r: &str| p.metadata.labels.as_ref().unwrap()[egress_api::LABEL_POOL_ROLE] == r;
    let active = members.iter().find(|p| role(p, "active")).unwrap().clone();
    let standby = members.iter().find(|p| role(p, "standby")).unwrap().clone();
    let (active_name, standby_name) = (
        kube::ResourceExt::name_any(&active),
        kube::ResourceExt::name_any(&standby),
    );

    // The active member's domain goes behind the operator's back.
    let domain = active
        .status
        .as_ref()
        .unwrap()
        .provider_id
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let host = seam(&env);
    let cx = OpCtx::background().with_timeout(Duration::from_secs(60));
    host.destroy_domain(&cx, &domain).await.unwrap();
    host.undefine_domain(&cx, &domain, UNDEFINE_FLAGS).await.unwrap();

    // The pool's Events from here, in order, until the replacement standby is being made.
    let mut reasons: Vec<(String, String)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let ordered = tokio::time::timeout(BOOT_PATIENCE, async {
        while let Some(e) = pool_events.try_next().await.unwrap() {
            let about_pool = e
                .regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("ProxyPool"));
            if !about_pool || !seen.insert(kube::ResourceExt::name_any(&e)) {
                continue;
            }
            let reason = e.reason.clone().unwrap_or_default();
            let note = e.note.clone().unwrap_or_default();
            let done = reason == "MemberCreated" && reasons.iter().any(|(r, _)| r == "Promoted");
            reasons.push((reason, note));
            if done {
                return;
            }
        }
    })
    .await;
    assert!(ordered.is_ok(), "no promotion and new standby: {reasons:#?}");
    // The three creates at the start, then the replacement, in this order: the standby is
    // promoted before anything is created, and one create follows the loss.
    let after_start: Vec<&str> = reasons
        .iter()
        .skip_while(|(r, _)| r == "MemberCreated")
        .map(|(r, _)| r.as_str())
        .collect();
    let promoted = after_start.iter().position(|r| *r == "Promoted").unwrap();
    let created = after_start.iter().position(|r| *r == "MemberCreated").unwrap();
    assert!(promoted < created, "{reasons:#?}");
    assert!(
        reasons
            .iter()
            .any(|(r, n)| r == "Promoted" && n.contains(&standby_name)),
        "{reasons:#?}"
    );
    assert!(
        reasons.iter().any(|(r, n)| r == "Draining" && n.contains(&active_name)),
        "{reasons:#?}"
    );

    // The promoted standby is leased at once, while the new standby still boots.
    let (status, grant) = common::lease(&discovery, "crawler-token", r#"{"selector": {"pool": "vms"}}"#).await;
    assert_eq!(status, 201, "{grant}");
    assert_eq!(grant["proxy"]["id"], format!("default/{standby_name}"), "{grant}");
    let lease = grant["leaseID"].as_str().unwrap().to_owned();
    let released = reqwest::Client::new()
        .delete(format!("http://{discovery}/v1/leases/{lease}"))
        .bearer_auth("crawler-token")
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 204);
    // The lost member was not rebuilt in place: it said so, and kept its instance id.
    let lost = proxies.get_opt(&active_name).await.unwrap();
    if let Some(lost) = lost {
        let status = lost.status.unwrap_or_default();
        assert_eq!(status.provider_id, active.status.as_ref().unwrap().provider_id);
    }

    // The pool goes with its members, and their domains with them.
    let uid = kube::ResourceExt::uid(&pools.get("vms").await.unwrap()).unwrap();
    pools.delete("vms", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        BOOT_PATIENCE,
        await_condition(pools.clone(), "vms", kube::runtime::wait::conditions::is_deleted(&uid)),
    )
    .await
    .expect("the pool is not gone")
    .unwrap();
    let left: Vec<String> = host
        .domain_names(&cx)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.starts_with("proxy-"))
        .collect();
    for p in &members {
        let name = p
            .status
            .as_ref()
            .unwrap()
            .provider_id
            .rsplit('/')
            .next()
            .unwrap()
            .to_owned();
        assert!(!left.contains(&name), "{name} outlived its pool: {left:?}");
    }
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}
