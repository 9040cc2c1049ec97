//! Real curl with an `https://` proxy URL: TLS to the gateway, then `CONNECT` or plain HTTP
//! inside it, through a real tinyproxy to local HTTP and HTTPS targets. A renewed certificate
//! is in force for the next connection once its files are read again; a client that does not
//! speak TLS to the TLS front gets nothing, and is counted.

mod common;

use std::path::Path;

use common::{TOKEN, World, world_with};
use egress_files::{Followed, Follower};
use egress_gateway::tls_front::{self, CurrentTls, TlsFiles, TlsFollower};
use egress_gateway::{Settings, http_front};
use egress_testkit::{Pki, ScratchDir, tinyproxy_available};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The gateway's certificate files in `dir`, for 127.0.0.1, from `pki`.
fn certificate(dir: &Path, pki: &Pki) -> TlsFiles {
    let files = TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    std::fs::write(&files.cert, &pki.server_cert_pem).unwrap();
    std::fs::write(&files.key, &pki.server_key_pem).unwrap();
    std::fs::write(dir.join("proxy-ca.pem"), &pki.ca_pem).unwrap();
    files
}

/// The TLS front of the world's gateway, on loopback.
async fn tls_front(w: &World, current: CurrentTls) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    tokio::spawn(http_front::serve_tls(listener, w.handle.clone(), current));
    at
}

/// curl's status for `url` through the https:// proxy at `front`, trusting `proxy_ca` for the
/// gateway and the world's CA for an HTTPS target.
async fn curl_https_proxy(w: &World, front: std::net::SocketAddr, proxy_ca: &Path, url: &str, tunnel: bool) -> String {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg("-x")
        .arg(format!("https://{front}"))
        .arg("--proxy-cacert")
        .arg(proxy_ca)
        .arg("--cacert")
        .arg(&w.ca)
        .arg("--proxy-user")
        .arg(format!("any:{TOKEN}"));
    if tunnel {
        cmd.arg("--proxytunnel");
    }
    let out = cmd.arg(url).output().await.expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn curl_reaches_http_and_https_targets_through_an_https_proxy_url() {
    if !tinyproxy_available() {
        return;
    }
    let w = world_with(1, Settings::default()).await;
    let dir = ScratchDir::new("gateway-tls-front");
    let files = certificate(dir.path(), &egress_testkit::pki());
    let (current, _follower) = tls_front::load(files).unwrap();
    let front = tls_front(&w, current).await;
    let ca = dir.path().join("proxy-ca.pem");
    let http = format!("http://{}/204", w.target);
    let https = format!("https://127.0.0.1:{}/204", w.tls_target.port());
    assert_eq!(
        curl_https_proxy(&w, front, &ca, &http, false).await,
        "204",
        "plain HTTP"
    );
    assert_eq!(curl_https_proxy(&w, front, &ca, &http, true).await, "204", "CONNECT");
    assert_eq!(
        curl_https_proxy(&w, front, &ca, &https, false).await,
        "204",
        "HTTPS target"
    );
    assert_eq!(common::until_released(&w).await, 0);
}

#[tokio::test]
async fn a_renewed_certificate_serves_the_next_connection() {
    if !tinyproxy_available() {
        return;
    }
    let w = world_with(1, Settings::default()).await;
    let dir = ScratchDir::new("gateway-tls-renewed");
    let old_ca = dir.path().join("old-ca.pem");
    let files = certificate(dir.path(), &egress_testkit::pki());
    std::fs::rename(dir.path().join("proxy-ca.pem"), &old_ca).unwrap();
    let (current, follower) = tls_front::load(files).unwrap();
    let front = tls_front(&w, current).await;
    let url = format!("http://{}/204", w.target);
    assert_eq!(curl_https_proxy(&w, front, &old_ca, &url, false).await, "204");
    certificate(dir.path(), &egress_testkit::pki());
    let mut follower: Follower<TlsFollower> = Follower::new(follower);
    follower.check_now();
    let new_ca = dir.path().join("proxy-ca.pem");
    assert_eq!(curl_https_proxy(&w, front, &new_ca, &url, false).await, "204");
    assert_eq!(
        curl_https_proxy(&w, front, &old_ca, &url, false).await,
        "000",
        "the old certificate is no longer served"
    );
}

#[tokio::test]
async fn a_client_that_does_not_speak_tls_gets_nothing_and_is_counted() {
    let w = world_with(0, Settings::default()).await;
    let dir = ScratchDir::new("gateway-tls-plain");
    let (current, mut follower) = tls_front::load(certificate(dir.path(), &egress_testkit::pki())).unwrap();
    assert_eq!(follower.check(), Ok(None));
    let front = tls_front(&w, current).await;
    let mut tcp = tokio::net::TcpStream::connect(front).await.unwrap();
    tcp.write_all(b"CONNECT example.test:443 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), tcp.read_to_end(&mut got)).await;
    assert!(!got.starts_with(b"HTTP/"), "no HTTP answer outside TLS: {got:?}");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut registry = prometheus_client::registry::Registry::default();
        w.handle.metrics().register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        if text.contains(r#"proxy_gateway_connections_refused_total{reason="tls"} 1"#) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
