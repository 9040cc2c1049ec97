//! Compatibility with the Go operator's `kvm` provider: a domain and its volumes laid down
//! exactly as it named and marked them (the `.../kvm` metadata namespace, its compact domain
//! document with `<clock>` and `<boot>`, `<name>.qcow2` backed by `base-<key>.qcow2` with its
//! `.sha256` marker, `<name>-seed.iso`) are listed, read, adopted and deleted by this provider,
//! and the shared base stays. Over the libvirt fake, and against the local hypervisor with a
//! guest that really boots from them.

#[path = "../../provider-kvm2/tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use egress_libvirt::engine::{Generation, names};
use egress_libvirt::host::Host;
use egress_libvirt::seed::{seed_iso, vendor_data};
use egress_libvirt::{DomainSpec, Flavour, HypervisorEnv, KVM_NAMESPACE, Mark, VolumeSpec};
use egress_provider::config::ProviderConfig;
use egress_provider::{InstanceState, OpCtx, Provider, ProviderId, name_from_uid};
use support::{FakeBackend, IMAGE_KEY, POOL, request_in};

/// What the Go kvm provider left on `host`: a running domain of Proxy `uid` on `image` bytes.
async fn lay_down(host: &dyn Host, pool: &str, uid: &str, image: &[u8], bridge: &str, domain_type: &str) -> String {
    let cx = OpCtx::background();
    let name = name_from_uid(uid);
    let base = format!("base-{IMAGE_KEY}.qcow2");
    if host.volume_path(&cx, pool, &format!("{base}.sha256")).await.is_err() {
        let _ = host.delete_volume(&cx, pool, &base).await;
        let xml = |name: &str, bytes: usize, backing: Option<(String, String)>, format: &str| {
            VolumeSpec {
                name: name.to_owned(),
                capacity_bytes: i64::try_from(bytes).unwrap(),
                format: format.to_owned(),
                backing,
            }
            .to_xml(Flavour::Kvm)
            .unwrap()
        };
        host.create_volume(&cx, pool, &xml(&base, image.len(), None, "qcow2"))
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
        let digest = support::sha256_hex(image);
        host.create_volume(&cx, pool, &xml(&format!("{base}.sha256"), 64, None, "raw"))
            .await
            .unwrap();
        host.upload(
            &cx,
            pool,
            &format!("{base}.sha256"),
            0,
            Box::new(std::io::Cursor::new(digest.into_bytes())),
        )
        .await
        .unwrap();
    }
    let base_path = host.volume_path(&cx, pool, &base).await.unwrap();
    let overlay = VolumeSpec {
        name: format!("{name}.qcow2"),
        capacity_bytes: 1 << 30,
        format: "qcow2".into(),
        backing: Some((base_path, "qcow2".into())),
    }
    .to_xml(Flavour::Kvm)
    .unwrap();
    host.create_volume(&cx, pool, &overlay).await.unwrap();
    let iso = seed_iso(&name, b"#cloud-config\n", &vendor_data(b"", false)).unwrap();
    let seed = VolumeSpec {
        name: format!("{name}-seed.iso"),
        capacity_bytes: i64::try_from(iso.len()).unwrap(),
        format: "raw".into(),
        backing: None,
    }
    .to_xml(Flavour::Kvm)
    .unwrap();
    host.create_volume(&cx, pool, &seed).await.unwrap();
    host.upload(
        &cx,
        pool,
        &format!("{name}-seed.iso"),
        0,
        Box::new(std::io::Cursor::new(iso)),
    )
    .await
    .unwrap();
    let domain = DomainSpec {
        name: name.clone(),
        memory_mib: 256,
        vcpus: 1,
        mark: Mark::new(uid, SystemTime::now()),
        firmware: "uefi".into(),
        domain_type: domain_type.into(),
        cpu_mode: None,
        disk_path: host.volume_path(&cx, pool, &format!("{name}.qcow2")).await.unwrap(),
        disk_format: "qcow2".into(),
        seed_path: host.volume_path(&cx, pool, &format!("{name}-seed.iso")).await.unwrap(),
        bridge: bridge.into(),
        mac: None,
    }
    .to_xml(Flavour::Kvm)
    .unwrap();
    assert!(domain.contains(KVM_NAMESPACE) && domain.contains("<clock offset=\"utc\"/>"));
    host.define_domain(&cx, &domain).await.unwrap();
    host.start_domain(&cx, &name).await.unwrap();
    name
}

