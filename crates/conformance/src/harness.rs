//! Running one case: a fresh backend, a capturing subscriber, a parent span,
//! and the skip/require rule.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use egress_provider::{CreateRequest, OpCtx, Provider, ProviderId};
use futures::FutureExt;
use tracing::Instrument;

use crate::ENTRY_NAME;
use crate::capture::Capture;
use crate::hooks::Unsupported;
use crate::target::{BuildOptions, ConformanceTarget, Fixtures, Profile};

/// Why a case did not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The real backend is not configured for this run.
    NotConfigured(String),
    /// The provider's profile or fixtures exclude the case.
    NotApplicable(String),
    /// The backend lacks a hook the case needs.
    Hook(&'static str),
}

impl From<Unsupported> for Skip {
    fn from(u: Unsupported) -> Self {
        Skip::Hook(u.0)
    }
}

/// A case's result: `Ok` passed (a failure panics), `Err` skipped.
pub type CaseResult = Result<(), Skip>;

/// Skips unless `condition` holds.
///
/// # Errors
/// [`Skip::NotApplicable`] with `why` when `condition` is false.
pub fn require(condition: bool, why: &str) -> CaseResult {
    if condition {
        Ok(())
    } else {
        Err(Skip::NotApplicable(why.to_owned()))
    }
}

/// Everything a case works with.
pub struct Scenario<T: ConformanceTarget> {
    /// The target under test.
    pub target: Arc<T>,
    /// A fresh backend (or the real one).
    pub backend: Arc<T::Backend>,
    /// Every event and span of the case.
    pub capture: Capture,
    /// The target's declared profile.
    pub profile: Profile,
    /// The target's fixtures.
    pub fixtures: Fixtures,
}

impl<T: ConformanceTarget> std::fmt::Debug for Scenario<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scenario")
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

impl<T: ConformanceTarget> Scenario<T> {
    /// A provider over the scenario's backend, as entry `conformance-entry`.
    ///
    /// # Panics
    /// When the target's constructor refuses the default options.
    pub fn provider(&self) -> Arc<dyn Provider> {
        self.provider_with(&BuildOptions {
            entry_name: ENTRY_NAME.to_owned(),
            insecure: false,
        })
    }

    /// A provider built with `options`.
    ///
    /// # Panics
    /// When the constructor refuses them.
    pub fn provider_with(&self, options: &BuildOptions) -> Arc<dyn Provider> {
        match self.target.build(&self.backend, options) {
            Ok(p) => p,
            Err(e) => panic!("building the provider failed: {e}"),
        }
    }

    /// The backend hooks.
    pub fn hooks(&self) -> &T::Backend {
        &self.backend
    }

    /// A valid request for Proxy UID `uid`.
    pub fn request(&self, uid: &str) -> CreateRequest {
        self.target.valid_request(uid)
    }

    /// The id of `name` in the default location.
    pub fn id_for(&self, name: &str) -> ProviderId {
        self.target.id_for(name)
    }

    /// Whether the target runs against a real backend.
    pub fn target_is_real(&self) -> bool {
        self.target.is_real()
    }

    /// A context that is never cancelled.
    pub fn cx(&self) -> OpCtx {
        OpCtx::background()
    }

    /// The number of the `conformance.parent` span the case runs in.
    pub fn parent_span(&self) -> u64 {
        self.capture
            .spans()
            .iter()
            .rev()
            .find(|s| s.name == crate::PARENT_SPAN)
            .map_or(0, |s| s.id)
    }
}

/// Runs one case against `target` on a fresh current-thread runtime, with
/// every event captured and the case inside a `conformance.parent` span.
///
/// A skip prints its reason; a skip because the real backend is not
/// configured panics when real backends are required
/// ([`egress_testkit::real::skip_or_fail`]).
///
/// # Panics
/// When the case fails, or must not skip.
pub fn run_case<T, F, Fut>(name: &str, target: T, case: F)
where
    T: ConformanceTarget,
    F: FnOnce(Scenario<T>) -> Fut,
    Fut: Future<Output = CaseResult>,
{
    match outcome(target, case) {
        Ok(Ok(())) => {}
        Ok(Err(skip @ Skip::NotConfigured(_))) => egress_testkit::real::skip_or_fail(name, &format!("{skip:?}")),
        Ok(Err(skip)) => println!("SKIPPED {name}: {skip:?}"),
        Err(message) => panic!("{name} failed: {message}"),
    }
}

/// Runs one case and reports how it ended instead of panicking: `Err` holds
/// the failure message. Used to prove that broken providers are caught.
///
/// # Errors
/// The case's failure (panic) message.
pub fn outcome<T, F, Fut>(target: T, case: F) -> Result<CaseResult, String>
where
    T: ConformanceTarget,
    F: FnOnce(Scenario<T>) -> Fut,
    Fut: Future<Output = CaseResult>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return Err(format!("cannot build a runtime: {e}")),
    };
    let (capture, _capturing) = Capture::start();
    let target = Arc::new(target);
    runtime.block_on(async move {
        let backend = match target.backend().await {
            Ok(b) => Arc::new(b),
            Err(nc) => return Ok(Err(Skip::NotConfigured(nc.0))),
        };
        let scenario = Scenario {
            profile: target.profile(),
            fixtures: target.fixtures(),
            target,
            backend,
            capture,
        };
        let parent = tracing::info_span!(crate::PARENT_SPAN);
        let run = AssertUnwindSafe(case(scenario).instrument(parent)).catch_unwind();
        // NB: a generous overall bound so a hung provider fails the case
        // instead of hanging the test binary.
        match tokio::time::timeout(CASE_BUDGET, run).await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(panic)) => Err(panic_message(panic.as_ref())),
            Err(_) => Err(format!("the case did not finish within {CASE_BUDGET:?}")),
        }
    })
}

/// The longest one case may take before it is failed as hung.
const CASE_BUDGET: Duration = Duration::from_secs(120);

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
