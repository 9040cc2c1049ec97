//! Project automation. `cargo xtask <command>`:
//!
//! - `test [--repeat N] [-p PKG]... [--test NAME]... [-- FILTER...]`: the README's test
//!   command. As root, installs the system packages the workspace needs (apt) and starts the
//!   services the tests use; then runs `cargo test --workspace --no-fail-fast` (so one failure
//!   shows all the others), streaming cargo's own output, `dev --smoke` and
//!   `conformance --provider gcp --real` against the fake Compute server, and the Python
//!   package's ruff, mypy and pytest (`python`); closes with one line `N passed, M failed`
//!   summed over every test binary (the smoke and gcp runs count as one test each, ruff and
//!   mypy as one, pytest's tests one each) and exits with cargo's status, else 1 when one of
//!   those steps failed. `--repeat N` runs the chosen tests N times in a row, to hunt flakes;
//!   `-p`, `--test` and a filter choose them (and leave the later steps out).
//! - `dev [--smoke] [--release] [--discovery-port N] [--stack-file F]`: the README's run
//!   command: the operator against a local Kubernetes test server, with three
//!   sample Proxies as tinyproxy processes, the gateway, and a guide to try it;
//!   Ctrl-C tears everything down. `--smoke` leases a proxy, sends a request
//!   through it, runs the guide's gateway lines and tears down, without waiting
//!   for a person. `--stack-file` serves the same system to tests (the Python
//!   package's fixture) from the programs already built, under `target/egress-stack`.
//! - `conformance --provider P [--real]`: one provider's conformance suite,
//!   against its fake backend or (`--real`) the real one, which must then be
//!   there. For gcp, `--real` takes a project from the environment, checks the credentials
//!   before anything else, and runs a janitor before and after the suite (`gcp_real`).
//! - `ci`: what CI checks: `cargo fmt --check`, clippy with warnings denied,
//!   then `test`.
//! - `deny`: `cargo deny check licenses bans sources` (advisories need the
//!   network, which these machines do not have).
//! - `python`: the Python package's checks alone, as `test` runs them.
//! - `packages`: installs the Debian packages the build and the tests need
//!   (the libvirt C bindings need libvirt-dev before anything compiles).
//! - `crds [--check]`: writes `deploy/crds/*.yaml` from the `egress-api` types;
//!   `--check` fails when the files are stale (CI runs it).
//! - `licenses [--check]`: writes `deploy/licenses/rust-crates.tsv`, the Rust crates the image
//!   ships with their licences, from Cargo.lock; `--check` fails when it is stale (CI runs it).
//! - `image [--debug] [--tag T]`: the operator's image built with podman from
//!   `deploy/Dockerfile` without any registry (the Debian base made with mmdebstrap when
//!   absent), saved as `target/image/egress-proxies-operator.oci.tar`; prints its size and
//!   the packages its runtime layer adds.
//!
//! - `bench [--proxies N] [--debug] [--only NAME]`: tables of figures: the health engine at
//!   1 000 and 10 000 proxies, the discovery API under 64 clients and the lease stores, the
//!   operator's resident memory and time to Ready with N Proxies (default 10 000) and its lease
//!   API, kvm2 on the local hypervisor, a ProxyPool's failover and rotation, the gateway against
//!   tinyproxy alone. The health, operator, kvm2, pool and gateway benches print a line of their
//!   conditions and one Markdown table, as their guides show them.
//!
//! - `hypervisor up|down|status`: a real libvirtd with QEMU, reached over a
//!   real sshd on 127.0.0.1, a storage pool, a NAT network and the test
//!   guest image; `up` writes the env file the libvirt tests read.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod crds;
mod dev;
mod gcp_real;
mod hypervisor;
mod image;
mod licenses;
mod map;
mod procs;
mod python;
mod system;
mod tally;
mod test_server;
mod unused;

