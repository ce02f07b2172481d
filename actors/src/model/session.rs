//! The session header: the small, bounded part of a session's snapshot that
//! every checkpoint rewrites. The transcript and the event log are stored
//! beside it, entry by entry, so the header's size does not grow with history.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{SharedConfig, ToolCallRecord, Usage};

/// The checkpoint format version this binary writes and the newest it reads.
///
/// 2: the queue of messages and the caller's metadata moved out of the
/// header into rows of their own (written once, not at every checkpoint);
/// remembered message ids are hashes. Version 1 snapshots are read and
/// rewritten in the new layout by their next checkpoint.
///
/// 3: a transcript entry kind `error` (a failure of the turn, kept out of
/// the assistant's text and out of requests), the stop reason
/// `context_overflow`, and the configuration's `route` (what serves the
/// session's model route). Purely additive: version 2 snapshots read as
/// they are, and a session read from one is written as version 3 by its
/// next checkpoint (`Session::from_stored`), since from then on it may hold
/// what version 2 cannot read.
///
/// 4: stored tasks, Agent Skills and forks (issue 27): a transcript entry
/// kind `skill_activated` (a skill's body, loaded into the session), the
/// configuration's `skills` and `tasks`, and the header's `task` and
/// `forked_from`. Additive like 3: older snapshots read as they are and are
/// written as 4 by their next checkpoint.
pub const SCHEMA_VERSION: u32 = 4;

/// Default of `max_delegation_depth`: the deepest child is at this depth.
pub const DEFAULT_MAX_DELEGATION_DEPTH: u32 = 3;

/// Default of `max_children`: live children per session.
pub const DEFAULT_MAX_CHILDREN: u32 = 8;

/// Identifier of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct SessionId(pub uuid::Uuid);

/// How maps keyed by [`SessionId`] hash: foldhash, seeded per map. The
/// server generates every session id, so SipHash's defence against keys
/// chosen to collide buys nothing there, and a session's few dozen lookups
/// in the runtime's maps and the store writer's spent about 27 k of its
/// 569 k instructions in SipHash (`benches/PROFILE.md`, fifth pass).
pub type SessionIdHasher = foldhash::fast::RandomState;

impl SessionId {
    /// A fresh, time-ordered id (uuid v7), so keys of new sessions append.
    pub fn generate() -> Self {
        Self(uuid::Uuid::now_v7())
    }

    /// The 16 bytes used in storage keys.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for SessionId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s).map(Self)
    }
}

/// Session statuses (documented in `docs/src/reference/events.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Created, no message yet.
    Pending,
    /// A turn is in progress.
    Running,
    /// At least one call waits for a decision.
    AwaitingApproval,
    /// The turn ended; waiting for a follow-up or `done`.
    AwaitingInput,
    /// Terminal: finished normally.
    Completed,
    /// Terminal: could not go on.
    Failed,
    /// Terminal: cancelled.
    Cancelled,
}

impl SessionStatus {
    /// Whether the session accepts no more work.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The wire name (`awaiting_approval`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::AwaitingApproval => "awaiting_approval",
            Self::AwaitingInput => "awaiting_input",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a turn stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model answered without calling tools.
    EndTurn,
    /// The turn used more than `max_steps` steps.
    MaxSteps,
    /// The session was cancelled.
    Cancelled,
    /// A budget ran out.
    BudgetExceeded,
    /// The provider (or the runtime) failed.
    Error,
    /// The model's answer hit the provider's output length limit.
    MaxTokens,
    /// Someone stopped the turn (`interrupt`); the session goes on.
    Interrupted,
    /// The model refused to answer; the session goes on.
    Refusal,
    /// The request did not fit the model's context window, and compacting
    /// the transcript could not make it fit; the session goes on.
    ContextOverflow,
}

