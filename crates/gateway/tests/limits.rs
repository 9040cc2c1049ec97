//! What bounds the gateway, asserted by outcome with small limits set here (never by elapsed
//! time): each client's cap on tunnels at once, a tunnel nobody speaks on closed at the idle
//! limit, and a drain that stops accepting, lets tunnels finish within its budget, then closes
//! the rest. Each with real tinyproxy behind, and the counts the metrics show.

mod common;

use std::time::Duration;

use common::{curl_through, open_tunnel, until_released, world_with};
use egress_gateway::Settings;
use egress_testkit::tinyproxy_available;
use tokio::io::AsyncReadExt;

/// The gateway's metrics as Prometheus text.
fn metrics(handle: &egress_gateway::Gateway) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    handle.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

/// The value of the series `series` (name and labels, as the text shows them) in `text`.
pub fn value_of(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits (within a deadline) until each of `series` has counted at least its `n`: a tunnel is
/// counted once its lease is given back, which can be after its client saw it close.
async fn counted(handle: &egress_gateway::Gateway, series: &[(&str, u64)]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(handle);
        if series.iter().all(|(s, n)| value_of(&text, s) >= *n) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all of {series:?} in\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads until the gateway closes the connection: what came before the end.
async fn until_closed(tcp: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the gateway closed the tunnel");
    got
}

#[tokio::test]
async fn a_client_past_its_cap_is_refused_until_a_tunnel_ends() {
    if !tinyproxy_available() {
        return;
    }
    let settings = Settings {
        per_client: 1,
        ..Settings::default()
    };
    let w = world_with(2, settings).await;
    let (held, head) = open_tunnel(w.gateway, "any", &w.target.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let user = format!("any:{}", common::TOKEN);
    let (code, body) = curl_through(w.gateway, Some(&user), true, &w.exits_url()).await;
    assert_eq!(code, "429", "{body}");
    drop(held);
    // The slot frees once the gateway saw the tunnel end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (code, _) = curl_through(w.gateway, Some(&user), true, &w.exits_url()).await;
        if code == "200" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {code}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    counted(
        &w.handle,
        &[(
            r#"proxy_gateway_tunnels_total{client="default",front="connect",outcome="client_cap"}"#,
            1,
        )],
    )
    .await;
}

#[tokio::test]
async fn a_tunnel_nobody_speaks_on_is_closed_at_the_idle_limit_and_its_lease_given_back() {
    if !tinyproxy_available() {
        return;
    }
    let settings = Settings {
        idle_timeout: Duration::from_millis(200),
        ..Settings::default()
    };
    let w = world_with(1, settings).await;
    let (mut tcp, head) = open_tunnel(w.gateway, "any", &w.target.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(until_closed(&mut tcp).await.is_empty());
    assert_eq!(until_released(&w).await, 0);
    counted(
        &w.handle,
        &[(
            r#"proxy_gateway_tunnels_total{client="default",front="connect",outcome="idle"}"#,
            1,
        )],
    )
    .await;
}

#[tokio::test]
async fn a_drain_stops_accepting_and_closes_tunnels_left_at_its_end() {
    if !tinyproxy_available() {
        return;
    }
    let w = world_with(1, Settings::default()).await;
    let (mut tcp, head) = open_tunnel(w.gateway, "any", &w.target.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let finished = w.handle.drain(Duration::from_millis(100)).await;
    assert!(!finished, "a tunnel was still open at the end of the budget");
    assert!(until_closed(&mut tcp).await.is_empty());
    assert!(
        tokio::net::TcpStream::connect(w.gateway).await.is_err(),
        "no connection is taken once draining"
    );
    assert_eq!(until_released(&w).await, 0);
    counted(
        &w.handle,
        &[(
            r#"proxy_gateway_tunnels_total{client="default",front="connect",outcome="drained"}"#,
            1,
        )],
    )
    .await;
}

#[tokio::test]
async fn a_drain_with_nothing_open_ends_at_once() {
    let w = world_with(0, Settings::default()).await;
    assert!(w.handle.drain(Duration::from_secs(30)).await);
}

/// What the gateway sent back to `sent` before it closed the connection (`stall`: then send
/// nothing more, as a slow client does).
async fn answer_to(at: std::net::SocketAddr, sent: &[u8]) -> Vec<u8> {
    use tokio::io::AsyncWriteExt;
    let mut tcp = tokio::net::TcpStream::connect(at).await.unwrap();
    // A huge head may be refused before all of it is written: the rest does not matter.
    let _ = tcp.write_all(sent).await;
    until_closed(&mut tcp).await
}

#[tokio::test]
async fn hostile_heads_and_handshakes_are_answered_or_closed_and_counted() {
    let settings = Settings {
        head_timeout: Duration::from_millis(200),
        max_head: 8 * 1024,
        ..Settings::default()
    };
    let w = world_with(0, settings).await;
    // A head that never ends: closed at the head timeout.
    let slow = answer_to(w.gateway, b"CONNECT example.test:443 HTTP/1.1\r\nHost: exa").await;
    assert!(
        String::from_utf8_lossy(&slow).is_empty() || slow.starts_with(b"HTTP/1.1 408"),
        "{slow:?}"
    );
    // A head over the limit: 431.
    let mut huge = b"GET http://example.test/ HTTP/1.1\r\nX-Pad: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
    let answer = answer_to(w.gateway, &huge).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // Not HTTP: 400.
    let answer = answer_to(w.gateway, b"\x16\x03\x01\x02\x00garbage\r\n\r\n").await;
    assert!(
        answer.starts_with(b"HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // SOCKS4, a SOCKS5 greeting that stops half-way, and one offering no method: closed.
    assert!(answer_to(w.socks, &[4, 1, 0, 80, 127, 0, 0, 1, 0]).await.is_empty());
    assert!(answer_to(w.socks, &[5, 3, 2]).await.is_empty());
    assert_eq!(answer_to(w.socks, &[5, 0]).await, [5, 0xFF]);
    counted(
        &w.handle,
        &[
            (r#"proxy_gateway_connections_refused_total{reason="head"}"#, 3),
            (r#"proxy_gateway_connections_refused_total{reason="handshake"}"#, 3),
        ],
    )
    .await;
}
