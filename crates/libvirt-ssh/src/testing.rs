//! A libvirt provider (kvm2 or kvm) against the local hypervisor (`cargo xtask hypervisor up`):
//! built by the production constructor from a config entry, over this crate's SSH transport to a
//! real libvirtd with QEMU, booting the test guest from an image this process serves over HTTP.
//! The profile, fixtures and requests are those of the fake target (`egress_libvirt::testing`);
//! this module adds what only the real transport can reach.
//!
//! Cases run one at a time here (a real pool refuses a refresh while an upload runs, and every
//! guest costs CPU on a small machine), and each case's domains and volumes are removed when
//! its backend goes away. The hooks libvirt cannot honour from outside (seeding marks, faults,
//! gates) answer Unsupported, and their cases skip.
//!
//! Behind the `testing` feature, for the tests of `egress-provider-kvm` and
//! `egress-provider-kvm2`; never in a production build.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::ThreadId;
use std::time::Duration;

use crate::dial::{DialOptions, Dialer, HostKeys, HostTarget};
use crate::pool::Pool;
use crate::remote::RemoteHost;
use async_trait::async_trait;
use egress_conformance::hooks::{BackendObject, HookResult};
use egress_conformance::{
    BackendHooks, BuildOptions, ConformanceTarget, Fixtures, NativeState, NotConfigured, Profile, Unsupported,
};
use egress_libvirt::Generation;
use egress_libvirt::config::{KvmConfig, KvmHost, KvmImage, KvmMachineType};
use egress_libvirt::host::Host;
use egress_libvirt::seed::read_seed_file;
use egress_libvirt::testing::{IMAGE_KEY, fixtures, marks_of, profile, request_in, sha256_hex, volume_object};
use egress_libvirt::{HypervisorEnv, Mark};
use egress_provider::config::ProviderConfig;
use egress_provider::{BoxError, CreateRequest, OpCtx, Provider, ProviderId};
use egress_testkit::ScratchDir;
use egress_testkit::image_server::ImageServer;

/// The one host of the real entry.
pub const HOST: &str = "hv";

/// The guest image, served for the whole test process (each case has its own runtime, so the
/// server runs on a thread of its own).
fn served_image(env: &HypervisorEnv) -> &'static (String, String) {
    static SERVED: OnceLock<(String, String)> = OnceLock::new();
    SERVED.get_or_init(|| {
        let image = std::fs::read(&env.guest_image).expect("the test guest image");
        let digest = sha256_hex(&image);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let server = ImageServer::start(image, "127.0.0.1:0").await;
                tx.send(server.url()).unwrap();
                std::future::pending::<()>().await;
            });
        });
        (rx.recv().unwrap(), digest)
    })
}

/// One case at a time on the real host; re-entrant for the thread holding it (a case may ask
/// for a second backend).
struct Turn {
    holder: Mutex<(Option<ThreadId>, usize)>,
    free: Condvar,
}

static TURN: Turn = Turn {
    holder: Mutex::new((None, 0)),
    free: Condvar::new(),
};

impl Turn {
    fn take(&'static self) -> TurnGuard {
        let me = std::thread::current().id();
        let mut h = self.holder.lock().unwrap_or_else(|p| p.into_inner());
        while h.0.is_some_and(|t| t != me) {
            h = self.free.wait(h).unwrap_or_else(|p| p.into_inner());
        }
        h.0 = Some(me);
        h.1 += 1;
        TurnGuard
    }
}

struct TurnGuard;

impl Drop for TurnGuard {
    fn drop(&mut self) {
        let mut h = TURN.holder.lock().unwrap_or_else(|p| p.into_inner());
        h.1 -= 1;
        if h.1 == 0 {
            h.0 = None;
            TURN.free.notify_all();
        }
    }
}

/// The marker in every UID the suite makes in this process (`<tag>-<pid:08x>-<n>`).
fn this_process() -> String {
    format!("-{:08x}-", std::process::id())
}

/// The real hypervisor, for one case.
pub struct RealBackend {
    generation: Generation,
    env: HypervisorEnv,
    files: Arc<ScratchDir>,
    url: String,
    sha256: String,
    /// Released after the sweep (fields drop after `Drop::drop`).
    _turn: TurnGuard,
}