impl StopReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EndTurn => "end_turn",
            Self::MaxSteps => "max_steps",
            Self::Cancelled => "cancelled",
            Self::BudgetExceeded => "budget_exceeded",
            Self::Error => "error",
            Self::MaxTokens => "max_tokens",
            Self::Interrupted => "interrupted",
            Self::Refusal => "refusal",
            Self::ContextOverflow => "context_overflow",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Approval policy of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Never ask.
    Auto,
    /// Ask for tools that declare `requires_approval`.
    #[default]
    PerTool,
    /// Ask for every call.
    Always,
}

/// A session's standing rule for one tool, set by a user who chose "always"
/// when asked (e.g. an editor's allow-always / reject-always): later calls
/// of that tool in the session are approved or denied without asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ToolRule {
    /// Run without asking.
    Allow,
    /// Deny without asking.
    Reject,
}

impl ToolRule {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Reject => "reject",
        }
    }
}

/// Whether a child's approvals go up to a human at the root, or are granted
/// automatically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ChildApproval {
    /// Pending approvals of children appear at the root and are decided there.
    #[default]
    Propagate,
    /// Children never ask.
    AutoApprove,
}

/// Spending limits of a session. `None` is unlimited. A child is granted
/// at most what its parent has left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Dispatched tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
    /// Provider steps (across turns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// Seconds since the session was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall_clock_secs: Option<u64>,
}

impl Budget {
    /// The tighter of two budgets, dimension by dimension.
    pub fn min(self, other: Budget) -> Budget {
        fn m(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, None) => x,
                (None, y) => y,
            }
        }
        Budget {
            max_tokens: m(self.max_tokens, other.max_tokens),
            max_tool_calls: m(self.max_tool_calls, other.max_tool_calls),
            max_steps: m(self.max_steps, other.max_steps),
            max_wall_clock_secs: m(self.max_wall_clock_secs, other.max_wall_clock_secs),
        }
    }

    /// What is left after spending `used` over `elapsed_secs`.
    pub fn remaining(&self, used: &Usage, elapsed_secs: u64) -> Budget {
        Budget {
            max_tokens: self
                .max_tokens
                .map(|b| b.saturating_sub(used.total_tokens())),
            max_tool_calls: self
                .max_tool_calls
                .map(|b| b.saturating_sub(used.tool_calls)),
            max_steps: self
                .max_steps
                .map(|b| b.saturating_sub(used.provider_requests)),
            max_wall_clock_secs: self
                .max_wall_clock_secs
                .map(|b| b.saturating_sub(elapsed_secs)),
        }
    }

    /// The first dimension `used` has reached, if any (a limit is reached when
    /// nothing of it is left).
    pub fn exhausted(&self, used: &Usage, elapsed_secs: u64) -> Option<&'static str> {
        if self.max_tokens.is_some_and(|b| used.total_tokens() >= b) {
            return Some("tokens");
        }
        if self.max_steps.is_some_and(|b| used.provider_requests >= b) {
            return Some("steps");
        }
        if self.max_wall_clock_secs.is_some_and(|b| elapsed_secs >= b) {
            return Some("wall_clock_secs");
        }
        None
    }
}

/// A named agent configuration, as the runtime needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentConfig {
    /// Agent name.
    pub name: String,
    /// Model route name (or model id for the scripted provider).
    pub model: String,
    /// System instructions.
    pub instructions: String,
    /// Tools the agent may use.
    pub tools: Vec<String>,
    /// Approval policy.
    pub approval: ApprovalPolicy,
    /// Most steps in one turn.
    pub max_steps: u32,
    /// Run a step's approved calls concurrently.
    pub parallel_tool_calls: bool,
    /// Seconds a call may wait for a decision before it is denied.
    pub approval_timeout_secs: u64,
    /// Agents this one may delegate to with `delegate_task`.
    pub subagents: Vec<String>,
    /// How children's approvals are handled.
    pub child_approval: ChildApproval,
    /// Deepest allowed delegation (a root is depth 0).
    pub max_delegation_depth: u32,
    /// Most live children per session.
    pub max_children: u32,
    /// Spending limits.
    pub budget: Budget,
    /// JSON Schema the final answer of a turn must match (structured output).
    pub output_schema: Option<Value>,
    /// A session idle in `awaiting_input` this long is completed.
    pub input_timeout_secs: Option<u64>,
    /// Per-tool overrides of `requires_approval` (tool name → ask?).
    pub tool_approvals: BTreeMap<String, bool>,
    /// Skills (Agent Skills format) this agent's sessions may activate,
    /// exact names (the edge resolves patterns at start).
    pub skills: Vec<String>,
    /// Stored tasks this agent may run with `run_task`, exact ids.
    pub tasks: Vec<String>,
}

