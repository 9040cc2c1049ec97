//! The shipped binary against the in-memory API server: it starts, takes the leader Lease, serves
//! probes and metrics, counts Proxies by phase on its metrics, and stops cleanly on SIGTERM.

mod common;

use std::time::Duration;

use common::{
    Cluster, Operator, PATIENCE, cluster, create_unreachable_external, operator_binary, served, until_status_written,
};
use egress_api::Proxy;
use egress_kube_testserver::Verb;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};

/// The controller-runtime families the Go operator's dashboards read, as `# TYPE` names them
/// (counters without their `_total`).
const CONTROLLER_RUNTIME_FAMILIES: &[&str] = &[
    "controller_runtime_reconcile",
    "controller_runtime_reconcile_errors",
    "controller_runtime_reconcile_panics",
    "controller_runtime_reconcile_timeouts",
    "controller_runtime_reconcile_time_seconds",
    "controller_runtime_max_concurrent_reconciles",
    "controller_runtime_active_workers",
    "leader_election_master_status",
    "rest_client_requests",
    "workqueue_adds",
    "workqueue_retries",
    "workqueue_depth",
    "workqueue_queue_duration_seconds",
    "workqueue_work_duration_seconds",
    "workqueue_unfinished_work_seconds",
    "workqueue_longest_running_processor_seconds",
    "process_cpu_seconds",
    "process_open_fds",
    "process_max_fds",
    "process_virtual_memory_bytes",
    "process_virtual_memory_max_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
];

