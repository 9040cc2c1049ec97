//! What a run leaves on the machine and how it goes: the child processes it recorded, the
//! local provider's instances (tinyproxy processes) in its state directory.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use egress_provider::OpCtx;

use super::layout::{ENTRY, Layout};

/// Stops what an earlier run left: its recorded child processes and its tinyproxies.
pub(super) async fn clean_leftovers(layout: &Layout) -> Result<()> {
    if let Ok(pids) = std::fs::read_to_string(layout.file("pids")) {
        for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("egress-"));
            if ours && let Some(p) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
                println!("dev: stopping process {pid} left by an earlier run");
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
    }
    if layout.state().exists() {
        let left = remove_instances(&layout.state()).await?;
        if left > 0 {
            println!("dev: removed {left} proxies left by an earlier run");
        }
    }
    let _ = std::fs::remove_dir_all(&layout.dir);
    Ok(())
}

/// Deletes every instance in `state` through the local provider; returns how many there were.
pub(super) async fn remove_instances(state: &Path) -> Result<usize> {
    let entry =
        egress_provider::config::ProviderConfig::new(ENTRY, ENTRY).with_block(&egress_provider_local::LocalConfig {
            state_dir: state.display().to_string(),
            tinyproxy_path: None,
            connect_ports: None,
        });
    let provider = egress_provider_local::construct(&entry).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cx = OpCtx::background().with_timeout(Duration::from_secs(60));
    let instances = provider.list_by_tag(&cx).await?;
    for i in &instances {
        provider.delete(&cx, &i.id).await?;
    }
    Ok(instances.len())
}

/// tinyproxy processes started with a config under `state`.
pub(super) fn tinyproxies_under(state: &Path) -> Vec<u32> {
    let needle = format!("{}/", state.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0)
                    .any(|a| String::from_utf8_lossy(a).starts_with(&needle))
            })
        })
        .collect()
}
