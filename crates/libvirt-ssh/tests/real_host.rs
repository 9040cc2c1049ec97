//! The transport against the real sshd and libvirtd of `cargo xtask hypervisor up`, every byte
//! through our SSH session and bridge: libvirt answers (version, hostname, pool info); a 64 MiB
//! upload keeps resident memory flat; host key and credential failures come back as their own
//! causes; and, through a TCP relay in front of sshd that can be frozen (a host that vanishes
//! without a reset), a hung call returns at its budget and the next one redials, an upload to a
//! host that takes no byte fails at the stall limit, and keepalive notices the silent peer with
//! no call in flight. A relay that closes its connections, and a libvirtd restart, are noticed
//! with no call in flight too; a zero keepalive interval keeps the link.
//!
//! Without the hypervisor every test skips, and under `cargo xtask test` (which brings it up)
//! they fail. They run one at a time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use egress_libvirt::HypervisorEnv;
use egress_libvirt_ssh::{CallError, DialCause, DialOptions, Dialer, HostKeys, HostTarget, Pool, RPC_BUDGET, Stage};
use egress_provider::OpCtx;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One test at a time: the memory figure of the upload is the process's, and every test shares
/// the one sshd.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The hypervisor's settings, or `None` (the test skips) when it is not up.
fn hypervisor() -> Option<HypervisorEnv> {
    let env = HypervisorEnv::for_test()?;
    egress_libvirt_ssh::quiet_libvirt();
    Some(env)
}

fn target(env: &HypervisorEnv) -> HostTarget {
    HostTarget {
        name: "local-hv".to_owned(),
        address: env.ssh_address.clone(),
        user: env.ssh_user.clone(),
        socket: env.libvirt_socket.clone(),
    }
}

fn options(env: &HypervisorEnv) -> DialOptions {
    DialOptions::new(&env.ssh_key, HostKeys::KnownHosts(env.known_hosts.clone()))
}

/// A relay in front of sshd, the host as seen through it, and options that accept its host key
/// (known_hosts names sshd's own address, not the relay's).
async fn through_relay(env: &HypervisorEnv) -> (Relay, HostTarget, DialOptions) {
    let relay = relay(env.ssh_address.clone()).await;
    let mut host = target(env);
    host.address = relay.address.clone();
    let mut opts = options(env);
    opts.host_keys = HostKeys::AcceptAny;
    (relay, host, opts)
}

/// A fresh ed25519 key pair (private key path; the public key is `<path>.pub`).
fn new_key(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "ssh-keygen failed");
    path
}

