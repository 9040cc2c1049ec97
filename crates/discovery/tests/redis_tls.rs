//! The Redis lease store over TLS (`rediss://`, `rediss+cluster://`), against real
//! redis-servers that take TLS connections with a certificate of a test CA: one server, and a
//! three-master cluster whose nodes also talk TLS to each other. The store leases through them
//! when given that CA (and, where the server asks for one, a client certificate the CA signed:
//! without one, or with another CA's, no lease), and finds unavailable a server it cannot trust: one whose CA it was not
//! given, or whose certificate names another host, and an endpoint that takes the connection
//! and never answers the handshake. A store given new TLS settings (what the operator does
//! when its TLS files change) uses them from its next call. The servers still answer plain
//! connections on another port, which these tests give the store only to see TLS settings
//! refused for it.
//!
//! Without redis-server the tests skip, unless `EGRESS_REAL_BACKENDS_REQUIRED=1` (`cargo xtask
//! test`, CI).

use std::time::Duration;

use egress_lease::{Candidate, LeaseRequest, LeaseStore, Scope, StoreError, ViewEntry};
use egress_lease_redis::{ClientIdentity, RedisStore, Tls, TlsRoots};
use egress_testkit::Pki;
use egress_testkit::redis::{LocalCluster, LocalRedis, TlsFiles};

/// In every URL of a store that must not reach Redis: no error may show it.
const PASSWORD: &str = "tls-sentinel-password";

/// A server with `pki`'s certificate, that asks clients for theirs or not.
fn files(pki: &Pki, client_certificates_required: bool) -> TlsFiles {
    TlsFiles {
        cert_pem: pki.server_cert_pem.clone(),
        key_pem: pki.server_key_pem.clone(),
        ca_pem: pki.ca_pem.clone(),
        client_certificates_required,
    }
}

/// A redis-server taking TLS with `pki`'s certificate (see [`files`]).
fn tls_redis(pki: &Pki, client_certificates_required: bool) -> LocalRedis {
    LocalRedis::start_tls(&files(pki, client_certificates_required)).expect("redis-server with TLS")
}

/// Trusts `pki`'s CA only, and shows no certificate.
fn roots(pki: &Pki) -> Tls {
    Tls {
        roots: TlsRoots::only(pki.ca_pem.as_bytes()).expect("the test CA"),
        client: None,
    }
}

fn store(url: &str, tls: &Tls) -> RedisStore {
    // As the operator does at start.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let prefix = format!("tls-{}:", std::process::id());
    RedisStore::new_with_tls(url, &prefix, Duration::from_secs(900), tls).expect("a store")
}

