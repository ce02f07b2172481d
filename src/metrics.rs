//! The Prometheus exporter: installs the process-wide recorder of the
//! `metrics` facade and hands out the handle that renders the text format.
//!
//! This module owns the recorder's configuration: which histograms get which
//! buckets (so they render as real, aggregatable Prometheus histograms rather
//! than summaries), the upkeep thread, and installing it exactly once per
//! process. It deliberately records nothing itself (the metric names and the
//! recording points are `overseer_actors::metrics`'), opens no listener of its
//! own (`GET /metrics` is a route of the API, with its auth, in
//! [`crate::http`]) and decides nothing about who may scrape.
//!
//! Install it before [`Overseer::start`](overseer_actors::Overseer::start):
//! the gauges are kept as deltas, and a delta recorded before there is a
//! recorder is lost.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics::{Key, KeyName, Metadata, SharedString, Unit};
pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusRecorder};
use overseer_actors::metrics as names;

/// The `Content-Type` of the Prometheus text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How often histogram samples are folded into their buckets between
/// scrapes, so that a server nobody scrapes does not accumulate them.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Why the recorder could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The exporter refused its configuration.
    #[error("cannot install the Prometheus recorder: {0}")]
    Install(#[from] BuildError),
    /// Another recorder (not this module's) is already installed in this
    /// process.
    #[error("cannot install the Prometheus recorder: another metrics recorder is installed")]
    Taken,
}

/// The installed handle; `None` until [`install_recorder`] succeeds. A std
/// mutex: held only for the few synchronous calls of an install.
static HANDLE: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the Prometheus recorder for this process and returns its handle.
///
/// Idempotent: every later call (several servers in one test process, say)
/// returns the same handle. Fails only if the exporter refuses its buckets or
/// some other recorder already took the process-wide slot.
pub fn install_recorder() -> Result<PrometheusHandle, MetricsError> {
    // Poisoning cannot leave a half-installed state: the slot is written
    // last, after the install succeeded.
    let mut slot = HANDLE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(handle) = slot.as_ref() {
        return Ok(handle.clone());
    }
    let recorder = builder()?.build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(Tee(recorder)).map_err(|_| MetricsError::Taken)?;
    describe();
    spawn_upkeep(handle.clone());
    *slot = Some(handle.clone());
    Ok(handle)
}

/// Describes every metric this process exports to the installed recorder:
/// the actor tree's (`overseer_actors::metrics`), the webhooks', the trace
/// exporter's and the GenAI client histograms. The book's metrics reference
/// is rendered from this same call (`crate::docs`), so it lists exactly what
/// a scrape can show.
pub fn describe() {
    use metrics::{describe_counter, describe_histogram};
    names::describe();
    crate::webhooks::metrics::describe();
    describe_counter!(
        crate::telemetry::SPANS_DROPPED_TOTAL,
        Unit::Count,
        "Trace spans dropped: the export queue was full or the collector did not take them."
    );
    describe_counter!(
        crate::telemetry::SPANS_EXPORTED_TOTAL,
        Unit::Count,
        "Trace spans the collector accepted."
    );
    describe_counter!(
        crate::telemetry::METRIC_EXPORTS_FAILED_TOTAL,
        Unit::Count,
        "GenAI metric exports the collector did not take (the next export carries the totals)."
    );
    describe_histogram!(
        overseer_actors::genai::OPERATION_DURATION,
        Unit::Seconds,
        "Provider requests' duration (GenAI semantic conventions), by gen_ai.operation.name, gen_ai.provider.name and gen_ai.request.model."
    );
    describe_histogram!(
        overseer_actors::genai::TOKEN_USAGE,
        Unit::Count,
        "Tokens per provider request (GenAI semantic conventions), by gen_ai.token.type (input, output) and the labels of the duration."
    );
}

/// The process recorder: Prometheus for everything, and the GenAI client
/// histograms also to OpenTelemetry ([`crate::telemetry::record_genai`],
/// a no-op unless metrics export is on), so both see the same samples
/// while the actors record each one once.
struct Tee(PrometheusRecorder);

/// A GenAI histogram: its Prometheus handle and the sample's attributes.
struct GenAiHistogram {
    prometheus: metrics::Histogram,
    name: &'static str,
    attributes: Vec<opentelemetry::KeyValue>,
}

impl metrics::HistogramFn for GenAiHistogram {
    fn record(&self, value: f64) {
        self.prometheus.record(value);
        crate::telemetry::record_genai(self.name, value, &self.attributes);
    }
}

impl metrics::Recorder for Tee {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Counter {
        self.0.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Gauge {
        self.0.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Histogram {
        let prometheus = self.0.register_histogram(key, metadata);
        let name = match key.name() {
            n if n == overseer_actors::genai::OPERATION_DURATION => {
                overseer_actors::genai::OPERATION_DURATION
            }
            n if n == overseer_actors::genai::TOKEN_USAGE => overseer_actors::genai::TOKEN_USAGE,
            _ => return prometheus,
        };
        let attributes = key
            .labels()
            .map(|l| opentelemetry::KeyValue::new(l.key().to_owned(), l.value().to_owned()))
            .collect();
        metrics::Histogram::from_arc(Arc::new(GenAiHistogram {
            prometheus,
            name,
            attributes,
        }))
    }
}

/// The handle, if [`install_recorder`] has been called in this process.
pub fn handle() -> Option<PrometheusHandle> {
    HANDLE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Buckets per histogram, from the range each one actually spans.
fn builder() -> Result<PrometheusBuilder, BuildError> {
    let buckets: [(&str, &[f64]); 6] = [
        (
            crate::webhooks::metrics::DELIVERY_SECONDS,
            crate::webhooks::metrics::DELIVERY_BUCKETS,
        ),
        (
            names::CHECKPOINT_SECONDS,
            &[
                0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5, 1.0,
            ],
        ),
        (
            names::TOOL_DURATION_SECONDS,
            &[
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ],
        ),
        (
            names::APPROVAL_WAIT_SECONDS,
            &[
                0.1, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1_800.0, 3_600.0, 14_400.0,
                43_200.0, 86_400.0,
            ],
        ),
        (
            names::PROVIDER_STREAM_SECONDS,
            &[
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
            ],
        ),
        (
            names::PROVIDER_FIRST_EVENT_SECONDS,
            &[
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ],
        ),
    ];
    buckets
        .into_iter()
        .try_fold(PrometheusBuilder::new(), |b, (name, values)| {
            b.set_buckets_for_metric(Matcher::Full(name.to_owned()), values)
        })
}

/// Folds histogram samples into buckets every [`UPKEEP_EVERY`]. A thread,
/// not a task: the recorder outlives any one tokio runtime, and installing
/// must work outside one. Without it, rendering still folds them; only the
/// memory between scrapes would grow, so a failure to start it is logged.
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("overseer-metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            handle.run_upkeep();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "metrics upkeep thread not started");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_histogram_gets_buckets() {
        assert!(builder().is_ok());
    }
}
