//! The exit check, on the shipped binary against real tinyproxies (each leaving from an
//! address of its own, as the local provider's do) and a local echo target: distinct exits
//! Verified, with their country and ASN from test databases in the status and the discovery
//! list; two External Proxies on one tinyproxy Shared, and not offered under enforce; a
//! tinyproxy leaving from the operator's own address found out; a lease selecting a country
//! getting only the proxies verified in it; an echo that lies leaving exits Unknown, never a
//! health failure; and, under enforce, a pool of the local provider replacing the member whose
//! exit the country database moves out of the template's countries.
//!
//! Skips without tinyproxy; fails under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1).

mod common;

use std::time::Duration;

use common::{PATIENCE, cluster, external_spec, lease, start_probing};
use egress_api::{ConditionStatus, Proxy, ProxyPool, conditions, reasons};
use egress_testkit::echo::{Echo, EchoTarget};
use egress_testkit::{Tinyproxy, tinyproxy_available};
use futures::TryStreamExt as _;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;

/// Several exit checks of every proxy, at the shortest interval the flag allows.
const EXIT_PATIENCE: Duration = Duration::from_secs(90);

/// Test databases for the tinyproxies' exits: 127.0.0.2 in DE, 127.0.0.3 in FR, all of
/// 127.0.0.0/8 in AS 64500.
fn databases(dir: &std::path::Path) -> (String, String) {
    let countries =
        egress_geoip::testing::country_database("Test-Country", &[("127.0.0.2/32", "DE"), ("127.0.0.3/32", "FR")]);
    let asns = egress_geoip::testing::asn_database(&[("127.0.0.0/8", 64500, "Loopback Networks")]);
    let (country, asn) = (dir.join("country.mmdb"), dir.join("asn.mmdb"));
    std::fs::write(&country, countries).unwrap();
    std::fs::write(&asn, asns).unwrap();
    (country.display().to_string(), asn.display().to_string())
}

/// An External Proxy `name` at tinyproxy `proxy`, checked each second with a 2 s budget.
fn external(name: &str, proxy: &Tinyproxy, countries: &[&str]) -> Proxy {
    let port: u16 = proxy.addr().rsplit_once(':').unwrap().1.parse().unwrap();
    let mut spec = external_spec(port);
    spec.attributes = [("name".to_owned(), name.to_owned())].into();
    spec.health_check = Some(egress_api::HealthCheckSpec {
        timeout_seconds: Some(2),
        ..Default::default()
    });
    if !countries.is_empty() {
        spec.exit = Some(egress_api::ExitSpec {
            countries: countries.iter().map(|c| (*c).to_owned()).collect(),
        });
    }
    Proxy::new(name, spec)
}

