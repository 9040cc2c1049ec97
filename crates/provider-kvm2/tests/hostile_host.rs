//! A hypervisor that misbehaves in the middle of a cold-image upload, on the local hypervisor
//! (`cargo xtask hypervisor up`). Each case holds the image server at a point it chooses, does
//! something to the host, lets the download go on, and checks that the create fails as it
//! should, that nothing of it is left, and that the next create of the same image succeeds
//! with a complete, marked base:
//!
//! - every process of the hypervisor's SSH user (its sshd sessions) stopped with SIGSTOP: the
//!   create fails, Transient, once the stall limit passes, and says why;
//! - libvirtd restarted: the create fails, Transient;
//! - the pool's filesystem filled up by someone else: the create fails and the half-written
//!   base is removed (the pool is a small tmpfs of its own).
//!
//! And one case where someone else works on the host between the provider's calls (spec/kvm.md
//! item 56): a domain of another provider is listed past in silence, a domain undefined behind
//! the provider's back is made again over its leftover volumes, and one stopped behind its back
//! is deleted.
//!
//! Skips without a hypervisor; fails under `cargo xtask test` (EGRESS_REAL_BACKENDS_REQUIRED=1).
//! Its own test binary, cases one at a time: nothing else uses the hypervisor while it is
//! frozen or restarting.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use egress_conformance::capture::Capture;
use egress_libvirt::config::KvmConfig;
use egress_libvirt::host::{Host, UNDEFINE_FLAGS};
use egress_libvirt::names;
use egress_libvirt::testing::IMAGE_KEY;
use egress_libvirt::{DomainSpec, Generation, HypervisorEnv, Mark, VolumeSpec};
use egress_libvirt_ssh::testing::{self as real, HOST};
use egress_provider::config::ProviderConfig;
use egress_provider::{CreateRequest, ErrorClass, OpCtx, Placement, name_from_uid};
use egress_testkit::freeze::{Frozen, uid_of};
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
        spread_group: None,
    }
}

/// One case at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_frozen_mid_upload_fails_the_create_at_the_stall_limit_and_the_next_succeeds() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = HypervisorEnv::for_test() else { return };
    let case = case(&env, "frozen", &env.pool).await;
    let creating = case.create_until_held().await;
    // The body being held says only that the download began: the create may still be taking
    // its fill lease on the shared connection, where a freeze is an RPC's budget, not a stall.
    // Once the base volume exists the upload is what runs.
    case.until_uploading(&env, &env.pool).await;
    let frozen = Frozen::freeze(uid_of(&env.ssh_user));
    let err = case
        .resume_until_failed(creating, "a create through a frozen host must fail")
        .await;
    drop(frozen);
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("the host accepted no byte for {STALL_SECONDS} s")),
        "{err}"
    );
    // Thawed: no marker (the base is never taken as complete) and no lease (others are not
    // held off). The base itself may be left: libvirt refuses to delete a volume while the
    // stopped session's upload stream still holds it; the next create removes it.
    let left = case.volumes(&env, &env.pool).await;
    assert!(left.iter().all(|v| *v == case.base), "{left:?}");
    case.next_create_succeeds(&env, &env.pool).await;
}

/// A provider of an entry of its own (so its base volume is not any other test's) with the
/// shortest stall limit, the padded image served and held at [`PAUSE_AT`], and the entry's
/// base and marker names.
struct Case {
    provider: std::sync::Arc<dyn egress_provider::Provider>,
    server: ImageServer,
    base: String,
    marker: String,
    req: CreateRequest,
}

