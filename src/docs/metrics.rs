//! The metrics reference page: every metric [`crate::metrics::describe`]
//! describes (the same call the exporter makes when it is installed), with
//! its type, unit and description, captured by a recorder of this module's
//! own for the length of the call (the process-wide recorder, if any, is not
//! touched). Names are shown as the Prometheus exporter writes them (a `.`
//! becomes `_`).

use std::sync::{Mutex, PoisonError};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use super::cell;

/// One described metric.
struct Described {
    name: String,
    kind: &'static str,
    unit: Option<Unit>,
    description: String,
}

/// A recorder that keeps descriptions and records nothing.
#[derive(Default)]
struct Capture(Mutex<Vec<Described>>);

impl Capture {
    fn push(&self, kind: &'static str, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Described {
                name: key.as_str().replace('.', "_"),
                kind,
                unit,
                description: text.into_owned(),
            });
    }
}

impl Recorder for Capture {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.push("counter", key, unit, description);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.push("gauge", key, unit, description);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.push("histogram", key, unit, description);
    }
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// The metrics reference page.
pub(super) fn render() -> String {
    let capture = Capture::default();
    metrics::with_local_recorder(&capture, crate::metrics::describe);
    let described = capture
        .0
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let mut out = String::from("# Metrics\n\n");
    out.push_str(
        "`GET /metrics` serves these in the Prometheus text format (the `admin` scope, \
         or no token with `[http] metrics_public = true`). A histogram is exported \
         with `_bucket`, `_sum` and `_count` series where `src/metrics.rs` gives it \
         buckets, as a summary (quantiles) otherwise; labels are named in each \
         description. Gauges of session actors count what is live in this process: \
         sessions that are only on disk (hibernated) are not in `overseer_live_sessions`, \
         while `overseer_pending_approvals` includes them.\n\n",
    );
    out.push_str("| Metric | Type | Unit | Description |\n|---|---|---|---|\n");
    for d in &described {
        let unit = d.unit.map_or("", |u| u.as_str());
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            d.name,
            d.kind,
            unit,
            cell(&d.description)
        ));
    }
    out
}
