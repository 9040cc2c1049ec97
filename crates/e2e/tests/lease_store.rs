//! The shipped binary with its leases in Redis: published and decided there, a Redis that goes
//! away answered 503, over TLS with the CA and client certificate files followed.

mod common;

use std::time::Duration;

use common::{
    Cluster, Operator, PATIENCE, cluster, create_unreachable_external, operator_binary, served, until_status_written,
};
use egress_api::Proxy;
use kube::api::Api;

/// With `--lease-store=redis://…`: the leader publishes its proxies to Redis, leases are
/// decided there, and a Redis that goes away makes the lease API answer 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_keeps_leases_in_redis() {
    keeps_leases_in_redis(false).await;
}

/// The same over TLS: `--lease-store=rediss://…` with `--lease-store-ca-file` naming the CA
/// that signed the server's certificate, and a client certificate the server asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_keeps_leases_in_redis_over_tls() {
    keeps_leases_in_redis(true).await;
}

/// A redis-server taking TLS with `pki`'s server certificate, that asks clients for a
/// certificate `pki`'s CA signed, as Redis does by default once TLS is on.
fn tls_redis(pki: &egress_testkit::Pki) -> egress_testkit::redis::LocalRedis {
    egress_testkit::redis::LocalRedis::start_tls(&egress_testkit::redis::TlsFiles {
        cert_pem: pki.server_cert_pem.clone(),
        key_pem: pki.server_key_pem.clone(),
        ca_pem: pki.ca_pem.clone(),
        client_certificates_required: true,
    })
    .expect("redis-server with TLS")
}

async fn keeps_leases_in_redis(tls: bool) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if !egress_testkit::redis::available_for_test() {
        return;
    }
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        dir,
        ..
    } = cluster(if tls { "redis-tls" } else { "redis" }, "providers: []\n").await;
    let mut flags = vec![
        providers_flag,
        "--installation-id=blue".to_owned(),
        "--health-probe-bind-address=0".to_owned(),
        "--metrics-bind-address=0".to_owned(),
        "--zap-encoder=json".to_owned(),
        "--discovery-addr=127.0.0.1:0".to_owned(),
        "--discovery-tls=off".to_owned(),
    ];
    let mut redis = if tls {
        let pki = egress_testkit::pki();
        let redis = tls_redis(&pki);
        flags.push(format!("--lease-store={}", redis.tls_url().expect("a TLS port")));
        // The server asks for a client certificate, as Redis does by default once TLS is on.
        for (flag, file, text) in [
            ("ca", "redis-ca.pem", &pki.ca_pem),
            ("client-cert", "redis-client.pem", &pki.client_cert_pem),
            ("client-key", "redis-client-key.pem", &pki.client_key_pem),
        ] {
            let path = dir.join(file);
            std::fs::write(&path, text).unwrap();
            flags.push(format!("--lease-store-{flag}-file={}", path.display()));
        }
        redis
    } else {
        let redis = egress_testkit::redis::LocalRedis::start().expect("redis-server");
        flags.push(format!("--lease-store={}", redis.url()));
        redis
    };
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut op = Operator::start(
        &operator_binary(),
        &flags,
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("DISCOVERY_TOKEN", "crawler-token"),
        ],
    );
    let kept = op.wait_msg("Leases are kept in Redis");
    assert_eq!(kept["prefix"], "egress-proxy:blue:");
    let discovery = served(&op.wait_msg("Serving the discovery API"));
    op.wait_msg("Starting manager");
    let proxies: Api<Proxy> = Api::namespaced(server.client().unwrap(), "default");
    create_unreachable_external(&proxies).await;
    // The leader's view reaches Redis.
    let mut redis_conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let view: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg("{egress-proxy:blue:}view")
            .query_async(&mut redis_conn)
            .await
            .unwrap();
        if view.contains_key("default/outside") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no published view: {view:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, answer) = common::lease(&discovery, "crawler-token", "{}").await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["considered"], 1, "{answer}");
    redis.kill();
    let (status, answer) = common::lease(&discovery, "crawler-token", "{}").await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (503, Some("store_unavailable")),
        "{answer}"
    );
    op.terminate();
    let status = op.wait_exit();
    assert_eq!(status.code(), Some(0), "{}", op.output());
}

