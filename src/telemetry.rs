//! Operators' instruments (issue 30): the process's `tracing` subscriber,
//! OpenTelemetry traces exported over OTLP (HTTP/protobuf), and the log
//! format (`[log] format = "text" | "json"`).
//!
//! It owns the subscriber (a text or JSON log layer filtered by `RUST_LOG`,
//! plus, when `[telemetry]` or the `OTEL_EXPORTER_OTLP_*` variables name a
//! collector, the `tracing-opentelemetry` layer for the GenAI spans of
//! target [`overseer_actors::genai::TARGET`]), the bridge the actors use for
//! W3C trace contexts ([`overseer_actors::genai::TraceBridge`]), and the
//! `traceparent` header of outgoing requests ([`traceparent`]). It
//! deliberately does not decide which spans exist or what they carry: the
//! actors do (`overseer_actors::genai`). Off by default: with no collector no
//! OpenTelemetry layer is installed, the GenAI spans are disabled at their
//! call sites and the actors hold no span state.

mod export;
mod logs;
mod meters;

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use serde::Deserialize;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

pub use export::{ExportOptions, SPANS_DROPPED_TOTAL, SPANS_EXPORTED_TOTAL};
pub use meters::{record as record_genai, METRIC_EXPORTS_FAILED_TOTAL};

