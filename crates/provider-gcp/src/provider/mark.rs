//! `mark_installation` on Compute Engine: read the instance, then `instances.setLabels` with
//! every label it carries plus the installation's, and the label fingerprint read with them. The
//! API refuses a stale fingerprint (412 `conditionNotMet`), so a label written since the read is
//! never lost: the call is then Transient, and the next one reads again. setLabels answers with
//! an operation, which is waited for, so that get and list read the label once the call returns.

use std::time::Duration;

use egress_provider::{
    ErrorClass, LABEL_INSTALLATION, LABEL_MANAGED, LABEL_MANAGED_YES, Marking, Op, OpCtx, ProviderError, ProviderId,
    marking,
};
use serde_json::{Value, json};

use super::{CALL_BUDGET, GcpProvider, Operation, Submission};
use crate::classify::{Call, classify, classify_operation_error};
use crate::id;
use crate::state::ApiInstance;

/// How often a running setLabels operation is read.
pub const OPERATION_POLL: Duration = Duration::from_millis(200);

/// The body of `instances.setLabels` (the API replaces every label with those sent): the labels
/// `api` carries with the installation's added, and the fingerprint they were read with.
pub fn set_labels_body(api: &ApiInstance, installation: &str) -> Value {
    let mut labels = api.labels.clone();
    labels.insert(LABEL_INSTALLATION.to_owned(), installation.to_owned());
    json!({"labels": labels, "labelFingerprint": api.label_fingerprint})
}

impl GcpProvider {
    /// See [`egress_provider::Provider::mark_installation`]: one read, one setLabels and its
    /// operation, within [`CALL_BUDGET`] together.
    pub(super) async fn mark(&self, cx: &OpCtx, pid: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        let op = Op::Mark;
        let budgeted = cx.clone().with_timeout(CALL_BUDGET);
        let cx = &budgeted;
        let (zone, name) = id::parse(pid.as_str()).map_err(|m| self.permanent(op, pid.as_str(), m))?;
        let path = format!("zones/{zone}/instances/{name}");
        let api = self.read_for_mark(cx, pid, zone, &path).await?;
        let managed = api.labels.get(LABEL_MANAGED).map(String::as_str) == Some(LABEL_MANAGED_YES);
        let current = api.labels.get(LABEL_INSTALLATION).map(String::as_str);
        match marking(pid.as_str(), managed, current, installation) {
            Marking::AlreadyMarked => {
                tracing::debug!(provider = %self.inner.entry, id = %pid, installation, "gcp instance already marked");
                return Ok(());
            }
            Marking::Refused(why) => return Err(self.permanent(op, pid.as_str(), why)),
            Marking::Write => {}
        }
        let body = set_labels_body(&api, installation);
        let answer = self
            .call(cx, Call::SetLabels, &format!("{path}/setLabels"), &[], Some(&body), &[])
            .await
            .map_err(|f| self.error(op, pid.as_str(), Call::SetLabels, &f))?;
        self.await_operation(cx, pid, zone, answer).await?;
        tracing::debug!(provider = %self.inner.entry, id = %pid, installation, "gcp instance marked");
        Ok(())
    }

    /// The instance to mark, as the API shows it. One that is not found is NotFound, unless this
    /// provider's insert of it is still running (Transient: it is marked once it is made) or
    /// failed after it was accepted (that failure's class), as get tells them apart.
    async fn read_for_mark(
        &self,
        cx: &OpCtx,
        pid: &ProviderId,
        zone: &str,
        path: &str,
    ) -> Result<ApiInstance, ProviderError> {
        let op = Op::Mark;
        let failed = |class: ErrorClass, message: String| {
            ProviderError::new(class, op, &self.inner.entry, pid.as_str()).with_message(message)
        };
        match self.call(cx, Call::Get, path, &[], None, &[]).await {
            Ok(v) => serde_json::from_value(v)
                .map_err(|e| failed(ErrorClass::Transient, format!("get: undecodable instance: {e}"))),
            Err(f) if classify(&f, Call::Get) == ErrorClass::NotFound => {
                match self.remembered_insert(cx, op, pid.as_str(), zone).await? {
                    Submission::Pending => Err(failed(
                        ErrorClass::Transient,
                        "the instance's insert is still running; it is marked once it is made".to_owned(),
                    )),
                    Submission::Failed(class, detail) => Err(failed(
                        class,
                        format!("the insert failed after it was accepted: {detail}"),
                    )),
                    Submission::Unknown | Submission::Gone => Err(self.error(op, pid.as_str(), Call::Get, &f)),
                }
            }
            Err(f) => Err(self.error(op, pid.as_str(), Call::Get, &f)),
        }
    }

    /// Waits until the setLabels operation `answer` is done, reading it every
    /// [`OPERATION_POLL`], and reports its failure. An operation that cannot be read (gone, or
    /// the budget out) is Transient: the label may land all the same, and the next call reads it.
    async fn await_operation(
        &self,
        cx: &OpCtx,
        pid: &ProviderId,
        zone: &str,
        answer: Value,
    ) -> Result<(), ProviderError> {
        let op = Op::Mark;
        let transient = |message: String| {
            ProviderError::new(ErrorClass::Transient, op, &self.inner.entry, pid.as_str()).with_message(message)
        };
        let mut operation: Operation = serde_json::from_value(answer).unwrap_or_default();
        while !operation.name.is_empty() && operation.status != "DONE" {
            if let Err(why) = cx.run(tokio::time::sleep(OPERATION_POLL)).await {
                return Err(transient(format!(
                    "waiting for setLabels operation {}: {why}",
                    operation.name
                )));
            }
            let path = format!("zones/{zone}/operations/{}", operation.name);
            let read = self.call(cx, Call::Operation, &path, &[], None, &[]).await;
            let value = read.map_err(|f| match classify(&f, Call::Operation) {
                // The operation, not the instance, is missing.
                ErrorClass::NotFound => transient(format!("setLabels operation {}: {f}", operation.name)),
                _ => self.error(op, pid.as_str(), Call::Operation, &f),
            })?;
            operation = serde_json::from_value(value)
                .map_err(|e| transient(format!("setLabels operation {}: undecodable: {e}", operation.name)))?;
        }
        match operation.error.filter(|e| !e.errors.is_empty()) {
            None => Ok(()),
            Some(errors) => {
                let codes: Vec<String> = errors.errors.iter().map(|e| e.code.clone()).collect();
                let class = classify_operation_error(&codes, operation.http_error_status_code);
                let detail = errors
                    .errors
                    .iter()
                    .map(|e| format!("{}: {}", e.code, egress_provider::redact(&e.message)))
                    .collect::<Vec<_>>()
                    .join("; ");
                Err(ProviderError::new(class, op, &self.inner.entry, pid.as_str())
                    .with_message(format!("setLabels failed after it was accepted: {detail}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_labels_sends_every_label_with_the_installation_and_the_fingerprint_read() {
        let api: ApiInstance = serde_json::from_value(json!({
            "name": "proxy-x",
            "labels": {"proxy-operator-managed": "true", "proxy-operator-uid": "u-1", "team": "crawl"},
            "labelFingerprint": "cX7Ia0IBvbs=",
        }))
        .unwrap();
        assert_eq!(
            set_labels_body(&api, "blue"),
            json!({
                "labels": {
                    "proxy-operator-managed": "true", "proxy-operator-uid": "u-1", "team": "crawl",
                    "proxy-operator-installation": "blue",
                },
                "labelFingerprint": "cX7Ia0IBvbs=",
            })
        );
    }
}
