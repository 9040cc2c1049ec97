//! `egress-kube-testserver` as xtask's commands start it: a process of its own, serving the
//! CRDs of `deploy/crds` and one namespace, announcing itself with the kubeconfig it writes; and
//! a client from that kubeconfig.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::procs::Killed;

/// How long the server gets to write its kubeconfig.
const START_BUDGET: Duration = Duration::from_secs(60);

/// The command that starts the server from `bin` with the CRDs under `root`, serving
/// `namespace`, writing its kubeconfig to `kubeconfig` and its log to `log`.
pub(crate) fn command(root: &Path, bin: &Path, namespace: &str, kubeconfig: &Path, log: &Path) -> Result<Command> {
    let mut command = Command::new(bin.join("egress-kube-testserver"));
    command
        .args(["--namespace", namespace, "--crds"])
        .arg(root.join("deploy/crds"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?);
    Ok(command)
}

/// Waits until `server` has written its kubeconfig at `path`.
pub(crate) fn wait_for_kubeconfig(path: &Path, server: &mut Child) -> Result<()> {
    let deadline = Instant::now() + START_BUDGET;
    while !path.exists() {
        if let Some(status) = server.try_wait()? {
            bail!("egress-kube-testserver exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("egress-kube-testserver wrote no kubeconfig within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Starts the server from `bin` serving `namespace`, its kubeconfig and log in `dir`; returns
/// it and the kubeconfig once it is written.
pub(crate) fn start(root: &Path, bin: &Path, namespace: &str, dir: &Path) -> Result<(Killed, PathBuf)> {
    let kubeconfig = dir.join("kubeconfig");
    let mut server = Killed(
        command(root, bin, namespace, &kubeconfig, &dir.join("testserver.log"))?
            .spawn()
            .context("starting egress-kube-testserver")?,
    );
    wait_for_kubeconfig(&kubeconfig, &mut server.0)?;
    Ok((server, kubeconfig))
}

/// A client of the server that wrote `kubeconfig`.
pub(crate) async fn client(kubeconfig: &Path) -> Result<kube::Client> {
    let config =
        kube::Config::from_custom_kubeconfig(kube::config::Kubeconfig::read_from(kubeconfig)?, &Default::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}
