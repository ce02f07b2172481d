//! Metrics of the actor tree, recorded through the `metrics` facade.
//!
//! This module owns the metric names (one constant each, so that the edge,
//! the documentation and the tests agree), their descriptions, and the small
//! helpers the actors call where things happen: checkpoints, status changes,
//! approval decisions, tool runs, provider streams. It deliberately installs
//! no recorder and renders nothing: without a recorder every call here is a
//! no-op, and the Prometheus exporter behind `GET /metrics` is the edge's
//! (`overseer::metrics`). A recorder must be installed before
//! [`crate::Overseer::start`], or the gauges, kept as deltas, start off wrong.
//!
//! How the gauges are kept, and why:
//! - [`LIVE_SESSIONS`] counts session *actors* by status, kept as deltas by
//!   each actor (+1 when it starts, moved on each checkpointed status change,
//!   −1 when its state is dropped, whether it stopped, hibernated or
//!   panicked). That is exact and O(1). Sessions that live only on disk
//!   (hibernated, or untouched since a restart) are not in it: counting them
//!   would mean a scan of every stored header (O(all sessions), at each scrape
//!   or at boot), which the store offers no cheaper way to do.
//! - [`PENDING_APPROVALS`] counts every pending approval, hibernated sessions
//!   included: a hibernated session's approvals are still waiting for a
//!   human. Each session's current count is kept in a process-wide map (only
//!   sessions with pending approvals have an entry), and the gauge moves by
//!   the difference whenever an entry changes, so a session that hibernates,
//!   crashes or is re-activated is never counted twice nor dropped. At boot,
//!   recovery activates every session awaiting approval, which counts them.

use std::sync::LazyLock;
use std::time::Instant;

use dashmap::DashMap;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use crate::machine::Session;
use crate::model::{
    Decision, Event, EventKind, SessionId, SessionIdHasher, SessionStatus, TranscriptEntry,
};
use crate::provider::{ProviderError, ProviderEvent};
use crate::store::{Checkpoint, CheckpointStore, StoreError};

/// Gauge: live session actors, by `status`.
pub const LIVE_SESSIONS: &str = "overseer_live_sessions";
/// Gauge: tool-call actors running a tool now.
pub const RUNNING_TOOL_CALLS: &str = "overseer_running_tool_calls";
/// Gauge: tool calls waiting for a human decision (hibernated sessions included).
pub const PENDING_APPROVALS: &str = "overseer_pending_approvals";
/// Histogram: approval requested → decided, by `outcome`
/// (`approved`, `denied`, `timed_out`).
pub const APPROVAL_WAIT_SECONDS: &str = "overseer_approval_wait_seconds";
/// Histogram: one tool run, by `tool` and `outcome`
/// (`ok`, `error`, `crashed`, `cancelled`).
pub const TOOL_DURATION_SECONDS: &str = "overseer_tool_duration_seconds";
/// Counter: provider streams ended, by `model` and `outcome` (`ok`, an error
/// kind such as `rate_limited`, or `cancelled`).
pub const PROVIDER_REQUESTS_TOTAL: &str = "overseer_provider_requests_total";
/// Histogram: provider stream start → end, by `model` and `outcome`.
pub const PROVIDER_STREAM_SECONDS: &str = "overseer_provider_stream_seconds";
/// Histogram: provider stream start → its first event, by `model`.
pub const PROVIDER_FIRST_EVENT_SECONDS: &str = "overseer_provider_first_event_seconds";
/// Counter: tokens reported by providers, by `model` and `kind` (`input`, `output`).
pub const PROVIDER_TOKENS_TOTAL: &str = "overseer_provider_tokens_total";
/// Histogram: one checkpoint write, until the store confirms it durable.
pub const CHECKPOINT_SECONDS: &str = "overseer_checkpoint_seconds";
/// Counter: bytes the store encoded for the checkpoints it wrote (header,
/// new rows, blobs; counted by the store that encodes them, see
/// [`record_checkpoint_bytes`]).
pub const CHECKPOINT_BYTES_TOTAL: &str = "overseer_checkpoint_bytes_total";
/// Counter: checkpoints the store refused or failed.
pub const CHECKPOINT_ERRORS_TOTAL: &str = "overseer_checkpoint_errors_total";
/// Counter: session actors restarted after a failure.
pub const SESSION_RESTARTS_TOTAL: &str = "overseer_session_restarts_total";
/// Counter: sessions hibernated (actor stopped, kept on disk).
pub const SESSION_HIBERNATIONS_TOTAL: &str = "overseer_session_hibernations_total";
/// Counter: sessions activated from disk.
pub const SESSION_ACTIVATIONS_TOTAL: &str = "overseer_session_activations_total";
/// Gauge: session trees this node holds the lease of (cluster mode).
pub const CLUSTER_SESSIONS_OWNED: &str = "overseer_cluster_sessions_owned";
/// Counter: leases of session trees this node took, by `reason`
/// (`create`, `activate`, `failover`).
pub const CLUSTER_CLAIMS_TOTAL: &str = "overseer_cluster_claims_total";
/// Counter: checkpoints refused because this node no longer owned the
/// session, by who refused it (`by`): `node` (its own lease had run out by
/// its own clock, or it held no lease on the tree) or `database` (the
/// tree's lease had a newer epoch: the fence).
pub const CLUSTER_FENCED_WRITES_TOTAL: &str = "overseer_cluster_fenced_writes_total";
/// Counter: API requests for a session owned by another node, by `outcome`:
/// `ok` (the owner answered), `unreachable` (it did not, within the
/// forward deadline), `breaker_open` (not sent: the owner stopped answering
/// recently), `overloaded` (not sent: the forward budget was full),
/// `insecure` (not sent: plain HTTP to a non-loopback owner, refused
/// without `cluster.allow_plain_http`).
pub const CLUSTER_FORWARDED_REQUESTS_TOTAL: &str = "overseer_cluster_forwarded_requests_total";
/// Gauge: requests this node is forwarding to owners now (bounded by
/// `cluster.max_in_flight_forwards`, apart from local work's budget).
pub const CLUSTER_FORWARDS_IN_FLIGHT: &str = "overseer_cluster_forwards_in_flight";
/// Histogram: from a dead owner's last heartbeat to this node's activation
/// of a session it took over.
pub const CLUSTER_FAILOVER_SECONDS: &str = "overseer_cluster_failover_seconds";

