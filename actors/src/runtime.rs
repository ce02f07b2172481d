//! The runtime: the services every actor of the tree shares (store, provider,
//! tools, event hub, the registry of live session actors, the effect journal,
//! approval timers) and routing of requests to session actors.
//!
//! Routing goes straight to live session actors through a concurrent map, so
//! the orchestrator's mailbox is not on the hot path. A session that lives
//! only on disk (never loaded, hibernated, restarting) is activated where it
//! belongs in the tree: a root by the orchestrator, a child by its parent's
//! actor (activating the parent first), so a child is never supervised by
//! anyone but its parent. This module only sends messages; it names no actor
//! type (the actors live above it, see ARCHITECTURE.md). The public in-process
//! API is [`crate::Overseer`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};

use crate::error::SessionError;
use crate::hub::EventHub;
use crate::journal::Journal;
use crate::limits::Limits;
use crate::machine::{Ctx, Effect, Input, Session};
use crate::messages::{OrchestratorMsg, SessionMsg};
use crate::model::{
    now_ms, AgentConfig, Notification, SessionHeader, SessionId, SessionIdHasher, SharedConfig,
    ToolCallId,
};
use crate::provider::Provider;
use crate::store::{CheckpointStore, Resumable, StoredSession};
use crate::supervision::{Decision, RestartPolicy, Restarts};
use crate::timers::{ApprovalTimers, Due, IdleLook, IdleTimers};
use crate::tool::ToolRegistry;

/// The default of [`RuntimeConfig::rest_after`]: long enough that an
/// automated approver or a person answering at once finds the session as
/// it left it, short beside the idle time before hibernation.
pub const DEFAULT_REST_AFTER: Duration = Duration::from_secs(10);

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
    /// How the idle time shortens as live sessions approach
    /// `limits.max_live_sessions`.
    pub idle_pressure: crate::limits::IdlePressure,
    /// How long a session stays at rest (idle, everything durable) before
    /// its actor lets go of what it can read back from a local store (its
    /// transcript and metadata). A decision or message within this time is
    /// handled from memory; one after it reads the session back first.
    /// Zero releases as soon as the session is at rest.
    pub rest_after: Duration,
    /// Size and admission limits.
    pub limits: Limits,
    /// Share of a model's context window, in percent, past which a session
    /// compacts its older transcript before the next step.
    pub compaction_threshold_pct: u8,
    /// The background sweeps (input expiry, retention); `None` runs none.
    pub janitor: Option<JanitorConfig>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            restart: RestartPolicy::default(),
            call_timeout: Duration::from_secs(30),
            idle_hibernate: Some(Duration::from_secs(300)),
            idle_pressure: crate::limits::IdlePressure::default(),
            rest_after: DEFAULT_REST_AFTER,
            limits: Limits::default(),
            compaction_threshold_pct: crate::machine::DEFAULT_COMPACTION_THRESHOLD_PCT,
            janitor: Some(JanitorConfig::default()),
        }
    }
}

/// When and how much the janitor (`crate::janitor`) sweeps: part of the
/// runtime's configuration, beside the rest of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JanitorConfig {
    /// Time between two batches.
    pub interval: Duration,
    /// Headers read per batch.
    pub batch: usize,
    /// Terminal sessions whose last change is older than this are purged
    /// (`None`: kept for ever).
    pub retention: Option<Duration>,
}

impl Default for JanitorConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            batch: 1000,
            retention: None,
        }
    }
}

/// Whether an activation is subject to the live-session limit: requests
/// from API callers are; the runtime's own work (recovery, timers, children
/// of live parents) is not, or accepted work could be stranded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Refuse past the limit.
    Check,
    /// Always admit.
    Bypass,
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

/// What the runtime holds per session, summed over all sessions: once every
/// session has ended or hibernated, all of it but `live` drops to zero (the
/// leak checks of the tests read it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bookkeeping {
    /// Live session actors.
    pub live: usize,
    /// Effect-journal entries of dispatched calls.
    pub journal: usize,
    /// Armed approval timers.
    pub timers: usize,
    /// Armed idle timers (one per idle live session actor).
    pub idle: usize,
    /// Ids being created right now.
    pub creating: usize,
}

