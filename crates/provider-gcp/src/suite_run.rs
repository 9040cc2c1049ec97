//! A run of the conformance suite against a real project (`cargo xtask conformance --provider
//! gcp --real`): its settings from the environment, checked before anything is built or sent,
//! and the janitor that removes what a run made.
//!
//! Every instance a run makes carries the installation label `conformance-<unix time>`, so the
//! janitor can find what this run, or an earlier one that was killed, left behind, and leaves
//! every other instance of the project alone (the operator's own included: they carry no
//! installation or another one).

use std::path::Path;
use std::time::Duration;

use egress_provider::{ErrorClass, Instance, Op, OpCtx, Provider, ProviderError, ProviderId};

use crate::auth::CredentialSource;
use crate::names::{is_name, is_project, region_of};

/// What every run's installation label starts with.
pub const RUN_PREFIX: &str = "conformance-";
/// The project to run in.
pub const PROJECT_VAR: &str = "EGRESS_GCP_PROJECT";
/// The zones to run in, comma-separated; the first is the default one.
pub const ZONES_VAR: &str = "EGRESS_GCP_ZONES";
/// The Compute API's base URL, for a test server (the real API when unset).
pub const API_URL_VAR: &str = "EGRESS_GCP_API_URL";
/// The boot image (default: Ubuntu 24.04 LTS).
pub const IMAGE_VAR: &str = "EGRESS_GCP_IMAGE";
/// The machine type (default `e2-micro`).
pub const MACHINE_TYPE_VAR: &str = "EGRESS_GCP_MACHINE_TYPE";
/// The VPC network, as the `gcp:` block's `network` (default `default`).
pub const NETWORK_VAR: &str = "EGRESS_GCP_NETWORK";
/// The subnetwork, as the `gcp:` block's `subnetwork` (needed with a custom-mode network).
pub const SUBNETWORK_VAR: &str = "EGRESS_GCP_SUBNETWORK";
/// Which instances a janitor pass deletes: `run` (this run's, `EGRESS_GCP_RUN`) or `all` (every
/// run's).
pub const SWEEP_VAR: &str = "EGRESS_GCP_SWEEP";
/// This run's label value, `conformance-<id>` (set by the xtask for the test processes).
pub const RUN_VAR: &str = "EGRESS_GCP_RUN";
/// The image a run boots unless told otherwise.
pub const DEFAULT_IMAGE: &str = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64";
/// The machine type a run uses unless told otherwise.
pub const DEFAULT_MACHINE_TYPE: &str = "e2-micro";

/// The settings of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSettings {
    /// Where the credentials come from (Application Default Credentials).
    pub credentials: CredentialSource,
    /// The project.
    pub project: String,
    /// The zones; at least one.
    pub zones: Vec<String>,
    /// The Compute API's base URL.
    pub api_url: String,
    /// The boot image.
    pub image: String,
    /// The machine type.
    pub machine_type: String,
    /// The `gcp:` block's `network`, when set.
    pub network: Option<String>,
    /// The `gcp:` block's `subnetwork`, when set.
    pub subnetwork: Option<String>,
    /// This run's installation label, when the run has one yet.
    pub run: Option<String>,
}

/// How a missing credential is told: the ways to configure one.
pub const NO_CREDENTIALS: &str = "no Google credentials: set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run `gcloud auth application-default login`, or run on a Compute Engine VM whose metadata server gives tokens";

