//! The session state machine: the turn loop and the approval rules
//! as pure transitions.
//!
//! [`Session::apply`] takes an [`Input`] and returns the [`Effect`]s the actor
//! must carry out (start a provider stream, dispatch a tool, arm a timer…). It
//! performs no I/O and reads neither a clock nor randomness (the caller passes
//! `now_ms` and a `seed` the ids it mints derive from), so the same state and
//! input always give the same new state and effects: that is what makes every
//! rule here unit-testable without actors (see the table-driven tests below). What changed is
//! tracked so the actor can checkpoint exactly the new transcript entries and
//! events before it executes any effect (third invariant).

mod context;
mod fork;
mod output;
#[cfg(test)]
mod proptests;
mod rest;
mod skills;

pub use context::DEFAULT_COMPACTION_THRESHOLD_PCT;
pub(crate) use fork::{fork_points, ForkSpec};
pub use fork::{ForkAt, ForkPoint, ForkPointKind};
pub(crate) use rest::RestoreError;

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::delegation::{spawns_child, DelegateArgs, DELEGATE_TASK};
use crate::error::SessionError;
use crate::limits::Limits;
use crate::model::decision::merge_override;
use crate::model::{
    ApprovalPolicy, Budget, CallState, Decision, DecisionRecord, Event, EventKind, OnInterrupt,
    ProposedCall, QueuedMessage, SessionHeader, SessionId, SessionStatus, StopReason, Submission,
    ToolCallId, ToolCallRecord, ToolRule, TranscriptEntry, Usage, SCHEMA_VERSION,
};
use crate::provider::{
    FinishReason, ProviderError, ProviderEvent, ProviderRequest, RequestPurpose,
};
use crate::store::{Checkpoint, Resumable, StoredSession};
use crate::tasks::{RunTaskArgs, RUN_TASK};
use crate::tool::{not_available, ToolRegistry};

/// How many message ids a session remembers for idempotent retries. A retry
/// older than this many later messages is accepted again.
pub(crate) const RECENT_MESSAGE_IDS: usize = 256;

/// The longest accepted `message_id`.
pub(crate) const MAX_MESSAGE_ID_BYTES: usize = 256;

/// FNV-1a: a stable 64-bit hash (std's hasher may change between releases,
/// and these values are persisted).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Reason recorded when an approval times out.
pub(crate) const APPROVAL_TIMEOUT_REASON: &str = "No approval decision received";

/// The result the model sees for a call whose approval timed out.
pub(crate) fn timed_out_result(timeout_secs: u64) -> Value {
    Value::String(format!(
        "Tool not run: the approval request timed out ({APPROVAL_TIMEOUT_REASON} within {timeout_secs} s)"
    ))
}

/// Result of a call that was dispatched when the process stopped and whose
/// outcome is unknown, under `on_interrupt = "fail"`.
pub(crate) fn interrupted_error() -> Value {
    json!({"error": "interrupted: the process stopped while this tool was running; its outcome is unknown"})
}

/// Something that happens to a session.
// `ExpireInput` expires a queued input (the session's, not an `Input`).
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone)]
pub(crate) enum Input {
    /// A user message.
    Message {
        /// Its text.
        text: String,
        /// Client-chosen id that makes a retry of the same message a no-op.
        message_id: Option<String>,
    },
    /// An event of the current provider stream.
    Provider(ProviderEvent),
    /// The current provider stream ended.
    StreamEnded(Result<(), ProviderError>),
    /// Human decisions.
    Decide(Submission),
    /// A tool-call actor reported (or crashed).
    ToolFinished {
        /// Call.
        call_id: ToolCallId,
        /// Dispatch attempt the result belongs to (stale attempts are ignored).
        attempt: u32,
        /// `Ok(result)` or `Err(error object)`.
        result: Result<Value, Value>,
    },
    /// A call's approval deadline passed.
    ApprovalTimedOut {
        /// Call.
        call_id: ToolCallId,
        /// The deadline the timer was armed for: a call asked again since has
        /// another one, and this stale timeout is ignored.
        deadline_ms: i64,
    },
    /// A child session started by a `delegate_task` call ended its turn.
    ChildFinished {
        /// The parent's call.
        call_id: ToolCallId,
        /// Dispatch attempt of that call.
        attempt: u32,
        /// The child's result (see [`crate::delegation::child_result`]).
        result: Result<Value, Value>,
        /// What the child's subtree spent.
        usage: Usage,
    },
    /// A propagating child started or stopped waiting for a decision.
    ChildWaiting {
        /// The parent's call.
        call_id: ToolCallId,
        /// Whether it waits now.
        waiting: bool,
    },
    /// Cancel the session.
    Cancel,
    /// Stop the current turn, keep the session (it then awaits input).
    Interrupt,
    /// Serve the next turns with another model route.
    SetModel {
        /// The route.
        model: String,
        /// What serves it, as the provider describes it (see
        /// [`crate::model::EffectiveConfig::route`]).
        route: Option<Value>,
    },
    /// Set the session's standing approval rule for one tool.
    SetToolRule {
        /// Tool name.
        tool: String,
        /// The rule.
        rule: ToolRule,
        /// Who set it.
        by: Option<String>,
    },
    /// The session has been idle in `awaiting_input` since `idle_since_ms`
    /// (its last transition): complete it if that is past its
    /// `input_timeout_secs`.
    ExpireInput {
        /// The `updated_at_ms` it was found with.
        idle_since_ms: i64,
    },
    /// A person activates a skill: its body joins the conversation.
    ActivateSkill {
        /// The skill's name.
        name: String,
        /// Its instructions (the body of its `SKILL.md`).
        body: String,
        /// Who.
        by: Option<String>,
    },
    /// The user is done with the session.
    Done,
    /// The actor (re)started from a checkpoint: continue whatever was in
    /// flight. `journal` says, for calls dispatched by this process, what is
    /// known of them; a running call absent from it has an unknown outcome.
    Resume {
        /// What this process knows of the open step's running calls.
        journal: Vec<(ToolCallId, u32, Dispatched)>,
    },
    /// The session cannot go on (e.g. restart limit exceeded): fail it,
    /// leaving no call in a non-terminal state.
    Fail {
        /// Recorded as the session's error.
        reason: String,
    },
}

/// Work the actor carries out after the transition is checkpointed.
#[derive(Debug, Clone)]
pub(crate) enum Effect {
    /// Start (or re-issue) the step's provider stream.
    StartStream(ProviderRequest),
    /// Abort the provider stream in flight.
    StopStream,
    /// Run a call in its own tool-call actor.
    Dispatch {
        /// Call.
        call_id: ToolCallId,
        /// Tool.
        name: String,
        /// Arguments to run with.
        arguments: Value,
        /// Attempt number (from 1).
        attempt: u32,
        /// Stable idempotency key.
        idempotency_key: String,
    },
    /// Kill every running tool-call actor.
    KillTools,
    /// Start (or resume) the child session of a `delegate_task` call.
    Delegate {
        /// The parent's call.
        call_id: ToolCallId,
        /// Its attempt.
        attempt: u32,
        /// The child's id (fixed in the intent, so a restart finds the same child).
        child: SessionId,
        /// Parsed arguments.
        args: DelegateArgs,
        /// What the parent has left to grant.
        grant: Budget,
    },
    /// Start (or resume) the child session of a `run_task` call: the
    /// stored task runs under the rules of a delegation.
    RunTask {
        /// The parent's call.
        call_id: ToolCallId,
        /// Its attempt.
        attempt: u32,
        /// The child's id (fixed in the intent, so a restart finds the same child).
        child: SessionId,
        /// Parsed arguments.
        args: RunTaskArgs,
        /// What the parent has left to grant.
        grant: Budget,
    },
    /// Cancel a child session (and its subtree).
    CancelChild(SessionId),
    /// Deliver `ApprovalTimedOut` for this call after a delay.
    ArmApprovalTimer {
        /// Call.
        call_id: ToolCallId,
        /// Its deadline, ms since the epoch.
        deadline_ms: i64,
        /// Delay from now until the deadline.
        after: Duration,
    },
    /// Forward a streamed text fragment to subscribers (never stored).
    Delta(String),
}

/// The timer of a call waiting for a decision, as of `now_ms`.
fn approval_timer(call: &ToolCallRecord, timeout_secs: u64, now_ms: i64) -> Effect {
    let deadline_ms = call
        .approval_deadline_ms
        .unwrap_or_else(|| full_timeout(timeout_secs, now_ms));
    approval_timer_at(&call.id, deadline_ms, now_ms)
}

/// The deadline of a call waiting for a decision with none stored
/// (snapshots from before deadlines were recorded): a full timeout from now.
fn full_timeout(timeout_secs: u64, now_ms: i64) -> i64 {
    now_ms.saturating_add((timeout_secs as i64).saturating_mul(1000))
}

/// The timer of call `call_id` due at `deadline_ms`, as of `now_ms`.
fn approval_timer_at(call_id: &ToolCallId, deadline_ms: i64, now_ms: i64) -> Effect {
    Effect::ArmApprovalTimer {
        call_id: call_id.clone(),
        deadline_ms,
        after: Duration::from_millis(deadline_ms.saturating_sub(now_ms).max(0) as u64),
    }
}

/// What resuming this session after a restart would do, when that is
/// nothing but arming approval timers: the session waits for decisions
/// (`awaiting_approval`, some call awaits one) and nothing of it runs (no
/// call is running, so no tool to sort and no child to resume). `None` for
/// any other session, which needs its actor to resume.
///
/// Boot recovery uses it to leave such a session on disk, as if it had
/// hibernated, instead of loading it and spawning its actor: it arms these
/// timers, and the first decision (or a timeout) activates the session.
/// `machine::tests::a_parked_session_resumes_to_its_timers_alone` checks
/// that it agrees with [`Input::Resume`].
///
/// From what recovery reads of the header ([`Resumable`]): a call with no
/// deadline stored needs the configuration's timeout, and a session whose
/// timeout was not read is not parked (its actor resumes it whole).
pub(crate) fn resume_of_parked(session: &Resumable, now_ms: i64) -> Option<Vec<Effect>> {
    let calls = &session.open_calls;
    let parked = session.status == SessionStatus::AwaitingApproval
        && calls.iter().any(|c| c.state == CallState::AwaitingApproval)
        && calls.iter().all(|c| c.state != CallState::Running);
    if !parked {
        return None;
    }
    calls
        .iter()
        .filter(|c| c.state == CallState::AwaitingApproval)
        .map(|c| {
            let deadline_ms = match (c.approval_deadline_ms, session.approval_timeout_secs) {
                (Some(at), _) => at,
                (None, Some(timeout_secs)) => full_timeout(timeout_secs, now_ms),
                (None, None) => return None,
            };
            Some(approval_timer_at(&c.id, deadline_ms, now_ms))
        })
        .collect()
}

/// What the process knows of a dispatched call whose result the session has
/// not recorded (the in-memory half of the effect journal).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Dispatched {
    /// The tool body never started: dispatching again runs it once.
    NotStarted,
    /// The tool started and never reported: its outcome is unknown.
    Started,
    /// The tool finished; the result is spliced in, never re-run.
    Finished(Result<Value, Value>),
}

/// What the machine needs from outside: the tools, the time and entropy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    /// All tools of the runtime.
    pub tools: &'a ToolRegistry,
    /// Wall-clock now, ms since the epoch.
    pub now_ms: i64,
    /// Entropy for the ids this transition mints (tool calls, children):
    /// the same seed, state and input mint the same ids.
    pub seed: u64,
    /// Bounds of the queue of messages.
    pub limits: Limits,
    /// The context window of the session's model route, in tokens, if known.
    pub context_window: Option<u64>,
    /// Share of the window, in percent, past which the session compacts.
    pub compaction_threshold_pct: u8,
}

impl Ctx<'_> {
    /// A time-ordered id (UUID v7 layout: `now_ms`, then bits derived from
    /// the seed and `salt`). Distinct salts within one transition give
    /// distinct ids.
    fn mint(&self, salt: u64) -> uuid::Uuid {
        let mut bits = [0u8; 10];
        let a = splitmix64(self.seed ^ splitmix64(salt));
        let b = splitmix64(a);
        bits[..8].copy_from_slice(&a.to_be_bytes());
        bits[8..].copy_from_slice(&b.to_be_bytes()[..2]);
        uuid::Builder::from_unix_timestamp_millis(self.now_ms.max(0) as u64, &bits).into_uuid()
    }
}

/// A 64-bit mixer (SplitMix64's finaliser): spreads a seed and a counter
/// over all bits.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What the current provider stream produced so far. Never checkpointed: a
/// lost stream is re-issued whole, so its partial text is never duplicated.
#[derive(Debug, Clone, Default)]
struct Partial {
    text: String,
    calls: Vec<(String, Value)>,
    /// Everything the stream reported: this request's usage and that of
    /// the requests made besides it (see [`ProviderEvent::Usage`]).
    usage: Usage,
    /// What the provider reported of this request's own usage.
    own: Usage,
    finish: Option<FinishReason>,
}