/// Waits until Proxy `name`'s `ExitVerified` condition has `reason`, and returns the Proxy.
async fn until_exit(api: &Api<Proxy>, name: &str, reason: &'static str) -> Proxy {
    common::wait_for_proxy(api, name, reason, EXIT_PATIENCE, move |p| {
        p.condition(conditions::EXIT_VERIFIED)
            .is_some_and(|c| c.reason == reason)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_are_verified_shared_or_the_operators_and_selectable_by_country() {
    if !tinyproxy_available() {
        return;
    }
    let echo = EchoTarget::http("127.0.0.1").await;
    let echo_port = echo.addr.port();
    let (target, _) = egress_testkit::http_target_at("127.0.0.1").await;
    let ports = [echo_port, target.port()];
    let leaving =
        |last: u8| Tinyproxy::start_leaving_from(&ports, None, Some(std::net::Ipv4Addr::new(127, 0, 0, last)));
    let (germany, france, shared) = (leaving(2), leaving(3), leaving(4));
    // Leaves from 127.0.0.1, where the operator's own fetch of the echo comes from too.
    let open = Tinyproxy::start(&ports);
    let cluster = cluster("exits", "providers: []\n").await;
    let (country_db, asn_db) = databases(&cluster.dir);
    let flags = [
        format!("--exit-check-url={}", echo.url()),
        "--exit-check-interval=10s".to_owned(),
        "--exit-policy=enforce".to_owned(),
        format!("--geoip-country-file={country_db}"),
        format!("--geoip-asn-file={asn_db}"),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let health_url = format!("http://127.0.0.1:{}/204", target.port());
    let ca = egress_testkit::pki().ca_pem;
    let (_op, discovery) = start_probing(&cluster, &ca, &health_url, &flags, &[]);
    let api: Api<Proxy> = Api::namespaced(cluster.server.client().unwrap(), "default");
    for proxy in [
        external("de", &germany, &["DE"]),
        external("fr", &france, &["DE"]),
        external("twin-a", &shared, &[]),
        external("twin-b", &shared, &[]),
        external("open", &open, &[]),
    ] {
        api.create(&PostParams::default(), &proxy).await.unwrap();
    }

    let de = until_exit(&api, "de", reasons::EXIT_VERIFIED).await;
    let exit = de.status.as_ref().unwrap().exit.clone().unwrap();
    assert_eq!(exit.address, "127.0.0.2");
    assert_eq!(exit.country.as_deref(), Some("DE"));
    assert_eq!(
        (exit.asn, exit.organization.as_deref()),
        (Some(64500), Some("Loopback Networks"))
    );
    let fr = until_exit(&api, "fr", reasons::EXIT_UNEXPECTED).await;
    assert!(
        fr.condition(conditions::EXIT_VERIFIED)
            .unwrap()
            .message
            .contains("is in FR")
    );
    for twin in ["twin-a", "twin-b"] {
        let p = until_exit(&api, twin, reasons::EXIT_SHARED).await;
        let condition = p.condition(conditions::EXIT_VERIFIED).unwrap();
        assert_eq!(condition.status, ConditionStatus::False);
        assert!(
            condition.message.contains("shared with 1 other Proxy"),
            "{}",
            condition.message
        );
    }
    until_exit(&api, "open", reasons::EXIT_OPERATOR_ADDRESS).await;
    for name in ["de", "fr", "twin-a", "twin-b", "open"] {
        let p = api.get(name).await.unwrap();
        assert!(
            p.condition(conditions::HEALTHY)
                .is_some_and(|c| c.status == ConditionStatus::True),
            "{name} stays healthy"
        );
    }

    // The list shows the exits; a country selects the proxies verified in it, and under
    // enforce the others are no candidates.
    let list = common::proxy_list(&discovery, "crawler-token").await;
    let shown = |id: &str| {
        list["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {list}"))
            .clone()
    };
    assert_eq!(shown("default/de")["exit"]["country"], "DE");
    assert_eq!(shown("default/de")["exit"]["verification"], "Verified");
    assert_eq!(shown("default/de")["attributes"]["exit.asn"], "64500");
    assert_eq!(shown("default/twin-a")["exit"]["verification"], "Shared");
    let (status, grant) = lease(&discovery, "crawler-token", r#"{"selector": {"exit.country": "DE"}}"#).await;
    assert_eq!(
        (status, grant["proxy"]["id"].as_str()),
        (201, Some("default/de")),
        "{grant}"
    );
    for name in ["fr", "twin-a", "open"] {
        let body = format!(r#"{{"selector": {{"name": "{name}"}}}}"#);
        let (status, answer) = lease(&discovery, "crawler-token", &body).await;
        assert_eq!(status, 409, "{name} is offered under enforce: {answer}");
    }

    // An echo that answers a list: every exit Unknown at the next checks, none unhealthy.
    echo.answer_as(Echo::List);
    let de = until_exit(&api, "de", reasons::EXIT_UNKNOWN).await;
    assert!(
        de.condition(conditions::EXIT_VERIFIED)
            .unwrap()
            .message
            .contains("a list")
    );
    assert!(
        de.condition(conditions::HEALTHY)
            .is_some_and(|c| c.status == ConditionStatus::True)
    );
    assert!(PATIENCE <= EXIT_PATIENCE);
}

/// Watches pool `pool`'s members that are not being deleted until `done` holds for them (at
/// most [`EXIT_PATIENCE`]), and returns them.
async fn until_members(api: &Api<Proxy>, pool: &str, what: &str, done: impl Fn(&[Proxy]) -> bool) -> Vec<Proxy> {
    let selector = format!("{}={pool}", egress_api::LABEL_POOL);
    let (store, writer) = kube::runtime::reflector::store();
    let events = kube::runtime::reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().labels(&selector)),
    );
    let live = || -> Vec<Proxy> {
        let all = store.state().into_iter().map(|p| Proxy::clone(&p));
        all.filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
    };
    let wait = async {
        let mut events = std::pin::pin!(events);
        while events.try_next().await.unwrap().is_some() {
            let members = live();
            if done(&members) {
                return members;
            }
        }
        panic!("{pool}: the watch ended");
    };
    match tokio::time::timeout(EXIT_PATIENCE, wait).await {
        Ok(members) => members,
        Err(_) => panic!(
            "{pool}: not {what} within {EXIT_PATIENCE:?}: {:#?}",
            live().iter().map(|p| (p.name_any(), &p.status)).collect::<Vec<_>>()
        ),
    }
}

/// Whether `members` are `n`, each with its exit Verified.
fn all_verified(members: &[Proxy], n: usize) -> bool {
    members.len() == n
        && members.iter().all(|p| {
            p.condition(conditions::EXIT_VERIFIED)
                .is_some_and(|c| c.reason == reasons::EXIT_VERIFIED)
        })
}

/// Writes `bytes` to `path` as a new file (a rename), as a database update is delivered.
fn replace_file(path: &std::path::Path, bytes: &[u8]) {
    let next = path.with_extension("next");
    std::fs::write(&next, bytes).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// A pool `de` of two local-provider members expecting an exit in `country`, one of which may
/// fail at a time (so a lone replacement is never held back).
async fn create_pool_of_two_in(client: kube::Client, country: &str) {
    let pool: ProxyPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "de"},
        "spec": {
            "replicas": 2, "maxUnhealthy": 1,
            "template": {"spec": {"provider": "local", "exit": {"countries": [country]}}}
        }
    }))
    .unwrap();
    Api::<ProxyPool>::namespaced(client, "default")
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_enforce_a_pool_replaces_a_member_whose_exit_is_in_another_country() {
    if !tinyproxy_available() {
        return;
    }
    let echo = EchoTarget::http("127.0.0.1").await;
    let (target, _) = egress_testkit::http_target_at("127.0.0.1").await;
    let state = egress_testkit::scratch_dir("operator-exit-pool-state").join("state");
    let providers = format!(
        "providers:\n  - name: local\n    type: local\n    local:\n      stateDir: {}\n      connectPorts: [{}, {}]\n",
        state.display(),
        target.port(),
        echo.addr.port()
    );
    let cluster = cluster("exit-pool", &providers).await;
    // Every local exit (127.a.b.c) in DE, as the template expects.
    let country_db = cluster.dir.join("country.mmdb");
    let germany = ("127.0.0.0/8", "DE");
    replace_file(
        &country_db,
        &egress_geoip::testing::country_database("Test-Country", &[germany]),
    );
    let flags = [
        format!("--exit-check-url={}", echo.url()),
        "--exit-check-interval=10s".to_owned(),
        "--exit-policy=enforce".to_owned(),
        format!("--geoip-country-file={}", country_db.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let health_url = format!("http://127.0.0.1:{}/204", target.port());
    let (_op, _) = start_probing(&cluster, &egress_testkit::pki().ca_pem, &health_url, &flags, &[]);
    let client = cluster.server.client().unwrap();
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    create_pool_of_two_in(client.clone(), "DE").await;
    let members = until_members(&proxies, "de", "two members verified in DE", |m| all_verified(m, 2)).await;

    // The databases move one member's exit to FR: the pool drains and replaces it.
    let moved = &members[0];
    let address = moved.status.as_ref().unwrap().exit.as_ref().unwrap().address.clone();
    let france = format!("{address}/32");
    replace_file(
        &country_db,
        &egress_geoip::testing::country_database("Test-Country", &[germany, (&france, "FR")]),
    );
    let gone = moved.name_any();
    let members = until_members(&proxies, "de", "two members verified in DE again", |m| {
        all_verified(m, 2) && m.iter().all(|p| p.name_any() != gone)
    })
    .await;
    for p in &members {
        assert_eq!(
            p.status.as_ref().unwrap().exit.as_ref().unwrap().country.as_deref(),
            Some("DE")
        );
    }
    let events: Api<Event> = Api::namespaced(client, "default");
    let drained = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some("Draining")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&gone) && n.contains("(exit refused)"))
        });
    assert!(drained, "a Draining Event names {gone} and its exit");
}