impl RunSettings {
    /// The settings from environment variables `var`, with files checked by `is_file` and the
    /// metadata server by `metadata_answers` (asked only when no key file is configured and no
    /// `GCE_METADATA_HOST` names one).
    ///
    /// # Errors
    /// Every missing or malformed setting, credentials first, in one message each.
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        is_file: impl Fn(&Path) -> bool,
        metadata_answers: impl Fn(&str) -> bool,
    ) -> Result<Self, String> {
        let get = |name: &str| var(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let credentials = CredentialSource::from_vars(&var, &is_file);
        match &credentials {
            CredentialSource::KeyFile(path) if !is_file(path) => {
                return Err(format!(
                    "{NO_CREDENTIALS} (GOOGLE_APPLICATION_CREDENTIALS names {}, which is not a file)",
                    path.display()
                ));
            }
            CredentialSource::Metadata { host } if get("GCE_METADATA_HOST").is_none() && !metadata_answers(host) => {
                return Err(format!("{NO_CREDENTIALS} (the metadata server {host} does not answer)"));
            }
            _ => {}
        }
        let project =
            get(PROJECT_VAR).ok_or_else(|| format!("{PROJECT_VAR} is not set: name the project to run in"))?;
        if !is_project(&project) {
            return Err(format!("{PROJECT_VAR}={project:?} is not a project ID"));
        }
        let zones: Vec<String> = get(ZONES_VAR)
            .ok_or_else(|| {
                format!(
                    "{ZONES_VAR} is not set: name one or more zones, comma-separated (europe-west1-b,us-central1-a)"
                )
            })?
            .split(',')
            .map(|z| z.trim().to_owned())
            .filter(|z| !z.is_empty())
            .collect();
        if let Some(bad) = zones.iter().find(|z| region_of(z).is_none()) {
            return Err(format!("{ZONES_VAR}: {bad:?} is not a zone name"));
        }
        if zones.is_empty() {
            return Err(format!("{ZONES_VAR} names no zone"));
        }
        let machine_type = get(MACHINE_TYPE_VAR).unwrap_or_else(|| DEFAULT_MACHINE_TYPE.to_owned());
        if !is_name(&machine_type) {
            return Err(format!(
                "{MACHINE_TYPE_VAR}={machine_type:?} is not a machine type name"
            ));
        }
        let block = crate::config::GcpConfig {
            project: project.clone(),
            network: get(NETWORK_VAR),
            subnetwork: get(SUBNETWORK_VAR),
            ..crate::config::GcpConfig::default()
        };
        <crate::config::GcpConfig as egress_provider::config::Block>::validate(crate::TYPE_NAME, Some(&block))
            .map_err(|e| format!("{NETWORK_VAR}/{SUBNETWORK_VAR}: {e}"))?;
        let run = get(RUN_VAR);
        if let Some(run) = &run
            && !is_run_label(run)
        {
            return Err(format!(
                "{RUN_VAR}={run:?} must be {RUN_PREFIX}<digits> (the run's start, in seconds since 1970)"
            ));
        }
        Ok(Self {
            credentials,
            project,
            zones,
            api_url: get(API_URL_VAR).unwrap_or_else(|| crate::client::DEFAULT_BASE_URL.to_owned()),
            image: get(IMAGE_VAR).unwrap_or_else(|| DEFAULT_IMAGE.to_owned()),
            machine_type,
            network: block.network,
            subnetwork: block.subnetwork,
            run,
        })
    }

    /// The settings from this process's environment; the metadata server is asked for at most
    /// two seconds.
    ///
    /// # Errors
    /// As [`Self::from_vars`].
    pub fn from_environment() -> Result<Self, String> {
        Self::from_vars(|name| std::env::var(name).ok(), Path::is_file, metadata_resolves)
    }
}

/// A run's label: `conformance-` and the run's start in seconds (at most 20 digits).
pub fn is_run_label(label: &str) -> bool {
    label
        .strip_prefix(RUN_PREFIX)
        .is_some_and(|id| (1..=20).contains(&id.len()) && id.bytes().all(|c| c.is_ascii_digit()))
}

/// Whether the metadata server at `host` answers a request within about two seconds (only on
/// Google Cloud does it), so a run elsewhere without credentials stops at once.
pub fn metadata_resolves(host: &str) -> bool {
    use std::io::{Read, Write};
    use std::net::{TcpStream, ToSocketAddrs};
    let target = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:80")
    };
    let host = host.to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    // The resolver has no timeout of its own: ask on a thread and stop waiting after 2 s.
    std::thread::spawn(move || {
        let answered = (|| -> std::io::Result<bool> {
            let Some(addr) = target.to_socket_addrs()?.next() else {
                return Ok(false);
            };
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            stream.set_read_timeout(Some(Duration::from_secs(1)))?;
            stream.set_write_timeout(Some(Duration::from_secs(1)))?;
            write!(
                stream,
                "GET /computeMetadata/v1/ HTTP/1.0\r\nHost: {host}\r\nMetadata-Flavor: Google\r\n\r\n"
            )?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head)?;
            Ok(head.starts_with(b"HTTP/1.") && &head[9..12] == b"200")
        })();
        let _ = tx.send(answered.unwrap_or(false));
    });
    rx.recv_timeout(Duration::from_secs(2)).unwrap_or(false)
}

