//! The runtime: shared services of the actor tree, and [`Overseer`], the
//! in-process API (create, message, decide, cancel, done, state, subscribe).
//!
//! The handle routes requests straight to live session actors through a
//! concurrent map, so the orchestrator's mailbox is not on the hot path; it
//! activates sessions that live only on disk (not yet loaded, hibernated,
//! restarting) through the orchestrator, which guarantees one actor per id.
//! It deliberately knows nothing of HTTP, auth or tenancy rules beyond
//! recording the tenant: those are the edge's (`overseer::http`).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use futures::StreamExt;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef, RpcReplyPort};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::error::SessionError;
use crate::hub::EventHub;
use crate::model::{
    now_ms, AgentConfig, Event, Notification, SessionHeader, SessionId, SessionStatus, Submission,
    ToolCallId, Usage, SCHEMA_VERSION,
};
use crate::orchestrator::{OrchestratorActor, OrchestratorArgs, OrchestratorMsg};
use crate::provider::Provider;
use crate::session::machine::{Ctx, Input, Session};
use crate::session::SessionMsg;
use crate::store::{CheckpointStore, StoredSession};
use crate::supervision::RestartPolicy;
use crate::tool::ToolRegistry;

/// Sessions loaded concurrently during boot recovery.
const RECOVERY_CONCURRENCY: usize = 64;

/// Tunables of the runtime.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Restart policy for failed session actors.
    pub restart: RestartPolicy,
    /// How long an API call waits for a session actor's answer.
    pub call_timeout: Duration,
    /// Stop the actor of a session idle this long (awaiting input or
    /// approval) and keep it only on disk; `None` never hibernates.
    pub idle_hibernate: Option<Duration>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            restart: RestartPolicy::default(),
            call_timeout: Duration::from_secs(30),
            idle_hibernate: Some(Duration::from_secs(300)),
        }
    }
}

/// Counters the edge exports as metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Session actor restarts.
    pub restarts: AtomicU64,
    /// Sessions hibernated (actor stopped, kept on disk).
    pub hibernations: AtomicU64,
    /// Sessions activated from disk (after hibernation or a restart of the process).
    pub activations: AtomicU64,
}

/// Services shared by every actor of the tree.
pub struct Runtime {
    /// Checkpoint store.
    pub store: Arc<dyn CheckpointStore>,
    /// LLM provider.
    pub provider: Arc<dyn Provider>,
    /// Tools.
    pub tools: ToolRegistry,
    /// Live event fan-out.
    pub hub: EventHub,
    /// Live session actors by id.
    pub live: DashMap<SessionId, ActorRef<SessionMsg>>,
    /// Tunables.
    pub config: RuntimeConfig,
    /// Counters.
    pub metrics: Metrics,
    /// Agents by name.
    pub agents: BTreeMap<String, AgentConfig>,
    /// The orchestrator, set once at start.
    pub(crate) orchestrator: std::sync::OnceLock<ActorRef<OrchestratorMsg>>,
    /// Approval timers armed in this process (session, call), so a session
    /// that is activated again does not arm a second timer for the same call.
    pub(crate) timers: dashmap::DashSet<(SessionId, crate::model::ToolCallId)>,
    /// Ids being created right now (see `create_session`).
    pub(crate) creating: dashmap::DashSet<SessionId>,
    /// The in-memory half of the effect journal: what this process knows of
    /// dispatched calls whose results their sessions have not yet recorded.
    /// It survives a session actor's crash (not the process's), so a restart
    /// in-process never re-runs a tool that did not start or already finished.
    pub(crate) journal:
        DashMap<(SessionId, crate::model::ToolCallId), (u32, crate::session::machine::Dispatched)>,
}

