//! Secrets never leave: with the access log on and every log line down to TRACE (the gateway's,
//! hyper's, reqwest's, the discovery API's) captured, after tunnels over both fronts, plain-HTTP
//! requests, a session and its report, a wrong token and a bad username, no client token and no
//! backend password appears in any line or in the metrics, in clear or in Basic encoding.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{BACKEND_PASSWORD, TOKEN, basic, curl_through, world_with};
use egress_discovery::client::{Client, ReportResult};
use egress_gateway::Settings;
use egress_testkit::tinyproxy_available;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn curl_socks(socks: std::net::SocketAddr, user: &str, url: &str) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg("--socks5-hostname")
        .arg(socks.to_string())
        .arg("--proxy-user")
        .arg(user)
        .arg(url)
        .output()
        .await
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn no_token_or_backend_password_reaches_a_log_line_or_a_metric() {
    if !tinyproxy_available() {
        return;
    }
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .init();
    let settings = Settings {
        access_log: true,
        ..Settings::default()
    };
    let w = world_with(2, settings).await;
    let target = format!("http://{}/204", w.target);
    for (user, tunnel) in [("geo=eu", true), ("any", false), ("session=s1,ttl=90s", true)] {
        let (code, body) = curl_through(w.gateway, Some(&format!("{user}:{TOKEN}")), tunnel, &target).await;
        assert_eq!(code, "204", "{user}: {body}");
    }
    let socks_url = format!("http://localhost:{}/204", w.target.port());
    assert_eq!(
        curl_socks(w.socks, &format!("session=s1:{TOKEN}"), &socks_url).await,
        "204"
    );
    let api = Client::new(&w.api, Some(TOKEN.into())).unwrap();
    api.report_session("s1", ReportResult::RateLimited, Some("127.0.0.1"))
        .await
        .unwrap();
    let wrong = "wrong-token-sentinel";
    let (code, _) = curl_through(w.gateway, Some(&format!("any:{wrong}")), true, &target).await;
    assert_eq!(code, "407");
    let (code, _) = curl_through(w.gateway, Some(&format!("geo=eu,geo=us:{TOKEN}")), true, &target).await;
    assert_eq!(code, "407");

    let mut registry = prometheus_client::registry::Registry::default();
    w.handle.metrics().register(&mut registry);
    let mut metrics = String::new();
    prometheus_client::encoding::text::encode(&mut metrics, &registry).unwrap();
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(logs.contains("egress_gateway::access"), "the access log is on:\n{logs}");
    assert!(logs.contains("destination"), "{logs}");
    let sentinels = [
        TOKEN.to_owned(),
        wrong.to_owned(),
        BACKEND_PASSWORD.to_owned(),
        basic("gw-backend", BACKEND_PASSWORD),
        basic("any", TOKEN),
        basic("geo=eu", TOKEN),
    ];
    for secret in &sentinels {
        let encoded = secret.trim_start_matches("Basic ");
        assert!(!logs.contains(encoded), "{secret:?} in the logs");
        assert!(!metrics.contains(encoded), "{secret:?} in the metrics");
    }
}