/// Describes every metric to the installed recorder and registers those
/// without labels at zero, so a scrape shows them before anything happened.
/// Call once, right after installing a recorder; calling again is harmless.
pub fn describe() {
    use metrics::Unit;
    describe_gauge!(
        LIVE_SESSIONS,
        Unit::Count,
        "Session actors live in this process, by status (sessions only on disk are not counted)."
    );
    describe_gauge!(
        RUNNING_TOOL_CALLS,
        Unit::Count,
        "Tool-call actors running a tool."
    );
    describe_gauge!(
        PENDING_APPROVALS,
        Unit::Count,
        "Tool calls waiting for a human decision, hibernated sessions included."
    );
    describe_histogram!(
        APPROVAL_WAIT_SECONDS,
        Unit::Seconds,
        "Time from an approval request to its decision, by outcome."
    );
    describe_histogram!(
        TOOL_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one tool run, by tool and outcome."
    );
    describe_counter!(
        PROVIDER_REQUESTS_TOTAL,
        Unit::Count,
        "Provider streams ended, by model and outcome."
    );
    describe_histogram!(
        PROVIDER_STREAM_SECONDS,
        Unit::Seconds,
        "Provider stream duration, from the request to its end, by model and outcome."
    );
    describe_histogram!(
        PROVIDER_FIRST_EVENT_SECONDS,
        Unit::Seconds,
        "Time from a provider request to its first event, by model."
    );
    describe_counter!(
        PROVIDER_TOKENS_TOTAL,
        Unit::Count,
        "Tokens reported by providers, by model and kind (input, output)."
    );
    describe_histogram!(
        CHECKPOINT_SECONDS,
        Unit::Seconds,
        "Checkpoint write latency, until the store confirms it as durable as configured."
    );
    describe_counter!(
        CHECKPOINT_BYTES_TOTAL,
        Unit::Bytes,
        "Serialized size of the checkpoints written (JSON of header, new entries and new events)."
    );
    describe_counter!(
        CHECKPOINT_ERRORS_TOTAL,
        Unit::Count,
        "Checkpoints that failed."
    );
    describe_counter!(
        SESSION_RESTARTS_TOTAL,
        Unit::Count,
        "Session actors restarted after a failure."
    );
    describe_counter!(
        SESSION_HIBERNATIONS_TOTAL,
        Unit::Count,
        "Sessions hibernated (actor stopped, kept on disk)."
    );
    describe_counter!(
        SESSION_ACTIVATIONS_TOTAL,
        Unit::Count,
        "Sessions activated from disk (after hibernation or a restart)."
    );
    describe_gauge!(
        CLUSTER_SESSIONS_OWNED,
        Unit::Count,
        "Session trees this node holds the lease of (cluster mode)."
    );
    describe_counter!(
        CLUSTER_CLAIMS_TOTAL,
        Unit::Count,
        "Leases of session trees this node took, by reason (create, activate, failover)."
    );
    describe_counter!(
        CLUSTER_FENCED_WRITES_TOTAL,
        Unit::Count,
        "Checkpoints refused because this node no longer owned the session, by who refused (node, database)."
    );
    describe_counter!(
        CLUSTER_FORWARDED_REQUESTS_TOTAL,
        Unit::Count,
        "API requests for a session owned by another node, by outcome (ok, unreachable, breaker_open, overloaded, insecure)."
    );
    describe_gauge!(
        CLUSTER_FORWARDS_IN_FLIGHT,
        Unit::Count,
        "Requests this node is forwarding to their sessions' owners now."
    );
    describe_histogram!(
        CLUSTER_FAILOVER_SECONDS,
        Unit::Seconds,
        "Time from a dead owner's last heartbeat to this node's activation of a session it took over."
    );
    gauge!(RUNNING_TOOL_CALLS).increment(0.0);
    gauge!(PENDING_APPROVALS).increment(0.0);
    for name in [
        CHECKPOINT_BYTES_TOTAL,
        CHECKPOINT_ERRORS_TOTAL,
        SESSION_RESTARTS_TOTAL,
        SESSION_HIBERNATIONS_TOTAL,
        SESSION_ACTIVATIONS_TOTAL,
    ] {
        counter!(name).increment(0);
    }
}