/// A request to create a session.
#[derive(Debug, Clone, Default)]
pub struct CreateSession {
    /// Agent name.
    pub agent: String,
    /// Owning tenant.
    pub tenant: String,
    /// Who starts it (a token's `sub`), recorded and passed to tools.
    pub created_by: Option<String>,
    /// First message; without it the session is `pending`.
    pub prompt: Option<String>,
    /// Optional title.
    pub title: Option<String>,
    /// Caller metadata.
    pub metadata: Value,
    /// Client-chosen id.
    pub id: Option<SessionId>,
    /// Complete instead of awaiting input when the turn ends.
    pub auto_complete: bool,
    /// Per-session changes to the agent's preset.
    pub overrides: SessionOverrides,
}

/// Per-session changes to an agent's preset. Each may only narrow what the
/// agent allows: tools a subset, limits lower.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOverrides {
    /// Appended to the agent's instructions, on a new line.
    #[serde(default)]
    pub instructions: Option<String>,
    /// Tools in scope: a subset of the agent's.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Model route (the edge checks it names a configured route).
    #[serde(default)]
    pub model: Option<String>,
    /// A lower step limit per turn.
    #[serde(default)]
    pub max_steps: Option<u32>,
    /// A shorter approval timeout.
    #[serde(default)]
    pub approval_timeout_secs: Option<u64>,
    /// Tighter spending limits.
    #[serde(default)]
    pub budget: Option<crate::model::Budget>,
}

impl SessionOverrides {
    /// The effective configuration of a session of `agent` with these
    /// overrides, or an error naming the field that asks for more than the
    /// agent allows.
    pub fn apply(
        &self,
        agent: &AgentConfig,
    ) -> Result<crate::model::EffectiveConfig, SessionError> {
        let mut cfg = agent.effective();
        if let Some(extra) = &self.instructions {
            if cfg.instructions.is_empty() {
                cfg.instructions.clone_from(extra);
            } else {
                cfg.instructions = format!("{}\n{extra}", cfg.instructions);
            }
        }
        if let Some(tools) = &self.tools {
            let wider: Vec<&str> = tools
                .iter()
                .filter(|t| !cfg.tools.contains(t))
                .map(String::as_str)
                .collect();
            if !wider.is_empty() {
                return Err(SessionError::Invalid(format!(
                    "tools: not available to agent '{}': {}",
                    agent.name,
                    wider.join(", ")
                )));
            }
            cfg.tools.clone_from(tools);
        }
        if let Some(model) = &self.model {
            cfg.model.clone_from(model);
        }
        if let Some(n) = self.max_steps {
            if n == 0 || n > cfg.max_steps {
                return Err(SessionError::Invalid(format!(
                    "max_steps: must be between 1 and the agent's {}",
                    cfg.max_steps
                )));
            }
            cfg.max_steps = n;
        }
        if let Some(n) = self.approval_timeout_secs {
            if n == 0 || n > cfg.approval_timeout_secs {
                return Err(SessionError::Invalid(format!(
                    "approval_timeout_secs: must be between 1 and the agent's {}",
                    cfg.approval_timeout_secs
                )));
            }
            cfg.approval_timeout_secs = n;
        }
        if let Some(b) = self.budget {
            let check = |field: &str, asked: Option<u64>, limit: Option<u64>| match (asked, limit) {
                (Some(a), Some(l)) if a > l => Err(SessionError::Invalid(format!(
                    "budget.{field}: {a} exceeds the agent's limit {l}"
                ))),
                _ => Ok(()),
            };
            let a = cfg.budget;
            check("max_tokens", b.max_tokens, a.max_tokens)?;
            check("max_tool_calls", b.max_tool_calls, a.max_tool_calls)?;
            check("max_steps", b.max_steps, a.max_steps)?;
            check(
                "max_wall_clock_secs",
                b.max_wall_clock_secs,
                a.max_wall_clock_secs,
            )?;
            cfg.budget = a.min(b);
        }
        Ok(cfg)
    }
}

/// The in-process API of overseer. Cheap to clone.
#[derive(Clone)]
pub struct Overseer {
    runtime: Arc<Runtime>,
    orchestrator: ActorRef<OrchestratorMsg>,
    join: Arc<tokio::sync::Mutex<Option<JoinHandle<()>>>>,
}

