//! The GenAI client metrics over OTLP: `gen_ai.client.operation.duration`
//! and `gen_ai.client.token.usage` as OpenTelemetry histograms, exported
//! every interval by the SDK's periodic reader to `<endpoint>/v1/metrics`.
//!
//! The actors record the two histograms once, through the `metrics` facade
//! (`overseer_actors::genai`); the process recorder (`crate::metrics`)
//! hands each sample to [`record`] besides its Prometheus bucket, so
//! `/metrics` and the collector see the same samples. This module owns the
//! OpenTelemetry instruments and their export; it deliberately does not
//! export the other (Prometheus-only) metrics: those are operators' service
//! metrics, scraped, not GenAI conventions.
//!
//! Off (no instruments, [`record`] is one atomic load) unless telemetry is
//! on and metrics are not turned off (`OTEL_METRICS_EXPORTER=none`).

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::metrics::{Histogram, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::Resource;

use super::{Settings, TelemetryError};
use overseer_actors::genai::{OPERATION_DURATION, TOKEN_USAGE};

/// Failed metric exports (the collector down or refusing), by Prometheus
/// name. Cumulative temporality: the next export carries the totals, so a
/// failed one loses no sample, only its timeliness.
pub const METRIC_EXPORTS_FAILED_TOTAL: &str = "overseer_otel_metric_exports_failed_total";

/// The semantic conventions' advised bucket boundaries (seconds).
const DURATION_BOUNDARIES: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// The semantic conventions' advised bucket boundaries (tokens).
const TOKEN_BOUNDARIES: [f64; 14] = [
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1_024.0,
    4_096.0,
    16_384.0,
    65_536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];

struct Instruments {
    duration: Histogram<f64>,
    tokens: Histogram<u64>,
}

/// Set once when metrics export starts; read on every GenAI sample.
static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();

/// One sample of the GenAI histogram `name` with its labels, for the
/// collector. Nothing when metrics export is off.
pub fn record(name: &str, value: f64, attributes: &[KeyValue]) {
    let Some(instruments) = INSTRUMENTS.get() else {
        return;
    };
    if name == OPERATION_DURATION {
        instruments.duration.record(value, attributes);
    } else if name == TOKEN_USAGE && value >= 0.0 {
        // Token counts are whole numbers; the facade carries them as f64.
        instruments.tokens.record(value as u64, attributes);
    }
}

/// Starts the periodic export to `url` and installs the instruments (once
/// per process: a second start exports from its own provider but the first
/// instruments stay, as the first subscriber does).
pub(super) fn start(
    settings: &Settings,
    url: &str,
    interval: Duration,
    resource: Resource,
) -> Result<SdkMeterProvider, TelemetryError> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let client = reqwest_mcp::Client::builder()
        .redirect(reqwest_mcp::redirect::Policy::none())
        .timeout(settings.export.timeout)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(url.to_owned())
        .with_headers(settings.headers.clone())
        .with_timeout(settings.export.timeout)
        .with_temporality(Temporality::Cumulative)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let exporter = OnRuntime::start(exporter, settings.export.timeout)
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let reader = PeriodicReader::builder(exporter)
        .with_interval(interval)
        .build();
    let provider = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(reader)
        .build();
    let meter = provider.meter("overseer");
    let _ = INSTRUMENTS.set(Instruments {
        duration: meter
            .f64_histogram(OPERATION_DURATION)
            .with_unit("s")
            .with_description("GenAI operation duration.")
            .with_boundaries(DURATION_BOUNDARIES.to_vec())
            .build(),
        tokens: meter
            .u64_histogram(TOKEN_USAGE)
            .with_unit("{token}")
            .with_description("Number of input and output tokens used.")
            .with_boundaries(TOKEN_BOUNDARIES.to_vec())
            .build(),
    });
    Ok(provider)
}

/// The OTLP exporter on a runtime of its own.
///
/// The SDK's periodic reader runs on a plain thread and drives the export
/// future with a minimal executor, while the exporter's HTTP client needs a
/// Tokio reactor: each export is run on a current-thread runtime that a
/// thread of this module keeps alive (and drops on that thread, where
/// dropping a runtime is allowed).
#[derive(Debug)]
struct OnRuntime<E> {
    inner: E,
    handle: tokio::runtime::Handle,
    timeout: Duration,
    /// Dropping it ends the runtime's thread.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl<E: PushMetricExporter> OnRuntime<E> {
    fn start(inner: E, timeout: Duration) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("otlp-metrics".into())
            .spawn(move || {
                // Driving the reactor: the exports run through `handle`.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Self {
            inner,
            handle,
            timeout,
            _stop: stop,
        })
    }
}

impl<E: PushMetricExporter> PushMetricExporter for OnRuntime<E> {
    fn export(
        &self,
        metrics: &ResourceMetrics,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        // The reader's thread is not a runtime's, so blocking it here is
        // what it expects (it blocks on this future anyway).
        // The timer is made inside the runtime: it needs its time driver.
        let result = match self.handle.block_on(async {
            tokio::time::timeout(self.timeout, self.inner.export(metrics)).await
        }) {
            Ok(result) => result,
            Err(_) => Err(opentelemetry_sdk::error::OTelSdkError::Timeout(
                self.timeout,
            )),
        };
        if result.is_err() {
            metrics::counter!(METRIC_EXPORTS_FAILED_TOTAL).increment(1);
        }
        std::future::ready(result)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}
