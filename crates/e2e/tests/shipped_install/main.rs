//! The shipped install, run from the image: `deploy/example` rendered by kubectl's kustomize
//! with the image `cargo xtask image` built, the rendered CRDs served by the test API server,
//! and the manager's Deployment and its ConfigMap run by `podman kube play` from the image
//! loaded out of its OCI archive. Checked: the security context inside the running container,
//! the probes, the providers file and the token read from their mounted paths (the token
//! rotated the kubelet's way and followed), a kvm2 Proxy on the local hypervisor made Ready by
//! the manager in the container (libvirt's library loaded from the image), and an exit 0 on its
//! own after SIGTERM.
//!
//! What a real cluster does and podman does not, the test does itself, and says so:
//! - the probes: asked here as the kubelet asks them (GET on the health port);
//! - the termination grace: `podman stop --time` with the Deployment's
//!   `terminationGracePeriodSeconds`;
//! - Secret volumes: host directories filled the kubelet's way, mode and group as the
//!   Deployment asks (podman 4.3 cannot mount them; [`play`] says why);
//! - RBAC: not sent: the test API server does not authorize (the controller's rbac test checks
//!   the rules against the code).
//!
//! Not a default test target (`test = false`): the Pod runs on the host's network, so the
//! manager binds its ports on every interface. `cargo xtask test` runs it on its own after the
//! parallel suites, with `EGRESS_TEST_IMAGE` (the image's name) and
//! `EGRESS_TEST_IMAGE_ARCHIVE` (its OCI archive); it checks the ports are free first and always
//! removes its Pod.

#[path = "../common/mod.rs"]
mod common;
mod play;
mod pod;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use egress_api::{Phase, Proxy};
use egress_discovery::client::Client;
use egress_kube_testserver::TestServer;
use egress_libvirt::HypervisorEnv;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

const NAMESPACE: &str = "egress-proxies-operator-system";
const DEPLOYMENT: &str = "egress-proxies-operator-controller-manager";
/// The ports the manager binds: health probes, discovery API, metrics.
const MANAGER_PORTS: [u16; 3] = [8081, 8090, 8443];
/// Where the Deployment mounts the kvm-ssh Secret.
const SSH_MOUNT: &str = "/etc/proxy-operator/kvm";
/// Starting in a container and electing itself leader takes seconds; a software-emulated guest
/// boots in about half a minute, after the image's download and upload.
const START_PATIENCE: Duration = Duration::from_secs(120);
const BOOT_PATIENCE: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_manager_runs_from_the_image() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(image) = image_under_test() else { return };
    let Some(env) = HypervisorEnv::for_test() else { return };
    for port in MANAGER_PORTS {
        if let Err(e) = std::net::TcpListener::bind(("0.0.0.0", port)) {
            panic!("port {port} is taken ({e}): the manager binds it on the host's network");
        }
    }
    let guest = std::fs::read(&env.guest_image).unwrap();
    let digest: String = Sha256::digest(&guest).iter().map(|b| format!("{b:02x}")).collect();
    let mirror = egress_testkit::image_server::ImageServer::start(guest, "127.0.0.1:0").await;
    let pki = egress_testkit::pki_for(&[&env.gateway]);
    let (probe_target, probe_seen) = egress_testkit::tls_target_at(&pki, &env.gateway).await;
    let health_url = format!("https://{}:{}/204", env.gateway, probe_target.port());

    let work = work_dir();
    let providers = providers_file(&env, &mirror.url(), &digest);
    let rendered = render_overlay(&work.join("overlay"), &image, &providers, &pki.ca_pem, &health_url);
    let deployment = rendered
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == DEPLOYMENT)
        .expect("the manager's Deployment is rendered")
        .clone();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        image.as_str()
    );
    let server = test_server(&rendered).await;
    std::fs::create_dir_all(work.join("kube")).unwrap();
    server.write_kubeconfig(&work.join("kube/kubeconfig")).unwrap();
    let mut token = egress_testkit::secret_volume::Volume::new("shipped-install", "token-one");
    let host = play::HostSide {
        kubeconfig_dir: work.join("kube"),
        secrets: BTreeMap::from([
            (
                "discovery-token".to_owned(),
                token.token_file().parent().unwrap().to_owned(),
            ),
            ("kvm-ssh".to_owned(), ssh_secret_dir(&work, &env, &deployment)),
        ]),
    };
    let documents = play::documents(&rendered, DEPLOYMENT, &host);
    let file = work.join("play.yaml");
    std::fs::write(&file, play::file_text(&documents)).unwrap();
    let played = pod::Played::play(&file, DEPLOYMENT, "manager", named_volumes(&deployment));

    probes_answer(&deployment).await;
    security_context_holds(&played);
    let ca = discovery_ca(&server).await;
    token_rotation_is_followed(&ca, &mut token).await;
    a_kvm2_proxy_becomes_ready_and_goes(&server).await;
    assert!(
        !probe_seen.lock().unwrap().is_empty(),
        "the health probe never reached its target"
    );

    let grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a termination grace");
    assert_eq!(
        played.stop(grace),
        0,
        "the manager did not exit 0 on SIGTERM:\n{}",
        played.log()
    );
}