impl Overseer {
    /// Starts the actor tree. Does not recover stored sessions: call
    /// [`Overseer::recover`] before accepting work.
    pub async fn start(
        agents: Vec<AgentConfig>,
        store: Arc<dyn CheckpointStore>,
        provider: Arc<dyn Provider>,
        tools: ToolRegistry,
        config: RuntimeConfig,
    ) -> Result<Self, SessionError> {
        // `delegate_task` is part of every runtime; it is in an agent's scope
        // only when the agent lists subagents.
        let tools = if tools.spec(crate::delegation::DELEGATE_TASK).is_some() {
            tools
        } else {
            tools
                .extended(vec![Arc::new(crate::delegation::DelegateTask::default())])
                .map_err(|e| SessionError::Invalid(e.to_string()))?
        };
        let runtime = Arc::new(Runtime {
            agents: agents.into_iter().map(|a| (a.name.clone(), a)).collect(),
            store,
            provider,
            tools,
            hub: EventHub::new(),
            live: DashMap::new(),
            config,
            metrics: Metrics::default(),
            orchestrator: std::sync::OnceLock::new(),
            timers: dashmap::DashSet::new(),
            creating: dashmap::DashSet::new(),
            journal: DashMap::new(),
        });
        let (orchestrator, join) = Actor::spawn(
            None,
            OrchestratorActor,
            OrchestratorArgs {
                runtime: runtime.clone(),
            },
        )
        .await
        .map_err(|e| SessionError::Invalid(format!("could not start the orchestrator: {e}")))?;
        let _ = runtime.orchestrator.set(orchestrator.clone());
        Ok(Self {
            runtime,
            orchestrator,
            join: Arc::new(tokio::sync::Mutex::new(Some(join))),
        })
    }

    /// The shared services (for the edges: metrics, store access).
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The configured agents.
    pub fn agents(&self) -> impl Iterator<Item = &AgentConfig> {
        self.runtime.agents.values()
    }

    /// Activates every session that was mid-turn (running or awaiting
    /// approval) when the previous process stopped. Sessions awaiting input
    /// stay on disk until touched. Returns how many were activated.
    pub async fn recover(&self) -> Result<usize, SessionError> {
        let headers = self
            .runtime
            .store
            .list_by_status(&[SessionStatus::Running, SessionStatus::AwaitingApproval])
            .await?;
        // Children are resumed by their parents, under their supervision.
        let roots: Vec<SessionId> = headers
            .into_iter()
            .filter(|h| h.parent.is_none())
            .map(|h| h.id)
            .collect();
        let n = roots.len();
        // Loads overlap; spawns are serialised by the orchestrator anyway.
        let mut activations = futures::stream::iter(roots)
            .map(|id| self.runtime.activate(id))
            .buffer_unordered(RECOVERY_CONCURRENCY);
        while let Some(result) = activations.next().await {
            result?;
        }
        Ok(n)
    }

    /// Creates a session; with a prompt, its first turn starts at once. Returns
    /// once the session is checkpointed.
    pub async fn create_session(&self, req: CreateSession) -> Result<SessionId, SessionError> {
        let agent = self
            .runtime
            .agents
            .get(&req.agent)
            .ok_or_else(|| SessionError::UnknownAgent(req.agent.clone()))?;
        let config = req.overrides.apply(agent)?;
        let id = req.id.unwrap_or_else(SessionId::generate);
        // Two creates of one client-chosen id must not both pass the check
        // below and overwrite each other: the second one here loses.
        if !self.runtime.creating.insert(id) {
            return Err(SessionError::AlreadyExists(id));
        }
        let result = self.create_checked(id, req, config, agent).await;
        self.runtime.creating.remove(&id);
        result
    }

