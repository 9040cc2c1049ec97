//! The local provider with real tinyproxy processes, beyond the contract suite: traffic through a
//! created proxy, a process that outlives its provider, a process that dies, a create that
//! resumes, the checker's verdicts, and cloud-init kept off the disk.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use egress_provider::config::ProviderConfig;
use egress_provider::{CreateRequest, ErrorClass, InstanceState, OpCtx, Placement, Provider, name_from_uid};
use egress_provider_local::LocalConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Whether tinyproxy is installed where the provider runs it; without it these tests skip, and
/// when real backends are required (`egress_testkit::real`, as under `cargo xtask test`, which
/// installs it) they fail.
fn tinyproxy_available() -> bool {
    let found = Path::new(support::TINYPROXY).exists();
    if !found {
        egress_testkit::real::skip_or_fail(
            "a test of the provider's real tinyproxy",
            &format!("{} is not installed (cargo xtask test installs it)", support::TINYPROXY),
        );
    }
    found
}

/// A state directory removed (with any process left in it) at the end of a test.
struct StateDir(PathBuf);

impl StateDir {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("egress-local-test-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        support::kill_processes_under(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A provider built the way the operator builds it, from a config entry.
fn provider(state: &StateDir, tinyproxy: Option<&str>) -> Arc<dyn Provider> {
    provider_allowing(state, tinyproxy, None)
}

/// The same, with `local.connectPorts` set.
fn provider_allowing(state: &StateDir, tinyproxy: Option<&str>, connect_ports: Option<Vec<u16>>) -> Arc<dyn Provider> {
    let entry = ProviderConfig::new("dev", "local").with_block(&LocalConfig {
        state_dir: state.path(),
        tinyproxy_path: tinyproxy.map(str::to_owned),
        connect_ports,
    });
    egress_provider_local::construct(&entry).expect("a valid entry")
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        name: name_from_uid(uid),
        uid: uid.to_owned(),
        namespace: "crawl".to_owned(),
        proxy_name: "p".to_owned(),
        placement: Placement::default(),
        cloud_init: Vec::new(),
        port: 3128,
        installation: Some("dev-install".to_owned()),
        credentials: None,
        spread_group: None,
    }
}

/// Polls `get` until the instance is in `want` (a real process needs a moment to listen).
async fn wait_for(
    p: &dyn Provider,
    id: &egress_provider::ProviderId,
    want: InstanceState,
) -> egress_provider::Instance {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let i = p.get(&OpCtx::background(), id).await.expect("get");
        if i.state == want {
            return i;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id} still {:?} after 20 s, want {want:?}",
            i.state
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A target that answers one line of text on every connection, naming the address the
/// connection came from.
async fn hello_target() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            tokio::spawn(async move {
                let line = format!("hello from the target to {}\n", peer.ip());
                let _ = s.write_all(line.as_bytes()).await;
            });
        }
    });
    addr
}

/// Opens a CONNECT tunnel through `proxy` to `target` and returns what the target sent.
async fn through(proxy: std::net::SocketAddr, target: std::net::SocketAddr) -> String {
    tunnel(proxy, target, None).await
}

