//! One behavioural table for the `Host` seam, run against the in-memory fake and against the real
//! libvirtd over SSH (`RemoteHost`), so the fake the providers' suites run on answers what the
//! real daemon answers: the error numbers of missing domains, pools and volumes, an existing
//! volume, a second start, a destroy of a stopped domain; metadata scoped by namespace; volume
//! bytes through upload and download; a failing upload source; a dedicated connection.
//!
//! The real run needs `cargo xtask hypervisor up` (skips without it; fails under
//! `cargo xtask test`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use egress_libvirt::host::{AddressSource, DomainState, Host, POOL_RUNNING, UNDEFINE_FLAGS, code};
use egress_libvirt::{DomainSpec, Flavour, KVM_NAMESPACE, KVM2_NAMESPACE, Mark, VolumeSpec};
use egress_libvirt_ssh::{DialOptions, Dialer, HostKeys, HostTarget, Pool, RemoteHost};
use egress_provider::OpCtx;

const ENV_FILE: &str = "/tmp/egress-hv/env";

fn hypervisor() -> Option<BTreeMap<String, String>> {
    let Ok(text) = std::fs::read_to_string(ENV_FILE) else {
        assert!(
            std::env::var("EGRESS_REAL_BACKENDS_REQUIRED").is_err(),
            "the hypervisor is required: {ENV_FILE} is missing (cargo xtask test brings it up as root)"
        );
        eprintln!("SKIP: no hypervisor ({ENV_FILE} is missing)");
        return None;
    };
    egress_libvirt_ssh::quiet_libvirt();
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    )
}

/// A source that yields some bytes, then fails.
struct Failing(usize);

impl Read for Failing {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0 == 0 {
            return Err(std::io::Error::other("the mirror went away"));
        }
        let n = self.0.min(buf.len());
        buf[..n].fill(7);
        self.0 -= n;
        Ok(n)
    }
}

fn volume(name: &str, bytes: i64) -> String {
    VolumeSpec {
        name: name.to_owned(),
        capacity_bytes: bytes,
        format: "raw".into(),
        backing: None,
    }
    .to_xml(Flavour::Kvm2)
    .unwrap()
}