    async fn create_checked(
        &self,
        id: SessionId,
        req: CreateSession,
        config: crate::model::EffectiveConfig,
        agent: &AgentConfig,
    ) -> Result<SessionId, SessionError> {
        if req.id.is_some() && self.runtime.store.load_header(id).await?.is_some() {
            return Err(SessionError::AlreadyExists(id));
        }
        let now = now_ms();
        let header = SessionHeader {
            schema_version: SCHEMA_VERSION,
            id,
            tenant: req.tenant,
            created_by: req.created_by,
            agent: agent.name.clone(),
            title: req.title,
            metadata: req.metadata,
            parent: None,
            root_id: id,
            status: SessionStatus::Pending,
            created_at_ms: now,
            updated_at_ms: now,
            auto_complete: req.auto_complete,
            config,
            usage: Usage::default(),
            children_usage: Usage::default(),
            turn: 0,
            step: 0,
            last_stop_reason: None,
            recent_messages: Vec::new(),
            inbox: Vec::new(),
            open_calls: Vec::new(),
            transcript_len: 0,
            last_event_seq: 0,
            error: None,
        };
        let mut session = Session::new(header);
        if let Some(text) = req.prompt {
            // The effects are recomputed by the actor's resume on start.
            session.apply(
                Input::Message {
                    text,
                    message_id: None,
                },
                Ctx {
                    tools: &self.runtime.tools,
                    now_ms: now,
                },
            )?;
        }
        crate::metrics::checkpoint(self.runtime.store.as_ref(), session.checkpoint()).await?;
        let events = session.mark_persisted();
        for e in events {
            self.runtime.hub.publish(id, Notification::Event(e));
        }
        self.runtime.spawn(session).await?;
        Ok(id)
    }

    /// Sends a user message (starts a turn, or queues behind the running one).
    pub async fn send_message(
        &self,
        id: SessionId,
        text: impl Into<String>,
    ) -> Result<(), SessionError> {
        self.send_message_with_id(id, text, None).await
    }

    /// Sends a user message with a client-chosen `message_id`: retrying the
    /// same message is a no-op answered like the first time; reusing the id
    /// for different text is a [`SessionError::Conflict`].
    pub async fn send_message_with_id(
        &self,
        id: SessionId,
        text: impl Into<String>,
        message_id: Option<String>,
    ) -> Result<(), SessionError> {
        let text = text.into();
        self.runtime
            .route(id, move |reply| {
                SessionMsg::Send(text.clone(), message_id.clone(), reply)
            })
            .await
    }

    /// Submits decisions; acknowledged once checkpointed. Calls of
    /// descendants whose approvals propagate to `id` may be decided here
    /// (§7): the decisions are routed to the sessions that own them.
    pub async fn submit(&self, id: SessionId, submission: Submission) -> Result<(), SessionError> {
        let direct = submission.clone();
        let result = self
            .runtime
            .route(id, move |reply| SessionMsg::Decide(direct.clone(), reply))
            .await;
        match result {
            // The session refused atomically; some ids may belong to children.
            Err(SessionError::UnknownCalls(_)) => self.submit_in_tree(id, submission).await,
            other => other,
        }
    }

