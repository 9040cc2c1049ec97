//! Real curl through the gateway's HTTP front, over `CONNECT` and plain HTTP, to a local target,
//! through a real tinyproxy that asks for its own credentials: the discovery API (in this
//! process, on a memory store) leases the tinyproxy with the client's token. Without the
//! client's credentials, with a token the API does not know or with a username outside the
//! grammar, the gateway answers 407 and nothing reaches the backend or the target.

mod common;

use common::{TOKEN, World, active, curl_through, until_released, world};
use egress_testkit::tinyproxy_available;

/// curl's status code and body for the target's `path` through the gateway, with `user` as
/// its proxy credentials (`None`: none) and `tunnel` forcing a `CONNECT` for plain HTTP.
async fn curl(w: &World, user: Option<&str>, tunnel: bool, path: &str) -> (String, String) {
    curl_through(w.gateway, user, tunnel, &format!("http://{}{path}", w.target)).await
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

/// The gateway's answer to `request`, sent as raw bytes, read to the end.
async fn raw(w: &World, request: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(w.gateway).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn requests_the_gateway_cannot_route_are_refused_and_dial_nothing() {
    if !tinyproxy_available() {
        return;
    }
    let w = world().await;
    let auth = format!(
        "Proxy-Authorization: Basic {}\r\nConnection: close\r\n",
        data_encoding::BASE64.encode(format!("any:{TOKEN}").as_bytes())
    );
    let no_port = raw(
        &w,
        format!("CONNECT example.test HTTP/1.1\r\nHost: example.test\r\n{auth}\r\n"),
    )
    .await;
    assert!(no_port.starts_with("HTTP/1.1 400"), "{no_port}");
    assert!(no_port.contains("host:port"), "{no_port}");
    let origin_form = raw(&w, format!("GET /204 HTTP/1.1\r\nHost: {}\r\n{auth}\r\n", w.target)).await;
    assert!(origin_form.starts_with("HTTP/1.1 400"), "{origin_form}");
    let https = raw(
        &w,
        format!("GET https://{0}/204 HTTP/1.1\r\nHost: {0}\r\n{auth}\r\n", w.target),
    )
    .await;
    assert!(
        https.starts_with("HTTP/1.1 400"),
        "absolute https:// is CONNECT's: {https}"
    );
    let huge = format!(
        "GET http://{0}/204 HTTP/1.1\r\nHost: {0}\r\nX-Pad: {1}\r\n{auth}\r\n",
        w.target,
        "a".repeat(64 * 1024)
    );
    let answer = raw(&w, huge).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "a head over the cap: {answer}"
    );
    let garbage = raw(&w, "\x16\x03\x01\x02\x00 not http\r\n\r\n".to_owned()).await;
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage}");
    assert!(w.seen.lock().unwrap().is_empty(), "nothing reached the target");
    assert_eq!(active(&w).await, 0, "no lease was taken");
}

#[tokio::test]
async fn a_backend_that_fails_is_reported_and_another_carries_the_request() {
    if !tinyproxy_available() {
        return;
    }
    let w = world().await;
    // A dead backend, faster on paper than the live one: the first lease goes to it.
    let dead = egress_testkit::dead_address().await;
    let mut fast = common::backend(
        "ns/dead",
        "127.0.0.1",
        dead.addr().port(),
        "gw-backend",
        common::BACKEND_PASSWORD,
    );
    fast.latency_millis = 0;
    w.add_proxy(fast);
    let user = format!("any:{TOKEN}");
    assert_eq!(
        curl(&w, Some(&user), true, "/204").await.0,
        "204",
        "carried by the live one"
    );
    // The dead one was reported for the target: the API now passes over it for that target.
    let api = egress_discovery::client::Client::new(&w.api, Some(TOKEN.into())).unwrap();
    let lease = api
        .acquire(&egress_discovery::client::AcquireRequest {
            target: Some("127.0.0.1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(lease.proxy.id, "ns/eu-1");
}
