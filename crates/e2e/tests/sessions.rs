//! Sessions through the shipped binary: a session asked for again gets its lease back,
//! `--max-sessions-per-client` holds a client to its cap of live sessions, and a renewal extends
//! a lease; on an External Proxy of a real tinyproxy, probed until it is healthy.

mod common;

use std::time::Duration;

use common::{PATIENCE, cluster, lease, start_probing, wait_for_proxy};
use egress_api::{Phase, Proxy, ProxySpec};
use egress_testkit as support;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// The client `default`'s token, as `start_probing` gives it.
const TOKEN: &str = "crawler-token";

/// `body`'s acquire, asked again on every tick of 100 ms until it is anything but `no_match`
/// (the discovery API sees a proxy healthy a moment after its status says Ready), within
/// [`PATIENCE`].
async fn granted(discovery: &str, body: &str) -> (u16, Value) {
    let mut again = tokio::time::interval(Duration::from_millis(100));
    let answered = tokio::time::timeout(PATIENCE, async {
        loop {
            again.tick().await;
            let (status, answer) = lease(discovery, TOKEN, body).await;
            if status != 409 || answer["error"] != "no_match" {
                return (status, answer);
            }
        }
    })
    .await;
    answered.unwrap_or_else(|_| panic!("{body}: no lease within {PATIENCE:?}"))
}

async fn renew(discovery: &str, lease_id: &Value, ttl: u64) -> (u16, Value) {
    let answer = reqwest::Client::new()
        .post(format!(
            "http://{discovery}/v1/leases/{}/renew",
            lease_id.as_str().unwrap()
        ))
        .bearer_auth(TOKEN)
        .json(&json!({ "ttlSeconds": ttl }))
        .send()
        .await
        .expect("the discovery API answers");
    let status = answer.status().as_u16();
    (status, answer.json().await.expect("a JSON answer"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_answered_again_and_a_client_is_held_to_its_cap() {
    if !support::tinyproxy_available() {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = support::pki();
    let (target, _) = support::tls_target(&pki).await;
    let tinyproxy = support::Tinyproxy::start(&[]);
    let cluster = cluster("sessions", "providers: []\n").await;
    let health_url = format!("https://localhost:{}/204", target.port());
    let (_op, discovery) = start_probing(
        &cluster,
        &pki.ca_pem,
        &health_url,
        &["--max-sessions-per-client=1"],
        &[],
    );
    let api: Api<Proxy> = Api::namespaced(cluster.server.client().unwrap(), "default");
    let spec = ProxySpec {
        max_leases: Some(5),
        ..common::external_spec(tinyproxy.port)
    };
    api.create(&PostParams::default(), &Proxy::new("tiny", spec))
        .await
        .unwrap();
    wait_for_proxy(&api, "tiny", "Ready", PATIENCE, |p| {
        p.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Ready))
    })
    .await;

    let (status, first) = granted(&discovery, r#"{"session": "login-1", "ttlSeconds": 60}"#).await;
    assert_eq!(
        (status, &first["proxy"]["id"]),
        (201, &json!("default/tiny")),
        "{first}"
    );
    let (status, again) = lease(&discovery, TOKEN, r#"{"session": "login-1", "ttlSeconds": 60}"#).await;
    assert_eq!((status, &again["leaseID"]), (200, &first["leaseID"]), "{again}");
    assert_eq!(again["proxy"]["activeLeases"], 1, "no second slot: {again}");
    // The flag's cap of one: a second session is refused, a plain lease is not a session.
    let (status, refused) = lease(&discovery, TOKEN, r#"{"session": "login-2"}"#).await;
    assert_eq!(
        (status, &refused["error"]),
        (409, &json!("too_many_sessions")),
        "{refused}"
    );
    assert_eq!(lease(&discovery, TOKEN, "{}").await.0, 201);
    let (status, renewed) = renew(&discovery, &first["leaseID"], 600).await;
    assert_eq!((status, &renewed["ttlSeconds"]), (200, &json!(600)), "{renewed}");
}