    async fn submit_in_tree(&self, id: SessionId, sub: Submission) -> Result<(), SessionError> {
        let tree = self.tree(id).await?;
        let mut owner: BTreeMap<ToolCallId, SessionId> = BTreeMap::new();
        let mut known: std::collections::BTreeSet<ToolCallId> = Default::default();
        tree.walk(&mut |node, reachable| {
            for c in &node.calls {
                known.insert(c.clone());
            }
            if reachable {
                for p in &node.pending {
                    owner.insert(p.call.id.clone(), node.session_id);
                }
            }
        });
        let unknown: Vec<ToolCallId> = sub
            .decisions
            .keys()
            .filter(|c| !owner.contains_key(*c) && !known.contains(*c))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(SessionError::UnknownCalls(unknown));
        }
        let decided: Vec<ToolCallId> = sub
            .decisions
            .keys()
            .filter(|c| !owner.contains_key(*c))
            .cloned()
            .collect();
        if !decided.is_empty() {
            return Err(SessionError::AlreadyDecided(decided));
        }
        let stray: Vec<ToolCallId> = sub
            .metadata
            .keys()
            .filter(|c| !sub.decisions.contains_key(*c))
            .cloned()
            .collect();
        if !stray.is_empty() {
            return Err(SessionError::StrayMetadata(stray));
        }
        let mut parts: BTreeMap<SessionId, Submission> = BTreeMap::new();
        for (call, decision) in sub.decisions {
            let Some(session) = owner.get(&call) else {
                continue;
            };
            let part = parts.entry(*session).or_insert_with(|| Submission {
                approved_by: sub.approved_by.clone(),
                ..Submission::default()
            });
            if let Some(m) = sub.metadata.get(&call) {
                part.metadata.insert(call.clone(), m.clone());
            }
            part.decisions.insert(call, decision);
        }
        for (session, part) in parts {
            self.runtime
                .route(session, move |reply| {
                    SessionMsg::Decide(part.clone(), reply)
                })
                .await?;
        }
        Ok(())
    }

    /// The session tree rooted at `id`: each node's agent, status, usage
    /// (own and rolled up) and pending approvals (§7).
    pub async fn tree(&self, id: SessionId) -> Result<TreeNode, SessionError> {
        let stored = self.state(id).await?;
        let session = Session::from_stored(stored);
        let h = &session.header;
        let mut child_ids = Vec::new();
        for c in session.all_calls() {
            if let Some(child) = c.child {
                if !child_ids.contains(&child) {
                    child_ids.push(child);
                }
            }
        }
        let mut children = Vec::new();
        for child in child_ids {
            match Box::pin(self.tree(child)).await {
                Ok(node) => children.push(node),
                Err(SessionError::NotFound(_)) => {} // intent recorded, child not yet created
                Err(e) => return Err(e),
            }
        }
        let mut subtree_usage = h.usage;
        for c in &children {
            subtree_usage.add(&c.subtree_usage);
        }
        Ok(TreeNode {
            session_id: h.id,
            agent: h.agent.clone(),
            status: h.status,
            stop_reason: h.last_stop_reason,
            depth: h.parent.as_ref().map_or(0, |p| p.depth),
            propagates: h.parent.as_ref().is_some_and(|p| p.propagate),
            usage: h.usage,
            subtree_usage,
            pending: session
                .pending_approvals()
                .into_iter()
                .map(|c| PendingApproval {
                    session_id: h.id,
                    path: vec![h.id],
                    call: c.clone(),
                })
                .collect(),
            calls: session
                .all_calls()
                .into_iter()
                .map(|c| c.id.clone())
                .collect(),
            children,
        })
    }

    /// Every approval decidable at `id`: its own and those of descendants whose
    /// requests propagate to it, each with the path of sessions leading to it.
    pub async fn pending_approvals(
        &self,
        id: SessionId,
    ) -> Result<Vec<PendingApproval>, SessionError> {
        let tree = self.tree(id).await?;
        let mut out = Vec::new();
        collect_pending(&tree, &mut Vec::new(), &mut out);
        Ok(out)
    }

    /// Cancels the session.
    pub async fn cancel(&self, id: SessionId) -> Result<(), SessionError> {
        self.runtime.route(id, SessionMsg::Cancel).await
    }

    /// Marks the session completed.
    pub async fn done(&self, id: SessionId) -> Result<(), SessionError> {
        self.runtime.route(id, SessionMsg::Done).await
    }

    /// The session's current state (from its actor when live, else from disk).
    pub async fn state(&self, id: SessionId) -> Result<StoredSession, SessionError> {
        let live = self.runtime.live.get(&id).map(|r| r.clone());
        if let Some(actor) = live {
            if let Ok(CallResult::Success(s)) = actor
                .call(SessionMsg::Get, Some(self.runtime.config.call_timeout))
                .await
            {
                return Ok(s);
            }
        }
        self.runtime
            .store
            .load(id)
            .await?
            .ok_or(SessionError::NotFound(id))
    }

    /// Live notifications of a session. Subscribe before acting to see every
    /// event; use [`Overseer::events_after`] to replay what came before.
    pub fn subscribe(&self, id: SessionId) -> broadcast::Receiver<Notification> {
        self.runtime.hub.subscribe(id)
    }

    /// Stored events with `seq > after`.
    pub async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, SessionError> {
        Ok(self.runtime.store.events_after(id, after, limit).await?)
    }

    /// Stops every actor gracefully and flushes the store.
    pub async fn shutdown(&self) -> Result<(), SessionError> {
        self.orchestrator.stop(None);
        if let Some(join) = self.join.lock().await.take() {
            let _ = join.await;
        }
        self.runtime.store.flush().await?;
        Ok(())
    }
}

