//! The gcp provider against the fake Compute server: what the suite cannot see (the exact
//! requests, the requestId, a failed insert reported through its operation, pagination, the
//! credential flows, the wire log).

mod support;

use std::time::Duration;

use egress_conformance::capture::Capture;
use egress_provider::{CreateRequest, ErrorClass, Instance, InstanceState, OpCtx, Provider, ProviderId};
use egress_provider_gcp::auth::Tokens;
use egress_provider_gcp::provider::MANAGED_FILTER;
use egress_provider_gcp::{CredentialSource, GcpProvider, Settings, WireOptions};
use serde_json::json;
use support::fake::{DEFAULT_OPERATION_TIME, FakeCompute, Seen, error_fixture};
use support::{GcpBackend, PROJECT, SERVICE_ACCOUNT, ZONE, ZONES, request_in};

fn cx() -> OpCtx {
    OpCtx::background().with_timeout(Duration::from_secs(30))
}

fn seen(b: &GcpBackend, method: &str, path_ends: &str) -> Vec<Seen> {
    b.fake
        .with(|w| w.seen())
        .into_iter()
        .filter(|s| s.method == method && s.path.ends_with(path_ends))
        .collect()
}

/// Calls get until `done` holds, moving the fake's clock on by a tenth of an operation's time
/// between calls (the fake moves only when looked at, so no call waits); at most 100 steps.
async fn get_until(
    fake: &FakeCompute,
    p: &GcpProvider,
    id: &ProviderId,
    done: impl Fn(&Result<Instance, egress_provider::ProviderError>) -> bool,
) -> Result<Instance, egress_provider::ProviderError> {
    for _ in 0..100 {
        let r = p.get(&cx(), id).await;
        if done(&r) {
            return r;
        }
        fake.advance(DEFAULT_OPERATION_TIME / 10);
    }
    panic!("{id} never reached the wanted state");
}

/// Calls get until the instance is gone (NotFound).
async fn until_gone(fake: &FakeCompute, p: &GcpProvider, id: &ProviderId) {
    let gone = get_until(
        fake,
        p,
        id,
        |r| matches!(r, Err(e) if e.class() == ErrorClass::NotFound),
    )
    .await;
    assert!(gone.is_err(), "{id} is gone");
}

async fn running(fake: &FakeCompute, p: &GcpProvider, id: &ProviderId) -> Instance {
    get_until(fake, p, id, |r| matches!(r, Ok(i) if i.state == InstanceState::Running))
        .await
        .expect("running")
}

fn managed_vm(b: &GcpBackend, name: &str, zone: &str, managed: bool) {
    b.fake.with(|w| {
        let mut vm = w.new_vm(name, zone);
        vm.status = "RUNNING".into();
        if managed {
            vm.labels.insert("proxy-operator-managed".into(), "true".into());
        }
        w.seed(vm);
    });
}

#[tokio::test]
async fn the_check_sends_exactly_one_request_even_when_more_pages_exist() {
    let b = GcpBackend::new().await;
    for i in 0..3 {
        managed_vm(&b, &format!("proxy-{i}"), ZONE, true);
    }
    let p = b.provider("gcp-eu", WireOptions::default());
    let statuses = p.checker().expect("a checker").check(&cx()).await;
    assert_eq!(statuses.len(), 1);
    let s = &statuses[0];
    assert!(s.ready, "{s:?}");
    assert_eq!(
        (s.name.as_str(), s.reason.as_str(), s.message.as_str()),
        (PROJECT, "Reachable", "")
    );
    assert_eq!(s.address, "127.0.0.1");
    let calls: Vec<Seen> = b
        .fake
        .with(|w| w.seen())
        .into_iter()
        .filter(|c| c.path.starts_with("/compute/"))
        .collect();
    assert_eq!(calls.len(), 1, "one request: {calls:?}");
    let call = &calls[0];
    assert_eq!(
        call.path,
        format!("/compute/v1/projects/{PROJECT}/aggregated/instances")
    );
    let q = &call.query;
    assert_eq!(q.get("maxResults").map(String::as_str), Some("1"));
    assert_eq!(q.get("returnPartialSuccess").map(String::as_str), Some("true"));
    assert_eq!(q.get("filter").map(String::as_str), Some(MANAGED_FILTER));
    assert!(!q.contains_key("pageToken"));
}

