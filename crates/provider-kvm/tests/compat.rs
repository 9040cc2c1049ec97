//! Compatibility with the Go operator's `kvm` provider: a domain and its volumes laid down the
//! way it wrote them (documents written out literally here, as Go's encoder produced them, not
//! by this workspace's builders: the `.../kvm` metadata namespace, the compact domain document
//! with `<clock>` and `<boot>`, `<name>.qcow2` backed by `base-<key>.qcow2` with its `.sha256`
//! marker uploaded to the stream's end, `<name>-seed.iso`) are read, listed, adopted without a
//! change, marked for an installation in Go's namespace, and deleted by this provider; a new
//! Proxy reuses the cached base without a download; the base stays. Over the libvirt fake, and
//! against the local hypervisor with a guest that really boots from them.

use egress_libvirt::testing as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_libvirt::config::{KvmConfig, KvmImage};
use egress_libvirt::engine::Generation;
use egress_libvirt::fake::GoKvmDomain;
use egress_libvirt::host::Host;
use egress_libvirt::seed::{seed_iso, vendor_data};
use egress_libvirt::{HypervisorEnv, KVM_NAMESPACE};
use egress_provider::config::ProviderConfig;
use egress_provider::{InstanceState, OpCtx, Provider, ProviderId, name_from_uid};
use support::{FakeBackend, POOL, request_in};

/// The image key the Go operator cached under (`base-go-image.qcow2`).
const GO_KEY: &str = "go-image";
/// The creation time the Go operator wrote.
const GO_CREATED: &str = "2026-09-16T12:00:00Z";

/// A volume document as Go's encoder wrote it (compact, empty elements as start/end pairs).
fn go_volume(name: &str, capacity: usize, format: &str, backing: Option<&str>) -> String {
    let backing = backing.map_or_else(String::new, |path| {
        format!("<backingStore><path>{path}</path><format type=\"qcow2\"></format></backingStore>")
    });
    format!(
        "<volume type=\"file\"><name>{name}</name><capacity unit=\"bytes\">{capacity}</capacity><target><format type=\"{format}\"></format></target>{backing}</volume>"
    )
}

/// What the Go kvm provider left on `host`: the cached base of [`GO_KEY`] (replaced, so this
/// run's is the one used) and a running domain of Proxy `uid` on it. Returns the domain's name.
async fn lay_down(host: &dyn Host, pool: &str, uid: &str, image: &[u8], bridge: &str, domain_type: &str) -> String {
    let cx = OpCtx::background();
    let name = name_from_uid(uid);
    let (base, marker) = (
        "base-go-image.qcow2".to_owned(),
        "base-go-image.qcow2.sha256".to_owned(),
    );
    for v in [&marker, &base] {
        let _ = host.delete_volume(&cx, pool, v).await;
    }
    host.create_volume(&cx, pool, &go_volume(&base, image.len(), "qcow2", None))
        .await
        .unwrap();
    host.upload(
        &cx,
        pool,
        &base,
        image.len() as u64,
        Box::new(std::io::Cursor::new(image.to_vec())),
    )
    .await
    .unwrap();
    host.refresh_pool(&cx, pool).await.unwrap();
    host.create_volume(&cx, pool, &go_volume(&marker, 64, "raw", None))
        .await
        .unwrap();
    // Go uploaded the marker with length 0: to the stream's end.
    let digest = support::sha256_hex(image);
    host.upload(
        &cx,
        pool,
        &marker,
        0,
        Box::new(std::io::Cursor::new(digest.into_bytes())),
    )
    .await
    .unwrap();
    let base_path = host.volume_path(&cx, pool, &base).await.unwrap();
    let overlay = format!("{name}.qcow2");
    host.create_volume(&cx, pool, &go_volume(&overlay, 1 << 30, "qcow2", Some(&base_path)))
        .await
        .unwrap();
    let iso = seed_iso(&name, b"#cloud-config\n", &vendor_data(b"", true)).unwrap();
    let seed = format!("{name}-seed.iso");
    host.create_volume(&cx, pool, &go_volume(&seed, iso.len(), "raw", None))
        .await
        .unwrap();
    host.upload(&cx, pool, &seed, 0, Box::new(std::io::Cursor::new(iso)))
        .await
        .unwrap();
    let disk = host.volume_path(&cx, pool, &overlay).await.unwrap();
    let seed = host.volume_path(&cx, pool, &seed).await.unwrap();
    let domain = GoKvmDomain {
        name: &name,
        uid,
        created_at: GO_CREATED,
        disk: &disk,
        seed: &seed,
        bridge,
        domain_type,
    };
    host.define_domain(&cx, &domain.xml()).await.unwrap();
    host.start_domain(&cx, &name).await.unwrap();
    name
}