/// What this provider does with it: lists it (with state and address, as the first generation
/// lists), reads it, adopts it on a create for its Proxy, and deletes it with its volumes while
/// the base and marker stay; a kvm2 provider on the same host does not see it.
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
    // Running with an address, once the guest has one.
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
    assert!(running.ip.is_some() && running.created_at.is_some());
    let listed = p.list_by_tag(&cx).await.unwrap();
    let mine: Vec<_> = listed.iter().filter(|i| i.id == id).collect();
    assert_eq!(mine.len(), 1, "{listed:?}");
    assert_eq!((mine[0].uid.as_str(), mine[0].state), (uid, InstanceState::Running));
    assert!(
        !kvm2.list_by_tag(&cx).await.unwrap().iter().any(|i| i.id == id),
        "a kvm2 provider listed a kvm domain"
    );
    // A create for its Proxy adopts it: the same id, nothing made.
    let volumes_before = host.volume_names(&cx, pool).await.unwrap().len();
    let mut req = request_in(uid, host.name());
    req.name = name.to_owned();
    assert_eq!(p.create(&cx, &req).await.unwrap(), id);
    assert_eq!(host.volume_names(&cx, pool).await.unwrap().len(), volumes_before);
    // Delete: the domain and its volumes go, the shared base stays.
    p.delete(&cx, &id).await.unwrap();
    assert!(p.get(&cx, &id).await.unwrap_err().is_not_found());
    let left = host.volume_names(&cx, pool).await.unwrap();
    assert!(!left.iter().any(|v| v.starts_with(name)), "{left:?}");
    let base = names::base_kvm(IMAGE_KEY, "qcow2");
    assert!(left.contains(&base) && left.contains(&names::marker(&base)), "{left:?}");
}

#[tokio::test]
async fn a_go_kvm_domain_on_the_fake_is_listed_read_adopted_and_deleted() {
    let b = FakeBackend::new(Generation::Kvm).await;
    let host = &b.hosts[0];
    let uid = "4f9a6c1e-0b7d-4d2a-9e55-1c2b3d4e5f60";
    let name = lay_down(host, POOL, uid, &support::image_bytes(), "br0", "qemu").await;
    let p = b.provider("kvm-home", b.config(false)).unwrap();
    let kvm2 = FakeBackend {
        generation: Generation::Kvm2,
        ..b.clone()
    }
    .provider("kvm2-home", b.config(false))
    .unwrap();
    exercise(&p, &kvm2, host, POOL, uid, &name, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_kvm_domain_on_the_local_hypervisor_is_listed_read_adopted_and_deleted() {
    let env = match HypervisorEnv::load() {
        Ok(Some(env)) => env,
        Ok(None) if std::env::var("EGRESS_REAL_BACKENDS_REQUIRED").is_ok_and(|v| v == "1") => {
            panic!(
                "the test hypervisor is required but {} is missing",
                HypervisorEnv::file().display()
            )
        }
        Ok(None) => return println!("SKIPPED: no test hypervisor (cargo xtask hypervisor up)"),
        Err(e) => panic!("{e}"),
    };
    let image = std::fs::read(&env.guest_image).unwrap();
    let (url, digest) = (
        "http://127.0.0.1:9/never-fetched.qcow2".to_owned(),
        support::sha256_hex(&image),
    );
    let block = egress_provider::config::KvmConfig {
        ssh_key_file: env.ssh_key.display().to_string(),
        known_hosts_file: env.known_hosts.display().to_string(),
        disk_size_gb: 1,
        domain_type: Some(env.domain_type.clone()),
        images: [(
            IMAGE_KEY.to_owned(),
            egress_provider::config::KvmImage {
                url,
                sha256: digest,
                ..Default::default()
            },
        )]
        .into(),
        machine_types: [(
            "small".to_owned(),
            egress_provider::config::KvmMachineType {
                vcpus: 1,
                memory_mib: 256,
            },
        )]
        .into(),
        hosts: vec![egress_provider::config::KvmHost {
            name: "hv".into(),
            address: env.ssh_address.clone(),
            user: env.ssh_user.clone(),
            socket: env.libvirt_socket.clone(),
            pool: env.pool.clone(),
            bridge: env.bridge.clone(),
        }],
        ..Default::default()
    };
    let p = egress_provider_kvm::construct(&ProviderConfig {
        name: "kvm-compat".into(),
        type_name: "kvm".into(),
        kvm: Some(block.clone()),
        ..Default::default()
    })
    .unwrap();
    let kvm2 = egress_libvirt::engine::LibvirtProvider::new(
        Generation::Kvm2,
        "kvm2-compat",
        block.clone(),
        egress_libvirt_ssh::hosts_of(&block, options(&env)),
    )
    .unwrap();
    let host: Arc<dyn Host> = Arc::from(egress_libvirt_ssh::hosts_of(&block, options(&env)).remove(0));
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
}

fn options(env: &HypervisorEnv) -> egress_libvirt_ssh::DialOptions {
    egress_libvirt_ssh::DialOptions::new(
        &env.ssh_key,
        egress_libvirt_ssh::HostKeys::KnownHosts(env.known_hosts.clone()),
    )
}
