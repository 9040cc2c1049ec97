//! The contract cases (spec/providers.md §2.3), one public async function
//! each. A case panics on a violation and returns `Err(Skip)` when the
//! provider's profile, fixtures or backend hooks exclude it.

use std::future::Future;
use std::time::Duration;

use egress_provider::{ErrorClass, Instance, OpCtx, Provider, ProviderError, ProviderId};

use crate::PROMPT;
use crate::harness::{CaseResult, Scenario, Skip};
use crate::hooks::{BackendHooks as _, BackendObject};
use crate::target::{AsyncOps, ConformanceTarget};

mod checker;
mod construction;
mod create;
mod delete;
mod errors;
mod get;
mod lifecycle;
mod list;
mod mark;
mod observability;
mod secrets;
mod stress;
mod time;

pub use checker::*;
pub use construction::*;
pub use create::*;
pub use delete::*;
pub use errors::*;
pub use get::*;
pub use lifecycle::*;
pub use list::*;
pub use mark::*;
pub use observability::*;
pub use secrets::*;
pub use stress::*;
pub use time::*;

/// Awaits `fut`, failing the case if it takes longer than `PROMPT`.
pub(crate) async fn promptly<F: Future>(what: &str, fut: F) -> F::Output {
    within(PROMPT, what, fut).await
}

/// Awaits `fut`, failing the case if it takes longer than `budget`.
pub(crate) async fn within<F: Future>(budget: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(budget, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not return within {budget:?}"),
    }
}

/// The error of a call that must fail, with context in the panic.
pub(crate) fn expect_err<T: std::fmt::Debug>(what: &str, r: Result<T, ProviderError>) -> ProviderError {
    match r {
        Ok(v) => panic!("{what}: expected an error, got Ok({v:?})"),
        Err(e) => e,
    }
}

/// The value of a call that must succeed.
pub(crate) fn expect_ok<T>(what: &str, r: Result<T, ProviderError>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: expected Ok, got {e} (class {:?})", e.class()),
    }
}

/// Asserts an error's class.
pub(crate) fn assert_class(what: &str, e: &ProviderError, class: ErrorClass) {
    assert_eq!(e.class(), class, "{what}: wrong class for error {e}");
}

/// Polls `get` every 100 ms until NotFound, within `budget`. Every answer
/// before that must be `Ok`, or Transient where `transient_ok`.
pub(crate) async fn poll_to_not_found(p: &dyn Provider, id: &ProviderId, budget: Duration, transient_ok: bool) {
    let cx = OpCtx::background();
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        match p.get(&cx, id).await {
            Err(e) if e.class() == ErrorClass::NotFound => return,
            Err(e) if transient_ok && e.class() == ErrorClass::Transient => {}
            Err(e) => panic!("get {id} while waiting for NotFound: {e} (class {:?})", e.class()),
            Ok(_) => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "get {id} did not reach NotFound within {budget:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `get` until NotFound within the profile's delete budget; Transient
/// answers are tolerated where the backend has locks or async tasks (GT6).
pub(crate) async fn poll_gone<T: ConformanceTarget>(s: &Scenario<T>, p: &dyn Provider, id: &ProviderId) {
    poll_to_not_found(p, id, s.profile.delete_budget, s.profile.async_ops != AsyncOps::None).await;
}

/// Polls `get` every 100 ms until Running with an address, within `budget`.
pub(crate) async fn poll_to_running(p: &dyn Provider, id: &ProviderId, budget: Duration) -> Instance {
    let cx = OpCtx::background();
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        match p.get(&cx, id).await {
            Ok(i) if i.state == egress_provider::InstanceState::Running => {
                assert!(i.ip.is_some(), "Running without an address: {i:?}");
                return i;
            }
            Ok(_) => {}
            Err(e) if e.class() == ErrorClass::Transient => {}
            Err(e) => panic!("get {id} while waiting for Running: {e}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id} was not Running within {budget:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Objects of `kind` owned by `name`.
pub(crate) fn owned<'a>(inv: &'a [BackendObject], name: &str, kind: &str) -> Vec<&'a BackendObject> {
    inv.iter().filter(|o| o.owner == name && o.kind == kind).collect()
}

/// The length of the backend's call log, to check later that nothing was called.
pub(crate) async fn calls_so_far<T: ConformanceTarget>(s: &Scenario<T>) -> Result<usize, Skip> {
    Ok(s.hooks().call_log().await?.len())
}

/// Fails the case when the backend saw any call after `mark`.
pub(crate) async fn assert_no_calls_since<T: ConformanceTarget>(
    s: &Scenario<T>,
    mark: usize,
    what: &str,
) -> CaseResult {
    let log = s.hooks().call_log().await?;
    assert_eq!(log.len(), mark, "{what} reached the backend: {:?}", &log[mark..]);
    Ok(())
}

/// Fails the case when anything owned by instance `name` is left, shared kinds aside.
pub(crate) async fn assert_nothing_left<T: ConformanceTarget>(s: &Scenario<T>, name: &str, what: &str) -> CaseResult {
    let inv = s.hooks().inventory().await?;
    let left: Vec<_> = inv
        .iter()
        .filter(|o| o.owner == name && !s.fixtures.shared_kinds.contains(&o.kind))
        .collect();
    assert!(left.is_empty(), "objects left {what}: {left:?}");
    Ok(())
}

/// A UID unique within the test process.
pub(crate) fn uid(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{tag}-{:08x}-{n}", std::process::id())
}

/// Writes a credential file as a Secret volume holds one: readable by its owner only (a
/// provider may refuse a key others can read).
pub(crate) fn write_credential(path: &std::path::Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, contents)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}
