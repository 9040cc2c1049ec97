//! Proxy credentials through the shipped binary: an External Proxy in front of a real tinyproxy
//! that demands a user and password, its credentials in the user's labelled Secret.
//!
//! - With a wrong password in the Secret the probe is refused, and the Proxy is Unhealthy with
//!   reason `ProxyAuthRequired`; once the Secret holds the right one (the watch brings it to
//!   the probe, nothing restarts) the authenticated probe passes and the Proxy is Ready.
//! - A lease hands out the user name, the password and `proxy.url`; the list never shows them.
//! - Sentinel: neither password, nor the Basic header or Secret encoding (base64) or URL
//!   encoding of either, appears in the operator's log (at debug level, JSON), in the spans it
//!   exports (OTLP, probe spans on), in the Proxy's status, in its Events, in the metrics or in
//!   any answer of the list route.
//! - A Secret that does not name the Proxy in `crawl.example.com/proxies` (another team's, say)
//!   is refused: the Proxy gets `Provisioned=False/CredentialsError` naming the annotation and
//!   the Secret, and a `CredentialsError` event, and no lease is granted on it; once the
//!   Secret's annotation names it (nothing restarts), it is probed with the credentials, Ready,
//!   and leased with them; taken off the list, it is refused again.

mod common;

use egress_testkit as support;

use std::collections::BTreeMap;

use common::{PATIENCE, cluster, start_probing, wait_for_proxy};
use egress_api::{Credentials, CredentialsSecretRef, CredentialsType, Phase, Proxy, ProxySpec};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};

fn healthy_reason(p: &Proxy) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Healthy")
        .map(|c| c.reason.clone())
}