/// Which instances a janitor pass deletes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sweep {
    /// Every run's: before a run, what a killed earlier one left (and, so, the instances of a
    /// run going on at the same time in the same project).
    AllRuns,
    /// One run's (its label): after it, whatever its outcome.
    Run(String),
}

impl Sweep {
    /// The pass `EGRESS_GCP_SWEEP` (`all`, or `run` with `EGRESS_GCP_RUN`) asks for.
    ///
    /// # Errors
    /// Another value, or `run` without a run label.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        match var(SWEEP_VAR).as_deref() {
            Some("all") => Ok(Self::AllRuns),
            Some("run") => var(RUN_VAR)
                .filter(|r| is_run_label(r))
                .map(Self::Run)
                .ok_or_else(|| format!("{SWEEP_VAR}=run needs {RUN_VAR}={RUN_PREFIX}<digits>")),
            other => Err(format!("{SWEEP_VAR} must be all or run, not {other:?}")),
        }
    }

    /// Whether this pass deletes `instance`.
    pub fn covers(&self, instance: &Instance) -> bool {
        let label = instance.installation.as_deref();
        match self {
            Self::AllRuns => label.is_some_and(is_run_label),
            Self::Run(run) => label == Some(run.as_str()),
        }
    }
}

/// How the janitor paces itself.
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    /// Between two looks at what is left.
    pub poll: Duration,
    /// For the whole sweep.
    pub budget: Duration,
}

impl Default for Pacing {
    /// A look every 5 s for at most 10 minutes (a real VM takes a minute or two to go).
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(5),
            budget: Duration::from_secs(600),
        }
    }
}

