//! The shipped binary against what someone inside the cluster could try: the discovery API
//! serves TLS as applied (its certificate made and kept in the Secret `discovery-tls`, its CA
//! what clients trust, plain HTTP getting nothing), one source address cannot hold every
//! connection, a client's token file taken out of the Secret revokes its tokens, and an SSH key
//! file others may read is refused, naming it.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{Cluster, Operator, PATIENCE, cluster, operator_binary};
use egress_testkit::secret_volume::Volume;

const NAMESPACE: &str = "egress-proxies-operator-system";

fn start(cluster: &Cluster, extra: &[&str]) -> (Operator, String) {
    let mut args = vec![
        "--leader-elect=false",
        "--health-probe-bind-address=0",
        "--metrics-bind-address=0",
        cluster.providers_flag.as_str(),
        "--zap-encoder=json",
        "--discovery-addr=127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let mut op = Operator::start(
        &operator_binary(),
        &args,
        &[
            ("KUBECONFIG", cluster.kubeconfig.as_str()),
            ("POD_NAMESPACE", NAMESPACE),
        ],
    );
    let address = op.wait_msg("Serving the discovery API")["address"]
        .as_str()
        .unwrap()
        .to_string();
    (op, address)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_api_serves_tls_from_a_secret_whose_ca_clients_trust() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = cluster("hardening-tls", "providers: []\n").await;
    let volume = Volume::new("hardening-tls", "tls-test-token\n");
    let token_file = format!("--discovery-token-file={}", volume.token_file().display());
    let (mut op, address) = start(&cluster, &[&token_file]);
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(cluster.server.client().unwrap(), NAMESPACE);
    let deadline = Instant::now() + PATIENCE;
    let secret = loop {
        if let Some(secret) = secrets.get_opt("discovery-tls").await.unwrap() {
            break secret;
        }
        assert!(Instant::now() < deadline, "no Secret discovery-tls was made");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let ca = secret.data.as_ref().unwrap()["ca.crt"].0.clone();

    // Once the Secret's certificate is in force (right after it was made), a client that
    // trusts its CA is served.
    let port = address.rsplit_once(':').unwrap().1;
    let url = format!("https://localhost:{port}");
    let client = egress_discovery::client::Client::with_ca(&url, Some("tls-test-token".into()), PATIENCE, &ca).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while client.whoami().await.ok().as_deref() != Some("default") {
        assert!(Instant::now() < deadline, "the Secret's certificate was never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Without the CA the certificate is not trusted, and plain HTTP gets no answer.
    let untrusting = egress_discovery::client::Client::new(&url, Some("tls-test-token".into())).unwrap();
    assert!(untrusting.whoami().await.is_err());
    let plain = reqwest::Client::new()
        .get(format!("http://{address}/healthz"))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");
    // The key stays in the Secret: never in the log.
    let key = String::from_utf8(secret.data.as_ref().unwrap()["tls.key"].0.clone()).unwrap();
    let middle = &key.lines().nth(1).unwrap()[..40];
    op.terminate();
    op.wait_exit();
    let output = op.output();
    assert!(
        output.contains("made a CA and a certificate and stored them in a Secret"),
        "{output}"
    );
    assert!(!output.contains(middle), "the private key was logged");
}

/// Opens a connection from `from` (an address of this machine) to `to`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(to).await.unwrap().into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream
}

/// What a connection answers to `GET /healthz`, its status line.
fn healthz(mut stream: TcpStream) -> String {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_cannot_hold_every_connection() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = cluster("hardening-sources", "providers: []\n").await;
    let (mut op, address) = start(
        &cluster,
        &[
            "--discovery-tls=off",
            "--discovery-auth=none",
            "--max-connections-per-source=64",
            // Long enough for the held connections to outlive the test's steps.
            "--max-connections=1024",
        ],
    );
    let to: SocketAddr = address.parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..64 {
        held.push(connect_from("127.0.0.1", to).await);
    }
    // The held ones are counted once the server accepted them: the 65th is accepted after them.
    let refused = healthz(connect_from("127.0.0.1", to).await);
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    let served = healthz(connect_from("127.0.0.2", to).await);
    assert!(served.starts_with("HTTP/1.1 200"), "another source: {served}");
    drop(held);
    // Their slots come back: the first source is served again.
    let deadline = Instant::now() + PATIENCE;
    while !healthz(connect_from("127.0.0.1", to).await).starts_with("HTTP/1.1 200") {
        assert!(Instant::now() < deadline, "the source's slots never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    op.terminate();
    op.wait_exit();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_file_taken_out_of_the_secret_revokes_its_tokens() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = cluster("hardening-revoke", "providers: []\n").await;
    let mut volume = Volume::with_keys(
        "hardening-revoke",
        &[("token", "default-token\n"), ("team-a", "team-a-token\n")],
    );
    let dir = format!("--discovery-token-dir={}", volume.file("").display());
    let file = format!("--discovery-token-file={}", volume.token_file().display());
    let (mut op, address) = start(
        &cluster,
        &["--discovery-tls=off", &dir, &file, "--token-revoke-grace=0s"],
    );
    let whoami = |token: &'static str| {
        let url = format!("http://{address}/v1/whoami");
        async move {
            let r = reqwest::Client::new().get(url).bearer_auth(token).send().await.unwrap();
            r.status().as_u16()
        }
    };
    assert_eq!(whoami("team-a-token").await, 200);
    volume.remove_key("team-a");
    let deadline = Instant::now() + PATIENCE;
    while whoami("team-a-token").await != 401 {
        assert!(
            Instant::now() < deadline,
            "the removed client's token was never revoked"
        );
        // NB: the manager reads the files every 10 s; poll its effect.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let revoked = op.wait_line("the revocation's warning", |l| {
        l.contains("a discovery token file was removed or emptied: its tokens are revoked")
    });
    let revoked: serde_json::Value = serde_json::from_str(&revoked).unwrap();
    assert_eq!(revoked["client"], "team-a", "{revoked}");
    assert_eq!(whoami("default-token").await, 200, "the other client stays");
    op.terminate();
    op.wait_exit();
    assert!(!op.output().contains("team-a-token"), "a token was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssh_key_file_others_may_read_is_refused_naming_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = egress_testkit::scratch_dir("hardening-key");
    let key = dir.join("id_ed25519");
    std::fs::write(&key, "not used: refused before it is read\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let providers = format!(
        "providers:
  - name: kvm-home
    type: kvm2
    kvm2:
      sshKeyFile: {}
      knownHostsFile: {}
      images:
        debian-13:
          url: https://example.com/debian-13.qcow2
      machineTypes:
        small: {{vcpus: 1, memoryMiB: 1024}}
      hosts:
        - {{name: beelink, address: 127.0.0.1:22, user: novakj, bridge: br0}}
",
        key.display(),
        dir.join("known_hosts").display()
    );
    let cluster = cluster("hardening-key", &providers).await;
    let mut op = Operator::start(
        &operator_binary(),
        &[
            "--leader-elect=false",
            "--health-probe-bind-address=0",
            "--metrics-bind-address=0",
            cluster.providers_flag.as_str(),
            "--discovery-addr=0",
        ],
        &[
            ("KUBECONFIG", cluster.kubeconfig.as_str()),
            ("POD_NAMESPACE", NAMESPACE),
        ],
    );
    let status = op.wait_exit();
    assert!(!status.success(), "{}", op.output());
    let output = op.output();
    assert!(
        output.contains(&format!(
            "ssh key file {} may be read by others (mode 644)",
            key.display()
        )),
        "{output}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
