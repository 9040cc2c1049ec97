//! `cargo xtask dev`: the whole system on one machine, with real proxies.
//!
//! ```text
//!  egress-kube-testserver (CRDs) ◄── egress-operator ──► local provider ──► tinyproxy × 6
//!                                                         (3 Proxies, a pool of 2 + 1 standby)
//!          ▲                              │  └─ health probes ──► TLS target (this process)
//!     samples applied                     └─ discovery API 127.0.0.1:<port>
//! ```
//!
//! Everything lives under `<target>/egress-dev/`: the kubeconfig, the providers config, the
//! target's CA, the proxies' state directory and the logs. The children run in their own process
//! groups, so a Ctrl-C reaches this process only and the teardown runs in order: the Proxies are
//! deleted (the operator stops their tinyproxies), then the operator and the test server stop,
//! then anything a crash left in the state directory is removed through the local provider. A run
//! killed outright is cleaned up by the next one.
//!
//! Long file: the `dev` command's steps (certificates, the test server, the operator, three
//! tinyproxies, the smoke run, the teardown) run in order and share their state.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use egress_api::{Proxy, ProxyPool};
use egress_discovery::client::{AcquireRequest, Client};
use egress_provider::OpCtx;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::procs::{Killed, free_port};
use crate::test_server::wait_for_kubeconfig as wait_for_file;
use crate::system;

/// The namespace the samples go to.
const NAMESPACE: &str = "default";
/// The local entry's name (the samples' `spec.provider`).
const ENTRY: &str = "local";
/// How long the samples get to become Ready.
const READY_BUDGET: Duration = Duration::from_secs(120);
/// How long the operator gets to delete the Proxies' instances at teardown.
const DELETE_BUDGET: Duration = Duration::from_secs(60);
/// Where the operator's tinyproxy comes from.
const TINYPROXY: &str = "/usr/bin/tinyproxy";

/// What `cargo xtask dev` was asked for.
pub(crate) struct Options {
    /// Run through once without a person: lease, send a request, tear down.
    pub(crate) smoke: bool,
    /// Use a release build.
    pub(crate) release: bool,
    /// The discovery API's port (0: any free one).
    pub(crate) discovery_port: u16,
    /// The smoke run's `kubectl describe` check fails, rather than skips, without kubectl
    /// (under `cargo xtask test`, as for the tests).
    pub(crate) require_kubectl: bool,
}

/// Files of one run.
struct Layout {
    dir: PathBuf,
}

impl Layout {
    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
}