#[tokio::test]
async fn the_check_of_an_empty_project_is_reachable_and_a_disabled_api_is_forbidden() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let checker = p.checker().expect("a checker");
    assert!(checker.check(&cx()).await[0].ready);
    let (status, body) = error_fixture("403-accessNotConfigured", "");
    b.fake.with(|w| w.script("aggregatedList", status, body));
    let s = checker.check(&cx()).await.remove(0);
    assert_eq!((s.ready, s.reason.as_str()), (false, "Forbidden"));
    assert!(
        s.message.contains("HTTP 403") && s.message.contains("accessNotConfigured"),
        "{}",
        s.message
    );
    assert!(
        s.message.contains("Compute Engine API has not been used"),
        "{}",
        s.message
    );
}

#[tokio::test]
async fn the_insert_request_field_by_field() {
    let b = GcpBackend::new().await;
    let settings = Settings::from_config(&egress_provider_gcp::config::GcpConfig {
        project: PROJECT.into(),
        network: Some("custom-vpc".into()),
        subnetwork: Some("proxies".into()),
        network_tag: Some("squid-proxies".into()),
        disk_size_gb: Some(20),
    });
    let p = egress_provider_gcp::build(
        "gcp-eu",
        settings,
        CredentialSource::KeyFile(b.key_path()),
        &b.fake.base_url(),
        WireOptions::default(),
    )
    .expect("a provider");
    let mut req = request_in("7d4c1f7e-0000-4000-8000-000000000001", ZONE);
    req.installation = Some("blue".into());
    let id = p.create(&cx(), &req).await.expect("create");
    assert_eq!(id.as_str(), format!("zones/{ZONE}/instances/{}", req.name));
    let inserts = seen(&b, "POST", &format!("zones/{ZONE}/instances"));
    assert_eq!(inserts.len(), 1);
    let insert = &inserts[0];
    assert_eq!(
        insert.body.as_ref().expect("a body"),
        &json!({
            "name": req.name,
            "machineType": format!("zones/{ZONE}/machineTypes/e2-micro"),
            "disks": [{"boot": true, "autoDelete": true, "initializeParams": {
                "sourceImage": support::IMAGE, "diskSizeGb": "20"}}],
            "networkInterfaces": [{"network": "global/networks/custom-vpc",
                "subnetwork": "regions/europe-west1/subnetworks/proxies",
                "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}],
            "labels": {"proxy-operator-managed": "true",
                "proxy-operator-uid": "7d4c1f7e-0000-4000-8000-000000000001",
                "proxy-operator-installation": "blue"},
            "metadata": {"items": [{"key": "user-data", "value": "#cloud-config\npackages: [squid]\n"}]},
            "tags": {"items": ["squid-proxies"]},
        })
    );
    let rid = insert.query.get("requestId").expect("a requestId");
    assert_eq!(
        rid,
        &egress_provider_gcp::body::request_id(&req.uid, ZONE, &req.name, 0),
        "derived from the UID"
    );
    assert!(
        insert
            .authorization
            .as_deref()
            .is_some_and(|a| a.starts_with("Bearer ya29.fake"))
    );
    // The instance runs with the external address the API gave it, and its disk goes with it.
    let i = running(&b.fake, &p, &id).await;
    assert!(i.ip.is_some_and(|ip| ip.to_string().starts_with("34.76.")), "{i:?}");
    p.delete(&cx(), &id).await.expect("delete");
    until_gone(&b.fake, &p, &id).await;
    assert!(
        b.fake.with(|w| w.disks()).is_empty(),
        "the boot disk is deleted with the instance"
    );
}

#[tokio::test]
async fn a_retried_insert_whose_answer_was_lost_creates_one_instance() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let req = request_in("retried-1", ZONE);
    b.fake.with(|w| w.lose_next_answer());
    let e = p.create(&cx(), &req).await.expect_err("the answer was lost");
    assert_eq!(e.class(), ErrorClass::Transient, "{e}");
    let id = p.create(&cx(), &req).await.expect("the retry");
    let inserts = seen(&b, "POST", "/instances");
    assert_eq!(inserts.len(), 2);
    assert_eq!(inserts[0].query.get("requestId"), inserts[1].query.get("requestId"));
    assert_eq!(b.fake.with(|w| w.vms()).len(), 1, "one instance");
    running(&b.fake, &p, &id).await;
    // Another provider (a restarted operator) retrying derives the same requestId.
    let again = b.provider("gcp-eu", WireOptions::default());
    again
        .create(&cx(), &req)
        .await
        .expect("the same create after a restart");
    assert_eq!(b.fake.with(|w| w.vms()).len(), 1, "still one instance");
}

#[tokio::test]
async fn an_insert_after_a_delete_is_not_answered_with_the_old_operation() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let req = request_in("recreated-1", ZONE);
    let id = p.create(&cx(), &req).await.expect("create");
    running(&b.fake, &p, &id).await;
    p.delete(&cx(), &id).await.expect("delete");
    until_gone(&b.fake, &p, &id).await;
    p.create(&cx(), &req).await.expect("create again");
    running(&b.fake, &p, &id).await;
    let inserts = seen(&b, "POST", "/instances");
    assert_ne!(inserts[0].query.get("requestId"), inserts[1].query.get("requestId"));
}

