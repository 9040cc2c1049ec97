//! The dial against an in-process russh server whose host key and authorized key the test
//! chooses: an unknown and a changed host key, a refused key, a missing and an unparsable key
//! file, and a host that refuses the libvirt channel. No hypervisor is needed: these run
//! everywhere. (The same failures against the real OpenSSH sshd, and the faults that need
//! libvirt behind the channel, are in real_host.rs.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use egress_libvirt_ssh::{DialCause, DialError, DialOptions, Dialer, HostKeys, HostTarget, Stage};
use egress_provider::OpCtx;
use russh::keys::PublicKey;
use russh::server::{Auth, VerifiedPublicKey};

/// A fresh ed25519 key pair made by ssh-keygen (`<path>` and `<path>.pub`).
fn new_key(dir: &Path, name: &str) -> PathBuf {
    new_key_of(dir, name, "ed25519")
}

/// A fresh key pair of type `kind` (`ed25519`, `ecdsa`...) made by ssh-keygen.
fn new_key_of(dir: &Path, name: &str, kind: &str) -> PathBuf {
    let path = dir.join(name);
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", kind, "-N", "", "-f"])
        .arg(&path)
        .status()
        .expect("ssh-keygen (package openssh-client, which cargo xtask test installs)");
    assert!(status.success());
    path
}

fn public(path: &Path) -> String {
    std::fs::read_to_string(path.with_extension("pub"))
        .unwrap()
        .trim()
        .to_owned()
}

/// The private key in the file at `path`, read as the dial reads its key (which also takes
/// the P-256 keys russh alone refuses).
fn read_private_key(path: &Path) -> russh::keys::PrivateKey {
    egress_libvirt_ssh::decode_private_key(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Accepts exactly one client key; refuses every channel.
#[derive(Clone)]
struct Server {
    authorized: PublicKey,
}

impl russh::server::Handler for Server {
    type Error = russh::Error;

    async fn auth_publickey(&mut self, _user: &str, key: VerifiedPublicKey<'_>) -> Result<Auth, Self::Error> {
        Ok(if key.public_key.key_data() == self.authorized.key_data() {
            Auth::Accept
        } else {
            Auth::reject()
        })
    }
}

/// Starts the server with `host_key`, accepting `client_key`; returns its `127.0.0.1:port`.
async fn serve(host_key: &Path, client_key: &Path) -> String {
    serve_keys(&[host_key], client_key).await
}

/// Starts the server with every key of `host_keys` (in its order of preference).
async fn serve_keys(host_keys: &[&Path], client_key: &Path) -> String {
    let keys = host_keys.iter().map(|k| read_private_key(k)).collect();
    let authorized = read_private_key(client_key).public_key().clone();
    let config = Arc::new(russh::server::Config {
        keys,
        auth_rejection_time: Duration::from_millis(10),
        auth_rejection_time_initial: Some(Duration::ZERO),
        ..russh::server::Config::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = Server { authorized };
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (config, handler) = (config.clone(), server.clone());
            tokio::spawn(async move {
                if let Ok(session) = russh::server::run_stream(config, stream, handler).await {
                    let _ = session.await;
                }
            });
        }
    });
    address
}

/// A port that accepts connections and never says a word (the SSH banner never comes); abort
/// the task to close it.
async fn silent_port() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            kept.push(s);
        }
    });
    (address, held)
}

/// A server with fresh keys in `dir`: the client key it accepts, a key it does not,
/// its address, and a known_hosts naming it.
struct Served {
    client: PathBuf,
    stranger: PathBuf,
    address: String,
    known: PathBuf,
}

async fn served(dir: &Path) -> Served {
    let (host_key, client, stranger) = (new_key(dir, "host"), new_key(dir, "client"), new_key(dir, "stranger"));
    let address = serve(&host_key, &client).await;
    let known = known_hosts(dir, "known", &address, &host_key);
    Served {
        client,
        stranger,
        address,
        known,
    }
}

