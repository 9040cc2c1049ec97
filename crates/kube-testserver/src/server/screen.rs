//! What a request meets before it is served: the test's request hook, then the faults a test
//! injected for its verb and resource.

use std::sync::Arc;

use http::{Response, StatusCode};

use super::respond::{Body, RESET_HEADER, full, reason_for};
use super::shared::Shared;
use crate::faults::{FaultAction, HookVerdict, HookedRequest, Verb};
use crate::status::ApiError;
use crate::store::Target;

fn shutting_down() -> ApiError {
    ApiError::new(503, "ServiceUnavailable", "shutting down")
}

/// Runs the request hook and the injected faults on a request for `verb` on `resource` of
/// `t`. `Ok(None)`: serve it; `Ok(Some(response))`: answer this instead (a reset connection);
/// an error: answer with it.
pub(super) async fn screen(
    shared: &Arc<Shared>,
    t: &Target,
    verb: Verb,
    resource: &str,
    client: Option<&str>,
    query: Option<&str>,
) -> Result<Option<Response<Body>>, ApiError> {
    if let Some(hook) = shared.faults.hook() {
        let request = HookedRequest {
            verb,
            resource: resource.to_owned(),
            namespace: t.namespace.clone(),
            name: t.name.clone(),
            client: client.map(str::to_owned),
            query: query.map(str::to_owned),
        };
        let verdict = tokio::select! {
            v = hook(request) => v,
            _ = shared.shutdown.cancelled() => return Err(shutting_down()),
        };
        match verdict {
            HookVerdict::Serve => {}
            HookVerdict::Fail { code, reason, message } => {
                return Err(ApiError::new(code, reason.unwrap_or(reason_for(code)), message));
            }
            HookVerdict::Reset => {
                let mut r = full(StatusCode::SERVICE_UNAVAILABLE, "text/plain", Vec::new());
                r.headers_mut()
                    .insert(RESET_HEADER, "1".parse().expect("a valid header"));
                return Ok(Some(r));
            }
        }
    }
    match shared.faults.take(verb, resource) {
        Some(FaultAction::Fail(code)) => Err(ApiError::new(
            code,
            reason_for(code),
            format!("injected fault: {verb} {resource} fails with {code}"),
        )),
        Some(FaultAction::Delay(d)) => {
            tokio::select! {
                _ = tokio::time::sleep(d) => Ok(None),
                _ = shared.shutdown.cancelled() => Err(shutting_down()),
            }
        }
        None => Ok(None),
    }
}
