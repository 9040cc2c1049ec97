//! The shipped binary refuses External Proxies that point at internal destinations: each gets
//! `Provisioned=False/DestinationRefused`, phase `Failed` and a Warning event, nothing is
//! dialled, and none is offered for a lease. "Nothing is dialled" is checked twice: a listener
//! at the loopback destination sees no connection, and the binary runs under strace, whose
//! record of every destination it sent to holds only loopback addresses (no dial of the others,
//! no name lookup). The test adds no address to this machine's interfaces. Named in
//! `--allowed-internal-destinations`, the loopback one is probed as usual. An External Proxy
//! outside `--external-proxy-namespaces` is refused alike (`ExternalNotAllowed`).

mod common;

use egress_testkit as support;

use std::net::IpAddr;
use std::path::Path;

use common::{PATIENCE, cluster, external_spec, start_probing, start_probing_traced, trace, wait_for_proxy};
use egress_api::{Endpoint, Phase, Proxy, ProxySpec, conditions, reasons};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use tokio::net::{TcpListener, TcpStream};

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

/// The refused External Proxies in `default`; the one on the loopback address points at `port`.
fn refused_proxies(port: u16) -> [(&'static str, ProxySpec); 5] {
    [
        ("loopback", external_at("127.0.0.1", i32::from(port))),
        ("metadata", external_at("169.254.169.254", 80)),
        ("metadata-as-a-number", external_at("2852039166", 80)),
        ("private", external_at("10.0.0.7", 3128)),
        ("service", external_at("redis.crawlers.svc.cluster.local", 6379)),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_proxies_at_internal_destinations_are_refused_and_never_dialled() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    // The control: the one destination allowed, on another loopback address (all of 127/8 is
    // on the loopback device, so no address is added). Its probes show that probing has run.
    let control = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let pki = support::pki();
    let cluster = cluster("destinations", "providers: []\n").await;
    // The flag given last wins over the tests' usual allowlist.
    let flags = [
        "--allowed-internal-destinations=127.0.0.2",
        "--proxy-namespace=default,team-b",
    ];
    // On this machine, so that the operator's own fetch of the probe target (which it makes
    // with no proxy) stays on the loopback device like everything else it may send.
    let health_url = "https://127.0.0.1:9/generate_204";
    let trace_file = cluster.dir.join("operator.strace");
    let traced = trace::strace_available();
    let (mut op, discovery) = if traced {
        start_probing_traced(&cluster, &pki.ca_pem, health_url, &flags, &trace_file)
    } else {
        start_probing(&cluster, &pki.ca_pem, health_url, &flags, &[])
    };
    let client = cluster.server.client().unwrap();
    let api: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let proxies = refused_proxies(listener.local_addr().unwrap().port());
    for (name, spec) in &proxies {
        api.create(&PostParams::default(), &Proxy::new(name, spec.clone()))
            .await
            .unwrap();
    }
    let vendor = create_vendor_elsewhere(&client).await;
    let control_port = i32::from(control.local_addr().unwrap().port());
    let control_spec = external_at("127.0.0.2", control_port);
    api.create(&PostParams::default(), &Proxy::new("control", control_spec))
        .await
        .unwrap();
    // Created last, the control enters the probe schedule last. First probes are due within one
    // interval of a Proxy's arrival, so by the control's second probe every refused Proxy would
    // have been dialled had it been scheduled.
    for _ in 0..2 {
        let (probe, _) = tokio::time::timeout(PATIENCE, control.accept())
            .await
            .expect("the allowed control Proxy is probed")
            .unwrap();
        drop(probe);
    }

    let p = wait_for_proxy(&vendor, "vendor", "refused", PATIENCE, |p| refused_reason(p).is_some()).await;
    assert_eq!(refused_reason(&p).as_deref(), Some(reasons::EXTERNAL_NOT_ALLOWED));
    for (name, _) in &proxies {
        assert_refused_without_verdict(&api, name).await;
    }
    assert_refusal_events(&client, proxies.len()).await;
    let (status, answer) = common::lease(&discovery, "crawler-token", "{}").await;
    let unhealthy = answer["unhealthy"].as_u64();
    // The refused ones, the vendor's and the control (whose probes fail).
    assert_eq!((status, unhealthy), (409, Some(proxies.len() as u64 + 2)), "{answer}");
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    if traced {
        assert_only_loopback_destinations(&trace_file, cluster.server.addr().ip());
    }
    assert_not_dialled(&listener).await;

    // Allowlisted, the loopback proxy is dialled by the probe.
    let (mut op, _) = start_probing(&cluster, &pki.ca_pem, health_url, &[], &[]);
    let (_dialled, _) = tokio::time::timeout(PATIENCE, listener.accept())
        .await
        .expect("the allowlisted proxy was never dialled")
        .unwrap();
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}

/// A public proxy, but in `team-b`, where External Proxies are not accepted: the API of its
/// namespace.
async fn create_vendor_elsewhere(client: &kube::Client) -> Api<Proxy> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut team_b = Namespace::default();
    team_b.metadata.name = Some("team-b".into());
    namespaces.create(&PostParams::default(), &team_b).await.unwrap();
    let elsewhere: Api<Proxy> = Api::namespaced(client.clone(), "team-b");
    let vendor = external_at("proxy.vendor.example", 3128);
    elsewhere
        .create(&PostParams::default(), &Proxy::new("vendor", vendor))
        .await
        .unwrap();
    elsewhere
}

async fn assert_refused_without_verdict(api: &Api<Proxy>, name: &str) {
    let p = wait_for_proxy(api, name, "refused", PATIENCE, |p| refused_reason(p).is_some()).await;
    assert_eq!(
        refused_reason(&p).as_deref(),
        Some(reasons::DESTINATION_REFUSED),
        "{name}"
    );
    let conditions = &p.status.as_ref().unwrap().conditions;
    let healthy = conditions.iter().any(|c| c.type_ == conditions::HEALTHY);
    assert!(!healthy, "{name} has a verdict");
}

async fn assert_refusal_events(client: &kube::Client, at_least: usize) {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let refused = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reasons::DESTINATION_REFUSED))
        .count();
    assert!(refused >= at_least, "{refused} DestinationRefused events");
}