/// Set once an OpenTelemetry layer is installed: what [`traceparent`]
/// checks first, so a process without telemetry pays one load per request.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// `[telemetry]`: where traces go. Every key is optional; the standard
/// `OTEL_*` variables override them (see [`TelemetrySection::resolve`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// The collector's base URL (`http://localhost:4318`); spans go to
    /// `<endpoint>/v1/traces`. Empty: no traces (unless
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` names one).
    #[serde(default)]
    pub otlp_endpoint: String,
    /// `http/protobuf` (the one built in).
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// Extra request headers (an API key of a hosted collector).
    #[serde(default)]
    pub headers: HashMap<String, String>,
    /// The share of new traces recorded, 0.0 to 1.0 (a caller's sampled
    /// flag is followed).
    #[serde(default = "default_ratio")]
    pub sampling_ratio: f64,
    /// `service.name` of the resource.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// Record prompts, answers, tool arguments and results on the spans
    /// (off: the conventions advise against it by default).
    #[serde(default)]
    pub capture_content: bool,
    /// Spans held for export at most; more are dropped and counted
    /// (`overseer_otel_spans_dropped_total`).
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
    /// Spans per export request at most.
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// Milliseconds between exports of a partial batch.
    #[serde(default = "default_export_interval_ms")]
    pub export_interval_ms: u64,
    /// Seconds one export request may take.
    #[serde(default = "default_export_timeout_secs")]
    pub export_timeout_secs: u64,
    /// Milliseconds between exports of the GenAI metrics
    /// (`gen_ai.client.token.usage`, `gen_ai.client.operation.duration`) to
    /// `<otlp_endpoint>/v1/metrics`.
    #[serde(default = "default_metrics_interval_ms")]
    pub metrics_interval_ms: u64,
}

fn default_protocol() -> String {
    "http/protobuf".into()
}
fn default_ratio() -> f64 {
    1.0
}
fn default_service_name() -> String {
    "overseer".into()
}
fn default_max_queue() -> usize {
    2048
}
fn default_max_batch() -> usize {
    512
}
fn default_export_interval_ms() -> u64 {
    5000
}
fn default_export_timeout_secs() -> u64 {
    10
}
fn default_metrics_interval_ms() -> u64 {
    60_000
}

impl Default for TelemetrySection {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            protocol: default_protocol(),
            headers: HashMap::new(),
            sampling_ratio: default_ratio(),
            service_name: default_service_name(),
            capture_content: false,
            max_queue: default_max_queue(),
            max_batch: default_max_batch(),
            export_interval_ms: default_export_interval_ms(),
            export_timeout_secs: default_export_timeout_secs(),
            metrics_interval_ms: default_metrics_interval_ms(),
        }
    }
}

/// `[log]`: the format of the log lines on stderr.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, message, fields,
    /// and `trace_id`/`span_id` inside a traced span.
    Json,
}

/// Telemetry as resolved from the section and the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Full URL spans are POSTed to.
    pub traces_url: String,
    /// Request headers.
    pub headers: HashMap<String, String>,
    /// Sampling ratio of new traces.
    pub sampling_ratio: f64,
    /// `service.name`.
    pub service_name: String,
    /// Record contents.
    pub capture_content: bool,
    /// Queue and batching.
    pub export: ExportOptions,
    /// Full URL the GenAI metrics are POSTed to; `None`: not exported.
    pub metrics_url: Option<String>,
    /// Time between metric exports.
    pub metrics_interval: Duration,
}

impl TelemetrySection {
    /// The problems of the section, each with its key.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Err(e) = check_protocol(&self.protocol) {
            out.push(("telemetry.protocol".into(), e));
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) || self.sampling_ratio.is_nan() {
            out.push((
                "telemetry.sampling_ratio".into(),
                format!("must be between 0.0 and 1.0, found {}", self.sampling_ratio),
            ));
        }
        let e = &self.otlp_endpoint;
        if !(e.is_empty() || e.starts_with("http://") || e.starts_with("https://")) {
            out.push((
                "telemetry.otlp_endpoint".into(),
                format!("'{e}' is not an http(s) URL like http://localhost:4318"),
            ));
        }
        for (key, value) in [
            ("telemetry.max_queue", self.max_queue as u64),
            ("telemetry.max_batch", self.max_batch as u64),
            ("telemetry.export_interval_ms", self.export_interval_ms),
            ("telemetry.export_timeout_secs", self.export_timeout_secs),
            ("telemetry.metrics_interval_ms", self.metrics_interval_ms),
        ] {
            if value == 0 {
                out.push((key.into(), "must be at least 1".into()));
            }
        }
        if self.service_name.trim().is_empty() {
            out.push(("telemetry.service_name".into(), "must not be empty".into()));
        }
        out
    }

    /// The settings in force: the section, overridden by the standard
    /// variables (`OTEL_SDK_DISABLED`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL`,
    /// `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`,
    /// `OTEL_TRACES_SAMPLER_ARG`, `OTEL_BSP_SCHEDULE_DELAY`,
    /// `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`,
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, `OTEL_METRICS_EXPORTER=none`,
    /// `OTEL_METRIC_EXPORT_INTERVAL`). `None`: telemetry is off (metrics
    /// go where traces go: no traces, no metrics). An invalid variable is
    /// an error naming it.
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Option<Settings>, String> {
        let var = |name: &str| -> Result<Option<String>, String> {
            match env(name) {
                None => Ok(None),
                Some(v) => match v.into_string() {
                    Ok(s) if s.trim().is_empty() => Ok(None),
                    Ok(s) => Ok(Some(s.trim().to_owned())),
                    Err(_) => Err(format!("{name} is not valid UTF-8")),
                },
            }
        };
        if var("OTEL_SDK_DISABLED")?.is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if let Some(p) =
            var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")?.or(var("OTEL_EXPORTER_OTLP_PROTOCOL")?)
        {
            check_protocol(&p).map_err(|e| format!("OTEL_EXPORTER_OTLP_PROTOCOL: {e}"))?;
        }
        let base = match var("OTEL_EXPORTER_OTLP_ENDPOINT")? {
            Some(base) => Some(base),
            None => (!self.otlp_endpoint.is_empty()).then(|| self.otlp_endpoint.clone()),
        };
        let signal = |path: &str| {
            base.as_ref()
                .map(|b| format!("{}/{path}", b.trim_end_matches('/')))
        };
        let Some(traces_url) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?.or(signal("v1/traces"))
        else {
            return Ok(None);
        };
        let metrics_url =
            if var("OTEL_METRICS_EXPORTER")?.is_some_and(|v| v.eq_ignore_ascii_case("none")) {
                None
            } else {
                var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")?.or(signal("v1/metrics"))
            };
        for url in std::iter::once(&traces_url).chain(metrics_url.as_ref()) {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("the OTLP endpoint '{url}' is not an http(s) URL"));
            }
        }
        let mut headers = self.headers.clone();
        if let Some(list) = var("OTEL_EXPORTER_OTLP_HEADERS")? {
            for pair in list.split(',').filter(|p| !p.trim().is_empty()) {
                let Some((k, v)) = pair.split_once('=') else {
                    return Err(format!(
                        "OTEL_EXPORTER_OTLP_HEADERS: '{pair}' is not key=value"
                    ));
                };
                headers.insert(k.trim().to_owned(), v.trim().to_owned());
            }
        }
        let number = |name: &str| -> Result<Option<u64>, String> {
            var(name)?
                .map(|v| {
                    v.parse::<u64>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| format!("{name}: '{v}' is not a positive integer"))
                })
                .transpose()
        };
        let sampling_ratio = match var("OTEL_TRACES_SAMPLER_ARG")? {
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| {
                    format!("OTEL_TRACES_SAMPLER_ARG: '{v}' is not a ratio between 0 and 1")
                })?,
            None => self.sampling_ratio,
        };
        Ok(Some(Settings {
            traces_url,
            headers,
            sampling_ratio,
            service_name: var("OTEL_SERVICE_NAME")?.unwrap_or_else(|| self.service_name.clone()),
            capture_content: self.capture_content,
            export: ExportOptions {
                max_queue: number("OTEL_BSP_MAX_QUEUE_SIZE")?
                    .map_or(self.max_queue, |n| n as usize),
                max_batch: number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")?
                    .map_or(self.max_batch, |n| n as usize),
                interval: Duration::from_millis(
                    number("OTEL_BSP_SCHEDULE_DELAY")?.unwrap_or(self.export_interval_ms),
                ),
                timeout: Duration::from_secs(self.export_timeout_secs),
            },
            metrics_url,
            metrics_interval: Duration::from_millis(
                number("OTEL_METRIC_EXPORT_INTERVAL")?.unwrap_or(self.metrics_interval_ms),
            ),
        }))
    }
}

