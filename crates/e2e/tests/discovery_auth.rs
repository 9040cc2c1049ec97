//! The shipped binary's discovery authentication, started with the Deployment's arguments and
//! its token volume laid out as the kubelet lays it out: strangers get 401 with the error
//! envelope on every `/v1/` route, the file's token works, and a rotation of the Secret reaches
//! the API without a restart. With tokens from the file the manager makes no Secret. Named
//! clients' keys in the same volume are served, except a token two of them hold.

mod common;

use egress_testkit::secret_volume;

use std::time::Duration;

use common::{Cluster, Operator, PATIENCE, cluster, operator_binary};
use secret_volume::Volume;

/// The manager Deployment's arguments (deploy/manager/manager.yaml), with this run's paths.
fn deployment_args(providers_flag: &str, token_file: &str) -> Vec<String> {
    vec![
        "--leader-elect".into(),
        "--health-probe-bind-address=0".into(),
        providers_flag.into(),
        "--zap-encoder=json".into(),
        "--zap-time-encoding=rfc3339".into(),
        "--discovery-addr=127.0.0.1:0".into(),
        "--discovery-tls=off".into(),
        format!("--discovery-token-file={token_file}"),
    ]
}

async fn status(http: &reqwest::Client, method: reqwest::Method, url: &str, token: Option<&str>) -> (u16, String) {
    let mut req = http.request(method, url).body("{}");
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_get_401_and_a_rotated_token_file_is_followed() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("discovery-auth", "providers: []\n").await;
    let mut volume = Volume::new("operator-rotation", "first-token-value\n");
    let token_file = volume.token_file().display().to_string();
    let args = deployment_args(&providers_flag, &token_file);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut op = Operator::start(
        &operator_binary(),
        &args,
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("POD_NAMESPACE", "egress-proxies-operator-system"),
        ],
    );
    let discovery = op.wait_msg("Serving the discovery API")["address"]
        .as_str()
        .unwrap()
        .to_string();
    let auth = op.wait_msg("Discovery API authentication: bearer tokens");
    assert_eq!(auth["tokens"], 1, "{auth}");
    let http = reqwest::Client::new();
    let base = format!("http://{discovery}");

    for (method, path) in [
        (reqwest::Method::GET, "/v1/proxies"),
        (reqwest::Method::POST, "/v1/leases"),
        (reqwest::Method::DELETE, "/v1/leases/L1"),
        (reqwest::Method::POST, "/v1/leases/L1/report"),
    ] {
        for token in [None, Some("wrong-token")] {
            let (code, body) = status(&http, method.clone(), &format!("{base}{path}"), token).await;
            assert_eq!(code, 401, "{method} {path} {token:?}");
            let envelope: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(envelope["error"], "unauthorized", "{body}");
        }
    }
    let (code, _) = status(&http, reqwest::Method::GET, &format!("{base}/healthz"), None).await;
    assert_eq!(code, 200, "healthz stays open");
    let list = format!("{base}/v1/proxies");
    assert_eq!(
        status(&http, reqwest::Method::GET, &list, Some("first-token-value"))
            .await
            .0,
        200
    );

    // The kubelet swaps the Secret's new version in: the new token works, the old one goes.
    volume.update("second-token-value\n");
    let deadline = std::time::Instant::now() + PATIENCE;
    while status(&http, reqwest::Method::GET, &list, Some("second-token-value"))
        .await
        .0
        != 200
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated token was never accepted"
        );
        // NB: the manager reads the file every 10 s; poll its effect.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        status(&http, reqwest::Method::GET, &list, Some("first-token-value"))
            .await
            .0,
        401
    );
    op.wait_msg("discovery tokens reloaded");

    // Tokens came from the file: no Secret was made.
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(server.client().unwrap(), "egress-proxies-operator-system");
    assert!(secrets.get_opt("discovery-token").await.unwrap().is_none());
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    let log = op.output();
    assert!(
        !log.contains("first-token-value") && !log.contains("second-token-value"),
        "a token reached the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_in_two_clients_files_is_refused_for_both_with_a_warning_naming_them() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Bound, not left to `..`: the server must live as long as the test.
    let Cluster {
        server: _server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("discovery-clients", "providers: []\n").await;
    let volume = Volume::with_keys(
        "operator-clients",
        &[
            ("token", "default-token-value\n"),
            ("team-a", "team-a-token-value\nshared-token-value\n"),
            ("team-b", "shared-token-value\nteam-b-token-value\n"),
        ],
    );
    let token_file = volume.token_file();
    let mut args = deployment_args(&providers_flag, &token_file.display().to_string());
    args.push(format!(
        "--discovery-token-dir={}",
        token_file.parent().unwrap().display()
    ));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut op = Operator::start(
        &operator_binary(),
        &args,
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("POD_NAMESPACE", "egress-proxies-operator-system"),
        ],
    );
    let shared =
        op.wait_msg("WARNING: a discovery token is in more than one client's file: it is refused for each of them");
    assert_eq!(shared["clients"], "team-a, team-b", "{shared}");
    let auth = op.wait_msg("Discovery API authentication: bearer tokens");
    assert_eq!(
        (auth["tokens"].as_u64(), auth["clients"].as_u64()),
        (Some(3), Some(3)),
        "{auth}"
    );
    let discovery = op.wait_msg("Serving the discovery API")["address"]
        .as_str()
        .unwrap()
        .to_string();
    let http = reqwest::Client::new();
    let list = format!("http://{discovery}/v1/proxies");
    let get = |token| status(&http, reqwest::Method::GET, &list, Some(token));
    assert_eq!(get("shared-token-value").await.0, 401);
    for token in ["team-a-token-value", "team-b-token-value", "default-token-value"] {
        assert_eq!(get(token).await.0, 200, "{token}");
    }

    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    let log = op.output();
    assert!(!log.contains("token-value"), "a token reached the log");
    // The request log says whose each served request was.
    assert!(
        op.seen.iter().any(|l| l.contains(r#""client":"team-b""#)),
        "no request logged as team-b's:\n{log}"
    );
}