async fn case(env: &HypervisorEnv, what: &str, pool: &str) -> Case {
    egress_libvirt_ssh::quiet_libvirt();
    let mut image = std::fs::read(&env.guest_image).expect("the test guest");
    image.resize(image.len() + PADDING, 0);
    let server = ImageServer::start(image, "127.0.0.1:0").await;
    server.serve(Serve::PauseAfter(PAUSE_AT));
    let entry = format!("{what}-{}", std::process::id());
    let base = names::base(&entry, IMAGE_KEY, "qcow2");
    let marker = names::marker(&base);
    // The shortest stall limit the config accepts; no digest (the image is padded).
    let mut block = KvmConfig {
        stall_timeout_seconds: Some(STALL_SECONDS),
        ..real::block(env, &server.url(), "")
    };
    block.hosts[0].pool = pool.to_owned();
    let config = ProviderConfig::new(entry.as_str(), egress_provider_kvm2::TYPE_NAME).with_block(&block);
    let provider = egress_provider_kvm2::construct(&config).expect("the provider");
    let req = request(&format!("{what}-{:08x}", std::process::id()));
    Case {
        provider,
        server,
        base,
        marker,
        req,
    }
}

impl Case {
    /// Starts the create and returns once the download is held.
    async fn create_until_held(
        &self,
    ) -> tokio::task::JoinHandle<Result<egress_provider::ProviderId, egress_provider::ProviderError>> {
        let creating = tokio::spawn({
            let (provider, req) = (self.provider.clone(), self.req.clone());
            async move { provider.create(&OpCtx::background().with_timeout(PATIENCE), &req).await }
        });
        tokio::time::timeout(PATIENCE, self.server.held())
            .await
            .expect("the download reached its pause");
        creating
    }

    /// Lets the held download go on and returns the error `creating` ends with (`why` says
    /// why it must fail), within the liveness bound.
    async fn resume_until_failed(
        &self,
        creating: tokio::task::JoinHandle<Result<egress_provider::ProviderId, egress_provider::ProviderError>>,
        why: &str,
    ) -> egress_provider::ProviderError {
        self.server.resume();
        tokio::time::timeout(PATIENCE, creating)
            .await
            .expect("the create ended within the liveness bound")
            .expect("the create's task")
            .expect_err(why)
    }