impl Partial {
    /// Characters of what the model streamed: text and tool calls.
    fn streamed_chars(&self) -> u64 {
        let calls: usize = self
            .calls
            .iter()
            .map(|(name, args)| name.len() + args.to_string().len())
            .sum();
        (self.text.len() + calls) as u64
    }
}

/// A session in memory: header, transcript, metadata, queued messages, and
/// what is not yet checkpointed.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The header (status, config, open calls, usage, where the queue is).
    pub header: SessionHeader,
    /// The transcript.
    pub transcript: Vec<Arc<TranscriptEntry>>,
    /// The caller's metadata (`null` if none); set at creation, never changed.
    pub metadata: Value,
    /// Messages accepted while a turn ran, oldest first; the first has
    /// sequence number `header.queue.head`.
    pub inbox: VecDeque<QueuedMessage>,
    persisted_entries: usize,
    /// The queue rows as of the last checkpoint (`head..next`).
    persisted_queue: (u64, u64),
    metadata_persisted: bool,
    /// Shared with the checkpoint that writes them (not copied), and taken
    /// back once it is durable: by then the store has let go of it.
    pending_events: Arc<Vec<Event>>,
    dirty: bool,
    partial: Partial,
    /// The transcript and metadata were let go of at rest (see `rest`):
    /// both are empty until restored from the store.
    released: bool,
}

impl Session {
    /// A brand-new session; its creation event is pending.
    pub(crate) fn new(header: SessionHeader) -> Self {
        let agent = header.agent.clone();
        let mut s = Self {
            header,
            transcript: Vec::new(),
            metadata: Value::Null,
            inbox: VecDeque::new(),
            persisted_entries: 0,
            persisted_queue: (0, 0),
            metadata_persisted: false,
            pending_events: Arc::default(),
            dirty: true,
            partial: Partial::default(),
            released: false,
        };
        s.emit(EventKind::SessionCreated { agent }, s.header.created_at_ms);
        s
    }

    /// A brand-new session with the caller's metadata (written once, by its
    /// first checkpoint).
    pub(crate) fn with_metadata(mut self, metadata: Value) -> Self {
        self.metadata = metadata;
        self
    }

    /// A session read back from the store; nothing pending (unless it was
    /// read from an older layout, which its next checkpoint rewrites).
    pub(crate) fn from_stored(mut stored: StoredSession) -> Self {
        let queue = stored.header.queue;
        let rewrite = stored.needs_rewrite;
        // Older versions are read as they are (the changes since are
        // additive); once in memory the session may gain what only this
        // version can read, so its next checkpoint says this version.
        stored.header.schema_version = stored.header.schema_version.max(SCHEMA_VERSION);
        Self {
            persisted_entries: stored.transcript.len(),
            persisted_queue: if rewrite {
                (queue.head, queue.head)
            } else {
                (queue.head, queue.next)
            },
            metadata_persisted: !rewrite,
            header: stored.header,
            transcript: stored.transcript,
            metadata: stored.metadata,
            inbox: stored.inbox.into(),
            pending_events: Arc::default(),
            dirty: rewrite,
            partial: Partial::default(),
            released: false,
        }
    }

    /// The session as a store would read it back (for the state API).
    pub(crate) fn to_stored(&self) -> StoredSession {
        StoredSession {
            header: self.header.clone(),
            transcript: self.transcript.clone(),
            metadata: self.metadata.clone(),
            inbox: self.inbox.iter().cloned().collect(),
            needs_rewrite: false,
        }
    }

    /// Whether a checkpoint is needed.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The checkpoint of everything changed since the last one. Call
    /// [`Session::mark_persisted`] once it is durable.
    pub(crate) fn checkpoint(&self) -> Checkpoint {
        let q = self.header.queue;
        let (head, next) = self.persisted_queue;
        // Rows queued since the last checkpoint and still queued (a message
        // queued and taken between two checkpoints is never written).
        let from = next.max(q.head);
        let queued = (from..q.next)
            .filter_map(|seq| {
                let i = usize::try_from(seq - q.head).ok()?;
                Some((seq, self.inbox.get(i)?.clone()))
            })
            .collect();
        Checkpoint {
            header: self.header.clone(),
            // Empty while released (nothing is dirty then, see `rest`).
            entries: self
                .transcript
                .get(self.persisted_entries..)
                .unwrap_or_default()
                .iter()
                .enumerate()
                .map(|(i, e)| ((self.persisted_entries + i) as u64, e.clone()))
                .collect(),
            events: Arc::clone(&self.pending_events),
            metadata: (!self.metadata_persisted && !self.metadata.is_null())
                .then(|| self.metadata.clone()),
            queued,
            dequeued: head..q.head.min(next),
        }
    }

    /// Marks the last checkpoint durable and hands back its events for publishing.
    pub(crate) fn mark_persisted(&mut self) -> Vec<Event> {
        // A released session has written everything already (`rest`).
        if !self.released {
            self.persisted_entries = self.transcript.len();
        }
        self.persisted_queue = (self.header.queue.head, self.header.queue.next);
        self.metadata_persisted = true;
        self.dirty = false;
        Arc::unwrap_or_clone(std::mem::take(&mut self.pending_events))
    }

    #[cfg(test)]
    /// Undoes nothing, but forgets pending events after a failed checkpoint
    /// (the actor then fails and restarts from the last durable state).
    pub(crate) fn pending_events(&self) -> &[Event] {
        &self.pending_events
    }

    /// Calls waiting for a decision.
    pub(crate) fn pending_approvals(&self) -> Vec<&ToolCallRecord> {
        self.header
            .open_calls
            .iter()
            .filter(|c| c.state == CallState::AwaitingApproval)
            .collect()
    }

    /// Every call record: those in the transcript, then the open step's.
    pub(crate) fn all_calls(&self) -> Vec<&ToolCallRecord> {
        let mut calls: Vec<&ToolCallRecord> = self
            .transcript
            .iter()
            .filter_map(|e| match e.as_ref() {
                TranscriptEntry::ToolResult { call } => Some(call),
                _ => None,
            })
            .collect();
        calls.extend(self.header.open_calls.iter());
        calls
    }

    /// The provider request for the current step: the transcript as
    /// the model sees it (after any compaction), the tools in scope, the
    /// output schema.
    pub(crate) fn provider_request(&self, tools: &ToolRegistry) -> ProviderRequest {
        ProviderRequest {
            session_id: self.header.id,
            agent: self.header.agent.clone(),
            model: self.header.config.model.clone(),
            instructions: self.header.config.instructions.clone(),
            transcript: self.transcript_as_run(),
            tools: tools.definitions(&self.header.config.tools),
            output_schema: self.header.config.output_schema.clone(),
            purpose: RequestPurpose::Step,
        }
    }

    /// The transcript as the model must see it: where a human edited a
    /// call's arguments before approving it, the assistant's call carries
    /// the arguments that actually ran, so the model reads its result against
    /// what produced it. The stored transcript keeps what the model proposed
    /// (and the call record both, with the diff).
    fn transcript_as_run(&self) -> Vec<Arc<TranscriptEntry>> {
        let view = self.context_view();
        let edited: std::collections::HashMap<&ToolCallId, &Value> = view
            .iter()
            .filter_map(|e| match e.as_ref() {
                TranscriptEntry::ToolResult { call } => call
                    .effective_arguments
                    .as_ref()
                    .map(|args| (&call.id, args)),
                _ => None,
            })
            .collect();
        if edited.is_empty() {
            return view;
        }
        view.iter()
            .map(|e| match e.as_ref() {
                TranscriptEntry::Assistant {
                    text,
                    tool_calls,
                    at_ms,
                    finish_reason,
                } if tool_calls.iter().any(|c| edited.contains_key(&c.id)) => {
                    let tool_calls = tool_calls
                        .iter()
                        .map(|c| match edited.get(&c.id) {
                            Some(args) => ProposedCall {
                                arguments: (*args).clone(),
                                ..c.clone()
                            },
                            None => c.clone(),
                        })
                        .collect();
                    Arc::new(TranscriptEntry::Assistant {
                        text: text.clone(),
                        tool_calls,
                        at_ms: *at_ms,
                        finish_reason: *finish_reason,
                    })
                }
                _ => e.clone(),
            })
            .collect()
    }

    /// Whether nothing is in flight that needs a live actor: the session
    /// waits for a human (or a message), and any call still running is a
    /// delegation whose child waits for a human too. Such a session may
    /// hibernate, and a child in this state is left on disk by its parent.
    pub(crate) fn is_settled(&self) -> bool {
        use SessionStatus::{AwaitingApproval, AwaitingInput, Pending};
        matches!(
            self.header.status,
            AwaitingApproval | AwaitingInput | Pending
        ) && self.header.open_calls.iter().all(|c| {
            c.state.is_terminal()
                || c.state == CallState::AwaitingApproval
                || (c.state == CallState::Running && spawns_child(&c.name) && c.child_waiting)
        })
    }

    /// Applies one input. On `Err` nothing changed, and an input that does
    /// not apply (stale, out of phase) changes nothing either.
    pub(crate) fn apply(
        &mut self,
        input: Input,
        ctx: Ctx<'_>,
    ) -> Result<Vec<Effect>, SessionError> {
        if self.released {
            // The actor restores a released session before any input; one
            // that reached here would transition on an empty transcript.
            return Err(SessionError::Internal(format!(
                "session {} was handed an input while its transcript was released",
                self.header.id
            )));
        }
        // Stamped only when this input changed something: a session with
        // an unwritten earlier transition is dirty already, and an input it
        // ignores must not move its `updated_at_ms` (input expiry reads it).
        let dirty_before = std::mem::replace(&mut self.dirty, false);
        let result = self.transition(input, ctx);
        if self.dirty {
            self.header.updated_at_ms = ctx.now_ms;
        }
        self.dirty |= dirty_before;
        result
    }

    fn transition(&mut self, input: Input, ctx: Ctx<'_>) -> Result<Vec<Effect>, SessionError> {
        let mut fx = Vec::new();
        match input {
            Input::Message { text, message_id } => {
                if self.seen_message(message_id.as_deref(), &text)? {
                    return Ok(fx);
                }
                // Every refusal comes before anything changes, the window of
                // remembered ids included.
                self.check_message(&text, message_id.as_deref(), ctx)?;
                if let Some(id) = message_id {
                    self.remember_message(id, &text);
                }
                self.on_message(text, ctx, &mut fx);
            }
            Input::Provider(ev) => self.on_provider_event(ev, &mut fx),
            Input::StreamEnded(result) => self.on_stream_ended(result, ctx, &mut fx),
            Input::Decide(sub) => self.on_decide(sub, ctx, &mut fx)?,
            Input::ToolFinished {
                call_id,
                attempt,
                result,
            } => self.on_tool_finished(call_id, attempt, result, ctx, &mut fx),
            Input::ApprovalTimedOut {
                call_id,
                deadline_ms,
            } => self.on_approval_timeout(call_id, deadline_ms, ctx, &mut fx),
            Input::ChildFinished {
                call_id,
                attempt,
                result,
                usage,
            } => {
                let running = self.header.open_calls.iter().any(|c| {
                    c.id == call_id && c.state == CallState::Running && c.attempt == attempt
                });
                if running {
                    self.header.children_usage.add(&usage);
                    self.on_tool_finished(call_id, attempt, result, ctx, &mut fx);
                }
            }
            Input::ChildWaiting { call_id, waiting } => {
                if let Some(c) = self
                    .header
                    .open_calls
                    .iter_mut()
                    .find(|c| c.id == call_id && c.state == CallState::Running)
                {
                    if c.child_waiting != waiting {
                        c.child_waiting = waiting;
                        self.dirty = true;
                        self.advance(ctx, &mut fx);
                    }
                }
            }
            Input::Cancel => self.on_cancel(ctx, &mut fx)?,
            Input::Interrupt => self.on_interrupt(ctx, &mut fx)?,
            Input::SetModel { model, route } => self.on_set_model(model, route, ctx)?,
            Input::SetToolRule { tool, rule, by } => self.on_set_tool_rule(tool, rule, by, ctx)?,
            Input::ExpireInput { idle_since_ms } => self.on_expire_input(idle_since_ms, ctx),
            Input::ActivateSkill { name, body, by } => {
                self.on_activate_skill(name, body, by, ctx)?
            }
            Input::Done => self.on_done(ctx)?,
            Input::Resume { journal } => self.on_resume(journal, ctx, &mut fx),
            Input::Fail { reason } => self.on_fail(reason, ctx, &mut fx)?,
        }
        Ok(fx)
    }

    // ---- inputs -------------------------------------------------------------