/// Sends a CONNECT through `proxy` to `target` (with a `Proxy-Authorization` header when
/// `credentials` are given) and returns what came back: the proxy's refusal, or its 200 and what
/// the target sent.
async fn tunnel(
    proxy: std::net::SocketAddr,
    target: std::net::SocketAddr,
    credentials: Option<&egress_provider::Credentials>,
) -> String {
    let mut s = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(proxy))
        .await
        .expect("connect in time")
        .expect("connect to the proxy");
    let auth = credentials.map_or_else(String::new, |c| {
        format!("Proxy-Authorization: {}\r\n", c.basic_authorization())
    });
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    let whole_line = |got: &[u8]| {
        let text = String::from_utf8_lossy(got);
        text.contains("from the target") && text.ends_with('\n')
    };
    while !whole_line(&got) {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        if n == 0 {
            // A refusal: the proxy answered and closed.
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_created_proxy_carries_a_connect_and_delete_leaves_nothing() {
    if !tinyproxy_available() {
        return;
    }
    let state = StateDir::new("connect");
    let target = hello_target().await;
    let p = provider_allowing(&state, None, Some(vec![target.port()]));
    let cx = OpCtx::background();
    let id = p.create(&cx, &request("u-connect")).await.expect("create");
    assert_eq!(id.as_str(), format!("local/{}", name_from_uid("u-connect")));
    let i = wait_for(p.as_ref(), &id, InstanceState::Running).await;
    let ip = i.ip.expect("a Running instance has an address");
    assert!(ip.is_loopback() && ip != std::net::IpAddr::from([127, 0, 0, 1]), "{ip}");
    assert_eq!(
        (i.uid.as_str(), i.installation.as_deref()),
        ("u-connect", Some("dev-install"))
    );

    let answer = through((ip, 3128).into(), target).await;
    assert!(answer.starts_with("HTTP/1.") && answer.contains(" 200 "), "{answer}");
    assert!(answer.contains("from the target"), "{answer}");
    // It leaves from its own address (`Bind`), not from 127.0.0.1 as every proxy would.
    assert!(answer.contains(&format!("from the target to {ip}\n")), "{answer}");

    p.delete(&cx, &id).await.expect("delete");
    let gone = p.get(&cx, &id).await.expect_err("gone after delete");
    assert_eq!(gone.class(), ErrorClass::NotFound);
    assert!(
        support::processes_under(&state.0).is_empty(),
        "a tinyproxy outlived its delete"
    );
    let left: Vec<_> = std::fs::read_dir(&state.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[tokio::test]
async fn the_process_outlives_its_provider_and_the_next_one_takes_it_over() {
    if !tinyproxy_available() {
        return;
    }
    let state = StateDir::new("restart");
    let cx = OpCtx::background();
    let first = provider(&state, None);
    let id = first.create(&cx, &request("u-restart")).await.expect("create");
    wait_for(first.as_ref(), &id, InstanceState::Running).await;
    let (pid, _) = support::processes_under(&state.0)[0].clone();
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    // Its own process group: a signal to the operator's group does not reach it.
    assert_ne!(
        rustix::process::getpgid(Some(pid)).unwrap(),
        rustix::process::getpgrp(),
        "tinyproxy shares the operator's process group"
    );
    drop(first);

    let second = provider(&state, None);
    let listed = second.list_by_tag(&cx).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id.clone(), listed[0].uid.as_str()),
        (id.clone(), "u-restart")
    );
    assert_eq!(listed[0].state, InstanceState::Running);
    // A repeated create adopts it instead of starting another process.
    assert_eq!(
        second.create(&cx, &request("u-restart")).await.expect("create again"),
        id
    );
    assert_eq!(support::processes_under(&state.0).len(), 1);
    second.delete(&cx, &id).await.expect("delete");
    assert!(support::processes_under(&state.0).is_empty());
}

#[tokio::test]
async fn a_killed_process_is_stopped() {
    if !tinyproxy_available() {
        return;
    }
    let state = StateDir::new("killed");
    let p = provider(&state, None);
    let id = p
        .create(&OpCtx::background(), &request("u-killed"))
        .await
        .expect("create");
    wait_for(p.as_ref(), &id, InstanceState::Running).await;
    for (pid, _) in support::processes_under(&state.0) {
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    }
    let i = wait_for(p.as_ref(), &id, InstanceState::Stopped).await;
    assert_eq!(i.ip, None);
    p.delete(&OpCtx::background(), &id)
        .await
        .expect("delete a dead instance");
}

#[tokio::test]
async fn a_create_without_a_binary_fails_clearly_and_the_next_create_resumes() {
    if !tinyproxy_available() {
        return;
    }
    let state = StateDir::new("resume");
    let cx = OpCtx::background();
    let broken = provider(&state, Some("/nonexistent/bin/tinyproxy"));
    let err = broken.create(&cx, &request("u-resume")).await.expect_err("no binary");
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");
    assert!(err.to_string().contains("/nonexistent/bin/tinyproxy"), "{err}");
    // The record was written in the creating call: the instance exists, not yet started.
    let id = egress_provider::ProviderId::new(format!("local/{}", name_from_uid("u-resume")));
    assert_eq!(
        broken.get(&cx, &id).await.expect("get").state,
        InstanceState::Provisioning
    );

    let fixed = provider(&state, None);
    assert_eq!(fixed.create(&cx, &request("u-resume")).await.expect("resumed"), id);
    wait_for(fixed.as_ref(), &id, InstanceState::Running).await;
    fixed.delete(&cx, &id).await.expect("delete");
}

#[tokio::test]
async fn cloud_init_is_written_nowhere() {
    if !tinyproxy_available() {
        return;
    }
    let state = StateDir::new("cloudinit");
    let p = provider(&state, None);
    let mut req = request("u-cloudinit");
    req.cloud_init = format!("#cloud-config\npassword: {}\n", egress_conformance::SENTINEL_CI).into_bytes();
    let id = p.create(&OpCtx::background(), &req).await.expect("create");
    wait_for(p.as_ref(), &id, InstanceState::Running).await;
    let mut files = vec![state.0.clone()];
    let mut read = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().flatten().map(|e| e.path()));
        } else {
            read += 1;
            let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
            assert!(
                !text.contains(egress_conformance::SENTINEL_CI),
                "{} holds cloud-init",
                path.display()
            );
        }
    }
    assert!(
        read >= 3,
        "expected the record, the config, the pid and the log; read {read}"
    );
    p.delete(&OpCtx::background(), &id).await.expect("delete");
}

