//! [`Overseer`]: the in-process API of overseer (create, message, decide,
//! cancel, done, state, tree, subscribe, recover, shutdown), and the shapes it
//! answers with ([`PendingApproval`], [`TreeNode`]).
//!
//! It sits on top of the actor tree: it starts the orchestrator and talks to
//! session actors only through [`Runtime`]'s routing. It deliberately knows
//! nothing of HTTP, auth or tenancy rules beyond recording the tenant: those
//! are the edge's (`overseer::http`). Stored tasks, skills and forks
//! have their parts of the API in `overseer/tasks.rs` and `overseer/fork.rs`.

mod edge;
mod fork;
mod tasks;

pub use edge::WeakOverseer;

pub use fork::HistoryPoint;
pub use tasks::TaskRun;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::error::SessionError;
use crate::library::Library;
use crate::machine::{Input, Session};
use crate::messages::{OrchestratorMsg, SessionMsg};
use crate::model::{
    AgentConfig, CallState, Event, Notification, SessionHeader, SessionId, SessionIdHasher,
    SessionOverrides, SessionStatus, Submission, ToolCallId, ToolRule, Usage,
};
use crate::orchestrator::{OrchestratorActor, OrchestratorArgs};
use crate::provider::Provider;
use crate::runtime::{Runtime, RuntimeConfig};
use crate::store::{each_resumable_page, CheckpointStore, StoredSession};
use crate::tool::ToolRegistry;

/// Sessions loaded concurrently during boot recovery.
const RECOVERY_CONCURRENCY: usize = 64;

/// Headers boot recovery reads (and holds decoded) at once: a million
/// parked sessions must not mean a million decoded headers in memory.
const RECOVERY_PAGE: usize = 8192;

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
    /// Tools of the session's own, added to its scope after the overrides
    /// narrowed the agent's: each must be among the tools given to this id
    /// with [`Overseer::set_session_tools`] first.
    pub session_tools: Vec<String>,
    /// A digest of the request, recorded in the header
    /// ([`SessionHeader::create_digest`]) so that a retry under a client's
    /// key can be told from a different request exactly.
    pub create_digest: Option<String>,
    /// The caller's W3C `traceparent` (checked with
    /// [`crate::model::is_traceparent`]): the first turn's span is its child.
    pub trace_parent: Option<String>,
}

/// The in-process API of overseer. Cheap to clone.
#[derive(Clone)]
pub struct Overseer {
    pub(crate) runtime: Arc<Runtime>,
    orchestrator: ActorRef<OrchestratorMsg>,
    join: Arc<JoinSlot>,
}

