//! The domain model: sessions, transcript entries, tool-call records, decisions,
//! usage and events. Plain data that serializes to the checkpoint format.
//!
//! This module owns the *shape* of the data and the small invariants that belong
//! to a single value (which states are terminal, how override arguments merge).
//! It deliberately owns no behaviour over time: the turn loop lives in
//! [`crate::machine`], persistence behind [`crate::store`].

mod builtins;
mod call;
pub(crate) mod decision;
mod event;
mod overrides;
mod prompt;
mod session;
mod shared_config;
mod trace;
mod transcript;
mod usage;

pub use builtins::{activation_text, ACTIVATE_SKILL, DELEGATE_TASK, READ_SKILL_RESOURCE, RUN_TASK};
pub use call::{CallState, OnInterrupt, ToolCallId, ToolCallRecord};
pub use decision::{merge_override, Decision, DecisionRecord, Submission};
pub use event::{Event, EventKind, Notification};
pub use overrides::{check_output_schema, OverrideError, SessionOverrides};
pub use prompt::PromptClosed;
pub use session::{
    AgentConfig, ApprovalPolicy, Budget, ChildApproval, ContextState, EffectiveConfig, ForkOrigin,
    ParentLink, QueueIndex, QueuedMessage, RecentMessage, SessionHeader, SessionId,
    SessionIdHasher, SessionStatus, StopReason, ToolRule, DEFAULT_MAX_CHILDREN,
    DEFAULT_MAX_DELEGATION_DEPTH, SCHEMA_VERSION,
};
pub use shared_config::SharedConfig;
pub use trace::{is_traceparent, TraceLink};
pub use transcript::{FinishReason, ProposedCall, TranscriptEntry};
pub use usage::Usage;

/// Milliseconds since the Unix epoch: the one wall-clock format in checkpoints,
/// chosen so that snapshots compare and sort without a date library.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