/// Services shared by every actor of the tree.
pub(crate) struct Runtime {
    /// Checkpoint store.
    pub store: Arc<dyn CheckpointStore>,
    /// LLM provider.
    pub provider: Arc<dyn Provider>,
    /// Tools.
    pub tools: ToolRegistry,
    /// Live event fan-out.
    pub hub: EventHub,
    /// Live session actors by id.
    pub live: DashMap<SessionId, ActorRef<SessionMsg>, SessionIdHasher>,
    /// Tunables.
    pub config: RuntimeConfig,
    /// Counters.
    pub metrics: Metrics,
    /// Agents by name.
    pub agents: BTreeMap<String, AgentConfig>,
    /// Stored tasks and skills.
    pub library: crate::library::Library,
    /// The orchestrator, set once at start.
    pub(crate) orchestrator: std::sync::OnceLock<ActorRef<OrchestratorMsg>>,
    /// Approval timers, owned per (session, call).
    pub(crate) timers: ApprovalTimers,
    /// Idle timers of live session actors.
    pub(crate) idle: IdleTimers,
    /// Ids being created right now (see `Overseer::create_session`).
    pub(crate) creating: dashmap::DashSet<SessionId>,
    /// The in-memory half of the effect journal.
    pub(crate) journal: Journal,
    /// Set once shutdown began: stopping actors then is not hibernation, and
    /// nothing is woken again.
    pub(crate) shutting_down: AtomicBool,
    /// When idle sessions were last asked to hibernate early (ms since the
    /// epoch), so that a burst of refusals asks once.
    last_shed_ms: AtomicU64,
    /// The runtime's clock (see [`Runtime::now_ms`]).
    clock: Clock,
    /// Live session actors per tenant (for the per-tenant quota).
    pub(crate) tenant_live: DashMap<String, usize>,
    /// Sessions created per tenant on the current day (UTC): (day, count).
    tenant_created: DashMap<String, (i64, u64)>,
    /// The tools of sessions that have tools of their own (an edge's
    /// per-session MCP servers): `tools` plus theirs.
    session_tools: DashMap<SessionId, ToolRegistry, SessionIdHasher>,
    /// Per configured agent, the configuration its live sessions share (see
    /// [`Runtime::share_config`]).
    configs: DashMap<String, SharedConfig>,
}

/// Wall-clock milliseconds read as the wall clock at start plus the tokio
/// clock's elapsed time: one time line for deadlines, timers and records,
/// which paused tokio time (tests) moves as it moves the timers.
#[derive(Debug)]
struct Clock {
    wall_at_start_ms: i64,
    start: tokio::time::Instant,
}

impl Clock {
    fn new() -> Self {
        Self {
            wall_at_start_ms: now_ms(),
            start: tokio::time::Instant::now(),
        }
    }

    fn now_ms(&self) -> i64 {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.wall_at_start_ms.saturating_add(elapsed)
    }
}

impl Runtime {
    /// A runtime with nothing live; the orchestrator is set by `Overseer::start`.
    pub(crate) fn new(
        agents: Vec<AgentConfig>,
        library: crate::library::Library,
        store: Arc<dyn CheckpointStore>,
        provider: Arc<dyn Provider>,
        tools: ToolRegistry,
        config: RuntimeConfig,
    ) -> Self {
        Self {
            agents: agents.into_iter().map(|a| (a.name.clone(), a)).collect(),
            library,
            store,
            provider,
            tools,
            hub: EventHub::new(),
            live: DashMap::default(),
            config,
            metrics: Metrics::default(),
            orchestrator: std::sync::OnceLock::new(),
            timers: ApprovalTimers::default(),
            idle: IdleTimers::default(),
            creating: dashmap::DashSet::new(),
            journal: Journal::default(),
            shutting_down: AtomicBool::new(false),
            last_shed_ms: AtomicU64::new(0),
            clock: Clock::new(),
            tenant_live: DashMap::new(),
            tenant_created: DashMap::new(),
            session_tools: DashMap::default(),
            configs: DashMap::new(),
        }
    }

