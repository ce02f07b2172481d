//! Transcript entries: what the model sees, in order.
//!
//! Entries are append-only; each is stored under its own key so a
//! checkpoint writes only the new ones.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ToolCallId, ToolCallRecord, ToolRule};

/// A tool call as the model proposed it, kept inside the assistant entry so
/// the provider request can replay the conversation faithfully.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProposedCall {
    /// Runtime-assigned id (also sent to providers as the tool-call id).
    pub id: ToolCallId,
    /// Tool name as proposed.
    pub name: String,
    /// Arguments as proposed (before any override).
    pub arguments: Value,
}

/// Why the model stopped a step's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// Natural end of the message.
    Stop,
    /// The model wants tools to run.
    ToolCalls,
    /// The output hit the provider's length limit.
    Length,
    /// The model declined to answer (OpenAI's `content_filter`, Anthropic's
    /// `refusal`).
    Refusal,
    /// Anything else the provider reported.
    Other,
}

/// One entry of a session's transcript.
// Entries always live behind an `Arc`, so the variants' size difference costs
// nothing per entry and boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum TranscriptEntry {
    /// A user message that started (or was queued for) a turn.
    User {
        /// The text of the message.
        text: String,
        /// Wall-clock time it was accepted, ms since the epoch.
        at_ms: i64,
    },
    /// What the model said in one step, with the tool calls it proposed.
    Assistant {
        /// Accumulated text of the step (may be empty when it only called tools).
        text: String,
        /// Tool calls in proposal order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ProposedCall>,
        /// Wall-clock time the step's stream ended.
        at_ms: i64,
        /// Why the model stopped (absent in entries from before it was kept).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finish_reason: Option<FinishReason>,
    },
    /// The final record of one tool call, including its result. Joins the
    /// transcript when every call of its step has a result.
    ToolResult {
        /// The full, terminal record (decision, arguments, result).
        call: ToolCallRecord,
    },
    /// A summary of the transcript before index `through`, written by the
    /// model when the conversation outgrew its context window. Requests carry
    /// it instead of the entries it covers (which stay stored and visible).
    Compaction {
        /// The summary.
        summary: String,
        /// It covers the entries before this index.
        through: u64,
        /// How many assistant entries it covers (for step counting).
        assistant_entries: u64,
        /// Wall-clock time it was written.
        at_ms: i64,
    },
    /// The session's model route changed between turns.
    ModelChanged {
        /// Route before.
        from: String,
        /// Route after.
        to: String,
        /// Wall-clock time of the change.
        at_ms: i64,
    },
    /// A failure the turn ran into: the provider's (the partial text of the
    /// step, if any, is the assistant entry before it) or a compaction's.
    /// For people and the API only: never sent to the model, which did not
    /// say it.
    Error {
        /// What went wrong, e.g. `provider error: transport error: …`.
        message: String,
        /// The kind of the provider's failure (`transport`,
        /// `context_overflow`, …; see `ProviderError::kind`), if it was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<String>,
        /// For a context overflow: the request's tokens, as estimated here
        /// (or counted by the provider when it said).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        estimated_tokens: Option<u64>,
        /// For a context overflow: the tokens the model's context allows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context_window: Option<u64>,
        /// Wall-clock time it was recorded.
        at_ms: i64,
    },
    /// A skill (Agent Skills format) was activated: its body joins the
    /// conversation. Requests carry it as a message of its own after the
    /// step it was activated in, and keep it whole through compaction
    /// (see `machine::skills`).
    SkillActivated {
        /// The skill's name.
        name: String,
        /// The skill's instructions (the body of its `SKILL.md`).
        body: String,
        /// The person who activated it; `None` when the model did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
        /// The model's `activate_skill` call, when the model activated it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<ToolCallId>,
        /// Wall-clock time it was activated.
        at_ms: i64,
    },
    /// A standing approval rule for a tool was set (not sent to the model).
    ToolRuleSet {
        /// Tool name.
        tool: String,
        /// The rule.
        rule: ToolRule,
        /// Who set it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
        /// Wall-clock time it was set.
        at_ms: i64,
    },
}