async fn dial_err(options: DialOptions, host: &HostTarget) -> egress_libvirt_ssh::DialError {
    match Dialer::new(options).dial(&OpCtx::background(), host).await {
        Ok(_) => panic!("the dial should have failed"),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libvirt_answers_through_our_bridge() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    let pool = Pool::new(Arc::new(Dialer::new(options(&env))));
    let cx = OpCtx::background();
    let host = target(&env);
    let conn = pool.get(&cx, &host).await.expect("a connection");
    let version = conn
        .call(&cx, "ConnectGetLibVersion", RPC_BUDGET, |c| c.lib_version())
        .await
        .unwrap();
    assert!(version >= 9_000_000, "libvirt {version}");
    let hostname = conn
        .call(&cx, "ConnectGetHostname", RPC_BUDGET, |c| c.hostname())
        .await
        .unwrap();
    assert!(!hostname.is_empty());
    let pool_name = env.pool.clone();
    let info = conn
        .call(&cx, "StoragePoolGetInfo", RPC_BUDGET, move |c| {
            c.lookup_storage_pool_by_name(&pool_name)?.info()
        })
        .await
        .unwrap();
    assert!(info.capacity > 0 && info.available <= info.capacity, "{info:?}");
    // The pool hands the same live connection to the next caller.
    let again = pool.get(&cx, &host).await.unwrap();
    assert!(Arc::ptr_eq(&conn, &again));
    // A daemon error is the daemon's: the connection stays.
    let missing = conn
        .call(&cx, "StoragePoolLookupByName", RPC_BUDGET, |c| {
            c.lookup_storage_pool_by_name("no-such-pool").map(drop)
        })
        .await
        .unwrap_err();
    assert!(!missing.is_transport(), "{missing}");
    assert!(
        missing
            .libvirt()
            .unwrap()
            .code()
            .is(virt::error::ErrorNumber::NoStoragePool)
    );
    assert!(!conn.is_dead());
}

fn rss_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_upload_streams_with_flat_memory() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    const LEN: u64 = 64 << 20;
    const CHUNK: usize = 256 << 10;
    let dialer = Dialer::new(options(&env));
    let cx = OpCtx::background();
    let conn = dialer.dial(&cx, &target(&env)).await.expect("a connection");
    let pool_name = env.pool.clone();
    let volume = format!("egress-test-{}-upload.raw", std::process::id());
    let before = rss_kib("VmRSS:");
    let (p, v) = (pool_name.clone(), volume.clone());
    let uploaded = conn
        .call(&cx, "StorageVolUpload", egress_libvirt_ssh::TRANSFER_BUDGET, move |c| {
            let pool = c.lookup_storage_pool_by_name(&p)?;
            let xml = format!(
                "<volume type='file'><name>{v}</name><capacity unit='bytes'>{LEN}</capacity><target><format type='raw'/></target></volume>"
            );
            let vol = virt::storage_vol::StorageVol::create_xml(&pool, &xml, 0)?;
            let stream = virt::stream::Stream::new(c, 0)?;
            vol.upload(&stream, 0, LEN, 0)?;
            // Generated chunk by chunk: the only buffer is one chunk.
            let mut chunk = vec![0u8; CHUNK];
            let mut sent = 0u64;
            while sent < LEN {
                chunk.fill((sent / CHUNK as u64) as u8);
                let mut at = 0;
                while at < CHUNK {
                    let n = stream.send(&chunk[at..])?;
                    at += usize::try_from(n).unwrap_or(0);
                }
                sent += CHUNK as u64;
            }
            stream.finish()?;
            Ok(vol.info()?.capacity)
        })
        .await;
    let peak_growth = rss_kib("VmHWM:").saturating_sub(before);
    let (p, v) = (pool_name, volume);
    let _ = conn
        .call(&cx, "StorageVolDelete", RPC_BUDGET, move |c| {
            c.lookup_storage_pool_by_name(&p)?
                .lookup_storage_vol_by_name(&v)?
                .delete(0)
        })
        .await;
    assert_eq!(uploaded.expect("the upload"), LEN);
    // Flat: far less than the upload's size (the bridge and the SSH window hold a few MiB).
    assert!(
        peak_growth < 24 * 1024,
        "resident memory grew by {peak_growth} KiB during a 64 MiB upload"
    );
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_and_host_key_failures_keep_their_cause() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    let host = target(&env);
    let dir = egress_testkit::scratch_dir("ssh-test-credentials");
    let known = env.known_hosts.clone();

    // The host is not in known_hosts.
    let empty = dir.join("empty_known_hosts");
    std::fs::write(&empty, "").unwrap();
    let e = dial_err(DialOptions::new(&env.ssh_key, HostKeys::KnownHosts(empty)), &host).await;
    assert!(
        matches!(e.cause, DialCause::HostKeyUnknown { .. }) && e.stage == Stage::Ssh,
        "{e}"
    );
    assert!(e.is_host_key_error());

    // known_hosts holds another key of the same type for the host.
    let other = new_key(&dir, "other_host_key");
    let other_pub = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let changed = dir.join("changed_known_hosts");
    let (host_part, port) = host.address.rsplit_once(':').unwrap();
    std::fs::write(&changed, format!("[{host_part}]:{port} {other_pub}")).unwrap();
    let e = dial_err(DialOptions::new(&env.ssh_key, HostKeys::KnownHosts(changed)), &host).await;
    assert!(matches!(e.cause, DialCause::HostKeyChanged { line: 1, .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("dialing host local-hv (ssh): knownhosts: key mismatch"),
        "{e}"
    );

    // A known_hosts file that is not there.
    let e = dial_err(
        DialOptions::new(&env.ssh_key, HostKeys::KnownHosts(dir.join("nope"))),
        &host,
    )
    .await;
    assert!(
        matches!(e.cause, DialCause::KnownHostsRead { .. }) && e.stage == Stage::Credentials,
        "{e}"
    );

    // A key the server does not know.
    let stranger = new_key(&dir, "stranger");
    let e = dial_err(DialOptions::new(&stranger, HostKeys::KnownHosts(known.clone())), &host).await;
    assert!(e.is_auth_error(), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "dialing host local-hv (ssh): ssh: unable to authenticate as {}: the server refused the key",
            host.user
        )
    );

    // No key file, and a public key where the private one should be (the classic mistake).
    let e = dial_err(
        DialOptions::new(dir.join("missing"), HostKeys::KnownHosts(known.clone())),
        &host,
    )
    .await;
    assert!(matches!(e.cause, DialCause::KeyRead { .. }) && e.is_key_error(), "{e}");
    let e = dial_err(
        DialOptions::new(stranger.with_extension("pub"), HostKeys::KnownHosts(known.clone())),
        &host,
    )
    .await;
    assert!(matches!(e.cause, DialCause::KeyParse { .. }) && e.is_key_error(), "{e}");
    assert!(
        !e.to_string().contains("ssh-ed25519 AAAA"),
        "the key's content leaked: {e}"
    );

    // Accepting any host key skips the check (and nothing else).
    let any = Dialer::new(DialOptions::new(&env.ssh_key, HostKeys::AcceptAny));
    let conn = any
        .dial(&OpCtx::background(), &host)
        .await
        .expect("accepting any host key");
    conn.close().await;

    // A socket path that does not exist on the host.
    let mut wrong = host.clone();
    wrong.socket = "/run/libvirt/no-such-sock".to_owned();
    let e = dial_err(options(&env), &wrong).await;
    assert!(
        matches!(e.stage, Stage::Socket | Stage::Libvirt),
        "a missing socket stops at the channel or the libvirt handshake: {e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TCP relay in front of sshd that can be frozen: while frozen it forwards nothing and
/// closes nothing, as a host that vanished without a reset.
struct Relay {
    address: String,
    frozen: watch::Sender<bool>,
    /// Bytes carried from the client to sshd so far.
    forwarded: watch::Sender<u64>,
    /// Bytes that arrived, from either side, while frozen.
    held: watch::Sender<u64>,
    /// Raised by [`Relay::cut`]: every connection open then is closed (both sides see the
    /// peer close); later ones are carried.
    cuts: watch::Sender<u64>,
}

impl Relay {
    fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Closes every connection the relay carries now, as a host that closes its sockets does.
    fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Waits (bounded) until `counter` reaches `at_least`.
    async fn reached(counter: &watch::Sender<u64>, at_least: u64) {
        let mut rx = counter.subscribe();
        tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|n| *n >= at_least))
            .await
            .expect("the relay carried the bytes within 60 s")
            .expect("the relay is alive");
    }
}

async fn relay(upstream: String) -> Relay {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let relay = Relay {
        address,
        frozen: watch::channel(false).0,
        forwarded: watch::channel(0).0,
        held: watch::channel(0).0,
        cuts: watch::channel(0).0,
    };
    let (frozen, forwarded, held, cuts) = (
        relay.frozen.clone(),
        relay.forwarded.clone(),
        relay.held.clone(),
        relay.cuts.clone(),
    );
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let cut = Cut::now(&cuts);
            tokio::spawn(pump(
                cr,
                sw,
                frozen.clone(),
                Some(forwarded.clone()),
                held.clone(),
                cut.clone(),
            ));
            tokio::spawn(pump(sr, cw, frozen.clone(), None, held.clone(), cut));
        }
    });
    relay
}

