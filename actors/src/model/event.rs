//! Session events: the audit trail, the source for event-stream replay, and
//! what subscribers receive live.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    CallState, DecisionRecord, SessionId, SessionStatus, StopReason, ToolCallId, ToolRule, Usage,
};

/// A durable event. `seq` is dense and increasing per session, starting at 1;
/// it is the SSE event id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Event {
    /// Session the event belongs to.
    pub session_id: SessionId,
    /// Per-session sequence number.
    pub seq: u64,
    /// Wall-clock time, ms since the epoch.
    pub at_ms: i64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened. Tagged by `type` on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// The session exists.
    SessionCreated {
        /// Agent it runs.
        agent: String,
    },
    /// A user message was accepted (it starts a turn now or after the current one).
    MessageAccepted {
        /// The text.
        text: String,
        /// Whether it waits behind a running turn.
        queued: bool,
    },
    /// A turn started.
    TurnStarted {
        /// 1-based turn number.
        turn: u32,
    },
    /// A step's stream ended: the assistant's text of that step.
    AssistantMessage {
        /// 1-based step number within the turn.
        step: u32,
        /// The text.
        text: String,
    },
    /// The model proposed a tool call.
    ToolCallProposed {
        /// Call id.
        call_id: ToolCallId,
        /// Tool name.
        name: String,
        /// Proposed arguments.
        arguments: Value,
    },
    /// A call waits for a human.
    ApprovalRequested {
        /// Call id.
        call_id: ToolCallId,
        /// Tool name.
        name: String,
        /// Proposed arguments.
        arguments: Value,
        /// Set when the call was interrupted and its outcome is unknown.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        outcome_unknown: bool,
    },
    /// A decision was recorded.
    DecisionRecorded {
        /// Call id.
        call_id: ToolCallId,
        /// The decision with who/when/metadata/diff.
        record: DecisionRecord,
    },
    /// A call was dispatched to its tool (the effect journal's intent).
    ToolCallStarted {
        /// Call id.
        call_id: ToolCallId,
        /// Dispatch attempt, from 1.
        attempt: u32,
    },
    /// A call reached a terminal state.
    ToolCallFinished {
        /// Call id.
        call_id: ToolCallId,
        /// Terminal state.
        state: CallState,
        /// The result object.
        result: Value,
    },
    /// The status changed.
    StatusChanged {
        /// New status.
        status: SessionStatus,
    },
    /// A turn ended.
    TurnEnded {
        /// Turn number.
        turn: u32,
        /// Why.
        stop_reason: StopReason,
        /// Usage after the turn (cumulative).
        usage: Usage,
        /// The turn's structured output, when the session has an
        /// `output_schema` and the answer matched it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Value>,
    },
    /// The older transcript was summarised to fit the model's context.
    Compacted {
        /// The summary covers the entries before this index.
        through: u64,
        /// The summary.
        summary: String,
    },
    /// The next request is close to the model's context window even after
    /// compaction: the conversation may soon fail.
    ContextPressure {
        /// Estimated tokens of the request.
        estimated_tokens: u64,
        /// The route's context window.
        context_window: u64,
    },
    /// The session's model route changed between turns.
    ModelChanged {
        /// Route before.
        from: String,
        /// Route after.
        to: String,
    },
    /// A standing approval rule for a tool was set.
    ToolRuleSet {
        /// Tool name.
        tool: String,
        /// The rule.
        rule: ToolRule,
        /// Who set it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// A skill was activated: its instructions joined the conversation.
    SkillActivated {
        /// The skill's name.
        name: String,
        /// The person who activated it; absent when the model did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// Something went wrong that the session survived or that ended it.
    Error {
        /// Human-readable message.
        message: String,
    },
}

/// What a subscriber receives: durable events, and text deltas that are sent
/// as they stream but never stored (the step's full text is stored once, in
/// `AssistantMessage`, so a lost stream never duplicates text).
// Events are nearly every notification, so boxing them would only add an
// allocation to each. Their size depends on serde_json's features: with
// `preserve_order` (which the ACP SDK of the `overseer` crate turns on for
// the whole build) a `Value` holds an index map and passes the lint's bound.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Notification {
    /// A checkpointed event.
    Event(Event),
    /// A streamed fragment of assistant text.
    TextDelta {
        /// Session.
        session_id: SessionId,
        /// The fragment.
        text: String,
    },
}

impl Notification {
    /// Whether this is the session starting to wait for a decision: the
    /// moment a watcher of propagated (subagent) approvals looks again.
    pub fn starts_awaiting_approval(&self) -> bool {
        matches!(
            self,
            Notification::Event(Event {
                kind: EventKind::StatusChanged {
                    status: SessionStatus::AwaitingApproval
                },
                ..
            })
        )
    }
}
