//! The gateway dials nothing but leased proxies, and where a proxy may go is the proxy's rule:
//! through the gateway and real Squid running the kubernetes provider's generated config, a
//! request for the cloud metadata address or for loopback gets Squid's 403, with Squid's
//! `egress-deny` note naming the rule, while an allowed destination is reached.
//!
//! Like the kubernetes provider's Squid test, it re-runs itself inside a network namespace of
//! its own whose one device is a loopback carrying 192.0.2.10 (TEST-NET-1): Squid, the target,
//! the discovery API and the gateway all live there, no packet can leave, and 169.254.169.254
//! has no route at all. Never through tinyproxy, whose config refuses neither address.
//!
//! Needs root and Squid; skips with a reason without them, and fails when real backends are
//! required, as under `cargo xtask test`.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Directory, TOKEN, backend, curl_with, leases, serve_api, serve_gateway};
use egress_credentials::Credentials;
use egress_gateway::{Gateway, Settings};
use egress_provider_kubernetes::squid::{AccessRules, SquidFiles, squid_conf};
use egress_testkit::squid::{Squid, deny_note, squid_available};
use egress_testkit::{ScratchDir, netns};
use tokio_util::sync::CancellationToken;

/// Set in the re-run inside the namespace.
const IN_NAMESPACE: &str = "EGRESS_GATEWAY_SQUID_TEST_NETNS";
/// Squid's and the target's address.
const PROXY_IP: &str = "192.0.2.10";
const SQUID_PORT: u16 = 3128;
/// Bounds the whole run inside the namespace.
const OUTER_BUDGET: Duration = Duration::from_secs(300);

#[test]
fn through_the_gateway_squid_refuses_internal_destinations_by_its_own_rules() {
    if netns::inside(IN_NAMESPACE) {
        return in_namespace();
    }
    if !squid_available("the gateway's Squid test") {
        return;
    }
    netns::rerun_isolated(
        "through_the_gateway_squid_refuses_internal_destinations_by_its_own_rules",
        IN_NAMESPACE,
        "the gateway's Squid test",
        OUTER_BUDGET,
    );
}

fn in_namespace() {
    netns::loopback_with(&[PROXY_IP]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(cases());
}

async fn cases() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = egress_testkit::pki_for(&[PROXY_IP]);
    let (target, _) = egress_testkit::tls_target_at(&pki, PROXY_IP).await;
    let scratch = ScratchDir::new("gateway-squid");
    let ca = scratch.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let credentials = Credentials::generate();
    // The gateway's connections to Squid come from 192.0.2.10 or 127.0.0.1 (the kernel's choice).
    let rules = AccessRules {
        connect_ports: vec![target.port()],
        allowed_sources: Some(vec![format!("{PROXY_IP}/32"), "127.0.0.1/32".to_owned()]),
        ..AccessRules::default()
    };
    let conf = |dir: &Path| squid_conf(SQUID_PORT, &rules, true, &SquidFiles::under(dir));
    let squid = Squid::start(
        "gateway",
        (PROXY_IP, SQUID_PORT),
        conf,
        Some(&credentials.htpasswd_line()),
    );
    let stop = CancellationToken::new();
    let squid_backend = backend(
        "ns/squid-1",
        PROXY_IP,
        SQUID_PORT,
        credentials.username(),
        credentials.password(),
    );
    let api = serve_api(Directory::of(vec![squid_backend]), stop.clone()).await;
    let gateway = Arc::new(Gateway::new(leases(&api), Settings::default()));
    let (front, _) = serve_gateway(gateway, &stop).await;
    let user = format!("any:{TOKEN}");
    let ca = ca.display().to_string();
    let get = |url: String, tunnel: bool| {
        let (user, ca) = (user.clone(), ca.clone());
        async move { curl_with(front, Some(&user), tunnel, &url, &["--cacert", &ca]).await }
    };

    // An allowed destination: through Squid, with Squid's credentials, to the target.
    let allowed = format!("https://{PROXY_IP}:{}/204", target.port());
    assert_eq!(get(allowed, true).await.0, "204");
    // The metadata address and loopback, over CONNECT: Squid's 403, passed on.
    let port = target.port();
    for host in ["169.254.169.254", "127.0.0.1"] {
        let (code, body) = get(format!("https://{host}:{port}/"), true).await;
        assert_eq!(code, "403", "{host}: {body}");
    }
    // The same CONNECT again: still Squid's refusal (a proxy that refused a destination by its
    // rules is not reported, so it is not cooling down for it).
    assert_eq!(get(format!("https://169.254.169.254:{port}/"), true).await.0, "403");
    // A metadata service by name over plain HTTP: Squid's 403 page, passed on.
    let metadata = "http://metadata.google.internal/computeMetadata/v1/".to_owned();
    assert_eq!(get(metadata.clone(), false).await.0, "403");

    let needles = [
        format!(" CONNECT 169.254.169.254:{port} "),
        format!(" CONNECT 127.0.0.1:{port} "),
        format!(" GET {metadata} "),
    ];
    let log = squid.access_log(&needles).await;
    assert_eq!(deny_note(&log, &needles[0]), "link-local", "{log:#?}");
    assert_eq!(deny_note(&log, &needles[1]), "localhost", "{log:#?}");
    assert_eq!(deny_note(&log, &needles[2]), "metadata", "{log:#?}");
    // The gateway's credentials for Squid never appear in Squid's log either.
    let text = log.join("\n");
    assert!(
        !text.contains(credentials.password()) && !text.contains(TOKEN),
        "{text}"
    );
}
