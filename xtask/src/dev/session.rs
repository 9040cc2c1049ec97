//! One run's session: the target, the test server and the operator started, the system used
//! (by a person, or by the smoke check), and always torn down, in order, even on Ctrl-C.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use egress_api::{Proxy, ProxyPool};
use kube::api::Api;

use super::layout::{Discovery, ENTRY, Layout, NAMESPACE, discovery_token};
use super::running::Running;
use super::smoke::TARGET_GREETING;
use super::{gateway, guide, samples, smoke};
use crate::procs::Killed;
use crate::test_server;

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
    /// Serve the system to tests: once it is Ready, write where everything is to this file
    /// (JSON, [`StackFile`]) and wait for SIGINT or SIGTERM to tear down. No guide is printed.
    pub(crate) stack_file: Option<PathBuf>,
}

/// Starts the test server from `bin` in a process group of its own, and waits for its
/// kubeconfig.
fn start_test_server(root: &Path, bin: &Path, layout: &Layout) -> Result<Killed> {
    let kubeconfig = layout.file("kubeconfig");
    let mut server = Killed(
        test_server::command(root, bin, NAMESPACE, &kubeconfig, &layout.file("testserver.log"))?
            .process_group(0)
            .spawn()
            .context("starting egress-kube-testserver")?,
    );
    layout.remember_pid(server.0.id())?;
    test_server::wait_for_kubeconfig(&kubeconfig, &mut server.0)?;
    Ok(server)
}

/// The providers file: the local entry, its state in the run's directory, allowed to connect
/// to the target's port, the echo's and 443.
fn providers_yaml(state: &Path, target_port: u16, echo_port: u16) -> String {
    format!(
        "providers:\n  - name: {ENTRY}\n    type: local\n    local:\n      stateDir: {}\n      \
         # the local target, the exit check's echo, and the public one the guide's curl line names\n      \
         connectPorts: [{}, {}, 443]\n",
        state.display(),
        target_port,
        echo_port
    )
}