#[tokio::test]
async fn an_insert_that_fails_after_acceptance_is_reported_as_that_failure() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let req = request_in("async-fail-1", ZONE);
    b.fake.with(|w| {
        w.stall_inserts(true);
        w.fail_next_insert(
            "QUOTA_EXCEEDED",
            "Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1.",
            403,
        );
    });
    let id = p.create(&cx(), &req).await.expect("accepted");
    // The operation runs: the instance is not there yet, and that is Provisioning, not NotFound.
    let i = p.get(&cx(), &id).await.expect("pending");
    assert_eq!(
        (i.state, i.uid.as_str()),
        (InstanceState::Provisioning, ""),
        "nothing from memory but the state"
    );
    // A delete now would "succeed" on a name the insert is about to take: it is refused.
    let e = p.delete(&cx(), &id).await.expect_err("the insert still runs");
    assert_eq!(e.class(), ErrorClass::Transient, "{e}");
    b.fake.with(|w| w.stall_inserts(false));
    let e = get_until(&b.fake, &p, &id, Result::is_err)
        .await
        .expect_err("the failure");
    assert_eq!(e.class(), ErrorClass::QuotaExceeded, "{e}");
    assert!(
        e.to_string().contains("QUOTA_EXCEEDED") && e.to_string().contains("Quota 'CPUS' exceeded"),
        "{e}"
    );
    // Reported once; then the name is free, and a new create is a new request.
    let e = p.get(&cx(), &id).await.expect_err("gone");
    assert_eq!(e.class(), ErrorClass::NotFound);
    p.create(&cx(), &req).await.expect("create again");
    running(&b.fake, &p, &id).await;
    let inserts = seen(&b, "POST", "/instances");
    assert_ne!(inserts[0].query.get("requestId"), inserts[1].query.get("requestId"));
    // A provider without the memory (a restart) sees what the Go one saw: NotFound.
    let b2 = GcpBackend::new().await;
    let p2 = b2.provider("gcp-eu", WireOptions::default());
    b2.fake
        .with(|w| w.fail_next_insert("RESOURCE_NOT_FOUND", "image not found", 404));
    let id2 = p2.create(&cx(), &req).await.expect("accepted");
    let fresh = b2.provider("gcp-eu", WireOptions::default());
    let e = fresh.get(&cx(), &id2).await.expect_err("not found");
    assert_eq!(e.class(), ErrorClass::NotFound);
    let e = get_until(&b2.fake, &p2, &id2, Result::is_err)
        .await
        .expect_err("the failure");
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
}

