//! The shipped binary refuses External Proxies that point at internal destinations: each gets
//! `Provisioned=False/DestinationRefused`, phase `Failed` and a Warning event, nothing is
//! dialled (a listener at the loopback one sees no connection; the others are never reached
//! because the check comes before any dial), and none is offered for a lease. Named in
//! `--allowed-internal-destinations`, the loopback one is probed as usual. An External Proxy
//! outside `--external-proxy-namespaces` is refused alike (`ExternalNotAllowed`).

mod common;

use egress_testkit as support;

use common::{PATIENCE, cluster, external_spec, start_probing, wait_for_proxy};
use egress_api::{Endpoint, Phase, Proxy, ProxySpec, conditions, reasons};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};

fn refused_reason(p: &Proxy) -> Option<String> {
    let status = p.status.as_ref()?;
    let provisioned = status.conditions.iter().find(|c| c.type_ == conditions::PROVISIONED)?;
    (status.phase == Some(Phase::Failed)).then(|| provisioned.reason.clone())
}

fn external_at(host: &str, port: i32) -> ProxySpec {
    ProxySpec {
        endpoint: Some(Endpoint {
            host: host.into(),
            port: Some(port),
        }),
        ..external_spec(1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_proxies_at_internal_destinations_are_refused_and_never_dialled() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = i32::from(listener.local_addr().unwrap().port());
    let pki = support::pki();
    let cluster = cluster("destinations", "providers: []\n").await;
    // The flag given last wins: no allowlist at all.
    let (mut op, discovery) = start_probing(
        &cluster,
        &pki.ca_pem,
        "https://www.example.com/",
        &["--allowed-internal-destinations=", "--proxy-namespace=default,team-b"],
        &[],
    );
    let api: Api<Proxy> = Api::namespaced(cluster.server.client().unwrap(), "default");
    let proxies = [
        ("loopback", external_at("127.0.0.1", port)),
        ("metadata", external_at("169.254.169.254", 80)),
        ("metadata-as-a-number", external_at("2852039166", 80)),
        ("private", external_at("10.0.0.7", 3128)),
        ("service", external_at("redis.crawlers.svc.cluster.local", 6379)),
    ];
    for (name, spec) in &proxies {
        api.create(&PostParams::default(), &Proxy::new(name, spec.clone()))
            .await
            .unwrap();
    }
    // A public proxy, but in a namespace where External Proxies are not accepted.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(cluster.server.client().unwrap());
    let mut team_b = k8s_openapi::api::core::v1::Namespace::default();
    team_b.metadata.name = Some("team-b".into());
    namespaces.create(&PostParams::default(), &team_b).await.unwrap();
    let elsewhere: Api<Proxy> = Api::namespaced(cluster.server.client().unwrap(), "team-b");
    let vendor = external_at("proxy.vendor.example", 3128);
    elsewhere
        .create(&PostParams::default(), &Proxy::new("vendor", vendor))
        .await
        .unwrap();
    let p = wait_for_proxy(&elsewhere, "vendor", "refused", PATIENCE, |p| {
        refused_reason(p).is_some()
    })
    .await;
    assert_eq!(refused_reason(&p).as_deref(), Some(reasons::EXTERNAL_NOT_ALLOWED));
    for (name, _) in &proxies {
        let p = wait_for_proxy(&api, name, "refused", PATIENCE, |p| refused_reason(p).is_some()).await;
        assert_eq!(
            refused_reason(&p).as_deref(),
            Some(reasons::DESTINATION_REFUSED),
            "{name}"
        );
        let healthy = p
            .status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::HEALTHY);
        assert!(!healthy, "{name} has a verdict");
    }
    let events: Api<Event> = Api::namespaced(cluster.server.client().unwrap(), "default");
    let refused_events = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("DestinationRefused"))
        .count();
    assert!(
        refused_events >= proxies.len(),
        "{refused_events} DestinationRefused events"
    );
    let (status, answer) = common::lease(&discovery, "crawler-token", "{}").await;
    let unhealthy = answer["unhealthy"].as_u64();
    assert_eq!((status, unhealthy), (409, Some(proxies.len() as u64 + 1)), "{answer}");
    // Had the operator dialled the loopback proxy, its connection would be waiting first.
    let ours = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (_, first) = listener.accept().await.unwrap();
    assert_eq!(
        first,
        ours.local_addr().unwrap(),
        "the operator dialled an internal proxy"
    );
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());

    // Allowlisted, the loopback proxy is dialled by the probe.
    let (mut op, _) = start_probing(&cluster, &pki.ca_pem, "https://www.example.com/", &[], &[]);
    let (_dialled, _) = tokio::time::timeout(PATIENCE, listener.accept())
        .await
        .expect("the allowlisted proxy was never dialled")
        .unwrap();
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}
