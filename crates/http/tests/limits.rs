//! Each way a client can hold a connection, against a real loopback socket: the server's budgets
//! are short, and every wait has a generous guard so a regression fails instead of hanging. No
//! timing is asserted; events (a connection count, a route being entered) order the steps.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use egress_http::{Limits, Router, Server};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// Far longer than any budget below: only a hang reaches it.
const GUARD: Duration = Duration::from_secs(30);

const SHORT: Limits = Limits {
    max_connections: 8,
    max_connections_per_source: 8,
    max_header_bytes: 16 * 1024,
    header_read: Duration::from_millis(200),
    write: Duration::from_millis(200),
    drain: Duration::from_millis(200),
};

struct Running {
    addr: std::net::SocketAddr,
    open: watch::Receiver<usize>,
    shutdown: CancellationToken,
    served: tokio::task::JoinHandle<()>,
}

async fn start(limits: Limits, router: Router) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::new("test").limits(limits);
    let open = server.open_connections();
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(server.serve(listener, router, shutdown.clone()));
    Running {
        addr,
        open,
        shutdown,
        served,
    }
}

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

async fn wait_for_open(open: &mut watch::Receiver<usize>, n: usize) {
    tokio::time::timeout(GUARD, open.wait_for(|&o| o == n))
        .await
        .unwrap_or_else(|_| panic!("the server never had {n} connections open"))
        .unwrap();
}

/// Everything the server sends until it closes (a reset counts as a close).
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(GUARD, async {
        let mut buf = [0u8; 8192];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server never closed the connection");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_head_that_never_finishes_is_cut_off() {
    let server = start(SHORT, hello()).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let answer = read_until_closed(&mut client).await;
    assert!(!answer.contains("hello"), "{answer}");
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed() {
    let server = start(SHORT, hello()).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    // One answer, then nothing more is sent: the server closes the kept-alive connection.
    let answer = read_until_closed(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("hello"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1").count(), 1);
}

#[tokio::test]
async fn headers_over_the_cap_get_the_server_s_answer() {
    let server = start(SHORT, hello()).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    let bloat = "a".repeat(20 * 1024);
    client
        .write_all(format!("GET / HTTP/1.1\r\nHost: x\r\nX-Bloat: {bloat}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let answer = read_until_closed(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    assert!(answer.ends_with("request header fields too large\n"), "{answer}");
}

#[tokio::test]
async fn headers_over_hyper_s_buffer_get_hyper_s_bare_431() {
    let server = start(SHORT, hello()).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    let bloat = "a".repeat(egress_http::HYPER_BUFFER + 1);
    // The server may answer before it has read all of this; a failed write is fine.
    let _ = client
        .write_all(format!("GET / HTTP/1.1\r\nHost: x\r\nX-Bloat: {bloat}\r\n\r\n").as_bytes())
        .await;
    let answer = read_until_closed(&mut client).await;
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431 "), "{answer}");
    assert!(!answer.contains("hello"), "{answer}");
}

#[tokio::test]
async fn a_client_that_does_not_read_is_cut_off() {
    // Far more than the loopback socket buffers on both sides hold.
    let big = bytes::Bytes::from(vec![b'x'; 64 * 1024 * 1024]);
    let router = Router::new().route("/big", get(move || async move { big.clone() }));
    let mut server = start(SHORT, router).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    client.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    wait_for_open(&mut server.open, 1).await;
    // The client reads nothing; the server gives up on it.
    wait_for_open(&mut server.open, 0).await;
    let answer = read_until_closed(&mut client).await;
    assert!(answer.len() < 64 * 1024 * 1024, "the whole response was written");
}

#[tokio::test]
async fn at_the_cap_a_new_client_is_answered_and_closed() {
    let limits = Limits {
        max_connections: 1,
        ..SHORT
    };
    // Long enough that the first client holds its slot while the second knocks.
    let limits = Limits {
        header_read: GUARD,
        ..limits
    };
    let mut server = start(limits, hello()).await;
    let _holder = TcpStream::connect(server.addr).await.unwrap();
    wait_for_open(&mut server.open, 1).await;
    let mut second = TcpStream::connect(server.addr).await.unwrap();
    second.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let answer = read_until_closed(&mut second).await;
    assert!(answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    assert!(answer.ends_with("overloaded\n"), "{answer}");
    assert_eq!(*server.open.borrow(), 1, "the turned-away client never took a slot");
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish() {
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let router = {
        let (entered, release) = (entered.clone(), release.clone());
        Router::new().route(
            "/slow",
            get(move || async move {
                entered.notify_one();
                release.notified().await;
                "done"
            }),
        )
    };
    let limits = Limits { drain: GUARD, ..SHORT };
    let server = start(limits, router).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    client
        .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::timeout(GUARD, entered.notified()).await.unwrap();
    server.shutdown.cancel();
    // New clients are refused once the listener is gone; the one in flight is still served.
    release.notify_one();
    let answer = read_until_closed(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("done"), "{answer}");
    tokio::time::timeout(GUARD, server.served).await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_drops_what_outlasts_the_drain() {
    let entered = Arc::new(Notify::new());
    let router = {
        let entered = entered.clone();
        Router::new().route(
            "/forever",
            get(move || async move {
                entered.notify_one();
                std::future::pending::<()>().await;
            }),
        )
    };
    let server = start(SHORT, router).await;
    let mut client = TcpStream::connect(server.addr).await.unwrap();
    client
        .write_all(b"GET /forever HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::timeout(GUARD, entered.notified()).await.unwrap();
    server.shutdown.cancel();
    tokio::time::timeout(GUARD, server.served)
        .await
        .expect("the server outlived its drain budget")
        .unwrap();
    let answer = read_until_closed(&mut client).await;
    assert!(answer.is_empty(), "{answer}");
}
