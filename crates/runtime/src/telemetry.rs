//! Tracing export, switched by the standard OpenTelemetry environment variables only.
//!
//! Off (no SDK, no IDs on log lines) when `OTEL_SDK_DISABLED=true`, when
//! `OTEL_TRACES_EXPORTER=none`, or when none of `OTEL_TRACES_EXPORTER`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set. Otherwise spans
//! go to an OTLP collector (`http/protobuf` by default, or `grpc`), or to stdout with
//! `OTEL_TRACES_EXPORTER=console`. Endpoint, headers, timeout, sampler, batch settings and
//! resource attributes come from the SDK's own handling of the standard variables.

use std::time::{Duration, SystemTime};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{KeyValue, global};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracerProvider, SpanData, SpanExporter};

/// Spans waiting for export are capped, so a slow collector costs bounded memory.
const MAX_QUEUE: usize = 512;

/// What the environment asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Off,
    Otlp(Protocol),
    Console,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    HttpProtobuf,
    Grpc,
}

/// Reads the mode from environment variables, given as a lookup so the rules are testable.
///
/// # Errors
///
/// An exporter or protocol this build does not have, named with the variable that asked for it.
pub fn mode(env: impl Fn(&str) -> Option<String>) -> Result<Mode, String> {
    let set = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(Mode::Off);
    }
    let exporter = set("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase());
    let endpoint = set("OTEL_EXPORTER_OTLP_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"));
    match exporter.as_deref() {
        Some("none") => Ok(Mode::Off),
        Some("console") => Ok(Mode::Console),
        None if endpoint.is_none() => Ok(Mode::Off),
        None | Some("otlp") => {
            let (var, value) = match set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
                Some(v) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", v),
                None => (
                    "OTEL_EXPORTER_OTLP_PROTOCOL",
                    set("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap_or_else(|| "http/protobuf".into()),
                ),
            };
            match value.trim() {
                "http/protobuf" => Ok(Mode::Otlp(Protocol::HttpProtobuf)),
                "grpc" => Ok(Mode::Otlp(Protocol::Grpc)),
                other => Err(format!(
                    "{var}={other:?} is not supported: use http/protobuf (port 4318) or grpc (port 4317)"
                )),
            }
        }
        Some(other) => Err(format!(
            "OTEL_TRACES_EXPORTER={other:?} is not supported: use otlp, console or none"
        )),
    }
}

/// Builds the tracer provider for `mode` and installs the W3C propagators. `None` when off.
///
/// # Errors
///
/// The exporter could not be built (for example a malformed endpoint).
pub fn provider(mode: Mode, service: &str, version: &str) -> Result<Option<SdkTracerProvider>, String> {
    let exporter: Box<dyn ExportAny> = match mode {
        Mode::Off => return Ok(None),
        Mode::Console => Box::new(Console),
        Mode::Otlp(Protocol::HttpProtobuf) => {
            use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| format!("building the OTLP HTTP client: {e}"))?;
            Box::new(
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .build()
                    .map_err(|e| format!("building the OTLP exporter: {e}"))?,
            )
        }
        Mode::Otlp(Protocol::Grpc) => Box::new(
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build()
                .map_err(|e| format!("building the OTLP gRPC exporter: {e}"))?,
        ),
    };
    let batch = BatchConfigBuilder::default().with_max_queue_size(MAX_QUEUE).build();
    let processor = BatchSpanProcessor::builder(Boxed(exporter), opentelemetry_sdk::runtime::Tokio)
        .with_batch_config(batch)
        .build();
    // Ours first, then OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME: the environment wins.
    // (The SDK's own service-name detector is left out: without OTEL_SERVICE_NAME it would put
    // `unknown_service:<exe>` over ours.)
    let mut resource = Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", service.to_owned()),
            KeyValue::new("service.version", version.to_string()),
        ])
        .with_detector(Box::new(opentelemetry_sdk::resource::EnvResourceDetector::new()));
    if let Some(name) = std::env::var("OTEL_SERVICE_NAME").ok().filter(|n| !n.trim().is_empty()) {
        resource = resource.with_attribute(KeyValue::new("service.name", name));
    }
    let resource = resource.build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    global::set_text_map_propagator(opentelemetry::propagation::TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
    Ok(Some(provider))
}

