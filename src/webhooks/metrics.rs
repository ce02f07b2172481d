//! Metrics of webhook deliveries, named and recorded in the
//! style of `overseer_actors::metrics`: one constant per name, a
//! [`describe`] for the recorder, small helpers the delivery task calls
//! where things happen.
//!
//! The two gauges are read from the store by the delivery task, at most
//! once per sweep, rather than kept as deltas: they are facts of the store
//! (a restart, another node of a cluster, a deleted endpoint all move them),
//! so in a cluster every node reports the same, cluster-wide, figure.
//!
//! It deliberately installs no recorder (`crate::metrics` does, with the
//! histogram's buckets) and decides nothing about deliveries.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

/// Counter: deliveries that ended, by `outcome` (`delivered`, or `failed`:
/// given up, their endpoint disabled or deleted).
pub const DELIVERIES_TOTAL: &str = "overseer_webhook_deliveries_total";
/// Counter: attempts that did not deliver (each retry counts).
pub const FAILED_ATTEMPTS_TOTAL: &str = "overseer_webhook_failed_attempts_total";
/// Counter: deliveries dropped unsent, by `reason`: `purged` (the session
/// was purged before its body was built), `event_gone` (its event is no
/// longer stored as the outbox row describes it), `not_committed` (an
/// outbox row no committed event backs, or whose session is gone, at
/// intake).
pub const DROPPED_TOTAL: &str = "overseer_webhook_dropped_total";
/// Gauge: deliveries waiting for their first or next attempt.
pub const PENDING_DELIVERIES: &str = "overseer_webhook_pending_deliveries";
/// Gauge: endpoints disabled (given up on, or answered 410 Gone).
pub const DISABLED_ENDPOINTS: &str = "overseer_webhook_disabled_endpoints";
/// Histogram: event → delivered (the receiver's 2xx), retries included.
pub const DELIVERY_SECONDS: &str = "overseer_webhook_delivery_seconds";

/// Buckets of [`DELIVERY_SECONDS`]: from a loopback receiver's milliseconds
/// to the day a delivery may be retried for.
pub const DELIVERY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3_600.0,
    86_400.0,
];

/// Describes every metric to the installed recorder and registers the
/// counters at zero.
pub fn describe() {
    use metrics::Unit;
    describe_counter!(
        DELIVERIES_TOTAL,
        Unit::Count,
        "Webhook deliveries that ended, by outcome (delivered, failed)."
    );
    describe_counter!(
        FAILED_ATTEMPTS_TOTAL,
        Unit::Count,
        "Webhook delivery attempts that did not deliver (each retry counts)."
    );
    describe_counter!(
        DROPPED_TOTAL,
        Unit::Count,
        "Webhook deliveries dropped unsent because their session or event is no longer stored, by reason (purged, event_gone, not_committed)."
    );
    describe_gauge!(
        PENDING_DELIVERIES,
        Unit::Count,
        "Webhook deliveries waiting for an attempt (the store's, cluster-wide)."
    );
    describe_gauge!(
        DISABLED_ENDPOINTS,
        Unit::Count,
        "Webhook endpoints disabled (given up on, or 410 Gone)."
    );
    describe_histogram!(
        DELIVERY_SECONDS,
        Unit::Seconds,
        "Time from an event to its webhook's delivery, retries included."
    );
    counter!(DELIVERIES_TOTAL, "outcome" => "delivered").absolute(0);
    counter!(DELIVERIES_TOTAL, "outcome" => "failed").absolute(0);
    counter!(FAILED_ATTEMPTS_TOTAL).absolute(0);
    for reason in ["purged", "event_gone", "not_committed"] {
        counter!(DROPPED_TOTAL, "reason" => reason).absolute(0);
    }
}

/// A delivery (or outbox row) was dropped unsent, for `reason`.
pub fn dropped(reason: &'static str) {
    counter!(DROPPED_TOTAL, "reason" => reason).increment(1);
}

/// A delivery reached its receiver `latency_ms` after its event.
pub(super) fn delivered(latency_ms: i64) {
    counter!(DELIVERIES_TOTAL, "outcome" => "delivered").increment(1);
    histogram!(DELIVERY_SECONDS).record(latency_ms.max(0) as f64 / 1000.0);
}

/// A delivery was given up.
pub(super) fn failed() {
    counter!(DELIVERIES_TOTAL, "outcome" => "failed").increment(1);
}

/// An attempt did not deliver.
pub(super) fn failed_attempt() {
    counter!(FAILED_ATTEMPTS_TOTAL).increment(1);
}

/// The store's current figures.
pub(super) fn gauges(pending: u64, disabled: usize) {
    gauge!(PENDING_DELIVERIES).set(pending as f64);
    gauge!(DISABLED_ENDPOINTS).set(disabled as f64);
}