/// A connection's view of [`Relay::cut`]: the cut count when it was accepted.
#[derive(Clone)]
struct Cut {
    cuts: watch::Receiver<u64>,
    born: u64,
}

impl Cut {
    fn now(cuts: &watch::Sender<u64>) -> Self {
        let cuts = cuts.subscribe();
        let born = *cuts.borrow();
        Self { cuts, born }
    }

    /// Resolves once the relay cuts the connections open when this one was accepted.
    async fn happened(&mut self) {
        let born = self.born;
        let _ = self.cuts.wait_for(|n| *n != born).await;
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: watch::Sender<bool>,
    count: Option<watch::Sender<u64>>,
    held: watch::Sender<u64>,
    mut cut: Cut,
) {
    let mut buf = vec![0u8; 16 << 10];
    let mut is_frozen = frozen.subscribe();
    loop {
        // Cut: both halves are dropped, so each peer sees the other close.
        let read = tokio::select! {
            read = from.read(&mut buf) => read,
            () = cut.happened() => return,
        };
        let Ok(n) = read else { return };
        if n == 0 {
            return;
        }
        // Frozen: hold the bytes until thawed (the connection stays open, silent).
        if *is_frozen.borrow() {
            held.send_modify(|h| *h += n as u64);
        }
        if is_frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Some(count) = &count {
            count.send_modify(|c| *c += n as u64);
        }
    }
}

/// Review M6: a host that closes the connection (rather than going silent) is noticed with no
/// call in flight; a call on the dead link is refused at once, and the pool dials again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m6_a_host_that_closes_the_connection_marks_it_dead_and_the_next_get_redials() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    let (relay, host, opts) = through_relay(&env).await;
    let pool = Pool::new(Arc::new(Dialer::new(opts)));
    let cx = OpCtx::background();
    let conn = pool.get(&cx, &host).await.expect("a connection through the relay");
    conn.call(&cx, "ConnectGetLibVersion", RPC_BUDGET, |c| c.lib_version())
        .await
        .unwrap();
    relay.cut();
    tokio::time::timeout(Duration::from_secs(30), conn.link().dead())
        .await
        .expect("the closed connection was marked dead");
    let refused = conn
        .call(&cx, "ConnectGetHostname", RPC_BUDGET, |c| c.hostname())
        .await
        .unwrap_err();
    assert!(matches!(refused, CallError::Closed { .. }), "{refused}");
    let fresh = pool.get(&cx, &host).await.expect("a redial");
    assert!(!Arc::ptr_eq(&conn, &fresh), "the dead connection was replaced");
    fresh
        .call(&cx, "ConnectGetHostname", RPC_BUDGET, |c| c.hostname())
        .await
        .unwrap();
}