#[tokio::test]
async fn list_reads_every_page_and_warns_of_unreachable_zones() {
    let (capture, _guard) = Capture::start();
    let b = GcpBackend::new().await;
    for i in 0..1100 {
        managed_vm(&b, &format!("proxy-a{i:04}"), ZONES[0], true);
    }
    for i in 0..5 {
        managed_vm(&b, &format!("other-{i}"), ZONES[0], false);
    }
    for i in 0..3 {
        managed_vm(&b, &format!("proxy-b{i}"), ZONES[1], true);
    }
    let p = b.provider("gcp-eu", WireOptions::default());
    let all = p.list_by_tag(&cx()).await.expect("list");
    assert_eq!(all.len(), 1103);
    let pages = seen(&b, "GET", "aggregated/instances");
    assert_eq!(pages.len(), 3, "500 per page");
    assert!(!pages[0].query.contains_key("pageToken") && pages[2].query.contains_key("pageToken"));
    assert!(pages.iter().all(|q| !q.query.contains_key("maxResults")));
    // One list leaves the unreachable zone out and says so once, in one WARN naming it.
    let partial_list_warns_once = || async {
        let mark = capture.event_mark();
        assert_eq!(p.list_by_tag(&cx()).await.expect("partial list").len(), 1100);
        let warned: Vec<_> = capture
            .events_since(mark)
            .into_iter()
            .filter(|e| e.level == tracing::Level::WARN)
            .collect();
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].text().contains("zones/us-central1-a"), "{warned:?}");
    };
    b.fake.with(|w| w.set_zone_unreachable(ZONES[1]));
    partial_list_warns_once().await;
    // The API may name the zone only by its per-zone UNREACHABLE warning.
    b.fake.with(|w| w.unreachables_unlisted(true));
    partial_list_warns_once().await;
}

#[tokio::test]
async fn an_instance_moves_on_the_fakes_clock_and_a_delete_during_a_delete_succeeds() {
    let b = GcpBackend::new().await;
    b.fake.set_operation_time(Duration::from_secs(60));
    let p = b.provider("gcp-eu", WireOptions::default());
    let req = request_in("slow-1", ZONE);
    let id = p.create(&cx(), &req).await.expect("create");
    let status = || b.fake.with(|w| w.vm(&req.name).map(|vm| vm.status.clone()));
    let state = |i: Instance| (i.state, i.ip.is_some());
    assert_eq!(
        state(p.get(&cx(), &id).await.expect("get")),
        (InstanceState::Provisioning, false)
    );
    assert_eq!(status().as_deref(), Some("PROVISIONING"));
    b.fake.advance(Duration::from_secs(30));
    assert_eq!(
        state(p.get(&cx(), &id).await.expect("get")),
        (InstanceState::Provisioning, false)
    );
    assert_eq!(status().as_deref(), Some("STAGING"));
    b.fake.advance(Duration::from_secs(30));
    assert_eq!(
        state(p.get(&cx(), &id).await.expect("get")),
        (InstanceState::Running, true)
    );
    p.delete(&cx(), &id).await.expect("delete");
    b.fake.advance(Duration::from_secs(59));
    // The first delete runs for another second: a second one is refused by the API with
    // resourceNotReady, and the provider, reading STOPPING, takes it as done.
    p.delete(&cx(), &id).await.expect("a delete while the first runs");
    let deletes = seen(&b, "DELETE", &format!("/instances/{}", req.name)).len();
    assert_eq!(deletes, 2);
    assert_eq!(status().as_deref(), Some("STOPPING"));
    assert_eq!(p.get(&cx(), &id).await.expect("stopping").state, InstanceState::Stopped);
    b.fake.advance(Duration::from_secs(1));
    let gone = p.get(&cx(), &id).await.expect_err("gone");
    assert_eq!(gone.class(), ErrorClass::NotFound);
    assert!(b.fake.with(|w| w.disks()).is_empty(), "the boot disk went with it");
}

