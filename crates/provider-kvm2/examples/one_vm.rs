//! The kvm2 provider in a tool of its own, without the operator: builds the provider from a
//! config block for the hypervisor that an `EGRESS_HV_ENV` file describes (`cargo xtask
//! hypervisor up` writes one for the local hypervisor; docs/providers/kvm2.md shows the format),
//! creates one VM, waits until it runs with an address, prints it, and deletes the VM again.
//!
//! ```sh
//! cargo run -p egress-provider-kvm2 --example one_vm
//! EGRESS_IMAGE_URL=https://mirror.example/guest.qcow2 cargo run -p egress-provider-kvm2 --example one_vm
//! ```
//!
//! The image comes from `EGRESS_IMAGE_URL`, or else the file's test guest is served to the
//! provider from this process over HTTP. Exits non-zero, naming the step, when anything fails;
//! what a create made is deleted on every path (an interrupt, Ctrl-C, leaves it). Every step has
//! a deadline.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use egress_libvirt::HypervisorEnv;
use egress_libvirt::config::{KvmConfig, KvmHost, KvmImage, KvmMachineType};
use egress_provider::config::{Block, ProviderConfig};
use egress_provider::{CreateRequest, InstanceState, OpCtx, Placement, Provider, ProviderId, name_from_uid};

/// A software-emulated guest boots in about half a minute; the first create also fetches and
/// uploads the image.
const BOOT_PATIENCE: Duration = Duration::from_secs(300);
/// How long the delete may take to be confirmed.
const DELETE_PATIENCE: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("one_vm: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let env = HypervisorEnv::load()?.ok_or_else(|| {
        format!(
            "no hypervisor description at {} (set EGRESS_HV_ENV, or run cargo xtask hypervisor up)",
            HypervisorEnv::file().display()
        )
    })?;
    // Kept alive until the end: the provider may fetch the image on the create.
    let (url, _mirror) = match std::env::var("EGRESS_IMAGE_URL") {
        Ok(url) if !url.is_empty() => (url, None),
        _ => {
            let image = std::fs::read(&env.guest_image)
                .map_err(|e| format!("reading the test guest {}: {e}", env.guest_image.display()))?;
            let mirror = egress_testkit::image_server::ImageServer::start(image, "127.0.0.1:0").await;
            (mirror.url(), Some(mirror))
        }
    };
    // The block as a providers file would give it, checked by the rules the operator applies.
    let block = block(&env, &url);
    KvmConfig::validate(egress_provider_kvm2::TYPE_NAME, Some(&block)).map_err(|e| format!("the config block: {e}"))?;
    let entry = ProviderConfig::new("kvm2-example", egress_provider_kvm2::TYPE_NAME).with_block(&block);
    let provider = egress_provider_kvm2::construct(&entry).map_err(|e| format!("building the provider: {e}"))?;

    let uid = format!("one-vm-example-{}", std::process::id());
    let request = CreateRequest {
        name: name_from_uid(&uid),
        uid: uid.clone(),
        namespace: "example".into(),
        proxy_name: "one-vm".into(),
        placement: Placement {
            zone: "hv".into(),
            machine_type: "small".into(),
            image: "guest".into(),
            ..Placement::default()
        },
        cloud_init: b"#cloud-config\n".to_vec(),
        port: 3128,
        installation: None,
        credentials: None,
        spread_group: None,
    };
    let cx = OpCtx::background().with_deadline((Instant::now() + BOOT_PATIENCE).into());
    let id = match provider.create(&cx, &request).await {
        Ok(id) => id,
        Err(e) => {
            // A create that failed half-way may have left a domain or volumes behind; its id is
            // the one it would have returned.
            let made = ProviderId::new(format!("hosts/hv/domains/{}", request.name));
            return Err(match delete(provider.as_ref(), &made).await {
                Ok(()) => format!("create: {e}"),
                Err(d) => format!("create: {e}; and cleaning up: {d}"),
            });
        }
    };
    println!("created {}", id.as_str());
    let running = wait_running(provider.as_ref(), &id).await;
    let deleted = delete(provider.as_ref(), &id).await;
    match (running, deleted) {
        (Ok(ip), Ok(())) => {
            println!("running at {ip}");
            println!("deleted {}", id.as_str());
            Ok(())
        }
        (Ok(_), Err(d)) => Err(d),
        (Err(r), Ok(())) => Err(r),
        (Err(r), Err(d)) => Err(format!("{r}; and {d}")),
    }
}

/// The provider's block for the one host the description names.
fn block(env: &HypervisorEnv, url: &str) -> KvmConfig {
    KvmConfig {
        ssh_key_file: env.ssh_key.display().to_string(),
        known_hosts_file: env.known_hosts.display().to_string(),
        domain_type: Some(env.domain_type.clone()),
        disk_size_gb: 1,
        images: [(
            "guest".to_owned(),
            KvmImage {
                url: url.to_owned(),
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
            name: "hv".into(),
            address: env.ssh_address.clone(),
            user: env.ssh_user.clone(),
            socket: env.libvirt_socket.clone(),
            pool: env.pool.clone(),
            bridge: env.bridge.clone(),
        }],
        ..KvmConfig::default()
    }
}

/// Polls `get` until the VM runs with an address, within [`BOOT_PATIENCE`].
async fn wait_running(provider: &dyn Provider, id: &ProviderId) -> Result<std::net::IpAddr, String> {
    let deadline = Instant::now() + BOOT_PATIENCE;
    loop {
        let cx = OpCtx::background().with_deadline(deadline.into());
        match provider.get(&cx, id).await {
            Ok(instance) if instance.state == InstanceState::Running => {
                if let Some(ip) = instance.ip {
                    return Ok(ip);
                }
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Err(format!("get: the VM is gone: {e}")),
            Err(e) => eprintln!("one_vm: get (retried): {e}"),
        }
        if Instant::now() >= deadline {
            return Err(format!("the VM did not run with an address within {BOOT_PATIENCE:?}"));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Deletes the VM and waits until `get` says it is gone, within [`DELETE_PATIENCE`].
async fn delete(provider: &dyn Provider, id: &ProviderId) -> Result<(), String> {
    let deadline = Instant::now() + DELETE_PATIENCE;
    loop {
        let cx = OpCtx::background().with_deadline(deadline.into());
        if let Err(e) = provider.delete(&cx, id).await {
            eprintln!("one_vm: delete (retried): {e}");
        }
        match provider.get(&cx, id).await {
            Err(e) if e.is_not_found() => return Ok(()),
            _ if Instant::now() >= deadline => {
                return Err(format!("the VM was not deleted within {DELETE_PATIENCE:?}"));
            }
            _ => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
}
