//! The kvm2 figures of `cargo xtask bench`, on the local hypervisor (`cargo xtask hypervisor
//! up`; skipped without it): the time from creating a Proxy to Ready with a cold and with a
//! warm image cache, the operator's peak memory while it streams a 512 MiB image into the
//! host's pool, and the time from a host frozen in the middle of such an upload (every process of
//! its SSH user stopped) to the create's Transient error in the operator's log.
//!
//! The shipped operator runs against `egress-kube-testserver` with one kvm2 entry whose name is
//! new each run (so its cache starts cold); the images are served from this process; the health
//! probe's target listens on the bridge's host address. Everything made is removed at the end,
//! the cached base images included.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use egress_api::{CloudInit, HealthCheckSpec, Mode, Phase, Placement, Proxy, ProxySpec};
use kube::api::{Api, DeleteParams, PostParams};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::report::{self, Conditions, Table};
use crate::procs::Killed;
use crate::test_server;

/// The size of the image whose upload is measured.
const BIG_IMAGE: u64 = 512 << 20;
/// How long one Proxy may take to become Ready.
const READY_BUDGET: Duration = Duration::from_secs(600);

/// The settings `cargo xtask hypervisor up` wrote, or `None` when it has not run.
fn hypervisor_settings() -> Result<Option<BTreeMap<String, String>>> {
    let file =
        std::env::var_os("EGRESS_HV_ENV").map_or_else(|| PathBuf::from(crate::hypervisor::ENV_FILE), PathBuf::from);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    Ok(Some(
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect(),
    ))
}

/// A file of `size` pseudo-random bytes (incompressible, like an image).
fn write_big_image(path: &Path, size: u64) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..size / chunk.len() as u64 {
        for word in chunk.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        out.write_all(&chunk)?;
    }
    out.flush()?;
    Ok(())
}

/// Serves `files` (URL path to file) over plain HTTP/1.1, streamed from disk, with their length.
async fn serve_files(files: BTreeMap<String, PathBuf>) -> Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let files = Arc::new(files);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let files = files.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let mut parts = line.split(' ');
                let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
                let Some(file) = files.get(path) else {
                    let _ = conn
                        .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        .await;
                    return;
                };
                let Ok(mut f) = tokio::fs::File::open(file).await else {
                    return;
                };
                let Ok(meta) = f.metadata().await else { return };
                let header = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    meta.len()
                );
                if conn.write_all(header.as_bytes()).await.is_err() || method == "HEAD" {
                    return;
                }
                let _ = tokio::io::copy(&mut f, &mut conn).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(addr)
}

fn rss_kib(pid: u32, key: &str) -> u64 {
    crate::procs::rss_kib(pid, key).unwrap_or(0)
}

