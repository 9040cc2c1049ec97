//! The probe against real tinyproxy, a TLS target signed by a test CA, and a scripted proxy for
//! the faults a real one cannot be made to do on demand.

use egress_testkit as support;

use std::time::Duration;

use egress_health::{ProbeError, ProbeRequest, ProbeTls, fetch_directly, probe};
use support::{Fault, Tinyproxy, dead_address, fault_proxy, http_target, pki, tinyproxy_available, tls_target};

fn request(proxy: &str, url: String, expected_status: u16) -> ProbeRequest {
    ProbeRequest {
        proxy: proxy.into(),
        url,
        expected_status,
        timeout: Duration::from_secs(5),
        credentials: None,
        destinations: None,
    }
}

/// Header names that would carry trace context or baggage to the target.
const TRACING_HEADERS: [&str; 6] = [
    "traceparent",
    "tracestate",
    "baggage",
    "uber-trace-id",
    "x-b3-traceid",
    "b3",
];

#[tokio::test]
async fn a_connect_through_tinyproxy_reaches_the_target_and_sends_nothing_identifying() {
    if !tinyproxy_available() {
        return;
    }
    let pki = pki();
    let (target, seen) = tls_target(&pki).await;
    let proxy = Tinyproxy::start(&[]);
    let url = format!("https://localhost:{}/generate_204", target.port());
    let outcome = probe(&request(&proxy.addr(), url, 204), &ProbeTls::with_roots(pki.roots())).await;
    assert_eq!(outcome.result, Ok(()));
    assert!(outcome.latency > Duration::ZERO);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "GET /generate_204 HTTP/1.1");
    assert_eq!(
        seen[0].1,
        ["host", "user-agent", "accept", "connection"],
        "exactly these headers"
    );
}

#[tokio::test]
async fn a_proxy_that_refuses_the_tunnel_fails_the_probe() {
    if !tinyproxy_available() {
        return;
    }
    let pki = pki();
    let (target, seen) = tls_target(&pki).await;
    // CONNECT is allowed to 443 only, so the target's port is refused.
    let proxy = Tinyproxy::start(&[443]);
    let url = format!("https://localhost:{}/204", target.port());
    let outcome = probe(&request(&proxy.addr(), url, 204), &ProbeTls::with_roots(pki.roots())).await;
    assert!(
        matches!(outcome.result, Err(ProbeError::TunnelRefused(403))),
        "{outcome:?}"
    );
    assert!(seen.lock().unwrap().is_empty(), "the target was never reached");
}

#[tokio::test]
async fn a_plain_http_target_is_fetched_in_absolute_form() {
    if !tinyproxy_available() {
        return;
    }
    let (target, seen) = http_target().await;
    let proxy = Tinyproxy::start(&[]);
    let url = format!("http://127.0.0.1:{}/200", target.port());
    let outcome = probe(&request(&proxy.addr(), url, 200), &ProbeTls::with_roots(pki().roots())).await;
    assert_eq!(outcome.result, Ok(()));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen[0].0, "GET /200 HTTP/1.1",
        "tinyproxy forwarded our absolute-form request"
    );
    for h in TRACING_HEADERS {
        assert!(
            !seen[0].1.iter().any(|n| n == h),
            "{h} reached the target: {:?}",
            seen[0].1
        );
    }
}

#[tokio::test]
async fn a_wrong_status_fails_the_probe() {
    if !tinyproxy_available() {
        return;
    }
    let pki = pki();
    let (target, _) = tls_target(&pki).await;
    let proxy = Tinyproxy::start(&[]);
    let url = format!("https://localhost:{}/500", target.port());
    let outcome = probe(&request(&proxy.addr(), url, 204), &ProbeTls::with_roots(pki.roots())).await;
    assert_eq!(
        outcome.result,
        Err(ProbeError::WrongStatus {
            got: 500,
            expected: 204
        })
    );
}