/// A libvirtd restart between calls: the daemon closing its end of the libvirt channel marks
/// the link dead at once (the SSH session itself is fine), so the next call redials instead of
/// failing first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_libvirtd_restart_between_calls_is_noticed_and_the_next_call_redials() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    let pool = Pool::new(Arc::new(Dialer::new(options(&env))));
    let (cx, host) = (OpCtx::background(), target(&env));
    let conn = pool.get(&cx, &host).await.expect("a connection");
    conn.call(&cx, "ConnectGetLibVersion", RPC_BUDGET, |c| c.lib_version())
        .await
        .unwrap();
    egress_testkit::restart_libvirtd(&HypervisorEnv::file().with_file_name("libvirtd.conf"));
    tokio::time::timeout(Duration::from_secs(30), conn.link().dead())
        .await
        .expect("the restart was noticed without a call");
    let reason = conn.link().reason().unwrap();
    assert!(reason.contains("libvirt closed its end"), "{reason}");
    let fresh = pool.get(&cx, &host).await.expect("a redial");
    assert!(!Arc::ptr_eq(&conn, &fresh));
    fresh
        .call(&cx, "ConnectGetHostname", RPC_BUDGET, |c| c.hostname())
        .await
        .expect("the first call after the restart");
}

/// Review L1: a keepalive interval of zero means the default (15 s), not a timer that fires
/// without pause. Watched through the relay: over an idle stretch the client sends nothing (a
/// zero period would send probes back to back, thousands in this window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l1_a_zero_keepalive_interval_means_the_default() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    let (relay, host, mut opts) = through_relay(&env).await;
    opts.keepalive = Duration::ZERO;
    let cx = OpCtx::background();
    let conn = Dialer::new(opts).dial(&cx, &host).await.expect("a connection");
    conn.call(&cx, "ConnectGetHostname", RPC_BUDGET, |c| c.hostname())
        .await
        .expect("a call on a zero-keepalive link");
    let before = *relay.forwarded.borrow();
    // The observation window, not a synchronisation: nothing is expected to happen in it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sent = *relay.forwarded.borrow() - before;
    assert!(sent < 1024, "{sent} bytes sent to an idle host in 2 s");
    assert!(!conn.is_dead(), "{:?}", conn.link().reason());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_host_ends_the_call_at_its_budget_and_the_next_call_redials() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    let (relay, host, opts) = through_relay(&env).await;
    let pool = Pool::new(Arc::new(Dialer::new(opts)));
    let cx = OpCtx::background();
    let conn = pool.get(&cx, &host).await.expect("a connection through the relay");
    conn.call(&cx, "ConnectGetLibVersion", RPC_BUDGET, |c| c.lib_version())
        .await
        .unwrap();

    relay.freeze(true);
    let budget = Duration::from_millis(500);
    let stalled = conn
        .call(&cx, "ConnectGetHostname", budget, |c| c.hostname())
        .await
        .unwrap_err();
    assert!(matches!(stalled, CallError::OverBudget { .. }), "{stalled}");
    assert!(stalled.is_transport());
    assert!(conn.is_dead(), "an overlong call kills the connection");
    let refused = conn
        .call(&cx, "ConnectGetHostname", RPC_BUDGET, |c| c.hostname())
        .await
        .unwrap_err();
    assert!(matches!(refused, CallError::Closed { .. }), "{refused}");

    relay.freeze(false);
    let fresh = pool.get(&cx, &host).await.expect("a redial");
    assert!(!Arc::ptr_eq(&conn, &fresh), "the dead connection was replaced");
    let name = fresh
        .call(&cx, "ConnectGetHostname", RPC_BUDGET, |c| c.hostname())
        .await
        .unwrap();
    assert!(!name.is_empty());
}

