//! The smoke run (`cargo xtask dev --smoke`, and `cargo xtask test`): without a person, the
//! running system is checked end to end. The discovery API refuses a caller without the token;
//! a lease is granted with credentials; the leased proxy refuses a request without them and
//! carries one with them to the local target; a lease naming the pool lands on a member; a
//! session's second acquire answers its lease again, and the lease is renewed; `kubectl
//! describe` shows the operator's events; the guide's curl lines through the gateway work as
//! printed; and neither the operator's log nor the gateway's holds a password.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use egress_api::Proxy;
use egress_discovery::client::AcquireRequest;
use kube::api::Api;

use super::layout::{Discovery, Layout, NAMESPACE};

/// What the target answers on every path but the probe's.
pub(super) const TARGET_GREETING: &str = "hello from the egress dev target";

/// What the smoke run checks beyond the leases.
pub(super) struct Checks<'a> {
    /// A sample Proxy whose events `kubectl describe` must show, when there is one.
    pub(super) first: Option<&'a String>,
    /// The sample Proxies, whose exits `kubectl get -o wide` must show.
    pub(super) proxies: &'a [String],
    pub(super) require_kubectl: bool,
    /// The guide's curl lines through the gateway.
    pub(super) gateway_lines: &'a [Vec<String>],
}

/// The whole smoke check of the run of `layout`: the sample Proxy must show its events, the
/// leases and the gateway must work as the module says, the logs hold no password.
pub(super) async fn run(
    layout: &Layout,
    api: Api<Proxy>,
    discovery: &Discovery<'_>,
    target: std::net::SocketAddr,
    checks: Checks<'_>,
) -> Result<()> {
    if let Some(first) = checks.first {
        describe_shows_events(api.clone(), &layout.file("kubeconfig"), first, checks.require_kubectl).await?;
    }
    match kubectl() {
        Some(kubectl) => {
            super::exits::wide_shows_exits(&api, &layout.file("kubeconfig"), checks.proxies, &kubectl).await?;
        }
        None if checks.require_kubectl || egress_testkit::real::required() => {
            bail!("kubectl is needed on PATH for the smoke run's exit check")
        }
        None => println!("dev: smoke: SKIPPED the kubectl get -o wide check: no kubectl on PATH"),
    }
    let ca = pki_ca(&layout.file("ca.pem"))?;
    let password = smoke(discovery, target, &ca).await?;
    smoke_pool(discovery, target, &ca).await?;
    smoke_session(discovery).await?;
    super::gateway::smoke(layout, checks.gateway_lines, discovery.token, &password).await?;
    // The operator minted, probed with and handed out that password: none of it may be logged.
    let log = std::fs::read_to_string(layout.file("operator.log"))?;
    if log.contains(&password) {
        bail!("the operator's log holds a proxy password");
    }
    println!("dev: smoke: the operator's log holds no proxy password");
    println!("dev: smoke: passed");
    Ok(())
}

/// The reasons `kubectl describe px` must show for a Proxy that became Ready.
const EXPECTED_EVENTS: [&str; 2] = ["Created", "Ready"];