#[tokio::test]
async fn an_untrusted_target_certificate_fails_the_probe() {
    if !tinyproxy_available() {
        return;
    }
    let (target, seen) = tls_target(&pki()).await;
    let proxy = Tinyproxy::start(&[]);
    let url = format!("https://localhost:{}/204", target.port());
    // Trusts another CA than the one that signed the target.
    let outcome = probe(&request(&proxy.addr(), url, 204), &ProbeTls::with_roots(pki().roots())).await;
    assert!(matches!(outcome.result, Err(ProbeError::Tls(_))), "{outcome:?}");
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_dead_proxy_is_unreachable() {
    let proxy = dead_address().await;
    let outcome = probe(
        &request(&proxy.to_string(), "https://localhost:1/204".into(), 204),
        &ProbeTls::with_roots(pki().roots()),
    )
    .await;
    assert!(matches!(outcome.result, Err(ProbeError::Unreachable(_))), "{outcome:?}");
}

#[tokio::test]
async fn a_407_is_its_own_failure() {
    let proxy = fault_proxy(Fault::AuthRequired).await;
    let outcome = probe(
        &request(&proxy.to_string(), "https://localhost:1/204".into(), 204),
        &ProbeTls::with_roots(pki().roots()),
    )
    .await;
    assert_eq!(outcome.result, Err(ProbeError::ProxyAuthRequired));
    let plain = probe(
        &request(&proxy.to_string(), "http://localhost:1/204".into(), 204),
        &ProbeTls::with_roots(pki().roots()),
    )
    .await;
    assert_eq!(plain.result, Err(ProbeError::ProxyAuthRequired));
}

#[tokio::test]
async fn a_stalling_or_slow_proxy_is_cut_off_by_the_deadline() {
    for fault in [Fault::Silent, Fault::Slow] {
        let proxy = fault_proxy(fault).await;
        let mut req = request(&proxy.to_string(), "https://localhost:1/204".into(), 204);
        req.timeout = Duration::from_millis(300);
        let outcome = probe(&req, &ProbeTls::with_roots(pki().roots())).await;
        assert_eq!(
            outcome.result,
            Err(ProbeError::Timeout(Duration::from_millis(300))),
            "{fault:?}"
        );
    }
}

#[tokio::test]
async fn a_tunnel_closed_before_tls_fails_the_probe() {
    let proxy = fault_proxy(Fault::CloseMidTunnel).await;
    let outcome = probe(
        &request(&proxy.to_string(), "https://localhost:1/204".into(), 204),
        &ProbeTls::with_roots(pki().roots()),
    )
    .await;
    assert!(matches!(outcome.result, Err(ProbeError::Tls(_))), "{outcome:?}");
}

#[tokio::test]
async fn a_malformed_target_url_is_named() {
    let outcome = probe(
        &request("127.0.0.1:1", "ftp://x/".into(), 204),
        &ProbeTls::with_roots(pki().roots()),
    )
    .await;
    assert!(matches!(outcome.result, Err(ProbeError::BadUrl(_))), "{outcome:?}");
}

#[tokio::test]
async fn hostile_answers_are_malformed_and_bounded() {
    for fault in [Fault::Endless, Fault::Garbage] {
        let proxy = fault_proxy(fault).await;
        let outcome = probe(
            &request(&proxy.to_string(), "https://localhost:1/204".into(), 204),
            &ProbeTls::with_roots(pki().roots()),
        )
        .await;
        assert!(
            matches!(outcome.result, Err(ProbeError::Malformed(_))),
            "{fault:?}: {outcome:?}"
        );
    }
}

#[tokio::test]
async fn the_probe_authenticates_and_a_refused_credential_is_its_own_failure() {
    if !tinyproxy_available() {
        return;
    }
    let pki = pki();
    let (target, seen) = tls_target(&pki).await;
    let good = egress_credentials::Credentials::generate();
    let proxy = Tinyproxy::start_with(&[], Some((good.username(), good.password())));
    let url = format!("https://localhost:{}/generate_204", target.port());
    let with = |credentials: Option<egress_credentials::Credentials>| ProbeRequest {
        credentials,
        ..request(&proxy.addr(), url.clone(), 204)
    };
    let wrong = egress_credentials::Credentials::new(good.username(), "not-it").unwrap();
    for credentials in [None, Some(wrong)] {
        let outcome = probe(&with(credentials), &ProbeTls::with_roots(pki.roots())).await;
        assert_eq!(outcome.result, Err(ProbeError::ProxyAuthRequired));
    }
    let outcome = probe(&with(Some(good.clone())), &ProbeTls::with_roots(pki.roots())).await;
    assert_eq!(outcome.result, Ok(()));
    // The credentials went to the proxy only: nothing of them reached the target.
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].1.iter().all(|h| !h.contains("authorization")), "{heads:?}");
    // Nor does an error or the request's Debug show the password.
    let shown = format!("{:?} {}", with(Some(good.clone())), ProbeError::ProxyAuthRequired);
    assert!(!shown.contains(good.password()), "{shown}");
}

