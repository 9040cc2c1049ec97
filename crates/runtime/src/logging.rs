//! Log lines shaped like the Go operator's (zap through controller-runtime's flags), so log
//! pipelines built for it keep parsing them:
//!
//! - json: `{"level":"info","ts":"2026-11-29T21:47:16Z","logger":"egress_controller.gc","msg":"...","key":"value"}`
//! - console: `2026-11-29T21:47:16.123Z\tINFO\tegress_controller.gc\tmessage\t{"key": "value"}`
//!
//! Fields of the enclosing spans are added to each line (the logr "values" of a context logger).
//! With tracing on, a line inside a span carries that span's `traceID` and `spanID`; with tracing
//! off nothing is added. Warnings are written as Info lines whose message starts with
//! `WARNING:`, as the Go operator wrote them (logr has no warn level). Lines go to stderr.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use tracing::field::{Field, Visit};
use tracing::{Dispatch, Event, Level, Subscriber};
use tracing_subscriber::Layer as _;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;

/// The `--zap-*` flags as given; unset ones follow `--zap-devel`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOptions {
    pub devel: bool,
    pub encoder: Option<Encoder>,
    pub level: Option<LogLevel>,
    pub stacktrace_level: Option<StacktraceLevel>,
    pub time_encoding: Option<TimeEncoding>,
}

impl Default for LogOptions {
    fn default() -> Self {
        // The Go operator set Development: true, so that is the base here too.
        Self {
            devel: true,
            encoder: None,
            level: None,
            stacktrace_level: None,
            time_encoding: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoder {
    Json,
    Console,
}

impl FromStr for Encoder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(Self::Json),
            "console" => Ok(Self::Console),
            _ => Err(format!("invalid encoder value {s:?}")),
        }
    }
}

/// `debug`, `info`, `error`, or a verbosity `n > 0` (logr's V(n); 1 is debug, more is trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Error,
    Verbosity(u32),
}

impl FromStr for LogLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "debug" => Ok(Self::Debug),
            "info" => Ok(Self::Info),
            "error" => Ok(Self::Error),
            _ => match s.parse::<u32>() {
                Ok(n) if n > 0 => Ok(Self::Verbosity(n)),
                _ => Err(format!("invalid log level {s:?}")),
            },
        }
    }
}

impl LogLevel {
    fn most_verbose(self) -> Level {
        match self {
            Self::Debug | Self::Verbosity(1) => Level::DEBUG,
            Self::Verbosity(_) => Level::TRACE,
            Self::Info => Level::INFO,
            Self::Error => Level::ERROR,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StacktraceLevel {
    Info,
    Warn,
    Error,
    Panic,
}

impl FromStr for StacktraceLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "info" => Ok(Self::Info),
            "error" => Ok(Self::Error),
            "panic" => Ok(Self::Panic),
            _ => Err(format!("invalid stacktrace level {s:?}")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeEncoding {
    Epoch,
    Millis,
    Nano,
    Iso8601,
    Rfc3339,
    Rfc3339Nano,
}

impl FromStr for TimeEncoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "epoch" => Ok(Self::Epoch),
            "millis" => Ok(Self::Millis),
            "nano" => Ok(Self::Nano),
            "iso8601" => Ok(Self::Iso8601),
            "rfc3339" => Ok(Self::Rfc3339),
            "rfc3339nano" => Ok(Self::Rfc3339Nano),
            _ => Err(format!("invalid time encoding {s:?}")),
        }
    }
}

/// The effective settings, defaults filled in from `--zap-devel` as controller-runtime does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    pub encoder: Encoder,
    pub level: LogLevel,
    pub stacktrace: StacktraceLevel,
    pub time: TimeEncoding,
}

impl LogOptions {
    pub fn resolve(&self) -> LogConfig {
        let (encoder, level, stacktrace, time) = if self.devel {
            (
                Encoder::Console,
                LogLevel::Debug,
                StacktraceLevel::Warn,
                TimeEncoding::Iso8601,
            )
        } else {
            (
                Encoder::Json,
                LogLevel::Info,
                StacktraceLevel::Error,
                TimeEncoding::Epoch,
            )
        };
        LogConfig {
            encoder: self.encoder.unwrap_or(encoder),
            level: self.level.unwrap_or(level),
            stacktrace: self.stacktrace_level.unwrap_or(stacktrace),
            // NB: zap's JSON encoder writes epoch seconds unless told otherwise, even in
            // development mode; the console one writes ISO 8601.
            time: self.time_encoding.unwrap_or(match (self.encoder, self.devel) {
                (Some(Encoder::Json), _) => TimeEncoding::Epoch,
                _ => time,
            }),
        }
    }
}

