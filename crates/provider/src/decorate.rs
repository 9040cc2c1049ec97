//! The decorators every configured provider is wrapped in, as
//! `tracing(metrics(p))`: tracing outermost so its span also covers the
//! metrics recording. Both pass the inner result through unchanged, and
//! neither offers a checker (health checks are not provider requests).

use std::sync::Arc;

use crate::Provider;

mod metrics;
mod traced;

pub use metrics::{MeteredProvider, ProviderMetrics};
pub use traced::TracedProvider;

/// Wraps `inner`, configured as `name`, as `tracing(metrics(inner))`.
pub fn decorate(name: &str, inner: Arc<dyn Provider>, metrics: &ProviderMetrics) -> Arc<dyn Provider> {
    let metered = Arc::new(MeteredProvider::new(name, inner, metrics.clone()));
    Arc::new(TracedProvider::new(name, metered))
}