impl AgentConfig {
    /// An agent with the design's defaults (per_tool approval, 10 steps,
    /// sequential tools, 24 h approval timeout).
    pub fn new(name: impl Into<String>, tools: &[&str]) -> Self {
        Self {
            name: name.into(),
            model: "scripted".into(),
            instructions: String::new(),
            tools: tools.iter().map(|t| (*t).to_owned()).collect(),
            approval: ApprovalPolicy::PerTool,
            max_steps: 10,
            parallel_tool_calls: false,
            approval_timeout_secs: 86_400,
            subagents: Vec::new(),
            child_approval: ChildApproval::Propagate,
            max_delegation_depth: DEFAULT_MAX_DELEGATION_DEPTH,
            max_children: DEFAULT_MAX_CHILDREN,
            budget: Budget::default(),
            output_schema: None,
            input_timeout_secs: None,
            tool_approvals: BTreeMap::new(),
            skills: Vec::new(),
            tasks: Vec::new(),
        }
    }

    /// The configuration a new session of this agent runs under.
    pub fn effective(&self) -> EffectiveConfig {
        let mut tools = self.tools.clone();
        // `delegate_task` exists exactly for agents that list subagents
        //, `run_task` for those that list tasks, and the skill tools
        // for those that list skills.
        let builtins = [
            super::DELEGATE_TASK,
            super::RUN_TASK,
            super::ACTIVATE_SKILL,
            super::READ_SKILL_RESOURCE,
        ];
        tools.retain(|t| !builtins.contains(&t.as_str()));
        if !self.subagents.is_empty() {
            tools.push(super::DELEGATE_TASK.to_owned());
        }
        if !self.tasks.is_empty() {
            tools.push(super::RUN_TASK.to_owned());
        }
        if !self.skills.is_empty() {
            tools.push(super::ACTIVATE_SKILL.to_owned());
            tools.push(super::READ_SKILL_RESOURCE.to_owned());
        }
        EffectiveConfig {
            instructions: self.instructions.clone(),
            tools,
            model: self.model.clone(),
            route: None,
            approval: self.approval,
            max_steps: self.max_steps,
            parallel_tool_calls: self.parallel_tool_calls,
            approval_timeout_secs: self.approval_timeout_secs,
            subagents: self.subagents.clone(),
            child_approval: self.child_approval,
            max_delegation_depth: self.max_delegation_depth,
            max_children: self.max_children,
            budget: self.budget,
            output_schema: self.output_schema.clone(),
            input_timeout_secs: self.input_timeout_secs,
            tool_approvals: self.tool_approvals.clone(),
            skills: self.skills.clone(),
            tasks: self.tasks.clone(),
        }
    }
}

