//! The gcp provider against a real project (`cargo xtask conformance --provider gcp --real`),
//! configured by the environment ([`egress_provider_gcp::suite_run`]): built as `construct`
//! builds it (Application Default Credentials, the production client), pointed at
//! `EGRESS_GCP_API_URL` when that is set (the xtask's own test points it at the fake).
//!
//! Every request carries this run's installation label (`EGRESS_GCP_RUN`), so the janitor the
//! xtask runs before and after the suite removes exactly what runs made. A key file is copied
//! for each case, so the cases that remove or garble the credential file (A02, A03) never touch
//! the user's own. The hooks a real project cannot honour (seeding, faults, gates, inventory)
//! answer Unsupported and their cases skip.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use egress_conformance::hooks::HookResult;
use egress_conformance::{
    BackendHooks, BuildOptions, ConformanceTarget, Fixtures, NotConfigured, Profile, Unsupported,
};
use egress_provider::{BoxError, CreateRequest, Provider, ProviderId};
use egress_provider_gcp::suite_run::RunSettings;
use egress_provider_gcp::{CredentialSource, Settings, WireOptions};
use egress_testkit::ScratchDir;

/// A real project, for one case.
#[derive(Debug)]
pub struct RealGcpBackend {
    settings: RunSettings,
    /// The case's copy of the key file, when the credentials are one.
    key: Option<(Arc<ScratchDir>, PathBuf)>,
}

impl RealGcpBackend {
    fn credentials(&self) -> CredentialSource {
        match &self.key {
            Some((_, path)) => CredentialSource::KeyFile(path.clone()),
            None => self.settings.credentials.clone(),
        }
    }
}

#[async_trait]
impl BackendHooks for RealGcpBackend {
    async fn credential_path(&self) -> HookResult<PathBuf> {
        self.key.as_ref().map(|(_, path)| path.clone()).ok_or(Unsupported(
            "H15 credential_path (the credentials are the metadata server's)",
        ))
    }
}

/// The gcp provider against the project the environment names.
#[derive(Clone, Copy, Debug)]
pub struct RealGcp;

impl RealGcp {
    fn settings() -> Result<RunSettings, String> {
        RunSettings::from_environment()
    }

    fn request(settings: &RunSettings, uid: &str, zone: &str) -> CreateRequest {
        let mut req = super::request_in(uid, zone);
        req.placement.image = settings.image.clone();
        req.placement.machine_type = settings.machine_type.clone();
        req.installation = settings.run.clone();
        req
    }
}

#[async_trait]
impl ConformanceTarget for RealGcp {
    type Backend = RealGcpBackend;

    async fn backend(&self) -> Result<RealGcpBackend, NotConfigured> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let settings = Self::settings().map_err(NotConfigured)?;
        if settings.run.is_none() {
            return Err(NotConfigured(format!(
                "{} is not set: run the suite through cargo xtask conformance --provider gcp --real",
                egress_provider_gcp::suite_run::RUN_VAR
            )));
        }
        let key = match &settings.credentials {
            CredentialSource::KeyFile(path) => {
                let dir = Arc::new(ScratchDir::new("gcp-real"));
                let copy = dir.path().join("key.json");
                let text = std::fs::read(path).map_err(|e| NotConfigured(format!("{}: {e}", path.display())))?;
                std::fs::write(&copy, text).map_err(|e| NotConfigured(format!("{}: {e}", copy.display())))?;
                Some((dir, copy))
            }
            CredentialSource::Metadata { .. } => None,
        };
        Ok(RealGcpBackend { settings, key })
    }

    fn build(&self, backend: &RealGcpBackend, options: &BuildOptions) -> Result<Arc<dyn Provider>, BoxError> {
        let s = &backend.settings;
        let provider = egress_provider_gcp::build(
            &options.entry_name,
            settings_of(s),
            backend.credentials(),
            &s.api_url,
            WireOptions::default(),
        )?;
        Ok(Arc::new(provider))
    }

    fn profile(&self) -> Profile {
        Profile {
            // A real VM takes a minute or two to run, and as long to go.
            readiness_budget: Duration::from_secs(300),
            delete_budget: Duration::from_secs(300),
            ..super::GcpTarget.profile()
        }
    }

    fn valid_request(&self, uid: &str) -> CreateRequest {
        let settings = Self::settings().unwrap_or_else(|e| panic!("{e}"));
        Self::request(&settings, uid, &settings.zones[0])
    }

    fn request_in(&self, uid: &str, location: &str) -> CreateRequest {
        let settings = Self::settings().unwrap_or_else(|e| panic!("{e}"));
        Self::request(&settings, uid, location)
    }

    fn id_for(&self, name: &str) -> ProviderId {
        let settings = Self::settings().unwrap_or_else(|e| panic!("{e}"));
        ProviderId::new(egress_provider_gcp::id::format(&settings.zones[0], name))
    }

    fn fixtures(&self) -> Fixtures {
        let mut fixtures = super::GcpTarget.fixtures();
        if let Ok(settings) = Self::settings() {
            fixtures.check_targets = vec![settings.project.clone()];
            fixtures.locations = settings.zones.clone();
        }
        // Nothing can be injected into a real project.
        fixtures.check_faults = Vec::new();
        fixtures
    }

    fn is_real(&self) -> bool {
        true
    }
}

/// The provider settings of a run: its project, and its network and subnetwork when set.
fn settings_of(run: &RunSettings) -> Settings {
    Settings::from_config(&egress_provider_gcp::GcpConfig {
        project: run.project.clone(),
        network: run.network.clone(),
        subnetwork: run.subnetwork.clone(),
        ..egress_provider_gcp::GcpConfig::default()
    })
}

/// A janitor pass: deletes the instances of the runs `which` covers and waits until they are
/// gone.
///
/// # Errors
/// The settings are missing, or the sweep failed (see [`egress_provider_gcp::suite_run::sweep`]).
pub async fn sweep(
    which: &egress_provider_gcp::suite_run::Sweep,
    pacing: egress_provider_gcp::suite_run::Pacing,
) -> Result<Vec<ProviderId>, String> {
    let settings = RealGcp::settings()?;
    let provider = egress_provider_gcp::build(
        "conformance-janitor",
        settings_of(&settings),
        settings.credentials.clone(),
        &settings.api_url,
        WireOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    let cx = egress_provider::OpCtx::background().with_timeout(pacing.budget + Duration::from_secs(60));
    egress_provider_gcp::suite_run::sweep(&provider, &cx, which, pacing)
        .await
        .map_err(|e| e.to_string())
}