#[tokio::test]
async fn a_plain_http_probe_sends_the_credentials_to_the_proxy() {
    if !tinyproxy_available() {
        return;
    }
    let (target, seen) = http_target().await;
    let good = egress_credentials::Credentials::generate();
    let proxy = Tinyproxy::start_with(&[], Some((good.username(), good.password())));
    let url = format!("http://127.0.0.1:{}/204", target.port());
    let mut req = request(&proxy.addr(), url.clone(), 204);
    let refused = probe(&req, &ProbeTls::with_roots(pki().roots())).await;
    assert_eq!(refused.result, Err(ProbeError::ProxyAuthRequired));
    req.credentials = Some(good);
    assert_eq!(probe(&req, &ProbeTls::with_roots(pki().roots())).await.result, Ok(()));
    // tinyproxy takes Proxy-Authorization off before forwarding.
    let heads = seen.lock().unwrap().clone();
    assert!(
        heads
            .iter()
            .all(|(_, names)| !names.iter().any(|n| n == "proxy-authorization")),
        "{heads:?}"
    );
}

#[tokio::test]
async fn the_target_fetched_directly_answers_or_says_why_not() {
    let pki = pki();
    let tls = ProbeTls::with_roots(pki.roots());
    let (target, seen) = tls_target(&pki).await;
    let url = |path: &str| format!("https://localhost:{}{path}", target.port());
    let timeout = Duration::from_secs(5);
    assert_eq!(fetch_directly(&url("/204"), 204, timeout, &tls).await.result, Ok(()));
    assert_eq!(
        seen.lock().unwrap()[0].0,
        "GET /204 HTTP/1.1",
        "no proxy: the origin form"
    );
    assert_eq!(
        fetch_directly(&url("/500"), 204, timeout, &tls).await.result,
        Err(ProbeError::WrongStatus {
            got: 500,
            expected: 204
        })
    );
    let (plain, _) = http_target().await;
    let plain_url = format!("http://127.0.0.1:{}/204", plain.port());
    assert_eq!(fetch_directly(&plain_url, 204, timeout, &tls).await.result, Ok(()));
    let dead = dead_address().await;
    let down = format!("https://{dead}/204");
    assert!(matches!(
        fetch_directly(&down, 204, timeout, &tls).await.result,
        Err(ProbeError::Unreachable(_))
    ));
    // A target that never answers is bounded by the timeout.
    let silent = fault_proxy(Fault::Silent).await;
    let silent_url = format!("http://{silent}/204");
    let short = Duration::from_millis(300);
    assert_eq!(
        fetch_directly(&silent_url, 204, short, &tls).await.result,
        Err(ProbeError::Timeout(short))
    );
}

/// With a guard (External proxies), a proxy whose host is or resolves to an internal address is
/// refused before any connection: a listener there sees none. The same proxy allowlisted is
/// dialled as usual.
#[tokio::test]
async fn a_guarded_probe_never_dials_an_internal_proxy() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (target, _) = http_target().await;
    let url = format!("http://127.0.0.1:{}/", target.port());
    let tls = ProbeTls::with_roots(pki().roots());
    let guard = std::sync::Arc::new(egress_netguard::Guard::default());
    for host in ["127.0.0.1", "localhost"] {
        let req = ProbeRequest {
            destinations: Some(guard.clone()),
            ..request(&format!("{host}:{port}"), url.clone(), 204)
        };
        let outcome = probe(&req, &tls).await;
        let Err(ProbeError::Internal(why)) = &outcome.result else {
            panic!("{host}: {:?}", outcome.result);
        };
        assert!(why.contains("loopback"), "{why}");
    }
    // Had a probe connected, its connection would be the first one waiting; it is ours.
    let ours = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (_, first) = listener.accept().await.unwrap();
    assert_eq!(first, ours.local_addr().unwrap(), "the guarded probe dialled the proxy");

    let allowed = std::sync::Arc::new(egress_netguard::Guard::new(&[], &["127.0.0.1".into()]).unwrap());
    let req = ProbeRequest {
        destinations: Some(allowed),
        ..request(&format!("127.0.0.1:{port}"), url, 204)
    };
    let probing = tokio::spawn(async move { probe(&req, &tls).await });
    let (_dialled, _) = listener.accept().await.expect("the allowlisted proxy is dialled");
    probing.abort();
}