/// Publishes one proxy, leases it and gives the lease back.
async fn lease_and_release(store: &RedisStore) -> Result<String, StoreError> {
    let (id, latency_millis, max_leases) = ("crawl/p0", 5, 2);
    store
        .publish_view(&[ViewEntry {
            id: id.to_owned(),
            healthy: true,
            latency_millis,
            max_leases,
            offered: true,
            indexed: Vec::new(),
            pool: None,
        }])
        .await?;
    let mut candidates = [Candidate {
        id,
        healthy: true,
        latency_millis,
        max_leases,
        pool: None,
    }]
    .into_iter();
    let request = LeaseRequest {
        ttl: Duration::from_secs(60),
        target: None,
        scope: Scope::Installation,
    };
    let grant = store.acquire(&mut candidates, &request).await?.expect("a free proxy");
    store.release(&grant.lease_id).await?;
    Ok(grant.proxy_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_over_tls_leases_with_the_ca_it_was_given() {
    if !egress_testkit::redis::available_for_test() {
        return;
    }
    let pki = egress_testkit::pki();
    let redis = tls_redis(&pki, false);
    let url = redis.tls_url().expect("a TLS port");
    let leased = lease_and_release(&store(&url, &roots(&pki))).await;
    assert_eq!(leased.as_deref(), Ok("crawl/p0"), "{url}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_leases_with_the_ca_it_was_given() {
    if !egress_testkit::redis::available_for_test() {
        return;
    }
    let pki = egress_testkit::pki();
    let cluster = LocalCluster::start_tls(3, 0, &files(&pki, false)).expect("a Redis Cluster with TLS forms");
    // Named by one node alone: the others, and the slot's master, are found over TLS.
    let url = cluster.tls_url().expect("TLS ports");
    let one_node = url.split(',').next().expect("a node").to_owned();
    let leased = lease_and_release(&store(&one_node, &roots(&pki))).await;
    assert_eq!(leased.as_deref(), Ok("crawl/p0"), "{one_node}");
    // A store that trusted another CA leases once it is given the cluster's.
    let rotated = store(&one_node, &roots(&egress_testkit::pki()));
    assert!(lease_and_release(&rotated).await.is_err(), "trusted another CA");
    rotated.use_tls(&roots(&pki)).expect("TLS settings for a TLS URL");
    assert_eq!(lease_and_release(&rotated).await.as_deref(), Ok("crawl/p0"));
}

fn identity(of: &Pki) -> ClientIdentity {
    ClientIdentity::from_pem(of.client_cert_pem.as_bytes(), of.client_key_pem.as_bytes()).expect("a client identity")
}

/// New TLS settings, as when a CA is rotated or a client certificate renewed: the store's next
/// call goes over a connection made with them, whichever way that goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_given_new_tls_settings_uses_them_from_its_next_call() {
    if !egress_testkit::redis::available_for_test() {
        return;
    }
    let pki = egress_testkit::pki();
    let redis = tls_redis(&pki, true);
    let url = redis.tls_url().expect("a TLS port");
    let other = egress_testkit::pki();
    let rotating = store(&url, &roots(&other));
    assert!(lease_and_release(&rotating).await.is_err(), "trusted another CA");
    let right = Tls {
        client: Some(identity(&pki)),
        ..roots(&pki)
    };
    rotating.use_tls(&right).expect("TLS settings for a TLS URL");
    assert_eq!(lease_and_release(&rotating).await.as_deref(), Ok("crawl/p0"));
    // A client certificate the server's CA did not sign: refused from the next call on.
    rotating
        .use_tls(&Tls {
            client: Some(identity(&other)),
            ..roots(&pki)
        })
        .expect("TLS settings for a TLS URL");
    assert!(
        lease_and_release(&rotating).await.is_err(),
        "leased with a stranger's certificate"
    );
    rotating.use_tls(&right).expect("TLS settings for a TLS URL");
    assert_eq!(lease_and_release(&rotating).await.as_deref(), Ok("crawl/p0"));
    // TLS settings for a store reached without TLS are refused, and its connection stays.
    let plain = store(&redis.url(), &Tls::default());
    let refused = plain.use_tls(&roots(&pki)).expect_err("CA certificates for redis://");
    assert!(refused.contains("without TLS"), "{refused}");
    assert_eq!(lease_and_release(&plain).await.as_deref(), Ok("crawl/p0"));
}

/// Redis asks for a client certificate by default once TLS is on (`tls-auth-clients yes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_asks_for_a_client_certificate_takes_the_one_the_store_shows() {
    if !egress_testkit::redis::available_for_test() {
        return;
    }
    let pki = egress_testkit::pki();
    let redis = tls_redis(&pki, true);
    let url = redis.tls_url().expect("a TLS port");
    let shown = Tls {
        client: Some(identity(&pki)),
        ..roots(&pki)
    };
    assert_eq!(lease_and_release(&store(&url, &shown)).await.as_deref(), Ok("crawl/p0"));
    // Without one, or with one from a CA the server does not know: no lease.
    let stranger = egress_testkit::pki();
    // A key that is not the certificate's is refused when the identity is made.
    let mismatched = ClientIdentity::from_pem(pki.client_cert_pem.as_bytes(), stranger.client_key_pem.as_bytes())
        .expect_err("another certificate's key");
    assert!(mismatched.contains("does not fit"), "{mismatched}");
    for (tls, why) in [
        (roots(&pki), "no client certificate"),
        (
            Tls {
                client: Some(identity(&stranger)),
                ..roots(&pki)
            },
            "a client certificate of another CA",
        ),
    ] {
        assert!(
            lease_and_release(&store(&url, &tls)).await.is_err(),
            "leased with {why}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_the_store_cannot_trust_is_unavailable_and_the_password_stays_hidden() {
    if !egress_testkit::redis::available_for_test() {
        return;
    }
    let pki = egress_testkit::pki();
    let redis = tls_redis(&pki, false);
    // A certificate for another host, from the CA the store is given.
    let elsewhere = egress_testkit::pki_for(&["redis.example"]);
    let misnamed = tls_redis(&elsewhere, false);
    let with_password = |r: &LocalRedis| {
        r.tls_url()
            .expect("a TLS port")
            .replace("rediss://", &format!("rediss://:{PASSWORD}@"))
    };
    let other_ca = egress_testkit::pki();
    for (url, tls, why) in [
        (with_password(&redis), roots(&other_ca), "a CA that did not sign it"),
        (
            with_password(&redis),
            Tls::default(),
            "the system's CAs, none of which signed it",
        ),
        (
            with_password(&misnamed),
            roots(&elsewhere),
            "its certificate names another host",
        ),
    ] {
        let Err(StoreError(e)) = lease_and_release(&store(&url, &tls)).await else {
            panic!("leased through a server the store cannot trust: {why}");
        };
        assert!(!e.contains(PASSWORD), "{why}: {e}");
    }
}

/// An endpoint that takes connections and never says a word: the TLS handshake gets no answer,
/// and the store's call budget ends the wait (nextest's timeout fails a call that hangs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_endpoint_that_never_answers_fails_the_call() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a listener");
    let address = listener.local_addr().expect("its address");
    let (held_tx, mut held) = tokio::sync::mpsc::unbounded_channel();
    let silent = tokio::spawn(async move {
        while let Ok((connection, _)) = listener.accept().await {
            // Kept open, never read from or written to.
            let _ = held_tx.send(connection);
        }
    });
    let pki = egress_testkit::pki();
    let url = format!("rediss://:{PASSWORD}@{address}");
    let Err(StoreError(e)) = lease_and_release(&store(&url, &roots(&pki))).await else {
        panic!("leased through an endpoint that never answered");
    };
    assert!(!e.contains(PASSWORD), "{e}");
    assert!(held.try_recv().is_ok(), "the store never connected: {e}");
    silent.abort();
}