async fn get(url: &str) -> (u16, String) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let r = client.get(url).send().await.expect(url);
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_starts_serves_and_stops_on_sigterm() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("binary", "providers: []\n").await;

    let mut op = Operator::start(
        &operator_binary(),
        &[
            &providers_flag,
            "--leader-elect",
            "--health-probe-bind-address=127.0.0.1:0",
            "--metrics-bind-address=127.0.0.1:0",
            "--metrics-secure=false",
            "--zap-encoder=json",
            "--discovery-addr=127.0.0.1:0",
            "--discovery-tls=off",
            "--zap-time-encoding=rfc3339",
            &format!("--allowed-internal-destinations={}", common::LOCAL_DESTINATIONS),
            "--external-proxy-namespaces=default",
            // The Proxies are in `default`, not in the operator's own namespace.
            "--proxy-namespace=default",
        ],
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("POD_NAMESPACE", "egress-proxies-operator-system"),
            ("POD_NAME", "manager-0"),
        ],
    );
    let start = op.wait_msg("Starting egress-proxies-operator");
    assert_eq!(start["commit"], egress_manager::COMMIT);
    assert!(start["ts"].as_str().is_some_and(|t| t.ends_with('Z')), "{start}");
    op.wait_msg("tracing disabled");
    op.wait_line("no-providers warning", |l| {
        l.contains("WARNING: no providers are configured")
    });
    let probes = served(&op.wait_msg("Serving health probes"));
    let metrics = served(&op.wait_msg("Serving metrics"));
    op.wait_msg("Starting manager");

    assert_eq!(get(&format!("http://{probes}/healthz")).await, (200, "ok".into()));
    assert_eq!(get(&format!("http://{probes}/readyz")).await, (200, "ok".into()));
    assert_eq!(get(&format!("http://{probes}/nope")).await.0, 404);

    let leases: Api<Lease> = Api::namespaced(server.client().unwrap(), "egress-proxies-operator-system");
    let lease = leases.get("b47711d1.example.com").await.expect("the leader Lease");
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    assert!(holder.starts_with("manager-0_"), "{holder}");

    // An External Proxy whose proxy is not there: the health engine probes it, fails, and the
    // reconciler marks it Unhealthy; the metrics count it by phase and count its failed probes.
    let proxies: Api<Proxy> = Api::namespaced(server.client().unwrap(), "default");
    create_unreachable_external(&proxies).await;
    let unhealthy = kube::runtime::wait::await_condition(proxies.clone(), "outside", |p: Option<&Proxy>| {
        p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase) == Some(egress_api::Phase::Unhealthy)
    });
    tokio::time::timeout(PATIENCE, unhealthy)
        .await
        .expect("the External Proxy is found Unhealthy")
        .unwrap();
    // The gauge reads the operator's own cache, which follows the API server by a watch event.
    let deadline = std::time::Instant::now() + PATIENCE;
    let scrape = loop {
        let (status, text) = get(&format!("http://{metrics}/metrics")).await;
        assert_eq!(status, 200);
        if text
            .lines()
            .any(|l| l == r#"proxy_operator_proxies{phase="Unhealthy"} 1"#)
        {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no Unhealthy in the phase gauge:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        scrape
            .lines()
            .any(|l| l.starts_with(r#"healthcheck_failures_total{proxy="default/outside"} "#)),
        "{scrape}"
    );
    // controller-runtime's families, as the Go operator served them: the reconciles that marked
    // the Proxy Unhealthy were counted, this replica leads, and the process collector reports.
    let families: Vec<&str> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    for family in CONTROLLER_RUNTIME_FAMILIES {
        assert!(families.contains(family), "no {family} family:\n{scrape}");
    }
    // Removed: this controller has no error it does not retry (docs/migrating-from-go.md).
    assert!(
        !families.contains(&"controller_runtime_terminal_reconcile_errors"),
        "{scrape}"
    );
    assert!(
        scrape
            .lines()
            .any(|l| l == r#"leader_election_master_status{name="b47711d1.example.com"} 1"#),
        "{scrape}"
    );
    let reconciles: f64 = scrape
        .lines()
        .filter(|l| l.starts_with("controller_runtime_reconcile_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(reconciles >= 1.0, "no reconcile counted:\n{scrape}");
    let adds = scrape
        .lines()
        .find_map(|l| l.strip_prefix(r#"workqueue_adds_total{name="proxy",controller="proxy"} "#))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(adds.is_some_and(|n| n >= 1.0), "no add counted:\n{scrape}");
    // The API calls that got it there: the status patches among them.
    assert!(
        scrape
            .lines()
            .any(|l| l.starts_with(r#"rest_client_requests_total{code="200",method="PATCH",host="127.0.0.1:"#)),
        "{scrape}"
    );
    // The discovery API lists it and will not lease it.
    let discovery = served(&op.wait_msg("Serving the discovery API"));
    // No token was given: the manager made one, kept it in the Secret of its namespace, and
    // said how to read it (never the token itself).
    let made = op.wait_msg(
        "WARNING: No discovery token was configured: made one and stored it in a Secret; clients send it as a bearer token",
    );
    assert_eq!(
        made["secret"], "egress-proxies-operator-system/discovery-token",
        "{made}"
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(server.client().unwrap(), "egress-proxies-operator-system");
    let secret = secrets.get("discovery-token").await.unwrap();
    let token = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    assert_eq!(token.len(), 52);
    let http = reqwest::Client::new();
    let anonymous = http.get(format!("http://{discovery}/v1/proxies")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let envelope: serde_json::Value = anonymous.json().await.unwrap();
    assert_eq!(envelope["error"], "unauthorized");
    let listed = common::proxy_list(&discovery, &token).await;
    assert_eq!(listed["count"], 1, "{listed}");
    assert_eq!(listed["proxies"][0]["id"], "default/outside");
    assert_eq!(listed["proxies"][0]["healthy"], false);
    let (status, refused) = common::lease(&discovery, &token, "{}").await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(
        (refused["considered"].as_u64(), refused["unhealthy"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(scrape.contains("proxy_operator_leases_active 0"), "{scrape}");
    assert!(
        scrape.contains("proxy_operator_lease_cooldowns_dropped_total 0"),
        "{scrape}"
    );
    assert!(
        !scrape.contains("proxy_operator_provider_target_up"),
        "no providers, no targets:\n{scrape}"
    );
    // The create budgets are registered: their gauge's family is served (no entry, so no series;
    // the counter family, having none either, is left out of the scrape altogether).
    let family = "# TYPE proxy_operator_provider_create_budget_waiting gauge";
    assert!(scrape.lines().any(|l| l == family), "no {family:?}:\n{scrape}");

    op.terminate();
    let status = op.wait_exit();
    assert_eq!(status.code(), Some(0), "{}", op.output());
    assert!(op.output().contains("\"msg\":\"Stopped\""), "{}", op.output());
    assert!(!op.output().contains(&token), "the discovery token reached the log");
    for line in op.seen.iter().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v.get("traceID").is_none(), "tracing is off, yet {line}");
    }
}

async fn get_tls(url: &str, token: Option<&str>) -> (u16, http::Version, String) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let mut req = client.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect(url);
    (r.status().as_u16(), r.version(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_metrics_serve_only_authorised_callers_over_https() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = egress_kube_testserver::TestServer::builder()
        .custom_resource::<Proxy>()
        .custom_resource::<egress_api::ProviderHealth>()
        .user(
            "scraper-token",
            "system:serviceaccount:monitoring:prometheus",
            &["system:serviceaccounts"],
        )
        .user("nosy-token", "system:serviceaccount:default:nosy", &[])
        .allow_path("system:serviceaccount:monitoring:prometheus", "get", "/metrics")
        .start()
        .await
        .unwrap();
    let dir = egress_testkit::scratch_dir("operator-secure-metrics");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let providers = dir.join("providers.yaml");
    std::fs::write(&providers, "providers: []\n").unwrap();
    let providers_flag = format!("--providers-config={}", providers.display());
    for (http2, version) in [(false, http::Version::HTTP_11), (true, http::Version::HTTP_2)] {
        let http2_flag = format!("--enable-http2={http2}");
        let mut op = Operator::start(
            &operator_binary(),
            &[
                &providers_flag,
                "--health-probe-bind-address=0",
                "--metrics-bind-address=127.0.0.1:0",
                &http2_flag,
                "--zap-encoder=json",
                "--discovery-addr=127.0.0.1:0",
                "--discovery-tls=off",
            ],
            &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
        );
        let line = op.wait_msg("Serving metrics");
        assert_eq!(line["secure"], true);
        let url = format!("https://{}/metrics", served(&line));
        assert_eq!(get_tls(&url, None).await.0, 401, "no token");
        assert_eq!(
            get_tls(&url, Some("forged")).await.0,
            401,
            "a token the API server rejects"
        );
        assert_eq!(
            get_tls(&url, Some("nosy-token")).await.0,
            403,
            "authenticated but not allowed"
        );
        let reviews = || server.requests().count(Verb::Create, "tokenreviews");
        let before = reviews();
        let (status, got, _) = get_tls(&url, Some("scraper-token")).await;
        assert_eq!((status, got), (200, version), "allowed, over {version:?}");
        assert_eq!(get_tls(&url, Some("scraper-token")).await.0, 200);
        assert_eq!(reviews(), before + 1, "a repeated scrape reuses the answer");
        op.terminate();
        assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());
        // Checked once the process is gone and every line it wrote has been read.
        assert!(
            !op.output().contains("scraper-token") && !op.output().contains("forged"),
            "tokens never reach the logs:\n{}",
            op.output()
        );
    }
    // The reviews it made are exactly what deploy/rbac/metrics_auth_role.yaml grants.
    let used: Vec<(egress_kube_testserver::Verb, String)> = server
        .requests()
        .snapshot()
        .into_keys()
        .filter(|(_, r)| r.ends_with("reviews"))
        .collect();
    let role = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/rbac/metrics_auth_role.yaml"
    ))
    .unwrap();
    for (verb, resource) in &used {
        assert_eq!(verb.as_str(), "create");
        assert!(
            role.contains(&format!("resources: [\"{resource}\"]")),
            "{resource} not granted"
        );
    }
    assert_eq!(used.len(), 2, "{used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_loses_the_lease_stops_with_exit_1() {
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("lease-loss", "providers: []\n").await;
    let mut op = Operator::start(
        &operator_binary(),
        &[
            &providers_flag,
            "--leader-elect",
            "--health-probe-bind-address=0",
            "--zap-encoder=json",
            "--discovery-addr=127.0.0.1:0",
            "--discovery-tls=off",
        ],
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("POD_NAMESPACE", "egress-proxies-operator-system"),
        ],
    );
    op.wait_msg("Starting manager");
    // Another replica takes the Lease over (as after a partition): the next renewal sees it.
    let leases: Api<Lease> = Api::namespaced(server.client().unwrap(), "egress-proxies-operator-system");
    let mut lease = leases.get("b47711d1.example.com").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("another-replica".into());
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases
        .replace("b47711d1.example.com", &PostParams::default(), &lease)
        .await
        .unwrap();
    let status = op.wait_exit();
    assert_eq!(status.code(), Some(1), "{}", op.output());
    assert!(
        op.output().contains("\"msg\":\"leader election lost\""),
        "{}",
        op.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replica_stops_with_exit_0_on_sigterm() {
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("standby", "providers: []\n").await;
    // Another replica leads, for long enough that this one stays a standby.
    let leases: Api<Lease> = Api::namespaced(server.client().unwrap(), "egress-proxies-operator-system");
    let mut lease = Lease::default();
    lease.metadata.name = Some("b47711d1.example.com".into());
    lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
        holder_identity: Some("another-replica".into()),
        lease_duration_seconds: Some(3600),
        renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        )),
        ..Default::default()
    });
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut op = Operator::start(
        &operator_binary(),
        &[
            &providers_flag,
            "--leader-elect",
            "--health-probe-bind-address=0",
            "--zap-encoder=json",
            "--discovery-addr=127.0.0.1:0",
            "--discovery-tls=off",
        ],
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("POD_NAMESPACE", "egress-proxies-operator-system"),
        ],
    );
    op.wait_msg("Attempting to acquire leader lease");
    op.terminate();
    let status = op.wait_exit();
    // A rolling update stops standbys this way; a failure exit would page someone.
    assert_eq!(status.code(), Some(0), "{}", op.output());
    assert!(!op.output().contains("\"msg\":\"Starting manager\""), "{}", op.output());
}

/// `--kubeconfig`, the Go operator's flag (controller-runtime's), names the file the client
/// reads, ahead of `KUBECONFIG`; a file that is not there stops the start with its path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubeconfig_flag_names_the_cluster() {
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("kubeconfig-flag", "providers: []\n").await;
    let flag = format!("--kubeconfig={kubeconfig}");
    let mut op = Operator::start(
        &operator_binary(),
        &[
            &providers_flag,
            &flag,
            "--health-probe-bind-address=0",
            "--metrics-bind-address=0",
            "--zap-encoder=json",
            "--discovery-addr=127.0.0.1:0",
            "--discovery-tls=off",
        ],
        &[("KUBECONFIG", "/nonexistent/kubeconfig")],
    );
    op.wait_msg("Starting manager");
    // It is serving the cluster the flag names: an External Proxy there gets a status.
    let proxies: Api<Proxy> = Api::namespaced(server.client().unwrap(), "default");
    create_unreachable_external(&proxies).await;
    until_status_written(proxies).await;
    op.terminate();
    assert_eq!(op.wait_exit().code(), Some(0), "{}", op.output());

    let (code, output) = common::run_to_exit(
        &operator_binary(),
        &[&providers_flag, "--kubeconfig=/nonexistent/flag-kubeconfig"],
    );
    assert_ne!(code, Some(0), "{output}");
    assert!(output.contains("/nonexistent/flag-kubeconfig"), "{output}");
}