/// Starts the operator from `bin` in a process group of its own, with the run's files, its
/// discovery API on `discovery_port` and its health probe aimed at the target on `target_port`.
fn start_operator(
    bin: &Path,
    layout: &Layout,
    discovery_port: u16,
    (target_port, echo): (u16, &str),
) -> Result<Killed> {
    let operator = Killed(
        Command::new(bin.join("egress-operator"))
            .arg(format!(
                "--providers-config={}",
                layout.file("providers.yaml").display()
            ))
            .arg(format!("--discovery-addr=127.0.0.1:{discovery_port}"))
            .arg(format!(
                "--discovery-token-file={}",
                layout.file("discovery-token").display()
            ))
            .arg(format!(
                "--health-check-url=https://127.0.0.1:{target_port}/generate_204"
            ))
            .arg(format!("--health-check-ca-file={}", layout.file("ca.pem").display()))
            // Each proxy's exit, through it, against the run's own echo (the same CA).
            .arg(format!("--exit-check-url={echo}"))
            .arg(format!(
                "--discovery-tls-cert-file={}",
                layout.file("discovery.crt").display()
            ))
            .arg(format!(
                "--discovery-tls-key-file={}",
                layout.file("discovery.key").display()
            ))
            .args([
                "--leader-elect=false",
                "--metrics-bind-address=0",
                "--health-probe-bind-address=0",
                // An External Proxy tried here points at a tinyproxy on this machine.
                "--allowed-internal-destinations=127.0.0.0/8,localhost",
            ])
            .env("KUBECONFIG", layout.file("kubeconfig"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(layout.file("operator.log"))?)
            .process_group(0)
            .spawn()
            .context("starting egress-operator")?,
    );
    layout.remember_pid(operator.0.id())?;
    Ok(operator)
}

/// The running system: started, used, and always torn down.
pub(super) async fn session(root: &Path, bin: &Path, layout: &Layout, options: &Options) -> Result<()> {
    // From here on Ctrl-C no longer kills this process: it starts the teardown (and a second
    // one hurries it), so nothing started below is left behind.
    let mut interrupts = Stops::new()?;
    let pki = egress_testkit::pki();
    std::fs::write(layout.file("ca.pem"), &pki.ca_pem)?;
    let target = egress_testkit::tls_greeting_target(&pki, TARGET_GREETING).await?;
    let echo = egress_testkit::echo::EchoTarget::https(&pki, "127.0.0.1").await;
    let discovery_port = if options.discovery_port == 0 {
        egress_testkit::try_free_port()?
    } else {
        options.discovery_port
    };
    let discovery = format!("https://127.0.0.1:{discovery_port}");
    // The API serves TLS as installed, its certificate from the run's CA (as the target's).
    std::fs::write(layout.file("discovery.crt"), &pki.server_cert_pem)?;
    write_private(&layout.file("discovery.key"), &pki.server_key_pem)?;
    let server = start_test_server(root, bin, layout)?;
    std::fs::write(
        layout.file("providers.yaml"),
        providers_yaml(&layout.state(), target.port(), echo.addr.port()),
    )?;
    // The discovery API asks for a token, as installed: one made for this run, in a file the
    // operator follows (as it follows the Secret volume in a cluster).
    let token = discovery_token();
    std::fs::write(layout.file("discovery-token"), format!("{token}\n"))?;
    let operator = start_operator(bin, layout, discovery_port, (target.port(), &echo.url()))?;
    let mut running = Running::new(layout, server, operator);
    let ca = layout.file("ca.pem");
    let api = Discovery {
        url: &discovery,
        token: &token,
        ca: &ca,
    };
    let (started, fronts) = gateway::start(bin, layout, &api)?;
    running.with_gateway(started);
    let used = tokio::select! {
        used = use_it(&mut running, root, &api, (target, fronts), options) => used,
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

/// The signals that stop a run: Ctrl-C (SIGINT) from a person, SIGTERM from a test fixture.
struct Stops {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Stops {
    fn new() -> Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Writes `text` to `path`, readable by its owner only (a private key).
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// Serves until stopped (by a signal, in [`session`]), or fails when the operator exits.
async fn serve(running: &mut Running<'_>) -> Result<()> {
    loop {
        running.check_operator()?;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Writes the stack file for tests, a whole file or none (written beside it, then renamed):
/// the discovery API's base URL and the token of its client `default`; the gateway's HTTP front
/// (`http://127.0.0.1:PORT`) and SOCKS5 front (`127.0.0.1:PORT`); the sample Proxies and pools
/// applied, all Ready; the run's directory (its logs); and `ca`, the CA file the API's and the
/// probes' target's certificates chain to.
fn write_stack_file(
    path: &Path,
    discovery: &Discovery<'_>,
    fronts: gateway::Fronts,
    applied: &samples::Applied,
    dir: &Path,
) -> Result<()> {
    let stack = serde_json::json!({
        "discovery": discovery.url,
        "token": discovery.token,
        "gateway": format!("http://{}", fronts.http),
        "socks": fronts.socks.to_string(),
        "proxies": applied.proxies,
        "pools": applied.pools,
        "dir": dir,
        "ca": discovery.ca,
    });
    let partial = path.with_extension("partial");
    std::fs::write(&partial, serde_json::to_vec_pretty(&stack)?)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))
}

/// Applies the samples, waits for Ready, then prints the guide and waits for Ctrl-C, or (smoke)
/// leases a proxy and sends a request through it, and runs the guide's gateway lines.
async fn use_it(
    running: &mut Running<'_>,
    root: &Path,
    discovery: &Discovery<'_>,
    (target, fronts): (std::net::SocketAddr, gateway::Fronts),
    options: &Options,
) -> Result<()> {
    let kubeconfig: PathBuf = running.layout.file("kubeconfig");
    let client = test_server::client(&kubeconfig).await?;
    let api: Api<Proxy> = Api::namespaced(client.clone(), NAMESPACE);
    let pools: Api<ProxyPool> = Api::namespaced(client, NAMESPACE);
    running.api = Some(api.clone());
    running.pools = Some(pools.clone());
    let applied = samples::apply(root, &api, &pools).await?;
    println!(
        "dev: applied {} sample Proxies ({}) and the pool {}; waiting until they are Ready",
        applied.proxies.len(),
        applied.proxies.join(", "),
        applied.pools.join(", ")
    );
    samples::wait_ready(&api, &applied.proxies, running).await?;
    samples::wait_pools(&pools, &applied.pools, running).await?;
    if let Some(path) = &options.stack_file {
        write_stack_file(path, discovery, fronts, &applied, &running.layout.dir)?;
        println!("dev: serving; wrote {}; SIGINT or SIGTERM stops it", path.display());
        return serve(running).await;
    }
    let lines = gateway::curl_lines(fronts, discovery.token, &running.layout.file("ca.pem"), target);
    guide::print(running.layout, &kubeconfig, discovery, target, &applied.proxies, &lines);
    if !options.smoke {
        println!("Press Ctrl-C to stop everything.");
        std::future::pending::<()>().await;
    }
    let first = applied.proxies.first();
    let checks = smoke::Checks {
        first,
        proxies: &applied.proxies,
        require_kubectl: options.require_kubectl,
        gateway_lines: &lines,
    };
    smoke::run(running.layout, api, discovery, target, checks).await
}