/// Writes a checkpoint, recording its latency. Its size is counted by the
/// store, which encodes it anyway (see [`record_checkpoint_bytes`]):
/// serializing it a second time here only to measure it cost a whole JSON
/// pass per checkpoint.
pub(crate) async fn checkpoint(
    store: &dyn CheckpointStore,
    checkpoint: Checkpoint,
) -> Result<(), StoreError> {
    let started = Instant::now();
    let result = store.checkpoint(checkpoint).await;
    match &result {
        Ok(()) => histogram!(CHECKPOINT_SECONDS).record(started.elapsed()),
        Err(_) => counter!(CHECKPOINT_ERRORS_TOTAL).increment(1),
    }
    result
}

/// Counts `bytes` written for one checkpoint: what a store implementation
/// encoded (keys excluded), called once it is durable.
pub fn record_checkpoint_bytes(bytes: u64) {
    counter!(CHECKPOINT_BYTES_TOTAL).increment(bytes);
}

/// Pending approvals per session, for the sessions that have any.
static PENDING: LazyLock<DashMap<SessionId, usize, SessionIdHasher>> =
    LazyLock::new(DashMap::default);

/// Records that session `id` now has `n` pending approvals; the gauge moves
/// by the difference with what was recorded for it before.
pub(crate) fn set_pending(id: SessionId, n: usize) {
    let old = if n == 0 {
        PENDING.remove(&id).map_or(0, |(_, old)| old)
    } else {
        PENDING.insert(id, n).unwrap_or(0)
    };
    if old != n {
        gauge!(PENDING_APPROVALS).increment(n as f64 - old as f64);
    }
}

/// What one live session actor contributes to the gauges. Dropping it (with
/// the actor's state, however the actor ended) takes the session out of
/// [`LIVE_SESSIONS`]; its pending approvals stay counted (see the module docs).
pub(crate) struct SessionGauges {
    id: SessionId,
    status: SessionStatus,
    pending: usize,
}

impl SessionGauges {
    /// A session actor starts with `session` as last checkpointed.
    pub(crate) fn start(session: &Session) -> Self {
        let status = session.header.status;
        gauge!(LIVE_SESSIONS, "status" => status.as_str()).increment(1.0);
        let pending = session.pending_approvals().len();
        set_pending(session.header.id, pending);
        Self {
            id: session.header.id,
            status,
            pending,
        }
    }

    /// A checkpoint of `session` was written, with `events`: moves the gauges
    /// and records the approval waits that ended.
    pub(crate) fn checkpointed(&mut self, session: &Session, events: &[Event]) {
        let status = session.header.status;
        if status != self.status {
            gauge!(LIVE_SESSIONS, "status" => self.status.as_str()).decrement(1.0);
            gauge!(LIVE_SESSIONS, "status" => status.as_str()).increment(1.0);
            self.status = status;
        }
        let pending = session.pending_approvals().len();
        if pending != self.pending {
            set_pending(self.id, pending);
            self.pending = pending;
        }
        for event in events {
            if let EventKind::DecisionRecorded { call_id, record } = &event.kind {
                let Some(requested_ms) = approval_requested_at(session, call_id) else {
                    continue;
                };
                let outcome = match (&record.decision, record.by.as_deref()) {
                    (Decision::Approve { .. }, _) => "approved",
                    // The approval timer decides as `system`; people decide
                    // under their own name.
                    (Decision::Deny { .. }, Some("system")) => "timed_out",
                    (Decision::Deny { .. }, _) => "denied",
                };
                let waited_ms = record.at_ms.saturating_sub(requested_ms).max(0);
                histogram!(APPROVAL_WAIT_SECONDS, "outcome" => outcome)
                    .record(waited_ms as f64 / 1000.0);
            }
        }
    }
}