/// Had the operator dialled the proxy behind `listener`, its connection would be waiting first.
async fn assert_not_dialled(listener: &TcpListener) {
    let ours = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (_, first) = listener.accept().await.unwrap();
    assert_eq!(
        first,
        ours.local_addr().unwrap(),
        "the operator dialled an internal proxy"
    );
}

/// Every packet the operator sent stayed on the loopback device: no dial of the refused
/// destinations, and no name lookup of the refused names (a lookup is a datagram to a name
/// server). The trace must hold the operator's dial of the API server, or it proves nothing.
fn assert_only_loopback_destinations(trace_file: &Path, api_server: IpAddr) {
    let text = std::fs::read_to_string(trace_file).unwrap();
    let destinations = trace::destinations(&text);
    assert!(
        destinations.contains(&api_server),
        "the trace misses the API server:\n{text}"
    );
    let elsewhere: Vec<_> = destinations.into_iter().filter(|ip| !trace::is_loopback(*ip)).collect();
    assert!(elsewhere.is_empty(), "the operator sent to {elsewhere:?}:\n{text}");
}

#[test]
fn strace_destinations_are_read_in_every_family() {
    let text = r#"12 connect(9, {sa_family=AF_INET, sin_port=htons(6443), sin_addr=inet_addr("127.0.0.1")}, 16) = -1 EINPROGRESS
13 sendto(4, "x", 1, 0, {sa_family=AF_INET6, sin6_port=htons(53), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "2001:db8::53", &sin6_addr), sin6_scope_id=0}, 28) = 1
14 sendmsg(5, {msg_name={sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.0.0.2")}, msg_namelen=16}, 0) = 30
15 connect(6, {sa_family=AF_INET6, sin6_port=htons(80), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::ffff:127.0.0.1", &sin6_addr), sin6_scope_id=0}, 28) = 0
16 connect(7, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1 ENOENT"#;
    let found = trace::destinations(text);
    let expected: Vec<IpAddr> = ["127.0.0.1", "2001:db8::53", "10.0.0.2", "::ffff:127.0.0.1"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(found, expected);
    let loopback: Vec<bool> = found.into_iter().map(trace::is_loopback).collect();
    assert_eq!(loopback, [true, false, false, true]);
}
