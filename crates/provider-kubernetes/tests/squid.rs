//! Real Squid (Debian's `squid` package) running the config this crate generates for its Pods.
//!
//! The test re-runs itself inside a network namespace of its own (`unshare --net`,
//! `egress_testkit::netns`) that has only a loopback device carrying two test addresses (192.0.2.10 and 192.0.2.20, TEST-NET-1): no
//! request can leave the machine, even through a broken rule, and the denied addresses the
//! cases name (169.254.169.254, 10.1.2.3) have no route at all. Squid's `dst` rules would need
//! DNS for names, which is offline here, so every case names a literal address except the
//! metadata one, which its `dstdomain` rule refuses by name before any lookup.
//!
//! Which rule refused a request is read from the access log's `egress-deny` note.
//!
//! Needs root (for the namespace) and Squid; skips with a reason without them, and fails when
//! real backends are required (`egress_testkit::real`), as under `cargo xtask test`, which runs
//! as root and installs Squid.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use egress_credentials::Credentials;
use egress_provider_kubernetes::squid::{AccessRules, SquidFiles, squid_conf};
use egress_testkit::ScratchDir;
use egress_testkit::netns;
use egress_testkit::squid::{SQUID, Squid, deny_note, squid_available};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Set in the re-run inside the namespace.
const IN_NAMESPACE: &str = "EGRESS_SQUID_TEST_NETNS";
/// The proxy's and the allowed client's address.
const PROXY_IP: &str = "192.0.2.10";
/// A client outside the allowed sources.
const STRANGER_IP: &str = "192.0.2.20";
/// Squid with credentials, and one without.
const AUTH_PORT: u16 = 3128;
const OPEN_PORT: u16 = 3129;
/// The TLS target, the one port CONNECT may reach.
const TARGET_PORT: u16 = 8443;
/// Bounds every wait of this test.
const BUDGET: Duration = Duration::from_secs(30);
/// Bounds the whole run inside the namespace.
const OUTER_BUDGET: Duration = Duration::from_secs(300);

#[test]
fn generated_squid_config_enforces_credentials_and_every_access_rule() {
    if netns::inside(IN_NAMESPACE) {
        return in_namespace();
    }
    if !squid_available("the Squid access test") {
        return;
    }
    netns::rerun_isolated(
        "generated_squid_config_enforces_credentials_and_every_access_rule",
        IN_NAMESPACE,
        "the Squid access test",
        OUTER_BUDGET,
    );
}

/// Squid on `port` with the generated config for `rules` (and credentials when `htpasswd` is
/// given), its files in its own directory.
fn start_squid(name: &str, port: u16, rules: &AccessRules, htpasswd: Option<&str>) -> Squid {
    let conf = |dir: &Path| squid_conf(port, rules, htpasswd.is_some(), &SquidFiles::under(dir));
    Squid::start(name, (PROXY_IP, port), conf, htpasswd)
}

/// A TLS target on `PROXY_IP:TARGET_PORT` that answers every request 204, and a client config
/// that trusts only it.
async fn tls_target() -> Arc<rustls::ClientConfig> {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![PROXY_IP.to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = TcpListener::bind((PROXY_IP, TARGET_PORT)).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = vec![0u8; 4096];
                let _ = tls.read(&mut buf).await;
                let _ = tls
                    .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// What one CONNECT got: the proxy's status and, when the tunnel opened, the target's.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    proxy: u16,
    target: Option<u16>,
}

async fn status_of<R: tokio::io::AsyncRead + Unpin>(reader: &mut BufReader<R>) -> u16 {
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a status line: {line:?}"));
    // The rest of the head.
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).await.unwrap();
        if header == "\r\n" || header.is_empty() {
            return status;
        }
    }
}

