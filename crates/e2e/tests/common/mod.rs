//! Runs the operator as a child process against an in-process test server, and reads its log
//! lines (JSON, one per line) as they come.
#![allow(dead_code, unreachable_pub)]

pub mod trace;

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use egress_api::{ProviderHealth, Proxy};
use egress_kube_testserver::TestServer;

/// How long any one step may take before the test fails (a liveness bound, not a speed check).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The shipped binary: bins/egress-operator/src/main.rs, built by this package under another
/// name (see Cargo.toml), so every test run builds it fresh.
pub fn operator_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_egress-operator-under-test"))
}

/// The operator with the reference provider (examples/reference_operator.rs), which cargo builds
/// next to the test binaries.
pub fn reference_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = profile_dir.join("examples/reference_operator");
    assert!(path.exists(), "{} is missing: build with --all-targets", path.display());
    path
}

pub async fn test_server() -> TestServer {
    TestServer::builder()
        .custom_resource::<Proxy>()
        .custom_resource::<ProviderHealth>()
        .custom_resource::<egress_api::ProxyPool>()
        .namespace("default")
        .namespace("egress-proxies-operator-system")
        .start()
        .await
        .expect("test server")
}

/// What a run of the operator needs: a test server, a scratch directory with a kubeconfig for
/// it, and a providers file.
pub struct Cluster {
    pub server: TestServer,
    pub dir: PathBuf,
    pub kubeconfig: String,
    /// `--providers-config=<file>`.
    pub providers_flag: String,
}

/// A cluster for the test `name`, whose providers file holds `providers`.
pub async fn cluster(name: &str, providers: &str) -> Cluster {
    let server = test_server().await;
    let dir = egress_testkit::scratch_dir(&format!("operator-{name}"));
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let file = dir.join("providers.yaml");
    std::fs::write(&file, providers).unwrap();
    Cluster {
        server,
        kubeconfig: kubeconfig.to_str().unwrap().to_string(),
        providers_flag: format!("--providers-config={}", file.display()),
        dir,
    }
}

/// What the tests' External Proxies point at: proxies and targets on this machine.
pub const LOCAL_DESTINATIONS: &str = "127.0.0.1,localhost";

/// An operator on `cluster` whose health probes trust the CA `ca_pem` and go to `health_url`,
/// serving the discovery API on a free port for the token `crawler-token`, with `extra_flags`
/// and `extra_env` on top. Returned once it leads, with the discovery API's address.
pub fn start_probing(
    cluster: &Cluster,
    ca_pem: &str,
    health_url: &str,
    extra_flags: &[&str],
    extra_env: &[(&str, &str)],
) -> (Operator, String) {
    start_probing_as(cluster, ca_pem, health_url, extra_flags, extra_env, None)
}

/// [`start_probing`], run under strace writing to `trace_file` (see [`trace`]).
pub fn start_probing_traced(
    cluster: &Cluster,
    ca_pem: &str,
    health_url: &str,
    extra_flags: &[&str],
    trace_file: &Path,
) -> (Operator, String) {
    start_probing_as(cluster, ca_pem, health_url, extra_flags, &[], Some(trace_file))
}

fn start_probing_as(
    cluster: &Cluster,
    ca_pem: &str,
    health_url: &str,
    extra_flags: &[&str],
    extra_env: &[(&str, &str)],
    trace_file: Option<&Path>,
) -> (Operator, String) {
    let ca = cluster.dir.join("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    let mut flags = vec![
        cluster.providers_flag.clone(),
        format!("--health-check-ca-file={}", ca.display()),
        format!("--health-check-url={health_url}"),
        "--health-probe-bind-address=0".to_owned(),
        "--zap-encoder=json".to_owned(),
        "--discovery-addr=127.0.0.1:0".to_owned(),
        "--discovery-tls=off".to_owned(),
        // The tests' proxies and targets listen on this machine; their Proxies are in `default`.
        format!("--allowed-internal-destinations={LOCAL_DESTINATIONS}"),
        "--external-proxy-namespaces=default".to_owned(),
    ];
    flags.extend(extra_flags.iter().map(|f| (*f).to_owned()));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut env = vec![
        ("KUBECONFIG", cluster.kubeconfig.as_str()),
        ("DISCOVERY_TOKEN", "crawler-token"),
    ];
    env.extend_from_slice(extra_env);
    let mut op = match trace_file {
        Some(file) => Operator::start_traced(&operator_binary(), &args, &env, file),
        None => Operator::start(&operator_binary(), &args, &env),
    };
    let discovery = op.wait_msg("Serving the discovery API")["address"]
        .as_str()
        .unwrap()
        .to_string();
    op.wait_msg("Starting manager");
    (op, discovery)
}

