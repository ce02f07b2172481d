//! What the actors of the tree say to each other: [`SessionMsg`],
//! [`ToolCallMsg`] and [`OrchestratorMsg`].
//!
//! The message types live below the actors that handle them so that the
//! shared services ([`crate::runtime`]) can route messages without naming an
//! actor type, which is what keeps the crate's imports free of cycles (see
//! ARCHITECTURE.md). This module holds data only: no behaviour, no rules.

use ractor::{ActorRef, RpcReplyPort};
use serde_json::{json, Value};

use crate::error::SessionError;
use crate::machine::Session;
use crate::model::{SessionHeader, SessionId, Submission, ToolCallId, ToolRule, Usage};
use crate::provider::{ProviderError, ProviderEvent};
use crate::store::StoredSession;

/// Messages of a session actor. RPC variants carry their reply port last.
pub(crate) enum SessionMsg {
    /// A user message (with an optional idempotency id); acknowledged once
    /// checkpointed.
    Send(
        String,
        Option<String>,
        RpcReplyPort<Result<(), SessionError>>,
    ),
    /// A message sent with the caller's W3C `traceparent`: the turn it
    /// starts is a child of the caller's span (telemetry).
    Traced(String, Box<SessionMsg>),
    /// Decisions; acknowledged once checkpointed.
    Decide(Submission, RpcReplyPort<Result<(), SessionError>>),
    /// Cancel the session (and its subtree).
    Cancel(RpcReplyPort<Result<(), SessionError>>),
    /// Cancel from the parent (its own cancel cascading down): nobody waits.
    CancelFromParent,
    /// Stop the current turn and keep the session.
    Interrupt(RpcReplyPort<Result<(), SessionError>>),
    /// Serve the next turns with another model route.
    SetModel(String, RpcReplyPort<Result<(), SessionError>>),
    /// Set a standing approval rule: (tool, rule, who).
    SetToolRule(
        (String, ToolRule, Option<String>),
        RpcReplyPort<Result<(), SessionError>>,
    ),
    /// The session was found idle in `awaiting_input` since this time.
    ExpireInput(i64),
    /// A person activates a skill: (name, body, who).
    ActivateSkill(
        (String, String, Option<String>),
        RpcReplyPort<Result<(), SessionError>>,
    ),
    /// Mark the session completed.
    Done(RpcReplyPort<Result<(), SessionError>>),
    /// The current state.
    Get(RpcReplyPort<StoredSession>),
    /// The current header alone: what a caller needs that does not need the
    /// transcript (pending approvals, status) without copying it.
    GetHeader(RpcReplyPort<SessionHeader>),
    /// The live actor of one of this session's children, spawned (under this
    /// actor's supervision) from its checkpoint if it is not live. Children
    /// are never activated anywhere else.
    /// The answer says whether the actor was spawned now (an activation).
    ActivateChild(
        SessionId,
        RpcReplyPort<Result<(ActorRef<SessionMsg>, bool), SessionError>>,
    ),
    /// An event of provider stream `attempt`.
    Provider {
        /// Stream attempt (older ones are ignored).
        attempt: u64,
        /// The event.
        event: ProviderEvent,
    },
    /// Provider stream `attempt` ended.
    StreamEnded {
        /// Stream attempt.
        attempt: u64,
        /// Outcome.
        result: Result<(), ProviderError>,
    },
    /// A tool-call actor's result.
    ToolFinished {
        /// Call.
        call_id: ToolCallId,
        /// Dispatch attempt.
        attempt: u32,
        /// Result or error object.
        result: Result<Value, Value>,
    },
    /// An approval deadline passed (ignored unless it is still the call's
    /// deadline: a call asked again has a new one).
    ApprovalTimeout {
        /// Call.
        call_id: ToolCallId,
        /// The deadline the timer was armed for.
        deadline_ms: i64,
    },
    /// The idle timer armed after message number `n` fired.
    Hibernate(u64),
    /// The session has been idle for the rest delay since message number
    /// `n`: let go of what can be read back, if nothing happened since.
    Rest(u64),
    /// The runtime is at its live-session limit: hibernate now if idle.
    HibernateIfIdle,
    /// A child session ended its turn.
    ChildFinished {
        /// This session's `delegate_task` call.
        call_id: ToolCallId,
        /// Its attempt.
        attempt: u32,
        /// The child's result.
        result: Result<Value, Value>,
        /// What the child's subtree spent.
        usage: Usage,
    },
    /// A propagating child started or stopped waiting for a decision.
    ChildWaiting {
        /// This session's `delegate_task` call.
        call_id: ToolCallId,
        /// Whether it waits.
        waiting: bool,
    },
    /// Respawn a failed child from its checkpoint (after backoff).
    RestartChild(SessionId),
    /// Fault injection: panic now (sent by a tool-call actor at `during_tool`).
    #[cfg(feature = "fault-injection")]
    InjectedPanic,
}

/// Messages of a tool-call actor.
pub(crate) enum ToolCallMsg {
    /// Run the tool now.
    Run,
}

/// Messages of the orchestrator.
pub(crate) enum OrchestratorMsg {
    /// Start the actor of a checkpointed root session (or return the live
    /// one; the answer says whether it was spawned now). Child sessions are
    /// refused: only their parent spawns them.
    Spawn(
        Box<Session>,
        RpcReplyPort<Result<(ActorRef<SessionMsg>, bool), SessionError>>,
    ),
    /// Respawn a failed session from its last checkpoint (sent after backoff).
    Restart {
        /// Session.
        id: SessionId,
        /// The failure that caused the restart.
        reason: String,
    },
    /// A restart's reload (read and claim, done off the mailbox) is over:
    /// spawn from it, unless the session was activated meanwhile.
    Reloaded {
        /// Session.
        id: SessionId,
        /// The failure that caused the restart.
        reason: String,
        /// The session as read (`None`: it no longer exists).
        loaded: Result<Option<Box<StoredSession>>, SessionError>,
    },
    /// Cancel, in the store, a child session that no live parent will ever
    /// resume (its parent is terminal, gone, or no longer runs the call that
    /// started it), so none of its approvals is left orphaned.
    CancelOrphan(SessionId, RpcReplyPort<Result<(), SessionError>>),
    /// The cancel of an orphan in the store (done off the mailbox) is over:
    /// answer everyone who asked for it.
    OrphanCancelled(SessionId, Result<(), SessionError>),
    /// How many sessions have a restart history (for leak checks).
    RestartHistories(RpcReplyPort<usize>),
}

/// The result recorded for a tool whose actor crashed.
pub(crate) fn crashed(reason: &str) -> Value {
    json!({"error": format!("tool crashed: {reason}")})
}
