//! A hypervisor that goes silent in the middle of a cold-image upload, on the local hypervisor
//! (`cargo xtask hypervisor up`): every process of the hypervisor's SSH user (its sshd sessions)
//! is stopped with SIGSTOP while the base image streams to it. The create fails, Transient, once
//! the stall limit passes, and says why; after the thaw the next create of the same image
//! succeeds with a complete, marked base, and nothing of the failed one is left.
//!
//! Skips without a hypervisor; fails under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1).
//! Its own test binary: nothing else uses the hypervisor's user while it is frozen.

use std::time::Duration;

use egress_libvirt::HypervisorEnv;
use egress_libvirt::config::KvmConfig;
use egress_libvirt::engine::names;
use egress_libvirt::host::Host;
use egress_libvirt_ssh::testing::IMAGE_KEY;
use egress_libvirt_ssh::testing::real::{self, HOST};
use egress_provider::config::ProviderConfig;
use egress_provider::{CreateRequest, ErrorClass, OpCtx, Placement, name_from_uid};
use egress_testkit::image_server::{ImageServer, Serve};

/// The stall limit of the entry: the shortest the config accepts.
const STALL_SECONDS: u64 = 5;
/// Far longer than the stall limit and the clean-up calls after it: a liveness bound only.
const PATIENCE: Duration = Duration::from_secs(300);
/// The download is held once this much has gone to the host.
const PAUSE_AT: usize = 4 << 20;
/// Zeros after the guest image, so that what is still to go after the pause is far more than
/// the socket buffers and the SSH window between here and the stopped host can hold.
const PADDING: usize = 96 << 20;

/// Every process of the user `uid` stopped until dropped (then continued).
struct Frozen {
    pids: Vec<rustix::process::Pid>,
}

impl Frozen {
    fn freeze(uid: u32) -> Self {
        let pids = processes_of(uid);
        assert!(
            !pids.is_empty(),
            "the hypervisor user has no process: no SSH session to freeze"
        );
        for pid in &pids {
            let _ = rustix::process::kill_process(*pid, rustix::process::Signal::STOP);
        }
        Self { pids }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for pid in &self.pids {
            let _ = rustix::process::kill_process(*pid, rustix::process::Signal::CONT);
        }
    }
}

/// The processes whose real user is `uid`, from /proc.
fn processes_of(uid: u32) -> Vec<rustix::process::Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|ids| ids.split_whitespace().next()?.parse::<u32>().ok())
                    == Some(uid)
            })
        })
        .filter_map(rustix::process::Pid::from_raw)
        .collect()
}

/// The uid of `user`, from /etc/passwd.
fn uid_of(user: &str) -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    passwd
        .lines()
        .find_map(|l| {
            let mut fields = l.split(':');
            (fields.next() == Some(user)).then(|| fields.nth(1)?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no user {user} in /etc/passwd"))
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        name: name_from_uid(uid),
        uid: uid.to_owned(),
        namespace: "crawl".into(),
        proxy_name: "frozen".into(),
        placement: Placement {
            zone: HOST.into(),
            machine_type: "small".into(),
            image: IMAGE_KEY.into(),
            ..Placement::default()
        },
        cloud_init: b"#cloud-config\n".to_vec(),
        port: 3128,
        installation: None,
        credentials: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_frozen_mid_upload_fails_the_create_at_the_stall_limit_and_the_next_succeeds() {
    let Some(env) = HypervisorEnv::for_test() else { return };
    egress_libvirt_ssh::quiet_libvirt();
    let mut image = std::fs::read(&env.guest_image).expect("the test guest");
    image.resize(image.len() + PADDING, 0);
    let server = ImageServer::start(image, "127.0.0.1:0").await;
    server.serve(Serve::PauseAfter(PAUSE_AT));

    // An entry of this process alone: its base volume is not any other test's.
    let entry = format!("frozen-{}", std::process::id());
    let base = names::base(&entry, IMAGE_KEY, "qcow2");
    let marker = names::marker(&base);
    // The shortest stall limit the config accepts; no digest (the image is padded).
    let block = KvmConfig {
        stall_timeout_seconds: Some(STALL_SECONDS),
        ..real::block(&env, &server.url(), "")
    };
    let config = ProviderConfig::new(entry.as_str(), egress_provider_kvm2::TYPE_NAME).with_block(&block);
    let provider = egress_provider_kvm2::construct(&config).expect("the provider");
    let req = request(&format!("frozen-host-{:08x}", std::process::id()));

    let creating = tokio::spawn({
        let (provider, req) = (provider.clone(), req.clone());
        async move { provider.create(&OpCtx::background().with_timeout(PATIENCE), &req).await }
    });
    tokio::time::timeout(PATIENCE, server.held())
        .await
        .expect("the download reached its pause");
    let frozen = Frozen::freeze(uid_of(&env.ssh_user));
    server.resume();
    let failed = tokio::time::timeout(PATIENCE, creating)
        .await
        .expect("the create ended within the liveness bound")
        .expect("the create's task");
    drop(frozen);
    let err = failed.expect_err("a create through a frozen host must fail");
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("the host accepted no byte for {STALL_SECONDS} s")),
        "{err}"
    );

    // Thawed: the same create again, the image served whole this time.
    server.serve(Serve::Image);
    let cx = OpCtx::background().with_timeout(PATIENCE);
    let id = provider
        .create(&cx, &req)
        .await
        .expect("the next create, after the thaw");
    let host = real::host_of(&env);
    let volumes = host.volume_names(&cx, &env.pool).await.expect("the pool's volumes");
    assert!(volumes.contains(&base) && volumes.contains(&marker), "{volumes:?}");
    provider.delete(&cx, &id).await.expect("the delete");

    // Only the cache is left, and it goes with the test.
    let left: Vec<String> = host
        .volume_names(&cx, &env.pool)
        .await
        .expect("the pool's volumes")
        .into_iter()
        .filter(|v| v.contains(&req.name) || v.contains(&entry))
        .collect();
    assert_eq!(left.len(), 2, "base and marker only: {left:?}");
    for volume in [&marker, &base] {
        host.delete_volume(&cx, &env.pool, volume)
            .await
            .expect("removing the test's base");
    }
}