    /// Whether a message can be accepted at all (nothing changes here): not
    /// to a terminal session, not empty, and within the queue's bounds when
    /// it would wait behind a running turn.
    fn check_message(
        &self,
        text: &str,
        message_id: Option<&str>,
        ctx: Ctx<'_>,
    ) -> Result<(), SessionError> {
        self.refuse_if_terminal()?;
        if text.trim().is_empty() {
            return Err(SessionError::Invalid("message text is empty".into()));
        }
        if let Some(id) = message_id {
            if id.is_empty() || id.len() > MAX_MESSAGE_ID_BYTES {
                return Err(SessionError::Invalid(format!(
                    "message_id: must be 1 to {MAX_MESSAGE_ID_BYTES} bytes"
                )));
            }
        }
        let queues = !matches!(
            self.header.status,
            SessionStatus::Pending | SessionStatus::AwaitingInput
        );
        if queues {
            let limits = ctx.limits;
            let q = self.header.queue;
            let len = text.len() as u64;
            if len > limits.max_queued_bytes {
                return Err(SessionError::TooLarge {
                    what: "text".into(),
                    size: len,
                    limit: limits.max_queued_bytes,
                });
            }
            if q.len() >= limits.max_queued_messages {
                return Err(SessionError::QueueFull {
                    id: self.header.id,
                    detail: format!(
                        "{} messages wait (max_queued_messages = {})",
                        q.len(),
                        limits.max_queued_messages
                    ),
                });
            }
            if q.bytes.saturating_add(len) > limits.max_queued_bytes {
                return Err(SessionError::QueueFull {
                    id: self.header.id,
                    detail: format!(
                        "{} bytes wait and this message has {len} (max_queued_bytes = {})",
                        q.bytes, limits.max_queued_bytes
                    ),
                });
            }
        }
        Ok(())
    }

    fn enqueue(&mut self, message: QueuedMessage) {
        let q = &mut self.header.queue;
        q.next += 1;
        q.bytes = q.bytes.saturating_add(message.text.len() as u64);
        self.inbox.push_back(message);
        self.dirty = true;
    }

    fn dequeue(&mut self) -> Option<QueuedMessage> {
        let message = self.inbox.pop_front()?;
        let q = &mut self.header.queue;
        q.head += 1;
        q.bytes = q.bytes.saturating_sub(message.text.len() as u64);
        self.dirty = true;
        Some(message)
    }

    fn clear_queue(&mut self) {
        if self.inbox.is_empty() {
            return;
        }
        self.inbox.clear();
        let q = &mut self.header.queue;
        q.head = q.next;
        q.bytes = 0;
        self.dirty = true;
    }

    /// Accepts a message [`Session::check_message`] passed.
    fn on_message(&mut self, text: String, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        match self.header.status {
            SessionStatus::Pending | SessionStatus::AwaitingInput => {
                self.emit(
                    EventKind::MessageAccepted {
                        text: text.clone(),
                        queued: false,
                    },
                    ctx.now_ms,
                );
                self.push_entry(TranscriptEntry::User {
                    text,
                    at_ms: ctx.now_ms,
                });
                self.start_turn(ctx, fx);
            }
            _ => {
                self.emit(
                    EventKind::MessageAccepted {
                        text: text.clone(),
                        queued: true,
                    },
                    ctx.now_ms,
                );
                self.enqueue(QueuedMessage {
                    text,
                    at_ms: ctx.now_ms,
                });
            }
        }
    }

    fn on_provider_event(&mut self, ev: ProviderEvent, fx: &mut Vec<Effect>) {
        if !self.is_streaming() {
            return;
        }
        match ev {
            ProviderEvent::TextDelta(t) => {
                self.partial.text.push_str(&t);
                fx.push(Effect::Delta(t));
            }
            ProviderEvent::ToolCall { name, arguments } => {
                self.partial.calls.push((name, arguments))
            }
            ProviderEvent::Usage(u) => {
                if u.provider_requests == 0 {
                    self.partial.own.add(&u);
                }
                self.partial.usage.add(&u);
            }
            ProviderEvent::Done(reason) => self.partial.finish = Some(reason),
        }
    }

    fn on_stream_ended(
        &mut self,
        result: Result<(), ProviderError>,
        ctx: Ctx<'_>,
        fx: &mut Vec<Effect>,
    ) {
        if !self.is_streaming() {
            return;
        }
        let partial = std::mem::take(&mut self.partial);
        self.count_request(&partial, ctx);
        if let Some(through) = self.header.context.compacting_through.take() {
            return self.compaction_ended(through, partial, result, ctx, fx);
        }
        if let Err(e) = result {
            let nothing_shown = partial.text.is_empty() && partial.calls.is_empty();
            if let (ProviderError::ContextOverflow { limit, .. }, true) = (&e, nothing_shown) {
                // A request the model could not fit: summarise the older
                // transcript once and ask again, instead of ending the turn.
                if !self.header.context.overflow_retried {
                    self.header.context.overflow_retried = true;
                    let window = ctx
                        .context_window
                        .or(*limit)
                        .unwrap_or_else(|| self.estimate_tokens(&self.provider_request(ctx.tools)));
                    if let Some(through) = self.compaction_boundary(window) {
                        self.begin_compaction(through, ctx, fx);
                        return;
                    }
                }
                return self.context_overflowed(&e, ctx, fx);
            }
            return self.provider_failed(partial.text, &e, ctx, fx);
        }
        if partial.own.input_tokens > 0 {
            self.calibrate(partial.own.input_tokens, ctx);
        }
        let step = self.header.step;
        let truncated = partial.finish == Some(FinishReason::Length);
        let refused = partial.finish == Some(FinishReason::Refusal);
        // An answer cut at the length limit may hold cut tool calls: none is
        // run (and none is recorded without a result); nor is any of an
        // answer the model itself withdrew.
        let calls = if truncated || refused {
            Vec::new()
        } else {
            partial.calls
        };
        let mut records = Vec::with_capacity(calls.len());
        let mut proposed = Vec::with_capacity(calls.len());
        let salt = self.header.last_event_seq << 16;
        for (i, (name, arguments)) in calls.into_iter().enumerate() {
            let id = ToolCallId(format!("call_{}", ctx.mint(salt | i as u64).simple()));
            proposed.push(ProposedCall {
                id: id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            });
            records.push(ToolCallRecord::proposed(id, name, arguments, ctx.now_ms));
        }
        self.emit(
            EventKind::AssistantMessage {
                step,
                text: partial.text.clone(),
            },
            ctx.now_ms,
        );
        let answer = partial.text;
        self.push_entry(TranscriptEntry::Assistant {
            text: answer.clone(),
            tool_calls: proposed,
            at_ms: ctx.now_ms,
            finish_reason: partial.finish,
        });
        if truncated {
            self.end_turn(StopReason::MaxTokens, ctx, fx);
            return;
        }
        // Not an answer: no output schema is checked against it.
        if refused {
            self.end_turn(StopReason::Refusal, ctx, fx);
            return;
        }
        if records.is_empty() {
            self.answer_ended(&answer, ctx, fx);
            return;
        }
        for mut call in records {
            self.emit(
                EventKind::ToolCallProposed {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                },
                ctx.now_ms,
            );
            self.vet(&mut call, ctx, fx);
            self.header.open_calls.push(call);
        }
        self.advance(ctx, fx);
    }

    /// Adds what the request whose stream just ended (or was cut) spent:
    /// itself, the requests the provider made besides it (retries), and
    /// its tokens as the provider reported them. A request cut off before
    /// its finish (interrupted, broken: a finished one has reported all it
    /// will) after it streamed output is counted with estimates for what it
    /// did not report: its input from the request, its output from what it
    /// streamed. Budgets then never undercount.
    fn count_request(&mut self, partial: &Partial, ctx: Ctx<'_>) {
        let mut usage = partial.usage;
        usage.provider_requests = usage.provider_requests.saturating_add(1);
        let streamed = partial.streamed_chars();
        if partial.finish.is_none() && streamed > 0 {
            if partial.own.input_tokens == 0 {
                let request = match self.header.context.compacting_through {
                    Some(through) => self.compaction_request(through, ctx),
                    None => self.provider_request(ctx.tools),
                };
                usage.input_tokens = usage
                    .input_tokens
                    .saturating_add(self.estimate_tokens(&request));
            }
            if partial.own.output_tokens == 0 {
                usage.output_tokens = usage
                    .output_tokens
                    .saturating_add(self.estimate_streamed_tokens(streamed));
            }
        }
        self.header.usage.add(&usage);
        self.dirty = true;
    }

    /// After a failure the partial text is kept as what the assistant
    /// said, and the error is recorded beside it (an `error` entry and
    /// event), never inside the text: the model is not told it said it.
    fn provider_failed(
        &mut self,
        partial_text: String,
        e: &ProviderError,
        ctx: Ctx<'_>,
        fx: &mut Vec<Effect>,
    ) {
        if !partial_text.is_empty() {
            self.emit(
                EventKind::AssistantMessage {
                    step: self.header.step,
                    text: partial_text.clone(),
                },
                ctx.now_ms,
            );
            self.push_entry(TranscriptEntry::Assistant {
                text: partial_text,
                tool_calls: vec![],
                at_ms: ctx.now_ms,
                finish_reason: None,
            });
        }
        self.record_error(format!("provider error: {e}"), Some(e.kind()), None, ctx);
        self.end_turn(StopReason::Error, ctx, fx);
    }

    /// The request does not fit the model's context, and compacting cannot
    /// make it fit (nothing before the current question to summarise, or a
    /// summary already tried): the turn ends with `context_overflow`,
    /// saying how large the request is and what the model allows.
    fn context_overflowed(&mut self, e: &ProviderError, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        let (counted, limit) = match e {
            ProviderError::ContextOverflow { tokens, limit, .. } => (*tokens, *limit),
            _ => (None, None),
        };
        let estimated = self.estimate_tokens(&self.provider_request(ctx.tools));
        let (tokens, how) = match counted {
            Some(n) => (n, "counted by the provider"),
            None => (estimated, "estimated"),
        };
        // The provider's own figure is what it enforces; the configured
        // window is the fallback.
        let window = limit.or(ctx.context_window);
        let allowed = match window {
            Some(w) => format!("the model's context window allows {w}"),
            None => "more than the model's context window allows".to_owned(),
        };
        let message = format!(
            "context overflow: the request has about {tokens} tokens ({how}); {allowed}, and \
             compacting the conversation cannot make it fit ({e})"
        );
        self.record_error(message, Some(e.kind()), Some((tokens, window)), ctx);
        self.end_turn(StopReason::ContextOverflow, ctx, fx);
    }

    /// Records a failure of the turn as an `error` event and transcript
    /// entry (never sent to the model).
    pub(super) fn record_error(
        &mut self,
        message: String,
        kind: Option<&str>,
        overflow: Option<(u64, Option<u64>)>,
        ctx: Ctx<'_>,
    ) {
        self.emit(
            EventKind::Error {
                message: message.clone(),
            },
            ctx.now_ms,
        );
        self.push_entry(TranscriptEntry::Error {
            message,
            kind: kind.map(str::to_owned),
            estimated_tokens: overflow.map(|(tokens, _)| tokens),
            context_window: overflow.and_then(|(_, window)| window),
            at_ms: ctx.now_ms,
        });
    }

    /// The model answered without calling tools: the turn ends, once its
    /// answer matches the output schema if the session has one (one
    /// repair step with the validation error, then an error).
    fn answer_ended(&mut self, answer: &str, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        let Some(schema) = self.header.config.output_schema.clone() else {
            self.end_turn(StopReason::EndTurn, ctx, fx);
            return;
        };
        match output::check(&schema, answer) {
            Ok(value) => {
                self.header.output = Some(value);
                self.end_turn(StopReason::EndTurn, ctx, fx);
            }
            Err(problem) if !self.header.context.output_repaired => {
                self.header.context.output_repaired = true;
                self.emit(
                    EventKind::Error {
                        message: format!("the answer does not match the output schema: {problem}"),
                    },
                    ctx.now_ms,
                );
                self.push_entry(TranscriptEntry::User {
                    text: output::repair_request(&problem),
                    at_ms: ctx.now_ms,
                });
                self.start_step(ctx, fx);
            }
            Err(problem) => {
                self.emit(
                    EventKind::Error {
                        message: format!(
                            "the answer does not match the output schema after one repair: {problem}"
                        ),
                    },
                    ctx.now_ms,
                );
                self.end_turn(StopReason::Error, ctx, fx);
            }
        }
    }

