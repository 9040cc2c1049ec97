//! The shipped binary's health engine end to end: an External Proxy in front of a real tinyproxy
//! turns Healthy and Ready, goes Unhealthy once tinyproxy stops (after the failure threshold),
//! and recovers when it starts again. Probes fetch a local TLS target signed by a test CA that
//! the operator trusts through `--health-check-ca-file`.

mod common;

use egress_testkit as support;

use common::{PATIENCE, cluster, start_probing};
use egress_api::{HealthCheckSpec, Phase, Proxy, ProxySpec};
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;

async fn wait_phase(api: &Api<Proxy>, name: &str, phase: Phase) -> Proxy {
    let cond = await_condition(api.clone(), name, move |p: Option<&Proxy>| {
        p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase) == Some(phase)
    });
    tokio::time::timeout(PATIENCE, cond)
        .await
        .unwrap_or_else(|_| panic!("{name} not {phase:?} within {PATIENCE:?}"))
        .unwrap()
        .unwrap()
}

fn healthy(p: &Proxy) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Healthy")
        .map(|c| format!("{:?}", c.status))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_proxy_follows_its_real_proxy_up_down_and_up() {
    if !support::tinyproxy_available() {
        return;
    }
    let pki = support::pki();
    let (target, _) = support::tls_target(&pki).await;
    let mut tinyproxy = support::Tinyproxy::start(&[]);

    let cluster = cluster("health-e2e", "providers: []\n").await;
    let health_url = format!("https://localhost:{}/204", target.port());
    let (mut op, discovery) = start_probing(&cluster, &pki.ca_pem, &health_url, &[], &[]);
    let server = &cluster.server;

    let api: Api<Proxy> = Api::namespaced(server.client().unwrap(), "default");
    let proxy = Proxy::new(
        "tiny",
        ProxySpec {
            health_check: Some(HealthCheckSpec {
                failure_threshold: Some(2),
                ..Default::default()
            }),
            ..common::external_spec(tinyproxy.port)
        },
    );
    api.create(&PostParams::default(), &proxy).await.unwrap();
    let ready = wait_phase(&api, "tiny", Phase::Ready).await;
    assert_eq!(healthy(&ready).as_deref(), Some("True"));
    assert!(ready.status.unwrap().latency_millis.is_some_and(|l| l >= 0));

    // Ready means leasable: a crawler gets it through the discovery API (with the token).
    let without_token = reqwest::Client::new()
        .post(format!("http://{discovery}/v1/leases"))
        .body(r#"{"target": "example.com"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(without_token.status(), 401);
    let (_, grant) = common::lease(&discovery, "crawler-token", r#"{"target": "example.com"}"#).await;
    assert_eq!(grant["proxy"]["id"], "default/tiny", "{grant}");
    assert_eq!(grant["proxy"]["port"], i64::from(tinyproxy.port));
    assert_eq!(grant["proxy"]["healthy"], true);

    tinyproxy.stop();
    let down = wait_phase(&api, "tiny", Phase::Unhealthy).await;
    assert_eq!(healthy(&down).as_deref(), Some("False"));

    tinyproxy.resume();
    let back = wait_phase(&api, "tiny", Phase::Ready).await;
    assert_eq!(healthy(&back).as_deref(), Some("True"));

    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}

/// `--health-check-ca-file` is read again every 10 s, as a ConfigMap or Secret volume's file
/// changes in place when a CA is rotated: probes of a target whose CA the file did not hold
/// fail, and pass once it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_follow_their_ca_file() {
    if !support::tinyproxy_available() {
        return;
    }
    let (pki, other) = (support::pki(), support::pki());
    let (target, _) = support::tls_target(&pki).await;
    let tinyproxy = support::Tinyproxy::start(&[]);

    let cluster = cluster("health-ca-rotation", "providers: []\n").await;
    let health_url = format!("https://localhost:{}/204", target.port());
    let (mut op, _) = start_probing(&cluster, &other.ca_pem, &health_url, &[], &[]);
    let api: Api<Proxy> = Api::namespaced(cluster.server.client().unwrap(), "default");
    let proxy = Proxy::new(
        "tiny",
        ProxySpec {
            health_check: Some(HealthCheckSpec {
                failure_threshold: Some(1),
                ..Default::default()
            }),
            ..common::external_spec(tinyproxy.port)
        },
    );
    api.create(&PostParams::default(), &proxy).await.unwrap();
    let distrusted = wait_phase(&api, "tiny", Phase::Unhealthy).await;
    assert_eq!(healthy(&distrusted).as_deref(), Some("False"));

    // Whole, at once, as a volume swaps its files.
    let (next, file) = (cluster.dir.join(".ca.pem.next"), cluster.dir.join("ca.pem"));
    std::fs::write(&next, &pki.ca_pem).unwrap();
    std::fs::rename(&next, &file).unwrap();
    let changed = op.wait_msg("Health check CA file changed; new probes use it");
    assert_eq!(changed["files"], file.display().to_string(), "{changed}");
    let trusted = wait_phase(&api, "tiny", Phase::Ready).await;
    assert_eq!(healthy(&trusted).as_deref(), Some("True"));

    // A file that holds no certificate: refused by flag (the unit tests show the CA in use
    // stays).
    std::fs::write(&next, "not a certificate\n").unwrap();
    std::fs::rename(&next, &file).unwrap();
    let refused = op.wait_msg("WARNING: Health check CA file cannot be used; the CA certificates in use stay");
    assert_eq!(refused["flag"], "--health-check-ca-file", "{refused}");
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}