    /// Makes `header`'s configuration the one other live sessions of its
    /// agent share, when it is equal to theirs, so that a thousand sessions
    /// of an agent hold its instructions and tool lists once. Only
    /// configured agents are kept, one configuration each (the latest one
    /// that differed), so what this holds is bounded by the configuration
    /// file, not by the sessions.
    pub(crate) fn share_config(&self, header: &mut SessionHeader) {
        if !self.agents.contains_key(&header.agent) {
            return;
        }
        // Cloned out: no map guard is held while the map is written below.
        let shared = self.configs.get(&header.agent).map(|c| c.clone());
        match shared {
            Some(shared) if shared.ptr_eq(&header.config) => {}
            Some(shared) if shared == header.config => header.config = shared,
            _ => {
                self.configs
                    .insert(header.agent.clone(), header.config.clone());
            }
        }
    }

    /// The tools session `id` sees: the runtime's, plus its own if it has
    /// any (cheap: registries share their maps).
    pub(crate) fn tools_for(&self, id: SessionId) -> ToolRegistry {
        self.session_tools
            .get(&id)
            .map_or_else(|| self.tools.clone(), |t| t.value().clone())
    }

    /// Gives session `id` tools of its own on top of the runtime's, in
    /// place of any it had.
    pub(crate) fn set_session_tools(
        &self,
        id: SessionId,
        extra: Vec<Arc<dyn crate::tool::Tool>>,
    ) -> Result<(), crate::tool::ToolRegistryError> {
        let tools = self.tools.extended(extra)?;
        self.session_tools.insert(id, tools);
        Ok(())
    }

    /// Takes session `id`'s own tools away; its calls of them then fail as
    /// not available.
    pub(crate) fn clear_session_tools(&self, id: SessionId) {
        self.session_tools.remove(&id);
    }

    /// Now, in ms since the epoch, on the runtime's clock.
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Admits one more live session of `tenant`, or refuses past the
    /// tenant's quota (a tenant-specific 429, unlike the node-wide 503).
    pub(crate) fn admit_tenant(&self, tenant: &str) -> Result<(), SessionError> {
        let Some(limit) = self.config.limits.max_live_sessions_per_tenant else {
            return Ok(());
        };
        let live = self.tenant_live.get(tenant).map_or(0, |n| *n);
        if live >= limit {
            return Err(SessionError::QuotaExceeded {
                tenant: tenant.to_owned(),
                detail: format!(
                    "{live} sessions of this tenant are live (max_live_sessions_per_tenant = {limit})"
                ),
            });
        }
        Ok(())
    }

    /// Counts a session created by `tenant` today, or refuses past the
    /// tenant's daily quota.
    pub(crate) fn count_creation(&self, tenant: &str) -> Result<(), SessionError> {
        let Some(limit) = self.config.limits.max_sessions_per_tenant_per_day else {
            return Ok(());
        };
        let day = self.now_ms().div_euclid(86_400_000);
        let mut entry = self
            .tenant_created
            .entry(tenant.to_owned())
            .or_insert((day, 0));
        if entry.0 != day {
            *entry = (day, 0);
        }
        if entry.1 >= limit {
            return Err(SessionError::QuotaExceeded {
                tenant: tenant.to_owned(),
                detail: format!(
                    "{} sessions were created by this tenant today (max_sessions_per_tenant_per_day = {limit})",
                    entry.1
                ),
            });
        }
        entry.1 += 1;
        Ok(())
    }

    /// A session actor of `tenant` started (`+1`) or stopped (`-1`).
    pub(crate) fn tenant_live_changed(&self, tenant: &str, started: bool) {
        if started && self.config.idle_hibernate.is_some() {
            // Past the pressure share each new actor shortens the idle time
            // a little: the idle driver reads it again.
            let start = self
                .config
                .idle_pressure
                .start(self.config.limits.max_live_sessions);
            if self.live.len() >= start {
                self.idle.nudge();
            }
        }
        if started {
            *self.tenant_live.entry(tenant.to_owned()).or_insert(0) += 1;
        } else {
            let empty = match self.tenant_live.get_mut(tenant) {
                Some(mut n) => {
                    *n = n.saturating_sub(1);
                    *n == 0
                }
                None => false,
            };
            if empty {
                self.tenant_live.remove_if(tenant, |_, n| *n == 0);
            }
        }
    }