    fn on_decide(
        &mut self,
        sub: Submission,
        ctx: Ctx<'_>,
        fx: &mut Vec<Effect>,
    ) -> Result<(), SessionError> {
        self.refuse_if_terminal()?;
        if sub.decisions.is_empty() {
            if sub.metadata.is_empty() {
                return Err(SessionError::EmptySubmission);
            }
            return Err(SessionError::StrayMetadata(
                sub.metadata.keys().cloned().collect(),
            ));
        }
        // Classify every id before changing anything: a submission is applied
        // whole or not at all.
        let known: BTreeSet<&ToolCallId> = self.all_calls().into_iter().map(|c| &c.id).collect();
        let mut unknown = Vec::new();
        let mut decided = Vec::new();
        for id in sub.decisions.keys() {
            match self.header.open_calls.iter().find(|c| &c.id == id) {
                Some(c) if c.state == CallState::AwaitingApproval => {}
                Some(_) => decided.push(id.clone()),
                None if known.contains(id) => decided.push(id.clone()),
                None => unknown.push(id.clone()),
            }
        }
        if !unknown.is_empty() {
            return Err(SessionError::UnknownCalls(unknown));
        }
        if !decided.is_empty() {
            return Err(SessionError::AlreadyDecided(decided));
        }
        // Past its deadline a call is the timeout's to decide, even when the
        // timer has not fired yet (a session resumed after the deadline arms
        // it to fire at once): a decision arriving then never runs it.
        let expired: Vec<ToolCallId> = self
            .header
            .open_calls
            .iter()
            .filter(|c| sub.decisions.contains_key(&c.id))
            .filter(|c| c.approval_deadline_ms.is_some_and(|d| d <= ctx.now_ms))
            .map(|c| c.id.clone())
            .collect();
        if !expired.is_empty() {
            return Err(SessionError::ApprovalExpired(expired));
        }
        let stray: Vec<ToolCallId> = sub
            .metadata
            .keys()
            .filter(|id| !sub.decisions.contains_key(*id))
            .cloned()
            .collect();
        if !stray.is_empty() {
            return Err(SessionError::StrayMetadata(stray));
        }
        // Validate overrides against the schema before applying any decision.
        let mut merged = Vec::new();
        for (id, decision) in &sub.decisions {
            if let Decision::Approve {
                override_args,
                remove_args,
            } = decision
            {
                if override_args.is_none() && remove_args.is_empty() {
                    continue;
                }
                let Some(call) = self.header.open_calls.iter().find(|c| &c.id == id) else {
                    continue;
                };
                let none = serde_json::Map::new();
                let over = override_args.as_ref().unwrap_or(&none);
                let (args, diff) = match merge_override(&call.arguments, over, remove_args) {
                    Ok(merged) => merged,
                    Err(problem) => {
                        return Err(SessionError::InvalidOverride {
                            call_id: id.clone(),
                            error: json!({"error": problem}),
                        })
                    }
                };
                if let Err(error) = ctx.tools.validate(&call.name, &args) {
                    return Err(SessionError::InvalidOverride {
                        call_id: id.clone(),
                        error,
                    });
                }
                merged.push((id.clone(), args, diff));
            }
        }
        let Submission {
            decisions,
            mut metadata,
            approved_by,
        } = sub;
        for (id, decision) in decisions {
            let (effective, diff) = match merged.iter().position(|(m, _, _)| m == &id) {
                Some(i) => {
                    let (_, args, diff) = merged.swap_remove(i);
                    (Some(args), Some(diff))
                }
                None => (None, None),
            };
            let record = DecisionRecord {
                decision: decision.clone(),
                by: approved_by.clone(),
                at_ms: ctx.now_ms,
                metadata: metadata.remove(&id),
                args_diff: diff,
            };
            self.record_decision(&id, record, effective, None, ctx);
        }
        self.advance(ctx, fx);
        Ok(())
    }

    fn on_tool_finished(
        &mut self,
        call_id: ToolCallId,
        attempt: u32,
        result: Result<Value, Value>,
        ctx: Ctx<'_>,
        fx: &mut Vec<Effect>,
    ) {
        let Some(i) =
            self.header.open_calls.iter().position(|c| {
                c.id == call_id && c.state == CallState::Running && c.attempt == attempt
            })
        else {
            return; // stale: cancelled, or an older attempt
        };
        // An activated skill's body moves from the result into the
        // transcript, as an entry of its own.
        let result = if self.header.open_calls[i].name == crate::skills::ACTIVATE_SKILL {
            self.skill_activated_by_call(&call_id, result, ctx)
        } else {
            result
        };
        let call = &mut self.header.open_calls[i];
        let (state, value) = match result {
            Ok(v) => (CallState::Completed, v),
            Err(v) => (CallState::Failed, v),
        };
        call.finish(state, value.clone(), ctx.now_ms);
        self.dirty = true;
        self.emit(
            EventKind::ToolCallFinished {
                call_id,
                state,
                result: value,
            },
            ctx.now_ms,
        );
        self.advance(ctx, fx);
    }

    fn on_approval_timeout(
        &mut self,
        call_id: ToolCallId,
        deadline_ms: i64,
        ctx: Ctx<'_>,
        fx: &mut Vec<Effect>,
    ) {
        let waiting = self.header.open_calls.iter().any(|c| {
            c.id == call_id
                && c.state == CallState::AwaitingApproval
                && c.approval_deadline_ms.is_none_or(|d| d == deadline_ms)
        });
        if !waiting || self.header.status.is_terminal() {
            return;
        }
        let record = DecisionRecord {
            decision: Decision::deny(APPROVAL_TIMEOUT_REASON),
            by: Some("system".into()),
            at_ms: ctx.now_ms,
            metadata: None,
            args_diff: None,
        };
        // The model is told the request timed out, not that someone said no.
        let text = timed_out_result(self.header.config.approval_timeout_secs);
        self.record_decision(&call_id, record, None, Some(text), ctx);
        self.advance(ctx, fx);
    }

    fn on_cancel(&mut self, ctx: Ctx<'_>, fx: &mut Vec<Effect>) -> Result<(), SessionError> {
        self.refuse_if_terminal()?;
        let turn_running = self.turn_running();
        self.stop_turn("cancelled: the session was cancelled", ctx, fx);
        if turn_running {
            self.end_turn(StopReason::Cancelled, ctx, fx);
        } else {
            self.set_status(SessionStatus::Cancelled, ctx);
        }
        Ok(())
    }

    /// Stops the current turn and keeps the session: it waits for the next
    /// message, which continues the conversation. Without a turn running it
    /// changes nothing.
    fn on_interrupt(&mut self, ctx: Ctx<'_>, fx: &mut Vec<Effect>) -> Result<(), SessionError> {
        self.refuse_if_terminal()?;
        if !self.turn_running() {
            return Ok(());
        }
        self.stop_turn("interrupted: the turn was stopped", ctx, fx);
        self.end_turn(StopReason::Interrupted, ctx, fx);
        Ok(())
    }

    fn turn_running(&self) -> bool {
        matches!(
            self.header.status,
            SessionStatus::Running | SessionStatus::AwaitingApproval
        )
    }

    /// Stops whatever the turn does (cancel, interrupt): the stream (its
    /// partial text kept), running tools and children, every call not
    /// finished (each gets `why` as its result, so no record is left
    /// non-terminal), and the messages queued behind the turn.
    fn stop_turn(&mut self, why: &str, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        if self.is_streaming() {
            fx.push(Effect::StopStream);
            let partial = std::mem::take(&mut self.partial);
            // The request was made: it counts, cut short or not.
            self.count_request(&partial, ctx);
            let was_summary = self.header.context.compacting_through.take().is_some();
            if !was_summary && !partial.text.is_empty() {
                self.push_entry(TranscriptEntry::Assistant {
                    text: partial.text,
                    tool_calls: vec![],
                    at_ms: ctx.now_ms,
                    finish_reason: None,
                });
            }
        }
        self.stop_calls(fx);
        self.cancel_open_calls(why, ctx);
        self.close_step(ctx);
        self.clear_queue();
    }

    /// Ends every call not yet terminal as cancelled with `why`, each with
    /// its `tool_call_finished` event, so whoever follows the calls (an
    /// inbox card, an editor's tool call) sees it end.
    fn cancel_open_calls(&mut self, why: &str, ctx: Ctx<'_>) {
        let result = json!({ "error": why });
        let mut finished = Vec::new();
        for call in &mut self.header.open_calls {
            if !call.state.is_terminal() {
                call.finish(CallState::Cancelled, result.clone(), ctx.now_ms);
                finished.push(call.id.clone());
            }
        }
        for call_id in finished {
            self.emit(
                EventKind::ToolCallFinished {
                    call_id,
                    state: CallState::Cancelled,
                    result: result.clone(),
                },
                ctx.now_ms,
            );
        }
    }

    /// Switches the model route between turns, recorded in the transcript.
    fn on_set_model(
        &mut self,
        model: String,
        route: Option<Value>,
        ctx: Ctx<'_>,
    ) -> Result<(), SessionError> {
        self.refuse_if_terminal()?;
        match self.header.status {
            SessionStatus::Pending | SessionStatus::AwaitingInput => {}
            status => {
                return Err(SessionError::Busy {
                    id: self.header.id,
                    status,
                })
            }
        }
        if model.trim().is_empty() {
            return Err(SessionError::Invalid("model: must not be empty".into()));
        }
        if self.header.config.model == model {
            // The same route, perhaps served differently now (its endpoint
            // moved): the record follows what serves it.
            if route.is_some() && self.header.config.route != route {
                self.header.config.make_mut().route = route;
                self.dirty = true;
            }
            return Ok(());
        }
        let config = self.header.config.make_mut();
        config.route = route;
        let from = std::mem::replace(&mut config.model, model.clone());
        self.push_entry(TranscriptEntry::ModelChanged {
            from: from.clone(),
            to: model.clone(),
            at_ms: ctx.now_ms,
        });
        self.emit(EventKind::ModelChanged { from, to: model }, ctx.now_ms);
        Ok(())
    }

    /// Records a standing rule for one of the session's tools (any time but
    /// after the end): its next calls are approved or denied without asking.
    fn on_set_tool_rule(
        &mut self,
        tool: String,
        rule: ToolRule,
        by: Option<String>,
        ctx: Ctx<'_>,
    ) -> Result<(), SessionError> {
        self.refuse_if_terminal()?;
        if !self.header.config.tools.iter().any(|t| t == &tool) {
            return Err(SessionError::Invalid(format!(
                "tool: '{tool}' is not one of this session's tools"
            )));
        }
        if self.header.tool_rules.get(&tool) == Some(&rule) {
            return Ok(());
        }
        self.header.tool_rules.insert(tool.clone(), rule);
        self.dirty = true;
        self.push_entry(TranscriptEntry::ToolRuleSet {
            tool: tool.clone(),
            rule,
            by: by.clone(),
            at_ms: ctx.now_ms,
        });
        self.emit(EventKind::ToolRuleSet { tool, rule, by }, ctx.now_ms);
        Ok(())
    }

    /// Completes a session left idle in `awaiting_input` past its
    /// `input_timeout_secs`, if nothing happened since `idle_since_ms`.
    fn on_expire_input(&mut self, idle_since_ms: i64, ctx: Ctx<'_>) {
        let Some(secs) = self.header.config.input_timeout_secs else {
            return;
        };
        let idle = self.header.status == SessionStatus::AwaitingInput
            && self.header.updated_at_ms == idle_since_ms;
        let deadline = idle_since_ms.saturating_add((secs as i64).saturating_mul(1000));
        if !idle || ctx.now_ms < deadline {
            return;
        }
        self.header.completion_reason = Some(format!(
            "no message for {secs} s in awaiting_input (input_timeout_secs = {secs})"
        ));
        self.set_status(SessionStatus::Completed, ctx);
    }

    fn on_fail(
        &mut self,
        reason: String,
        ctx: Ctx<'_>,
        fx: &mut Vec<Effect>,
    ) -> Result<(), SessionError> {
        self.refuse_if_terminal()?;
        let partial = std::mem::take(&mut self.partial);
        if self.is_streaming() {
            self.count_request(&partial, ctx);
        }
        for call in &mut self.header.open_calls {
            if !call.state.is_terminal() {
                call.finish(
                    CallState::Cancelled,
                    json!({"error": format!("session failed: {reason}")}),
                    ctx.now_ms,
                );
            }
        }
        self.close_step(ctx);
        self.clear_queue();
        self.emit(
            EventKind::Error {
                message: reason.clone(),
            },
            ctx.now_ms,
        );
        self.header.error = Some(reason);
        if matches!(
            self.header.status,
            SessionStatus::Running | SessionStatus::AwaitingApproval
        ) {
            self.header.last_stop_reason = Some(StopReason::Error);
            self.emit(
                EventKind::TurnEnded {
                    turn: self.header.turn,
                    stop_reason: StopReason::Error,
                    usage: self.header.usage,
                    output: None,
                },
                ctx.now_ms,
            );
        }
        fx.push(Effect::StopStream);
        self.set_status(SessionStatus::Failed, ctx);
        Ok(())
    }

    fn on_done(&mut self, ctx: Ctx<'_>) -> Result<(), SessionError> {
        self.refuse_if_terminal()?;
        match self.header.status {
            SessionStatus::Pending | SessionStatus::AwaitingInput => {
                self.set_status(SessionStatus::Completed, ctx);
                Ok(())
            }
            status => Err(SessionError::Busy {
                id: self.header.id,
                status,
            }),
        }
    }