#[tokio::test]
async fn an_unknown_zone_is_an_invalid_value_not_a_missing_instance() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let e = p
        .get(&cx(), &ProviderId::new("zones/asia-east9-z/instances/proxy-x"))
        .await
        .expect_err("an unknown zone");
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("Unknown zone"), "{e}");
    let e = p
        .create(&cx(), &request_in("nowhere-1", "asia-east9-z"))
        .await
        .expect_err("an unknown zone");
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert!(b.fake.with(|w| w.vms()).is_empty());
}

#[tokio::test]
async fn what_the_api_refuses_in_a_nic_or_a_tag_fails_create_permanently() {
    let b = GcpBackend::new().await;
    let with = |edit: fn(&mut Settings)| {
        let mut settings = Settings::for_project(PROJECT);
        edit(&mut settings);
        b.provider_with("gcp-eu", settings, WireOptions::default())
    };
    // Settings a load refuses, or that name what the project lacks: each insert is refused.
    for (what, edit, says) in [
        (
            "a network the project lacks",
            (|s: &mut Settings| s.network = "missing-vpc".into()) as fn(&mut Settings),
            "was not found",
        ),
        (
            "a custom-mode network without a subnetwork",
            |s| s.network = "custom-vpc".into(),
            "Subnetwork should be specified",
        ),
        (
            "a subnetwork in another region",
            |s| {
                s.network = "custom-vpc".into();
                s.subnetwork = Some("regions/us-central1/subnetworks/proxies".into());
            },
            "same region",
        ),
        (
            "a subnetwork the region lacks",
            |s| {
                s.network = "custom-vpc".into();
                s.subnetwork = Some("elsewhere".into());
            },
            "was not found",
        ),
        ("an upper-case tag", |s| s.network_tag = "Squid".into(), "tags.items[0]"),
    ] {
        let e = with(edit)
            .create(&cx(), &request_in("refused-1", ZONE))
            .await
            .expect_err(what);
        assert_eq!(e.class(), ErrorClass::Permanent, "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
    }
    assert!(b.fake.with(|w| w.vms()).is_empty(), "nothing was made");
    // The same subnetwork by name, in its own region, is taken.
    let p = with(|s| {
        s.network = "custom-vpc".into();
        s.subnetwork = Some("proxies".into());
    });
    let id = p.create(&cx(), &request_in("accepted-1", ZONE)).await.expect("create");
    running(&b.fake, &p, &id).await;
}

#[tokio::test]
async fn one_token_serves_concurrent_calls() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let gets = (0..10).map(|i| {
        let p = p.clone();
        async move {
            p.get(&cx(), &ProviderId::new(format!("zones/{ZONE}/instances/proxy-{i}")))
                .await
        }
    });
    for r in futures_join(gets).await {
        assert_eq!(r.expect_err("none exist").class(), ErrorClass::NotFound);
    }
    assert_eq!(b.fake.with(|w| w.token_requests()), 1);
    // The suite's call log sees the token request too.
    let log = b.fake.interceptor().call_log();
    assert_eq!(log.iter().filter(|c| c.kind.0 == "token").count(), 1, "{log:?}");
    assert_eq!(log.iter().filter(|c| c.kind.0 == "get").count(), 10, "{log:?}");
}

async fn futures_join<F>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("a task"));
    }
    out
}

#[tokio::test]
async fn a_refused_token_is_replaced_from_the_rotated_key_file() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    p.list_by_tag(&cx()).await.expect("list with the first key");
    // The key is rotated: the old account's tokens stop working, a new key file is mounted.
    let rotated = "rotated@egress-test.iam.gserviceaccount.com";
    b.fake.with(|w| {
        w.revoke_tokens();
        w.disable_account(SERVICE_ACCOUNT);
        w.enable_account(rotated);
    });
    std::fs::write(b.key_path(), b.fake.service_account_json("test-key-2", rotated)).expect("rotate");
    p.list_by_tag(&cx())
        .await
        .expect("list after the rotation, without a restart");
    assert_eq!(b.fake.with(|w| w.token_owners()), vec![rotated.to_owned()]);
}

