//! `cargo xtask conformance --provider gcp --real`: the conformance suite against a real project
//! named by the environment (see `egress_provider_gcp::suite_run`), with a janitor pass before
//! the suite (what a killed earlier run left) and after it (whatever the suite's outcome).
//!
//! [`check_against_fake`] is how CI proves this path without Google: the same command against
//! the fake Compute server run as a process of its own (`examples/fake_compute.rs`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use egress_provider_gcp::suite_run::{self, RunSettings};

use crate::cargo_bin;

const PACKAGE: &str = "egress-provider-gcp";
const TEST: &str = "conformance_real";

/// Runs the suite against the project `extra` and this process's environment name (`extra`
/// first); the janitor runs before and after it.
///
/// # Errors
/// Missing credentials or settings (before anything is built), a failed janitor pass, or a
/// failed suite.
pub(crate) fn run(root: &Path, extra: &[(String, String)]) -> Result<()> {
    let lookup = |name: &str| {
        extra
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
    };
    let settings = RunSettings::from_vars(lookup, Path::is_file, suite_run::metadata_resolves)
        .map_err(|e| anyhow::anyhow!("the gcp conformance run cannot start: {e}"))?;
    // The tests run in the crate's directory: a key file named relative to here must still be
    // found there.
    let mut extra = extra.to_vec();
    if let egress_provider_gcp::CredentialSource::KeyFile(path) = &settings.credentials
        && path.is_relative()
    {
        let absolute = std::env::current_dir().context("the working directory")?.join(path);
        extra.retain(|(k, _)| k != "GOOGLE_APPLICATION_CREDENTIALS");
        extra.push((
            "GOOGLE_APPLICATION_CREDENTIALS".to_owned(),
            absolute.display().to_string(),
        ));
    }
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let run = format!("{}{secs}", suite_run::RUN_PREFIX);
    println!(
        "xtask: gcp conformance in project {} (zones {}), instances labelled proxy-operator-installation={run}",
        settings.project,
        settings.zones.join(",")
    );
    let cargo_test = |args: &[&str]| {
        let mut cmd = Command::new(cargo_bin());
        cmd.current_dir(root)
            .args(["test", "-p", PACKAGE, "--test", TEST, "--"])
            .args(args)
            .envs(extra.iter().map(|(k, v)| (k, v)))
            .env(suite_run::RUN_VAR, &run)
            .env(egress_testkit::real::REQUIRED_ENV, "1");
        cmd
    };
    // Before: every run's instances (what a killed run left); after: this run's only.
    let janitor = |when: &str, sweep: &str| -> Result<()> {
        println!("xtask: janitor, {when} the suite ({}={sweep})", suite_run::SWEEP_VAR);
        let mut cmd = cargo_test(&["--ignored", "--exact", "janitor", "--nocapture"]);
        cmd.env(suite_run::SWEEP_VAR, sweep);
        let status = cmd.status().context("running cargo test")?;
        ensure!(status.success(), "the janitor pass {when} the suite failed ({status})");
        Ok(())
    };
    janitor("before", "all")?;
    // A few cases at a time: each one boots a VM in the project.
    let suite = cargo_test(&["--nocapture", "--test-threads=4"])
        .status()
        .context("running cargo test");
    let after = janitor("after", "run");
    let suite = suite?;
    if !suite.success() {
        if let Err(e) = &after {
            eprintln!("xtask: {e:#}");
        }
        bail!("the gcp conformance suite failed ({suite})");
    }
    after
}

/// Step 1 of [`check_against_fake`]: run as a user runs it, with no credentials, the command
/// is refused, naming what is missing.
fn refused_without_credentials(root: &Path, scratch: &Path) -> Result<()> {
    // 1. No credentials: a fresh HOME, no key file, no metadata host. Run as a user runs it,
    // through cargo (this very binary may have been rebuilt by the tests since it started);
    // cargo and rustup keep their own homes.
    let home = std::env::var("HOME").unwrap_or_default();
    let keep = |var: &str, under_home: &str| std::env::var(var).unwrap_or_else(|_| format!("{home}/{under_home}"));
    let mut bare = Command::new(cargo_bin());
    bare.current_dir(root)
        .args([
            "run",
            "-q",
            "-p",
            "xtask",
            "--",
            "conformance",
            "--provider",
            "gcp",
            "--real",
        ])
        .env("CARGO_HOME", keep("CARGO_HOME", ".cargo"))
        .env("RUSTUP_HOME", keep("RUSTUP_HOME", ".rustup"))
        .env("HOME", scratch)
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env_remove("GCE_METADATA_HOST")
        .env_remove(suite_run::PROJECT_VAR)
        .env_remove(suite_run::ZONES_VAR);
    let out = bare.output().context("running xtask without credentials")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "without credentials the command succeeded: {stderr}"
    );
    // On Google Cloud the metadata server is a credential: then the project is what is missing.
    let expected = if suite_run::metadata_resolves(egress_provider_gcp::auth::METADATA_HOST) {
        suite_run::PROJECT_VAR
    } else {
        suite_run::NO_CREDENTIALS
    };
    ensure!(
        stderr.contains(expected),
        "without credentials the command did not say {expected:?}: {stderr}"
    );
    println!("xtask: without credentials: refused, as it should be");
    Ok(())
}

