//! Errors a caller of the session API can act on. They travel back through
//! reply ports as `Result`s; the HTTP edge maps each variant to one status.

use serde_json::Value;

use crate::model::{OverrideError, SessionId, SessionStatus, ToolCallId};
use crate::store::StoreError;

/// Why a request to a session was refused. A refused request changed nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SessionError {
    /// No such session.
    #[error("session {0} not found")]
    NotFound(SessionId),
    /// No such agent.
    #[error("unknown agent '{0}'")]
    UnknownAgent(String),
    /// The named stored task does not exist.
    #[error("unknown task '{0}'")]
    UnknownTask(String),
    /// A task run's `context` does not match the task's `input_schema`.
    #[error("{field}: {message}")]
    InvalidContext {
        /// The field (`context`, `context.ticket.id`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The session is completed, failed or cancelled.
    #[error("session {id} is {status} and accepts no more requests")]
    Terminal {
        /// Session.
        id: SessionId,
        /// Its terminal status.
        status: SessionStatus,
    },
    /// The request needs an idle session (e.g. `done` while a turn runs).
    #[error("session {id} is {status}; wait for the turn to end or cancel it")]
    Busy {
        /// Session.
        id: SessionId,
        /// Its status.
        status: SessionStatus,
    },
    /// A submission named calls that are not pending anywhere in the session.
    #[error("unknown tool call id(s): {}", join(.0))]
    UnknownCalls(Vec<ToolCallId>),
    /// A submission named calls that were already decided.
    #[error("tool call(s) already decided: {}", join(.0))]
    AlreadyDecided(Vec<ToolCallId>),
    /// A submission named calls whose approval deadline has passed: the
    /// timeout decides them (denied), whatever arrives after it.
    #[error("the approval deadline of tool call(s) passed, so the timeout denies them: {}", join(.0))]
    ApprovalExpired(Vec<ToolCallId>),
    /// Metadata for calls not decided in the same submission.
    #[error("metadata given for tool call(s) not decided in this submission: {}", join(.0))]
    StrayMetadata(Vec<ToolCallId>),
    /// A submission with no decisions.
    #[error("the submission contains no decisions")]
    EmptySubmission,
    /// Override arguments that fail the tool's schema. Nothing was applied.
    #[error("override_args for {call_id} fail the tool's schema: {}", .error.get("error").and_then(Value::as_str).unwrap_or("invalid"))]
    InvalidOverride {
        /// The call.
        call_id: ToolCallId,
        /// The `{"error", "validation_errors"}` object.
        error: Value,
    },
    /// The request conflicts with one already accepted (e.g. a reused
    /// `message_id` with different text).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A session with this id already exists (with a different request).
    #[error("session {0} already exists")]
    AlreadyExists(SessionId),
    /// The request itself is invalid (empty message, bad option).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Something of the runtime's own failed (it is not started, a record
    /// it relies on is missing): not the caller's doing, and never answered
    /// as a bad request.
    #[error("internal error: {0}")]
    Internal(String),
    /// The checkpoint could not be written or read; the request was not applied.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The session actor could not be reached (shutting down, restarting).
    #[error("session {id} is unavailable: {reason}")]
    Unavailable {
        /// Session.
        id: SessionId,
        /// Why.
        reason: String,
    },
    /// The session's queue of messages waiting behind its running turn is
    /// full (by count or bytes); retry once the turn has moved on.
    #[error("session {id} has too many queued messages: {detail}; retry when its current turn has ended")]
    QueueFull {
        /// Session.
        id: SessionId,
        /// Which limit, with its value.
        detail: String,
    },
    /// A value is over its documented size limit.
    #[error("{what} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// What (a field name).
        what: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// A tenant's quota (live sessions, sessions created per day) is used up.
    #[error("tenant '{tenant}' is over its quota: {detail}")]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// Which quota, with its value.
        detail: String,
    },
    /// The runtime is at its admission limit; retry after the given delay.
    #[error("overloaded: {reason}; retry in {retry_after_secs} s")]
    Overloaded {
        /// Which limit.
        reason: String,
        /// Seconds after which a retry is likely to be admitted.
        retry_after_secs: u64,
    },
}

impl From<OverrideError> for SessionError {
    /// An override the agent does not allow is the caller's to fix.
    fn from(e: OverrideError) -> Self {
        Self::Invalid(e.0)
    }
}

fn join(ids: &[ToolCallId]) -> String {
    ids.iter()
        .map(ToolCallId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// An error with its sources, one line: each source's message is appended
/// unless the text already holds it (many errors repeat their source's
/// message, e.g. [`StoreError::Backend`]; reqwest's "error sending request"
/// hides the useful part, "connection refused", in a source).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store failure keeps the OS error beneath it as a typed source, and
    /// [`chain`] prints each message once.
    #[test]
    fn a_store_failure_keeps_the_os_error_as_its_source() {
        let os = std::io::Error::from_raw_os_error(28);
        let os_text = os.to_string();
        let e = SessionError::Store(StoreError::io("writing the log", os));
        let mut source = std::error::Error::source(&e);
        let mut found = None;
        while let Some(s) = source {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                found = io.raw_os_error();
            }
            source = s.source();
        }
        assert_eq!(found, Some(28), "the OS error is not in the chain of {e:?}");
        let text = chain(&e);
        assert!(text.contains("writing the log"), "{text}");
        assert_eq!(text.matches(&os_text).count(), 1, "{text}");
        // Clone and equality survive the shared cause.
        let copy = e.clone();
        assert_eq!(copy, e);
    }
}