fn virsh(args: &[&str]) -> bool {
    Command::new("virsh")
        .args(["-c", "qemu:///system"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn proxy(entry: &str, image: &str) -> ProxySpec {
    ProxySpec {
        mode: Mode::Managed,
        provider: entry.to_owned(),
        placement: Some(Placement {
            zone: "hv".into(),
            machine_type: "small".into(),
            image: image.into(),
            ..Placement::default()
        }),
        cloud_init: Some(CloudInit {
            inline: Some("#cloud-config\n".into()),
            ..CloudInit::default()
        }),
        port: 3128,
        health_check: Some(HealthCheckSpec::default()),
        ..ProxySpec::default()
    }
}

async fn time_to_ready(api: &Api<Proxy>, name: &str, spec: ProxySpec) -> Result<Duration> {
    let started = Instant::now();
    api.create(&PostParams::default(), &Proxy::new(name, spec)).await?;
    loop {
        let p = api.get(name).await?;
        if p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > READY_BUDGET {
            bail!("{name} not Ready after {READY_BUDGET:?}: {:?}", p.status);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn delete_all(api: &Api<Proxy>, names: &[&str]) -> Result<()> {
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    let started = Instant::now();
    for name in names {
        while api.get_opt(name).await?.is_some() {
            if started.elapsed() > READY_BUDGET {
                bail!("{name} was not deleted");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Where the image `big-frozen` comes from: a server that holds the body after this much, so
/// the freeze lands in the middle of the upload whatever the machine's speed.
const FROZEN_AT: usize = 64 << 20;

/// Creates the Proxy `frozen` with the cold image `big-frozen` (served by `held_image`, which
/// holds it at [`FROZEN_AT`]), freezes the host's SSH user (`user`) once the upload has begun and
/// lets the body go on; returns the time from the freeze to the operator's `reconcile failed`
/// line for the create's Transient failure (the entry's stall limit is the default 30 s, the
/// keepalive's 15 s interval times its count about as long; the reconciler logs the failure as
/// the create returns), and what noticed it. The host is thawed before this returns.
async fn frozen_to_transient(
    api: &Api<Proxy>,
    held_image: &egress_testkit::image_server::ImageServer,
    entry: &str,
    pool: &str,
    user: &str,
    log: &Path,
) -> Result<(Duration, &'static str)> {
    let base = format!("base-{entry}-big-frozen.raw");
    api.create(
        &PostParams::default(),
        &Proxy::new("frozen", proxy(entry, "big-frozen")),
    )
    .await?;
    tokio::time::timeout(READY_BUDGET, held_image.held())
        .await
        .context("the download of big-frozen never reached its pause")?;
    // The base volume is made just before the upload into it begins.
    let started = Instant::now();
    while !virsh(&["vol-info", "--pool", pool, &base]) {
        if started.elapsed() > READY_BUDGET {
            bail!("the upload of {base} did not begin within {READY_BUDGET:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let frozen = egress_testkit::freeze::Frozen::freeze(egress_testkit::freeze::uid_of(user));
    let froze = Instant::now();
    held_image.resume();
    let noticed = loop {
        let text = std::fs::read_to_string(log)?;
        // The stall limit or russh's keepalive, whichever notices first (the keepalive does
        // when the buffers on the way never filled, so the pump never had bytes waiting).
        if let Some(line) = text
            .lines()
            .find(|l| l.contains("reconcile failed") && l.contains("\"proxy\":\"frozen\"") && l.contains("transient"))
        {
            break if line.contains("accepted no byte") {
                "the stall limit noticed"
            } else if line.contains("Keepalive") {
                "the keepalive noticed"
            } else {
                "noticed by neither the stall limit nor the keepalive"
            };
        }
        if froze.elapsed() > READY_BUDGET {
            bail!("no Transient failure within {READY_BUDGET:?} of the freeze");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let figure = froze.elapsed();
    drop(frozen);
    Ok((figure, noticed))
}

/// The test hypervisor, as `cargo xtask hypervisor up` described it.
struct Hypervisor {
    /// The bridge's host address: where the guests reach this machine.
    gateway: String,
    pool: String,
    user: String,
    ssh_key: String,
    known_hosts: String,
    domain_type: String,
    ssh_address: String,
    socket: String,
    bridge: String,
    guest_image: String,
}

impl Hypervisor {
    /// The settings' `EGRESS_HV_*` values; an error names the first one missing.
    fn from_settings(settings: &BTreeMap<String, String>) -> Result<Self> {
        let get = |k: &str| {
            settings
                .get(&format!("EGRESS_HV_{k}"))
                .cloned()
                .with_context(|| format!("EGRESS_HV_{k} missing from the hypervisor settings"))
        };
        Ok(Self {
            gateway: get("GATEWAY")?,
            pool: get("POOL")?,
            user: get("SSH_USER")?,
            ssh_key: get("SSH_KEY")?,
            known_hosts: get("KNOWN_HOSTS")?,
            domain_type: get("DOMAIN_TYPE")?,
            ssh_address: get("SSH_ADDRESS")?,
            socket: get("LIBVIRT_SOCKET")?,
            bridge: get("BRIDGE")?,
            guest_image: get("GUEST_IMAGE")?,
        })
    }
}

/// The kvm2 entry's name: new each run, so its image cache starts cold.
fn entry_name() -> String {
    format!(
        "kvm2-bench-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
    )
}

/// The providers file: one kvm2 entry `entry` on `hv`, its images from `mirror` and (the one
/// frozen mid-upload) `held`.
fn providers_yaml(entry: &str, hv: &Hypervisor, mirror: std::net::SocketAddr, held: &str) -> String {
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
        guest: {{url: 'http://{mirror}/guest.qcow2'}}
        big: {{url: 'http://{mirror}/big.raw', format: raw}}
        big-frozen: {{url: '{held}', format: raw}}
      machineTypes:
        small: {{vcpus: 1, memoryMiB: 256}}
      hosts:
        - {{name: hv, address: '{address}', user: {user}, socket: {socket}, pool: {pool}, bridge: {bridge}}}
",
        key = hv.ssh_key,
        known = hv.known_hosts,
        domain_type = hv.domain_type,
        address = hv.ssh_address,
        user = hv.user,
        socket = hv.socket,
        pool = hv.pool,
        bridge = hv.bridge,
    )
}

/// Starts the shipped operator with `providers`, probing the target on the gateway's `port`
/// (its CA in `ca`), logging JSON to `log`.
fn start_operator(
    bin: &Path,
    providers: &Path,
    ca: &Path,
    probe: (&str, u16),
    kubeconfig: &Path,
    log: &Path,
) -> Result<Killed> {
    let (gateway, port) = probe;
    let operator = Command::new(bin.join("egress-operator"))
        .arg(format!("--providers-config={}", providers.display()))
        // The bench's Proxies are in `bench`; the operator otherwise serves its own namespace.
        .arg("--proxy-namespace=bench")
        .arg(format!("--health-check-ca-file={}", ca.display()))
        .arg(format!("--health-check-url=https://{gateway}:{port}/generate_204"))
        .arg(format!(
            "--metrics-bind-address=127.0.0.1:{}",
            egress_testkit::try_free_port()?
        ))
        .args([
            "--metrics-secure=false",
            "--health-probe-bind-address=0",
            "--discovery-addr=127.0.0.1:0",
            "--discovery-tls=off",
            "--zap-encoder=json",
        ])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .context("starting the operator")?;
    Ok(Killed(operator))
}

/// The bench's figures.
struct Figures {
    cold: Duration,
    warm: Duration,
    upload: Duration,
    /// The operator's peak RSS before and after the big upload, in KiB.
    before: u64,
    after: u64,
    /// Freeze to Transient failure, and what noticed the frozen host.
    frozen: (Duration, &'static str),
}

/// Creates the 512 MiB image's Proxy and waits until its base volume is cached; returns the
/// time that took.
async fn big_upload(api: &Api<Proxy>, entry: &str, pool: &str) -> Result<Duration> {
    let marker = format!("base-{entry}-big.raw.sha256");
    let started = Instant::now();
    api.create(&PostParams::default(), &Proxy::new("big", proxy(entry, "big")))
        .await?;
    while !virsh(&["vol-info", "--pool", pool, &marker]) {
        if started.elapsed() > READY_BUDGET {
            bail!("the 512 MiB image was not cached within {READY_BUDGET:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(started.elapsed())
}

/// Takes the figures from the operator (process `pid`, logging to `log`) with entry `entry`,
/// then deletes every Proxy it made, whatever happened.
async fn measure(
    kubeconfig: &Path,
    (entry, hv): (&str, &Hypervisor),
    pid: u32,
    held_image: &egress_testkit::image_server::ImageServer,
    log: &Path,
) -> Result<Figures> {
    let api: Api<Proxy> = Api::namespaced(test_server::client(kubeconfig).await?, "bench");
    let measured = async {
        let cold = time_to_ready(&api, "cold", proxy(entry, "guest")).await?;
        let warm = time_to_ready(&api, "warm", proxy(entry, "guest")).await?;
        let before = rss_kib(pid, "VmHWM:");
        let upload = big_upload(&api, entry, &hv.pool).await?;
        let after = rss_kib(pid, "VmHWM:");
        let frozen = frozen_to_transient(&api, held_image, entry, &hv.pool, &hv.user, log).await?;
        anyhow::Ok(Figures {
            cold,
            warm,
            upload,
            before,
            after,
            frozen,
        })
    }
    .await;
    let cleaned = delete_all(&api, &["cold", "warm", "big", "frozen"]).await;
    let figures = measured?;
    cleaned?;
    Ok(figures)
}

/// Removes the base images the entry `entry` cached in `pool`, and their markers.
fn remove_cached_images(pool: &str, entry: &str) {
    for volume in ["guest.qcow2", "big.raw", "big-frozen.raw"] {
        let base = format!("base-{entry}-{volume}");
        virsh(&["vol-delete", "--pool", pool, &format!("{base}.sha256")]);
        virsh(&["vol-delete", "--pool", pool, &base]);
    }
}

fn print_table(f: &Figures, conditions: &str) {
    let mut table = Table::new(&["Figure", "Value"]);
    table
        .row([
            "Proxy created to Ready, cold image cache (the 13 MB test image downloaded and uploaded first)".to_owned(),
            report::seconds(f.cold),
        ])
        .row([
            "Proxy created to Ready, warm image cache".to_owned(),
            report::seconds(f.warm),
        ])
        .row([
            "a 512 MiB image: Proxy created to base cached (download, SHA-256, upload over SSH)".to_owned(),
            report::seconds(f.upload),
        ])
        .row([
            "operator peak RSS before / after that upload (the manager's limit is 128 MiB)".to_owned(),
            format!("{} / {}", report::mib(f.before), report::mib(f.after)),
        ])
        .row([
            "a host frozen in the middle of a 512 MiB upload (every process of its SSH user stopped): \
             freeze to the create's Transient failure in the operator's log, default 30 s stall limit"
                .to_owned(),
            format!("{} ({})", report::seconds(f.frozen.0), f.frozen.1),
        ]);
    table.print(conditions);
}

/// Runs the kvm2 bench with the binaries in `bin` and scratch space `dir`; prints its table.
pub(super) fn run(root: &Path, bin: &Path, dir: &Path, conditions: &Conditions) -> Result<()> {
    let Some(settings) = hypervisor_settings()? else {
        println!("\nkvm2 bench skipped: no test hypervisor (run `cargo xtask hypervisor up` first)");
        return Ok(());
    };
    let hv = Hypervisor::from_settings(&settings)?;
    let dir = dir.join("kvm2");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let big = dir.join("big.raw");
    write_big_image(&big, BIG_IMAGE)?;
    let entry = entry_name();
    let runtime = tokio::runtime::Runtime::new()?;
    let _guard = runtime.enter();
    let pki = egress_testkit::pki_for(&[hv.gateway.as_str()]);
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem)?;
    let (probe_target, _) = runtime.block_on(egress_testkit::tls_target_at(&pki, &hv.gateway));
    let held_image = runtime.block_on(egress_testkit::image_server::ImageServer::start(
        std::fs::read(&big)?,
        "127.0.0.1:0",
    ));
    held_image.serve(egress_testkit::image_server::Serve::PauseAfter(FROZEN_AT));
    let mirror = runtime.block_on(serve_files(BTreeMap::from([
        ("/guest.qcow2".to_owned(), PathBuf::from(&hv.guest_image)),
        ("/big.raw".to_owned(), big.clone()),
    ])))?;
    let providers = dir.join("providers.yaml");
    std::fs::write(&providers, providers_yaml(&entry, &hv, mirror, &held_image.url()))?;
    let (server, kubeconfig) = test_server::start(root, bin, "bench", &dir)?;
    let log = dir.join("operator.log");
    let probe = (hv.gateway.as_str(), probe_target.port());
    let operator = start_operator(bin, &providers, &ca, probe, &kubeconfig, &log)?;
    let figures = runtime.block_on(measure(&kubeconfig, (&entry, &hv), operator.0.id(), &held_image, &log));
    drop(operator);
    drop(server);
    remove_cached_images(&hv.pool, &entry);
    let _ = std::fs::remove_file(&big);
    let setup = format!(
        "the shipped operator on egress-kube-testserver with one kvm2 entry, named anew so its \
         image cache starts cold, on the local hypervisor (`cargo xtask hypervisor up`; guests of \
         `domainType: {}`, 1 vCPU and 256 MiB), its images served by the bench: a Proxy of the test \
         image with the cache cold, another with it warm, one of a 512 MiB image, then one of \
         another 512 MiB image whose host is frozen mid-upload (its download held at {} MiB until \
         then)",
        hv.domain_type,
        FROZEN_AT >> 20
    );
    print_table(&figures?, &conditions.line("kvm2", &setup));
    Ok(())
}