/// The level a line is written with: the Go operator had no warn level, so warnings are Info.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Written {
    Debug,
    Info,
    Error,
}

fn written(level: Level) -> Written {
    if level == Level::ERROR {
        Written::Error
    } else if level == Level::WARN || level == Level::INFO {
        Written::Info
    } else {
        Written::Debug
    }
}

impl LogConfig {
    /// Whether a line of this target and level is written. The operator's own crates and kube
    /// follow the level; other libraries are capped at info (their debug output is transport
    /// noise); the OpenTelemetry SDK's own reports are debug lines (an unreachable collector is
    /// not an operator error).
    pub fn enabled(&self, target: &str, level: Level) -> bool {
        let most_verbose = self.level.most_verbose();
        if target.starts_with("egress") && target.ends_with("::wire") {
            // Raw wire logs (gcp's) are V(5): only `--zap-log-level=5` or more shows them.
            return (level == Level::TRACE && matches!(self.level, LogLevel::Verbosity(n) if n >= 5))
                || level <= Level::INFO;
        }
        if is_otel(target) {
            return Level::DEBUG <= most_verbose;
        }
        let cap = if target.starts_with("egress") || target.starts_with("kube") {
            most_verbose
        } else {
            most_verbose.min(Level::INFO)
        };
        level <= cap
    }

    fn stacktrace_for(&self, level: Written) -> bool {
        match self.stacktrace {
            StacktraceLevel::Info => level >= Written::Info,
            // Warnings are written as Info, and nothing is written at warn or panic level.
            StacktraceLevel::Warn | StacktraceLevel::Error => level >= Written::Error,
            StacktraceLevel::Panic => false,
        }
    }
}

fn is_otel(target: &str) -> bool {
    target.starts_with("opentelemetry")
}

/// The dispatcher the formatter asks for a span's trace context (set once tracing is on). Weak:
/// the dispatcher owns the formatter.
static TRACE_DISPATCH: OnceLock<tracing::dispatcher::WeakDispatch> = OnceLock::new();

/// Lets the formatter put `traceID` and `spanID` on lines inside spans.
pub fn enable_trace_ids(dispatch: &Dispatch) {
    let _ = TRACE_DISPATCH.set(dispatch.downgrade());
}

/// The keys a program puts on the lines inside one kind of span, in place of that span's own
/// fields: the operator gives a reconcile's lines the keys controller-runtime gave them.
#[derive(Debug, Clone, Copy)]
pub struct SpanKeys {
    /// The span's name.
    pub span: &'static str,
    /// The keys, from the span's fields.
    pub keys: fn(serde_json::Map<String, serde_json::Value>) -> serde_json::Map<String, serde_json::Value>,
}

/// The zap-shaped line formatter.
#[derive(Debug, Clone)]
pub struct ZapFormat {
    pub config: LogConfig,
    pub span_keys: &'static [SpanKeys],
}

impl<S, N> FormatEvent<S, N> for ZapFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = if is_otel(meta.target()) {
            Written::Debug
        } else {
            written(*meta.level())
        };
        let mut message = fields.message.take().unwrap_or_default();
        if *meta.level() == Level::WARN && !message.starts_with("WARNING:") {
            message = format!("WARNING: {message}");
        }
        let logger = if is_otel(meta.target()) {
            "otel".to_string()
        } else {
            meta.target().replace("::", ".")
        };

        // Span fields first (outermost first), then the line's own, which win on a clash.
        let mut values = serde_json::Map::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(stored) = extensions.get::<FormattedFields<N>>()
                    && let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(stored)
                {
                    let map = map.into_iter().filter(|(k, _)| !k.starts_with("otel.")).collect();
                    match self.span_keys.iter().find(|k| k.span == span.name()) {
                        Some(rekey) => values.extend((rekey.keys)(map)),
                        None => values.extend(map),
                    }
                }
            }
        }
        values.extend(fields.values);
        // The event's own span: its explicit parent, else the current one.
        let leaf = ctx.event_scope().and_then(|mut scope| scope.next());
        if let Some((trace_id, span_id)) = leaf.and_then(|span| trace_ids(&span.id())) {
            values.insert("traceID".into(), trace_id.into());
            values.insert("spanID".into(), span_id.into());
        }
        if self.config.stacktrace_for(level) {
            values.insert("stacktrace".into(), stacktrace().into());
        }

        let now = jiff::Timestamp::now();
        match self.config.encoder {
            Encoder::Json => {
                let mut line = serde_json::Map::new();
                line.insert("level".into(), level_name(level, false).into());
                line.insert("ts".into(), time_json(now, self.config.time));
                line.insert("logger".into(), logger.into());
                line.insert("msg".into(), message.into());
                for (k, v) in values {
                    line.entry(k).or_insert(v);
                }
                let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
                writeln!(writer, "{text}")
            }
            Encoder::Console => {
                let time = match time_json(now, self.config.time) {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                write!(writer, "{time}\t{}\t{logger}\t{message}", level_name(level, true))?;
                if !values.is_empty() {
                    writer.write_char('\t')?;
                    write_spaced(&mut writer, &values)?;
                }
                writeln!(writer)
            }
        }
    }
}

