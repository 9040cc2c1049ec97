//! One client span per provider call: `provider.create|get|delete|list|mark`.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use tracing::field::Empty;
use tracing::{Instrument, Span};

use crate::error::result_label;
use crate::{CreateRequest, ErrorClass, Instance, Op, OpCtx, Provider, ProviderError, ProviderId};

/// Opens a span per call with `provider.name`, `provider.id` (when there is
/// one) and `provider.result`. The span status is an error for every class
/// except NotFound: polling until NotFound is the normal way to watch a
/// delete finish.
#[derive(Debug)]
pub struct TracedProvider {
    name: String,
    inner: Arc<dyn Provider>,
}

/// A span with a literal name per op (tracing names are static).
fn span_for(op: Op, name: &str) -> Span {
    macro_rules! span {
        ($n:literal) => {
            tracing::info_span!(
                $n,
                otel.kind = "client",
                provider.name = %name,
                provider.id = Empty,
                provider.result = Empty,
                otel.status_code = Empty,
                otel.status_description = Empty,
            )
        };
    }
    match op {
        Op::Create => span!("provider.create"),
        Op::Get => span!("provider.get"),
        Op::Delete => span!("provider.delete"),
        Op::List => span!("provider.list"),
        Op::Mark => span!("provider.mark"),
    }
}

impl TracedProvider {
    /// Traces `inner`, configured as `name`.
    pub fn new(name: &str, inner: Arc<dyn Provider>) -> Self {
        Self {
            name: name.to_owned(),
            inner,
        }
    }

    /// Runs `call` inside the op's span. `returned_id` picks an id out of a
    /// successful result (create learns its id only at the end).
    async fn traced<T, F>(
        &self,
        op: Op,
        id: Option<&ProviderId>,
        call: F,
        returned_id: fn(&T) -> Option<&ProviderId>,
    ) -> Result<T, ProviderError>
    where
        F: Future<Output = Result<T, ProviderError>>,
    {
        let span = span_for(op, &self.name);
        if let Some(id) = id {
            span.record("provider.id", id.as_str());
        }
        let result = call.instrument(span.clone()).await;
        if let Some(id) = result.as_ref().ok().and_then(returned_id) {
            span.record("provider.id", id.as_str());
        }
        span.record("provider.result", result_label(&result));
        match &result {
            Err(e) if e.class() != ErrorClass::NotFound => {
                span.record("otel.status_code", "error");
                span.record("otel.status_description", e.class().label());
            }
            _ => {
                span.record("otel.status_code", "ok");
            }
        }
        result
    }
}

#[async_trait]
impl Provider for TracedProvider {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        self.traced(Op::Create, None, self.inner.create(cx, req), |id| Some(id))
            .await
    }

    async fn get(&self, cx: &OpCtx, id: &ProviderId) -> Result<Instance, ProviderError> {
        self.traced(Op::Get, Some(id), self.inner.get(cx, id), |_| None).await
    }

    async fn delete(&self, cx: &OpCtx, id: &ProviderId) -> Result<(), ProviderError> {
        self.traced(Op::Delete, Some(id), self.inner.delete(cx, id), |_| None)
            .await
    }

    async fn list_by_tag(&self, cx: &OpCtx) -> Result<Vec<Instance>, ProviderError> {
        self.traced(Op::List, None, self.inner.list_by_tag(cx), |_| None).await
    }

    async fn mark_installation(&self, cx: &OpCtx, id: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        let call = self.inner.mark_installation(cx, id, installation);
        self.traced(Op::Mark, Some(id), call, |_| None).await
    }
}