/// The orchestrator's join handle, taken by the first shutdown.
type JoinSlot = tokio::sync::Mutex<Option<JoinHandle<()>>>;

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
        Self::start_with(agents, Library::default(), store, provider, tools, config).await
    }

    /// [`Overseer::start`] with stored tasks and skills: agents that
    /// list tasks get `run_task`, agents that list skills `activate_skill`
    /// and `read_skill_resource` (whose implementation, reading files, the
    /// edge puts in `tools`). Every name an agent or task gives must exist.
    pub async fn start_with(
        agents: Vec<AgentConfig>,
        library: Library,
        store: Arc<dyn CheckpointStore>,
        provider: Arc<dyn Provider>,
        tools: ToolRegistry,
        config: RuntimeConfig,
    ) -> Result<Self, SessionError> {
        library.check(&agents).map_err(SessionError::Invalid)?;
        for agent in &agents {
            if let Some(schema) = &agent.output_schema {
                crate::model::check_output_schema(schema).map_err(|e| {
                    SessionError::Invalid(format!("agent '{}': output_schema: {e}", agent.name))
                })?;
            }
        }
        // `delegate_task` is part of every runtime; it is in an agent's scope
        // only when the agent lists subagents.
        let tools = if tools.spec(crate::delegation::DELEGATE_TASK).is_some() {
            tools
        } else {
            tools
                .extended(vec![Arc::new(crate::delegation::DelegateTask::default())])
                .map_err(|e| SessionError::Internal(e.to_string()))?
        };
        let mut builtins: Vec<Arc<dyn crate::tool::Tool>> = Vec::new();
        if tools.spec(crate::tasks::RUN_TASK).is_none() {
            builtins.push(Arc::new(crate::tasks::RunTask::default()));
        }
        if tools.spec(crate::skills::ACTIVATE_SKILL).is_none() {
            builtins.push(Arc::new(crate::skills::ActivateSkill::new(
                library.skills.clone(),
            )));
        }
        let tools = if builtins.is_empty() {
            tools
        } else {
            tools
                .extended(builtins)
                .map_err(|e| SessionError::Invalid(e.to_string()))?
        };
        let runtime = Arc::new(Runtime::new(
            agents, library, store, provider, tools, config,
        ));
        let (orchestrator, join) = Actor::spawn(
            None,
            OrchestratorActor,
            OrchestratorArgs {
                runtime: runtime.clone(),
            },
        )
        .await
        .map_err(|e| SessionError::Internal(format!("could not start the orchestrator: {e}")))?;
        let _ = runtime.orchestrator.set(orchestrator.clone());
        if let Some(janitor) = runtime.config.janitor {
            crate::janitor::spawn(Arc::downgrade(&runtime), janitor);
        }
        Ok(Self {
            runtime,
            orchestrator,
            join: Arc::new(tokio::sync::Mutex::new(Some(join))),
        })
    }

    /// How many root sessions the orchestrator keeps a restart history for
    /// (sessions in a crash loop; for leak checks and diagnostics).
    pub async fn restart_histories(&self) -> Result<usize, SessionError> {
        match self
            .orchestrator
            .call(
                OrchestratorMsg::RestartHistories,
                Some(self.runtime.config.call_timeout),
            )
            .await
        {
            Ok(CallResult::Success(n)) => Ok(n),
            _ => Err(SessionError::Internal(
                "the orchestrator did not answer".into(),
            )),
        }
    }

    /// The configured agents.
    pub fn agents(&self) -> impl Iterator<Item = &AgentConfig> {
        self.runtime.agents.values()
    }

    /// Recovers every session that was mid-turn (running or awaiting
    /// approval) when the previous process stopped. Sessions awaiting input
    /// stay on disk until touched. A root that only waits for decisions
    /// (nothing of it runs: see [`crate::machine::resume_of_parked`]) stays
    /// on disk too, as if it had hibernated: its approval timers are armed
    /// and its approvals counted, and the first decision or timeout
    /// activates it. Every other root is activated here; each resumes its
    /// own children, under its own supervision. A child whose parent will
    /// not resume it (the parent ended, or a crash came between the two
    /// checkpoints of a cancel) is cancelled, so no approval is orphaned.
    /// Returns how many roots were recovered (activated or left parked).
    pub async fn recover(&self) -> Result<usize, SessionError> {
        // Page by page: only ids outlive a page (a parent may come on a
        // later page than its child, so orphans are found at the end).
        let mut active: HashSet<SessionId, SessionIdHasher> = HashSet::default();
        let mut children: Vec<(SessionId, SessionId)> = Vec::new();
        let mut roots = Vec::new();
        let mut parked = 0;
        each_resumable_page(self.runtime.store.as_ref(), RECOVERY_PAGE, |page| {
            for h in &page {
                active.insert(h.id);
                match &h.parent {
                    // Costs its header (read above) and its timers: ready
                    // after a restart does not wait for loading every
                    // session that waits for a person, nor does memory
                    // hold their actors.
                    None if self.runtime.recover_parked(h) => parked += 1,
                    None => roots.push(h.id),
                    Some(parent) => children.push((h.id, *parent)),
                }
            }
        })
        .await?;
        let orphans = children
            .into_iter()
            .filter(|(_, parent)| !active.contains(parent))
            .map(|(child, _)| child);
        for id in orphans {
            self.runtime.cancel_in_store(id).await?;
        }
        let n = roots.len() + parked;
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
        self.create_session_with(req, Extras::default()).await
    }

    async fn create_session_with(
        &self,
        req: CreateSession,
        extras: Extras,
    ) -> Result<SessionId, SessionError> {
        let agent = self
            .runtime
            .agents
            .get(&req.agent)
            .ok_or_else(|| SessionError::UnknownAgent(req.agent.clone()))?;
        let mut config = req.overrides.apply(agent)?;
        config.route = self.runtime.provider.describe_route(&config.model);
        if let Some(schema) = &extras.output_schema {
            config.output_schema = Some(schema.clone());
        }
        for skill in &extras.skills {
            if !config.skills.contains(skill) {
                config.skills.push(skill.clone());
            }
        }
        if !config.skills.is_empty() {
            for t in [
                crate::skills::ACTIVATE_SKILL,
                crate::skills::READ_SKILL_RESOURCE,
            ] {
                if !config.tools.iter().any(|x| x == t) {
                    config.tools.push(t.to_owned());
                }
            }
        }
        self.runtime.library.describe(&mut config);
        let limits = &self.runtime.config.limits;
        if let Some(title) = &req.title {
            check_size("title", title.len() as u64, limits.max_title_bytes)?;
        }
        if !req.metadata.is_null() {
            let size = serde_json::to_vec(&req.metadata)
                .map(|v| v.len() as u64)
                .map_err(|e| SessionError::Invalid(format!("metadata: {e}")))?;
            check_size("metadata", size, limits.max_metadata_bytes)?;
        }
        self.runtime.admit()?;
        self.runtime.admit_tenant(&req.tenant)?;
        let id = req.id.unwrap_or_else(SessionId::generate);
        // Two creates of one client-chosen id must not both pass the check
        // below and overwrite each other: the second one here loses. The
        // guard releases the id however this future ends, dropped included.
        let Some(_creating) = CreatingGuard::claim(&self.runtime, id) else {
            return Err(SessionError::AlreadyExists(id));
        };
        if !req.session_tools.is_empty() {
            let tools = self.runtime.tools_for(id);
            let missing: Vec<&str> = req
                .session_tools
                .iter()
                .filter(|t| tools.spec(t).is_none())
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                return Err(SessionError::Invalid(format!(
                    "session_tools: no such tool for session {id}: {}",
                    missing.join(", ")
                )));
            }
            for tool in &req.session_tools {
                if !config.tools.contains(tool) {
                    config.tools.push(tool.clone());
                }
            }
        }
        // Boxed: the rest (the first checkpoint, spawning the actor) is a
        // 5 KB future, which every caller's future (an HTTP request's, a
        // batch of creates) would otherwise carry inline and copy.
        Box::pin(self.create_checked(id, req, config, agent, extras)).await
    }

    async fn create_checked(
        &self,
        id: SessionId,
        req: CreateSession,
        config: crate::model::EffectiveConfig,
        agent: &AgentConfig,
        extras: Extras,
    ) -> Result<SessionId, SessionError> {
        if req.id.is_some() && self.runtime.store.load_header(id).await?.is_some() {
            return Err(SessionError::AlreadyExists(id));
        }
        self.runtime.count_creation(&req.tenant)?;
        let now = self.runtime.now_ms();
        let mut header = SessionHeader::new(id, req.tenant, agent.name.clone(), config, now);
        header.created_by = req.created_by;
        header.create_digest = req.create_digest;
        header.title = req.title;
        header.auto_complete = req.auto_complete;
        header.task = extras.task;
        header.trace = req.trace_parent.map(|parent| crate::model::TraceLink {
            parent: Some(parent),
            turn: None,
        });
        let mut session = Session::new(header).with_metadata(req.metadata);
        // Skills a person asked for are active before the first message.
        for name in &extras.skills {
            let Some(skill) = self.runtime.library.skills.get(name) else {
                return Err(SessionError::Invalid(format!(
                    "skills: no skill named '{name}'"
                )));
            };
            session.apply(
                Input::ActivateSkill {
                    name: name.clone(),
                    body: skill.body.clone(),
                    by: session.header.created_by.clone(),
                },
                self.runtime.ctx_with(&self.runtime.tools_for(id)),
            )?;
        }
        if let Some(text) = req.prompt {
            // The effects are recomputed by the actor's resume on start.
            // One instant for the whole creation: the prompt is stamped with
            // the session's creation time, which is how a prompt is told
            // from a later message (a clock reading of its own could fall
            // in the next millisecond).
            let tools = self.runtime.tools_for(id);
            let mut ctx = self.runtime.ctx_with(&tools);
            ctx.now_ms = now;
            session.apply(
                Input::Message {
                    text,
                    message_id: None,
                },
                ctx,
            )?;
        }
        // A new tree's lease, in a store shared by several nodes.
        self.runtime.store.claim(id).await?;
        crate::metrics::checkpoint(self.runtime.store.as_ref(), session.checkpoint()).await?;
        let events = session.mark_persisted();
        for e in events {
            self.runtime.hub.publish(id, Notification::Event(e));
        }
        self.runtime.spawn_root(session).await?;
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

    /// [`Overseer::send_message_with_id`] with the caller's W3C
    /// `traceparent`: the turn the message starts is a child of its span.
    pub async fn send_message_traced(
        &self,
        id: SessionId,
        text: impl Into<String>,
        message_id: Option<String>,
        traceparent: Option<String>,
    ) -> Result<(), SessionError> {
        let Some(traceparent) = traceparent else {
            return self.send_message_with_id(id, text, message_id).await;
        };
        let text = text.into();
        self.runtime
            .route(id, move |reply| {
                SessionMsg::Traced(
                    traceparent.clone(),
                    Box::new(SessionMsg::Send(text.clone(), message_id.clone(), reply)),
                )
            })
            .await
    }

    /// Submits decisions; acknowledged once checkpointed. Calls of
    /// descendants whose approvals propagate to `id` may be decided here
    ///: the decisions are routed to the sessions that own them.
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
    /// (own and rolled up) and pending approvals.
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
        let header = self.header(id).await?;
        self.pending_approvals_in(header).await
    }

    /// [`Overseer::pending_approvals`] from a header the caller has just
    /// read (the HTTP edge reads it to check the tenant): one ask of the
    /// session less.
    pub async fn pending_approvals_in(
        &self,
        header: SessionHeader,
    ) -> Result<Vec<PendingApproval>, SessionError> {
        let mut out = Vec::new();
        self.collect_pending(header, &mut Vec::new(), &mut out)
            .await?;
        Ok(out)
    }

    /// Pending approvals of `header`'s session and of the propagating
    /// children of its open calls, depth first. Headers only: a child that
    /// can still ask for a decision hangs off an open call of its parent
    /// (a finished, cancelled or interrupted call leaves its child terminal),
    /// so neither transcripts nor finished children are read. This is the
    /// path of every decision over HTTP; [`Overseer::tree`] walks the whole
    /// history.
    async fn collect_pending(
        &self,
        header: SessionHeader,
        path: &mut Vec<SessionId>,
        out: &mut Vec<PendingApproval>,
    ) -> Result<(), SessionError> {
        path.push(header.id);
        let mut children = Vec::new();
        for call in &header.open_calls {
            if call.state == CallState::AwaitingApproval {
                out.push(PendingApproval {
                    session_id: header.id,
                    path: path.clone(),
                    call: call.clone(),
                });
            }
            if let Some(child) = call.child {
                if !children.contains(&child) {
                    children.push(child);
                }
            }
        }
        for child in children {
            let child = match self.header(child).await {
                Ok(h) => h,
                // Intent recorded, child not yet created.
                Err(SessionError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            if child.parent.as_ref().is_some_and(|p| p.propagate) {
                Box::pin(self.collect_pending(child, path, out)).await?;
            }
        }
        path.pop();
        Ok(())
    }

    /// The session's current header: from its live actor, else the store.
    pub async fn header(&self, id: SessionId) -> Result<SessionHeader, SessionError> {
        if let Some(h) = self.ask_live(id, SessionMsg::GetHeader).await {
            return Ok(h);
        }
        self.runtime
            .store
            .load_header(id)
            .await?
            .ok_or(SessionError::NotFound(id))
    }

    /// What the live actor of `id` answers to `msg`; `None` when the session
    /// has no actor or it did not answer in time (the caller reads the store).
    async fn ask_live<T: Send + 'static>(
        &self,
        id: SessionId,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> SessionMsg,
    ) -> Option<T> {
        let actor = self.runtime.live.get(&id).map(|r| r.clone())?;
        match actor
            .call(msg, Some(self.runtime.config.call_timeout))
            .await
        {
            Ok(CallResult::Success(v)) => Some(v),
            _ => None,
        }
    }

    /// Cancels the session.
    pub async fn cancel(&self, id: SessionId) -> Result<(), SessionError> {
        self.runtime.route(id, SessionMsg::Cancel).await
    }

    /// Marks the session completed.
    pub async fn done(&self, id: SessionId) -> Result<(), SessionError> {
        self.runtime.route(id, SessionMsg::Done).await
    }

    /// Gives session `id` tools of its own (an edge's per-session MCP
    /// servers, say), on top of the runtime's, in place of any it had. Set
    /// them before creating the session (see [`CreateSession::session_tools`])
    /// or resuming it; they are held until [`Overseer::clear_session_tools`],
    /// and a session without them fails their calls as not available.
    pub fn set_session_tools(
        &self,
        id: SessionId,
        tools: Vec<Arc<dyn crate::tool::Tool>>,
    ) -> Result<(), SessionError> {
        self.runtime
            .set_session_tools(id, tools)
            .map_err(|e| SessionError::Invalid(e.to_string()))
    }

    /// Drops session `id`'s own tools (see [`Overseer::set_session_tools`]).
    pub fn clear_session_tools(&self, id: SessionId) {
        self.runtime.clear_session_tools(id);
    }

    /// Stops the current turn (stream, tools, pending approvals, the
    /// subtree) and keeps the session: it awaits input, and the next message
    /// continues the conversation. A session with no turn running is left
    /// as it is.
    pub async fn interrupt(&self, id: SessionId) -> Result<(), SessionError> {
        self.runtime.route(id, SessionMsg::Interrupt).await
    }

    /// Serves the session's next turns with the model route `model` (the
    /// caller checks the route exists); only between turns.
    pub async fn set_model(&self, id: SessionId, model: &str) -> Result<(), SessionError> {
        let model = model.to_owned();
        self.runtime
            .route(id, move |reply| SessionMsg::SetModel(model.clone(), reply))
            .await
    }

    /// Sets the session's standing approval rule for `tool` (one of its
    /// tools): its later calls that would wait for a decision are approved
    /// or denied at once, audited as decided by `rule:allow|reject`. The
    /// rule is recorded in the transcript and events (with `by`) and kept
    /// in the checkpoint.
    pub async fn set_tool_rule(
        &self,
        id: SessionId,
        tool: &str,
        rule: ToolRule,
        by: Option<String>,
    ) -> Result<(), SessionError> {
        let args = (tool.to_owned(), rule, by);
        self.runtime
            .route(id, move |reply| {
                SessionMsg::SetToolRule(args.clone(), reply)
            })
            .await
    }

    /// The session's current state (from its actor when live, else from disk).
    pub async fn state(&self, id: SessionId) -> Result<StoredSession, SessionError> {
        if let Some(s) = self.ask_live(id, SessionMsg::Get).await {
            return Ok(s);
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
        self.runtime.shutting_down.store(true, Ordering::Relaxed);
        self.orchestrator.stop(None);
        if let Some(join) = self.join.lock().await.take() {
            let _ = join.await;
        }
        self.runtime.store.flush().await?;
        Ok(())
    }
}

/// What a create asks for besides a [`CreateSession`]: a task run's task,
/// output schema and skills (activated by the person who asked).
#[derive(Debug, Clone, Default)]
struct Extras {
    task: Option<String>,
    output_schema: Option<Value>,
    skills: Vec<String>,
}

/// Holds a session id in the set of ids being created, and releases it when
/// dropped, so a create whose future is dropped half-way leaves no trace.
struct CreatingGuard<'a> {
    runtime: &'a Runtime,
    id: SessionId,
}

impl<'a> CreatingGuard<'a> {
    fn claim(runtime: &'a Runtime, id: SessionId) -> Option<Self> {
        runtime.creating.insert(id).then_some(Self { runtime, id })
    }
}

impl Drop for CreatingGuard<'_> {
    fn drop(&mut self) {
        self.runtime.creating.remove(&self.id);
    }
}

/// A pending approval as seen from an ancestor.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    #[cfg_attr(feature = "openapi", schema(no_recursion))]
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

fn check_size(what: &str, size: u64, limit: u64) -> Result<(), SessionError> {
    if size > limit {
        return Err(SessionError::TooLarge {
            what: what.to_owned(),
            size,
            limit,
        });
    }
    Ok(())
}
