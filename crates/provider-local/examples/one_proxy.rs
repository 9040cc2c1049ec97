//! The local provider in a tool of its own, without the operator: reads a providers file (YAML,
//! as the operator reads it, through a registry that knows only the `local` type), builds the
//! provider of its first entry, starts one tinyproxy through it, waits until it listens, prints
//! its address, and stops it again.
//!
//! ```sh
//! cargo run -p egress-provider-local --example one_proxy                  # a built-in file
//! cargo run -p egress-provider-local --example one_proxy -- providers.yaml
//! ```
//!
//! Without a file it uses one entry whose state directory is a fresh directory under the
//! system's temporary directory, removed at the end. Needs tinyproxy (`/usr/bin/tinyproxy`, or
//! the entry's `tinyproxyPath`). Exits non-zero, naming the step, when anything fails; what the
//! create made is deleted on every path (an interrupt, Ctrl-C, leaves it). Every step has a
//! deadline.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use egress_provider::config::ProvidersConfig;
use egress_provider::{CreateRequest, InstanceState, OpCtx, Placement, Provider, ProviderId, Registry, name_from_uid};

/// tinyproxy starts listening within a second or two.
const START_PATIENCE: Duration = Duration::from_secs(30);
/// How long the delete may take to be confirmed (a stop waits 3 s before SIGKILL).
const DELETE_PATIENCE: Duration = Duration::from_secs(30);
/// The port the proxy listens on, at its own loopback address.
const PORT: u16 = 3128;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("one_proxy: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let registry = Registry::new().with(egress_provider_local::provider_type());
    let (text, file, _state) = match std::env::args_os().nth(1) {
        Some(path) => {
            let path = PathBuf::from(path);
            let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            (text, path.display().to_string(), None)
        }
        None => {
            let state = StateDir::fresh()?;
            (built_in_file(&state.0), "(built in)".to_owned(), Some(state))
        }
    };
    // The same parse and rules as the operator's, so a file it refuses is refused here too.
    let config = ProvidersConfig::parse(&text, &file, &registry)
        .map_err(|e| e.to_string())?
        .config;
    let entry = config
        .providers
        .first()
        .ok_or_else(|| format!("{file}: no provider entry"))?;
    let provider_type = registry
        .get(&entry.type_name)
        .ok_or_else(|| format!("{file}: type {:?} is not known", entry.type_name))?;
    let provider = provider_type
        .construct(entry)
        .map_err(|e| format!("building the provider: {e}"))?;

    let uid = format!("one-proxy-example-{}", std::process::id());
    let request = CreateRequest {
        name: name_from_uid(&uid),
        uid: uid.clone(),
        namespace: "example".into(),
        proxy_name: "one-proxy".into(),
        placement: Placement::default(),
        cloud_init: Vec::new(),
        port: PORT,
        installation: None,
        // A tool handing the proxy to others would mint credentials here, as the operator does.
        credentials: None,
        spread_group: None,
    };
    let cx = OpCtx::background().with_deadline((Instant::now() + START_PATIENCE).into());
    let id = match provider.create(&cx, &request).await {
        Ok(id) => id,
        Err(e) => {
            // A create that failed half-way may have left a record or a process; its id is the
            // one it would have returned.
            let made = ProviderId::new(egress_provider_local::id_of(&request.name));
            return Err(match delete(provider.as_ref(), &made).await {
                Ok(()) => format!("create: {e}"),
                Err(d) => format!("create: {e}; and cleaning up: {d}"),
            });
        }
    };
    println!("created {}", id.as_str());
    let listening = wait_listening(provider.as_ref(), &id).await;
    let deleted = delete(provider.as_ref(), &id).await;
    match (listening, deleted) {
        (Ok(ip), Ok(())) => {
            println!("listening at {ip}:{PORT}");
            println!("deleted {}", id.as_str());
            Ok(())
        }
        (Ok(_), Err(d)) => Err(d),
        (Err(r), Ok(())) => Err(r),
        (Err(r), Err(d)) => Err(format!("{r}; and {d}")),
    }
}

/// The providers file used when none is given: one `local` entry over `state_dir`.
fn built_in_file(state_dir: &std::path::Path) -> String {
    format!(
        "providers:\n  - name: dev\n    type: local\n    local:\n      stateDir: {}\n",
        state_dir.display()
    )
}

/// A state directory of this run, removed when dropped.
struct StateDir(PathBuf);

impl StateDir {
    fn fresh() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("egress-one-proxy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `get` until the proxy listens, within [`START_PATIENCE`].
async fn wait_listening(provider: &dyn Provider, id: &ProviderId) -> Result<std::net::IpAddr, String> {
    let deadline = Instant::now() + START_PATIENCE;
    loop {
        let cx = OpCtx::background().with_deadline(deadline.into());
        match provider.get(&cx, id).await {
            Ok(instance) if instance.state == InstanceState::Running => {
                if let Some(ip) = instance.ip {
                    return Ok(ip);
                }
            }
            Ok(instance) if instance.state == InstanceState::Stopped => {
                return Err("get: tinyproxy exited (its log is in the state directory)".to_owned());
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Err(format!("get: the proxy is gone: {e}")),
            Err(e) => eprintln!("one_proxy: get (retried): {e}"),
        }
        if Instant::now() >= deadline {
            return Err(format!("the proxy did not listen within {START_PATIENCE:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the proxy and waits until `get` says it is gone, within [`DELETE_PATIENCE`].
async fn delete(provider: &dyn Provider, id: &ProviderId) -> Result<(), String> {
    let deadline = Instant::now() + DELETE_PATIENCE;
    loop {
        let cx = OpCtx::background().with_deadline(deadline.into());
        if let Err(e) = provider.delete(&cx, id).await {
            eprintln!("one_proxy: delete (retried): {e}");
        }
        match provider.get(&cx, id).await {
            Err(e) if e.is_not_found() => return Ok(()),
            _ if Instant::now() >= deadline => {
                return Err(format!("the proxy was not deleted within {DELETE_PATIENCE:?}"));
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
