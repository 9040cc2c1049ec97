//! Chaining through real tinyproxy backends and scripted ones: a tunnel carries a request to a
//! target once the backend said yes, with the backend's credentials; a backend that refuses,
//! stays silent, answers garbage or cannot be reached gives a clear error and no tunnel.

use std::time::Duration;

use egress_gateway::chain::{Backend, ChainError, Limits, tunnel};
use egress_testkit::{Fault, Tinyproxy, dead_address, fault_proxy, http_target, tinyproxy_available};
use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn at(port: u16, credentials: Option<(&str, &str)>) -> Backend {
    Backend {
        addr: ([127, 0, 0, 1], port).into(),
        credentials: credentials.map(|(u, p)| (u.to_owned(), p.to_owned())),
    }
}

/// Small limits, so a silent backend ends the test soon; the outcome is asserted, never the time.
const SHORT: Limits = Limits {
    budget: Duration::from_millis(300),
    max_head: 8192,
};

#[tokio::test]
async fn a_tunnel_through_tinyproxy_carries_a_request_to_the_target() {
    if !tinyproxy_available() {
        return;
    }
    let (target, seen) = http_target().await;
    let proxy = Tinyproxy::start_with(&[target.port()], Some(("gw-user", "gw-pass")));
    let backend = at(proxy.port, Some(("gw-user", "gw-pass")));
    let mut t = tunnel(&backend, &target.to_string(), Limits::default())
        .await
        .expect("tinyproxy opens the tunnel");
    let request = format!("GET /204 HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    t.write_all(request.as_bytes()).await.expect("sent");
    let mut answer = String::new();
    t.read_to_string(&mut answer).await.expect("read");
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].1.iter().all(|h| !h.eq_ignore_ascii_case("proxy-authorization")),
        "the backend's credentials stay with the backend: {seen:?}"
    );
}

#[tokio::test]
async fn wrong_credentials_or_a_forbidden_port_give_the_backends_refusal() {
    if !tinyproxy_available() {
        return;
    }
    let (target, _) = http_target().await;
    let proxy = Tinyproxy::start_with(&[target.port()], Some(("gw-user", "gw-pass")));
    let wrong = at(proxy.port, Some(("gw-user", "not-it")));
    let refused = tunnel(&wrong, &target.to_string(), Limits::default()).await.err();
    // tinyproxy answers wrong credentials on a CONNECT with 401, where RFC 9110 says 407.
    assert!(
        matches!(refused, Some(ChainError::Refused(s)) if s == StatusCode::UNAUTHORIZED || s == StatusCode::PROXY_AUTHENTICATION_REQUIRED),
        "{refused:?}"
    );
    let none = at(proxy.port, None);
    assert!(matches!(
        tunnel(&none, &target.to_string(), Limits::default()).await.err(),
        Some(ChainError::Refused(_))
    ));
    let right = at(proxy.port, Some(("gw-user", "gw-pass")));
    let other_port = format!("127.0.0.1:{}", target.port().wrapping_add(1).max(1));
    let forbidden = tunnel(&right, &other_port, Limits::default()).await.err();
    assert_eq!(forbidden, Some(ChainError::Refused(StatusCode::FORBIDDEN)));
    assert!(!forbidden.unwrap().worth_another(), "no backend would allow it");
}

#[tokio::test]
async fn a_silent_backend_runs_out_the_budget() {
    let silent = fault_proxy(Fault::Silent).await;
    let got = tunnel(&at(silent.port(), None), "example.test:443", SHORT).await.err();
    assert_eq!(got, Some(ChainError::Timeout(SHORT.budget)));
}

#[tokio::test]
async fn a_backend_answering_garbage_or_endlessly_is_not_http() {
    for fault in [Fault::Garbage, Fault::Endless] {
        let backend = fault_proxy(fault).await;
        let got = tunnel(&at(backend.port(), None), "example.test:443", SHORT).await.err();
        assert_eq!(got, Some(ChainError::Protocol), "{fault:?}");
    }
}

#[tokio::test]
async fn a_backend_asking_for_credentials_refuses_with_407() {
    let backend = fault_proxy(Fault::AuthRequired).await;
    let got = tunnel(&at(backend.port(), None), "example.test:443", SHORT).await.err();
    assert_eq!(
        got,
        Some(ChainError::Refused(StatusCode::PROXY_AUTHENTICATION_REQUIRED))
    );
}

#[tokio::test]
async fn an_unreachable_backend_is_a_dial_error() {
    let dead = dead_address().await;
    let got = tunnel(&at(dead.addr().port(), None), "example.test:443", SHORT)
        .await
        .err();
    assert!(matches!(got, Some(ChainError::Dial(_))), "{got:?}");
}