/// The provider's block: the Go image under its key, at `url`.
fn block(hosts: Vec<egress_libvirt::config::KvmHost>, url: &str, digest: &str, keys: (&str, &str)) -> KvmConfig {
    KvmConfig {
        ssh_key_file: keys.0.to_owned(),
        known_hosts_file: keys.1.to_owned(),
        disk_size_gb: 1,
        domain_type: Some("qemu".into()),
        images: [(
            GO_KEY.to_owned(),
            KvmImage {
                url: url.to_owned(),
                sha256: digest.to_owned(),
                ..KvmImage::default()
            },
        )]
        .into(),
        machine_types: [(
            "small".to_owned(),
            egress_libvirt::config::KvmMachineType {
                vcpus: 1,
                memory_mib: 256,
            },
        )]
        .into(),
        hosts,
        ..KvmConfig::default()
    }
}

/// What this provider does with it.
async fn exercise(
    p: &dyn Provider,
    kvm2: &dyn Provider,
    host: &dyn Host,
    pool: &str,
    uid: &str,
    name: &str,
    patience: Duration,
) {
    let cx = OpCtx::background();
    let id = ProviderId::new(format!("hosts/{}/domains/{name}", host.name()));
    // Read back: Running with an address once the guest has one; the UID and creation time
    // from Go's mark.
    let started = Instant::now();
    let running = loop {
        let got = p.get(&cx, &id).await.unwrap();
        if got.state == InstanceState::Running {
            break got;
        }
        assert!(started.elapsed() < patience, "not Running within {patience:?}: {got:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    assert_eq!(running.uid, uid);
    assert!(running.ip.is_some());
    let go_created = std::time::SystemTime::from(GO_CREATED.parse::<jiff::Timestamp>().unwrap());
    assert_eq!(running.created_at, Some(go_created));
    // Listed whole, as the first generation lists; not by a kvm2 provider.
    let listed = p.list_by_tag(&cx).await.unwrap();
    let mine: Vec<_> = listed.iter().filter(|i| i.id == id).collect();
    assert_eq!(mine.len(), 1, "{listed:?}");
    assert_eq!(
        (mine[0].uid.as_str(), mine[0].state, mine[0].created_at),
        (uid, InstanceState::Running, Some(go_created))
    );
    assert!(
        !kvm2.list_by_tag(&cx).await.unwrap().iter().any(|i| i.id == id),
        "a kvm2 provider listed a kvm domain"
    );
    // A create for its Proxy adopts it as it is: the same id, the same mark, nothing made.
    let volumes = host.volume_names(&cx, pool).await.unwrap();
    let mut req = request_in(uid, host.name());
    req.placement.image = GO_KEY.into();
    assert_eq!(p.create(&cx, &req).await.unwrap(), id);
    assert_eq!(host.volume_names(&cx, pool).await.unwrap(), volumes);
    assert_eq!(p.get(&cx, &id).await.unwrap().created_at, Some(go_created));
    // Marked for an installation: the mark gains the child in Go's namespace, its UID and
    // creation time kept; the domain keeps running; a second mark changes nothing.
    p.mark_installation(&cx, &id, "prod-eu").await.unwrap();
    let marked = p.get(&cx, &id).await.unwrap();
    assert_eq!(
        (
            marked.installation.as_deref(),
            marked.uid.as_str(),
            marked.created_at,
            marked.state
        ),
        (Some("prod-eu"), uid, Some(go_created), InstanceState::Running)
    );
    let element = host
        .domain_metadata(&cx, name, KVM_NAMESPACE)
        .await
        .unwrap()
        .expect("Go's mark");
    assert!(element.contains("prod-eu"), "{element}");
    p.mark_installation(&cx, &id, "prod-eu").await.unwrap();
    assert!(
        p.mark_installation(&cx, &id, "prod-us").await.unwrap_err().class() == egress_provider::ErrorClass::Permanent,
        "another installation's mark was replaced"
    );
    // A new Proxy on the same image uses Go's cached base (the image URL is never asked).
    let other = request_in(&format!("{uid}-new"), host.name());
    let other = egress_provider::CreateRequest {
        placement: egress_provider::Placement {
            image: GO_KEY.into(),
            ..other.placement
        },
        ..other
    };
    let other_id = p.create(&cx, &other).await.unwrap();
    p.delete(&cx, &other_id).await.unwrap();
    // Delete: the domain and its volumes go; the shared base and marker stay.
    p.delete(&cx, &id).await.unwrap();
    assert!(p.get(&cx, &id).await.unwrap_err().is_not_found());
    let left = host.volume_names(&cx, pool).await.unwrap();
    assert!(!left.iter().any(|v| v.starts_with(name)), "{left:?}");
    assert!(
        left.iter().any(|v| v == "base-go-image.qcow2") && left.iter().any(|v| v == "base-go-image.qcow2.sha256"),
        "{left:?}"
    );
}

#[tokio::test]
async fn a_go_kvm_domain_on_the_fake_is_read_listed_adopted_and_deleted() {
    let b = FakeBackend::new(Generation::Kvm).await;
    let host = &b.hosts[0];
    let uid = "4f9a6c1e-0b7d-4d2a-9e55-1c2b3d4e5f60";
    let image = support::image_bytes();
    let name = lay_down(host, POOL, uid, &image, "br0", "qemu").await;
    let keys = (
        b.files.path().join("id_ed25519").display().to_string(),
        b.files.path().join("known_hosts").display().to_string(),
    );
    let cfg = block(
        b.config(false).hosts,
        &b.server.url(),
        &support::sha256_hex(&image),
        (&keys.0, &keys.1),
    );
    let p = b.provider("kvm-home", cfg.clone()).unwrap();
    let kvm2 = FakeBackend {
        generation: Generation::Kvm2,
        ..b.clone()
    }
    .provider("kvm2-home", cfg)
    .unwrap();
    let calls_before = b.interceptor.call_log().len();
    exercise(&p, &kvm2, host, POOL, uid, &name, Duration::from_secs(10)).await;
    // Adoption made nothing: no definition, start or volume call other than the new Proxy's.
    assert_eq!(b.server.requests(), 0, "the Go image was fetched again");
    let adopted: Vec<_> = b.interceptor.call_log()[calls_before..]
        .iter()
        .filter(|c| {
            c.target == name
                && matches!(
                    c.kind.0,
                    "DomainDefineXML" | "DomainCreate" | "StorageVolCreateXML" | "StorageVolUpload"
                )
        })
        .map(|c| c.kind.0)
        .collect();
    assert!(adopted.is_empty(), "adopting the Go domain changed it: {adopted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_kvm_domain_on_the_local_hypervisor_is_read_listed_adopted_and_deleted() {
    let Some(env) = HypervisorEnv::for_test() else { return };
    let image = std::fs::read(&env.guest_image).unwrap();
    // Nothing listens there: a download attempt would fail the create.
    let url = "http://127.0.0.1:9/never-fetched.qcow2";
    let hosts = vec![egress_libvirt::config::KvmHost {
        name: "hv".into(),
        address: env.ssh_address.clone(),
        user: env.ssh_user.clone(),
        socket: env.libvirt_socket.clone(),
        pool: env.pool.clone(),
        bridge: env.bridge.clone(),
    }];
    let key = env.ssh_key.display().to_string();
    let known = env.known_hosts.display().to_string();
    let mut cfg = block(hosts, url, &support::sha256_hex(&image), (&key, &known));
    cfg.domain_type = Some(env.domain_type.clone());
    let p = egress_provider_kvm::construct(&ProviderConfig::new("kvm-compat", "kvm").with_block(&cfg)).unwrap();
    let options = || {
        egress_libvirt_ssh::DialOptions::new(
            &env.ssh_key,
            egress_libvirt_ssh::HostKeys::KnownHosts(env.known_hosts.clone()),
        )
    };
    let kvm2 = egress_libvirt::engine::LibvirtProvider::new(
        Generation::Kvm2,
        "kvm2-compat",
        cfg.clone(),
        egress_libvirt_ssh::hosts_of(&cfg, options()),
    )
    .unwrap();
    let host: Arc<dyn Host> = Arc::from(egress_libvirt_ssh::hosts_of(&cfg, options()).remove(0));
    let uid = format!("compat-{:08x}", std::process::id());
    let name = lay_down(host.as_ref(), &env.pool, &uid, &image, &env.bridge, &env.domain_type).await;
    exercise(
        p.as_ref(),
        &kvm2,
        host.as_ref(),
        &env.pool,
        &uid,
        &name,
        Duration::from_secs(150),
    )
    .await;
    // This run's copy of the Go cache goes too.
    let cx = OpCtx::background();
    for v in ["base-go-image.qcow2.sha256", "base-go-image.qcow2"] {
        let _ = host.delete_volume(&cx, &env.pool, v).await;
    }
}