/// What CI checks of the command: without credentials it stops at once with the message; with
/// the fake Compute server as the project it runs the suite, and the janitor leaves none of the
/// runs' instances (an earlier "killed" run's included) and every other instance.
///
/// # Errors
/// Any of those does not hold.
pub(crate) fn check_against_fake(root: &Path) -> Result<()> {
    let scratch = egress_testkit::ScratchDir::new("xtask-gcp-real");
    refused_without_credentials(root, scratch.path())?;

    // 2. The fake as the project, with instances an earlier run and another installation left.
    let fake = Command::new(cargo_bin())
        .current_dir(root)
        .args(["run", "-q", "-p", PACKAGE, "--example", "fake_compute", "--"])
        .arg(scratch.path())
        .arg("--leftovers")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the fake Compute server")?;
    let mut fake = Fake::new(fake)?;
    // Building the example may come first.
    let line = fake.line(Duration::from_secs(900)).context("the fake's first line")?;
    let ready: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("the fake said {line:?}"))?;
    let text = |key: &str| {
        ready[key]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("no {key} in {line}"))
    };
    // Every setting pinned, so a developer's own (a real project's image, say) cannot leak in.
    let env = vec![
        ("GOOGLE_APPLICATION_CREDENTIALS".to_owned(), text("key_file")?),
        (suite_run::PROJECT_VAR.to_owned(), text("project")?),
        (suite_run::ZONES_VAR.to_owned(), text("zones")?),
        (suite_run::API_URL_VAR.to_owned(), text("api_url")?),
        (suite_run::IMAGE_VAR.to_owned(), suite_run::DEFAULT_IMAGE.to_owned()),
        (
            suite_run::MACHINE_TYPE_VAR.to_owned(),
            suite_run::DEFAULT_MACHINE_TYPE.to_owned(),
        ),
        (suite_run::NETWORK_VAR.to_owned(), "default".to_owned()),
        (suite_run::SUBNETWORK_VAR.to_owned(), String::new()),
    ];
    let outcome = run(root, &env);
    // Closing its stdin makes the fake print what it still holds and exit.
    drop(fake.child.stdin.take());
    let rest = fake.line(Duration::from_secs(60)).context("the fake's inventory");
    outcome?;
    let rest = rest?;
    let held: Vec<serde_json::Value> =
        serde_json::from_str(rest.trim()).with_context(|| format!("the fake's inventory {rest:?}"))?;
    let installations: Vec<&str> = held.iter().filter_map(|i| i["installation"].as_str()).collect();
    let left: Vec<&&str> = installations.iter().filter(|i| suite_run::is_run_label(i)).collect();
    ensure!(
        left.is_empty(),
        "instances of conformance runs were left behind: {left:?}"
    );
    ensure!(
        installations.contains(&"prod"),
        "the janitor deleted an instance of another installation: {held:?}"
    );
    println!("xtask: gcp --real against the fake: suite passed, nothing of any run left behind");
    Ok(())
}

/// The fake's process: its stdout read on a thread (so nothing it prints can block it), and
/// killed when dropped.
struct Fake {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Fake {
    fn new(mut child: Child) -> Result<Self> {
        let stdout = child.stdout.take().context("the fake's stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, lines })
    }

    /// The next line the fake prints, waiting at most `patience`.
    fn line(&mut self, patience: Duration) -> Result<String> {
        self.lines
            .recv_timeout(patience)
            .map_err(|e| anyhow::anyhow!("nothing from the fake within {patience:?} ({e})"))
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