/// The caller's stack, cut to the operator's own frames (the logging machinery and the runtime
/// around them are dozens of frames that say nothing).
fn stacktrace() -> String {
    let full = std::backtrace::Backtrace::force_capture().to_string();
    let mut frames: Vec<String> = Vec::new();
    for line in full.lines() {
        let is_frame_start = line
            .trim_start()
            .split_once(':')
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        match frames.last_mut() {
            Some(frame) if !is_frame_start => {
                frame.push('\n');
                frame.push_str(line);
            }
            _ => frames.push(line.to_string()),
        }
    }
    frames
        .into_iter()
        .filter(|f| f.contains("egress") && !f.contains("egress_runtime::logging"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn trace_ids(id: &tracing::span::Id) -> Option<(String, String)> {
    use opentelemetry::trace::TraceContextExt;
    let dispatch = TRACE_DISPATCH.get()?.upgrade()?;
    let cx = tracing_opentelemetry::get_otel_context(id, &dispatch)?;
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

fn level_name(level: Written, upper: bool) -> &'static str {
    match (level, upper) {
        (Written::Debug, false) => "debug",
        (Written::Info, false) => "info",
        (Written::Error, false) => "error",
        (Written::Debug, true) => "DEBUG",
        (Written::Info, true) => "INFO",
        (Written::Error, true) => "ERROR",
    }
}

fn time_json(now: jiff::Timestamp, encoding: TimeEncoding) -> serde_json::Value {
    let nanos = now.as_nanosecond();
    match encoding {
        TimeEncoding::Epoch => serde_json::json!(nanos as f64 / 1e9),
        TimeEncoding::Millis => serde_json::json!(nanos as f64 / 1e6),
        TimeEncoding::Nano => serde_json::json!(i64::try_from(nanos).unwrap_or(i64::MAX)),
        TimeEncoding::Iso8601 => now.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string().into(),
        TimeEncoding::Rfc3339 => now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string().into(),
        TimeEncoding::Rfc3339Nano => {
            let whole = now.strftime("%Y-%m-%dT%H:%M:%S").to_string();
            let sub = now.subsec_nanosecond();
            if sub == 0 {
                format!("{whole}Z").into()
            } else {
                format!("{whole}.{}Z", format!("{sub:09}").trim_end_matches('0')).into()
            }
        }
    }
}

/// zap's console encoder writes the values as JSON with a space after `:` and `,`.
fn write_spaced(writer: &mut Writer<'_>, values: &serde_json::Map<String, serde_json::Value>) -> fmt::Result {
    writer.write_char('{')?;
    for (i, (k, v)) in values.iter().enumerate() {
        if i > 0 {
            writer.write_str(", ")?;
        }
        let key = serde_json::to_string(k).map_err(|_| fmt::Error)?;
        let value = serde_json::to_string(v).map_err(|_| fmt::Error)?;
        write!(writer, "{key}: {value}")?;
    }
    writer.write_char('}')
}

/// The line's own fields, typed as JSON where tracing gives a type.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    values: serde_json::Map<String, serde_json::Value>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_string());
        } else {
            self.values.insert(field.name().into(), value.into());
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.values.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.values.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.values.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.values.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.values.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
        } else {
            self.values.insert(field.name().into(), text.into());
        }
    }
}

/// Span fields are stored as JSON objects, so the formatter can merge them into lines.
pub fn span_fields() -> JsonFields {
    JsonFields::new()
}