impl Runtime {
    fn orchestrator(&self) -> Result<&ActorRef<OrchestratorMsg>, SessionError> {
        self.orchestrator
            .get()
            .ok_or(SessionError::Invalid("the runtime is not started".into()))
    }

    pub(crate) async fn spawn(
        &self,
        session: Session,
    ) -> Result<ActorRef<SessionMsg>, SessionError> {
        let id = session.header.id;
        match self
            .orchestrator()?
            .call(
                |reply| OrchestratorMsg::Spawn(Box::new(session), reply),
                Some(self.config.call_timeout),
            )
            .await
        {
            Ok(CallResult::Success(r)) => r,
            Ok(_) | Err(_) => Err(SessionError::Unavailable {
                id,
                reason: "the orchestrator did not answer".into(),
            }),
        }
    }

    /// The live actor of a session, loading it from disk if needed.
    pub async fn activate(&self, id: SessionId) -> Result<ActorRef<SessionMsg>, SessionError> {
        if let Some(r) = self.live.get(&id) {
            return Ok(r.clone());
        }
        let stored = self
            .store
            .load(id)
            .await?
            .ok_or(SessionError::NotFound(id))?;
        if stored.header.status.is_terminal() {
            return Err(SessionError::Terminal {
                id,
                status: stored.header.status,
            });
        }
        self.metrics
            .activations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!(crate::metrics::SESSION_ACTIVATIONS_TOTAL).increment(1);
        self.spawn(Session::from_stored(stored)).await
    }

    /// Sends a request to a session (activating it) and waits for its answer.
    pub async fn route<F>(&self, id: SessionId, make: F) -> Result<(), SessionError>
    where
        F: Fn(RpcReplyPort<Result<(), SessionError>>) -> SessionMsg,
    {
        // One retry, only when the message was never delivered (the actor had
        // just stopped): a delivered request is never sent twice.
        for _ in 0..2 {
            let actor = self.activate(id).await?;
            match actor.call(&make, Some(self.config.call_timeout)).await {
                Ok(CallResult::Success(r)) => return r,
                Ok(CallResult::Timeout) => {
                    return Err(SessionError::Unavailable {
                        id,
                        reason: "the session did not answer in time".into(),
                    })
                }
                Ok(CallResult::SenderError) => {
                    return Err(SessionError::Unavailable {
                        id,
                        reason: "the session stopped before answering; check its state".into(),
                    })
                }
                Err(_) => self.await_stopped(id, &actor).await,
            }
        }
        Err(SessionError::Unavailable {
            id,
            reason: "the session actor is restarting".into(),
        })
    }

    /// Delivers a fire-and-forget message, activating the session if it
    /// lives only on disk (a timer firing while the session hibernates).
    pub async fn deliver(
        &self,
        id: SessionId,
        make: impl Fn() -> SessionMsg,
    ) -> Result<(), SessionError> {
        for _ in 0..2 {
            let actor = self.activate(id).await?;
            match actor.cast(make()) {
                Ok(()) => return Ok(()),
                Err(_) => self.await_stopped(id, &actor).await,
            }
        }
        Err(SessionError::Unavailable {
            id,
            reason: "the session actor is restarting".into(),
        })
    }

    /// A send was refused: the actor is draining (hibernating) or stopping.
    /// Wait until it has stopped, so its last checkpoint is the one the next
    /// activation loads, then forget it.
    async fn await_stopped(&self, id: SessionId, actor: &ActorRef<SessionMsg>) {
        let deadline = tokio::time::Instant::now() + self.config.call_timeout;
        while actor.get_status() != ractor::ActorStatus::Stopped
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let stale = actor.get_id();
        self.live.remove_if(&id, |_, r| r.get_id() == stale);
    }

