//! Real curl through the gateway's SOCKS5 front (`--socks5-hostname`: the name goes to the
//! backend), through a real tinyproxy, to a local target; and the handshakes SOCKS5 clients may
//! get wrong, each answered as RFC 1928 and 1929 say, by what comes back.

mod common;

use common::{TOKEN, World, active, until_released, world};
use egress_testkit::tinyproxy_available;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// curl's status code for the target's `path` through the SOCKS5 front, as `user`.
async fn curl_socks(w: &World, user: &str, path: &str) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg("--socks5-hostname")
        .arg(w.socks.to_string())
        .arg("--proxy-user")
        .arg(user)
        .arg(format!("http://localhost:{}{path}", w.target.port()))
        .output()
        .await
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the front answers `sent`, to the end (it closes after a refusal).
async fn exchange(w: &World, sent: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(w.socks).await.unwrap();
    s.write_all(sent).await.unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got).await;
    got
}

fn greeting_and_credentials(user: &str, password: &str) -> Vec<u8> {
    let mut b = vec![5, 1, 2, 1, u8::try_from(user.len()).unwrap()];
    b.extend(user.as_bytes());
    b.push(u8::try_from(password.len()).unwrap());
    b.extend(password.as_bytes());
    b
}

#[tokio::test]
async fn curl_reaches_the_target_through_the_socks5_front() {
    if !tinyproxy_available() {
        return;
    }
    let w = world().await;
    assert_eq!(curl_socks(&w, &format!("geo=eu:{TOKEN}"), "/204").await, "204");
    assert_eq!(curl_socks(&w, &format!("any:{TOKEN}"), "/204").await, "204");
    let seen = w.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(until_released(&w).await, 0, "every lease given back");
}

#[tokio::test]
async fn bad_handshakes_are_answered_and_nothing_is_dialled() {
    if !tinyproxy_available() {
        return;
    }
    let w = world().await;
    assert_eq!(exchange(&w, &[5, 1, 0]).await, [5, 0xFF], "no authentication: refused");
    assert_eq!(
        exchange(&w, &[4, 1, 0, 80, 127, 0, 0, 1, 0]).await,
        [] as [u8; 0],
        "SOCKS4: closed"
    );
    let wrong_token = greeting_and_credentials("any", "not-a-token");
    assert_eq!(
        exchange(&w, &wrong_token).await,
        [5, 2, 1, 1],
        "a token the API does not take"
    );
    let bad_username = greeting_and_credentials("geo=eu,geo=us", TOKEN);
    assert_eq!(
        exchange(&w, &bad_username).await,
        [5, 2, 1, 1],
        "a username outside the grammar"
    );
    let mut bind = greeting_and_credentials("any", TOKEN);
    bind.extend([5, 2, 0, 1, 127, 0, 0, 1, 0, 80]);
    assert_eq!(
        exchange(&w, &bind).await,
        [5, 2, 1, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0],
        "BIND: command not supported"
    );
    assert!(w.seen.lock().unwrap().is_empty(), "nothing reached the target");
    assert_eq!(active(&w).await, 0, "no lease was taken");
}