/// The configuration one session actually runs under, recorded in its header
/// so that a later change to the agent's preset does not change a running
/// session behind its users' backs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EffectiveConfig {
    /// System instructions.
    pub instructions: String,
    /// Tools in scope.
    pub tools: Vec<String>,
    /// Model route.
    pub model: String,
    /// What serves the model route, as the provider edge described it when
    /// the route was chosen (provider, endpoint, model id; never a secret):
    /// it names the real route in the API, and lets a session whose route
    /// only it remembers (one made from `overseer run`'s flags) be
    /// continued on it. Opaque here: the actors crate knows no wire format.
    /// Absent in snapshots from before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Value>,
    /// Approval policy.
    pub approval: ApprovalPolicy,
    /// Most steps in one turn.
    pub max_steps: u32,
    /// Run a step's approved calls concurrently.
    pub parallel_tool_calls: bool,
    /// Seconds a call may wait for a decision.
    pub approval_timeout_secs: u64,
    /// Agents this session may delegate to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subagents: Vec<String>,
    /// How children's approvals are handled.
    #[serde(default)]
    pub child_approval: ChildApproval,
    /// Deepest allowed delegation.
    #[serde(default = "default_depth")]
    pub max_delegation_depth: u32,
    /// Most live children.
    #[serde(default = "default_children")]
    pub max_children: u32,
    /// Spending limits (for a child: what it was granted).
    #[serde(default)]
    pub budget: Budget,
    /// JSON Schema of the final answer of each turn, if structured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Complete the session after this long idle in `awaiting_input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_timeout_secs: Option<u64>,
    /// Per-tool overrides of `requires_approval`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_approvals: BTreeMap<String, bool>,
    /// Skills this session may activate (a child's: its agent's, within
    /// its parent's). Their names and descriptions are in `instructions`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
    /// Stored tasks this session may run with `run_task`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<String>,
}

fn default_depth() -> u32 {
    DEFAULT_MAX_DELEGATION_DEPTH
}

fn default_children() -> u32 {
    DEFAULT_MAX_CHILDREN
}

/// Link from a child session to the call that started it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ParentLink {
    /// Parent session.
    pub session_id: SessionId,
    /// The parent's `delegate_task` call.
    pub call_id: super::ToolCallId,
    /// Dispatch attempt of that call (the child reports with it).
    #[serde(default)]
    pub attempt: u32,
    /// Whether this child's approvals surface at the root.
    #[serde(default)]
    pub propagate: bool,
    /// Depth of the child (root = 0).
    pub depth: u32,
}

/// A message id a session accepted, for idempotent retries. Only hashes are
/// kept, so a long id costs the header nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RecentMessage {
    /// Hash of the client-chosen id.
    #[serde(default)]
    pub id_hash: u64,
    /// The id itself, as version 1 snapshots stored it (never written now).
    #[serde(default, skip_serializing)]
    pub id: Option<String>,
    /// Hash of the text it came with (a reuse with other text is a conflict).
    pub text_hash: u64,
}

/// A user message waiting behind a running turn. Acknowledged, so it must
/// survive a crash: each is a row of its own beside the header, written once
/// when accepted and deleted when its turn starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueuedMessage {
    /// The text.
    pub text: String,
    /// Accepted at, ms since the epoch.
    pub at_ms: i64,
}

/// Where a session's queued messages are: rows `head..next` (by sequence
/// number), `bytes` of text in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueIndex {
    /// Sequence number of the oldest queued message.
    pub head: u64,
    /// Sequence number the next queued message gets.
    pub next: u64,
    /// Bytes of text queued.
    pub bytes: u64,
}

impl QueueIndex {
    /// Messages queued.
    pub fn len(&self) -> u64 {
        self.next.saturating_sub(self.head)
    }

