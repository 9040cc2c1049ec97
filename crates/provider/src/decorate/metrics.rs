//! `proxy_operator_provider_requests_total{provider, op, result}`.

use std::sync::Arc;

use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::error::result_label;
use crate::{CreateRequest, Instance, Op, OpCtx, Provider, ProviderError, ProviderId};

/// Labels of the request counter. Every value is bounded: the configured
/// entry name, one of five ops, one of five results.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    provider: String,
    op: String,
    result: String,
}

/// The provider request counter, shared by every metered provider.
#[derive(Clone, Debug, Default)]
pub struct ProviderMetrics {
    requests: Family<RequestLabels, Counter>,
}

impl ProviderMetrics {
    /// A counter family not yet registered anywhere.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the counter as `proxy_operator_provider_requests_total`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "proxy_operator_provider_requests",
            "Provider calls by configured provider, operation and result",
            self.requests.clone(),
        );
    }

    /// The current count for one label set (for tests and diagnostics).
    pub fn requests(&self, provider: &str, op: Op, result: &str) -> u64 {
        self.requests.get_or_create(&labels(provider, op, result)).get()
    }

    fn count(&self, provider: &str, op: Op, result: &str) {
        self.requests.get_or_create(&labels(provider, op, result)).inc();
    }
}

fn labels(provider: &str, op: Op, result: &str) -> RequestLabels {
    RequestLabels {
        provider: provider.to_owned(),
        op: op.as_str().to_owned(),
        result: result.to_owned(),
    }
}

/// Counts every call of the inner provider once, by its outcome.
#[derive(Debug)]
pub struct MeteredProvider {
    name: String,
    inner: Arc<dyn Provider>,
    metrics: ProviderMetrics,
}

impl MeteredProvider {
    /// Meters `inner`, configured as `name`.
    pub fn new(name: &str, inner: Arc<dyn Provider>, metrics: ProviderMetrics) -> Self {
        Self {
            name: name.to_owned(),
            inner,
            metrics,
        }
    }

    fn record<T>(&self, op: Op, result: Result<T, ProviderError>) -> Result<T, ProviderError> {
        self.metrics.count(&self.name, op, result_label(&result));
        result
    }
}

#[async_trait]
impl Provider for MeteredProvider {
    async fn create(&self, cx: &OpCtx, req: &CreateRequest) -> Result<ProviderId, ProviderError> {
        self.record(Op::Create, self.inner.create(cx, req).await)
    }

    async fn get(&self, cx: &OpCtx, id: &ProviderId) -> Result<Instance, ProviderError> {
        self.record(Op::Get, self.inner.get(cx, id).await)
    }

    async fn delete(&self, cx: &OpCtx, id: &ProviderId) -> Result<(), ProviderError> {
        self.record(Op::Delete, self.inner.delete(cx, id).await)
    }

    async fn list_by_tag(&self, cx: &OpCtx) -> Result<Vec<Instance>, ProviderError> {
        self.record(Op::List, self.inner.list_by_tag(cx).await)
    }

    async fn mark_installation(&self, cx: &OpCtx, id: &ProviderId, installation: &str) -> Result<(), ProviderError> {
        self.record(Op::Mark, self.inner.mark_installation(cx, id, installation).await)
    }
}