/// Sends `CONNECT authority` from `from` to the proxy on `port`, with `credentials` when given;
/// through an opened tunnel, a TLS `GET /` when `tls` is given. Within [`BUDGET`].
async fn connect(
    from: &str,
    port: u16,
    authority: &str,
    credentials: Option<&Credentials>,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Answer {
    tokio::time::timeout(BUDGET, connect_unbounded(from, port, authority, credentials, tls))
        .await
        .unwrap_or_else(|_| panic!("CONNECT {authority}: no answer within {BUDGET:?}"))
}

/// Sends a plain-HTTP `GET url` (an absolute URL) from the allowed client, and returns the
/// proxy's status. Within [`BUDGET`].
async fn get(port: u16, url: &str, credentials: Option<&Credentials>) -> u16 {
    let exchange = async {
        let mut conn = BufReader::new(TcpStream::connect((PROXY_IP, port)).await.unwrap());
        let mut head = format!("GET {url} HTTP/1.1\r\nHost: egress.test\r\nConnection: close\r\n");
        if let Some(c) = credentials {
            head.push_str(&format!("Proxy-Authorization: {}\r\n", c.basic_authorization()));
        }
        head.push_str("\r\n");
        conn.write_all(head.as_bytes()).await.unwrap();
        status_of(&mut conn).await
    };
    tokio::time::timeout(BUDGET, exchange)
        .await
        .unwrap_or_else(|_| panic!("GET {url}: no answer within {BUDGET:?}"))
}

async fn connect_unbounded(
    from: &str,
    port: u16,
    authority: &str,
    credentials: Option<&Credentials>,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Answer {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let tcp: TcpStream = socket
        .connect(format!("{PROXY_IP}:{port}").parse().unwrap())
        .await
        .unwrap();
    let mut conn = BufReader::new(tcp);
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(c) = credentials {
        head.push_str(&format!("Proxy-Authorization: {}\r\n", c.basic_authorization()));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).await.unwrap();
    let proxy = status_of(&mut conn).await;
    if proxy != 200 {
        return Answer { proxy, target: None };
    }
    let Some(tls) = tls else {
        return Answer { proxy, target: None };
    };
    let name = rustls::pki_types::ServerName::try_from(authority.rsplit_once(':').unwrap().0.to_owned()).unwrap();
    let mut tunnel = BufReader::new(
        tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, conn)
            .await
            .expect("TLS with the target through the tunnel"),
    );
    tunnel
        .write_all(format!("GET / HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    Answer {
        proxy,
        target: Some(status_of(&mut tunnel).await),
    }
}

/// The `egress-deny` note of the log line about `CONNECT authority`.
fn note_for(log: &[String], authority: &str) -> String {
    deny_note(log, &format!(" CONNECT {authority} "))
}

fn in_namespace() {
    netns::loopback_with(&[PROXY_IP, STRANGER_IP]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(cases());
}

async fn cases() {
    let tls = tls_target().await;
    let good = Credentials::generate();
    let wrong = Credentials::new(good.username(), "not-the-password").unwrap();
    // The test's own target is allowed: its port, and a range outside the refused ones.
    let rules = AccessRules {
        connect_ports: vec![TARGET_PORT],
        allowed_sources: Some(vec![format!("{PROXY_IP}/32")]),
        ..AccessRules::default()
    };
    let squid = start_squid("auth", AUTH_PORT, &rules, Some(&good.htpasswd_line()));
    let target = format!("{PROXY_IP}:{TARGET_PORT}");
    let ask = |authority: &str, credentials: Option<&Credentials>| {
        let (authority, credentials) = (authority.to_owned(), credentials.cloned());
        let tls = tls.clone();
        async move { connect(PROXY_IP, AUTH_PORT, &authority, credentials.as_ref(), Some(&tls)).await }
    };

    // Credentials: none and wrong ones are challenged; the right ones reach the target.
    assert_eq!(
        ask(&target, None).await,
        Answer {
            proxy: 407,
            target: None
        }
    );
    assert_eq!(
        ask(&target, Some(&wrong)).await,
        Answer {
            proxy: 407,
            target: None
        }
    );
    assert_eq!(
        ask(&target, Some(&good)).await,
        Answer {
            proxy: 200,
            target: Some(204)
        }
    );

    // With the right credentials, each refused destination is refused by its own rule.
    // (what is asked for, how Squid's log writes it, the rule that refuses it)
    let refused = [
        (format!("{PROXY_IP}:9443"), None, "port"),
        (format!("169.254.169.254:{TARGET_PORT}"), None, "link-local"),
        (format!("metadata.google.internal:{TARGET_PORT}"), None, "metadata"),
        (format!("10.1.2.3:{TARGET_PORT}"), None, "denied-range"),
        (format!("[fd00::1]:{TARGET_PORT}"), None, "denied-range"),
        (format!("127.0.0.1:{TARGET_PORT}"), None, "localhost"),
        (format!("[::1]:{TARGET_PORT}"), None, "localhost"),
        // An IPv4 address in IPv6 form is the IPv4 address to Squid (and its log).
        (
            format!("[::ffff:7f00:2]:{TARGET_PORT}"),
            Some(format!("127.0.0.2:{TARGET_PORT}")),
            "localhost",
        ),
        (
            format!("[::ffff:a9fe:a9fd]:{TARGET_PORT}"),
            Some(format!("169.254.169.253:{TARGET_PORT}")),
            "link-local",
        ),
        (format!("[fe80::1]:{TARGET_PORT}"), None, "link-local"),
        (format!("100.100.100.200:{TARGET_PORT}"), None, "metadata"),
        // 169.254.169.254 through NAT64, and through 6to4.
        (format!("[64:ff9b::a9fe:a9fe]:{TARGET_PORT}"), None, "translated"),
        (format!("[2002:a9fe:a9fe::1]:{TARGET_PORT}"), None, "translated"),
        (format!("100.64.1.1:{TARGET_PORT}"), None, "denied-range"),
    ];
    for (authority, _, _) in &refused {
        assert_eq!(
            ask(authority, Some(&good)).await,
            Answer {
                proxy: 403,
                target: None
            },
            "{authority}"
        );
    }
    // A client outside the allowed sources is refused before credentials are asked for.
    let stranger = connect(STRANGER_IP, AUTH_PORT, &target, Some(&good), None).await;
    assert_eq!(
        stranger,
        Answer {
            proxy: 403,
            target: None
        }
    );

    // Plain HTTP: the metadata server on the allowed port, and Squid's own cache manager, each
    // refused by its rule; without credentials, challenged first.
    let plain = [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://metadata.google.internal/computeMetadata/v1/", "metadata"),
        (
            &*format!("http://{PROXY_IP}:{AUTH_PORT}/squid-internal-mgr/menu"),
            "manager",
        ),
        ("cache_object://localhost/info", "manager"),
    ];
    for (url, _) in &plain {
        assert_eq!(get(AUTH_PORT, url, None).await, 407, "{url}");
        assert_eq!(get(AUTH_PORT, url, Some(&good)).await, 403, "{url}");
    }

    // The refusals and the stranger.
    let logged = |(asked, logged, _): &(String, Option<String>, &str)| logged.clone().unwrap_or_else(|| asked.clone());
    let mut needles: Vec<String> = refused.iter().map(|r| format!(" CONNECT {} ", logged(r))).collect();
    needles.push(format!(" {STRANGER_IP} "));
    // Each URL was asked twice (bare, then with credentials): wait for the second answer's
    // line, which Squid may write after the client read the answer.
    needles.extend(plain.iter().map(|(url, rule)| format!(" GET {url} {rule}")));
    let log = squid.access_log(&needles).await;
    for r in &refused {
        assert_eq!(note_for(&log, &logged(r)), r.2, "{}: {log:#?}", r.0);
    }
    for (url, rule) in &plain {
        assert_eq!(deny_note(&log, &format!(" GET {url} ")), *rule, "{url}: {log:#?}");
    }
    let stranger_line = log.iter().find(|l| l.contains(&format!(" {STRANGER_IP} "))).unwrap();
    assert!(stranger_line.ends_with(" source"), "{stranger_line}");
    // The log never carries the user name or the password.
    let text = log.join("\n");
    assert!(
        !text.contains(good.username()) && !text.contains(good.password()),
        "{text}"
    );

    // Without credentials nothing is asked for, and the same rules hold.
    let open = start_squid("open", OPEN_PORT, &rules, None);
    let answer = connect(PROXY_IP, OPEN_PORT, &target, None, Some(&tls)).await;
    assert_eq!(
        answer,
        Answer {
            proxy: 200,
            target: Some(204)
        }
    );
    let refused_port = format!("{PROXY_IP}:9443");
    let answer = connect(PROXY_IP, OPEN_PORT, &refused_port, None, None).await;
    assert_eq!(
        answer,
        Answer {
            proxy: 403,
            target: None
        }
    );
    let log = open.access_log(&[format!(" CONNECT {refused_port} ")]).await;
    assert_eq!(note_for(&log, &refused_port), "port");
}

/// The Squid config inside a shipped VM sample's cloud-init.
fn sample_squid_conf(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/samples/other-providers")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("content: |\n").expect("a squid.conf in the sample") + "content: |\n".len();
    let block: Vec<&str> = text[start..]
        .lines()
        .take_while(|l| !l.trim_start().starts_with("runcmd:"))
        .collect();
    let indent = block[0].len() - block[0].trim_start().len();
    block
        .iter()
        .map(|l| format!("{}\n", l.get(indent..).unwrap_or("")))
        .collect()
}

#[test]
fn the_vm_samples_carry_the_generated_rules_and_squid_reads_them() {
    // The generated config with credentials, less what only the Pod has (the files, the access
    // log's notes) and what Squid defaults to.
    let generated = squid_conf(3128, &AccessRules::default(), true, &SquidFiles::pod());
    let rules: Vec<String> = generated
        .lines()
        .filter(|l| l.starts_with("acl egress_") || l.starts_with("http_access"))
        .filter(|l| !l.starts_with("acl egress_why_"))
        .map(|l| {
            l.split(' ')
                .filter(|w| !w.starts_with("egress_why_"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert!(rules.len() > 15, "{rules:?}");
    for sample in [
        "crawl_v1alpha1_proxy_kvm.yaml",
        "crawl_v1alpha1_proxy_gcp.yaml",
        "crawl_v1alpha1_proxy_secretref.yaml",
    ] {
        let conf = sample_squid_conf(sample);
        let lines: Vec<&str> = conf.lines().collect();
        for rule in &rules {
            assert!(lines.contains(&rule.as_str()), "{sample} lacks {rule:?}:\n{conf}");
        }
        assert_eq!(lines.iter().filter(|l| l.starts_with("http_access allow")).count(), 1);
        assert_eq!(
            lines.iter().rfind(|l| l.starts_with("http_access")),
            Some(&"http_access allow all")
        );
        if !squid_available("parsing the samples' configs with Squid") {
            continue;
        }
        // Squid itself reads it (basic_ncsa_auth is where the sample says, as on the VM).
        let dir = ScratchDir::new("squid-sample");
        let path = dir.path().join("squid.conf");
        std::fs::write(&path, &conf).unwrap();
        let out = std::process::Command::new(SQUID)
            .args(["-k", "parse", "-f"])
            .arg(&path)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{sample}: {said}");
        assert!(!said.contains("ERROR") && !said.contains("FATAL"), "{sample}: {said}");
    }
}