    fn on_resume(
        &mut self,
        journal: Vec<(ToolCallId, u32, Dispatched)>,
        ctx: Ctx<'_>,
        fx: &mut Vec<Effect>,
    ) {
        match self.header.status {
            SessionStatus::Running if self.header.open_calls.is_empty() => {
                // The step's provider call (or its compaction) was in
                // flight: re-issue it.
                self.partial = Partial::default();
                let request = match self.header.context.compacting_through {
                    Some(through) => self.compaction_request(through, ctx),
                    None => self.provider_request(ctx.tools),
                };
                fx.push(Effect::StartStream(request));
            }
            SessionStatus::Running | SessionStatus::AwaitingApproval => {
                for i in 0..self.header.open_calls.len() {
                    let state = self.header.open_calls[i].state;
                    if state == CallState::Running && spawns_child(&self.header.open_calls[i].name)
                    {
                        // A child is a session of its own with its own
                        // checkpoints: resume it, never re-create it.
                        self.delegate_effect(i, ctx, fx);
                    } else if state == CallState::Running {
                        let call = &self.header.open_calls[i];
                        let known = journal
                            .iter()
                            .find(|(id, attempt, _)| id == &call.id && *attempt == call.attempt)
                            .map(|(_, _, d)| d.clone());
                        match known {
                            Some(Dispatched::NotStarted) => self.dispatch_again(i, ctx, fx),
                            Some(Dispatched::Finished(result)) => {
                                let (id, attempt) = (call.id.clone(), call.attempt);
                                self.on_tool_finished(id, attempt, result, ctx, &mut Vec::new());
                            }
                            Some(Dispatched::Started) | None => self.interrupted(i, ctx, fx),
                        }
                    } else if state == CallState::AwaitingApproval {
                        self.arm_timer(i, ctx, fx);
                    }
                }
                self.advance(ctx, fx);
            }
            _ => {}
        }
    }

    // ---- the turn loop ------------------------------------------------------

    fn start_turn(&mut self, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        self.header.turn += 1;
        self.header.step = 0;
        self.header.output = None;
        self.header.context.output_repaired = false;
        self.emit(
            EventKind::TurnStarted {
                turn: self.header.turn,
            },
            ctx.now_ms,
        );
        self.set_status(SessionStatus::Running, ctx);
        self.start_step(ctx, fx);
    }

    fn start_step(&mut self, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        if self.header.step >= self.header.config.max_steps {
            self.end_turn(StopReason::MaxSteps, ctx, fx);
            return;
        }
        let elapsed = self.elapsed_secs(ctx);
        if let Some(limit) = self.header.config.budget.exhausted(&self.spent(), elapsed) {
            self.stop_for_budget(limit, ctx, fx);
            return;
        }
        self.header.step += 1;
        self.header.context.overflow_retried = false;
        self.dirty = true;
        self.partial = Partial::default();
        self.request_step(ctx, fx);
    }

    /// Policy and validation of one freshly proposed call.
    fn vet(&mut self, call: &mut ToolCallRecord, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        let in_scope = self.header.config.tools.iter().any(|t| t == &call.name)
            && ctx.tools.spec(&call.name).is_some();
        if !in_scope {
            self.fail_call(call, not_available(&call.name), ctx);
            return;
        }
        if let Err(error) = ctx.tools.validate(&call.name, &call.arguments) {
            self.fail_call(call, error, ctx);
            return;
        }
        if call.name == DELEGATE_TASK {
            if let Err(error) = self.check_delegation(&call.arguments) {
                self.fail_call(call, error, ctx);
                return;
            }
        }
        if call.name == RUN_TASK {
            if let Err(error) = self.check_run_task(&call.arguments) {
                self.fail_call(call, error, ctx);
                return;
            }
        }
        // The skill tools' answers that need no run (a skill not available
        // here, not active yet, or already active) are given at once.
        if let Some(settled) = self.settle_skill_call(call) {
            match settled {
                Ok(result) => self.complete_call(call, result, ctx),
                Err(error) => self.fail_call(call, error, ctx),
            }
            return;
        }
        // The agent's own rule for a tool wins over the tool's default.
        let requires = match self.header.config.tool_approvals.get(&call.name) {
            Some(ask) => *ask,
            None => ctx
                .tools
                .spec(&call.name)
                .is_some_and(|s| s.requires_approval),
        };
        let ask = match self.header.config.approval {
            ApprovalPolicy::Auto => false,
            ApprovalPolicy::Always => true,
            ApprovalPolicy::PerTool => requires,
        };
        // A standing rule answers what a human would have been asked.
        if let (true, Some(&rule)) = (ask, self.header.tool_rules.get(&call.name)) {
            let decision = match rule {
                ToolRule::Allow => Decision::approve(),
                ToolRule::Reject => Decision::deny(format!(
                    "the session's standing rule rejects every call of {}",
                    call.name
                )),
            };
            let record = DecisionRecord {
                decision: decision.clone(),
                by: Some(format!("rule:{}", rule.as_str())),
                at_ms: ctx.now_ms,
                metadata: None,
                args_diff: None,
            };
            self.emit(
                EventKind::DecisionRecorded {
                    call_id: call.id.clone(),
                    record: record.clone(),
                },
                ctx.now_ms,
            );
            call.requires_approval = true;
            call.decision = Some(record);
            match decision {
                Decision::Approve { .. } => call.state = CallState::Approved,
                Decision::Deny { message } => {
                    let reason = message.unwrap_or_default();
                    let result = Value::String(format!("Tool denied by user: {reason}"));
                    call.finish(CallState::Denied, result.clone(), ctx.now_ms);
                    self.emit(
                        EventKind::ToolCallFinished {
                            call_id: call.id.clone(),
                            state: CallState::Denied,
                            result,
                        },
                        ctx.now_ms,
                    );
                }
            }
            return;
        }
        if ask {
            call.requires_approval = true;
            call.state = CallState::AwaitingApproval;
            let secs = self.header.config.approval_timeout_secs;
            let deadline_ms = ctx
                .now_ms
                .saturating_add((secs as i64).saturating_mul(1000));
            call.approval_deadline_ms = Some(deadline_ms);
            self.emit(
                EventKind::ApprovalRequested {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    outcome_unknown: false,
                },
                ctx.now_ms,
            );
            fx.push(Effect::ArmApprovalTimer {
                call_id: call.id.clone(),
                deadline_ms,
                after: Duration::from_secs(secs),
            });
        } else {
            call.state = CallState::Approved;
        }
    }

    /// Completes a call that needs no run (its answer is known at once).
    fn complete_call(&mut self, call: &mut ToolCallRecord, result: Value, ctx: Ctx<'_>) {
        call.finish(CallState::Completed, result.clone(), ctx.now_ms);
        self.emit(
            EventKind::ToolCallFinished {
                call_id: call.id.clone(),
                state: CallState::Completed,
                result,
            },
            ctx.now_ms,
        );
    }

    fn fail_call(&mut self, call: &mut ToolCallRecord, error: Value, ctx: Ctx<'_>) {
        call.finish(CallState::Failed, error.clone(), ctx.now_ms);
        self.emit(
            EventKind::ToolCallFinished {
                call_id: call.id.clone(),
                state: CallState::Failed,
                result: error,
            },
            ctx.now_ms,
        );
    }

    /// Applies one decision. `denied_result` replaces the result text of a
    /// denial (a timeout is not a user's "no").
    fn record_decision(
        &mut self,
        id: &ToolCallId,
        record: DecisionRecord,
        effective: Option<Value>,
        denied_result: Option<Value>,
        ctx: Ctx<'_>,
    ) {
        let Some(i) = self.header.open_calls.iter().position(|c| &c.id == id) else {
            return;
        };
        self.emit(
            EventKind::DecisionRecorded {
                call_id: id.clone(),
                record: record.clone(),
            },
            ctx.now_ms,
        );
        let call = &mut self.header.open_calls[i];
        let denial = match &record.decision {
            Decision::Deny { message } => Some(message.clone()),
            Decision::Approve { .. } => None,
        };
        call.decision = Some(record);
        let finished = match denial {
            Some(message) if call.outcome_unknown => {
                // Denying the re-run of an interrupted call fails it (`ask`).
                let _ = message;
                call.finish(CallState::Failed, interrupted_error(), ctx.now_ms);
                Some((CallState::Failed, interrupted_error()))
            }
            Some(message) => {
                let reason = message.unwrap_or_else(|| "no reason given".into());
                let result = denied_result
                    .unwrap_or_else(|| Value::String(format!("Tool denied by user: {reason}")));
                call.finish(CallState::Denied, result.clone(), ctx.now_ms);
                Some((CallState::Denied, result))
            }
            None => {
                if effective.is_some() {
                    call.effective_arguments = effective;
                }
                call.state = CallState::Approved;
                None
            }
        };
        self.dirty = true;
        if let Some((state, result)) = finished {
            self.emit(
                EventKind::ToolCallFinished {
                    call_id: id.clone(),
                    state,
                    result,
                },
                ctx.now_ms,
            );
        }
    }

    /// Moves the open step forward: wait for decisions, dispatch approved calls,
    /// or close the step and start the next one.
    fn advance(&mut self, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        if self.header.status.is_terminal() {
            return;
        }
        if self
            .header
            .open_calls
            .iter()
            .any(|c| c.state == CallState::AwaitingApproval)
        {
            self.set_status(SessionStatus::AwaitingApproval, ctx);
            return;
        }
        // A propagating child that waits for a decision makes this session
        // wait too, while its other calls go on.
        let child_waits = self
            .header
            .open_calls
            .iter()
            .any(|c| c.state == CallState::Running && c.child_waiting);
        self.set_status(
            if child_waits {
                SessionStatus::AwaitingApproval
            } else {
                SessionStatus::Running
            },
            ctx,
        );
        let calls = &self.header.open_calls;
        let parallel = self.header.config.parallel_tool_calls;
        let is_plain = |c: &ToolCallRecord| !spawns_child(&c.name);
        let running_plain = calls
            .iter()
            .any(|c| c.state == CallState::Running && is_plain(c));
        // Delegations always run concurrently; other calls in proposal
        // order unless the agent allows parallel calls.
        let mut to_dispatch: Vec<usize> = (0..calls.len())
            .filter(|&i| calls[i].state == CallState::Approved && !is_plain(&calls[i]))
            .collect();
        let plain = (0..calls.len())
            .filter(|&i| calls[i].state == CallState::Approved && is_plain(&calls[i]));
        if parallel {
            to_dispatch.extend(plain);
        } else if !running_plain {
            to_dispatch.extend(plain.take(1));
        }
        to_dispatch.sort_unstable();
        if !to_dispatch.is_empty() {
            if let Some(limit) = self.tool_budget_exhausted(to_dispatch.len() as u64) {
                self.stop_for_budget(limit, ctx, fx);
                return;
            }
        }
        for i in to_dispatch {
            self.dispatch(i, ctx, fx);
        }
        if self.header.open_calls.iter().all(|c| c.state.is_terminal()) {
            self.close_step(ctx);
            self.start_step(ctx, fx);
        }
    }

    /// Records the intent and asks the actor to run the call (effect journal).
    fn dispatch(&mut self, i: usize, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        if spawns_child(&self.header.open_calls[i].name) {
            let live = self
                .header
                .open_calls
                .iter()
                .filter(|c| spawns_child(&c.name) && c.state == CallState::Running)
                .count() as u32;
            let max = self.header.config.max_children;
            if live >= max {
                let error = json!({"error": format!(
                    "max_children reached: this session already has {live} live child session(s) (max_children = {max})"
                )});
                let mut call = self.header.open_calls[i].clone();
                self.fail_call(&mut call, error, ctx);
                self.header.open_calls[i] = call;
                return;
            }
            let salt = (self.header.last_event_seq << 16) | 0xffff;
            let call = &mut self.header.open_calls[i];
            call.state = CallState::Running;
            call.attempt += 1;
            call.child.get_or_insert_with(|| SessionId(ctx.mint(salt)));
            let (call_id, attempt) = (call.id.clone(), call.attempt);
            self.header.usage.tool_calls += 1;
            self.dirty = true;
            self.emit(EventKind::ToolCallStarted { call_id, attempt }, ctx.now_ms);
            self.delegate_effect(i, ctx, fx);
            return;
        }
        let call = &mut self.header.open_calls[i];
        call.state = CallState::Running;
        call.attempt += 1;
        let key = call
            .idempotency_key
            .get_or_insert_with(|| call.id.0.clone())
            .clone();
        let effect = Effect::Dispatch {
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: call.run_arguments().clone(),
            attempt: call.attempt,
            idempotency_key: key,
        };
        let (call_id, attempt) = (call.id.clone(), call.attempt);
        self.header.usage.tool_calls += 1;
        self.dirty = true;
        self.emit(EventKind::ToolCallStarted { call_id, attempt }, ctx.now_ms);
        fx.push(effect);
    }

    /// A call was running when its actor (or the process) stopped.
    fn interrupted(&mut self, i: usize, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        let policy = ctx
            .tools
            .spec(&self.header.open_calls[i].name)
            .map(|s| s.interrupt_policy())
            .unwrap_or(OnInterrupt::Fail);
        let auto = self.header.config.approval == ApprovalPolicy::Auto;
        match policy {
            OnInterrupt::Retry => self.dispatch_again(i, ctx, fx),
            OnInterrupt::Ask if !auto => {
                let call = &mut self.header.open_calls[i];
                call.state = CallState::AwaitingApproval;
                call.outcome_unknown = true;
                call.decision = None;
                call.approval_deadline_ms = Some(ctx.now_ms.saturating_add(
                    (self.header.config.approval_timeout_secs as i64).saturating_mul(1000),
                ));
                let (call_id, name, arguments) = (
                    call.id.clone(),
                    call.name.clone(),
                    call.run_arguments().clone(),
                );
                self.dirty = true;
                self.emit(
                    EventKind::ApprovalRequested {
                        call_id,
                        name,
                        arguments,
                        outcome_unknown: true,
                    },
                    ctx.now_ms,
                );
                self.arm_timer(i, ctx, fx);
            }
            OnInterrupt::Ask | OnInterrupt::Fail => {
                let call = &mut self.header.open_calls[i];
                call.finish(CallState::Failed, interrupted_error(), ctx.now_ms);
                let call_id = call.id.clone();
                self.dirty = true;
                self.emit(
                    EventKind::ToolCallFinished {
                        call_id,
                        state: CallState::Failed,
                        result: interrupted_error(),
                    },
                    ctx.now_ms,
                );
            }
        }
    }