/// Uploads 64 MiB to a fresh volume over a connection dialled with `opts` (adjusted by
/// `adjust`) through a relay that freezes once 8 MiB have passed, with the upload's `budget`.
/// Returns the upload's error once the blocked C call has returned, after checking that the
/// connection is dead and deleting the volume over a new one.
async fn upload_through_a_freeze(
    env: &HypervisorEnv,
    adjust: impl FnOnce(&mut DialOptions),
    budget: Duration,
) -> CallError {
    let (relay, host, mut opts) = through_relay(env).await;
    adjust(&mut opts);
    let pool = Pool::new(Arc::new(Dialer::new(opts)));
    let cx = OpCtx::background();
    let conn = pool.get(&cx, &host).await.expect("a connection through the relay");
    const LEN: u64 = 64 << 20;
    let pool_name = env.pool.clone();
    let volume = format!("egress-test-{}-stall.raw", std::process::id());
    let (p, v) = (pool_name.clone(), volume.clone());
    conn.call(&cx, "StorageVolCreateXML", RPC_BUDGET, move |c| {
        let pool = c.lookup_storage_pool_by_name(&p)?;
        let xml = format!(
            "<volume type='file'><name>{v}</name><capacity unit='bytes'>{LEN}</capacity><target><format type='raw'/></target></volume>"
        );
        virt::storage_vol::StorageVol::create_xml(&pool, &xml, 0).map(drop)
    })
    .await
    .unwrap();

    // The C call reports here when it has returned, whatever it returned.
    let (returned_tx, returned_rx) = tokio::sync::oneshot::channel::<()>();
    let (p, v) = (pool_name.clone(), volume.clone());
    let upload = conn.call(&cx, "StorageVolUpload", budget, move |c| {
        let result = (|| {
            let vol = c.lookup_storage_pool_by_name(&p)?.lookup_storage_vol_by_name(&v)?;
            let stream = virt::stream::Stream::new(c, 0)?;
            vol.upload(&stream, 0, LEN, 0)?;
            let chunk = vec![1u8; 256 << 10];
            for _ in 0..(LEN / chunk.len() as u64) {
                stream.send(&chunk)?;
            }
            stream.finish()
        })();
        let _ = returned_tx.send(());
        result
    });
    let freeze = async {
        // Freeze once the transfer is well under way.
        Relay::reached(&relay.forwarded, 8 << 20).await;
        relay.freeze(true);
    };
    let (result, ()) = tokio::join!(upload, freeze);
    let err = result.expect_err("the stalled upload must fail");
    assert!(conn.is_dead(), "{err}");
    // Tearing the transport down unblocked libvirt's C call.
    tokio::time::timeout(Duration::from_secs(30), returned_rx)
        .await
        .expect("the blocked C call returned after the teardown")
        .unwrap();

    relay.freeze(false);
    let fresh = pool.get(&cx, &host).await.expect("a redial");
    let v = volume.clone();
    fresh
        .call(&cx, "StorageVolDelete", RPC_BUDGET, move |c| {
            c.lookup_storage_pool_by_name(&pool_name)?
                .lookup_storage_vol_by_name(&v)?
                .delete(0)
        })
        .await
        .expect("the next call, over a new connection");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_stalls_mid_upload_ends_the_call_at_its_budget_and_unblocks_libvirt() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    // A budget well inside the default stall limit: the budget ends it.
    let err = upload_through_a_freeze(&env, |_| {}, Duration::from_secs(5)).await;
    assert!(matches!(err, CallError::OverBudget { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_takes_no_byte_mid_upload_is_taken_for_dead_at_the_stall_limit() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    // The whole transfer budget (20 minutes) for the upload, a short stall limit: the frozen
    // host is noticed by the write-progress deadline, and the call fails as a transport error
    // saying why, long before its budget.
    let err = upload_through_a_freeze(
        &env,
        |opts| opts.stall_limit = Duration::from_secs(3),
        egress_libvirt_ssh::TRANSFER_BUDGET,
    )
    .await;
    assert!(matches!(err, CallError::ClosedWhileWaiting { .. }), "{err}");
    assert!(err.is_transport(), "{err}");
    assert!(err.to_string().contains("the host accepted no byte for 3 s"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_notices_a_silent_peer_without_any_call() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    let (relay, host, mut opts) = through_relay(&env).await;
    opts.keepalive = Duration::from_millis(300);
    let conn = Dialer::new(opts)
        .dial(&OpCtx::background(), &host)
        .await
        .expect("a connection");
    assert!(!conn.is_dead());
    relay.freeze(true);
    // Bounded wait for the signal; no sleep decides the outcome.
    tokio::time::timeout(Duration::from_secs(30), conn.link().dead())
        .await
        .expect("keepalive marked the silent connection dead");
    let reason = conn.link().reason().unwrap();
    assert!(reason.contains("ssh"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_caller_abandons_the_call_and_the_dial() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = hypervisor() else { return };
    let (relay, host, opts) = through_relay(&env).await;
    let dialer = Dialer::new(opts);
    let conn = dialer.dial(&OpCtx::background(), &host).await.unwrap();
    relay.freeze(true);
    let token = egress_provider::CancellationToken::new();
    let cx = OpCtx::with_cancel(token.clone());
    let call = conn.call(&cx, "ConnectGetHostname", RPC_BUDGET, |c| c.hostname());
    let cancel = async {
        // Once the call's request is stuck in the frozen relay, the caller gives up.
        Relay::reached(&relay.held, 1).await;
        token.cancel();
    };
    let (result, ()) = tokio::join!(call, cancel);
    assert!(matches!(result, Err(CallError::Abandoned { .. })), "{result:?}");
    assert!(conn.is_dead());

    // A dial through a frozen relay ends with the caller too.
    let token = egress_provider::CancellationToken::new();
    token.cancel();
    let e = match dialer.dial(&OpCtx::with_cancel(token), &host).await {
        Ok(_) => panic!("a cancelled dial succeeded"),
        Err(e) => e,
    };
    assert!(e.is_timeout(), "{e}");
}