/// Smoke: the operator's Events on `name` reach `kubectl describe px` (real kubectl, which reads
/// core v1 Events by `involvedObject` field selectors while the operator writes
/// events.k8s.io/v1). Waits (bounded) until the Events exist, then runs kubectl once.
async fn describe_shows_events(api: Api<Proxy>, kubeconfig: &Path, name: &str, required: bool) -> Result<()> {
    use futures::TryStreamExt as _;
    use k8s_openapi::api::core::v1::Event;
    use kube::runtime::WatchStreamExt as _;
    let Some(kubectl) = kubectl() else {
        // Where a test would fail (egress_testkit::real), xtask, no test, fails with an error.
        if required || egress_testkit::real::required() {
            bail!("kubectl is needed on PATH for the smoke run's describe check");
        }
        println!("dev: smoke: SKIPPED the kubectl describe check: no kubectl on PATH");
        return Ok(());
    };
    let events: Api<Event> = Api::namespaced(api.into_client(), NAMESPACE);
    let selector = format!("involvedObject.kind=Proxy,involvedObject.name={name}");
    let config = kube::runtime::watcher::Config::default().fields(&selector);
    let mut seen = std::collections::BTreeSet::new();
    let stream = kube::runtime::watcher(events, config).applied_objects();
    futures::pin_mut!(stream);
    let waited = tokio::time::timeout(EVENTS_BUDGET, async {
        while !EXPECTED_EVENTS.iter().all(|r| seen.contains(*r)) {
            match stream.try_next().await? {
                Some(e) => {
                    seen.insert(e.reason.unwrap_or_default());
                }
                None => bail!("the event watch ended"),
            }
        }
        anyhow::Ok(())
    })
    .await;
    match waited {
        Ok(r) => r?,
        Err(_) => bail!("{name} has Events {seen:?} after {EVENTS_BUDGET:?}, not all of {EXPECTED_EVENTS:?}"),
    }
    let out = tokio::time::timeout(
        EVENTS_BUDGET,
        tokio::process::Command::new(&kubectl)
            .args(["describe", "px", name, "--request-timeout=20s"])
            .env("KUBECONFIG", kubeconfig)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("kubectl describe did not finish")??;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "kubectl describe px {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let shown = events_section(&text);
    for reason in EXPECTED_EVENTS {
        if !shown.iter().any(|row| row.split_whitespace().nth(1) == Some(reason)) {
            bail!("kubectl describe px {name} shows no {reason} event:\n{text}");
        }
    }
    println!("dev: smoke: kubectl describe px {name} shows its events:");
    for row in &shown {
        println!("dev:   {row}");
    }
    Ok(())
}

/// How long the operator's Events and kubectl get.
const EVENTS_BUDGET: Duration = Duration::from_secs(30);

/// The rows of the `Events:` table of a `kubectl describe` (type, reason, age, from, message).
fn events_section(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| !l.starts_with("Events:"))
        .skip(3) // "Events:", the column names, the dashes
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// kubectl on PATH.
fn kubectl() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

/// The status a proxy answers `CONNECT authority` sent without credentials, within 10 s.
async fn bare_connect(ip: &str, port: u16, authority: &str) -> Result<u16> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect((ip, port)).await?;
        let mut conn = tokio::io::BufReader::new(tcp);
        conn.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
            .await?;
        let mut line = String::new();
        conn.read_line(&mut line).await?;
        line.split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("not a status line: {line:?}"))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| anyhow::anyhow!("the proxy at {ip}:{port} did not answer within 10 s"))?
}

/// The smoke check: a lease is granted with credentials, the leased proxy refuses a request
/// without them, and one with them reaches the local target. Returns the lease's password.
async fn smoke(discovery: &Discovery<'_>, target: std::net::SocketAddr, ca: &reqwest::Certificate) -> Result<String> {
    // Without the token the API answers 401 and nothing else.
    let anonymous = discovery.client(None)?;
    match anonymous.list(&Default::default()).await {
        Err(egress_discovery::client::ClientError::Unauthorized(_)) => {
            println!("dev: smoke: without the token the discovery API answers 401");
        }
        other => bail!("the discovery API served a request without the token: {other:?}"),
    }
    let client = discovery.client(Some(discovery.token.to_owned()))?;
    let lease = client
        .acquire(&AcquireRequest {
            selector: BTreeMap::from([("geo".to_owned(), "eu".to_owned())]),
            ttl_seconds: Some(60),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("acquiring a lease: {e}"))?;
    println!(
        "dev: smoke: lease {} granted on {} ({}:{})",
        lease.lease_id, lease.proxy.id, lease.proxy.ip, lease.proxy.port
    );
    // The samples' proxies demand credentials: the lease must carry them, and the proxy must
    // refuse a client without them.
    let Some(proxy_url) = lease.proxy.url.clone() else {
        bail!("the lease on {} carries no credentials (proxy.url)", lease.proxy.id);
    };
    let url = format!("https://127.0.0.1:{}/", target.port());
    // Asked bare, the proxy must challenge (407), not fail in some other way.
    let status = bare_connect(
        &lease.proxy.ip,
        lease.proxy.port,
        &format!("127.0.0.1:{}", target.port()),
    )
    .await?;
    if status != 407 {
        bail!(
            "the proxy {} answered a CONNECT without credentials with {status}, not 407",
            lease.proxy.id
        );
    }
    println!("dev: smoke: without the lease's credentials the proxy answers 407");
    let http = through_proxy(&proxy_url, ca)?;
    let answer = http
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url} through the lease"))?;
    let status = answer.status();
    let body = answer.text().await?;
    if !status.is_success() || !body.contains(TARGET_GREETING) {
        bail!("GET {url} through the lease answered {status}: {body:?}");
    }
    println!(
        "dev: smoke: GET {url} through {}:{} with the lease's credentials answered {status}",
        lease.proxy.ip, lease.proxy.port
    );
    client
        .release(&lease.lease_id)
        .await
        .map_err(|e| anyhow::anyhow!("releasing the lease: {e}"))?;
    lease
        .proxy
        .password
        .map(std::borrow::Cow::into_owned)
        .context("the lease carries a URL with credentials but no password")
}

