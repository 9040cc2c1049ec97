//! The gcp provider in a tool of its own, without the operator: builds the provider from a
//! config block for a project and lists the Compute Engine instances it manages there (every
//! zone, the Go operator's included): one line each with its id, state, address and UID mark,
//! then a count.
//!
//! ```sh
//! cargo run -p egress-provider-gcp --example list_instances -- my-project
//! GOOGLE_CLOUD_PROJECT=my-project cargo run -p egress-provider-gcp --example list_instances
//! cargo run -p egress-provider-gcp --example list_instances -- my-project --endpoint http://127.0.0.1:8085/compute/v1
//! ```
//!
//! Credentials are Application Default Credentials, found as the operator finds them: the key
//! file `GOOGLE_APPLICATION_CREDENTIALS` names, gcloud's
//! `~/.config/gcloud/application_default_credentials.json`, or the metadata server on a GCE VM.
//! `--endpoint` sends the Compute calls to another server speaking the same API (an emulator or
//! a test server) instead of Google's. Changes nothing. Exits non-zero, naming the step, when
//! anything fails; the list has a deadline.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use egress_provider::config::{Block, ProviderConfig};
use egress_provider::{Instance, OpCtx};
use egress_provider_gcp::{CredentialSource, GcpConfig, Settings, WireOptions};

/// A token exchange and an aggregated list, with the client's own retries of reads.
const LIST_PATIENCE: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("list_instances: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the command line asked for.
struct Args {
    project: String,
    endpoint: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut project = None;
    let mut endpoint = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--endpoint" => endpoint = Some(args.next().ok_or("--endpoint needs a URL")?),
            flag if flag.starts_with('-') => return Err(format!("unknown flag {flag}")),
            _ if project.is_some() => return Err(format!("one project only (also got {arg:?})")),
            _ => project = Some(arg),
        }
    }
    let project = project
        .or_else(|| std::env::var("GOOGLE_CLOUD_PROJECT").ok())
        .filter(|p| !p.is_empty())
        .ok_or("no project: give it as the argument or in GOOGLE_CLOUD_PROJECT")?;
    Ok(Args { project, endpoint })
}

async fn run() -> Result<(), String> {
    let args = args()?;
    // The block as a providers file would give it, checked by the rules the operator applies.
    let block = GcpConfig {
        project: args.project,
        ..GcpConfig::default()
    };
    GcpConfig::validate(egress_provider_gcp::TYPE_NAME, Some(&block)).map_err(|e| format!("the config block: {e}"))?;
    let entry = ProviderConfig::new("gcp-example", egress_provider_gcp::TYPE_NAME).with_block(&block);
    let source = CredentialSource::from_environment();
    if let CredentialSource::Metadata { host } = &source {
        eprintln!("list_instances: no key file found; asking the metadata server at {host} for a token");
    }
    let provider = match &args.endpoint {
        None => egress_provider_gcp::construct(&entry, WireOptions::default()),
        // What construct does, with another base URL: the block decoded from the entry.
        Some(url) => {
            let block: GcpConfig = entry.block()?.unwrap_or_default();
            egress_provider_gcp::build(
                &entry.name,
                Settings::from_config(&block),
                source,
                url,
                WireOptions::default(),
            )
            .map(|p| std::sync::Arc::new(p) as std::sync::Arc<dyn egress_provider::Provider>)
        }
    }
    .map_err(|e| format!("building the provider: {e}"))?;

    let cx = OpCtx::background().with_deadline((Instant::now() + LIST_PATIENCE).into());
    let instances = provider.list_by_tag(&cx).await.map_err(|e| format!("list: {e}"))?;
    for instance in &instances {
        println!("{}", line(instance));
    }
    println!("{} managed instances", instances.len());
    Ok(())
}

/// One instance: `<id> <state> <address or -> uid=<mark>`.
fn line(instance: &Instance) -> String {
    let ip = instance.ip.map_or_else(|| "-".to_owned(), |ip| ip.to_string());
    format!(
        "{} {:?} {ip} uid={}",
        instance.id.as_str(),
        instance.state,
        instance.uid
    )
}
