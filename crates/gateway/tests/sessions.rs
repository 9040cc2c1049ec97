//! Sticky sessions through the gateway, with real curl and real tinyproxies that each leave from
//! their own loopback address, so the target tells the proxies apart: one exit for a session,
//! another for another session, the same on two gateway replicas, and a new one once the
//! session's proxy is deleted or reported banned for the target by the session's name.

mod common;

use common::{TOKEN, World, curl_through, exit_of, world_with};
use egress_discovery::client::{Client, ReportResult};
use egress_gateway::Settings;
use egress_testkit::tinyproxy_available;

/// The exit the target saw for one request through the gateway at `gateway` in `session`
/// (over `CONNECT` when `tunnel`).
async fn exit_at(w: &World, gateway: std::net::SocketAddr, session: &str, tunnel: bool) -> String {
    let user = format!("session={session}:{TOKEN}");
    let (code, body) = curl_through(gateway, Some(&user), tunnel, &w.exits_url()).await;
    assert_eq!(code, "200", "{body}");
    body
}

async fn exit(w: &World, session: &str) -> String {
    exit_at(w, w.gateway, session, true).await
}

#[tokio::test]
async fn a_session_keeps_one_exit_and_another_session_gets_another() {
    if !tinyproxy_available() {
        return;
    }
    let w = world_with(2, Settings::default()).await;
    let first = exit(&w, "login-1").await;
    assert_eq!(first, exit_of(0).to_string(), "the fastest proxy first");
    for tunnel in [true, false, true] {
        assert_eq!(exit_at(&w, w.gateway, "login-1", tunnel).await, first);
    }
    let other = exit(&w, "login-2").await;
    assert_eq!(other, exit_of(1).to_string(), "the proxy with fewer leases");
    assert_eq!(exit(&w, "login-2").await, other);
    assert_eq!(common::active_each(&w).await, [1, 1], "one lease per session, kept");
}

#[tokio::test]
async fn a_session_moves_once_its_proxy_is_deleted() {
    if !tinyproxy_available() {
        return;
    }
    let w = world_with(2, Settings::default()).await;
    assert_eq!(exit(&w, "cart").await, exit_of(0).to_string());
    w.remove_proxy("ns/eu-1");
    assert_eq!(exit(&w, "cart").await, exit_of(1).to_string());
    assert_eq!(exit(&w, "cart").await, exit_of(1).to_string(), "and stays there");
}

#[tokio::test]
async fn two_gateway_replicas_route_one_session_the_same_way() {
    if !tinyproxy_available() {
        return;
    }
    let w = world_with(3, Settings::default()).await;
    let replica = w.another_gateway().await;
    let here = exit(&w, "shared").await;
    assert_eq!(exit_at(&w, replica, "shared", true).await, here);
    assert_eq!(exit_at(&w, replica, "shared", false).await, here);
    let elsewhere = exit_at(&w, replica, "not-shared", true).await;
    assert_ne!(elsewhere, here, "another session, on another proxy");
    assert_eq!(exit(&w, "not-shared").await, elsewhere);
}

#[tokio::test]
async fn a_ban_reported_by_the_sessions_name_moves_it_for_that_target() {
    if !tinyproxy_available() {
        return;
    }
    let w = world_with(2, Settings::default()).await;
    assert_eq!(exit(&w, "login").await, exit_of(0).to_string());
    // The client saw a ban inside its tunnel: it knows its session, never the lease.
    let api = Client::new(&w.api, Some(TOKEN.into())).unwrap();
    api.report_session("login", ReportResult::Banned, Some("127.0.0.1"))
        .await
        .expect("the session is known");
    assert_eq!(exit(&w, "login").await, exit_of(1).to_string());
    assert_eq!(exit(&w, "login").await, exit_of(1).to_string());
}

/// Waits (within a deadline) until the gateway has renewed leases at least `n` times.
async fn renewed(w: &World, n: u64) {
    let series = r#"proxy_gateway_lease_renewals_total{outcome="renewed"}"#;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut registry = prometheus_client::registry::Registry::default();
        w.handle.metrics().register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let value: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0);
        if value >= n {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{series} is {value} in\n{text}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_sessions_lease_is_renewed_while_its_tunnel_is_open() {
    if !tinyproxy_available() {
        return;
    }
    let w = world_with(1, Settings::default()).await;
    // A 2 s lease, renewed every second while the tunnel is open: by the third renewal its
    // first TTL is long over, and the lease still lives.
    let (tunnel, head) = common::open_tunnel(w.gateway, "session=long,ttl=2", &w.target.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    renewed(&w, 3).await;
    assert_eq!(
        common::active_each(&w).await,
        [1],
        "the session's lease outlived its first TTL"
    );
    drop(tunnel);
}