/// Installs the logger `options` ask for as the global one, with spans exported through
/// `tracer` when there is one, and the lines inside the spans `span_keys` names keyed as it says.
pub fn install(
    options: &LogOptions,
    tracer: Option<&opentelemetry_sdk::trace::SdkTracerProvider>,
    span_keys: &'static [SpanKeys],
) {
    let config = options.resolve();
    let filter = tracing_subscriber::filter::filter_fn(move |meta| {
        // Spans of our crates always reach the formatter, so their fields are on every line
        // inside them whatever the level.
        (meta.is_span() && meta.target().starts_with("egress")) || config.enabled(meta.target(), *meta.level())
    });
    let fmt = tracing_subscriber::fmt::layer()
        .fmt_fields(span_fields())
        .event_format(ZapFormat { config, span_keys })
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let otel = tracer.map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(crate::telemetry::tracer(provider))
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::dynamic_filter_fn(|meta, cx| {
                // Only spans (no span events), and only ours, plus Kubernetes API calls made
                // inside one of ours: watches, lease renewals and other background calls never
                // start a trace.
                meta.is_span()
                    && (meta.target().starts_with("egress")
                        || (meta.target().starts_with("kube_client") && cx.lookup_current().is_some()))
            }))
    });
    let subscriber = tracing_subscriber::registry().with(fmt).with(otel);
    let dispatch = Dispatch::new(subscriber);
    if tracer.is_some() {
        enable_trace_ids(&dispatch);
    }
    let _ = tracing::dispatcher::set_global_default(dispatch);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devel_and_production_defaults_as_controller_runtime_has_them() {
        let dev = LogOptions::default().resolve();
        assert_eq!(
            dev,
            LogConfig {
                encoder: Encoder::Console,
                level: LogLevel::Debug,
                stacktrace: StacktraceLevel::Warn,
                time: TimeEncoding::Iso8601
            }
        );
        let prod = LogOptions {
            devel: false,
            ..Default::default()
        }
        .resolve();
        assert_eq!(
            (prod.encoder, prod.level, prod.time),
            (Encoder::Json, LogLevel::Info, TimeEncoding::Epoch)
        );
        // The shipped Deployment: development mode, json, rfc3339.
        let shipped = LogOptions {
            encoder: Some(Encoder::Json),
            time_encoding: Some(TimeEncoding::Rfc3339),
            ..Default::default()
        }
        .resolve();
        assert_eq!((shipped.level, shipped.time), (LogLevel::Debug, TimeEncoding::Rfc3339));
        let json_only = LogOptions {
            encoder: Some(Encoder::Json),
            ..Default::default()
        }
        .resolve();
        assert_eq!(json_only.time, TimeEncoding::Epoch);
    }

    #[test]
    fn levels_gate_lines_and_libraries_are_capped_at_info() {
        let info = LogOptions {
            level: Some(LogLevel::Info),
            ..Default::default()
        }
        .resolve();
        assert!(info.enabled("egress_controller::gc", Level::INFO));
        assert!(!info.enabled("egress_controller::gc", Level::DEBUG));
        assert!(!info.enabled("opentelemetry_sdk", Level::ERROR));
        let debug = LogOptions::default().resolve();
        assert!(debug.enabled("egress_controller::gc", Level::DEBUG));
        assert!(debug.enabled("kube_runtime::controller", Level::DEBUG));
        assert!(!debug.enabled("hyper_util::client", Level::DEBUG));
        assert!(debug.enabled("opentelemetry_sdk", Level::WARN));
        let v3 = LogOptions {
            level: Some(LogLevel::Verbosity(3)),
            ..Default::default()
        }
        .resolve();
        assert!(v3.enabled("egress_provider", Level::TRACE));
        assert!(
            !v3.enabled("egress_provider_gcp::wire", Level::TRACE),
            "the wire log is V(5)"
        );
        let v5 = LogOptions {
            level: Some(LogLevel::Verbosity(5)),
            ..Default::default()
        }
        .resolve();
        assert!(v5.enabled("egress_provider_gcp::wire", Level::TRACE));
        let error = LogOptions {
            level: Some(LogLevel::Error),
            ..Default::default()
        }
        .resolve();
        assert!(!error.enabled("egress_controller", Level::WARN));
        assert!(error.enabled("egress_controller", Level::ERROR));
    }

    #[test]
    fn time_encodings() {
        let t: jiff::Timestamp = "2026-11-29T21:47:16.5Z".parse().unwrap();
        assert_eq!(time_json(t, TimeEncoding::Rfc3339), "2026-11-29T21:47:16Z");
        assert_eq!(time_json(t, TimeEncoding::Rfc3339Nano), "2026-11-29T21:47:16.5Z");
        assert_eq!(time_json(t, TimeEncoding::Iso8601), "2026-11-29T21:47:16.500Z");
        assert_eq!(time_json(t, TimeEncoding::Epoch), serde_json::json!(1_795_988_836.5));
        assert_eq!(
            time_json(t, TimeEncoding::Nano),
            serde_json::json!(1_795_988_836_500_000_000i64)
        );
    }
}