/// The image to run, loaded from its archive (so the run proves `podman load` takes it); `None`
/// when this is not `cargo xtask test`'s run, which fails instead where real backends are required.
fn image_under_test() -> Option<String> {
    let (Ok(image), Ok(archive)) = (
        std::env::var("EGRESS_TEST_IMAGE"),
        std::env::var("EGRESS_TEST_IMAGE_ARCHIVE"),
    ) else {
        egress_testkit::real::skip_or_fail(
            "the shipped install from the image",
            "EGRESS_TEST_IMAGE and EGRESS_TEST_IMAGE_ARCHIVE are unset (cargo xtask test builds the image and sets them)",
        );
        return None;
    };
    let _ = pod::podman(&["rmi", "--force", &image]);
    let out = pod::podman(&["load", "--input", &archive]);
    assert!(out.status.success(), "podman load {archive}: {}", pod::both(&out));
    let exists = pod::podman(&["image", "exists", &image]);
    assert!(
        exists.status.success(),
        "{archive} does not hold {image}: {}",
        pod::both(&out)
    );
    Some(image)
}

/// A directory of this test's own under the workspace's target/ (the overlay's path to
/// deploy/default must be relative: kustomize refuses absolute ones).
fn work_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/shipped-install");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The providers file: one kvm2 entry on the local hypervisor, its key where the Deployment
/// mounts the kvm-ssh Secret, its image from this test's mirror.
fn providers_file(env: &HypervisorEnv, mirror: &str, digest: &str) -> String {
    let (key, known) = (
        Path::new(SSH_MOUNT).join("id_ed25519"),
        Path::new(SSH_MOUNT).join("known_hosts"),
    );
    common::kvm2_providers_file(env, "kvm2-image", (&key, &known), (mirror, digest), &env.bridge)
}

/// `deploy/example` as a platform engineer adapts it: its base, the image, the providers, plus
/// the probe target's CA in the generated ConfigMap and the flags that point the probes at it
/// (the default target is on the internet, which the guests cannot reach). Rendered by kubectl.
fn render_overlay(dir: &Path, image: &str, providers: &str, ca_pem: &str, health_url: &str) -> Vec<Value> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/example/kustomization.yaml");
    let (name, tag) = image.rsplit_once(':').expect("an image with a tag");
    let replace = |text: String, from: &str, to: &str| {
        assert!(text.contains(from), "deploy/example no longer has {from:?}");
        text.replace(from, to)
    };
    let mut k = std::fs::read_to_string(example).unwrap();
    k = replace(k, "  - ../default\n", "  - ../../../deploy/default\n");
    k = replace(
        k,
        "newName: registry.example.com/egress-proxies-operator",
        &format!("newName: {name}"),
    );
    k = replace(k, "newTag: v0.1.0", &format!("newTag: {tag}"));
    k = replace(
        k,
        "      - providers.yaml\n",
        "      - providers.yaml\n      - ca.pem\n",
    );
    k.push_str(&format!(
        "patches:
  - target: {{kind: Deployment, labelSelector: control-plane=controller-manager}}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --health-check-url={health_url}
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --health-check-ca-file=/etc/proxy-operator/ca.pem
"
    ));
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("kustomization.yaml"), k).unwrap();
    std::fs::write(dir.join("providers.yaml"), providers).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_pem).unwrap();
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "kubectl kustomize: {}", pod::both(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .collect()
}

/// The test API server serving the rendered CRDs, with the install's namespace.
async fn test_server(rendered: &[Value]) -> TestServer {
    let mut builder = TestServer::builder().namespace(NAMESPACE);
    for crd in rendered.iter().filter(|d| d["kind"] == "CustomResourceDefinition") {
        builder = builder.crd_json(crd.clone());
    }
    builder.start().await.expect("the test API server")
}

/// The kvm-ssh Secret's files as the kubelet writes them for this Deployment: root's, in the
/// Pod's `fsGroup`, with the volume's `defaultMode`.
fn ssh_secret_dir(work: &Path, env: &HypervisorEnv, deployment: &Value) -> PathBuf {
    let pod = &deployment["spec"]["template"]["spec"];
    let group = u32::try_from(pod["securityContext"]["fsGroup"].as_u64().expect("an fsGroup")).unwrap();
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == "kvm-ssh")
        .expect("the kvm-ssh volume");
    let mode = u32::try_from(volume["secret"]["defaultMode"].as_u64().expect("a defaultMode")).unwrap();
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the kvm-ssh mount");
    assert_eq!(mount["mountPath"], SSH_MOUNT);
    let dir = work.join("kvm-ssh");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(0), Some(group)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    for (name, from) in [("id_ed25519", &env.ssh_key), ("known_hosts", &env.known_hosts)] {
        let file = dir.join(name);
        std::fs::copy(from, &file).unwrap();
        std::os::unix::fs::chown(&file, Some(0), Some(group)).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    dir
}