fn check_protocol(protocol: &str) -> Result<(), String> {
    match protocol {
        "http/protobuf" => Ok(()),
        "grpc" => Err(
            "grpc is not built in; use \"http/protobuf\" (collectors listen for it on port 4318)"
                .into(),
        ),
        other => Err(format!(
            "unknown protocol '{other}', expected \"http/protobuf\""
        )),
    }
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A variable or key is invalid.
    #[error("telemetry: {0}")]
    Config(String),
    /// The exporter could not be built.
    #[error("telemetry: cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

/// What keeps telemetry running: dropping it (or [`Telemetry::shutdown`])
/// exports what is queued, for a bounded time.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    meters: Option<opentelemetry_sdk::metrics::SdkMeterProvider>,
}

impl Telemetry {
    /// Exports what is queued (at most a few seconds) and stops.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown_with_timeout(Duration::from_secs(5));
        }
        // The last export carries the totals up to now.
        if let Some(meters) = self.meters.take() {
            let _ = meters.shutdown_with_timeout(Duration::from_secs(5));
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Installs the process's subscriber: logs in `log`'s format (filtered by
/// `RUST_LOG`, `warn` by default) and, if `settings` is some, GenAI spans
/// exported over OTLP. Call once, before the actors start; a second call
/// (a subscriber is installed) leaves the first in place.
pub fn init(log: &LogSection, settings: Option<&Settings>) -> Result<Telemetry, TelemetryError> {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    if log.format == LogFormat::Json && settings.is_some() {
        // The JSON lines take their trace ids from the GenAI spans, so the
        // log layer must see them (it prints no span by itself).
        if let Ok(directive) = format!("{}=info", overseer_actors::genai::TARGET).parse() {
            filter = filter.add_directive(directive);
        }
    }
    let log_layer = match log.format {
        LogFormat::Text => {
            let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none();
            tracing_subscriber::fmt::layer()
                .with_ansi(colour)
                .with_writer(std::io::stderr)
                // See `init_tracing`: a log line that cannot be
                // written is lost, it does not panic.
                .log_internal_errors(false)
                .with_filter(filter)
                .boxed()
        }
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .event_format(logs::JsonLines)
            .with_writer(std::io::stderr)
            .log_internal_errors(false)
            .with_filter(filter)
            .boxed(),
    };
    let Some(settings) = settings else {
        let _ = tracing_subscriber::registry().with(log_layer).try_init();
        return Ok(Telemetry {
            provider: None,
            meters: None,
        });
    };
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .build();
    let provider = tracer_provider(settings, resource.clone())?;
    let tracer = provider.tracer("overseer");
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(Targets::new().with_target(overseer_actors::genai::TARGET, LevelFilter::INFO));
    if tracing_subscriber::registry()
        .with(log_layer)
        .with(otel)
        .try_init()
        .is_ok()
    {
        overseer_actors::genai::install(Box::new(Bridge {
            capture_content: settings.capture_content,
        }));
        ENABLED.store(true, Ordering::Release);
    }
    let meters = match &settings.metrics_url {
        Some(url) => Some(meters::start(
            settings,
            url,
            settings.metrics_interval,
            resource,
        )?),
        None => None,
    };
    Ok(Telemetry {
        provider: Some(provider),
        meters,
    })
}

fn tracer_provider(
    settings: &Settings,
    resource: Resource,
) -> Result<SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    // The exporter's own client: no redirects, bounded by the export
    // timeout; rustls with the process's provider (installed in `main`).
    let client = reqwest_mcp::Client::builder()
        .redirect(reqwest_mcp::redirect::Policy::none())
        .timeout(settings.export.timeout)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(settings.traces_url.clone())
        .with_headers(settings.headers.clone())
        .with_timeout(settings.export.timeout)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let processor = export::QueueProcessor::start(exporter, &resource, settings.export.clone())
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    Ok(SdkTracerProvider::builder()
        .with_resource(resource)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sampling_ratio,
        ))))
        .with_span_processor(processor)
        .build())
}