pub(crate) fn run(root: &Path, options: &Options) -> Result<()> {
    // Before anything compiles: the build needs libvirt-dev, the run needs tinyproxy.
    system::require_packages(&[system::BUILD_PACKAGES, &["tinyproxy"]].concat())?;
    if !Path::new(TINYPROXY).exists() {
        bail!("{TINYPROXY} is needed: apt-get install tinyproxy (as root, cargo xtask dev installs it)");
    }
    let profile = if options.release { "release" } else { "debug" };
    let mut build = Command::new(crate::cargo_bin());
    build.current_dir(root).args(["build", "--workspace", "--bins"]);
    if options.release {
        build.arg("--release");
    }
    if !build.status().context("running cargo build")?.success() {
        bail!("building the operator and the test server failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let bin = target.join(profile);
    let layout = Layout {
        dir: target.join("egress-dev"),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(clean_leftovers(&layout))?;
    std::fs::create_dir_all(&layout.dir)?;
    runtime.block_on(session(root, &bin, &layout, options))
}

/// Stops what an earlier run left: its recorded child processes and its tinyproxies.
async fn clean_leftovers(layout: &Layout) -> Result<()> {
    if let Ok(pids) = std::fs::read_to_string(layout.file("pids")) {
        for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("egress-"));
            if ours && let Some(p) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
                println!("dev: stopping process {pid} left by an earlier run");
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
    }
    if layout.state().exists() {
        let left = remove_instances(&layout.state()).await?;
        if left > 0 {
            println!("dev: removed {left} proxies left by an earlier run");
        }
    }
    let _ = std::fs::remove_dir_all(&layout.dir);
    Ok(())
}

/// Deletes every instance in `state` through the local provider; returns how many there were.
async fn remove_instances(state: &Path) -> Result<usize> {
    let entry =
        egress_provider::config::ProviderConfig::new(ENTRY, ENTRY).with_block(&egress_provider_local::LocalConfig {
            state_dir: state.display().to_string(),
            tinyproxy_path: None,
            connect_ports: None,
        });
    let provider = egress_provider_local::construct(&entry).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cx = OpCtx::background().with_timeout(Duration::from_secs(60));
    let instances = provider.list_by_tag(&cx).await?;
    for i in &instances {
        provider.delete(&cx, &i.id).await?;
    }
    Ok(instances.len())
}

/// The running system: started, used, and always torn down.
async fn session(root: &Path, bin: &Path, layout: &Layout, options: &Options) -> Result<()> {
    // From here on Ctrl-C no longer kills this process: it starts the teardown (and a second
    // one hurries it), so nothing started below is left behind.
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let pki = Pki::new()?;
    std::fs::write(layout.file("ca.pem"), &pki.ca_pem)?;
    let target = tls_target(pki.server.clone()).await?;
    let discovery_port = if options.discovery_port == 0 {
        free_port()?
    } else {
        options.discovery_port
    };
    let discovery = format!("http://127.0.0.1:{discovery_port}");

    let kubeconfig = layout.file("kubeconfig");
    let mut server = Killed(
        Command::new(bin.join("egress-kube-testserver"))
            .args(["--namespace", NAMESPACE, "--crds"])
            .arg(root.join("deploy/crds"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(layout.file("testserver.log"))?)
            .process_group(0)
            .spawn()
            .context("starting egress-kube-testserver")?,
    );
    remember_pid(layout, server.0.id())?;
    wait_for_file(&kubeconfig, &mut server.0)?;

    let providers = layout.file("providers.yaml");
    std::fs::write(
        &providers,
        format!(
            "providers:\n  - name: {ENTRY}\n    type: local\n    local:\n      stateDir: {}\n      \
             # the local target, and the public one the guide's curl line names\n      \
             connectPorts: [{}, 443]\n",
            layout.state().display(),
            target.port()
        ),
    )?;
    // The discovery API asks for a token, as installed: one made for this run, in a file the
    // operator follows (as it follows the Secret volume in a cluster).
    let token = discovery_token();
    let token_file = layout.file("discovery-token");
    std::fs::write(&token_file, format!("{token}\n"))?;
    let operator = Killed(
        Command::new(bin.join("egress-operator"))
            .arg(format!("--providers-config={}", providers.display()))
            .arg(format!("--discovery-addr=127.0.0.1:{discovery_port}"))
            .arg(format!("--discovery-token-file={}", token_file.display()))
            .arg(format!(
                "--health-check-url=https://127.0.0.1:{}/generate_204",
                target.port()
            ))
            .arg(format!("--health-check-ca-file={}", layout.file("ca.pem").display()))
            .args([
                "--leader-elect=false",
                "--metrics-bind-address=0",
                "--health-probe-bind-address=0",
                // An External Proxy tried here points at a tinyproxy on this machine.
                "--allowed-internal-destinations=127.0.0.0/8,localhost",
            ])
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(layout.file("operator.log"))?)
            .process_group(0)
            .spawn()
            .context("starting egress-operator")?,
    );
    remember_pid(layout, operator.0.id())?;
    let mut running = Running {
        layout,
        server: Some(server),
        operator: Some(operator),
        api: None,
        pools: None,
    };

    let api = Discovery {
        url: &discovery,
        token: &token,
    };
    let used = tokio::select! {
        used = use_it(&mut running, root, &kubeconfig, &api, target, options) => used,
        _ = interrupts.recv() => {
            println!("\ndev: interrupted (Ctrl-C again to stop at once)");
            Ok(())
        }
    };
    let torn_down = tokio::select! {
        t = running.tear_down() => t,
        _ = interrupts.recv() => {
            println!("\ndev: stopping at once");
            running.kill_now().await
        }
    };
    match (used, torn_down) {
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(())) => Ok(()),
    }
}

/// Adds a child's pid to the file the next run reads to stop what this one left.
fn remember_pid(layout: &Layout, pid: u32) -> Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(layout.file("pids"))?;
    writeln!(file, "{pid}")?;
    Ok(())
}

