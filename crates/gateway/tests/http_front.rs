//! Real curl through the gateway's HTTP front, over `CONNECT` and plain HTTP, to a local target,
//! through a real tinyproxy that asks for its own credentials: the discovery API (in this
//! process, on a memory store) leases the tinyproxy with the client's token. Without the
//! client's credentials, with a token the API does not know or with a username outside the
//! grammar, the gateway answers 407 and nothing reaches the backend or the target.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use egress_discovery::client::Client;
use egress_discovery::{DiscoveryApi, Fleet, ProxyDirectory, ProxyInfo};
use egress_gateway::leases::Leases;
use egress_gateway::{Gateway, Settings, http_front};
use egress_lease::{MemoryStore, SystemClock};
use egress_testkit::{Seen, Tinyproxy, http_target, tinyproxy_available};
use tokio_util::sync::{CancellationToken, DropGuard};

const TOKEN: &str = "tok-gateway-test";
const BACKEND_PASSWORD: &str = "backend-secret-sentinel";

struct Fixed(Arc<Fleet>);

impl ProxyDirectory for Fixed {
    fn proxies(&self) -> Result<Arc<Fleet>, String> {
        Ok(self.0.clone())
    }
}

/// The gateway, the API behind it, the tinyproxy it leases and the target, all on loopback.
struct World {
    gateway: SocketAddr,
    target: SocketAddr,
    seen: Seen,
    api: String,
    _proxy: Tinyproxy,
    _stop: DropGuard,
}

async fn world() -> World {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (target, seen) = http_target().await;
    let proxy = Tinyproxy::start_with(&[target.port()], Some(("gw-backend", BACKEND_PASSWORD)));
    let info = ProxyInfo {
        id: "ns/eu-1".into(),
        ip: "127.0.0.1".into(),
        port: proxy.port,
        attributes: [("geo".to_owned(), "eu".to_owned())].into(),
        phase: "Ready".into(),
        healthy: true,
        latency_millis: 1,
        max_leases: 5,
        credentials: Some(egress_credentials::Credentials::new("gw-backend", BACKEND_PASSWORD).unwrap()),
        offered: true,
        pool_role: None,
        pool: None,
    };
    let api = DiscoveryApi {
        directory: Arc::new(Fixed(Arc::new(std::iter::once(info).collect()))),
        store: Arc::new(MemoryStore::new(Arc::new(SystemClock), Duration::from_secs(900))),
        max_ttl: Duration::from_secs(3600),
        auth: egress_discovery::Auth::Tokens(Arc::new(egress_discovery::TokenSet::new(vec![TOKEN.into()]))),
        refusals: None,
        scopes: egress_discovery::Scopes::default(),
        max_sessions: egress_discovery::DEFAULT_MAX_SESSIONS,
        admission: egress_discovery::Admission::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(egress_discovery::serve(
        listener,
        Arc::new(api),
        egress_http::Limits::DEFAULT,
        stop.clone(),
    ));
    let leases = Leases::new(Client::new(&api_url, None).unwrap());
    let gateway = Arc::new(Gateway::new(leases, Settings::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    let serving = tokio::spawn(http_front::serve(listener, gateway));
    let stop_all = CancellationToken::new();
    let stopped = stop_all.clone();
    tokio::spawn(async move {
        stopped.cancelled().await;
        serving.abort();
        stop.cancel();
    });
    World {
        gateway: at,
        target,
        seen,
        api: api_url,
        _proxy: proxy,
        _stop: stop_all.drop_guard(),
    }
}

/// curl's status code and body for `url` through the gateway, with `user` as its proxy
/// credentials (`None`: none) and `tunnel` forcing a `CONNECT` for plain HTTP.
async fn curl(w: &World, user: Option<&str>, tunnel: bool, path: &str) -> (String, String) {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "20", "-w", "\n%{http_code}/%{http_connect}"])
        .arg("-x")
        .arg(format!("http://{}", w.gateway));
    if let Some(user) = user {
        cmd.arg("--proxy-user").arg(user);
    }
    if tunnel {
        cmd.arg("--proxytunnel");
    }
    let out = cmd
        .arg(format!("http://{}{path}", w.target))
        .output()
        .await
        .expect("curl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, codes) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    // A CONNECT the gateway refused leaves no answer from the target: its code is the CONNECT's.
    let code = match codes.split_once('/') {
        Some(("000", connect)) => connect,
        Some((code, _)) => code,
        None => codes,
    };
    (code.to_owned(), body.to_owned())
}

/// The active leases the API shows on the proxy.
async fn active(w: &World) -> u64 {
    let api = Client::new(&w.api, Some(TOKEN.into())).unwrap();
    let all = api.list(&Default::default()).await.unwrap();
    all[0].active_leases
}

/// Waits until the proxy's leases are all given back, within a deadline: the gateway gives a
/// lease back as its connection ends, after curl has its answer.
async fn until_released(w: &World) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = active(w).await;
        if n == 0 || tokio::time::Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn curl_reaches_the_target_through_the_gateway_over_connect_and_plain_http() {
    if !tinyproxy_available() {
        return;
    }
    let w = world().await;
    let user = format!("geo=eu:{TOKEN}");
    assert_eq!(curl(&w, Some(&user), true, "/204").await.0, "204", "over CONNECT");
    assert_eq!(curl(&w, Some(&user), false, "/204").await.0, "204", "plain HTTP");
    assert_eq!(curl(&w, Some(&format!("any:{TOKEN}")), false, "/204").await.0, "204");
    let seen = w.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for (_, headers) in &seen {
        assert!(
            headers.iter().all(|h| !h.eq_ignore_ascii_case("proxy-authorization")),
            "no credentials reach the target: {headers:?}"
        );
    }
    assert_eq!(until_released(&w).await, 0, "every lease given back");
}

#[tokio::test]
async fn a_plain_http_answer_with_a_ban_status_is_reported_for_its_host() {
    if !tinyproxy_available() {
        return;
    }
    let w = world().await;
    let user = format!("any:{TOKEN}");
    assert_eq!(curl(&w, Some(&user), false, "/429").await.0, "429");
    assert_eq!(until_released(&w).await, 0);
    // The only proxy now cools down for the target's host: the next request finds none.
    let (code, body) = curl(&w, Some(&user), false, "/204").await;
    assert_eq!(code, "503", "{body}");
    assert!(body.contains("cooldown"), "the lease API's reason: {body}");
}

#[tokio::test]
async fn without_good_credentials_the_gateway_answers_407_and_dials_nothing() {
    if !tinyproxy_available() {
        return;
    }
    let w = world().await;
    for (user, says) in [
        (None, "credentials are required"),
        (Some("any:wrong-token".to_owned()), "token"),
        (Some(format!("geo=eu,geo=us:{TOKEN}")), "twice"),
        (Some(format!("exit.ip=1.2.3.4:{TOKEN}")), "reserved"),
        (Some(format!("ttl=60:{TOKEN}")), "needs a session"),
    ] {
        for tunnel in [false, true] {
            let (code, body) = curl(&w, user.as_deref(), tunnel, "/204").await;
            assert_eq!(code, "407", "{user:?} {body}");
            if !tunnel {
                assert!(body.contains(says), "{user:?}: {body}");
            }
        }
    }
    assert!(w.seen.lock().unwrap().is_empty(), "nothing reached the target");
    assert_eq!(active(&w).await, 0, "no lease was taken");
}