fn host(address: &str) -> HostTarget {
    HostTarget {
        name: "russh".to_owned(),
        address: address.to_owned(),
        user: "tester".to_owned(),
        socket: "/run/libvirt/libvirt-sock".to_owned(),
    }
}

async fn dial(key: &Path, host_keys: HostKeys, address: &str) -> DialError {
    match Dialer::new(DialOptions::new(key, host_keys))
        .dial(&OpCtx::background(), &host(address))
        .await
    {
        Ok(_) => panic!("the dial should have failed"),
        Err(e) => e,
    }
}

/// A known_hosts file naming `address` with the public key of `key`.
fn known_hosts(dir: &Path, file: &str, address: &str, key: &Path) -> PathBuf {
    let (h, port) = address.rsplit_once(':').unwrap();
    let path = dir.join(file);
    std::fs::write(&path, format!("[{h}]:{port} {}\n", public(key))).unwrap();
    path
}

/// About one P-256 key in 256 has a scalar OpenSSH writes in 31 bytes, which russh's parser
/// alone refuses (this test's `ssh-keygen` keys once failed that way, one run in 256): such a
/// key works as the dial's key and as a host key pinned in known_hosts.
#[tokio::test]
async fn a_p256_key_whose_scalar_is_written_in_31_bytes_works_as_client_and_host_key() {
    let dir = egress_testkit::scratch_dir("russh-test-short-scalar");
    // Copied out of the checkout, readable by its owner only: a key others may read is refused.
    let short = dir.join("ecdsa-p256-short-scalar");
    let keys = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/keys");
    std::fs::copy(keys.join("ecdsa-p256-short-scalar"), &short).unwrap();
    std::fs::copy(keys.join("ecdsa-p256-short-scalar.pub"), short.with_extension("pub")).unwrap();
    std::fs::set_permissions(&short, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (host_key, client) = (new_key(&dir, "host"), new_key(&dir, "client"));

    let address = serve(&host_key, &short).await;
    let known = known_hosts(&dir, "as-client", &address, &host_key);
    let e = dial(&short, HostKeys::KnownHosts(known), &address).await;
    // Past SSH (the key signed, the server took it): the channel is where this server says no.
    assert_eq!(e.stage, Stage::Socket, "{e}");

    let address = serve(&short, &client).await;
    let known = known_hosts(&dir, "as-host", &address, &short);
    let e = dial(&client, HostKeys::KnownHosts(known), &address).await;
    assert_eq!(e.stage, Stage::Socket, "{e}");
}

#[tokio::test]
async fn l3_a_pin_of_another_key_type_than_the_servers_first_still_works() {
    let dir = egress_testkit::scratch_dir("russh-test-pin-type");
    let (ed25519, ecdsa, client) = (
        new_key(&dir, "host-ed25519"),
        new_key_of(&dir, "host-ecdsa", "ecdsa"),
        new_key(&dir, "client"),
    );
    // The server holds both; known_hosts pins only its ECDSA key.
    let address = serve_keys(&[&ed25519, &ecdsa], &client).await;
    let pinned = known_hosts(&dir, "pinned", &address, &ecdsa);
    let e = dial(&client, HostKeys::KnownHosts(pinned), &address).await;
    // Past SSH: the channel is where this server says no.
    assert_eq!(e.stage, Stage::Socket, "{e}");
}

#[tokio::test]
async fn l2_a_revoked_host_key_is_refused_even_where_it_is_pinned() {
    let dir = egress_testkit::scratch_dir("russh-test-revoked");
    let (host_key, client) = (new_key(&dir, "host"), new_key(&dir, "client"));
    let address = serve(&host_key, &client).await;
    let (h, port) = address.rsplit_once(':').unwrap();
    let path = dir.join("revoked");
    let key = public(&host_key);
    std::fs::write(&path, format!("[{h}]:{port} {key}\n@revoked * {key}\n")).unwrap();
    let e = dial(&client, HostKeys::KnownHosts(path), &address).await;
    assert!(matches!(e.cause, DialCause::HostKeyRevoked { line: 2, .. }), "{e}");
    assert!(e.is_host_key_error(), "{e}");
    assert_eq!(e.stage, Stage::Ssh);
}

#[tokio::test]
async fn host_keys_are_checked_against_known_hosts() {
    let dir = egress_testkit::scratch_dir("russh-test-hostkeys");
    let (host_key, other, client) = (new_key(&dir, "host"), new_key(&dir, "other"), new_key(&dir, "client"));
    let address = serve(&host_key, &client).await;

    let empty = dir.join("empty");
    std::fs::write(&empty, "").unwrap();
    let e = dial(&client, HostKeys::KnownHosts(empty), &address).await;
    assert!(
        matches!(&e.cause, DialCause::HostKeyUnknown { host } if host.starts_with("[127.0.0.1]:")),
        "{e}"
    );
    assert_eq!(e.stage, Stage::Ssh);
    assert!(e.is_host_key_error());

    let changed = known_hosts(&dir, "changed", &address, &other);
    let e = dial(&client, HostKeys::KnownHosts(changed), &address).await;
    assert!(matches!(e.cause, DialCause::HostKeyChanged { line: 1, .. }), "{e}");

    // The right key: the dial gets past SSH and stops at the channel, which this server refuses.
    let right = known_hosts(&dir, "right", &address, &host_key);
    let e = dial(&client, HostKeys::KnownHosts(right), &address).await;
    assert_eq!(e.stage, Stage::Socket, "{e}");
    assert!(matches!(e.cause, DialCause::ChannelRejected { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("dialing host russh (socket): opening /run/libvirt/libvirt-sock: "),
        "{e}"
    );

    // Two keys of one type for the host (a rotation): the matching one is accepted, wherever it is.
    let rotation = dir.join("rotation");
    let (h, port) = address.rsplit_once(':').unwrap();
    std::fs::write(
        &rotation,
        format!("[{h}]:{port} {}\n[{h}]:{port} {}\n", public(&other), public(&host_key)),
    )
    .unwrap();
    let e = dial(&client, HostKeys::KnownHosts(rotation), &address).await;
    assert_eq!(e.stage, Stage::Socket, "{e}");

    // Accepting any key skips the check only.
    let e = dial(&client, HostKeys::AcceptAny, &address).await;
    assert_eq!(e.stage, Stage::Socket, "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A known_hosts that is not a regular file (a pipe nobody writes to, a directory) is refused
/// before anything reads it, where reading would never end; one beyond 4 MiB is refused unread.
#[tokio::test]
async fn a_known_hosts_that_would_never_end_or_is_too_large_is_refused() {
    let dir = egress_testkit::scratch_dir("russh-test-hostkeys-odd");
    let (host_key, client) = (new_key(&dir, "host"), new_key(&dir, "client"));
    let address = serve(&host_key, &client).await;

    let pipe = dir.join("pipe");
    egress_testkit::make_fifo(&pipe);
    for odd in [pipe, dir.clone()] {
        let e = dial(&client, HostKeys::KnownHosts(odd.clone()), &address).await;
        assert!(matches!(e.cause, DialCause::KnownHostsRead { .. }), "{e}");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert_eq!(e.stage, Stage::Credentials, "{e}");
    }

    // The right entry, past 4 MiB of comments.
    let large = dir.join("large");
    let (h, port) = address.rsplit_once(':').unwrap();
    let padding = "# padding\n".repeat(420 * 1024);
    std::fs::write(&large, format!("{padding}[{h}]:{port} {}\n", public(&host_key))).unwrap();
    let e = dial(&client, HostKeys::KnownHosts(large), &address).await;
    assert!(matches!(e.cause, DialCause::KnownHostsParse { .. }), "{e}");
    assert!(e.to_string().contains("larger than 4 MiB"), "{e}");
    assert!(e.is_host_key_error(), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_refused_missing_or_unparsable_key_says_so() {
    let dir = egress_testkit::scratch_dir("russh-test-keys");
    let Served {
        client,
        stranger,
        address,
        known,
    } = served(&dir).await;

    let e = dial(&stranger, HostKeys::KnownHosts(known.clone()), &address).await;
    assert!(e.is_auth_error() && e.stage == Stage::Ssh, "{e}");
    assert_eq!(
        e.to_string(),
        "dialing host russh (ssh): ssh: unable to authenticate as tester: the server refused the key"
    );

    let missing = dir.join("missing");
    let e = dial(&missing, HostKeys::KnownHosts(known.clone()), &address).await;
    assert!(
        matches!(e.cause, DialCause::KeyRead { .. }) && e.stage == Stage::Credentials,
        "{e}"
    );
    assert!(e.to_string().contains(&missing.display().to_string()), "{e}");

    // The classic mistake: the public key where the private one belongs.
    let e = dial(
        &client.with_extension("pub"),
        HostKeys::KnownHosts(known.clone()),
        &address,
    )
    .await;
    assert!(matches!(e.cause, DialCause::KeyParse { .. }) && e.is_key_error(), "{e}");
    assert!(
        !e.to_string().contains(&public(&client)[12..40]),
        "the key's content leaked: {e}"
    );

    // A file far larger than any key is refused after 64 KiB; one that never ends (a device)
    // or a pipe nobody writes to is refused unread, as no regular file.
    let huge = dir.join("huge");
    std::fs::write(&huge, vec![b'A'; 64 * 1024 + 1]).unwrap();
    let e = dial(&huge, HostKeys::KnownHosts(known.clone()), &address).await;
    assert!(matches!(e.cause, DialCause::KeyParse { .. }) && e.is_key_error(), "{e}");
    assert!(e.to_string().contains("larger than 64 KiB"), "{e}");
    let pipe = dir.join("pipe");
    egress_testkit::make_fifo(&pipe);
    for endless in [Path::new("/dev/zero"), pipe.as_path()] {
        let e = dial(endless, HostKeys::KnownHosts(known.clone()), &address).await;
        assert!(matches!(e.cause, DialCause::KeyParse { .. }) && e.is_key_error(), "{e}");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
    let binary = dir.join("binary");
    std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
    let e = dial(&binary, HostKeys::KnownHosts(known.clone()), &address).await;
    assert!(matches!(e.cause, DialCause::KeyParse { .. }), "{e}");

    let garbage = dir.join("garbage");
    std::fs::write(&garbage, "not a key at all\n").unwrap();
    let e = dial(&garbage, HostKeys::KnownHosts(known.clone()), &address).await;
    assert!(matches!(e.cause, DialCause::KeyParse { .. }), "{e}");

    // The right key, readable by others: refused as exposed, naming the file; readable by its
    // group only (a Secret volume's 0440 with the Pod's fsGroup), it is used.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&client, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = dial(&client, HostKeys::KnownHosts(known.clone()), &address).await;
    assert!(
        matches!(e.cause, DialCause::KeyExposed { mode: 0o644, .. }) && e.is_key_error(),
        "{e}"
    );
    assert!(e.to_string().contains(&client.display().to_string()), "{e}");
    assert!(e.to_string().contains("may be read by others (mode 644)"), "{e}");
    std::fs::set_permissions(&client, std::fs::Permissions::from_mode(0o440)).unwrap();
    let e = dial(&client, HostKeys::KnownHosts(known), &address).await;
    // Past SSH (the key signed, the server took it): the channel is where this server says no.
    assert_eq!(e.stage, Stage::Socket, "a key its group may read is used: {e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_silent_port_ends_the_dial_at_its_budget() {
    let (address, held) = silent_port().await;
    let dir = egress_testkit::scratch_dir("russh-test-silent");
    let client = new_key(&dir, "client");
    let mut options = DialOptions::new(&client, HostKeys::AcceptAny);
    options.budget = Duration::from_millis(300);
    let e = match Dialer::new(options).dial(&OpCtx::background(), &host(&address)).await {
        Ok(_) => panic!("a silent server cannot be dialled"),
        Err(e) => e,
    };
    assert!(e.is_timeout() && e.stage == Stage::Ssh, "{e}");
    held.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_key_file_is_read_again_when_it_changes_unless_kept() {
    let dir = egress_testkit::scratch_dir("russh-test-reread");
    let Served {
        client,
        stranger,
        address,
        known,
    } = served(&dir).await;
    let key = dir.join("id");
    std::fs::copy(&client, &key).unwrap();
    for reread in [true, false] {
        std::fs::copy(&client, &key).unwrap();
        let mut options = DialOptions::new(&key, HostKeys::KnownHosts(known.clone()));
        options.reread_material = reread;
        let dialer = Dialer::new(options);
        let stage = |r: Result<_, DialError>| match r {
            Ok(_) => panic!("this server refuses every channel"),
            Err(e) => e.stage,
        };
        // Authenticated: the dial stops at the channel.
        assert_eq!(
            stage(dialer.dial(&OpCtx::background(), &host(&address)).await),
            Stage::Socket
        );
        if reread {
            // Review L19: an unchanged file is not read again. Garbage of the same length is
            // written in place and the modification time put back: the same file as far as
            // its stamp tells, so the parsed key is still used.
            let original = std::fs::metadata(&key).unwrap().modified().unwrap();
            let len = std::fs::metadata(&key).unwrap().len();
            let file = std::fs::OpenOptions::new().write(true).open(&key).unwrap();
            std::io::Write::write_all(&mut &file, &vec![b'x'; usize::try_from(len).unwrap()]).unwrap();
            file.set_modified(original).unwrap();
            drop(file);
            assert_eq!(
                stage(dialer.dial(&OpCtx::background(), &host(&address)).await),
                Stage::Socket,
                "an unchanged key file must not be parsed again"
            );
        }
        // The Secret is rotated to a key the server does not accept: a new file renamed over
        // the old, as the kubelet swaps a Secret's files.
        let next = dir.join("id.next");
        std::fs::copy(&stranger, &next).unwrap();
        std::fs::rename(&next, &key).unwrap();
        let after = stage(dialer.dial(&OpCtx::background(), &host(&address)).await);
        if reread {
            assert_eq!(after, Stage::Ssh, "a re-read key must be the new one");
        } else {
            assert_eq!(after, Stage::Socket, "a kept key must still be the first one");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_refused_port_is_a_network_error_at_the_tcp_stage() {
    // A port nobody listens on (held refusing until the test ends).
    let dead = egress_testkit::dead_address().await;
    let address = dead.to_string();
    let dir = egress_testkit::scratch_dir("russh-test-refused");
    let client = new_key(&dir, "client");
    let e = dial(&client, HostKeys::AcceptAny, &address).await;
    assert_eq!(e.stage, Stage::Tcp, "{e}");
    assert!(
        matches!(&e.cause, DialCause::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn waiting_for_a_host_slot_ends_with_the_caller() {
    // A host whose dial hangs (silent port) holds its slot; a second caller gives up when its
    // context ends, without dialling.
    let (address, held) = silent_port().await;
    let dir = egress_testkit::scratch_dir("russh-test-slot");
    let client = new_key(&dir, "client");
    let mut options = DialOptions::new(&client, HostKeys::AcceptAny);
    options.budget = Duration::from_secs(20);
    let pool = egress_libvirt_ssh::Pool::new(Arc::new(Dialer::new(options)));
    let target = host(&address);
    let first_cancel = egress_provider::CancellationToken::new();
    let first_cx = OpCtx::with_cancel(first_cancel.clone());
    let first = pool.get(&first_cx, &target);
    let second = async {
        // Once the first holds the slot (its dial is under way), the second waits and gives up.
        tokio::task::yield_now().await;
        let token = egress_provider::CancellationToken::new();
        let cx = OpCtx::with_cancel(token.clone());
        let waiting = pool.get(&cx, &target);
        tokio::pin!(waiting);
        // Not done while the slot is held...
        assert!(futures::poll!(&mut waiting).is_pending());
        token.cancel();
        let e = match waiting.await {
            Ok(_) => panic!("a cancelled wait returned a connection"),
            Err(e) => e,
        };
        first_cancel.cancel();
        e
    };
    let (first, second) = tokio::join!(first, second);
    assert!(second.is_timeout(), "{second}");
    assert!(
        second.to_string().contains("waiting for the connection to host russh"),
        "{second}"
    );
    assert!(first.is_err_and(|e| e.is_timeout()));
    held.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_seam_says_what_stopped_a_connection() {
    use egress_libvirt::host::{DialFailure, Host};
    let dir = egress_testkit::scratch_dir("russh-test-seam-dial");
    let Served {
        client,
        stranger,
        address,
        known,
    } = served(&dir).await;
    let empty = dir.join("empty");
    std::fs::write(&empty, "").unwrap();
    let bad_known = dir.join("bad_known");
    let (h, port) = address.rsplit_once(':').unwrap();
    std::fs::write(&bad_known, format!("[{h}]:{port} ssh-ed25519 !!!not-base64!!!\n")).unwrap();
    let dead = egress_testkit::dead_address().await;
    let refused = dead.to_string();
    let cases = [
        (
            dir.join("missing"),
            HostKeys::KnownHosts(known.clone()),
            address.clone(),
            DialFailure::KeyUnreadable,
        ),
        (
            client.with_extension("pub"),
            HostKeys::KnownHosts(known.clone()),
            address.clone(),
            DialFailure::KeyInvalid,
        ),
        (
            client.clone(),
            HostKeys::KnownHosts(dir.join("nope")),
            address.clone(),
            DialFailure::KnownHostsUnreadable,
        ),
        (
            client.clone(),
            HostKeys::KnownHosts(empty),
            address.clone(),
            DialFailure::HostKey,
        ),
        (
            client.clone(),
            HostKeys::KnownHosts(bad_known),
            address.clone(),
            DialFailure::KnownHostsInvalid,
        ),
        (
            stranger,
            HostKeys::KnownHosts(known.clone()),
            address.clone(),
            DialFailure::Auth,
        ),
        (
            client.clone(),
            HostKeys::KnownHosts(known.clone()),
            address.clone(),
            DialFailure::Socket,
        ),
        (client.clone(), HostKeys::AcceptAny, refused, DialFailure::Network),
    ];
    for (key, host_keys, addr, want) in cases {
        let pool = Arc::new(egress_libvirt_ssh::Pool::new(Arc::new(Dialer::new(DialOptions::new(
            &key, host_keys,
        )))));
        let remote = egress_libvirt_ssh::RemoteHost::new(host(&addr), pool);
        let e = remote.version(&OpCtx::background()).await.expect_err("no connection");
        assert_eq!(e.dial, Some(want), "{e}");
        assert!(e.transport, "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn l17_a_silent_host_under_a_short_round_is_unreachable_not_a_timeout() {
    use egress_libvirt::host::{DialFailure, Host as _};
    let (address, held) = silent_port().await;
    let dir = egress_testkit::scratch_dir("russh-test-l17");
    let client = new_key(&dir, "client");
    // The dial's own budget (10 s) is longer than the round's: it shrinks to end inside it.
    let options = DialOptions::new(&client, HostKeys::AcceptAny);
    let round = || OpCtx::background().with_timeout(Duration::from_millis(500));
    let e = match Dialer::new(options.clone()).dial(&round(), &host(&address)).await {
        Ok(_) => panic!("a silent server cannot be dialled"),
        Err(e) => e,
    };
    assert!(matches!(e.cause, DialCause::Budget(_)), "{e}");
    // Through the seam and the check: the host is unreachable, the round did not time out.
    let pool = Arc::new(egress_libvirt_ssh::Pool::new(Arc::new(Dialer::new(options))));
    let remote = egress_libvirt_ssh::RemoteHost::new(host(&address), pool);
    let e = remote.version(&round()).await.expect_err("no connection");
    assert_eq!((e.dial, e.timed_out), (Some(DialFailure::Timeout), false), "{e}");
    let status = egress_libvirt::engine::check::check_host(&round(), &remote, &address, "tester", "default").await;
    assert_eq!(status.reason, egress_provider::REASON_UNREACHABLE, "{status:?}");
    held.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