/// A provider whose key file is an authorized user's, refreshed at the fake's token endpoint.
fn authorized_user_provider(b: &GcpBackend) -> GcpProvider {
    let http = egress_provider_gcp::client::http_client().expect("a client");
    let tokens = Tokens::new(CredentialSource::KeyFile(b.key_path()), http.clone()).with_oauth_url(b.fake.token_url());
    egress_provider_gcp::build_with(
        "gcp-eu",
        Settings::for_project(PROJECT),
        tokens,
        http,
        &b.fake.base_url(),
        WireOptions::default(),
    )
    .expect("a provider")
}

#[tokio::test]
async fn authorized_user_and_metadata_server_credentials() {
    let b = GcpBackend::new().await;
    std::fs::write(
        b.key_path(),
        b.fake.authorized_user_json("client-1", "s3cret", "1//refresh"),
    )
    .expect("write");
    let p = authorized_user_provider(&b);
    p.list_by_tag(&cx()).await.expect("list as an authorized user");
    let p = egress_provider_gcp::build(
        "gcp-eu",
        Settings::for_project(PROJECT),
        CredentialSource::Metadata {
            host: b.fake.metadata_host(),
        },
        &b.fake.base_url(),
        WireOptions::default(),
    )
    .expect("a provider");
    p.list_by_tag(&cx())
        .await
        .expect("list with the metadata server's token");
    assert_eq!(b.fake.with(|w| w.metadata_requests()), 1);
    // A wrong refresh token never reaches the Compute API: Transient, and the check says
    // Unreachable.
    std::fs::write(
        b.key_path(),
        json!({"type": "authorized_user", "client_id": "client-1",
        "client_secret": "wrong", "refresh_token": "1//refresh"})
        .to_string(),
    )
    .expect("write");
    let p = authorized_user_provider(&b);
    let e = p.list_by_tag(&cx()).await.expect_err("no token");
    assert_eq!(e.class(), ErrorClass::Transient);
    assert!(
        !e.to_string().contains("wrong") && !e.to_string().contains("1//refresh"),
        "{e}"
    );
    let s = p.checker().expect("a checker").check(&cx()).await.remove(0);
    assert_eq!(s.reason, "Unreachable");
}

#[tokio::test]
async fn a_bad_placement_fetches_no_token() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let mut req: CreateRequest = request_in("placement-1", ZONE);
    req.placement.machine_type.clear();
    let e = p.create(&cx(), &req).await.expect_err("refused");
    assert_eq!(e.class(), ErrorClass::Permanent);
    assert!(e.to_string().contains("placement.machineType is required"), "{e}");
    assert_eq!(b.fake.with(|w| w.token_requests()), 0);
}

#[tokio::test]
async fn the_wire_log_never_shows_user_data_or_tokens_even_with_full_payloads() {
    const SENTINEL: &str = "SENTINEL-gcp-user-data-5d1e";
    let (capture, _guard) = Capture::start();
    // Under a caller's span, so the client spans are there to be checked too.
    let parent = tracing::info_span!("test.parent");
    let _inside = parent.enter();
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions { full_payloads: true });
    let mut req = request_in("wire-1", ZONE);
    req.cloud_init = format!("#cloud-config\n# {SENTINEL}\n").into_bytes();
    let id = p.create(&cx(), &req).await.expect("create");
    p.get(&cx(), &id).await.expect("get");
    p.list_by_tag(&cx()).await.expect("list");
    p.checker().expect("a checker").check(&cx()).await;
    p.delete(&cx(), &id).await.expect("delete");
    b.fake.with(|w| {
        w.script(
            "insert",
            400,
            json!({"error": {"code": 400, "message": format!("bad metadata: {SENTINEL}")}}),
        )
    });
    let e = p
        .create(
            &cx(),
            &request_in("wire-2", ZONE).clone_with_cloud_init(&req.cloud_init),
        )
        .await
        .expect_err("refused");
    assert!(!format!("{e} {e:?}").contains(SENTINEL), "{e}");
    assert!(!format!("{e} {e:?}").contains("ya29.fake"), "{e}");
    assert!(
        capture.spans().iter().any(|s| s.name == "gcp.http"),
        "no client span to check"
    );
    let wire: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.target == egress_provider_gcp::wire::TARGET)
        .collect();
    assert!(
        wire.iter()
            .any(|e| e.message() == "api request" && e.text().contains("<user-data: ")),
        "{wire:?}"
    );
    assert!(wire.iter().any(|e| e.message() == "api response"));
    assert_eq!(capture.find_text(SENTINEL), None);
    assert_eq!(capture.find_text("ya29.fake"), None, "a token was logged");
    assert_eq!(capture.find_text("BEGIN PRIVATE KEY"), None, "the key was logged");
}