/// Deletes every instance `which` covers and waits until the list shows none; returns the ids
/// it deleted. A Transient failure is tried again at the next look.
///
/// # Errors
/// A list or delete that failed other than Transient (a delete's NotFound is success), or
/// instances still there when the budget is spent (named in the message).
pub async fn sweep(
    provider: &dyn Provider,
    cx: &OpCtx,
    which: &Sweep,
    pacing: Pacing,
) -> Result<Vec<ProviderId>, ProviderError> {
    let deadline = tokio::time::Instant::now() + pacing.budget;
    let mut deleted: Vec<ProviderId> = Vec::new();
    loop {
        let unfinished = match provider.list_by_tag(cx).await {
            Ok(all) => {
                let left: Vec<Instance> = all.into_iter().filter(|i| which.covers(i)).collect();
                if left.is_empty() {
                    return Ok(deleted);
                }
                for instance in &left {
                    match provider.delete(cx, &instance.id).await {
                        Ok(()) => {}
                        Err(e) if matches!(e.class(), ErrorClass::NotFound | ErrorClass::Transient) => {}
                        Err(e) => return Err(e),
                    }
                    if !deleted.contains(&instance.id) {
                        deleted.push(instance.id.clone());
                    }
                }
                let names: Vec<&str> = left.iter().map(|i| i.id.as_str()).collect();
                format!("still there: {}", names.join(", "))
            }
            Err(e) if e.class() == ErrorClass::Transient => format!("the last list failed: {e}"),
            Err(e) => return Err(e),
        };
        if tokio::time::Instant::now() + pacing.poll > deadline {
            return Err(
                ProviderError::new(ErrorClass::Transient, Op::List, "janitor", "").with_message(format!(
                    "the sweep did not finish within {:?}; {unfinished}",
                    pacing.budget
                )),
            );
        }
        // A poll with a deadline: deletes take the API a while.
        tokio::time::sleep(pacing.poll).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use egress_provider::InstanceState;

    use super::*;

    fn settings(vars: &[(&str, &str)], files: &[&str], metadata: bool) -> Result<RunSettings, String> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let files: Vec<PathBuf> = files.iter().map(PathBuf::from).collect();
        RunSettings::from_vars(
            |name| vars.get(name).cloned(),
            |p| files.iter().any(|f| f == p),
            |_| metadata,
        )
    }

    const GOOD: [(&str, &str); 3] = [
        ("GOOGLE_APPLICATION_CREDENTIALS", "/keys/sa.json"),
        (PROJECT_VAR, "egress-test"),
        (ZONES_VAR, "europe-west1-b, us-central1-a"),
    ];

    #[test]
    fn a_run_needs_credentials_before_anything_else() {
        let e = settings(&[(PROJECT_VAR, "egress-test")], &[], false).expect_err("no credentials");
        assert!(e.starts_with(NO_CREDENTIALS), "{e}");
        assert!(
            e.contains("metadata server metadata.google.internal does not answer"),
            "{e}"
        );
        let e = settings(&GOOD, &[], false).expect_err("the key file is not there");
        assert!(
            e.contains("GOOGLE_APPLICATION_CREDENTIALS names /keys/sa.json, which is not a file"),
            "{e}"
        );
        // On Compute Engine, or with GCE_METADATA_HOST, the metadata server is the credential.
        let on_gce = [(PROJECT_VAR, "egress-test"), (ZONES_VAR, "europe-west1-b")];
        assert!(settings(&on_gce, &[], true).is_ok());
        let mut told = on_gce.to_vec();
        told.push(("GCE_METADATA_HOST", "127.0.0.1:8080"));
        assert!(settings(&told, &[], false).is_ok());
        let home = [
            ("HOME", "/home/me"),
            (PROJECT_VAR, "egress-test"),
            (ZONES_VAR, "europe-west1-b"),
        ];
        let gcloud = "/home/me/.config/gcloud/application_default_credentials.json";
        assert_eq!(
            settings(&home, &[gcloud], false).map(|s| s.credentials),
            Ok(CredentialSource::KeyFile(gcloud.into()))
        );
    }

    #[test]
    fn the_project_and_zones_are_required_and_checked() {
        let s = settings(&GOOD, &["/keys/sa.json"], false).expect("settings");
        assert_eq!(s.zones, ["europe-west1-b", "us-central1-a"]);
        assert_eq!(
            (s.api_url.as_str(), s.image.as_str(), s.machine_type.as_str(), s.run),
            (
                crate::client::DEFAULT_BASE_URL,
                DEFAULT_IMAGE,
                DEFAULT_MACHINE_TYPE,
                None
            )
        );
        for (name, value, says) in [
            (PROJECT_VAR, "", "EGRESS_GCP_PROJECT is not set"),
            (PROJECT_VAR, "Egress", "is not a project ID"),
            (ZONES_VAR, "", "EGRESS_GCP_ZONES is not set"),
            (ZONES_VAR, "europe-west1", "\"europe-west1\" is not a zone name"),
            (ZONES_VAR, ",", "names no zone"),
            (MACHINE_TYPE_VAR, "E2", "is not a machine type name"),
            (NETWORK_VAR, "My VPC", "gcp.network \"My VPC\" is not a network"),
            (SUBNETWORK_VAR, "a/b", "gcp.subnetwork \"a/b\" is not a subnetwork"),
            (RUN_VAR, "mine-1", "must be conformance-"),
            (RUN_VAR, "conformance-prod", "must be conformance-"),
        ] {
            let mut vars = GOOD.to_vec();
            vars.retain(|(k, _)| *k != name);
            vars.push((name, value));
            let e = settings(&vars, &["/keys/sa.json"], false).expect_err(says);
            assert!(e.contains(says), "{name}={value:?}: {e}");
        }
    }

    #[test]
    fn each_janitor_pass_covers_only_its_runs() {
        let with = |installation: Option<&str>| {
            Instance::new("zones/z/instances/proxy-a", InstanceState::Running)
                .with_installation(installation.map(str::to_owned))
        };
        let this = Sweep::Run("conformance-1796400000".into());
        for (label, all, mine) in [
            (Some("conformance-1796400000"), true, true),
            (Some("conformance-1"), true, false),
            (Some("conformance-prod"), false, false),
            (Some("conformance-"), false, false),
            (Some("prod"), false, false),
            (Some("my-conformance-1"), false, false),
            (None, false, false),
        ] {
            assert_eq!(
                (Sweep::AllRuns.covers(&with(label)), this.covers(&with(label))),
                (all, mine),
                "{label:?}"
            );
        }
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
        };
        assert_eq!(Sweep::from_vars(vars(&[(SWEEP_VAR, "all")])), Ok(Sweep::AllRuns));
        assert_eq!(
            Sweep::from_vars(vars(&[(SWEEP_VAR, "run"), (RUN_VAR, "conformance-7")])),
            Ok(Sweep::Run("conformance-7".into()))
        );
        assert!(Sweep::from_vars(vars(&[(SWEEP_VAR, "run")])).is_err());
        assert!(Sweep::from_vars(vars(&[])).is_err());
    }
}