#[derive(Parser)]
#[command(about = "Automation for the egress-proxy operator workspace")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the tests need (as root), then run every test of the workspace.
    Test {
        /// Run the chosen tests this many times in a row (a flake hunt); every run is reported.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        repeat: u32,
        /// Only this package's tests (repeatable); the dev smoke run is then left out.
        #[arg(long = "package", short = 'p')]
        packages: Vec<String>,
        /// Only this integration test binary (repeatable); the dev smoke run is then left out.
        #[arg(long = "test")]
        tests: Vec<String>,
        /// Extra arguments passed to the test binaries after `--` (e.g. a test name filter).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The operator on this machine, with three sample proxies as tinyproxy processes.
    Dev {
        /// Lease a proxy, send a request through it, tear down and exit (0 when all of it worked).
        #[arg(long)]
        smoke: bool,
        /// Run release builds.
        #[arg(long)]
        release: bool,
        /// The discovery API's port on 127.0.0.1 (0: any free one; the default with --smoke).
        #[arg(long)]
        discovery_port: Option<u16>,
        /// For tests (the Python package's fixture): run the programs already built beside
        /// xtask, write where everything is to this JSON file once Ready, and serve until
        /// SIGINT or SIGTERM.
        #[arg(long, conflicts_with_all = ["smoke", "release"])]
        stack_file: Option<PathBuf>,
    },
    /// One provider's conformance suite (providers: reference, local, kubernetes, gcp, kvm, kvm2).
    Conformance {
        /// The provider type.
        #[arg(long)]
        provider: String,
        /// Against the real backend, which must be configured (a skip becomes a failure).
        #[arg(long)]
        real: bool,
    },
    /// A real libvirt hypervisor on this machine, reached over SSH (up and down need root).
    Hypervisor {
        #[command(subcommand)]
        action: HypervisorAction,
    },
    /// Install the Debian packages the build and the tests need (as root; otherwise list them).
    Packages,
    /// The Python package's checks alone (as `test` runs them last), against the programs
    /// already built.
    Python,
    /// Formatting check, clippy with warnings denied, then `test`.
    Ci,
    /// License, ban and source checks with cargo-deny.
    Deny,
    /// Write deploy/crds/*.yaml from the Rust types (`--check`: fail if they are stale).
    Crds {
        #[arg(long)]
        check: bool,
    },
    /// Write the dependency table of docs/architecture.md from the manifests (`--check`: fail
    /// if it differs).
    Map {
        #[arg(long)]
        check: bool,
    },
    /// Fail on a dependency a manifest declares and its crate does not use (cargo-machete at a
    /// pinned version, installed when missing).
    Unused,
    /// Write deploy/licenses/rust-crates.tsv from Cargo.lock (`--check`: fail if it is stale).
    Licenses {
        #[arg(long)]
        check: bool,
    },
    /// Build the image with podman, without any registry, and save it as an OCI archive under
    /// target/image.
    Image {
        /// From the debug binaries `cargo build --workspace` made, instead of a release build.
        #[arg(long)]
        debug: bool,
        /// The image's tag.
        #[arg(long, default_value = "dev")]
        tag: String,
    },
    /// The benchmarks (a release build by default): the health engine, the discovery API, the
    /// lease stores, the operator's memory and time to Ready with many Proxies, kvm2 on the local
    /// hypervisor, a ProxyPool's failover and rotation.
    Bench {
        #[arg(long, default_value_t = 10_000)]
        proxies: usize,
        /// Measure a debug build (faster to build, not representative of the image).
        #[arg(long)]
        debug: bool,
        /// Run only these benches (health, discovery, lease-store, operator, kvm2, pool,
        /// gateway); all by default.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
}

#[derive(Subcommand)]
enum HypervisorAction {
    /// Install, start and check everything (idempotent); writes /tmp/egress-hv/env.
    Up,
    /// Stop and remove what `up` started or created (packages and caches stay).
    Down,
    /// Show what is running.
    Status,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<TestsFailed>().is_some() => {
            // Already reported before the closing count line, which stays the last line.
            let code = e.downcast_ref::<TestsFailed>().map_or(1, |t| t.0);
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let root = workspace_root();
    match cli.command {
        Cmd::Test {
            repeat,
            packages,
            tests,
            args,
        } => test(
            &root,
            &TestSelection {
                repeat,
                packages,
                tests,
                filter: args,
            },
        ),
        Cmd::Dev {
            smoke,
            release,
            discovery_port,
            stack_file,
        } => dev::run(
            &root,
            &dev::Options {
                smoke,
                release,
                discovery_port: discovery_port.unwrap_or(if smoke || stack_file.is_some() { 0 } else { 8090 }),
                require_kubectl: false,
                stack_file,
            },
        ),
        Cmd::Conformance { provider, real } => conformance(&root, &provider, real),
        Cmd::Hypervisor { action } => match action {
            HypervisorAction::Up => hypervisor::up(&root),
            HypervisorAction::Down => hypervisor::down(),
            HypervisorAction::Status => hypervisor::status(),
        },
        Cmd::Crds { check } => crds::run(&root, check),
        Cmd::Map { check } => map::run(&root, check),
        Cmd::Unused => unused::run(&root),
        Cmd::Licenses { check } => licenses::run(&root, check),
        Cmd::Image { debug, tag } => {
            let built = image::build(&root, !debug, &tag)?;
            image::describe(&root, &built)
        }
        Cmd::Bench { proxies, debug, only } => bench::run(&root, proxies, !debug, &only),
        Cmd::Packages => system::ensure_packages(system::APT_PACKAGES),
        Cmd::Python => {
            let (counts, problem) = python::check(&root)?;
            println!("xtask: {}", counts.line());
            problem.map_or(Ok(()), |p| Err(anyhow::anyhow!(p)))
        }
        Cmd::Ci => {
            system::ensure_packages(system::APT_PACKAGES)?;
            cargo(&root, &["fmt", "--all", "--check"])?;
            crds::run(&root, true)?;
            licenses::run(&root, true)?;
            map::run(&root, true)?;
            unused::run(&root)?;
            cargo(&root, &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
            test(&root, &TestSelection::everything())
        }
        Cmd::Deny => cargo(&root, &["deny", "check", "licenses", "bans", "sources"]).context(
            "cargo-deny is needed: cargo install cargo-deny --locked (advisories are not checked: they need the network)",
        ),
    }
}

/// What `cargo xtask test` runs.
struct TestSelection {
    repeat: u32,
    packages: Vec<String>,
    tests: Vec<String>,
    filter: Vec<String>,
}

impl TestSelection {
    fn everything() -> Self {
        Self {
            repeat: 1,
            packages: Vec::new(),
            tests: Vec::new(),
            filter: Vec::new(),
        }
    }

    /// The whole suite: every test binary of the workspace and no filter, so the dev smoke run
    /// belongs to it.
    fn is_whole_suite(&self) -> bool {
        self.packages.is_empty() && self.tests.is_empty() && self.filter.is_empty()
    }

    fn cargo_args(&self) -> Vec<String> {
        let mut args = vec!["test".to_owned(), "--no-fail-fast".to_owned()];
        if self.packages.is_empty() {
            args.push("--workspace".to_owned());
        }
        for p in &self.packages {
            args.extend(["-p".to_owned(), p.clone()]);
        }
        for t in &self.tests {
            args.extend(["--test".to_owned(), t.clone()]);
        }
        if !self.filter.is_empty() {
            args.push("--".to_owned());
            args.extend(self.filter.iter().cloned());
        }
        args
    }
}

/// The README's test command.
fn test(root: &Path, selection: &TestSelection) -> Result<()> {
    system::ensure_packages(system::APT_PACKAGES)?;
    // As root, the real hypervisor the libvirt tests use comes up for this run and goes down
    // after it; one that is up and running is left as it was. One left half-up by a killed run
    // (its env file still there, its daemons gone) is brought up again: `up` is idempotent.
    let bring_up = system::is_root() && !hypervisor::is_up();
    if bring_up {
        hypervisor::up(root)?;
    }
    let outcome = test_with_services(root, selection);
    let down = if bring_up { hypervisor::down() } else { Ok(()) };
    let (total, failure) = outcome?;
    if let Err(e) = &down {
        eprintln!("xtask: stopping the hypervisor failed: {e:#}");
    }
    if let Some(failure) = &failure {
        eprintln!("xtask: {failure}");
    }
    // The closing line, summed over every test binary (and every run): the last thing printed.
    println!("{}", total.line());
    match failure {
        Some(f) => Err(TestsFailed(f.exit_code()).into()),
        None => down,
    }
}

/// Why a test run failed, reported just before the closing line.
enum Failure {
    /// `cargo test` exited with this status.
    Cargo(i32),
    /// The dev smoke run failed.
    Smoke(anyhow::Error),
    /// `conformance --provider gcp --real` against the fake failed.
    GcpReal(anyhow::Error),
    /// The Python package's checks failed.
    Python(String),
    /// The image for the shipped-install test could not be built.
    Image(anyhow::Error),
}

impl Failure {
    fn exit_code(&self) -> i32 {
        match self {
            Self::Cargo(code) => *code,
            Self::Smoke(_) | Self::GcpReal(_) | Self::Python(_) | Self::Image(_) => 1,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cargo(code) => write!(f, "cargo test failed (exit status {code})"),
            Self::Smoke(e) => write!(f, "the dev smoke run failed: {e:#}"),
            Self::GcpReal(e) => write!(f, "conformance --provider gcp --real against the fake failed: {e:#}"),
            Self::Python(e) => write!(f, "the Python package's checks failed: {e}"),
            Self::Image(e) => write!(f, "building the image for the shipped-install test failed: {e:#}"),
        }
    }
}

/// Runs the selection with the services it needs; returns the counts and the first failure.
fn test_with_services(root: &Path, selection: &TestSelection) -> Result<(tally::Counts, Option<Failure>)> {
    // The shared lease store's tests run against a real redis-server of this run's own (its
    // file never synced: nothing is crashed here)...
    let redis = egress_testkit::redis::LocalRedis::start_with_appendfsync("no")
        .map_err(anyhow::Error::msg)
        .context("starting a redis-server for the lease store tests")?;
    println!("xtask: redis-server on {}", redis.url());
    // ... and against a Redis Cluster of three masters.
    let redis_cluster = egress_testkit::redis::LocalCluster::steady(3)
        .map_err(anyhow::Error::msg)
        .context("starting a Redis Cluster for the lease store tests")?;
    println!("xtask: Redis Cluster of three masters at {}", redis_cluster.url());
    let mut total = tally::Counts::default();
    let mut failure = None;
    for run in 1..=selection.repeat {
        if selection.repeat > 1 {
            println!("xtask: run {run} of {}", selection.repeat);
        }
        let mut cmd = Command::new(cargo_bin());
        cmd.args(selection.cargo_args())
            .current_dir(root)
            // Under this command a test that needs a real backend or component (a configured
            // conformance backend, tinyproxy, redis-server, ...) fails instead of skipping: CI
            // must run them.
            .env(egress_testkit::real::REQUIRED_ENV, "1")
            .env("EGRESS_TEST_REDIS_URL", redis.url())
            .env("EGRESS_TEST_REDIS_CLUSTER_URL", redis_cluster.url());
        let (status, counts) = tally::run_counting(&mut cmd).context("running cargo test")?;
        if selection.repeat > 1 {
            println!("xtask: run {run} of {}: {}", selection.repeat, counts.line());
        }
        total.add(&counts);
        if !status.success() && failure.is_none() {
            failure = Some(Failure::Cargo(status.code().unwrap_or(1)));
        }
    }
    drop(redis);
    drop(redis_cluster);
    if selection.is_whole_suite() {
        whole_suite_steps(root, &mut total, &mut failure);
    }
    Ok((total, failure))
}

/// The steps only the whole suite runs, after cargo's tests: the dev smoke run, the gcp --real
/// path against the fake, the Python package, and last the shipped install from the image.
fn whole_suite_steps(root: &Path, total: &mut tally::Counts, failure: &mut Option<Failure>) {
    println!("xtask: cargo xtask dev --smoke");
    let smoke = dev::run(
        root,
        &dev::Options {
            smoke: true,
            release: false,
            discovery_port: 0,
            // As for the tests: a missing kubectl fails the describe check.
            require_kubectl: true,
            stack_file: None,
        },
    );
    // The smoke run counts as one test of the suite, and so does the gcp --real path.
    count(total, failure, smoke.map_err(Failure::Smoke));
    println!("xtask: cargo xtask conformance --provider gcp --real, against the fake Compute server");
    count(
        total,
        failure,
        gcp_real::check_against_fake(root).map_err(Failure::GcpReal),
    );
    println!("xtask: the Python package (clients/python): ruff, mypy, pytest");
    match python::check(root) {
        Ok((counts, problem)) => {
            total.add(&counts);
            if let Some(problem) = problem
                && failure.is_none()
            {
                *failure = Some(Failure::Python(problem));
            }
        }
        Err(e) => count(total, failure, Err(Failure::Python(format!("{e:#}")))),
    }
    // Last and alone: its Pod binds the manager's ports on the host's network.
    println!("xtask: the shipped install, run from the image with podman");
    match image::test_shipped_install(root) {
        Ok((status, counts)) => {
            total.add(&counts);
            if !status.success() && failure.is_none() {
                *failure = Some(Failure::Cargo(status.code().unwrap_or(1)));
            }
        }
        Err(e) => count(total, failure, Err(Failure::Image(e))),
    }
}

/// Counts one whole-run step as a test; keeps the first failure and reports later ones.
fn count(total: &mut tally::Counts, failure: &mut Option<Failure>, outcome: std::result::Result<(), Failure>) {
    match outcome {
        Ok(()) => total.passed += 1,
        Err(f) => {
            total.failed += 1;
            if failure.is_none() {
                *failure = Some(f);
            } else {
                eprintln!("xtask: {f} too");
            }
        }
    }
}

/// The test command failed with this exit code, and has said why.
#[derive(Debug)]
struct TestsFailed(i32);

impl std::fmt::Display for TestsFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the tests failed (exit status {})", self.0)
    }
}

impl std::error::Error for TestsFailed {}

/// Runs one provider's conformance suite; with `real`, against the real backend, where a
/// missing backend fails instead of skipping.
fn conformance(root: &Path, provider: &str, real: bool) -> Result<()> {
    if real && provider == "gcp" {
        // Checks settings and credentials first, and runs the janitor around the suite.
        return gcp_real::run(root, &[]);
    }
    let (package, fake, real_test) = match provider {
        "reference" => ("egress-conformance", "reference", None),
        "local" => ("egress-provider-local", "conformance", Some("conformance_real")),
        "kubernetes" => ("egress-provider-kubernetes", "conformance", None),
        "gcp" => ("egress-provider-gcp", "conformance", Some("conformance_real")),
        "kvm" => ("egress-provider-kvm", "conformance", Some("conformance_real")),
        "kvm2" => ("egress-provider-kvm2", "conformance", Some("conformance_real")),
        other => {
            bail!("no conformance suite for provider {other:?} (known: reference, local, kubernetes, gcp, kvm, kvm2)")
        }
    };
    let test = if real {
        real_test.with_context(|| format!("provider {provider} has no real backend"))?
    } else {
        fake
    };
    // Only the kvm crates build the libvirt C bindings; only the real local suite runs tinyproxy.
    let mut packages = Vec::new();
    if matches!(provider, "kvm" | "kvm2") {
        packages.extend_from_slice(system::BUILD_PACKAGES);
    }
    if real && provider == "local" {
        packages.push("tinyproxy");
    }
    system::require_packages(&packages)?;
    if real && matches!(provider, "kvm" | "kvm2") {
        // The same rule as egress_libvirt::HypervisorEnv::file.
        let env = std::env::var_os("EGRESS_HV_ENV").map_or_else(|| PathBuf::from(hypervisor::ENV_FILE), PathBuf::from);
        if !env.exists() {
            bail!(
                "no hypervisor settings at {}: run `cargo xtask hypervisor up` for the local one, or point \
                 EGRESS_HV_ENV at a file describing your own (see docs/providers/kvm2.md)",
                env.display()
            );
        }
    }
    let mut cmd = Command::new(cargo_bin());
    cmd.current_dir(root)
        .args(["test", "-p", package, "--test", test, "--", "--nocapture"]);
    if real {
        cmd.env(egress_testkit::real::REQUIRED_ENV, "1");
    }
    let status = cmd.status().context("running cargo test")?;
    if !status.success() {
        bail!("the {provider} conformance suite failed ({status})");
    }
    Ok(())
}

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    println!("xtask: cargo {}", args.join(" "));
    let status = Command::new(cargo_bin())
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

pub(crate) fn cargo_bin() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// Cargo's target directory for the workspace at `root` (`CARGO_TARGET_DIR` when set).
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

fn workspace_root() -> PathBuf {
    // xtask lives one directory below the workspace root.
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}
