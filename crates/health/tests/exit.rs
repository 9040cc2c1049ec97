//! The exit check against real tinyproxy and a local echo target: the address the echo sees
//! through the proxy (over http and over an https tunnel), the operator's own one, and what a
//! hanging or lying echo gives, each asserted by outcome with a small budget.

use egress_testkit as support;

use std::net::IpAddr;
use std::time::Duration;

use egress_health::{EchoError, ProbeError, ProbeRequest, ProbeTls, exit_through, own_exit};
use support::echo::{Echo, EchoTarget};
use support::{Tinyproxy, pki, tinyproxy_available};

fn request(proxy: &str, url: String, budget: Duration) -> ProbeRequest {
    ProbeRequest {
        proxy: proxy.into(),
        url,
        expected_status: 204,
        timeout: budget,
        credentials: None,
        destinations: None,
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A tinyproxy whose connections leave from 127.0.0.`last`, allowed to `port`.
fn leaving_from(last: u8, port: u16) -> Tinyproxy {
    Tinyproxy::start_leaving_from(&[port], None, Some(std::net::Ipv4Addr::new(127, 0, 0, last)))
}

#[tokio::test]
async fn the_echo_sees_the_proxys_exit_over_http_and_through_a_tunnel() {
    if !tinyproxy_available() {
        return;
    }
    let pki = pki();
    let tls = ProbeTls::with_roots(pki.roots());
    let plain = EchoTarget::http("127.0.0.1").await;
    let proxy = leaving_from(2, plain.addr.port());
    let budget = Duration::from_secs(5);
    let found = exit_through(&request(&proxy.addr(), plain.url(), budget), &tls).await;
    assert_eq!(found, Ok(ip("127.0.0.2")));

    let secure = EchoTarget::https(&pki, "127.0.0.1").await;
    let tunnel = leaving_from(3, secure.addr.port());
    secure.answer_as(Echo::Json);
    let url = format!("https://localhost:{}/ip", secure.addr.port());
    assert_eq!(
        exit_through(&request(&tunnel.addr(), url.clone(), budget), &tls).await,
        Ok(ip("127.0.0.3"))
    );
    // Straight from here: the operator's own exit.
    assert_eq!(own_exit(&url, budget, &tls).await, Ok(ip("127.0.0.1")));
}

#[tokio::test]
async fn an_echo_that_hangs_or_lies_leaves_the_exit_unknown_within_the_budget() {
    if !tinyproxy_available() {
        return;
    }
    let tls = ProbeTls::with_roots(pki().roots());
    let echo = EchoTarget::http("127.0.0.1").await;
    let proxy = leaving_from(4, echo.addr.port());
    let budget = Duration::from_secs(1);
    let req = request(&proxy.addr(), echo.url(), budget);
    for (mode, want) in [
        (Echo::List, EchoError::List),
        (Echo::Text("not an address".into()), EchoError::NotAnAddress),
        (Echo::Text("127.0.0.2:80".into()), EchoError::NotAnAddress),
        (Echo::Text(format!("{}127.0.0.2", " ".repeat(1100))), EchoError::TooLong),
        (Echo::Hang, EchoError::Fetch(ProbeError::Timeout(budget))),
    ] {
        echo.answer_as(mode.clone());
        assert_eq!(exit_through(&req, &tls).await, Err(want), "{mode:?}");
    }
    // An echo that is not there at all.
    let dead = support::dead_address().await;
    let gone = format!("http://{dead}/ip");
    let found = exit_through(&request(&proxy.addr(), gone, budget), &tls).await;
    assert!(
        matches!(found, Err(EchoError::Status(_) | EchoError::Fetch(_))),
        "{found:?}"
    );
}