pub struct Operator {
    child: Child,
    /// Whether `child` is strace running the operator rather than the operator itself.
    traced: bool,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Operator {
    /// Starts `binary` with `args` and the given environment on top of a clean one (no OTEL_*
    /// variable leaks in from the test's own environment).
    pub fn start(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(Command::new(binary), false, args, env)
    }

    /// Like [`Operator::start`], with every destination the binary names written to
    /// `trace_file` (see [`trace`]).
    pub fn start_traced(binary: &Path, args: &[&str], env: &[(&str, &str)], trace_file: &Path) -> Self {
        Self::spawn(trace::traced(binary, trace_file), true, args, env)
    }

    fn spawn(mut cmd: Command, traced: bool, args: &[&str], env: &[(&str, &str)]) -> Self {
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn the operator");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let out = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if out.send(format!("stdout: {line}")).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            traced,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a log line for which `pred` holds, and returns it.
    pub fn wait_line(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        if let Some(l) = self.seen.iter().find(|l| pred(l)) {
            return l.clone();
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no log line {what} within {PATIENCE:?}; lines so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The JSON line whose `msg` is `msg`.
    pub fn wait_msg(&mut self, msg: &str) -> serde_json::Value {
        let line = self.wait_line(msg, |l| {
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v["msg"] == msg)
        });
        serde_json::from_str(&line).unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as the kubelet does.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.operator_pid()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// The operator's process id: the child's own, or under strace, strace's one child.
    fn operator_pid(&self) -> String {
        let id = self.child.id();
        if !self.traced {
            return id.to_string();
        }
        let children = std::fs::read_to_string(format!("/proc/{id}/task/{id}/children")).expect("strace is running");
        let mut pids = children.split_whitespace();
        let pid = pids.next().expect("strace runs the operator").to_owned();
        assert_eq!(pids.next(), None, "strace has one child");
        pid
    }

    /// Waits for the process to exit, collecting the rest of its output.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The pipes close with the process; drain what is left.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    self.seen.push(line);
                }
                return status;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the operator did not exit within {PATIENCE:?}");
            // Output keeps the wait event-driven: each line or a short tick re-checks the exit.
            if let Ok(line) = self.lines.recv_timeout(left.min(Duration::from_millis(50))) {
                self.seen.push(line);
            }
        }
    }

    pub fn output(&self) -> String {
        self.seen.join("\n")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if self.traced && self.child.try_wait().is_ok_and(|s| s.is_none()) {
            // Killing strace would leave the operator running, detached.
            let _ = Command::new("kill").args(["-KILL", &self.operator_pid()]).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary to completion (a start that must fail) and returns its exit code and output.
pub fn run_to_exit(binary: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(binary)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .expect("run the operator");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Waits at most `patience` until Proxy `name` exists and `cond` holds for it (`what` names the
/// state in the failure), and returns it.
pub async fn wait_for_proxy(
    api: &kube::Api<Proxy>,
    name: &str,
    what: &str,
    patience: Duration,
    cond: impl Fn(&Proxy) -> bool + Send + 'static,
) -> Proxy {
    let wait = kube::runtime::wait::await_condition(api.clone(), name, move |p: Option<&Proxy>| p.is_some_and(&cond));
    tokio::time::timeout(patience, wait)
        .await
        .unwrap_or_else(|_| panic!("{name}: not {what} within {patience:?}"))
        .unwrap()
        .unwrap()
}

/// Waits (at most [`PATIENCE`]) until entry `entry`'s ProviderHealth reports target `target`
/// ready.
pub async fn wait_target_ready(server: &TestServer, entry: &str, target: &str) {
    let api: kube::Api<ProviderHealth> = kube::Api::all(server.client().unwrap());
    let ready = kube::runtime::wait::await_condition(api, entry, |h: Option<&ProviderHealth>| {
        h.and_then(|h| h.status.as_ref())
            .is_some_and(|s| s.targets.iter().any(|t| t.name == target && t.ready))
    });
    tokio::time::timeout(PATIENCE, ready)
        .await
        .unwrap_or_else(|_| panic!("{entry}'s target {target} never turned ready"))
        .unwrap();
}

/// An OTLP/HTTP receiver that keeps every export request's body as it came (protobuf, in which
/// every string attribute is its UTF-8 bytes), for sentinel searches; answers each with 200.
pub async fn raw_otlp_receiver() -> (std::net::SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    use http_body_util::BodyExt as _;
    let kept: std::sync::Arc<std::sync::Mutex<Vec<u8>>> = std::sync::Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bodies = kept.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let bodies = bodies.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let bodies = bodies.clone();
                    async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        bodies.lock().unwrap().extend_from_slice(&body);
                        let mut answer = http::Response::new(http_body_util::Full::new(bytes::Bytes::new()));
                        answer.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/x-protobuf"),
                        );
                        Ok::<_, hyper::Error>(answer)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, kept)
}

/// An External Proxy's spec for a proxy at `127.0.0.1:port`.
pub fn external_spec(port: u16) -> egress_api::ProxySpec {
    egress_api::ProxySpec {
        mode: egress_api::Mode::External,
        endpoint: Some(egress_api::Endpoint {
            host: "127.0.0.1".into(),
            port: Some(i32::from(port)),
        }),
        ..Default::default()
    }
}

/// `POST /v1/leases` with `body` to the discovery API at `discovery`, as a crawler holding
/// `token`: the status and the JSON answer.
pub async fn lease(discovery: &str, token: &str, body: &str) -> (u16, serde_json::Value) {
    let answer = reqwest::Client::new()
        .post(format!("http://{discovery}/v1/leases"))
        .bearer_auth(token)
        .body(body.to_owned())
        .send()
        .await
        .expect("the discovery API answers");
    let status = answer.status().as_u16();
    (status, answer.json().await.expect("a JSON answer"))
}

/// `GET /v1/proxies` from the discovery API at `discovery` with `token`: the list as JSON.
pub async fn proxy_list(discovery: &str, token: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("http://{discovery}/v1/proxies"))
        .bearer_auth(token)
        .send()
        .await
        .expect("the discovery API answers")
        .json()
        .await
        .expect("a JSON answer")
}

/// The address a server logged it is serving on.
pub fn served(line: &serde_json::Value) -> String {
    line["address"].as_str().expect("address").to_string()
}

/// Waits until the operator has written a status on Proxy `outside`.
pub async fn until_status_written(proxies: kube::Api<Proxy>) {
    let observed = kube::runtime::wait::await_condition(proxies, "outside", |p: Option<&Proxy>| {
        p.is_some_and(|p| p.status.is_some())
    });
    tokio::time::timeout(PATIENCE, observed)
        .await
        .expect("the operator never wrote a status")
        .unwrap();
}

/// Creates External Proxy `outside` at 127.0.0.1:1, where nothing listens: its probes fail.
pub async fn create_unreachable_external(proxies: &kube::Api<Proxy>) {
    let proxy = Proxy::new("outside", external_spec(1));
    proxies.create(&kube::api::PostParams::default(), &proxy).await.unwrap();
}

/// A Managed Proxy `name` on `entry`'s host `hv`, booting the image `test-image`.
pub fn vm_proxy(name: &str, entry: &str) -> Proxy {
    egress_api::Proxy::new(
        name,
        egress_api::ProxySpec {
            mode: egress_api::Mode::Managed,
            provider: entry.into(),
            placement: Some(egress_api::Placement {
                zone: "hv".into(),
                machine_type: "small".into(),
                image: "test-image".into(),
                ..egress_api::Placement::default()
            }),
            cloud_init: Some(egress_api::CloudInit {
                inline: Some("#cloud-config\n".into()),
                ..egress_api::CloudInit::default()
            }),
            port: 3128,
            health_check: Some(egress_api::HealthCheckSpec::default()),
            ..egress_api::ProxySpec::default()
        },
    )
}

/// A providers file with one kvm2 entry `entry` on the local hypervisor, its SSH key and
/// known_hosts at `ssh` (where the operator reads them), its host's VMs on `bridge`, and the
/// image `test-image` from `url` with sha256 `digest`.
pub fn kvm2_providers_file(
    env: &egress_libvirt::HypervisorEnv,
    entry: &str,
    (key, known): (&Path, &Path),
    (url, digest): (&str, &str),
    bridge: &str,
) -> String {
    format!(
        "providers:
  - name: {entry}
    type: kvm2
    kvm2:
      sshKeyFile: {key}
      knownHostsFile: {known}
      domainType: {domain_type}
      diskSizeGb: 1
      images:
        test-image:
          url: {url}
          sha256: {digest}
      machineTypes:
        small: {{vcpus: 1, memoryMiB: 256}}
      hosts:
        - name: hv
          address: {address}
          user: {user}
          socket: {socket}
          pool: {pool}
          bridge: {bridge}
",
        key = key.display(),
        known = known.display(),
        domain_type = env.domain_type,
        address = env.ssh_address,
        user = env.ssh_user,
        socket = env.libvirt_socket,
        pool = env.pool,
    )
}