/// The Provisioned condition's reason and message.
fn provisioned(p: &Proxy) -> Option<(String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Provisioned")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// The user's labelled Secret `tiny-credentials`, naming the Proxy `tiny`.
fn user_secret(username: &str, password: &str) -> Secret {
    let mut secret = secret_naming(username, password, "tiny");
    secret.metadata.name = Some("tiny-credentials".into());
    secret
}

/// The labelled Secret `vendor-credentials`, naming `proxies` in its annotation.
fn secret_naming(username: &str, password: &str, proxies: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("vendor-credentials".into()),
            labels: Some(BTreeMap::from([(
                egress_api::LABEL_PROXY_CREDENTIALS.to_owned(),
                "true".to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                egress_api::ANNOTATION_CREDENTIALS_PROXIES.to_owned(),
                proxies.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            ("username".to_owned(), ByteString(username.as_bytes().to_vec())),
            ("password".to_owned(), ByteString(password.as_bytes().to_vec())),
        ])),
        ..Secret::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_proxy_with_credentials_is_probed_with_them_and_leased_with_them() {
    if !support::tinyproxy_available() {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = support::pki();
    let (target, _) = support::tls_target(&pki).await;
    let right = egress_credentials::Credentials::generate();
    // Characters that URL encoding changes, so the encoded form is a sentinel of its own.
    let wrong = "SENTINEL/wr@ng:Pass w0rd";
    let (otlp, exported) = common::raw_otlp_receiver().await;
    let otlp = format!("http://{otlp}");
    let tinyproxy = support::Tinyproxy::start_with(&[], Some((right.username(), right.password())));

    let cluster = cluster("credentials-e2e", "providers: []\n").await;
    let health_url = format!("https://localhost:{}/204", target.port());
    let (mut op, discovery) = start_probing(
        &cluster,
        &pki.ca_pem,
        &health_url,
        &[
            "--metrics-bind-address=127.0.0.1:0",
            "--metrics-secure=false",
            "--zap-log-level=debug",
            "--trace-health-probes=true",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let metrics = op.wait_msg("Serving metrics")["address"].as_str().unwrap().to_string();
    let server = &cluster.server;

    let client = server.client().unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    secrets
        .create(&PostParams::default(), &user_secret(right.username(), wrong))
        .await
        .unwrap();
    let api: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let proxy = Proxy::new(
        "tiny",
        ProxySpec {
            credentials: Some(Credentials {
                type_: CredentialsType::Secret,
                secret_ref: Some(CredentialsSecretRef {
                    name: "tiny-credentials".into(),
                }),
            }),
            ..common::external_spec(tinyproxy.port)
        },
    );
    api.create(&PostParams::default(), &proxy).await.unwrap();

    // A wrong password: refused, and said so.
    let refused = wait_for_proxy(&api, "tiny", "refused", PATIENCE, |p| {
        healthy_reason(p).as_deref() == Some(egress_api::reasons::PROXY_AUTH_REQUIRED)
    })
    .await;
    assert_eq!(refused.status.as_ref().unwrap().phase, Some(Phase::Unhealthy));

    // The right one, through the Secret only.
    secrets
        .patch(
            "tiny-credentials",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"stringData": {"password": right.password()}})),
        )
        .await
        .unwrap();
    let ready = wait_for_proxy(&api, "tiny", "Ready", PATIENCE, |p| {
        p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready)
    })
    .await;
    assert_eq!(
        healthy_reason(&ready).as_deref(),
        Some(egress_api::reasons::PROBE_SUCCEEDED)
    );

    // The lease carries what the proxy demands; a client using it gets through.
    let (_, grant) = common::lease(&discovery, "crawler-token", r#"{"target": "example.com"}"#).await;
    assert_eq!(grant["proxy"]["username"], right.username(), "{grant}");
    assert_eq!(grant["proxy"]["password"], right.password());
    let url = grant["proxy"]["url"].as_str().unwrap().to_owned();
    assert_eq!(url, right.proxy_url("127.0.0.1", tinyproxy.port));
    let through = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(&url).unwrap())
        .tls_certs_only([reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let answer = through
        .get(format!("https://localhost:{}/204", target.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 204);

    // Sentinel: nowhere else.
    let http = reqwest::Client::new();
    let text = |req: reqwest::RequestBuilder| async move { req.send().await.unwrap().text().await.unwrap() };
    let list = text(
        http.get(format!("http://{discovery}/v1/proxies"))
            .bearer_auth("crawler-token"),
    )
    .await;
    let scraped = text(http.get(format!("http://{metrics}/metrics"))).await;
    let status = serde_json::to_string(&api.get("tiny").await.unwrap().status).unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "default");
    let events = serde_json::to_string(&events.list(&ListParams::default()).await.unwrap().items).unwrap();
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    let log = op.output();
    assert!(log.contains("\"level\":\"debug\""), "the log ran at debug level");
    assert!(scraped.contains("proxy_operator"), "{scraped}");
    // The flush at shutdown has delivered every span by now.
    let spans = String::from_utf8_lossy(&exported.lock().unwrap()).into_owned();
    assert!(spans.contains("health.probe"), "no probe span was exported");
    let forms = |user: &str, password: &str| {
        let b64 = &data_encoding::BASE64;
        [
            password.to_owned(),
            b64.encode(password.as_bytes()),
            b64.encode(format!("{user}:{password}").as_bytes()),
            percent_encoding::utf8_percent_encode(password, percent_encoding::NON_ALPHANUMERIC).to_string(),
        ]
    };
    let mut sentinels = forms(right.username(), wrong).to_vec();
    sentinels.extend(forms(right.username(), right.password()));
    for (place, text) in [
        ("the log", &log),
        ("the spans", &spans),
        ("the list", &list),
        ("the metrics", &scraped),
        ("the status", &status),
        ("the events", &events),
    ] {
        for sentinel in &sentinels {
            assert!(!text.contains(sentinel.as_str()), "{sentinel:?} in {place}:\n{text}");
        }
    }
    assert!(!list.contains("username"), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_proxy_whose_secret_does_not_name_it_is_refused_until_the_secret_does() {
    if !support::tinyproxy_available() {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = support::pki();
    let (target, _) = support::tls_target(&pki).await;
    let login = egress_credentials::Credentials::generate();
    let tinyproxy = support::Tinyproxy::start_with(&[], Some((login.username(), login.password())));
    let cluster = cluster("credentials-bound", "providers: []\n").await;
    let health_url = format!("https://localhost:{}/204", target.port());
    let (mut op, discovery) = start_probing(&cluster, &pki.ca_pem, &health_url, &[], &[]);

    let client = cluster.server.client().unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    // Another team's vendor login, labelled as before the upgrade, naming only its own Proxy.
    secrets
        .create(
            &PostParams::default(),
            &secret_naming(login.username(), login.password(), "team-b"),
        )
        .await
        .unwrap();
    let api: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let proxy = Proxy::new(
        "tiny",
        ProxySpec {
            credentials: Some(Credentials {
                type_: CredentialsType::Secret,
                secret_ref: Some(CredentialsSecretRef {
                    name: "vendor-credentials".into(),
                }),
            }),
            ..common::external_spec(tinyproxy.port)
        },
    );
    api.create(&PostParams::default(), &proxy).await.unwrap();

    // Refused, and said so: the annotation and the Secret are named.
    let refused = wait_for_proxy(&api, "tiny", "refused", PATIENCE, |p| {
        provisioned(p).is_some_and(|(reason, _)| reason == egress_api::reasons::CREDENTIALS_ERROR)
    })
    .await;
    let (_, message) = provisioned(&refused).unwrap();
    assert!(
        message.contains("crawl.example.com/proxies") && message.contains("\"vendor-credentials\""),
        "{message}"
    );
    let status = refused.status.as_ref().unwrap();
    assert_eq!(status.phase, Some(Phase::Failed));
    assert_eq!(healthy_reason(&refused), None, "not probed, so no verdict");
    // The discovery API reads the same cache the refusal came from: no lease on it.
    let (code, answer) = common::lease(&discovery, "crawler-token", r#"{"target": "example.com"}"#).await;
    assert_eq!((code, &answer["considered"]), (409, &serde_json::json!(0)), "{answer}");
    // An event says it too (published after the status write, so waited for).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), "default");
    let deadline = std::time::Instant::now() + PATIENCE;
    let event = loop {
        let listed = events.list(&ListParams::default()).await.unwrap().items;
        if let Some(e) = listed.into_iter().find(|e| {
            e.reason.as_deref() == Some("CredentialsError")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("tiny")
        }) {
            break e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no CredentialsError event within {PATIENCE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("crawl.example.com/proxies"),
        "{event:?}"
    );
    let shown = serde_json::to_string(&(status, &event)).unwrap();
    assert!(!shown.contains(login.password()), "{shown}");

    // The Secret's owner names this Proxy too: accepted, probed with the login, leased.
    secrets
        .patch(
            "vendor-credentials",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {egress_api::ANNOTATION_CREDENTIALS_PROXIES: "team-b, tiny"}}
            })),
        )
        .await
        .unwrap();
    let ready = wait_for_proxy(&api, "tiny", "Ready", PATIENCE, |p| {
        p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready)
    })
    .await;
    assert_eq!(provisioned(&ready), None, "the refusal is gone");
    assert_eq!(
        healthy_reason(&ready).as_deref(),
        Some(egress_api::reasons::PROBE_SUCCEEDED)
    );
    let deadline = std::time::Instant::now() + PATIENCE;
    let grant = loop {
        let (code, answer) = common::lease(&discovery, "crawler-token", r#"{"target": "example.com"}"#).await;
        if code == 201 {
            break answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no lease within {PATIENCE:?}: {answer}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(grant["proxy"]["id"], "default/tiny", "{grant}");
    assert_eq!(grant["proxy"]["username"], login.username(), "{grant}");
    assert_eq!(grant["proxy"]["password"], login.password());

    // Taken off the list again: refused again, without anything else happening to the Proxy.
    secrets
        .patch(
            "vendor-credentials",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {egress_api::ANNOTATION_CREDENTIALS_PROXIES: "team-b"}}
            })),
        )
        .await
        .unwrap();
    wait_for_proxy(&api, "tiny", "refused again", PATIENCE, |p| {
        provisioned(p).is_some_and(|(reason, _)| reason == egress_api::reasons::CREDENTIALS_ERROR)
    })
    .await;
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
}