    /// Returns once the base volume exists: the upload into it is under way.
    async fn until_uploading(&self, env: &HypervisorEnv, pool: &str) {
        let deadline = std::time::Instant::now() + PATIENCE;
        while !self.volumes(env, pool).await.contains(&self.base) {
            assert!(std::time::Instant::now() < deadline, "the upload never began");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The volumes of `pool` that belong to this case.
    async fn volumes(&self, env: &HypervisorEnv, pool: &str) -> Vec<String> {
        let cx = OpCtx::background().with_timeout(PATIENCE);
        real::host_of(env)
            .volume_names(&cx, pool)
            .await
            .expect("the pool's volumes")
            .into_iter()
            .filter(|v| v.contains(&self.req.name) || v.starts_with(&self.base))
            .collect()
    }

    /// The same create again, the image served whole: it succeeds, the base is marked, and
    /// after the delete only the cache is left, which goes with the test.
    async fn next_create_succeeds(&self, env: &HypervisorEnv, pool: &str) {
        let id = self.create_whole(env, pool).await;
        self.delete_and_clear(env, pool, &id).await;
    }

    /// The create with the image served whole; the base is marked afterwards.
    async fn create_whole(&self, env: &HypervisorEnv, pool: &str) -> egress_provider::ProviderId {
        self.server.serve(Serve::Image);
        let cx = OpCtx::background().with_timeout(PATIENCE);
        let id = self.provider.create(&cx, &self.req).await.expect("the create");
        let mut volumes = self.volumes(env, pool).await;
        volumes.sort();
        assert!(
            volumes.contains(&self.base) && volumes.contains(&self.marker),
            "{volumes:?}"
        );
        id
    }

    /// Deletes `id`, checks that only the image cache is left, and removes the cache.
    async fn delete_and_clear(&self, env: &HypervisorEnv, pool: &str, id: &egress_provider::ProviderId) {
        let cx = OpCtx::background().with_timeout(PATIENCE);
        self.provider.delete(&cx, id).await.expect("the delete");
        let mut left = self.volumes(env, pool).await;
        left.sort();
        let mut cache = vec![self.base.clone(), self.marker.clone()];
        cache.sort();
        assert_eq!(left, cache, "base and marker only");
        let host = real::host_of(env);
        for volume in [&self.marker, &self.base] {
            host.delete_volume(&cx, pool, volume)
                .await
                .expect("removing the test's base");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_libvirtd_restart_mid_upload_fails_the_create_and_the_next_succeeds() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = HypervisorEnv::for_test() else { return };
    let case = case(&env, "restart", &env.pool).await;
    let creating = case.create_until_held().await;
    case.until_uploading(&env, &env.pool).await;
    egress_testkit::restart_libvirtd(&HypervisorEnv::file().with_file_name("libvirtd.conf"));
    let err = case
        .resume_until_failed(creating, "a create whose libvirtd restarted mid-upload must fail")
        .await;
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");
    // The failed fill removed what it made (its base and its lease), over a new connection
    // once libvirtd answered again.
    assert_eq!(case.volumes(&env, &env.pool).await, Vec::<String>::new());
    case.next_create_succeeds(&env, &env.pool).await;
}

/// A storage pool of its own on a tmpfs of `size` bytes, removed (pool and mount) on drop.
struct SmallPool {
    name: String,
    dir: PathBuf,
}

impl SmallPool {
    fn new(size: u64) -> Self {
        let name = format!("egress-small-{}", std::process::id());
        let dir = HypervisorEnv::file().with_file_name(&name);
        std::fs::create_dir_all(&dir).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"])
            .arg(&dir));
        let pool = Self { name, dir };
        virsh(&[
            "pool-define-as",
            &pool.name,
            "dir",
            "--target",
            &pool.dir.display().to_string(),
        ]);
        virsh(&["pool-start", &pool.name]);
        pool
    }

    /// Takes all but `leave` bytes of the filesystem's free space, as another writer would.
    /// What is still in flight to the pool when it is measured must fit in `leave`.
    fn fill(&self, leave: u64) -> PathBuf {
        let df = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.dir)
            .output()
            .expect("df runs");
        let free: u64 = String::from_utf8_lossy(&df.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df's figure");
        let filler = self.dir.join("filler");
        run(Command::new("fallocate")
            .args(["-l", &free.saturating_sub(leave).to_string()])
            .arg(&filler));
        filler
    }
}

impl Drop for SmallPool {
    fn drop(&mut self) {
        virsh_in_cleanup(&["pool-destroy", &self.name]);
        virsh_in_cleanup(&["pool-undefine", &self.name]);
        let _ = Command::new("umount").arg(&self.dir).output();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn run(command: &mut Command) {
    let out = command.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn virsh(args: &[&str]) {
    run(Command::new("virsh").args(["-c", "qemu:///system"]).args(args));
}

/// `virsh` from a Drop guard: best effort, what is already gone is no error.
fn virsh_in_cleanup(args: &[&str]) {
    let _ = Command::new("virsh").args(["-c", "qemu:///system"]).args(args).output();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_fills_up_mid_upload_fails_the_create_and_leaves_nothing() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = HypervisorEnv::for_test() else { return };
    // Room for the precheck: the padded image, the 1 GiB overlay, the seed and a twentieth.
    let pool = SmallPool::new(1400 << 20);
    let case = case(&env, "full", &pool.name).await;
    let creating = case.create_until_held().await;
    case.until_uploading(&env, &pool.name).await;
    // At most PAUSE_AT bytes reach the pool before the image server resumes.
    let filler = pool.fill(2 * PAUSE_AT as u64);
    let err = case
        .resume_until_failed(creating, "a create into a full pool must fail")
        .await;
    // Transient: the next attempt's space check says QuotaExceeded while the pool stays full.
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");
    assert!(err.to_string().contains("No space left on device"), "{err}");
    assert_eq!(
        case.volumes(&env, &pool.name).await,
        Vec::<String>::new(),
        "the half-written base was left"
    );
    std::fs::remove_file(&filler).unwrap();
    case.next_create_succeeds(&env, &pool.name).await;
}

/// A stopped domain of the first-generation provider (its mark in kvm's namespace, none in
/// kvm2's), with a small disk of its own; both removed on drop.
struct ForeignDomain {
    name: String,
    disk: String,
    pool: String,
}

impl ForeignDomain {
    async fn define(env: &HypervisorEnv, cx: &OpCtx) -> Self {
        let host = real::host_of(env);
        let name = format!("egress-test-{}-foreign", std::process::id());
        let disk = format!("{name}.raw");
        let volume = VolumeSpec {
            name: disk.clone(),
            capacity_bytes: 1 << 20,
            format: "raw".to_owned(),
            backing: None,
        }
        .to_xml(Generation::Kvm)
        .unwrap();
        host.create_volume(cx, &env.pool, &volume)
            .await
            .expect("the foreign disk");
        let foreign = Self {
            name: name.clone(),
            disk: disk.clone(),
            pool: env.pool.clone(),
        };
        let path = host.volume_path(cx, &env.pool, &disk).await.unwrap();
        let xml = DomainSpec {
            name,
            memory_mib: 128,
            vcpus: 1,
            mark: Mark::new("u-foreign", std::time::SystemTime::now()),
            firmware: "bios".into(),
            domain_type: env.domain_type.clone(),
            cpu_mode: None,
            disk_path: path.clone(),
            disk_format: "raw".into(),
            seed_path: path,
            bridge: env.bridge.clone(),
            mac: None,
        }
        .to_xml(Generation::Kvm)
        .unwrap();
        host.define_domain(cx, &xml).await.expect("the foreign domain");
        foreign
    }
}

impl Drop for ForeignDomain {
    fn drop(&mut self) {
        virsh_in_cleanup(&["undefine", &self.name]);
        virsh_in_cleanup(&["vol-delete", "--pool", &self.pool, &self.disk]);
    }
}

/// Spec/kvm.md item 56, on the real daemon: what another actor does on the host between the
/// provider's calls. A domain of another provider reads "no metadata" (libvirt's code 80) and
/// is listed past without a word; a domain destroyed and undefined over another connection
/// leaves its volumes, and the next create makes it over them (code 90, a volume that exists);
/// a domain stopped before the delete is deleted all the same (code 55, not running).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_done_behind_the_providers_back_is_met_quietly() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let Some(env) = HypervisorEnv::for_test() else { return };
    let case = case(&env, "behind", &env.pool).await;
    let cx = OpCtx::background().with_timeout(PATIENCE);
    let foreign = ForeignDomain::define(&env, &cx).await;
    // Everything this thread's awaits log, debug lines included.
    let (capture, _capturing) = Capture::start();
    let id = case.create_whole(&env, &env.pool).await;
    let listed = case.provider.list_by_tag(&cx).await.expect("the list");
    assert!(listed.iter().any(|i| i.id == id), "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|i| !i.id.as_str().ends_with(&format!("/{}", foreign.name))),
        "{listed:?}"
    );

    let other = real::host_of(&env);
    other
        .destroy_domain(&cx, &case.req.name)
        .await
        .expect("destroyed behind its back");
    other
        .undefine_domain(&cx, &case.req.name, UNDEFINE_FLAGS)
        .await
        .expect("undefined behind its back");
    let overlay = names::overlay(&case.req.name);
    assert!(
        case.volumes(&env, &env.pool).await.contains(&overlay),
        "the overlay stays"
    );
    let again = case
        .provider
        .create(&cx, &case.req)
        .await
        .expect("made again over its volumes");
    assert_eq!(again, id);
    assert!(other.domain_state(&cx, &case.req.name).await.unwrap().is_active());

    other
        .destroy_domain(&cx, &case.req.name)
        .await
        .expect("stopped behind its back");
    case.delete_and_clear(&env, &env.pool, &id).await;
    assert!(
        other
            .domain_state(&cx, &case.req.name)
            .await
            .unwrap_err()
            .is(egress_libvirt::host::code::NO_DOMAIN)
    );
    assert_eq!(
        capture.find_text("unreadable metadata"),
        None,
        "a domain of another provider was logged as unreadable"
    );
    drop(foreign);
}