/// The lease store's TLS files are read again while the operator runs (every 10 s), as a
/// Secret volume's files change in place when a CA is rotated or a client certificate renewed:
/// started with a CA that did not sign the server's certificate, it leases once the file holds
/// the right one; a change it cannot use (a key that is not the certificate's) is logged by
/// flag and file, never by content, and the connection in use stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_follows_its_lease_store_tls_files() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if !egress_testkit::redis::available_for_test() {
        return;
    }
    let Cluster {
        server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("redis-tls-rotation", "providers: []\n").await;
    let (pki, other) = (egress_testkit::pki(), egress_testkit::pki());
    let redis = tls_redis(&pki);
    // The files as a Secret volume holds them, swapped whole on an update.
    let mut volume = egress_testkit::secret_volume::Volume::with_keys(
        "redis-tls-rotation",
        &[
            ("ca.crt", &other.ca_pem),
            ("tls.crt", &pki.client_cert_pem),
            ("tls.key", &pki.client_key_pem),
        ],
    );
    let mut flags = vec![
        providers_flag,
        "--health-probe-bind-address=0".to_owned(),
        "--metrics-bind-address=0".to_owned(),
        "--zap-encoder=json".to_owned(),
        "--discovery-addr=127.0.0.1:0".to_owned(),
        "--discovery-tls=off".to_owned(),
        format!("--lease-store={}", redis.tls_url().expect("a TLS port")),
    ];
    for (flag, key) in [("ca", "ca.crt"), ("client-cert", "tls.crt"), ("client-key", "tls.key")] {
        flags.push(format!("--lease-store-{flag}-file={}", volume.file(key).display()));
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut op = Operator::start(
        &operator_binary(),
        &flags,
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("DISCOVERY_TOKEN", "crawler-token"),
        ],
    );
    let discovery = served(&op.wait_msg("Serving the discovery API"));
    op.wait_msg("Starting manager");
    let proxies: Api<Proxy> = Api::namespaced(server.client().unwrap(), "default");
    create_unreachable_external(&proxies).await;
    // Once the operator has written the Proxy's status, its cache, and so the API's directory,
    // holds it: a lease is then asked of the store.
    until_status_written(proxies).await;
    let (status, answer) = common::lease(&discovery, "crawler-token", "{}").await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (503, Some("store_unavailable")),
        "a server whose CA the operator was not given: {answer}"
    );

    volume.update_keys(&[("ca.crt", &pki.ca_pem)]);
    let changed = op.wait_msg("Lease store TLS files changed; new calls to Redis use them");
    assert!(
        changed["files"].as_str().is_some_and(|f| f.contains("ca.crt")),
        "{changed}"
    );
    // The store's next call goes over a connection made with the new CA: Redis decides, and
    // the one Proxy's probes fail.
    let (status, answer) = common::lease(&discovery, "crawler-token", "{}").await;
    assert_eq!((status, answer["considered"].as_u64()), (409, Some(1)), "{answer}");

    // Another certificate's key: refused, by flag and file, and the connection in use stays.
    volume.update_keys(&[("tls.key", &other.client_key_pem)]);
    // Warnings carry the Go logger's prefix.
    let refused = op.wait_msg("WARNING: Lease store TLS files cannot be used; the connection in use stays");
    assert_eq!(
        refused["flag"], "--lease-store-client-cert-file and --lease-store-client-key-file",
        "{refused}"
    );
    assert!(
        refused["path"].as_str().is_some_and(|p| p.contains("tls.key")),
        "{refused}"
    );
    let (status, answer) = common::lease(&discovery, "crawler-token", "{}").await;
    assert_eq!((status, answer["considered"].as_u64()), (409, Some(1)), "{answer}");
    op.terminate();
    let status = op.wait_exit();
    assert_eq!(status.code(), Some(0), "{}", op.output());
    // No key reached the log: neither the one in use nor the one refused.
    let key_body = |pem: &str| pem.lines().nth(1).expect("a PEM body line").to_owned();
    for key in [&pki.client_key_pem, &other.client_key_pem] {
        assert!(!op.output().contains(&key_body(key)), "a key in the log");
    }
}

/// `--lease-store-password-file`: the password kept out of `--lease-store` (and the process
/// list); a Redis whose password changes, and the file with it, is reached again without a
/// restart; the password is never logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_the_redis_password_from_a_followed_file() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if !egress_testkit::redis::available_for_test() {
        return;
    }
    let redis = egress_testkit::redis::LocalRedis::start().expect("redis-server");
    let set_password = |old: Option<&str>, new: &str| {
        let url = match old {
            Some(p) => redis.url().replacen("redis://", &format!("redis://:{p}@"), 1),
            None => redis.url(),
        };
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg(new)
            .exec(&mut c)
            .unwrap();
        // Connections made with the old password are cut: the store must make new ones.
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .exec(&mut c)
            .unwrap();
    };
    set_password(None, "first-redis-password");
    // The test server lives as long as the cluster's `server`.
    let Cluster {
        server: _server,
        kubeconfig,
        providers_flag,
        ..
    } = cluster("redis-password", "providers: []\n").await;
    let mut file =
        egress_testkit::secret_volume::Volume::with_keys("redis-password", &[("password", "first-redis-password\n")]);
    let password_flag = format!("--lease-store-password-file={}", file.file("password").display());
    let store_flag = format!("--lease-store={}", redis.url());
    let args = [
        providers_flag.as_str(),
        "--health-probe-bind-address=0",
        "--metrics-bind-address=0",
        "--zap-encoder=json",
        "--discovery-addr=127.0.0.1:0",
        "--discovery-tls=off",
        "--discovery-auth=none",
        &store_flag,
        &password_flag,
    ];
    let mut op = Operator::start(&operator_binary(), &args, &[("KUBECONFIG", kubeconfig.as_str())]);
    let discovery = served(&op.wait_msg("Serving the discovery API"));
    // No proxy: an acquire's answer comes from the store (no_match), not 503 store_unavailable.
    let acquire = |discovery: String| async move {
        let r = reqwest::Client::new()
            .post(format!("http://{discovery}/v1/leases"))
            .body("{}")
            .send()
            .await
            .unwrap();
        r.status().as_u16()
    };
    let until = |want: u16| {
        let discovery = discovery.clone();
        async move {
            let deadline = std::time::Instant::now() + PATIENCE;
            loop {
                let got = acquire(discovery.clone()).await;
                if got == want {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the lease API answered {got}, not {want}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    until(409).await;
    // The password rotated on the server: the old one no longer connects...
    set_password(Some("first-redis-password"), "second-redis-password");
    until(503).await;
    // ... until the file has the new one: the store connects with it, without a restart.
    file.update_keys(&[("password", "second-redis-password\n")]);
    op.wait_line("the password file's change", |l| {
        l.contains("Lease store password file changed")
    });
    until(409).await;
    op.terminate();
    op.wait_exit();
    let output = op.output();
    assert!(
        !output.contains("first-redis-password") && !output.contains("second-redis-password"),
        "a password was logged"
    );
}