impl Drop for SessionGauges {
    fn drop(&mut self) {
        gauge!(LIVE_SESSIONS, "status" => self.status.as_str()).decrement(1.0);
    }
}

/// When the approval of `call_id` was requested, in wall-clock ms: its
/// deadline less the session's approval timeout (exact, also for a call asked
/// again after an interrupted run), else when it was proposed. Wall-clock
/// times, because a wait outlives hibernations and restarts.
fn approval_requested_at(session: &Session, call_id: &crate::model::ToolCallId) -> Option<i64> {
    // A decided call is usually still open; a denial that closed the step
    // has just moved it to the end of the transcript.
    let call = session
        .header
        .open_calls
        .iter()
        .find(|c| &c.id == call_id)
        .or_else(|| {
            session
                .transcript
                .iter()
                .rev()
                .take(64)
                .find_map(|e| match e.as_ref() {
                    TranscriptEntry::ToolResult { call } if &call.id == call_id => Some(call),
                    _ => None,
                })
        })?;
    let timeout_ms = (session.header.config.approval_timeout_secs as i64).saturating_mul(1000);
    Some(
        call.approval_deadline_ms
            .map_or(call.proposed_at_ms, |d| d.saturating_sub(timeout_ms)),
    )
}

/// One tool run in a tool-call actor. Dropped without [`ToolRun::finish`],
/// the run panicked (`crashed`) or was killed (`cancelled`).
pub(crate) struct ToolRun {
    tool: String,
    started: Instant,
    outcome: Option<&'static str>,
}

impl ToolRun {
    /// The tool starts.
    pub(crate) fn start(tool: &str) -> Self {
        gauge!(RUNNING_TOOL_CALLS).increment(1.0);
        Self {
            tool: tool.to_owned(),
            started: Instant::now(),
            outcome: None,
        }
    }

    /// The tool returned `result`.
    pub(crate) fn finish<T, E>(mut self, result: &Result<T, E>) {
        self.outcome = Some(if result.is_ok() { "ok" } else { "error" });
    }
}

impl Drop for ToolRun {
    fn drop(&mut self) {
        gauge!(RUNNING_TOOL_CALLS).decrement(1.0);
        let outcome = self.outcome.unwrap_or(if std::thread::panicking() {
            "crashed"
        } else {
            "cancelled"
        });
        histogram!(TOOL_DURATION_SECONDS, "tool" => std::mem::take(&mut self.tool), "outcome" => outcome)
            .record(self.started.elapsed());
    }
}

/// One provider stream. Dropped without [`ProviderStream::finish`], the
/// stream was aborted (`cancelled`: the session stopped it or went away).
pub(crate) struct ProviderStream {
    model: String,
    started: Instant,
    first_event: bool,
    outcome: Option<&'static str>,
}

impl ProviderStream {
    /// A stream for `model` is requested.
    pub(crate) fn start(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            started: Instant::now(),
            first_event: false,
            outcome: None,
        }
    }

    /// The stream produced `event`.
    pub(crate) fn event(&mut self, event: &ProviderEvent) {
        if !self.first_event {
            self.first_event = true;
            histogram!(PROVIDER_FIRST_EVENT_SECONDS, "model" => self.model.clone())
                .record(self.started.elapsed());
        }
        if let ProviderEvent::Usage(usage) = event {
            counter!(PROVIDER_TOKENS_TOTAL, "model" => self.model.clone(), "kind" => "input")
                .increment(usage.input_tokens);
            counter!(PROVIDER_TOKENS_TOTAL, "model" => self.model.clone(), "kind" => "output")
                .increment(usage.output_tokens);
        }
    }

    /// The stream ended with `result`.
    pub(crate) fn finish(mut self, result: &Result<(), ProviderError>) {
        self.outcome = Some(match result {
            Ok(()) => "ok",
            Err(e) => e.kind(),
        });
    }
}

impl Drop for ProviderStream {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or("cancelled");
        let model = std::mem::take(&mut self.model);
        histogram!(PROVIDER_STREAM_SECONDS, "model" => model.clone(), "outcome" => outcome)
            .record(self.started.elapsed());
        counter!(PROVIDER_REQUESTS_TOTAL, "model" => model, "outcome" => outcome).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_map_keeps_only_sessions_with_pending_approvals() {
        let id = SessionId::generate();
        set_pending(id, 2);
        assert_eq!(PENDING.get(&id).map(|v| *v), Some(2));
        set_pending(id, 2);
        assert_eq!(PENDING.get(&id).map(|v| *v), Some(2));
        set_pending(id, 0);
        assert!(PENDING.get(&id).is_none());
    }
}