impl std::fmt::Debug for RealBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealBackend")
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

impl RealBackend {
    fn key_file(&self) -> PathBuf {
        self.files.path().join("id_ed25519")
    }

    /// The entry's block.
    pub fn config(&self, insecure: bool) -> KvmConfig {
        KvmConfig {
            ssh_key_file: self.key_file().display().to_string(),
            insecure_ignore_host_key: insecure,
            ..block(&self.env, &self.url, &self.sha256)
        }
    }

    fn host(&self) -> RemoteHost {
        host_of(&self.env)
    }
}

/// A block for the one host `env` describes, with the environment's own key, the image
/// [`IMAGE_KEY`] at `url` (checked against `sha256` unless it is empty) and one machine type,
/// `small`.
pub fn block(env: &HypervisorEnv, url: &str, sha256: &str) -> KvmConfig {
    KvmConfig {
        ssh_key_file: env.ssh_key.display().to_string(),
        known_hosts_file: env.known_hosts.display().to_string(),
        disk_size_gb: 1,
        domain_type: Some(env.domain_type.clone()),
        images: [(
            IMAGE_KEY.to_owned(),
            KvmImage {
                url: url.to_owned(),
                sha256: sha256.to_owned(),
                ..KvmImage::default()
            },
        )]
        .into(),
        machine_types: [(
            "small".to_owned(),
            KvmMachineType {
                vcpus: 1,
                memory_mib: 256,
            },
        )]
        .into(),
        hosts: vec![KvmHost {
            name: HOST.to_owned(),
            address: env.ssh_address.clone(),
            user: env.ssh_user.clone(),
            socket: env.libvirt_socket.clone(),
            pool: env.pool.clone(),
            bridge: env.bridge.clone(),
        }],
        ..KvmConfig::default()
    }
}

/// A seam host of its own over SSH, with the environment's own key (for hooks, sweeps and a
/// test's own look at the pool).
pub fn host_of(env: &HypervisorEnv) -> RemoteHost {
    let options = DialOptions::new(&env.ssh_key, HostKeys::KnownHosts(env.known_hosts.clone()));
    RemoteHost::new(
        HostTarget {
            name: HOST.to_owned(),
            address: env.ssh_address.clone(),
            user: env.ssh_user.clone(),
            socket: env.libvirt_socket.clone(),
        },
        Arc::new(Pool::new(Arc::new(Dialer::new(options)))),
    )
}

/// Removes every domain (with its overlay and seed) whose kvm2 mark names a UID this test
/// process made: what the finished case left. The shared base image stays.
async fn sweep(env: &HypervisorEnv, generation: Generation) {
    let host = host_of(env);
    let cx = OpCtx::background().with_timeout(Duration::from_secs(120));
    let Ok(names) = host.domain_names(&cx).await else {
        return;
    };
    let ours = this_process();
    for name in names {
        let Ok(Some(element)) = host.domain_metadata(&cx, &name, generation.namespace()).await else {
            continue;
        };
        if Mark::parse(&element).is_ok_and(|m| m.uid.contains(&ours)) {
            let _ = egress_libvirt::engine::ops::remove(&cx, &host, &env.pool, &name).await;
        }
    }
}

impl Drop for RealBackend {
    fn drop(&mut self) {
        // Only the case's last backend sweeps: another one may still be in use.
        if TURN.holder.lock().unwrap_or_else(|p| p.into_inner()).1 > 1 {
            return;
        }
        // Async work from a destructor: on a thread of its own, with a runtime of its own,
        // before the turn passes to the next case.
        let (env, generation) = (self.env.clone(), self.generation);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(sweep(&env, generation));
        })
        .join();
    }
}

#[async_trait]
impl BackendHooks for RealBackend {
    async fn set_native_state(&self, name: &str, state: NativeState) -> HookResult {
        let cx = OpCtx::background();
        let host = self.host();
        let done = match state {
            NativeState::Stopped => host.destroy_domain(&cx, name).await,
            NativeState::Running => host.start_domain(&cx, name).await,
            _ => return Err(Unsupported("H02 set_native_state (a state libvirt cannot be put in)")),
        };
        done.map_err(|_| Unsupported("H02 set_native_state (libvirt refused)"))
    }