/// The children and what was created in the cluster.
struct Running<'a> {
    layout: &'a Layout,
    server: Option<Killed>,
    operator: Option<Killed>,
    api: Option<Api<Proxy>>,
    pools: Option<Api<ProxyPool>>,
}

impl Running<'_> {
    /// The hurried teardown: the operator and the test server are killed, the proxies removed
    /// directly.
    async fn kill_now(&mut self) -> Result<()> {
        drop(self.operator.take());
        drop(self.server.take());
        remove_instances(&self.layout.state()).await?;
        let _ = std::fs::remove_file(self.layout.file("pids"));
        Ok(())
    }

    /// Deletes the Proxies (so the operator removes their instances), stops the operator and the
    /// test server, removes whatever instance is left, and checks that no tinyproxy survived.
    async fn tear_down(&mut self) -> Result<()> {
        println!("dev: tearing down");
        // Pools first: their members drain and go with them (deleting the members alone would
        // only make the pools make new ones).
        if let Some(pools) = self.pools.take() {
            let deleted = delete_all(&pools, "ProxyPools").await;
            if let Err(e) = &deleted {
                println!("dev: {e:#} (removing the proxies directly)");
            }
        }
        if let Some(api) = self.api.take() {
            let deleted = delete_all(&api, "Proxies").await;
            if let Err(e) = &deleted {
                println!("dev: {e:#} (removing the proxies directly)");
            }
        }
        if let Some(operator) = self.operator.take() {
            operator.stop(Duration::from_secs(15));
        }
        if let Some(server) = self.server.take() {
            server.stop(Duration::from_secs(5));
        }
        let left = remove_instances(&self.layout.state()).await?;
        if left > 0 {
            println!("dev: removed {left} proxies the operator had not deleted");
        }
        let _ = std::fs::remove_file(self.layout.file("pids"));
        let survivors = tinyproxies_under(&self.layout.state());
        if !survivors.is_empty() {
            bail!("tinyproxy processes survived the teardown: {survivors:?}");
        }
        println!("dev: stopped everything; logs are in {}", self.layout.dir.display());
        Ok(())
    }
}