    /// Whether nothing is queued (and nothing ever was, for serialisation).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// The header of a session snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionHeader {
    /// Format version (see [`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// Session id.
    pub id: SessionId,
    /// Owning tenant.
    pub tenant: String,
    /// Who started the session (or its root), e.g. a token's `sub`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// For a session created under a client's idempotency key: a digest of
    /// the create request (the edge's, e.g. SHA-256 hex), so that a retry is
    /// told from a different request under the same key exactly, however
    /// the session has changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_digest: Option<String>,
    /// Agent name.
    pub agent: String,
    /// Optional title (bounded, see [`crate::Limits`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Parent link for a child session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// Root of the tree (itself for a root session).
    pub root_id: SessionId,
    /// Current status.
    pub status: SessionStatus,
    /// Created at, ms since the epoch.
    pub created_at_ms: i64,
    /// Last transition at, ms since the epoch.
    pub updated_at_ms: i64,
    /// Complete (instead of awaiting input) when a turn ends with an empty inbox.
    #[serde(default)]
    pub auto_complete: bool,
    /// What the session runs under (shared with the other sessions that
    /// run under the same, see [`SharedConfig`]).
    #[cfg_attr(feature = "openapi", schema(value_type = EffectiveConfig))]
    pub config: SharedConfig,
    /// Cumulative usage of this session alone.
    pub usage: Usage,
    /// Usage reported by finished children (their whole subtrees).
    #[serde(default)]
    pub children_usage: Usage,
    /// Turns started so far.
    pub turn: u32,
    /// Steps started in the current turn.
    pub step: u32,
    /// Why the last turn stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stop_reason: Option<StopReason>,
    /// Ids of recently accepted messages (bounded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_messages: Vec<RecentMessage>,
    /// Where the messages accepted while a turn ran are stored.
    #[serde(default, skip_serializing_if = "QueueIndex::is_default")]
    pub queue: QueueIndex,
    /// Tool calls of the open step, in proposal order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open_calls: Vec<ToolCallRecord>,
    /// Number of transcript entries stored.
    pub transcript_len: u64,
    /// Sequence number of the last stored event.
    pub last_event_seq: u64,
    /// Why the session failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the session was completed, when the runtime did it (e.g. it was
    /// idle in `awaiting_input` past `input_timeout_secs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_reason: Option<String>,
    /// The structured output of the last turn (when the session has an
    /// `output_schema` and the answer matched it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Context management: see [`ContextState`].
    #[serde(default, skip_serializing_if = "ContextState::is_default")]
    pub context: ContextState,
    /// Standing approval rules per tool name (see [`ToolRule`]); they win
    /// over the approval policy for this session's own calls.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_rules: BTreeMap<String, ToolRule>,
    /// The stored task this session runs (a person's task run, or a
    /// `run_task` child), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The session this one was forked from, and where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkOrigin>,
    /// Where the current turn sits in a distributed trace (telemetry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<super::TraceLink>,
}

/// Where a fork came from: the source session and the point of its
/// history the fork's transcript ends at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkOrigin {
    /// The source session.
    pub session: SessionId,
    /// The source's event sequence number the fork point corresponds to.
    pub at: u64,
    /// How many of the source's transcript entries the fork starts from
    /// (the entries of a step left open at the fork point among them).
    pub index: u64,
}

/// What a session tracks to keep its requests inside the model's context
/// window: how its estimate of a request's tokens compares with what the
/// provider reported, and what the current step has already tried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextState {
    /// Tokens the provider counted per 1,000 characters of request, from the
    /// last step that reported usage (0: not calibrated yet; 250 is used).
    #[serde(default)]
    pub tokens_per_kchar: u32,
    /// A compaction is in flight: it summarises transcript entries before
    /// this index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compacting_through: Option<u64>,
    /// Index of the latest compaction entry (the summary requests carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_at: Option<u64>,
    /// The current step has already been retried after a context overflow.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overflow_retried: bool,
    /// The current turn has already had its structured-output repair step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_repaired: bool,
}

impl ContextState {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl SessionHeader {
    /// The header of a brand-new session (`pending`, nothing spent, nothing
    /// recorded): the one place a header is built from scratch, for roots
    /// and children alike.
    pub fn new(
        id: SessionId,
        tenant: String,
        agent: String,
        config: impl Into<SharedConfig>,
        now_ms: i64,
    ) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            id,
            tenant,
            created_by: None,
            create_digest: None,
            agent,
            title: None,
            parent: None,
            root_id: id,
            status: SessionStatus::Pending,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            auto_complete: false,
            config: config.into(),
            usage: Usage::default(),
            children_usage: Usage::default(),
            turn: 0,
            step: 0,
            last_stop_reason: None,
            recent_messages: Vec::new(),
            queue: QueueIndex::default(),
            open_calls: Vec::new(),
            transcript_len: 0,
            last_event_seq: 0,
            error: None,
            completion_reason: None,
            output: None,
            context: ContextState::default(),
            tool_rules: BTreeMap::new(),
            task: None,
            forked_from: None,
            trace: None,
        }
    }
}