    fn dispatch_again(&mut self, i: usize, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        self.header.open_calls[i].state = CallState::Approved;
        if self.header.config.parallel_tool_calls
            || !self
                .header
                .open_calls
                .iter()
                .any(|c| c.state == CallState::Running)
        {
            self.dispatch(i, ctx, fx);
        }
    }

    fn arm_timer(&self, i: usize, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        fx.push(approval_timer(
            &self.header.open_calls[i],
            self.header.config.approval_timeout_secs,
            ctx.now_ms,
        ));
    }

    /// Moves the open step's finished calls into the transcript, in proposal order.
    fn close_step(&mut self, _ctx: Ctx<'_>) {
        let calls = std::mem::take(&mut self.header.open_calls);
        for call in calls {
            self.push_entry(TranscriptEntry::ToolResult { call });
        }
    }

    fn end_turn(&mut self, reason: StopReason, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        self.header.last_stop_reason = Some(reason);
        self.emit(
            EventKind::TurnEnded {
                turn: self.header.turn,
                stop_reason: reason,
                usage: self.header.usage,
                output: self
                    .header
                    .output
                    .clone()
                    .filter(|_| reason == StopReason::EndTurn),
            },
            ctx.now_ms,
        );
        if reason == StopReason::Cancelled {
            self.set_status(SessionStatus::Cancelled, ctx);
            return;
        }
        if let Some(next) = self.dequeue() {
            self.push_entry(TranscriptEntry::User {
                text: next.text,
                at_ms: next.at_ms,
            });
            self.start_turn(ctx, fx);
            return;
        }
        let status = if self.header.auto_complete {
            SessionStatus::Completed
        } else {
            SessionStatus::AwaitingInput
        };
        self.set_status(status, ctx);
    }

    // ---- message idempotency ------------------------------------------------------

    /// Whether `message_id` was already accepted: `Ok(true)` for a retry of
    /// the same message (a no-op), an error if the id came with other text.
    fn seen_message(&self, message_id: Option<&str>, text: &str) -> Result<bool, SessionError> {
        let Some(id) = message_id else {
            return Ok(false);
        };
        let key = fnv1a(id);
        let same = |m: &&crate::model::RecentMessage| match &m.id {
            Some(legacy) => legacy == id,
            None => m.id_hash == key,
        };
        match self.header.recent_messages.iter().find(same) {
            Some(m) if m.text_hash == fnv1a(text) => Ok(true),
            Some(_) => Err(SessionError::Conflict(format!(
                "message_id '{id}' was already used for a different message"
            ))),
            None => Ok(false),
        }
    }

    fn remember_message(&mut self, id: String, text: &str) {
        let recent = &mut self.header.recent_messages;
        if recent.len() >= RECENT_MESSAGE_IDS {
            recent.remove(0);
        }
        recent.push(crate::model::RecentMessage {
            id_hash: fnv1a(&id),
            id: None,
            text_hash: fnv1a(text),
        });
        self.dirty = true;
    }

    // ---- delegation and budgets -----------------------------------------------

    /// What this session and its finished children spent.
    pub(crate) fn spent(&self) -> Usage {
        let mut u = self.header.usage;
        u.add(&self.header.children_usage);
        u
    }

    fn elapsed_secs(&self, ctx: Ctx<'_>) -> u64 {
        (ctx.now_ms.saturating_sub(self.header.created_at_ms) / 1000).max(0) as u64
    }

    /// The subagent and depth rules of delegation, checked when the call is proposed.
    fn check_delegation(&self, arguments: &Value) -> Result<(), Value> {
        let args: DelegateArgs = serde_json::from_value(arguments.clone())
            .map_err(|e| json!({"error": format!("invalid delegate_task arguments: {e}")}))?;
        let cfg = &self.header.config;
        if !cfg.subagents.iter().any(|a| a == &args.agent) {
            return Err(json!({"error": format!(
                "agent '{}' is not a subagent of '{}' (subagents: {})",
                args.agent,
                self.header.agent,
                cfg.subagents.join(", ")
            )}));
        }
        let depth = self.header.parent.as_ref().map_or(0, |p| p.depth);
        if depth + 1 > cfg.max_delegation_depth {
            return Err(json!({"error": format!(
                "delegation depth limit reached: a child here would be at depth {} (max_delegation_depth = {})",
                depth + 1,
                cfg.max_delegation_depth
            )}));
        }
        Ok(())
    }

    fn delegate_effect(&mut self, i: usize, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        if self.header.open_calls[i].name == RUN_TASK {
            return self.run_task_effect(i, ctx, fx);
        }
        let call = &self.header.open_calls[i];
        let args: DelegateArgs = match serde_json::from_value(call.run_arguments().clone()) {
            Ok(a) => a,
            Err(e) => {
                let error = json!({"error": format!("invalid delegate_task arguments: {e}")});
                let mut call = call.clone();
                call.finish(CallState::Failed, error.clone(), ctx.now_ms);
                let id = call.id.clone();
                self.header.open_calls[i] = call;
                self.emit(
                    EventKind::ToolCallFinished {
                        call_id: id,
                        state: CallState::Failed,
                        result: error,
                    },
                    ctx.now_ms,
                );
                return;
            }
        };
        let Some(child) = call.child else { return };
        let grant = self
            .header
            .config
            .budget
            .remaining(&self.spent(), self.elapsed_secs(ctx));
        fx.push(Effect::Delegate {
            call_id: call.id.clone(),
            attempt: call.attempt,
            child,
            args,
            grant,
        });
    }

    /// The rules for `run_task`, checked when the call is proposed:
    /// the task must be one this session may run.
    fn check_run_task(&self, arguments: &Value) -> Result<(), Value> {
        let args: RunTaskArgs = serde_json::from_value(arguments.clone())
            .map_err(|e| json!({"error": format!("invalid run_task arguments: {e}")}))?;
        let cfg = &self.header.config;
        if !cfg.tasks.iter().any(|t| t == &args.task) {
            return Err(json!({"error": format!(
                "unknown task '{}': not one of the tasks this session may run ({})",
                args.task,
                if cfg.tasks.is_empty() { "none".to_owned() } else { cfg.tasks.join(", ") }
            )}));
        }
        let depth = self.header.parent.as_ref().map_or(0, |p| p.depth);
        if depth + 1 > cfg.max_delegation_depth {
            return Err(json!({"error": format!(
                "delegation depth limit reached: a task run here would be at depth {} (max_delegation_depth = {})",
                depth + 1,
                cfg.max_delegation_depth
            )}));
        }
        Ok(())
    }

    fn run_task_effect(&mut self, i: usize, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        let call = &self.header.open_calls[i];
        let args: RunTaskArgs = match serde_json::from_value(call.run_arguments().clone()) {
            Ok(a) => a,
            Err(e) => {
                let error = json!({"error": format!("invalid run_task arguments: {e}")});
                let mut call = call.clone();
                self.fail_call(&mut call, error, ctx);
                self.header.open_calls[i] = call;
                return;
            }
        };
        let Some(child) = call.child else { return };
        let grant = self
            .header
            .config
            .budget
            .remaining(&self.spent(), self.elapsed_secs(ctx));
        fx.push(Effect::RunTask {
            call_id: call.id.clone(),
            attempt: call.attempt,
            child,
            args,
            grant,
        });
    }

    /// Whether dispatching `n` more calls would pass the tool-call budget.
    fn tool_budget_exhausted(&self, n: u64) -> Option<&'static str> {
        let max = self.header.config.budget.max_tool_calls?;
        (self.spent().tool_calls.saturating_add(n) > max).then_some("tool_calls")
    }

    /// Kills running tools and cancels running children (effects only).
    fn stop_calls(&self, fx: &mut Vec<Effect>) {
        let calls = &self.header.open_calls;
        if calls
            .iter()
            .any(|c| c.state == CallState::Running && !spawns_child(&c.name))
        {
            fx.push(Effect::KillTools);
        }
        for c in calls {
            if c.state == CallState::Running && spawns_child(&c.name) {
                if let Some(child) = c.child {
                    fx.push(Effect::CancelChild(child));
                }
            }
        }
    }

    /// Ends the turn with `budget_exceeded`; no call is left non-terminal.
    fn stop_for_budget(&mut self, limit: &str, ctx: Ctx<'_>, fx: &mut Vec<Effect>) {
        self.stop_calls(fx);
        let reason = format!("budget exceeded: {limit}");
        self.cancel_open_calls(&reason, ctx);
        self.close_step(ctx);
        self.emit(EventKind::Error { message: reason }, ctx.now_ms);
        self.end_turn(StopReason::BudgetExceeded, ctx, fx);
    }

    // ---- helpers ------------------------------------------------------------

    fn is_streaming(&self) -> bool {
        self.header.status == SessionStatus::Running && self.header.open_calls.is_empty()
    }

    fn refuse_if_terminal(&self) -> Result<(), SessionError> {
        if self.header.status.is_terminal() {
            return Err(SessionError::Terminal {
                id: self.header.id,
                status: self.header.status,
            });
        }
        Ok(())
    }

    fn set_status(&mut self, status: SessionStatus, ctx: Ctx<'_>) {
        if self.header.status != status {
            self.header.status = status;
            self.emit(EventKind::StatusChanged { status }, ctx.now_ms);
        }
    }

    fn push_entry(&mut self, entry: TranscriptEntry) {
        self.transcript.push(Arc::new(entry));
        self.header.transcript_len = self.transcript.len() as u64;
        self.dirty = true;
    }

    fn emit(&mut self, kind: EventKind, at_ms: i64) {
        self.header.last_event_seq += 1;
        Arc::make_mut(&mut self.pending_events).push(Event {
            session_id: self.header.id,
            seq: self.header.last_event_seq,
            at_ms,
            kind,
        });
        self.dirty = true;
    }
}

#[cfg(test)]
mod tests {
    //! `Session::apply` itself, table-driven: a session is driven through a
    //! list of inputs, and each row names what the last input must produce
    //! (effects, status, and whether it was refused with nothing changed).

    use super::*;
    use crate::model::{AgentConfig, RecentMessage, SCHEMA_VERSION};
    use crate::tool::{Tool, ToolContext, ToolError, ToolSpec};

    struct Noop(ToolSpec);

    #[async_trait::async_trait]
    impl Tool for Noop {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        async fn call(&self, _ctx: ToolContext, _args: Value) -> Result<Value, ToolError> {
            Ok(Value::Null)
        }
    }

    pub(super) fn registry() -> ToolRegistry {
        ToolRegistry::new(vec![
            Arc::new(Noop(
                ToolSpec::new(
                    "ask",
                    "needs approval",
                    json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
                )
                .with_approval(true),
            )),
            Arc::new(Noop(ToolSpec::new(
                "free",
                "no approval",
                json!({"type": "object"}),
            ))),
        ])
        .unwrap()
    }

    const NOW: i64 = 1_700_000_000_000;
    const TIMEOUT_SECS: u64 = 30;

    pub(super) fn session() -> Session {
        let mut agent = AgentConfig::new("a", &["ask", "free"]);
        agent.approval_timeout_secs = TIMEOUT_SECS;
        let id = SessionId(uuid::Uuid::from_u128(7));
        let header = SessionHeader::new(id, "t".into(), "a".into(), agent.effective(), NOW);
        assert_eq!(header.schema_version, SCHEMA_VERSION);
        let mut s = Session::new(header);
        s.mark_persisted();
        s
    }

    pub(super) fn msg(text: &str) -> Input {
        Input::Message {
            text: text.into(),
            message_id: None,
        }
    }

    pub(super) fn calls(names: &[&str]) -> Vec<Input> {
        let mut v: Vec<Input> = names
            .iter()
            .map(|n| {
                Input::Provider(ProviderEvent::ToolCall {
                    name: (*n).into(),
                    arguments: json!({}),
                })
            })
            .collect();
        v.push(Input::StreamEnded(Ok(())));
        v
    }

    /// A compact name for each effect.
    fn shape(fx: &[Effect]) -> Vec<String> {
        fx.iter()
            .map(|e| match e {
                Effect::StartStream(_) => "stream".to_owned(),
                Effect::StopStream => "stop_stream".to_owned(),
                Effect::Dispatch { name, attempt, .. } => format!("dispatch {name} #{attempt}"),
                Effect::KillTools => "kill_tools".to_owned(),
                Effect::Delegate { .. } => "delegate".to_owned(),
                Effect::RunTask { .. } => "run_task".to_owned(),
                Effect::CancelChild(_) => "cancel_child".to_owned(),
                Effect::ArmApprovalTimer {
                    deadline_ms, after, ..
                } => format!("timer +{}ms @{}", after.as_millis(), deadline_ms - NOW),
                Effect::Delta(t) => format!("delta {t}"),
            })
            .collect()
    }