#[tokio::test]
async fn the_checker_verifies_the_binary_and_the_directory() {
    if !tinyproxy_available() {
        return;
    }
    let state = StateDir::new("checker");
    let check = |p: Arc<dyn Provider>| async move { p.checker().expect("a checker").check(&OpCtx::background()).await };

    let ok = check(provider(&state, None)).await;
    assert_eq!(ok.len(), 1);
    assert!(ok[0].ready, "{ok:?}");
    assert_eq!(ok[0].name, "local");
    assert_eq!(ok[0].address, state.path());
    assert!(ok[0].details["tinyproxy"].starts_with("tinyproxy 1."), "{ok:?}");

    let no_binary = check(provider(&state, Some("/nonexistent/bin/tinyproxy"))).await;
    assert!(!no_binary[0].ready);
    assert_eq!(no_binary[0].reason, egress_provider::REASON_UNREACHABLE);
    assert!(
        no_binary[0].message.contains("/nonexistent/bin/tinyproxy"),
        "{no_binary:?}"
    );

    // A state directory below a regular file can never be created.
    let file = StateDir::new("checker-file");
    std::fs::write(&file.0, b"").unwrap();
    let below = StateDir(file.0.join("state"));
    let no_dir = check(provider(&below, None)).await;
    assert!(!no_dir[0].ready);
    assert!(no_dir[0].message.contains(&below.path()), "{no_dir:?}");
    std::mem::forget(below);
    let _ = std::fs::remove_file(&file.0);
}

/// The status code of a proxy's answer (`HTTP/1.0 407 Proxy Authentication Required` → 407).
fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

#[tokio::test]
async fn credentials_are_demanded_and_only_the_connect_ports_are_reached() {
    if !tinyproxy_available() {
        return;
    }
    let state = StateDir::new("credentials");
    let (target, other) = (hello_target().await, hello_target().await);
    let p = provider_allowing(&state, None, Some(vec![target.port()]));
    let cx = OpCtx::background();
    let good = egress_provider::Credentials::generate();
    let mut req = request("u-credentials");
    req.credentials = Some(egress_provider::ProxyCredentials::new(good.clone(), "unused-here"));
    let id = p.create(&cx, &req).await.expect("create");
    let ip = wait_for(p.as_ref(), &id, InstanceState::Running).await.ip.unwrap();
    let proxy = (ip, 3128).into();

    let wrong = egress_provider::Credentials::new(good.username(), "not-the-password").unwrap();
    assert_eq!(status(&tunnel(proxy, target, None).await), 407);
    // tinyproxy 1.11 answers wrong credentials `401 Unauthorized` (with `WWW-Authenticate`), not
    // 407; the probe reads either as the proxy refusing its credentials.
    assert_eq!(status(&tunnel(proxy, target, Some(&wrong)).await), 401);
    let answer = tunnel(proxy, target, Some(&good)).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.contains("hello from the target"), "{answer}");
    // The right credentials, a port outside `connectPorts`: refused, nothing reaches it.
    let refused = tunnel(proxy, other, Some(&good)).await;
    assert_eq!(status(&refused), 403, "{refused}");
    assert!(!refused.contains("from the target"));

    // The config holds the password, so only its owner reads it.
    use std::os::unix::fs::PermissionsExt as _;
    let name = name_from_uid("u-credentials");
    let config = state.0.join(&name).join("tinyproxy.conf");
    let mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", config.display());
    p.delete(&cx, &id).await.expect("delete");

    // A user's own credentials that a tinyproxy line cannot carry are refused, not mangled.
    let mut spaced = request("u-spaced");
    spaced.credentials = Some(egress_provider::ProxyCredentials::new(
        egress_provider::Credentials::new("u", "two words").unwrap(),
        "unused-here",
    ));
    let err = p.create(&cx, &spaced).await.expect_err("refused");
    assert_eq!(err.class(), ErrorClass::Permanent);
    assert!(!err.to_string().contains("two words"), "{err}");
}