/// The table. `tag` keeps the names of concurrent runs apart.
async fn behaviours(host: &dyn Host, pool: &str, bridge: &str, domain_type: &str, tag: &str) {
    let cx = OpCtx::background();
    let (lib, hostname) = host.version(&cx).await.unwrap();
    assert!(lib >= 9_000_000 && !hostname.is_empty());

    // What is missing, by libvirt's numbers.
    let missing = format!("{tag}-missing");
    assert!(
        host.domain_metadata(&cx, &missing, KVM2_NAMESPACE)
            .await
            .unwrap_err()
            .is(code::NO_DOMAIN)
    );
    assert!(host.domain_state(&cx, &missing).await.unwrap_err().is(code::NO_DOMAIN));
    assert!(host.start_domain(&cx, &missing).await.unwrap_err().is(code::NO_DOMAIN));
    assert!(
        host.destroy_domain(&cx, &missing)
            .await
            .unwrap_err()
            .is(code::NO_DOMAIN)
    );
    assert!(
        host.undefine_domain(&cx, &missing, UNDEFINE_FLAGS)
            .await
            .unwrap_err()
            .is(code::NO_DOMAIN)
    );
    assert!(
        host.volume_path(&cx, pool, &missing)
            .await
            .unwrap_err()
            .is(code::NO_STORAGE_VOL)
    );
    assert!(
        host.delete_volume(&cx, pool, &missing)
            .await
            .unwrap_err()
            .is(code::NO_STORAGE_VOL)
    );
    assert!(
        host.pool_info(&cx, &missing)
            .await
            .unwrap_err()
            .is(code::NO_STORAGE_POOL)
    );

    let info = host.pool_info(&cx, pool).await.unwrap();
    assert_eq!(info.state, POOL_RUNNING);
    assert!(info.capacity > 0);
    host.refresh_pool(&cx, pool).await.unwrap();

    // A volume: created once, its bytes through upload and download.
    let marker = format!("{tag}-marker");
    host.create_volume(&cx, pool, &volume(&marker, 64)).await.unwrap();
    assert!(
        host.create_volume(&cx, pool, &volume(&marker, 64))
            .await
            .unwrap_err()
            .is(code::STORAGE_VOL_EXIST)
    );
    let digest = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".to_vec();
    let sent = host
        .upload(&cx, pool, &marker, 64, Box::new(std::io::Cursor::new(digest.clone())))
        .await
        .unwrap();
    assert_eq!(sent, 64);
    assert_eq!(host.download(&cx, pool, &marker, 1024).await.unwrap(), digest);
    assert_eq!(host.download(&cx, pool, &marker, 10).await.unwrap(), digest[..10]);
    assert!(!host.volume_path(&cx, pool, &marker).await.unwrap().is_empty());

    // A failing source ends the upload with its own error; the host stays usable.
    let failing = format!("{tag}-failing");
    host.create_volume(&cx, pool, &volume(&failing, 1 << 20)).await.unwrap();
    let err = host
        .upload(&cx, pool, &failing, 1 << 20, Box::new(Failing(300 << 10)))
        .await
        .unwrap_err();
    // libvirt accepts a short stream that ends cleanly; the source's error is what is reported.
    assert_eq!(
        err.message,
        format!("reading the upload source for {failing}: the mirror went away")
    );
    assert!(err.transport);
    host.delete_volume(&cx, pool, &failing).await.unwrap();
    host.delete_volume(&cx, pool, &marker).await.unwrap();
    assert!(
        host.volume_path(&cx, pool, &marker)
            .await
            .unwrap_err()
            .is(code::NO_STORAGE_VOL)
    );

    // A domain from our document: its mark under our namespace only.
    let disk = format!("{tag}-disk.raw");
    let seed = format!("{tag}-seed.iso");
    host.create_volume(&cx, pool, &volume(&disk, 1 << 20)).await.unwrap();
    host.create_volume(&cx, pool, &volume(&seed, 1 << 20)).await.unwrap();
    let name = format!("{tag}-domain");
    let mark = Mark::new("u-seam", SystemTime::now());
    let xml = DomainSpec {
        name: name.clone(),
        memory_mib: 128,
        vcpus: 1,
        mark: mark.clone(),
        firmware: "uefi".into(),
        domain_type: domain_type.to_owned(),
        cpu_mode: None,
        disk_path: host.volume_path(&cx, pool, &disk).await.unwrap(),
        disk_format: "raw".into(),
        seed_path: host.volume_path(&cx, pool, &seed).await.unwrap(),
        bridge: bridge.to_owned(),
    }
    .to_xml(Flavour::Kvm2)
    .unwrap();
    host.define_domain(&cx, &xml).await.unwrap();
    let element = host
        .domain_metadata(&cx, &name, KVM2_NAMESPACE)
        .await
        .unwrap()
        .expect("our mark");
    assert_eq!(Mark::parse(&element).unwrap().uid, "u-seam");
    assert_eq!(host.domain_metadata(&cx, &name, KVM_NAMESPACE).await.unwrap(), None);
    assert!(host.domain_names(&cx).await.unwrap().contains(&name));
    assert_eq!(host.domain_state(&cx, &name).await.unwrap(), DomainState::Shutoff);
    assert!(
        host.destroy_domain(&cx, &name)
            .await
            .unwrap_err()
            .is(code::OPERATION_INVALID)
    );
    assert!(
        host.interface_addresses(&cx, &name, AddressSource::Agent)
            .await
            .unwrap_err()
            .is(code::OPERATION_INVALID)
    );

    // Started twice, destroyed, undefined with the NVRAM.
    host.start_domain(&cx, &name).await.unwrap();
    assert!(host.domain_state(&cx, &name).await.unwrap().is_active());
    assert!(
        host.start_domain(&cx, &name)
            .await
            .unwrap_err()
            .is(code::OPERATION_INVALID)
    );
    host.destroy_domain(&cx, &name).await.unwrap();
    assert_eq!(host.domain_state(&cx, &name).await.unwrap(), DomainState::Shutoff);
    host.undefine_domain(&cx, &name, UNDEFINE_FLAGS).await.unwrap();
    assert!(host.domain_state(&cx, &name).await.unwrap_err().is(code::NO_DOMAIN));
    host.delete_volume(&cx, pool, &disk).await.unwrap();
    host.delete_volume(&cx, pool, &seed).await.unwrap();

    // A connection of its own answers too.
    let own = host.dedicated(&cx).await.unwrap();
    assert_eq!(own.version(&cx).await.unwrap().0, lib);
}

#[tokio::test]
async fn the_fake_answers_the_table() {
    let fake = egress_libvirt::fake::FakeHost::new("fake-hv", "default", 10 << 30);
    behaviours(&fake, "default", "br0", "qemu", "egress-test-fake").await;
    assert!(fake.domains().is_empty() && fake.volumes("default").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_daemon_answers_the_table() {
    let Some(env) = hypervisor() else { return };
    let target = HostTarget {
        name: "local-hv".to_owned(),
        address: env["EGRESS_HV_SSH_ADDRESS"].clone(),
        user: env["EGRESS_HV_SSH_USER"].clone(),
        socket: env["EGRESS_HV_LIBVIRT_SOCKET"].clone(),
    };
    let options = DialOptions::new(
        &env["EGRESS_HV_SSH_KEY"],
        HostKeys::KnownHosts(PathBuf::from(&env["EGRESS_HV_KNOWN_HOSTS"])),
    );
    let host = RemoteHost::new(target, Arc::new(Pool::new(Arc::new(Dialer::new(options)))));
    let tag = format!("egress-test-{}-seam", std::process::id());
    behaviours(
        &host,
        &env["EGRESS_HV_POOL"],
        &env["EGRESS_HV_BRIDGE"],
        &env["EGRESS_HV_DOMAIN_TYPE"],
        &tag,
    )
    .await;
}