/// Deletes every object of `api`'s kind in the namespace and waits until the operator has let
/// them go (a pool, once its members have drained and gone).
async fn delete_all<K>(api: &Api<K>, what: &str) -> Result<()>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .with_context(|| format!("deleting the {what}"))?;
    let started = Instant::now();
    loop {
        let left = api.list(&ListParams::default()).await?.items.len();
        if left == 0 {
            return Ok(());
        }
        if started.elapsed() > DELETE_BUDGET {
            bail!("{left} {what} still there {DELETE_BUDGET:?} after their deletion");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A new random discovery token for one run (hex of 24 random bytes).
fn discovery_token() -> String {
    let bytes: [u8; 24] = rand::random();
    data_encoding::HEXLOWER.encode(&bytes)
}

/// Where the run's discovery API is, and its token.
struct Discovery<'a> {
    url: &'a str,
    token: &'a str,
}

/// Applies the samples, waits for Ready, then prints the guide and waits for Ctrl-C, or (smoke)
/// leases a proxy and sends a request through it.
async fn use_it(
    running: &mut Running<'_>,
    root: &Path,
    kubeconfig: &Path,
    discovery: &Discovery<'_>,
    target: std::net::SocketAddr,
    options: &Options,
) -> Result<()> {
    let config =
        kube::Config::from_custom_kubeconfig(kube::config::Kubeconfig::read_from(kubeconfig)?, &Default::default())
            .await?;
    let client = kube::Client::try_from(config)?;
    let api: Api<Proxy> = Api::namespaced(client.clone(), NAMESPACE);
    let pools: Api<ProxyPool> = Api::namespaced(client, NAMESPACE);
    running.api = Some(api.clone());
    running.pools = Some(pools.clone());
    let samples = root.join("deploy/samples/local");
    let mut names = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&samples)
        .with_context(|| format!("reading {}", samples.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut pool_names = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let parsing = || format!("parsing {}", file.display());
        let kind: serde_json::Value = serde_saphyr::from_str(&text).with_context(parsing)?;
        if kind["kind"] == "ProxyPool" {
            let pool: ProxyPool = serde_saphyr::from_str(&text).with_context(parsing)?;
            let created = pools
                .create(&PostParams::default(), &pool)
                .await
                .with_context(|| format!("creating {}", file.display()))?;
            pool_names.push(created.metadata.name.unwrap_or_default());
            continue;
        }
        let proxy: Proxy = serde_saphyr::from_str(&text).with_context(parsing)?;
        let created = api
            .create(&PostParams::default(), &proxy)
            .await
            .with_context(|| format!("creating {}", file.display()))?;
        names.push(created.metadata.name.unwrap_or_default());
    }
    println!(
        "dev: applied {} sample Proxies ({}) and the pool {}; waiting until they are Ready",
        names.len(),
        names.join(", "),
        pool_names.join(", ")
    );
    wait_ready(&api, &names, running).await?;
    wait_pools(&pools, &pool_names, running).await?;

    let kubeconfig = kubeconfig.display();
    let ca = running.layout.file("ca.pem");
    let ca = ca.display();
    let log = running.layout.file("operator.log");
    let log = log.display();
    let target_url = format!("https://127.0.0.1:{}/", target.port());
    println!(
        "
The egress-proxy operator runs against a local Kubernetes test server, with {n} tinyproxy
proxies of the local provider. Try, in another terminal:

  # the Proxies, as kubectl sees them, and one with its events
  kubectl --kubeconfig {kubeconfig} get proxies
  kubectl --kubeconfig {kubeconfig} describe px {first}

  # the pool: its counts, its events, and a resize (its members drain before they go)
  kubectl --kubeconfig {kubeconfig} get ppool
  kubectl --kubeconfig {kubeconfig} describe ppool local-pool
  kubectl --kubeconfig {kubeconfig} scale ppool local-pool --replicas=3

  # the discovery API (its token: {token_file}): list, then lease a proxy in the EU for 60 s
  curl -s -H 'Authorization: Bearer {token}' {discovery}/v1/proxies
  curl -s -X POST -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' \\
       -d '{{\"selector\": {{\"geo\": \"eu\"}}, \"ttlSeconds\": 60}}' {discovery}/v1/leases
  # or one of the pool's members
  curl -s -X POST -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' \\
       -d '{{\"selector\": {{\"pool\": \"local-pool\"}}}}' {discovery}/v1/leases

  # traffic through the leased proxy: put the lease's proxy.url (http://user:password@ip:port;
  # the proxies demand the credentials the lease hands out) in place of PROXY_URL:
  # to the local target,
  curl --cacert {ca} -x PROXY_URL {target_url}
  # and to the internet, where this machine can reach it
  curl -x PROXY_URL https://www.gstatic.com/generate_204 -w '%{{http_code}}\\n'

  # give the lease back (its leaseID from the answer above)
  curl -s -X DELETE -H 'Authorization: Bearer {token}' {discovery}/v1/leases/LEASE_ID

The operator's log: {log}
",
        n = names.len(),
        first = names.first().map_or("NAME", String::as_str),
        discovery = discovery.url,
        token = discovery.token,
        token_file = running.layout.file("discovery-token").display(),
    );

    if !options.smoke {
        println!("Press Ctrl-C to stop everything.");
        std::future::pending::<()>().await;
    }
    if let Some(first) = names.first() {
        describe_shows_events(
            api.clone(),
            &running.layout.file("kubeconfig"),
            first,
            options.require_kubectl,
        )
        .await?;
    }
    let ca = pki_ca(&running.layout.file("ca.pem"))?;
    let password = smoke(discovery, target, &ca).await?;
    smoke_pool(discovery, target, &ca).await?;
    // The operator minted, probed with and handed out that password: none of it may be logged.
    let log = std::fs::read_to_string(running.layout.file("operator.log"))?;
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
        if required || std::env::var_os("EGRESS_REAL_BACKENDS_REQUIRED").is_some() {
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

/// How many of the operator log's last lines a failure shows.
const LOG_TAIL_LINES: usize = 40;

/// The operator stopped under the run: the error carries its log's last lines, as CI keeps only
/// what the run printed (the log holds no secret: the smoke run checks it).
fn operator_exited(status: std::process::ExitStatus, layout: &Layout) -> anyhow::Error {
    let path = layout.file("operator.log");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..]
        .iter()
        .map(|l| format!("\n  | {}", l.chars().take(400).collect::<String>()))
        .collect::<String>();
    anyhow::anyhow!(
        "the operator exited: {status}; the last lines of its log ({}):{tail}",
        path.display()
    )
}

/// Waits until every named Proxy is Ready, printing phase changes.
async fn wait_ready(api: &Api<Proxy>, names: &[String], running: &mut Running<'_>) -> Result<()> {
    let started = Instant::now();
    let mut last = BTreeMap::new();
    loop {
        if let Some(operator) = running.operator.as_mut()
            && let Some(status) = operator.0.try_wait()?
        {
            return Err(operator_exited(status, running.layout));
        }
        let mut ready = 0;
        for p in api.list(&ListParams::default()).await?.items {
            let name = p.metadata.name.clone().unwrap_or_default();
            if !names.contains(&name) {
                // A pool's member: wait_pools follows its pool.
                continue;
            }
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_ref())
                .map_or_else(|| "-".to_owned(), |ph| format!("{ph:?}"));
            if phase == "Ready" {
                ready += 1;
            }
            if last.get(&name) != Some(&phase) {
                println!("dev:   {name}: {phase}");
                last.insert(name, phase);
            }
        }
        if ready == names.len() {
            println!("dev: all {ready} Proxies are Ready after {:.1?}", started.elapsed());
            return Ok(());
        }
        if started.elapsed() > READY_BUDGET {
            bail!(
                "only {ready} of {} Proxies Ready after {READY_BUDGET:?}; see {}",
                names.len(),
                running.layout.file("operator.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until each pool of `names` has all its members leasable and its standbys Ready.
async fn wait_pools(api: &Api<ProxyPool>, names: &[String], running: &mut Running<'_>) -> Result<()> {
    let started = Instant::now();
    for name in names {
        loop {
            if let Some(operator) = running.operator.as_mut()
                && let Some(status) = operator.0.try_wait()?
            {
                return Err(operator_exited(status, running.layout));
            }
            let pool = api.get(name).await?;
            let status = pool.status.clone().unwrap_or_default();
            if status.available_replicas == pool.spec.replicas && status.standby_ready == pool.spec.standby {
                println!(
                    "dev: pool {name}: {} members leasable, {} standby Ready after {:.1?}",
                    status.available_replicas,
                    status.standby_ready,
                    started.elapsed()
                );
                break;
            }
            if started.elapsed() > READY_BUDGET {
                bail!(
                    "pool {name} has {} of {} members leasable after {READY_BUDGET:?}; see {}",
                    status.available_replicas,
                    pool.spec.replicas,
                    running.layout.file("operator.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
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
    let anonymous = Client::new(discovery.url, None).map_err(|e| anyhow::anyhow!("{e}"))?;
    match anonymous.list(&Default::default()).await {
        Err(egress_discovery::client::ClientError::Unauthorized(_)) => {
            println!("dev: smoke: without the token the discovery API answers 401");
        }
        other => bail!("the discovery API served a request without the token: {other:?}"),
    }
    let client = Client::new(discovery.url, Some(discovery.token.to_owned())).map_err(|e| anyhow::anyhow!("{e}"))?;
    let lease = client
        .acquire(&AcquireRequest {
            selector: BTreeMap::from([("geo".to_owned(), "eu".to_owned())]),
            ttl_seconds: Some(60),
            target: None,
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
    let http = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(&proxy_url)?)
        .tls_certs_only([ca.clone()])
        .timeout(Duration::from_secs(10))
        .build()?;
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
        .clone()
        .context("the lease carries a URL with credentials but no password")
}

/// The smoke check of the pool: a lease that names the pool lands on one of its members, whose
/// proxy carries a request with the lease's credentials.
async fn smoke_pool(discovery: &Discovery<'_>, target: std::net::SocketAddr, ca: &reqwest::Certificate) -> Result<()> {
    let client = Client::new(discovery.url, Some(discovery.token.to_owned())).map_err(|e| anyhow::anyhow!("{e}"))?;
    let lease = client
        .acquire(&AcquireRequest {
            selector: BTreeMap::from([("pool".to_owned(), "local-pool".to_owned())]),
            ttl_seconds: Some(60),
            target: None,
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
    let http = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(&proxy_url)?)
        .tls_certs_only([ca.clone()])
        .timeout(Duration::from_secs(10))
        .build()?;
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

fn pki_ca(path: &Path) -> Result<reqwest::Certificate> {
    Ok(reqwest::Certificate::from_pem(&std::fs::read(path)?)?)
}

/// What the target answers on every path but the probe's.
const TARGET_GREETING: &str = "hello from the egress dev target";

/// A CA and a certificate for 127.0.0.1 and localhost signed by it, made at start.
pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    pub(crate) server: Arc<rustls::ServerConfig>,
}

impl Pki {
    fn new() -> Result<Self> {
        Self::for_names(&["localhost", "127.0.0.1"])
    }

    /// A CA and a certificate for `names` (DNS names or addresses).
    pub(crate) fn for_names(names: &[&str]) -> Result<Self> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "egress dev CA");
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let leaf_key = rcgen::KeyPair::generate()?;
        let leaf = rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?
            .signed_by(&leaf_key, &issuer)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )?;
        let b64 = data_encoding::BASE64.encode(ca.der());
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .filter_map(|c| std::str::from_utf8(c).ok())
            .collect();
        Ok(Self {
            ca_pem: format!(
                "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                lines.join("\n")
            ),
            server: Arc::new(server),
        })
    }
}

/// An HTTPS target on 127.0.0.1: `204` on `/generate_204` (the health probe), a greeting
/// elsewhere. Minimal HTTP/1.1: one request per connection.
async fn tls_target(config: Arc<rustls::ServerConfig>) -> Result<std::net::SocketAddr> {
    tls_target_at(config, "127.0.0.1").await
}

/// As [`tls_target`], listening on address `ip`.
pub(crate) async fn tls_target_at(config: Arc<rustls::ServerConfig>, ip: &str) -> Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
    let addr = listener.local_addr()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let answer = async {
                    let mut tls = acceptor.accept(tcp).await.ok()?;
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                        let n = tls.read(&mut buf).await.ok()?;
                        if n == 0 {
                            return None;
                        }
                        head.extend_from_slice(&buf[..n]);
                    }
                    let probe = head.starts_with(b"GET /generate_204 ");
                    let response = if probe {
                        "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_owned()
                    } else {
                        let body = format!("{TARGET_GREETING}\n");
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    tls.write_all(response.as_bytes()).await.ok()?;
                    tls.shutdown().await.ok()
                };
                // NB: bounded, so a client that never finishes its request does not hold a task.
                let _ = tokio::time::timeout(Duration::from_secs(30), answer).await;
            });
        }
    });
    Ok(addr)
}

/// tinyproxy processes started with a config under `state`.
fn tinyproxies_under(state: &Path) -> Vec<u32> {
    let needle = format!("{}/", state.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0)
                    .any(|a| String::from_utf8_lossy(a).starts_with(&needle))
            })
        })
        .collect()
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