    pub(super) fn ctx(tools: &ToolRegistry, seed: u64) -> Ctx<'_> {
        Ctx {
            tools,
            now_ms: NOW,
            seed,
            limits: Limits::default(),
            context_window: None,
            compaction_threshold_pct: DEFAULT_COMPACTION_THRESHOLD_PCT,
        }
    }

    /// Applies `inputs` in order; returns the session and what the last one
    /// gave.
    fn drive(
        s: &mut Session,
        tools: &ToolRegistry,
        inputs: Vec<Input>,
    ) -> Result<Vec<Effect>, SessionError> {
        let mut last = Ok(Vec::new());
        for input in inputs {
            last = s.apply(input, ctx(tools, 42));
            s.mark_persisted();
        }
        last
    }

    pub(super) fn pending_id(s: &Session) -> ToolCallId {
        s.pending_approvals()[0].id.clone()
    }

    pub(super) fn approve(s: &Session) -> Input {
        Input::Decide(Submission::one(pending_id(s), Decision::approve()))
    }

    /// Past its deadline a call is the timeout's: a decision that arrives
    /// before the timer fired (as after a restart past the deadline) is
    /// refused and changes nothing, and the timeout then denies the call.
    #[test]
    fn a_decision_past_the_call_deadline_is_refused_and_the_timeout_decides() {
        let tools = registry();
        let at = |now_ms| Ctx {
            now_ms,
            ..ctx(&tools, 42)
        };
        let mut s = session();
        drive(&mut s, &tools, [vec![msg("hi")], calls(&["ask"])].concat()).unwrap();
        let id = pending_id(&s);
        let before = s.header.clone();
        match s.apply(approve(&s), at(NOW + 30_000)) {
            Err(SessionError::ApprovalExpired(ids)) => assert_eq!(ids, vec![id.clone()]),
            other => panic!("a decision at the deadline: {other:?}"),
        }
        assert_eq!(s.header, before, "nothing changed");
        let fx = s
            .apply(
                Input::ApprovalTimedOut {
                    call_id: id,
                    deadline_ms: NOW + 30_000,
                },
                at(NOW + 30_000),
            )
            .unwrap();
        assert!(
            !shape(&fx).iter().any(|e| e.starts_with("dispatch")),
            "{fx:?}"
        );
        assert_eq!(s.header.status, SessionStatus::Running);

        // Just before the deadline, the decision is the person's.
        let mut s = session();
        drive(&mut s, &tools, [vec![msg("hi")], calls(&["ask"])].concat()).unwrap();
        let fx = s.apply(approve(&s), at(NOW + 29_999)).unwrap();
        assert_eq!(shape(&fx), vec!["dispatch ask #1"]);
    }

    #[test]
    fn a_checkpoint_shares_its_events_and_hands_them_back_uncopied() {
        let tools = registry();
        let mut s = session();
        s.apply(msg("hi"), ctx(&tools, 1)).unwrap();
        let cp = s.checkpoint();
        assert!(!cp.events.is_empty());
        let (buffer, seqs): (*const Event, Vec<u64>) = (
            cp.events.as_ptr(),
            cp.events.iter().map(|e| e.seq).collect(),
        );
        drop(cp); // as the store does once the checkpoint is written
        let events = s.mark_persisted();
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), seqs);
        assert_eq!(events.as_ptr(), buffer, "the events were copied");
        assert!(s.checkpoint().events.is_empty(), "handed back once");
    }

    #[test]
    fn requests_share_the_registrys_tool_definitions_and_count_them_once() {
        let tools = registry();
        let s = session();
        let (a, b) = (s.provider_request(&tools), s.provider_request(&tools));
        let names: Vec<&str> = a.tools.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["ask", "free"], "the agent's tools, in its order");
        for (x, y) in a.tools.iter().zip(&b.tools) {
            assert!(Arc::ptr_eq(x, y), "{} was copied per request", x.name());
        }
        // The estimate counts each tool's name, description and schema as
        // sent, the same as counting them per request did.
        let declared: usize = a
            .tools
            .iter()
            .map(|t| t.name().len() + t.description().len() + t.parameters().to_string().len())
            .sum();
        let entries: usize = a
            .transcript
            .iter()
            .map(|e| crate::provider::entry_chars(e))
            .sum();
        assert!(declared > 0);
        assert_eq!(
            a.approx_chars(),
            (a.instructions.len() + declared + entries) as u64
        );
    }

    #[test]
    fn a_parked_session_resumes_to_its_timers_alone() {
        type Then = Option<fn(&Session) -> Input>;
        // Name, inputs, one more input built from the state they left, and
        // the timers a parked session resumes to (`None`: not parked).
        type Row = (&'static str, Vec<Input>, Then, Option<Vec<&'static str>>);
        let hi = || vec![msg("hi")];
        let rows: Vec<Row> = vec![
            (
                "one call awaits a decision",
                [hi(), calls(&["ask"])].concat(),
                None,
                Some(vec!["timer +30000ms @30000"]),
            ),
            (
                "two calls await decisions",
                [hi(), calls(&["ask", "ask"])].concat(),
                None,
                Some(vec!["timer +30000ms @30000", "timer +30000ms @30000"]),
            ),
            (
                "one of two is approved, the other awaits",
                [hi(), calls(&["ask", "ask"])].concat(),
                Some(approve),
                Some(vec!["timer +30000ms @30000"]),
            ),
            ("a tool runs", [hi(), calls(&["free"])].concat(), None, None),
            ("the provider call is in flight", hi(), None, None),
            (
                "the turn ended",
                [hi(), vec![Input::StreamEnded(Ok(()))]].concat(),
                None,
                None,
            ),
            ("never started", vec![], None, None),
        ];
        let tools = registry();
        for (name, inputs, then, want) in rows {
            let mut s = session();
            drive(&mut s, &tools, inputs).unwrap();
            if let Some(then) = then {
                let input = then(&s);
                drive(&mut s, &tools, vec![input]).unwrap();
            }
            let parked = resume_of_parked(&Resumable::from(&s.header), NOW);
            let want = want.map(|w| w.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>());
            assert_eq!(parked.as_deref().map(shape), want, "{name}");
            if let Some(parked) = parked {
                // Resuming in an actor would do exactly that and write
                // nothing: leaving the session on disk loses nothing.
                let resumed = s
                    .apply(Input::Resume { journal: vec![] }, ctx(&tools, 42))
                    .unwrap();
                assert_eq!(shape(&resumed), shape(&parked), "{name}");
                assert!(!s.is_dirty(), "{name}: resuming changed the session");
            }
        }
    }

    /// A call awaiting approval with no deadline stored (a snapshot from
    /// before deadlines were) gets a full timeout from now, which needs the
    /// configuration's timeout; a store that did not read it leaves the
    /// session to its actor rather than guess.
    #[test]
    fn a_parked_call_without_a_stored_deadline_needs_the_configured_timeout() {
        let tools = registry();
        let mut s = session();
        drive(&mut s, &tools, [vec![msg("hi")], calls(&["ask"])].concat()).unwrap();
        let mut parked = Resumable::from(&s.header);
        parked.open_calls[0].approval_deadline_ms = Some(NOW + 5_000);
        parked.approval_timeout_secs = None;
        let timers = resume_of_parked(&parked, NOW).unwrap();
        assert_eq!(shape(&timers), vec!["timer +5000ms @5000"]);
        parked.open_calls[0].approval_deadline_ms = None;
        assert!(resume_of_parked(&parked, NOW).is_none());
        parked.approval_timeout_secs = Some(TIMEOUT_SECS);
        let timers = resume_of_parked(&parked, NOW).unwrap();
        assert_eq!(shape(&timers), vec!["timer +30000ms @30000"]);
    }

    #[test]
    fn inputs_give_the_effects_of_the_turn_loop() {
        type Setup = fn(&Session) -> Vec<Input>;
        type Last = fn(&Session) -> Input;
        let rows: Vec<(&str, Setup, Last, Vec<&str>, SessionStatus)> = vec![
            (
                "a first message starts a turn and a stream",
                |_| vec![],
                |_| msg("hi"),
                vec!["stream"],
                SessionStatus::Running,
            ),
            (
                "text deltas are forwarded, not stored",
                |_| vec![msg("hi")],
                |_| Input::Provider(ProviderEvent::TextDelta("he".into())),
                vec!["delta he"],
                SessionStatus::Running,
            ),
            (
                "an answer without calls ends the turn",
                |_| vec![msg("hi")],
                |_| Input::StreamEnded(Ok(())),
                vec![],
                SessionStatus::AwaitingInput,
            ),
            (
                "a call that needs approval arms its timer at the deadline",
                |_| {
                    let mut v = vec![msg("hi")];
                    v.extend(calls(&["ask"]).into_iter().take(1));
                    v
                },
                |_| Input::StreamEnded(Ok(())),
                vec!["timer +30000ms @30000"],
                SessionStatus::AwaitingApproval,
            ),
            (
                "a call that needs none is dispatched at once",
                |_| {
                    let mut v = vec![msg("hi")];
                    v.extend(calls(&["free"]).into_iter().take(1));
                    v
                },
                |_| Input::StreamEnded(Ok(())),
                vec!["dispatch free #1"],
                SessionStatus::Running,
            ),
            (
                "an approval dispatches the call",
                |_| [vec![msg("hi")], calls(&["ask"])].concat(),
                approve,
                vec!["dispatch ask #1"],
                SessionStatus::Running,
            ),
            (
                "a stale timeout (another deadline) changes nothing",
                |_| [vec![msg("hi")], calls(&["ask"])].concat(),
                |s| Input::ApprovalTimedOut {
                    call_id: pending_id(s),
                    deadline_ms: NOW + 1,
                },
                vec![],
                SessionStatus::AwaitingApproval,
            ),
            (
                "the timeout at the call's deadline denies it and goes on",
                |_| [vec![msg("hi")], calls(&["ask"])].concat(),
                |s| Input::ApprovalTimedOut {
                    call_id: pending_id(s),
                    deadline_ms: NOW + 30_000,
                },
                vec!["stream"],
                SessionStatus::Running,
            ),
            (
                "a cancel while waiting leaves nothing to run",
                |_| [vec![msg("hi")], calls(&["ask"])].concat(),
                |_| Input::Cancel,
                vec![],
                SessionStatus::Cancelled,
            ),
            (
                "a cancel while a tool runs kills it",
                |_| [vec![msg("hi")], calls(&["free"])].concat(),
                |_| Input::Cancel,
                vec!["kill_tools"],
                SessionStatus::Cancelled,
            ),
        ];
        let tools = registry();
        for (name, setup, last, effects, status) in rows {
            let mut s = session();
            let steps = setup(&s);
            drive(&mut s, &tools, steps).unwrap();
            let input = last(&s);
            let fx = drive(&mut s, &tools, vec![input]).unwrap();
            assert_eq!(shape(&fx), effects, "{name}");
            assert_eq!(s.header.status, status, "{name}");
        }
    }

    #[test]
    fn the_same_state_input_and_seed_give_the_same_ids() {
        let tools = registry();
        let mut a = session();
        drive(
            &mut a,
            &tools,
            [vec![msg("hi")], calls(&["ask", "ask"])].concat(),
        )
        .unwrap();
        let mut b = session();
        drive(
            &mut b,
            &tools,
            [vec![msg("hi")], calls(&["ask", "ask"])].concat(),
        )
        .unwrap();
        let ids = |s: &Session| {
            s.header
                .open_calls
                .iter()
                .map(|c| c.id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&a), ids(&b));
        assert_ne!(ids(&a)[0], ids(&a)[1], "distinct within one transition");
        // Another seed, other ids.
        let mut c = session();
        drive(&mut c, &tools, vec![msg("hi")]).unwrap();
        for input in calls(&["ask", "ask"]) {
            c.apply(input, ctx(&tools, 43)).unwrap();
        }
        assert_ne!(ids(&a), ids(&c));
    }

    /// A standing rule answers for the human: allow approves and runs the
    /// next call of its tool without asking, reject denies it (the model
    /// sees the denial), both audited as the rule's; a rule for a tool the
    /// session does not have, or on an ended session, is refused; the rule
    /// is in the transcript, the events and the checkpointed header.
    #[test]
    fn a_tool_rule_decides_in_place_of_the_human() {
        let tools = registry();
        let rule = |tool: &str, rule| Input::SetToolRule {
            tool: tool.into(),
            rule,
            by: Some("acp".into()),
        };
        let mut s = session();
        let before = s.header.clone();
        assert!(s
            .apply(rule("nope", ToolRule::Allow), ctx(&tools, 1))
            .is_err());
        assert_eq!(s.header, before, "a refused rule changes nothing");

        drive(
            &mut s,
            &tools,
            vec![rule("ask", ToolRule::Allow), msg("hi")],
        )
        .unwrap();
        assert_eq!(s.header.tool_rules.get("ask"), Some(&ToolRule::Allow));
        let round: SessionHeader =
            serde_json::from_value(serde_json::to_value(&s.header).unwrap()).unwrap();
        assert_eq!(
            round.tool_rules, s.header.tool_rules,
            "kept in the checkpoint"
        );
        let fx = drive(&mut s, &tools, calls(&["ask"])).unwrap();
        assert_eq!(shape(&fx), vec!["dispatch ask #1"], "run without asking");
        assert_eq!(s.header.status, SessionStatus::Running);
        let call = &s.header.open_calls[0];
        assert_eq!(
            call.decision.as_ref().unwrap().by.as_deref(),
            Some("rule:allow")
        );

        let mut s = session();
        drive(&mut s, &tools, vec![msg("hi")]).unwrap();
        s.apply(rule("ask", ToolRule::Reject), ctx(&tools, 1))
            .unwrap();
        let events = s.mark_persisted();
        assert!(events.iter().any(|e| matches!(&e.kind,
            EventKind::ToolRuleSet { tool, rule: ToolRule::Reject, by } if tool == "ask" && by.as_deref() == Some("acp"))));
        let fx = drive(&mut s, &tools, calls(&["ask"])).unwrap();
        assert_eq!(
            shape(&fx),
            vec!["stream"],
            "denied at once; the model is asked again"
        );
        let entries = &s.transcript;
        assert!(entries.iter().any(|e| matches!(&**e,
            TranscriptEntry::ToolResult { call } if call.state == CallState::Denied
                && call.result.as_ref().is_some_and(|r| r.to_string().contains("standing rule")))));
        assert!(entries
            .iter()
            .any(|e| matches!(&**e, TranscriptEntry::ToolRuleSet { .. })));

        s.header.status = SessionStatus::Completed;
        assert!(s
            .apply(rule("ask", ToolRule::Allow), ctx(&tools, 1))
            .is_err());
    }

    /// A refused input changes nothing, the window of remembered message
    /// ids included (even when it is full).
    #[test]
    fn a_refused_message_changes_nothing() {
        let tools = registry();
        let mut s = session();
        s.header.recent_messages = (0..RECENT_MESSAGE_IDS)
            .map(|i| RecentMessage {
                id_hash: fnv1a(&format!("m{i}")),
                id: None,
                text_hash: fnv1a("x"),
            })
            .collect();
        let before = s.header.clone();
        let refusals = [
            ("an empty text", "  ", SessionStatus::Pending),
            ("a terminal session", "hello", SessionStatus::Completed),
        ];
        for (name, text, status) in refusals {
            s.header.status = status;
            let mut expected = before.clone();
            expected.status = status;
            let r = s.apply(
                Input::Message {
                    text: text.into(),
                    message_id: Some("new-id".into()),
                },
                ctx(&tools, 1),
            );
            assert!(r.is_err(), "{name}");
            assert_eq!(s.header, expected, "{name}: nothing changed");
            assert!(!s.is_dirty(), "{name}");
            assert!(s.pending_events().is_empty(), "{name}");
        }
    }

    /// Queued messages are rows of their own: a checkpoint carries the ones
    /// queued (or taken) since the previous one, never the whole queue.
    #[test]
    fn the_queue_is_checkpointed_as_what_changed_and_bounded() {
        let tools = registry();
        let mut s = session();
        drive(&mut s, &tools, [vec![msg("hi")], calls(&["ask"])].concat()).unwrap();
        assert_eq!(s.header.status, SessionStatus::AwaitingApproval);
        s.apply(msg("first"), ctx(&tools, 1)).unwrap();
        let cp = s.checkpoint();
        assert_eq!(cp.queued.len(), 1);
        assert_eq!(cp.queued[0].0, 0);
        assert_eq!(cp.dequeued, 0..0);
        assert_eq!(s.header.queue.len(), 1);
        assert_eq!(s.header.queue.bytes, 5);
        s.mark_persisted();
        s.apply(msg("second"), ctx(&tools, 1)).unwrap();
        let cp = s.checkpoint();
        assert_eq!(
            cp.queued
                .iter()
                .map(|(seq, m)| (*seq, m.text.as_str()))
                .collect::<Vec<_>>(),
            vec![(1, "second")],
            "only the new row"
        );
        s.mark_persisted();
        // Bounds: a message over the byte limit, then a full queue.
        let limits = Limits {
            max_queued_messages: 2,
            max_queued_bytes: 16,
            ..Limits::default()
        };
        let tight = |seed| Ctx {
            limits,
            ..ctx(&tools, seed)
        };
        let before = s.header.clone();
        let err = s.apply(msg(&"x".repeat(17)), tight(2)).unwrap_err();
        assert!(
            matches!(err, SessionError::TooLarge { limit: 16, .. }),
            "{err:?}"
        );
        let err = s.apply(msg("third"), tight(2)).unwrap_err();
        assert!(matches!(err, SessionError::QueueFull { .. }), "{err:?}");
        assert_eq!(s.header, before, "refusals change nothing");
        // The turn ends: the oldest message starts the next turn and its row
        // is deleted.
        let approve = approve(&s);
        drive(&mut s, &tools, vec![approve]).unwrap();
        s.apply(
            Input::ToolFinished {
                call_id: s.header.open_calls[0].id.clone(),
                attempt: 1,
                result: Ok(json!(1)),
            },
            ctx(&tools, 3),
        )
        .unwrap();
        s.mark_persisted();
        s.apply(Input::StreamEnded(Ok(())), ctx(&tools, 4)).unwrap();
        let cp = s.checkpoint();
        assert_eq!(cp.dequeued, 0..1);
        assert!(cp.queued.is_empty());
        assert_eq!(s.inbox.len(), 1);
        assert_eq!(s.header.queue.head, 1);
        // A cancel empties the queue.
        s.mark_persisted();
        s.apply(Input::Cancel, ctx(&tools, 5)).unwrap();
        assert!(s.header.queue.is_empty());
        assert_eq!(s.checkpoint().dequeued, 1..2);
    }

    #[test]
    fn a_reused_message_id_is_a_no_op_or_a_conflict() {
        let tools = registry();
        let mut s = session();
        let with_id = |text: &str| Input::Message {
            text: text.into(),
            message_id: Some("m-1".into()),
        };
        drive(&mut s, &tools, vec![with_id("hello")]).unwrap();
        let fx = drive(&mut s, &tools, vec![with_id("hello")]).unwrap();
        assert!(fx.is_empty());
        assert!(!s.is_dirty());
        let err = s.apply(with_id("other"), ctx(&tools, 1)).unwrap_err();
        assert!(matches!(err, SessionError::Conflict(_)), "{err:?}");
    }

    // ---- provider failures, usage, overflow (issue 32) ----------------------------

    fn text(t: &str) -> Input {
        Input::Provider(ProviderEvent::TextDelta(t.into()))
    }

    fn failed(e: ProviderError) -> Input {
        Input::StreamEnded(Err(e))
    }

    #[test]
    fn a_provider_failure_is_an_error_entry_never_the_assistants_text_nor_sent_again() {
        let tools = registry();
        let mut s = session();
        let broke = ProviderError::Transport("the stream broke".into());
        drive(&mut s, &tools, vec![msg("hi"), text("Part"), failed(broke)]).unwrap();
        assert_eq!(s.header.last_stop_reason, Some(StopReason::Error));
        let entries: Vec<&TranscriptEntry> = s.transcript.iter().map(|e| e.as_ref()).collect();
        match entries.as_slice() {
            [TranscriptEntry::User { .. }, TranscriptEntry::Assistant { text, .. }, TranscriptEntry::Error { message, kind, .. }] =>
            {
                assert_eq!(text, "Part", "the partial text is the assistant's, alone");
                assert_eq!(message, "provider error: transport error: the stream broke");
                assert_eq!(kind.as_deref(), Some("transport"));
            }
            other => panic!("{other:#?}"),
        }
        // Nothing shown at all: no assistant entry, the error alone.
        let mut t = session();
        let refused = ProviderError::Auth("HTTP 401: no".into());
        drive(&mut t, &tools, vec![msg("hi"), failed(refused)]).unwrap();
        assert!(matches!(
            t.transcript
                .iter()
                .map(|e| e.as_ref())
                .collect::<Vec<_>>()
                .as_slice(),
            [TranscriptEntry::User { .. }, TranscriptEntry::Error { .. }]
        ));
        // The next request carries the partial text, never the failure.
        let fx = drive(&mut s, &tools, vec![msg("again")]).unwrap();
        let Some(Effect::StartStream(request)) = fx.first() else {
            panic!("{:?}", shape(&fx))
        };
        assert!(request
            .transcript
            .iter()
            .all(|e| !matches!(e.as_ref(), TranscriptEntry::Error { .. })));
        assert_eq!(request.transcript.len(), 3, "user, partial answer, user");
    }

    #[test]
    fn every_request_is_counted_with_what_it_reported_or_streamed() {
        let tools = registry();
        // Interrupted after 400 characters, nothing reported: one request,
        // its output estimated from what streamed (250 tokens per 1,000
        // characters before calibration), its input from the request.
        let mut s = session();
        drive(
            &mut s,
            &tools,
            vec![msg("hi"), text(&"x".repeat(400)), Input::Interrupt],
        )
        .unwrap();
        let u = s.header.usage;
        assert_eq!(u.provider_requests, 1);
        assert_eq!(u.output_tokens, 100);
        assert!(u.input_tokens > 0, "{u:?}");
        // Two failed attempts before this one (reported by a retrying
        // provider), this one's prompt reported, then a broken stream.
        let mut s = session();
        let others = Usage {
            provider_requests: 2,
            input_tokens: 10,
            ..Usage::default()
        };
        let own = Usage {
            input_tokens: 50,
            ..Usage::default()
        };
        let broke = ProviderError::Transport("the stream broke".into());
        let inputs = vec![
            msg("hi"),
            Input::Provider(ProviderEvent::Usage(others)),
            Input::Provider(ProviderEvent::Usage(own)),
            text(&"y".repeat(40)),
            failed(broke),
        ];
        drive(&mut s, &tools, inputs).unwrap();
        let u = s.header.usage;
        assert_eq!(u.provider_requests, 3);
        assert_eq!(u.input_tokens, 60, "reported, so not estimated");
        assert_eq!(u.output_tokens, 10, "streamed, not reported: estimated");
        // A request that failed before any output adds itself alone.
        let mut s = session();
        let refused = ProviderError::Auth("no".into());
        drive(&mut s, &tools, vec![msg("hi"), failed(refused)]).unwrap();
        assert_eq!(
            s.header.usage,
            Usage {
                provider_requests: 1,
                ..Usage::default()
            }
        );
    }

    #[test]
    fn a_first_request_that_overflows_ends_with_context_overflow_and_the_sizes() {
        let tools = registry();
        // The provider said how large the request is and what it allows.
        let mut s = session();
        let said = ProviderError::ContextOverflow {
            message: "request (9000 tokens) exceeds the available context size (8192 tokens)"
                .into(),
            tokens: Some(9000),
            limit: Some(8192),
        };
        drive(&mut s, &tools, vec![msg("hi"), failed(said)]).unwrap();
        assert_eq!(s.header.last_stop_reason, Some(StopReason::ContextOverflow));
        assert_eq!(s.header.status, SessionStatus::AwaitingInput);
        match s.transcript.last().map(|e| e.as_ref()) {
            Some(TranscriptEntry::Error {
                message,
                kind,
                estimated_tokens,
                context_window,
                ..
            }) => {
                assert_eq!(kind.as_deref(), Some("context_overflow"));
                assert_eq!(
                    (*estimated_tokens, *context_window),
                    (Some(9000), Some(8192))
                );
                assert!(
                    message.contains("about 9000 tokens (counted by the provider)")
                        && message.contains("allows 8192"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // It did not: the estimate, and the route's window.
        let mut s = session();
        let bare = ProviderError::overflow("Context size has been exceeded.");
        for input in [msg("hi"), failed(bare)] {
            let mut c = ctx(&tools, 42);
            c.context_window = Some(4096);
            s.apply(input, c).unwrap();
        }
        assert_eq!(s.header.last_stop_reason, Some(StopReason::ContextOverflow));
        let Some(TranscriptEntry::Error {
            estimated_tokens: Some(estimate),
            context_window: Some(4096),
            message,
            ..
        }) = s.transcript.last().map(|e| e.as_ref())
        else {
            panic!("{:?}", s.transcript.last())
        };
        assert!(
            message.contains(&format!("about {estimate} tokens (estimated)")),
            "{message}"
        );
    }

    #[test]
    fn a_session_stored_by_an_older_version_is_written_as_this_one() {
        let mut header = session().header;
        header.schema_version = 2;
        let stored = StoredSession {
            header,
            transcript: Vec::new(),
            metadata: Value::Null,
            inbox: Vec::new(),
            needs_rewrite: false,
        };
        let s = Session::from_stored(stored);
        assert_eq!(s.checkpoint().header.schema_version, SCHEMA_VERSION);
    }
}