trait WithCloudInit {
    fn clone_with_cloud_init(&self, cloud_init: &[u8]) -> CreateRequest;
}

impl WithCloudInit for CreateRequest {
    fn clone_with_cloud_init(&self, cloud_init: &[u8]) -> CreateRequest {
        let mut r = self.clone();
        r.cloud_init = cloud_init.to_vec();
        r
    }
}

#[tokio::test]
async fn a_finished_insert_whose_instance_is_gone_moves_the_request_id_on() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let req = request_in("vanished-1", ZONE);
    let id = p.create(&cx(), &req).await.expect("create");
    // Deleted behind the provider's back once its insert has finished.
    get_until(
        &b.fake,
        &p,
        &id,
        |r| matches!(r, Ok(i) if i.state == InstanceState::Running),
    )
    .await
    .expect("running");
    b.fake.with(|w| {
        let vm = w.vm(&req.name).expect("the instance");
        vm.status = "RUNNING".into();
    });
    let other = b.provider("gcp-eu", WireOptions::default());
    other.delete(&cx(), &id).await.expect("deleted by another replica");
    until_gone(&b.fake, &p, &id).await;
    p.create(&cx(), &req).await.expect("create again");
    running(&b.fake, &p, &id).await;
    let inserts = seen(&b, "POST", "/instances");
    assert_ne!(inserts[0].query.get("requestId"), inserts[1].query.get("requestId"));
}

#[tokio::test]
async fn a_delete_of_an_instance_already_being_deleted_succeeds_and_a_busy_one_stays_transient() {
    let b = GcpBackend::new().await;
    let p = b.provider("gcp-eu", WireOptions::default());
    let id = p
        .create(&cx(), &request_in("deleted-twice", ZONE))
        .await
        .expect("create");
    running(&b.fake, &p, &id).await;
    let name = id.as_str().rsplit('/').next().unwrap().to_owned();
    let path = format!("/instances/{name}");
    // A delete is under way (started before, its answer lost, say) and held running: the
    // instance reads STOPPING, and the API answers another delete with 400 resourceNotReady.
    assert!(b.fake.with(|w| w.hold_delete(&name)));
    let reads_before = seen(&b, "GET", &path).len();
    p.delete(&cx(), &id)
        .await
        .expect("a delete of an instance already being deleted succeeds");
    assert_eq!(seen(&b, "DELETE", &path).len(), 1);
    assert!(
        seen(&b, "GET", &path).len() > reads_before,
        "the refusal was checked against a read"
    );
    b.fake.with(|w| w.release_delete(&name));
    until_gone(&b.fake, &p, &id).await;

    // Another operation holds a running instance: the delete is retried, not taken as done.
    let id = p.create(&cx(), &request_in("held-busy", ZONE)).await.expect("create");
    running(&b.fake, &p, &id).await;
    let name = id.as_str().rsplit('/').next().unwrap().to_owned();
    b.fake.with(|w| w.lock(&name));
    let busy = p.delete(&cx(), &id).await.expect_err("busy");
    assert_eq!(busy.class(), ErrorClass::Transient, "{busy}");
    b.fake.with(|w| w.unlock(&name));
    p.delete(&cx(), &id).await.expect("once free");
}
