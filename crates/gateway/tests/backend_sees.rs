//! What reaches a backend: a backend that records every request head it receives shows that the
//! client's `Proxy-Authorization` (its token) and every hop-by-hop header are taken out, that the
//! backend's own credentials from the lease are put in, for a plain-HTTP request and for a
//! `CONNECT`, and that a request without good credentials reaches it not at all.

mod common;

use std::sync::{Arc, Mutex};

use common::{Directory, TOKEN, backend, basic, leases, serve_api, serve_gateway};
use egress_gateway::{Gateway, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

type Heads = Arc<Mutex<Vec<String>>>;

/// A backend proxy that records each request head and answers `200` with a short body (a
/// `CONNECT` then closes: the test needs its head only).
async fn recording_backend() -> (std::net::SocketAddr, Heads) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    let heads: Heads = Arc::default();
    let kept = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                kept.lock().unwrap().push(String::from_utf8_lossy(&head).into_owned());
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                    .await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    (at, heads)
}

/// Sends `head` to the gateway at `front` and reads its answer to the end.
async fn send(front: std::net::SocketAddr, head: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(front).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), tcp.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn the_backend_gets_its_own_credentials_and_never_the_clients_or_a_hop_by_hop_header() {
    let (at, heads) = recording_backend().await;
    let stop = CancellationToken::new();
    let _stopped = stop.clone().drop_guard();
    let info = backend("ns/recorder", "127.0.0.1", at.port(), "backend-user", "backend-pass");
    let api = serve_api(Directory::of(vec![info]), stop.clone()).await;
    let gateway = Arc::new(Gateway::new(leases(&api), Settings::default()));
    let (front, _) = serve_gateway(gateway, &stop).await;
    let client = basic("any", TOKEN);
    let hop_by_hop = "Connection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nUpgrade: h2c\r\n";
    let plain = format!(
        "GET http://example.test/page HTTP/1.1\r\nHost: example.test\r\nProxy-Authorization: {client}\r\n{hop_by_hop}Accept: */*\r\n\r\n"
    );
    let answer = send(front, &plain).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let tunnel = format!(
        "CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\nProxy-Authorization: {client}\r\n{hop_by_hop}\r\n"
    );
    let answer = send(front, &tunnel).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Without good credentials, nothing reaches the backend.
    let stranger = plain.replace(&client, &basic("any", "not-a-token"));
    assert!(send(front, &stranger).await.starts_with("HTTP/1.1 407"));

    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "{heads:#?}");
    assert!(
        heads[0].starts_with("GET http://example.test/page HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        heads[1].starts_with("CONNECT example.test:443 HTTP/1.1\r\n"),
        "{}",
        heads[1]
    );
    let own = basic("backend-user", "backend-pass");
    let token = client.trim_start_matches("Basic ");
    for head in &heads {
        let lower = head.to_ascii_lowercase();
        let own_line = format!("\r\nproxy-authorization: {}\r\n", own.to_ascii_lowercase());
        assert!(lower.contains(&own_line), "the backend's own credentials: {head}");
        assert!(
            !head.contains(token) && !head.contains(TOKEN),
            "the client's token: {head}"
        );
        for header in ["x-hop:", "keep-alive:", "proxy-connection:", "te:", "upgrade:"] {
            assert!(
                !lower.contains(&format!("\r\n{header}")),
                "{header} reached the backend: {head}"
            );
        }
    }
    assert!(
        heads[0].to_ascii_lowercase().contains("\r\naccept: */*\r\n"),
        "end-to-end headers stay"
    );
}
