//! The shipped binary's admission per client: two clients from the token volume, one held by
//! the clients config (a ConfigMap volume, followed) to a small budget. Over it, its requests
//! get 429 `rate_limited` with `Retry-After` before their bodies are read (and a request that
//! announced a body has its connection closed), while the other client is served; the Rust
//! client waits as told and gets its answer; a changed config is followed, and one that cannot
//! be used keeps the budgets (and scopes) in force.

mod common;

use egress_discovery::client::{Client, ListFilter};
use egress_testkit::secret_volume::Volume;

use common::{Cluster, Operator, cluster, operator_binary};

const TEAM_A: &str = "team-a-token-value";
const TEAM_B: &str = "team-b-token-value";

/// A list call as `token`: its status, `Retry-After` and `Connection` headers, and body.
async fn list(http: &reqwest::Client, base: &str, token: &str) -> (u16, Option<String>, Option<String>, String) {
    let r = http
        .get(format!("{base}/v1/proxies"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let header = |name| {
        r.headers()
            .get(name)
            .map(|v: &reqwest::header::HeaderValue| v.to_str().unwrap().to_owned())
    };
    let (retry_after, connection) = (header("retry-after"), header("connection"));
    (r.status().as_u16(), retry_after, connection, r.text().await.unwrap())
}

/// The answers `token`'s list calls get until one is refused (the budget is small).
async fn until_refused(
    http: &reqwest::Client,
    base: &str,
    token: &str,
) -> (u16, Option<String>, Option<String>, String) {
    for _ in 0..100 {
        let answer = list(http, base, token).await;
        if answer.0 != 200 {
            return answer;
        }
    }
    panic!("100 calls and none refused: the budget is not held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_budget_gets_429_while_another_is_served() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Bound, not left to `..`: the server must live as long as the test.
    let Cluster {
        server: _server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("discovery-admission", "providers: []\n").await;
    let tokens = Volume::with_keys(
        "admission-tokens",
        &[("team-a", &format!("{TEAM_A}\n")), ("team-b", &format!("{TEAM_B}\n"))],
    );
    // One request a second, two at once: a third in a row is over.
    let mut config = Volume::with_keys(
        "admission-config",
        &[(
            "clients.yaml",
            "clients:\n  team-a:\n    requestsPerSecond: 1\n    burst: 2\n",
        )],
    );
    let args = [
        "--health-probe-bind-address=0".to_owned(),
        providers_flag,
        "--zap-encoder=json".into(),
        "--discovery-addr=127.0.0.1:0".into(),
        "--discovery-tls=off".into(),
        format!(
            "--discovery-token-dir={}",
            tokens.file("team-a").parent().unwrap().display()
        ),
        format!("--discovery-token-file={}", tokens.token_file().display()),
        format!("--discovery-clients-config={}", config.file("clients.yaml").display()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut op = Operator::start(
        &operator_binary(),
        &args,
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("POD_NAMESPACE", "egress-proxies-operator-system"),
        ],
    );
    let read = op.wait_msg("Discovery clients config read");
    assert_eq!(read["clients"], 1, "{read}");
    let discovery = op.wait_msg("Serving the discovery API")["address"]
        .as_str()
        .unwrap()
        .to_string();
    let base = format!("http://{discovery}");
    let http = reqwest::Client::new();

    let (status, retry_after, _, body) = until_refused(&http, &base, TEAM_A).await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")), "{body}");
    let envelope: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(envelope["error"], "rate_limited", "{body}");
    // Meanwhile the other client is served: its budget is its own.
    for _ in 0..5 {
        assert_eq!(list(&http, &base, TEAM_B).await.0, 200);
    }
    // Refused with a body announced: the body is never read, and the connection is closed.
    let _ = until_refused(&http, &base, TEAM_A).await;
    let refused = http
        .post(format!("{base}/v1/leases"))
        .bearer_auth(TEAM_A)
        .body(r#"{"target": "example.com"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["connection"], "close");

    // The Rust client over the budget waits as told and gets its answer (its retries are
    // counted in crates/discovery/tests/client.rs against a scripted server).
    let _ = until_refused(&http, &base, TEAM_A).await;
    let client = Client::new(&base, Some(TEAM_A.into())).unwrap();
    client
        .list(&ListFilter::default())
        .await
        .expect("served after Retry-After");

    // A changed config is followed: team-a's budget grows.
    config.update_keys(&[("clients.yaml", "clients:\n  team-a:\n    requestsPerSecond: 1000\n")]);
    op.wait_msg("Discovery clients config changed; the new budgets and scopes are in force");
    for _ in 0..20 {
        assert_eq!(list(&http, &base, TEAM_A).await.0, 200);
    }
    // One that cannot be used keeps it.
    config.update_keys(&[("clients.yaml", "clients:\n  team-a:\n    rate: 1\n")]);
    let kept = op.wait_msg("WARNING: Discovery clients config cannot be used; the budgets and scopes in force stay");
    assert_eq!(kept["flag"], "--discovery-clients-config", "{kept}");
    for _ in 0..20 {
        assert_eq!(list(&http, &base, TEAM_A).await.0, 200);
    }

    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
    assert!(!op.output().contains("token-value"), "a token reached the log");
    // Each refusal is in the request log under its client's name (four refused above).
    let refused = op
        .seen
        .iter()
        .filter(|l| l.contains(r#""client":"team-a""#) && l.contains(r#""status":429"#))
        .count();
    assert!(refused >= 4, "{refused} refusals of team-a logged:\n{}", op.output());
    assert!(
        !op.seen
            .iter()
            .any(|l| l.contains(r#""client":"team-b""#) && l.contains(r#""status":429"#))
    );
}
