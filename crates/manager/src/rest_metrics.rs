//! `rest_client_requests_total{code, method, host}`: every request the operator's Kubernetes
//! client sends, counted when its answer's head arrives (a watch counts once, when it opens), as
//! client-go counted them for the Go operator. `code` is the HTTP status, or `<error>` when no
//! answer came; `method` the HTTP method; `host` the API server's `host:port`. Every label is
//! bounded: a handful of codes and methods, one host.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestLabels {
    code: String,
    method: String,
    host: String,
}

/// The counter, and the layer that feeds it (cheap to clone).
#[derive(Clone, Debug, Default)]
pub(crate) struct RestClientMetrics {
    requests: Family<RestLabels, Counter>,
    host: String,
}

impl RestClientMetrics {
    /// The counter for requests to the API server at `host` (`host:port`).
    pub(crate) fn new(host: impl Into<String>) -> Self {
        Self {
            requests: Family::default(),
            host: host.into(),
        }
    }

    /// Registers the counter as `rest_client_requests_total`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "rest_client_requests",
            "Requests to the Kubernetes API server, by status code, method and host",
            self.requests.clone(),
        );
    }

    fn count(&self, code: String, method: &str) {
        self.requests
            .get_or_create(&RestLabels {
                code,
                method: method.to_owned(),
                host: self.host.clone(),
            })
            .inc();
    }
}

impl<S> tower::Layer<S> for RestClientMetrics {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            metrics: self.clone(),
        }
    }
}

/// The client's service, each call counted.
#[derive(Clone, Debug)]
pub(crate) struct Counted<S> {
    inner: S,
    metrics: RestClientMetrics,
}

impl<S, Req, Res> tower::Service<http::Request<Req>> for Counted<S>
where
    S: tower::Service<http::Request<Req>, Response = http::Response<Res>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Req>) -> Self::Future {
        let method = request.method().as_str().to_owned();
        let metrics = self.metrics.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            let code = match &answer {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            metrics.count(code, &method);
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer as _, ServiceExt as _};

    #[tokio::test]
    async fn each_request_is_counted_by_code_method_and_host() {
        let metrics = RestClientMetrics::new("10.96.0.1:443");
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let answering = |status: u16| {
            tower::service_fn(move |_: http::Request<()>| async move {
                Ok::<_, std::io::Error>(http::Response::builder().status(status).body(()).unwrap())
            })
        };
        for _ in 0..2 {
            let request = http::Request::get("/api/v1/namespaces").body(()).unwrap();
            metrics.layer(answering(200)).oneshot(request).await.unwrap();
        }
        let patch = http::Request::patch("/apis/x").body(()).unwrap();
        metrics.layer(answering(409)).oneshot(patch).await.unwrap();
        let failing = tower::service_fn(|_: http::Request<()>| async {
            Err::<http::Response<()>, _>(std::io::Error::other("connection refused"))
        });
        let request = http::Request::get("/api/v1/pods").body(()).unwrap();
        assert!(metrics.layer(failing).oneshot(request).await.is_err());

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"rest_client_requests_total{code="200",method="GET",host="10.96.0.1:443"} 2"#,
            r#"rest_client_requests_total{code="409",method="PATCH",host="10.96.0.1:443"} 1"#,
            r#"rest_client_requests_total{code="<error>",method="GET",host="10.96.0.1:443"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }
}