/// The smoke check of the pool: a lease that names the pool lands on one of its members, whose
/// proxy carries a request with the lease's credentials.
async fn smoke_pool(discovery: &Discovery<'_>, target: std::net::SocketAddr, ca: &reqwest::Certificate) -> Result<()> {
    let client = discovery.client(Some(discovery.token.to_owned()))?;
    let lease = client
        .acquire(&AcquireRequest {
            selector: BTreeMap::from([("pool".to_owned(), "local-pool".to_owned())]),
            ttl_seconds: Some(60),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("acquiring a lease from the pool: {e}"))?;
    if !lease.proxy.id.starts_with(&format!("{NAMESPACE}/local-pool-")) {
        bail!("a lease naming the pool landed on {}", lease.proxy.id);
    }
    let proxy_url = lease
        .proxy
        .url
        .clone()
        .context("the pool's lease carries no credentials")?;
    let http = through_proxy(&proxy_url, ca)?;
    let url = format!("https://127.0.0.1:{}/", target.port());
    let status = http.get(&url).send().await?.status();
    if !status.is_success() {
        bail!(
            "GET {url} through the pool's member {} answered {status}",
            lease.proxy.id
        );
    }
    println!(
        "dev: smoke: a lease naming the pool got member {}, which carried a request ({status})",
        lease.proxy.id
    );
    client
        .release(&lease.lease_id)
        .await
        .map_err(|e| anyhow::anyhow!("releasing the pool's lease: {e}"))
}

/// The smoke check of sessions: a session's second acquire answers its lease again, which is
/// then renewed.
async fn smoke_session(discovery: &Discovery<'_>) -> Result<()> {
    let client = discovery.client(Some(discovery.token.to_owned()))?;
    let asked = AcquireRequest {
        ttl_seconds: Some(60),
        session: Some("smoke-login".to_owned()),
        ..Default::default()
    };
    let first = client
        .acquire(&asked)
        .await
        .map_err(|e| anyhow::anyhow!("acquiring a session's lease: {e}"))?;
    let again = client
        .acquire(&asked)
        .await
        .map_err(|e| anyhow::anyhow!("acquiring the session again: {e}"))?;
    if again.lease_id != first.lease_id || again.proxy.id != first.proxy.id {
        bail!(
            "the session's second acquire got lease {} on {}, not its lease {} on {}",
            again.lease_id,
            again.proxy.id,
            first.lease_id,
            first.proxy.id
        );
    }
    let renewed = client
        .renew(&first.lease_id, Some(Duration::from_secs(120)))
        .await
        .map_err(|e| anyhow::anyhow!("renewing the session's lease: {e}"))?;
    println!(
        "dev: smoke: session smoke-login kept lease {} on {} and renewed it to {} s",
        first.lease_id, first.proxy.id, renewed.ttl_seconds
    );
    client
        .release(&first.lease_id)
        .await
        .map_err(|e| anyhow::anyhow!("releasing the session's lease: {e}"))
}

/// A client that sends every request through the proxy at `proxy_url` (credentials in it) and
/// trusts `ca` alone, within 10 s.
fn through_proxy(proxy_url: &str, ca: &reqwest::Certificate) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(proxy_url)?)
        .tls_certs_only([ca.clone()])
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// The CA certificate at `path`, for a client that trusts it alone.
fn pki_ca(path: &Path) -> Result<reqwest::Certificate> {
    Ok(reqwest::Certificate::from_pem(&std::fs::read(path)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_events_table_of_a_describe_is_read_row_by_row() {
        let text = "Name:  local-eu-1\nStatus:\n  Phase:  Ready\nEvents:\n  Type    Reason   Age   From             Message\n  ----    ------   ----  ----             -------\n  Normal  Created  10s   egress-operator  created instance local:abc\n  Normal  Ready    8s    egress-operator  the proxy at 127.0.0.2 carries traffic\n";
        let rows = events_section(text);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].split_whitespace().nth(1), Some("Created"));
        assert_eq!(rows[1].split_whitespace().nth(1), Some("Ready"));
        assert!(events_section("Name: x\nEvents:  <none>\n").is_empty());
    }
}
