//! Tool-call records and their state machine.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::DecisionRecord;

/// Identifier of one tool call, unique across a whole session tree.
///
/// The runtime assigns it (never the provider), so ids are unique even when a
/// provider reuses its own ids across steps, and a decision submitted at a root
/// can name a call of any descendant unambiguously.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct ToolCallId(pub String);

impl ToolCallId {
    /// A fresh, time-ordered id (`call_<uuid v7>`).
    pub fn generate() -> Self {
        Self(format!("call_{}", uuid::Uuid::now_v7().simple()))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ToolCallId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ToolCallId {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// The states of a tool call. `Completed`, `Failed`, `Denied` and `Cancelled` are terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Recorded from the model's output, not yet vetted.
    Proposed,
    /// Waits for a human decision.
    AwaitingApproval,
    /// Cleared to run (by policy or by a human), not yet dispatched.
    Approved,
    /// A human (or the approval timeout) said no.
    Denied,
    /// Dispatched to its tool-call actor; intent is checkpointed.
    Running,
    /// The tool returned a result.
    Completed,
    /// Scope, schema, timeout, crash or tool error.
    Failed,
    /// The session was cancelled before the call finished.
    Cancelled,
}

impl CallState {
    /// Whether no further transition is possible.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Denied | Self::Completed | Self::Failed | Self::Cancelled
        )
    }
}

/// What to do with a call that was dispatched when the process stopped and
/// whose outcome was never recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnInterrupt {
    /// Dispatch again with the same idempotency key.
    Retry,
    /// Return to `awaiting_approval`, marked `outcome_unknown`.
    Ask,
    /// Fail the call with an `interrupted` error.
    Fail,
}

/// Everything known about one tool call. Lives in the session header while its
/// step is open, then moves into the transcript as a `ToolResult` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolCallRecord {
    /// Runtime-assigned id.
    pub id: ToolCallId,
    /// Tool name as proposed.
    pub name: String,
    /// Arguments as proposed by the model.
    pub arguments: Value,
    /// Arguments after an approved override (what actually ran), if edited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_arguments: Option<Value>,
    /// Current state.
    pub state: CallState,
    /// Whether the policy asked a human about this call.
    pub requires_approval: bool,
    /// Wall-clock deadline for a decision, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_deadline_ms: Option<i64>,
    /// The decision, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionRecord>,
    /// Dispatch attempts so far (the effect journal's intent counter).
    #[serde(default)]
    pub attempt: u32,
    /// Key sent to the tool so a retried dispatch is recognisable as the same effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Set when the process stopped while the call ran and nobody knows whether
    /// it took effect; a human decides whether to run it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outcome_unknown: bool,
    /// For `delegate_task`: the child session running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<super::SessionId>,
    /// For `delegate_task`: the child (or its subtree) waits for a decision
    /// that surfaces here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub child_waiting: bool,
    /// The result (a tool's JSON, or an `{"error": …}` object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Wall-clock time the call was proposed.
    pub proposed_at_ms: i64,
    /// Wall-clock time the call reached a terminal state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<i64>,
}

impl ToolCallRecord {
    /// A freshly proposed call.
    pub fn proposed(id: ToolCallId, name: String, arguments: Value, at_ms: i64) -> Self {
        Self {
            id,
            name,
            arguments,
            effective_arguments: None,
            state: CallState::Proposed,
            requires_approval: false,
            approval_deadline_ms: None,
            decision: None,
            attempt: 0,
            idempotency_key: None,
            outcome_unknown: false,
            child: None,
            child_waiting: false,
            result: None,
            proposed_at_ms: at_ms,
            finished_at_ms: None,
        }
    }

    /// The arguments the tool is (or was) run with.
    pub fn run_arguments(&self) -> &Value {
        self.effective_arguments.as_ref().unwrap_or(&self.arguments)
    }

    /// Moves the call to a terminal state with `result`.
    pub fn finish(&mut self, state: CallState, result: Value, at_ms: i64) {
        debug_assert!(state.is_terminal());
        self.state = state;
        self.result = Some(result);
        self.finished_at_ms = Some(at_ms);
    }
}