/// The tracer spans are made with.
pub fn tracer(provider: &SdkTracerProvider) -> opentelemetry_sdk::trace::SdkTracer {
    provider.tracer("egress-operator")
}

/// Flushes what is pending and stops the exporter, on a blocking thread and within `budget`
/// (the SDK's flush blocks its caller).
///
/// # Errors
///
/// The flush failed or ran out of its budget.
pub async fn shutdown(provider: SdkTracerProvider, budget: Duration) -> Result<(), String> {
    let done = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(budget));
    match tokio::time::timeout(budget + Duration::from_secs(1), done).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {budget:?}")),
    }
}

/// The exporters differ in type; the processor wants one.
trait ExportAny: Send + Sync + std::fmt::Debug {
    fn export_boxed(
        &self,
        batch: Vec<SpanData>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = OTelSdkResult> + Send + '_>>;
    fn shutdown_boxed(&self, timeout: Duration) -> OTelSdkResult;
    fn set_resource_boxed(&mut self, resource: &Resource);
}

impl<E: SpanExporter + Sync> ExportAny for E {
    fn export_boxed(
        &self,
        batch: Vec<SpanData>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = OTelSdkResult> + Send + '_>> {
        Box::pin(self.export(batch))
    }
    fn shutdown_boxed(&self, timeout: Duration) -> OTelSdkResult {
        self.shutdown_with_timeout(timeout)
    }
    fn set_resource_boxed(&mut self, resource: &Resource) {
        self.set_resource(resource);
    }
}

#[derive(Debug)]
struct Boxed(Box<dyn ExportAny>);

impl SpanExporter for Boxed {
    fn export(&self, batch: Vec<SpanData>) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        self.0.export_boxed(batch)
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_boxed(timeout)
    }
    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource_boxed(resource);
    }
}

/// `OTEL_TRACES_EXPORTER=console`: one JSON object per span on stdout, for local use.
#[derive(Debug)]
struct Console;

impl SpanExporter for Console {
    fn export(&self, batch: Vec<SpanData>) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        for span in batch {
            let attributes: serde_json::Map<String, serde_json::Value> = span
                .attributes
                .iter()
                .map(|kv| (kv.key.to_string(), kv.value.to_string().into()))
                .collect();
            let line = serde_json::json!({
                "name": span.name,
                "traceID": span.span_context.trace_id().to_string(),
                "spanID": span.span_context.span_id().to_string(),
                "parentSpanID": span.parent_span_id.to_string(),
                "kind": format!("{:?}", span.span_kind),
                "start": unix(span.start_time),
                "end": unix(span.end_time),
                "status": format!("{:?}", span.status),
                "attributes": attributes,
            });
            let _ = writeln!(out, "{line}");
        }
        std::future::ready(Ok(()))
    }
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(vars: &[(&str, &str)]) -> Result<Mode, String> {
        mode(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn the_environment_switches_tracing() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let rows: [(Vars<'_>, Result<Mode, String>); 10] = [
            (&[], Ok(Mode::Off)),
            (&[("OTEL_SERVICE_NAME", "x")], Ok(Mode::Off)),
            (&[endpoint], Ok(Mode::Otlp(Protocol::HttpProtobuf))),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")],
                Ok(Mode::Otlp(Protocol::HttpProtobuf)),
            ),
            (&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")], Ok(Mode::Off)),
            (&[endpoint, ("OTEL_TRACES_EXPORTER", "none")], Ok(Mode::Off)),
            (&[("OTEL_TRACES_EXPORTER", "console")], Ok(Mode::Console)),
            (
                &[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                Ok(Mode::Otlp(Protocol::Grpc)),
            ),
            (
                &[
                    endpoint,
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
                ],
                Err("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=\"http/json\" is not supported: use http/protobuf (port 4318) or grpc (port 4317)".into()),
            ),
            (
                &[("OTEL_TRACES_EXPORTER", "zipkin")],
                Err("OTEL_TRACES_EXPORTER=\"zipkin\" is not supported: use otlp, console or none".into()),
            ),
        ];
        for (vars, want) in rows {
            assert_eq!(mode_of(vars), want, "{vars:?}");
        }
    }
}