    async fn inventory(&self) -> HookResult<Vec<BackendObject>> {
        let cx = OpCtx::background();
        let host = self.host();
        let pool = &self.env.pool;
        let mut out = Vec::new();
        let names = host
            .domain_names(&cx)
            .await
            .map_err(|_| Unsupported("H05 inventory (listing failed)"))?;
        for name in names {
            let namespace = self.generation.namespace();
            let mark = match host.domain_metadata(&cx, &name, namespace).await {
                Ok(Some(element)) => Mark::parse(&element).ok(),
                _ => None,
            };
            let seed = egress_libvirt::names::seed(&name);
            let user_data = match host.download(&cx, pool, &seed, 4 << 20).await {
                Ok(iso) => read_seed_file(&iso, "user-data"),
                Err(_) => None,
            };
            out.push(BackendObject {
                kind: "instance".to_owned(),
                owner: name.clone(),
                marks: marks_of(mark.and_then(|m| m.to_xml(namespace).ok()).as_ref()),
                user_data,
            });
        }
        let volumes = host
            .volume_names(&cx, pool)
            .await
            .map_err(|_| Unsupported("H05 inventory (listing volumes failed)"))?;
        out.extend(volumes.into_iter().map(|v| volume_object(&v)));
        Ok(out)
    }

    async fn credential_path(&self) -> HookResult<PathBuf> {
        Ok(self.key_file())
    }
}

/// A libvirt provider against the local hypervisor, built by `construct` (the provider crate's
/// own) as the operator builds it.
#[derive(Clone, Copy, Debug)]
pub struct RealTarget {
    /// Which provider.
    pub generation: Generation,
    /// Its crate's constructor.
    pub construct: fn(&ProviderConfig) -> Result<Arc<dyn Provider>, BoxError>,
}

#[async_trait]
impl ConformanceTarget for RealTarget {
    type Backend = RealBackend;

    async fn backend(&self) -> Result<RealBackend, NotConfigured> {
        let env = match HypervisorEnv::load() {
            Ok(Some(env)) => env,
            Ok(None) => {
                return Err(NotConfigured(format!(
                    "no test hypervisor ({} is missing; run cargo xtask hypervisor up)",
                    HypervisorEnv::file().display()
                )));
            }
            Err(e) => return Err(NotConfigured(e)),
        };
        let turn = TURN.take();
        let (url, sha256) = served_image(&env).clone();
        let files = Arc::new(ScratchDir::new("kvm2-real"));
        let key = std::fs::read(&env.ssh_key).map_err(|e| NotConfigured(format!("{}: {e}", env.ssh_key.display())))?;
        let copy = files.path().join("id_ed25519");
        std::fs::write(&copy, key).unwrap();
        // A private key is refused when others may read it.
        std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        Ok(RealBackend {
            generation: self.generation,
            env,
            files,
            url,
            sha256,
            _turn: turn,
        })
    }

    fn build(&self, backend: &RealBackend, options: &BuildOptions) -> Result<Arc<dyn Provider>, BoxError> {
        let type_name = match self.generation {
            Generation::Kvm => "kvm",
            Generation::Kvm2 => "kvm2",
        };
        let entry = ProviderConfig::new(&options.entry_name, type_name).with_block(&backend.config(options.insecure));
        (self.construct)(&entry)
    }

    fn profile(&self) -> Profile {
        Profile {
            // A software-emulated guest boots in about half a minute.
            readiness_budget: Duration::from_secs(150),
            delete_budget: Duration::from_secs(60),
            ..profile(self.generation)
        }
    }

    fn valid_request(&self, uid: &str) -> CreateRequest {
        request_in(uid, HOST)
    }

    fn request_in(&self, uid: &str, location: &str) -> CreateRequest {
        request_in(uid, location)
    }

    fn id_for(&self, name: &str) -> ProviderId {
        ProviderId::new(egress_libvirt::engine::id::format(HOST, name))
    }

    fn fixtures(&self) -> Fixtures {
        fixtures(self.generation, &[HOST])
    }

    fn is_real(&self) -> bool {
        true
    }
}