    /// Arms an approval timer that survives hibernation: it fires through
    /// [`Runtime::deliver`], which activates the session if needed.
    pub(crate) fn arm_approval_timer(
        self: &Arc<Self>,
        id: SessionId,
        call_id: crate::model::ToolCallId,
        after: Duration,
    ) {
        if !self.timers.insert((id, call_id.clone())) {
            return;
        }
        let rt = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            // A runtime that was shut down has nobody to deliver to.
            let Some(rt) = rt.upgrade() else { return };
            rt.timers.remove(&(id, call_id.clone()));
            if let Err(e) = rt
                .deliver(id, || SessionMsg::ApprovalTimeout(call_id.clone()))
                .await
            {
                tracing::debug!(session_id = %id, "approval timer not delivered: {e}");
            }
        });
    }

    /// Marks a session failed (restart limit exceeded) in its checkpoint,
    /// leaving no call non-terminal. Returns the failed session.
    pub(crate) async fn fail_session(
        &self,
        id: SessionId,
        reason: &str,
    ) -> Result<Option<Session>, SessionError> {
        let Some(stored) = self.store.load(id).await? else {
            return Ok(None);
        };
        let mut session = Session::from_stored(stored);
        session.apply(
            Input::Fail {
                reason: reason.to_owned(),
            },
            Ctx {
                tools: &self.tools,
                now_ms: now_ms(),
            },
        )?;
        crate::metrics::checkpoint(self.store.as_ref(), session.checkpoint()).await?;
        // No actor holds this session now: its approvals, closed by the
        // failure, leave the gauge here.
        crate::metrics::set_pending(id, session.pending_approvals().len());
        for event in session.mark_persisted() {
            self.hub.publish(id, Notification::Event(event));
        }
        Ok(Some(session))
    }
}

/// A pending approval as seen from an ancestor.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PendingApproval {
    /// The session that owns the call.
    pub session_id: SessionId,
    /// Sessions from the queried one down to the owner.
    pub path: Vec<SessionId>,
    /// The call.
    pub call: crate::model::ToolCallRecord,
}

/// One node of a session tree.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TreeNode {
    /// Session.
    pub session_id: SessionId,
    /// Agent.
    pub agent: String,
    /// Status.
    pub status: SessionStatus,
    /// Why its last turn stopped.
    pub stop_reason: Option<crate::model::StopReason>,
    /// Depth (root = 0).
    pub depth: u32,
    /// Whether its approvals surface at its parent.
    pub propagates: bool,
    /// Its own usage.
    pub usage: Usage,
    /// Its usage plus its whole subtree's.
    pub subtree_usage: Usage,
    /// Its own pending approvals.
    pub pending: Vec<PendingApproval>,
    /// Ids of all its calls (decided or not).
    #[serde(skip)]
    pub calls: Vec<ToolCallId>,
    /// Children, in call order.
    pub children: Vec<TreeNode>,
}

impl TreeNode {
    /// Visits every node with whether its approvals reach this node.
    fn walk(&self, f: &mut impl FnMut(&TreeNode, bool)) {
        fn go(n: &TreeNode, reachable: bool, f: &mut impl FnMut(&TreeNode, bool)) {
            f(n, reachable);
            for c in &n.children {
                go(c, reachable && c.propagates, f);
            }
        }
        go(self, true, f);
    }

    /// This node and every descendant, depth first.
    pub fn nodes(&self) -> Vec<&TreeNode> {
        let mut out = vec![self];
        for c in &self.children {
            out.extend(c.nodes());
        }
        out
    }
}

fn collect_pending(node: &TreeNode, path: &mut Vec<SessionId>, out: &mut Vec<PendingApproval>) {
    path.push(node.session_id);
    for p in &node.pending {
        out.push(PendingApproval {
            path: path.clone(),
            ..p.clone()
        });
    }
    for c in &node.children {
        if c.propagates {
            collect_pending(c, path, out);
        }
    }
    path.pop();
}