    /// Admits one more live session, or refuses with `Overloaded` at the
    /// limit (and asks idle sessions to hibernate now, at most once a
    /// second, so the refusal is brief).
    pub(crate) fn admit(&self) -> Result<(), SessionError> {
        let limit = self.config.limits.max_live_sessions;
        if self.live.len() < limit {
            return Ok(());
        }
        let now = self.now_ms().max(0) as u64;
        let last = self.last_shed_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1_000
            && self
                .last_shed_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                live = self.live.len(),
                limit,
                "at the live-session limit: hibernating idle sessions early"
            );
            for actor in self.live.iter() {
                let _ = actor.cast(SessionMsg::HibernateIfIdle);
            }
        }
        Err(SessionError::Overloaded {
            reason: format!("{limit} sessions are live (max_live_sessions)"),
            retry_after_secs: 1,
        })
    }

    /// What is held per session now (see [`Bookkeeping`]).
    pub(crate) fn bookkeeping(&self) -> Bookkeeping {
        Bookkeeping {
            live: self.live.len(),
            journal: self.journal.len(),
            timers: self.timers.len(),
            idle: self.idle.len(),
            creating: self.creating.len(),
        }
    }

    /// The context of a transition happening now, for a session whose
    /// model route is `model`.
    pub(crate) fn ctx_for<'a>(&'a self, tools: &'a ToolRegistry, model: &str) -> Ctx<'a> {
        Ctx {
            tools,
            now_ms: self.now_ms(),
            seed: rand_seed(),
            limits: self.config.limits,
            context_window: self.provider.context_window(model),
            compaction_threshold_pct: self.config.compaction_threshold_pct,
        }
    }

    /// [`Runtime::ctx_for`] where no step starts (no window needed).
    pub(crate) fn ctx(&self) -> Ctx<'_> {
        self.ctx_with(&self.tools)
    }

    /// [`Runtime::ctx`] with a session's `tools`.
    pub(crate) fn ctx_with<'a>(&'a self, tools: &'a ToolRegistry) -> Ctx<'a> {
        Ctx {
            context_window: None,
            ..self.ctx_for(tools, "")
        }
    }

    pub(crate) fn orchestrator(&self) -> Result<&ActorRef<OrchestratorMsg>, SessionError> {
        self.orchestrator
            .get()
            .ok_or(SessionError::Internal("the runtime is not started".into()))
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    /// Starts the actor of a checkpointed root session (through the
    /// orchestrator, which guarantees one actor per id).
    /// Also says whether the actor was spawned now (it may have been live).
    pub(crate) async fn spawn_root(
        &self,
        session: Session,
    ) -> Result<(ActorRef<SessionMsg>, bool), SessionError> {
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

    /// The live actor of a session, activating it from its checkpoint if
    /// needed: a root under the orchestrator, a child under its parent.
    pub(crate) async fn activate(
        &self,
        id: SessionId,
    ) -> Result<ActorRef<SessionMsg>, SessionError> {
        self.activate_with(id, Admission::Bypass).await
    }

    /// [`Runtime::activate`], refusing a new activation past the live-session
    /// limit when `admission` says so.
    pub(crate) async fn activate_with(
        &self,
        id: SessionId,
        admission: Admission,
    ) -> Result<ActorRef<SessionMsg>, SessionError> {
        if let Some(r) = self.live.get(&id) {
            return Ok(r.clone());
        }
        // Boxed: waking a session from the store is the rare path and its
        // future is large (~4 KB); inline, every message routed to a live
        // session would allocate and copy it.
        Box::pin(self.activate_from_store(id, admission)).await
    }

    /// The slow path of [`Runtime::activate_with`]: the session is not live.
    async fn activate_from_store(
        &self,
        id: SessionId,
        admission: Admission,
    ) -> Result<ActorRef<SessionMsg>, SessionError> {
        if admission == Admission::Check {
            self.admit()?;
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
        if admission == Admission::Check {
            self.admit_tenant(&stored.header.tenant)?;
        }
        let (actor, spawned) = match stored.header.parent.as_ref().map(|p| p.session_id) {
            Some(parent) => self.activate_child(id, parent).await?,
            None => {
                let stored = self.claimed(id, stored).await?;
                self.spawn_root(Session::from_stored(stored)).await?
            }
        };
        // Racing requests each load the session; only the one whose load
        // became the actor counts.
        if spawned {
            self.metrics.activations.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(crate::metrics::SESSION_ACTIVATIONS_TOTAL).increment(1);
        }
        Ok(actor)
    }

    /// A root about to be activated here, under this node's lease of its
    /// tree (a no-op for a store only this process writes): a lease
    /// taken just now means `stored` may predate the previous owner's last
    /// checkpoint, so the session is read again.
    pub(crate) async fn claimed(
        &self,
        id: SessionId,
        stored: StoredSession,
    ) -> Result<StoredSession, SessionError> {
        if !self.store.claim(id).await? {
            return Ok(stored);
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
        Ok(stored)
    }

    /// Activates a child through its parent's actor (activating the parent,
    /// and so the path up to the root, first). A child whose parent will
    /// never resume it is an orphan: it is cancelled, never run on its own.
    async fn activate_child(
        &self,
        id: SessionId,
        parent: SessionId,
    ) -> Result<(ActorRef<SessionMsg>, bool), SessionError> {
        for _ in 0..2 {
            let parent_ref = match Box::pin(self.activate(parent)).await {
                Ok(r) => r,
                Err(SessionError::Terminal { .. } | SessionError::NotFound(_)) => {
                    return Err(self.cancel_orphan(id).await);
                }
                Err(e) => return Err(e),
            };
            match parent_ref
                .call(
                    |reply| SessionMsg::ActivateChild(id, reply),
                    Some(self.config.call_timeout),
                )
                .await
            {
                Ok(CallResult::Success(Ok(child))) => return Ok(child),
                Ok(CallResult::Success(Err(SessionError::NotFound(_)))) => {
                    // The parent runs no call that started this child.
                    return Err(self.cancel_orphan(id).await);
                }
                Ok(CallResult::Success(Err(e))) => return Err(e),
                Ok(CallResult::Timeout) => {
                    return Err(SessionError::Unavailable {
                        id,
                        reason: "its parent session did not answer in time".into(),
                    })
                }
                // The parent is draining or stopping: wait for it, then
                // activate it afresh.
                Ok(CallResult::SenderError) | Err(_) => {
                    self.await_stopped(parent, &parent_ref).await
                }
            }
        }
        Err(SessionError::Unavailable {
            id,
            reason: "its parent session is restarting".into(),
        })
    }

    /// Cancels an orphaned child in the store (through the orchestrator, which
    /// serialises it with every other activation) and returns the error the
    /// caller gets: the session is cancelled.
    async fn cancel_orphan(&self, id: SessionId) -> SessionError {
        let result = match self.orchestrator() {
            Ok(o) => o
                .call(
                    |reply| OrchestratorMsg::CancelOrphan(id, reply),
                    Some(self.config.call_timeout),
                )
                .await
                .ok(),
            Err(e) => return e,
        };
        match result {
            Some(CallResult::Success(Ok(()))) => SessionError::Terminal {
                id,
                status: crate::model::SessionStatus::Cancelled,
            },
            Some(CallResult::Success(Err(e))) => e,
            _ => SessionError::Unavailable {
                id,
                reason: "the orchestrator did not answer".into(),
            },
        }
    }

    /// Cancels a session in the store, without an actor, leaving no call
    /// non-terminal, and publishes its events. Its children, if any, are
    /// orphans in turn and are cancelled when next touched or at recovery.
    pub(crate) async fn cancel_in_store(&self, id: SessionId) -> Result<(), SessionError> {
        let Some(stored) = self.store.load(id).await? else {
            return Ok(());
        };
        if stored.header.status.is_terminal() {
            return Ok(());
        }
        let mut session = Session::from_stored(stored);
        let effects = session.apply(Input::Cancel, self.ctx())?;
        self.persist_without_actor(&mut session).await?;
        // The subtree goes with it: nobody else would ever resume it.
        for effect in effects {
            if let crate::machine::Effect::CancelChild(child) = effect {
                if self.live.contains_key(&child) {
                    continue; // a live child is its live parent's to cancel
                }
                Box::pin(self.cancel_in_store(child)).await?;
            }
        }
        Ok(())
    }

    /// Sends a request to a session (activating it) and waits for its answer.
    pub(crate) async fn route<F>(&self, id: SessionId, make: F) -> Result<(), SessionError>
    where
        F: Fn(RpcReplyPort<Result<(), SessionError>>) -> SessionMsg,
    {
        // One retry, only when the message was never delivered (the actor had
        // just stopped): a delivered request is never sent twice.
        for _ in 0..2 {
            let actor = self.activate_with(id, Admission::Check).await?;
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
    pub(crate) async fn deliver(
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
    pub(crate) async fn await_stopped(&self, id: SessionId, actor: &ActorRef<SessionMsg>) {
        if actor.wait(Some(self.config.call_timeout)).await.is_err() {
            tracing::warn!(session_id = %id, "a stopping session actor did not stop in time");
        }
        let stale = actor.get_id();
        self.live.remove_if(&id, |_, r| r.get_id() == stale);
    }

    /// Activates a session again once `old` (its actor, which stopped with
    /// work in flight, e.g. a request queued behind its hibernation) is gone.
    pub(crate) fn wake_after(self: &Arc<Self>, id: SessionId, old: ActorRef<SessionMsg>) {
        let rt = Arc::downgrade(self);
        tokio::spawn(async move {
            let Some(rt) = rt.upgrade() else { return };
            rt.await_stopped(id, &old).await;
            if rt.is_shutting_down() {
                return;
            }
            if let Err(e) = rt.activate(id).await {
                tracing::error!(session_id = %id, "could not resume a stopped session: {e}");
            }
        });
    }

    /// Boot recovery of a root that only waits for decisions: arms its
    /// approval timers and counts its approvals, as its actor's resume
    /// would, and leaves it on disk. `false` (nothing done) when the
    /// session needs its actor to resume.
    pub(crate) fn recover_parked(self: &Arc<Self>, session: &Resumable) -> bool {
        let Some(timers) = crate::machine::resume_of_parked(session, self.now_ms()) else {
            return false;
        };
        let mut pending = 0;
        for timer in timers {
            if let Effect::ArmApprovalTimer {
                call_id,
                deadline_ms,
                after,
            } = timer
            {
                self.arm_approval_timer(session.id, call_id, deadline_ms, after);
                pending += 1;
            }
        }
        crate::metrics::set_pending(session.id, pending);
        true
    }

    /// Session `id`'s actor is idle from now, after its message number
    /// `activity`: it is asked to hibernate once idle for the idle time of
    /// the moment (`idle_hibernate`, shortened under pressure, see
    /// [`crate::limits::IdlePressure`]) by the runtime's one idle driver.
    pub(crate) fn arm_idle(
        self: &Arc<Self>,
        id: SessionId,
        actor: ActorRef<SessionMsg>,
        activity: u64,
    ) {
        if !self.times_idleness() {
            return;
        }
        let idle = self.config.idle_hibernate;
        let rest = self.delays_rest().then_some(self.config.rest_after);
        self.idle.start(|| {
            let rt = Arc::downgrade(self);
            Box::new(move || {
                let rt = rt.upgrade()?;
                Some(IdleLook {
                    live: rt.live.len(),
                    limit: rt.config.limits.max_live_sessions,
                    idle,
                    rest,
                    pressure: rt.config.idle_pressure,
                })
            })
        });
        self.idle
            .arm(id, actor, activity, tokio::time::Instant::now());
    }

    /// Whether an idle session's actor is timed: it hibernates after the
    /// idle time, or rests after a delay.
    pub(crate) fn times_idleness(&self) -> bool {
        self.config.idle_hibernate.is_some() || self.delays_rest()
    }

    /// Whether sessions rest after a delay, asked by the idle driver: only
    /// where they rest at all (a local store, see
    /// `CheckpointStore::reads_are_local`).
    fn delays_rest(&self) -> bool {
        !self.config.rest_after.is_zero() && self.store.reads_are_local()
    }

    /// Arms the approval timer of a call (see [`crate::timers`]): it fires
    /// through [`Runtime::deliver`], which activates the session if needed.
    pub(crate) fn arm_approval_timer(
        self: &Arc<Self>,
        id: SessionId,
        call_id: ToolCallId,
        deadline_ms: i64,
        after: Duration,
    ) {
        if self.timers.is_armed(id, &call_id, deadline_ms) {
            return;
        }
        self.timers.start(|| {
            let rt = Arc::downgrade(self);
            Box::new(move |due: Due| {
                // A runtime that was shut down has nobody to deliver to.
                let Some(rt) = rt.upgrade() else { return };
                // Delivering may activate the session from disk: its own
                // task, so that one slow activation holds up no other timer.
                tokio::spawn(async move {
                    let Due {
                        session,
                        call,
                        deadline_ms,
                    } = due;
                    let delivered = rt
                        .deliver(session, || SessionMsg::ApprovalTimeout {
                            call_id: call.clone(),
                            deadline_ms,
                        })
                        .await;
                    if let Err(e) = delivered {
                        tracing::debug!(session_id = %session, "approval timer not delivered: {e}");
                    }
                });
            })
        });
        self.timers.arm(
            id,
            call_id,
            deadline_ms,
            tokio::time::Instant::now() + after,
        );
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
        if session.header.status.is_terminal() {
            return Ok(Some(session));
        }
        session.apply(
            Input::Fail {
                reason: reason.to_owned(),
            },
            self.ctx(),
        )?;
        self.persist_without_actor(&mut session).await?;
        Ok(Some(session))
    }

    /// Checkpoints a transition made with no actor holding the session, and
    /// drops what the runtime held for it if it ended.
    async fn persist_without_actor(&self, session: &mut Session) -> Result<(), SessionError> {
        let id = session.header.id;
        crate::metrics::checkpoint(self.store.as_ref(), session.checkpoint()).await?;
        // No actor holds this session now: its approvals, closed here, leave
        // the gauge here.
        crate::metrics::set_pending(id, session.pending_approvals().len());
        for event in session.mark_persisted() {
            self.hub.publish(id, Notification::Event(event));
        }
        if session.header.status.is_terminal() {
            self.forget(id);
        }
        Ok(())
    }

    /// Drops everything held in memory for a session that ended.
    pub(crate) fn forget(&self, id: SessionId) {
        self.journal.forget_session(id);
        self.timers.disarm_session(id);
    }

    /// The shared half of supervision, for the orchestrator (roots) and
    /// every session actor (its children): decide about a failure of `id`,
    /// and past the limit record the session as failed. The caller schedules
    /// the restart, or reports the failed session to whoever waits for it.
    ///
    /// A failure the store caused while it was down (`store_down`) is not
    /// the session's: it is retried at the longest backoff, uncounted, until
    /// the store serves again, instead of using up the restarts and failing
    /// the session for good over a full disk.
    pub(crate) async fn on_actor_failed(
        &self,
        restarts: &mut Restarts,
        id: SessionId,
        reason: &str,
        store_down: bool,
    ) -> AfterFailure {
        if store_down {
            let after = Duration::from_millis(self.config.restart.backoff_max_ms)
                .max(crate::supervision::STORE_DOWN_RETRY);
            return AfterFailure::RestartAfter(after);
        }
        match restarts.on_failure(&self.config.restart, id) {
            Decision::Restart(after) => {
                self.metrics.restarts.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(crate::metrics::SESSION_RESTARTS_TOTAL).increment(1);
                AfterFailure::RestartAfter(after)
            }
            Decision::GiveUp => {
                let why = format!("restart limit exceeded: {reason}");
                let failed = self.fail_session(id, &why).await.map(|s| s.map(Box::new));
                if let Err(e) = &failed {
                    tracing::error!(session_id = %id, "could not record the failure: {e}");
                }
                AfterFailure::GaveUp { why, failed }
            }
        }
    }
}

/// What a supervisor does after [`Runtime::on_actor_failed`].
pub(crate) enum AfterFailure {
    /// Respawn from the last checkpoint after this backoff.
    RestartAfter(Duration),
    /// The limit is exceeded: the session is failed (as recorded, when the
    /// store took it).
    GaveUp {
        /// The failure as recorded.
        why: String,
        /// The failed session, `None` if it has no checkpoint.
        failed: Result<Option<Box<Session>>, SessionError>,
    },
}

/// 64 bits of entropy for the ids a transition mints (the machine itself
/// reads no randomness, see [`Ctx::seed`]).
fn rand_seed() -> u64 {
    let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
    hi ^ lo
}
