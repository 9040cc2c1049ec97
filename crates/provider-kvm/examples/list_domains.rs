//! The kvm provider in a tool of its own, without the operator: builds the provider from a
//! config block for the hypervisor that an `EGRESS_HV_ENV` file describes (`cargo xtask
//! hypervisor up` writes one for the local hypervisor; docs/providers/kvm2.md shows the format)
//! and lists the domains it manages there, the Go operator's included: one line each with its
//! id, state, address and UID mark, then a count.
//!
//! ```sh
//! cargo run -p egress-provider-kvm --example list_domains
//! EGRESS_HV_ENV=/etc/my-hypervisor.env cargo run -p egress-provider-kvm --example list_domains
//! ```
//!
//! Changes nothing on the host. Exits non-zero, naming the step, when anything fails; the list
//! has a deadline.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use egress_libvirt::HypervisorEnv;
use egress_libvirt::config::{KvmConfig, KvmHost, KvmMachineType};
use egress_provider::config::{Block, ProviderConfig};
use egress_provider::{Instance, OpCtx};

/// Connecting over SSH and listing every domain of a host.
const LIST_PATIENCE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("list_domains: {e}");
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
    // The block as a providers file would give it, checked by the rules the operator applies.
    let block = block(&env);
    KvmConfig::validate(egress_provider_kvm::TYPE_NAME, Some(&block)).map_err(|e| format!("the config block: {e}"))?;
    let entry = ProviderConfig::new("kvm-example", egress_provider_kvm::TYPE_NAME).with_block(&block);
    let provider = egress_provider_kvm::construct(&entry).map_err(|e| format!("building the provider: {e}"))?;

    let cx = OpCtx::background().with_deadline((Instant::now() + LIST_PATIENCE).into());
    let domains = provider.list_by_tag(&cx).await.map_err(|e| format!("list: {e}"))?;
    for domain in &domains {
        println!("{}", line(domain));
    }
    println!("{} managed domains", domains.len());
    Ok(())
}

/// One domain: `<id> <state> <address or -> uid=<mark>`.
fn line(domain: &Instance) -> String {
    let ip = domain.ip.map_or_else(|| "-".to_owned(), |ip| ip.to_string());
    format!("{} {:?} {ip} uid={}", domain.id.as_str(), domain.state, domain.uid)
}

/// The provider's block for the one host the description names. Listing needs no image; the
/// rules ask for one machine type.
fn block(env: &HypervisorEnv) -> KvmConfig {
    KvmConfig {
        ssh_key_file: env.ssh_key.display().to_string(),
        known_hosts_file: env.known_hosts.display().to_string(),
        domain_type: Some(env.domain_type.clone()),
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