/// The named volumes podman makes for the Deployment: one per ConfigMap and per emptyDir.
fn named_volumes(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| {
            if let Some(name) = v["configMap"]["name"].as_str() {
                Some(name.to_owned())
            } else if v.get("emptyDir").is_some() {
                v["name"].as_str().map(str::to_owned)
            } else {
                None
            }
        })
        .collect()
}

/// Asks `check` every 200 ms until it gives a value, for at most `patience`.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    patience: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {patience:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The liveness and readiness probes, asked as the Deployment tells the kubelet to ask them.
async fn probes_answer(deployment: &Value) {
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    for kind in ["livenessProbe", "readinessProbe"] {
        let get = &container[kind]["httpGet"];
        let (Some(path), Some(port)) = (get["path"].as_str(), get["port"].as_u64()) else {
            panic!("the manager's {kind} is an httpGet on a numbered port: {get}");
        };
        let url = format!("http://127.0.0.1:{port}{path}");
        eventually(&format!("{kind}: GET {url} answers 200"), START_PATIENCE, || async {
            let answer = reqwest::get(&url).await.ok()?;
            answer.status().is_success().then_some(())
        })
        .await;
    }
}

/// Inside the running container, as the Deployment's security contexts ask: uid 65532, no
/// capabilities, no privilege escalation, a read-only root.
fn security_context_holds(played: &pod::Played) {
    let out = played.exec(&["cat", "/proc/1/status"]);
    assert!(out.status.success(), "{}", pod::both(&out));
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("no {name} in /proc/1/status:\n{status}"))
    };
    assert_eq!(field("Uid"), ["65532"; 4], "{status}");
    assert_eq!(field("CapEff"), ["0000000000000000"], "{status}");
    assert_eq!(field("NoNewPrivs"), ["1"], "{status}");
    let write = played.exec(&["sh", "-c", "echo x > /written-by-the-test"]);
    assert!(!write.status.success(), "a write to / succeeded");
    assert!(
        pod::both(&write).contains("Read-only file system"),
        "{}",
        pod::both(&write)
    );
}

/// The discovery API's CA, from the Secret the manager made (the install's default: TLS with a
/// CA of its own).
async fn discovery_ca(server: &TestServer) -> Vec<u8> {
    let secrets: Api<Secret> = Api::namespaced(server.client().unwrap(), NAMESPACE);
    let secret = eventually("the Secret discovery-tls is made", START_PATIENCE, || {
        let secrets = secrets.clone();
        async move { secrets.get_opt("discovery-tls").await.ok().flatten() }
    })
    .await;
    secret.data.expect("data")["ca.crt"].0.clone()
}

/// The token file's token is served; rotated the kubelet's way, the new one is, and the old one
/// no more.
async fn token_rotation_is_followed(ca: &[u8], token: &mut egress_testkit::secret_volume::Volume) {
    let client = |t: &str| Client::with_ca("https://localhost:8090", Some(t.to_owned()), START_PATIENCE, ca).unwrap();
    let (one, two) = (client("token-one"), client("token-two"));
    eventually("the mounted token is served", START_PATIENCE, || async {
        (one.whoami().await.ok()? == "default").then_some(())
    })
    .await;
    token.update("token-two");
    eventually("the rotated token is served", START_PATIENCE, || async {
        (two.whoami().await.ok()? == "default").then_some(())
    })
    .await;
    assert!(one.whoami().await.is_err(), "the replaced token is still served");
}

/// A kvm2 Proxy in the install's namespace: made Ready by the manager in the container, then
/// deleted, its domain with it.
async fn a_kvm2_proxy_becomes_ready_and_goes(server: &TestServer) {
    let api: Api<Proxy> = Api::namespaced(server.client().unwrap(), NAMESPACE);
    let proxy = common::vm_proxy("vm-image", "kvm2-image");
    api.create(&PostParams::default(), &proxy).await.unwrap();
    common::wait_for_proxy(&api, "vm-image", "Ready", BOOT_PATIENCE, |p| {
        p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready)
    })
    .await;
    api.delete("vm-image", &DeleteParams::default()).await.unwrap();
    let gone = kube::runtime::wait::await_condition(api, "vm-image", |p: Option<&Proxy>| p.is_none());
    tokio::time::timeout(BOOT_PATIENCE, gone)
        .await
        .expect("the Proxy is not gone: its instance was not removed")
        .unwrap();
}