/// The `traceparent` of the span the caller runs in (a `chat` or
/// `execute_tool` span), for an outgoing request; `None` when telemetry is
/// off or the request runs outside a traced span.
pub fn traceparent() -> Option<reqwest::header::HeaderValue> {
    if !ENABLED.load(Ordering::Acquire) {
        return None;
    }
    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    format_traceparent(&span).and_then(|v| reqwest::header::HeaderValue::from_str(&v).ok())
}

fn format_traceparent(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let otel = cx.span();
    let sc = otel.span_context();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

fn parse_traceparent(value: &str) -> Option<SpanContext> {
    if !overseer_actors::model::is_traceparent(value) {
        return None;
    }
    let mut parts = value.split('-').skip(1);
    let trace = TraceId::from_hex(parts.next()?).ok()?;
    let span = SpanId::from_hex(parts.next()?).ok()?;
    let flags = u8::from_str_radix(parts.next()?, 16).ok()?;
    Some(SpanContext::new(
        trace,
        span,
        TraceFlags::new(flags & 1),
        true,
        TraceState::default(),
    ))
}

/// The actors' side of trace contexts, over `tracing-opentelemetry`.
struct Bridge {
    capture_content: bool,
}

impl overseer_actors::genai::TraceBridge for Bridge {
    fn set_parent(&self, span: &tracing::Span, traceparent: &str) {
        if let Some(sc) = parse_traceparent(traceparent) {
            let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
        }
    }

    fn add_link(&self, span: &tracing::Span, traceparent: &str) {
        if let Some(sc) = parse_traceparent(traceparent) {
            span.add_link(sc);
        }
    }

    fn traceparent(&self, span: &tracing::Span) -> Option<String> {
        format_traceparent(span)
    }

    fn capture_content(&self) -> bool {
        self.capture_content
    }
}

/// Logs (tracing) go to stderr, `warn` and above unless `RUST_LOG` says
/// otherwise, so they never mix with the agent's text on stdout. They are
/// coloured only when stderr is a terminal (and `NO_COLOR` is not set): a
/// log file or a pipe gets plain text, without escape codes.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        // By default a failed write is reported with `eprintln!`, which
        // panics when stderr is closed (`overseer run … 2>&1 | head`): the
        // panic would fail whichever actor logged, the orchestrator included,
        // and the run would hang. A log line that cannot be written is lost,
        // nothing more.
        .log_internal_errors(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(*v))
        }
    }

    #[test]
    fn off_without_an_endpoint_and_on_with_one_from_the_file_or_the_environment() {
        let section = TelemetrySection::default();
        assert_eq!(section.resolve(env(&[])).unwrap(), None);
        let on = section
            .resolve(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]))
            .unwrap()
            .unwrap();
        assert_eq!(on.traces_url, "http://c:4318/v1/traces");
        let file = TelemetrySection {
            otlp_endpoint: "http://file:4318".into(),
            ..TelemetrySection::default()
        };
        let s = file
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=abc, x-b = 2"),
                ("OTEL_SERVICE_NAME", "svc"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(s.traces_url, "http://file:4318/v1/traces");
        assert_eq!(s.headers["x-key"], "abc");
        assert_eq!(s.headers["x-b"], "2");
        assert_eq!(s.service_name, "svc");
        assert_eq!(s.sampling_ratio, 0.25);
        assert_eq!(s.export.interval, Duration::from_millis(100));
        let traces = file
            .resolve(env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t/x")]))
            .unwrap()
            .unwrap();
        assert_eq!(traces.traces_url, "http://t/x");
        assert_eq!(
            file.resolve(env(&[("OTEL_SDK_DISABLED", "true")])).unwrap(),
            None
        );
    }

    #[test]
    fn bad_values_are_named() {
        let file = TelemetrySection {
            otlp_endpoint: "http://file:4318".into(),
            ..TelemetrySection::default()
        };
        for (vars, named) in [
            (
                &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")][..],
                "grpc is not built in",
            ),
            (
                &[("OTEL_TRACES_SAMPLER_ARG", "2")][..],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")][..],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                &[("OTEL_BSP_MAX_QUEUE_SIZE", "0")][..],
                "OTEL_BSP_MAX_QUEUE_SIZE",
            ),
        ] {
            let vars: &'static [(&'static str, &'static str)] = vars;
            let e = file.resolve(env(vars)).unwrap_err();
            assert!(e.contains(named), "{e}");
        }
        let bad = TelemetrySection {
            otlp_endpoint: "localhost:4318".into(),
            protocol: "grpc".into(),
            sampling_ratio: 1.5,
            max_queue: 0,
            ..TelemetrySection::default()
        };
        let keys: Vec<String> = bad.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "telemetry.protocol",
                "telemetry.sampling_ratio",
                "telemetry.otlp_endpoint",
                "telemetry.max_queue"
            ]
        );
    }

    #[test]
    fn traceparents_round_trip() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(tp).unwrap();
        assert_eq!(
            format!("{}-{}", sc.trace_id(), sc.span_id()),
            "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
        );
        assert!(sc.is_sampled());
        assert!(parse_traceparent("00-abc").is_none());
    }
}
