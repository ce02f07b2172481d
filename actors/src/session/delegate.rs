//! The session actor's side of delegation: starting, resuming,
//! activating, supervising and cancelling child sessions, and a child's
//! reports to its parent.
//!
//! A child session is an ordinary session actor, spawned linked to its
//! parent's actor (so the parent supervises it and restarts it from its own
//! checkpoint), with its own id, checkpoints and events. Only its parent ever
//! spawns it: on the parent's resume, on a request routed to the child
//! (`ActivateChild`), after a crash. It runs one turn and reports its result;
//! the parent's `delegate_task` call completes with it. Reports are not
//! trusted to arrive: whenever a child's actor stops, the parent reads the
//! child's checkpoint and acts on what it says (finished: its result;
//! waiting for a human: leave it on disk; mid-turn: spawn it again), so no
//! child result is ever lost while its parent lives, and a parent that is
//! re-activated does the same for every child on its resume. This module
//! deliberately holds no rules: which calls delegate, the depth and fan-out
//! limits and budgets are decided by the pure machine.

use std::sync::Arc;

use ractor::{Actor, ActorRef, RpcReplyPort};
use serde_json::Value;

use super::{Child, SessionActor, SessionArgs, SessionMsg, SessionState};
use crate::delegation::{child_result, spawns_child, DelegateArgs};
use crate::error::SessionError;
use crate::machine::{Input, Session};
use crate::model::{
    ApprovalPolicy, Budget, CallState, ChildApproval, ParentLink, SessionHeader, SessionId,
    SessionStatus, ToolCallId, TranscriptEntry, Usage,
};
use crate::runtime::{AfterFailure, Runtime};
use crate::skills::{ACTIVATE_SKILL, READ_SKILL_RESOURCE};
use crate::tasks::RUN_TASK;

/// What a finished (or failed) child reports to its parent.
pub(super) fn report_of(session: &Session) -> (Result<Value, Value>, Usage) {
    let h = &session.header;
    let final_text = session
        .transcript
        .iter()
        .rev()
        .find_map(|e| match e.as_ref() {
            TranscriptEntry::Assistant { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .unwrap_or("");
    let failure = match h.status {
        SessionStatus::Failed => Some(h.error.clone().unwrap_or_else(|| "failed".into())),
        SessionStatus::Cancelled => Some("cancelled".to_owned()),
        _ => None,
    };
    let usage = session.spent();
    let mut result = child_result(
        h.id,
        &h.agent,
        final_text,
        h.output.as_ref(),
        h.last_stop_reason,
        usage,
        failure.as_deref(),
    );
    // A stored task's run says which task it was.
    if let Some(task) = &h.task {
        if let Ok(Value::Object(m)) | Err(Value::Object(m)) = &mut result {
            m.insert("task".into(), Value::String(task.clone()));
        }
    }
    (result, usage)
}

/// Builds a new child session for a `delegate_task` call: the child's tools
/// are its agent's tools intersected with the parent's scope; its budget is
/// its agent's, capped by what the parent has left.
pub(super) fn new_child(
    runtime: &Runtime,
    parent: &SessionHeader,
    call_id: &ToolCallId,
    attempt: u32,
    child: SessionId,
    args: &DelegateArgs,
    grant: Budget,
) -> Result<Session, SessionError> {
    let plan = ChildPlan {
        agent: args.agent.clone(),
        message: args.first_message(),
        max_steps: args.max_steps,
        ..ChildPlan::default()
    };
    build_child(runtime, parent, call_id, attempt, child, plan, grant)
}

/// What a child runs: its agent, first message, and what a stored task
/// adds: its output schema, its skills (activated before the first
/// message), its id.
#[derive(Debug, Default)]
pub(super) struct ChildPlan {
    pub(super) agent: String,
    pub(super) message: String,
    pub(super) max_steps: Option<u32>,
    pub(super) output_schema: Option<Value>,
    pub(super) task: Option<String>,
    pub(super) skills: Vec<String>,
}

/// Builds a new child session under delegation's rules: the child's
/// tools, skills and tasks are its agent's intersected with the parent's;
/// its budget is its agent's, capped by what the parent has left.
pub(super) fn build_child(
    runtime: &Runtime,
    parent: &SessionHeader,
    call_id: &ToolCallId,
    attempt: u32,
    child: SessionId,
    plan: ChildPlan,
    grant: Budget,
) -> Result<Session, SessionError> {
    let agent = runtime
        .agents
        .get(&plan.agent)
        .ok_or_else(|| SessionError::UnknownAgent(plan.agent.clone()))?;
    let mut config = agent.effective();
    config.route = runtime.provider.describe_route(&config.model);
    for skill in &plan.skills {
        if !config.skills.contains(skill) {
            config.skills.push(skill.clone());
        }
    }
    if !config.skills.is_empty() {
        for t in [ACTIVATE_SKILL, READ_SKILL_RESOURCE] {
            if !config.tools.iter().any(|x| x == t) {
                config.tools.push(t.to_owned());
            }
        }
    }
    config
        .tools
        .retain(|t| parent.config.tools.iter().any(|p| p == t));
    config
        .skills
        .retain(|s| parent.config.skills.iter().any(|p| p == s));
    config
        .tasks
        .retain(|t| parent.config.tasks.iter().any(|p| p == t));
    if let Some(schema) = plan.output_schema {
        config.output_schema = Some(schema);
    }
    runtime.library.describe(&mut config);
    if parent.config.child_approval == ChildApproval::AutoApprove {
        config.approval = ApprovalPolicy::Auto;
    }
    if let Some(steps) = plan.max_steps {
        config.max_steps = config.max_steps.min(steps.max(1));
    }
    config.budget = config.budget.min(grant);
    // The root's depth limit bounds the whole tree.
    config.max_delegation_depth = config
        .max_delegation_depth
        .min(parent.config.max_delegation_depth);
    let ctx = runtime.ctx();
    let depth = parent.parent.as_ref().map_or(0, |p| p.depth) + 1;
    let mut header = SessionHeader::new(
        child,
        parent.tenant.clone(),
        agent.name.clone(),
        config,
        ctx.now_ms,
    );
    header.created_by = parent.created_by.clone();
    header.parent = Some(ParentLink {
        session_id: parent.id,
        call_id: call_id.clone(),
        attempt,
        depth,
        propagate: parent.config.child_approval == ChildApproval::Propagate,
    });
    header.root_id = parent.root_id;
    // A child runs one turn.
    header.auto_complete = true;
    header.task = plan.task.clone();
    let mut session = Session::new(header);
    for name in &plan.skills {
        if let Some(skill) = runtime.library.skills.get(name) {
            session.apply(
                Input::ActivateSkill {
                    name: name.clone(),
                    body: skill.body.clone(),
                    by: plan.task.as_ref().map(|t| format!("task:{t}")),
                },
                ctx,
            )?;
        }
    }
    session.apply(
        Input::Message {
            message_id: None,
            text: plan.message,
        },
        ctx,
    )?;
    Ok(session)
}

/// The parent's running `delegate_task` (or `run_task`) call that started
/// `child`.
pub(super) struct RunningCall {
    pub(super) call_id: ToolCallId,
    pub(super) attempt: u32,
    pub(super) agent: String,
    /// For `run_task`: the task.
    pub(super) task: Option<String>,
}

impl SessionState {
    fn running_call_of(&self, child: SessionId) -> Option<RunningCall> {
        self.session.header.open_calls.iter().find_map(|c| {
            (spawns_child(&c.name) && c.state == CallState::Running && c.child == Some(child)).then(
                || {
                    let arg = |k: &str| c.run_arguments().get(k).and_then(Value::as_str);
                    RunningCall {
                        call_id: c.id.clone(),
                        attempt: c.attempt,
                        agent: arg("agent").unwrap_or("subagent").to_owned(),
                        task: (c.name == RUN_TASK)
                            .then(|| arg("task").unwrap_or_default().to_owned()),
                    }
                },
            )
        })
    }

    pub(super) fn live_child(&self, child: SessionId) -> Option<ActorRef<SessionMsg>> {
        self.children
            .values()
            .find(|c| c.id == child)
            .map(|c| c.actor.clone())
    }

    pub(super) fn forget_child_actor(&self, child: &Child) {
        let stale = child.actor.get_id();
        self.runtime
            .live
            .remove_if(&child.id, |_, r| r.get_id() == stale);
    }

    /// Reports a child's outcome to ourselves (see `report_to_self`).
    fn child_report(
        &self,
        myself: &ActorRef<SessionMsg>,
        call: &RunningCall,
        result: Result<Value, Value>,
        usage: Usage,
    ) {
        self.report_to_self(
            myself,
            SessionMsg::ChildFinished {
                call_id: call.call_id.clone(),
                attempt: call.attempt,
                result,
                usage,
            },
        );
    }

    /// A child could not be started or resumed: the call fails visibly, with
    /// the reason, and the parent goes on.
    pub(super) fn child_failed(
        &self,
        myself: &ActorRef<SessionMsg>,
        call: &RunningCall,
        child: SessionId,
        reason: &str,
    ) {
        tracing::warn!(session_id = %child, "subagent failed: {reason}");
        if let Some(task) = &call.task {
            // Nothing ran: the model is told why, in the task's terms.
            let result = Err(serde_json::json!({
                "task": task,
                "error": format!("task '{task}' could not run: {reason}"),
            }));
            return self.child_report(myself, call, result, Usage::default());
        }
        let result = child_result(
            child,
            &call.agent,
            "",
            None,
            None,
            Usage::default(),
            Some(reason),
        );
        self.child_report(myself, call, result, Usage::default());
    }

    /// Starts the child of a `delegate_task` call, or resumes it from its
    /// checkpoint, or (if it already finished) reports its result at once.
    pub(super) async fn delegate(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        call_id: ToolCallId,
        attempt: u32,
        child: SessionId,
        args: DelegateArgs,
        grant: Budget,
    ) {
        if self.live_child(child).is_some() {
            return;
        }
        let call = RunningCall {
            call_id,
            attempt,
            agent: args.agent.clone(),
            task: None,
        };
        self.start_child(myself, call, child, |runtime, parent, call| {
            new_child(runtime, parent, &call.call_id, attempt, child, &args, grant)
        })
        .await
    }

    /// Starts the child of a call: resumes it from its checkpoint if it
    /// exists, else makes it with `make`, checkpoints it and spawns it.
    pub(super) async fn start_child(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        call: RunningCall,
        child: SessionId,
        make: impl FnOnce(&Runtime, &SessionHeader, &RunningCall) -> Result<Session, SessionError>,
    ) {
        match self.runtime.store.load_header(child).await {
            Ok(Some(_)) => {
                if let Err(e) = self.resume_child(myself, child, false).await {
                    self.child_failed(myself, &call, child, &e.to_string());
                }
            }
            Ok(None) => {
                let created = make(&self.runtime, &self.session.header, &call);
                let mut session = match created {
                    Ok(mut s) => {
                        // The child's turns run under this call's span.
                        let parent = self.genai.delegation(&call.call_id, &call.agent);
                        s.header.trace = parent.map(|p| crate::model::TraceLink {
                            parent: Some(p),
                            turn: None,
                        });
                        s
                    }
                    Err(e) => return self.child_failed(myself, &call, child, &e.to_string()),
                };
                if let Err(e) =
                    crate::metrics::checkpoint(self.runtime.store.as_ref(), session.checkpoint())
                        .await
                {
                    return self.child_failed(myself, &call, child, &e.to_string());
                }
                for e in session.mark_persisted() {
                    self.runtime
                        .hub
                        .publish(child, crate::model::Notification::Event(e));
                }
                if let Err(e) = self.spawn_child(myself, session).await {
                    self.child_failed(myself, &call, child, &e.to_string());
                }
            }
            Err(e) => self.child_failed(myself, &call, child, &e.to_string()),
        }
    }

    /// Brings a child of a running call to what its checkpoint says: a
    /// finished child's result is reported; a child that waits for a human is
    /// left on disk when `only_if_busy` (its waiting is recorded here);
    /// otherwise it is spawned. Returns its actor if it is live now.
    async fn resume_child(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        child: SessionId,
        only_if_busy: bool,
    ) -> Result<Option<ActorRef<SessionMsg>>, SessionError> {
        if let Some(actor) = self.live_child(child) {
            return Ok(Some(actor));
        }
        let Some(call) = self.running_call_of(child) else {
            return Ok(None);
        };
        let Some(stored) = self.runtime.store.load(child).await? else {
            return Err(SessionError::Internal(format!(
                "the checkpoint of subagent session {child} is missing"
            )));
        };
        let session = Session::from_stored(stored);
        if session.header.status.is_terminal() {
            let (result, usage) = report_of(&session);
            self.child_report(myself, &call, result, usage);
            return Ok(None);
        }
        if only_if_busy && session.is_settled() {
            let propagate = session.header.parent.as_ref().is_some_and(|p| p.propagate);
            if propagate {
                self.report_to_self(
                    myself,
                    SessionMsg::ChildWaiting {
                        call_id: call.call_id,
                        waiting: session.header.status == SessionStatus::AwaitingApproval,
                    },
                );
            }
            return Ok(None);
        }
        let mut session = session;
        // The child's resumed turn goes under this actor's span of the call
        // (the one it was started under may be gone with a process).
        if let Some(parent) = self.genai.delegation(&call.call_id, &call.agent) {
            session
                .header
                .trace
                .get_or_insert_with(Default::default)
                .parent = Some(parent);
        }
        self.spawn_child(myself, session).await.map(Some)
    }

    async fn spawn_child(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        session: Session,
    ) -> Result<ActorRef<SessionMsg>, SessionError> {
        let id = session.header.id;
        let args = SessionArgs {
            session,
            runtime: Arc::clone(&self.runtime),
            parent: Some(myself.clone()),
        };
        match Actor::spawn_linked(None, SessionActor, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                self.children.insert(
                    actor.get_id(),
                    Child {
                        id,
                        actor: actor.clone(),
                    },
                );
                self.runtime.live.insert(id, actor.clone());
                Ok(actor)
            }
            Err(e) => Err(SessionError::Unavailable {
                id,
                reason: format!("could not start the child session: {e}"),
            }),
        }
    }

    /// Answers a request, routed here by the runtime, for the live actor of
    /// one of our children.
    pub(super) async fn activate_child(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        child: SessionId,
        reply: RpcReplyPort<Result<(ActorRef<SessionMsg>, bool), SessionError>>,
    ) {
        if self.draining {
            // Dropping the port tells the caller we are going: it waits for
            // this actor to stop and activates a fresh one.
            drop(reply);
            return;
        }
        if self.running_call_of(child).is_none() {
            let _ = reply.send(Err(SessionError::NotFound(child)));
            return;
        }
        let was_live = self.live_child(child).is_some();
        let answer = match self.resume_child(myself, child, false).await {
            Ok(Some(actor)) => Ok((actor, !was_live)),
            // It had finished: its result is on its way to us.
            Ok(None) => Err(SessionError::Terminal {
                id: child,
                status: SessionStatus::Completed,
            }),
            Err(e) => Err(e),
        };
        let _ = reply.send(answer);
    }

    /// Cancels a child as part of our own cancel: a live one by a
    /// message, one on disk in the store (nobody else may run it).
    pub(super) async fn cancel_child(&mut self, child: SessionId) {
        match self.live_child(child) {
            Some(actor) => {
                if actor.cast(SessionMsg::CancelFromParent).is_err() {
                    tracing::warn!(session_id = %child, "child stopped before its cancel; cancelling it on disk");
                    if let Err(e) = self.runtime.cancel_in_store(child).await {
                        tracing::error!(session_id = %child, "could not cancel the child: {e}");
                    }
                }
            }
            None => {
                if let Err(e) = self.runtime.cancel_in_store(child).await {
                    tracing::error!(session_id = %child, "could not cancel the child: {e}");
                }
            }
        }
    }

    /// A child's actor stopped normally (it finished, or hibernated, or was
    /// drained with work queued): act on its checkpoint.
    pub(super) async fn child_stopped(&mut self, myself: &ActorRef<SessionMsg>, child: SessionId) {
        self.child_restarts.forget(&child);
        if self.runtime.is_shutting_down() {
            return;
        }
        if let Err(e) = self.resume_child(myself, child, true).await {
            let down = crate::supervision::store_down_error(&e);
            Box::pin(self.on_child_failed(myself, child, format!("resume failed: {e}"), down))
                .await;
        }
    }

    /// A child session actor failed: restart it from its checkpoint under the
    /// restart policy, or fail it and let the parent go on.
    pub(super) async fn on_child_failed(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        child: SessionId,
        reason: String,
        store_down: bool,
    ) {
        let Some(call) = self.running_call_of(child) else {
            // Its call is no longer running (cancelled): nothing to resume.
            self.child_restarts.forget(&child);
            return;
        };
        match self
            .runtime
            .on_actor_failed(&mut self.child_restarts, child, &reason, store_down)
            .await
        {
            AfterFailure::RestartAfter(after) => {
                myself.send_after(after, move || SessionMsg::RestartChild(child));
            }
            AfterFailure::GaveUp { why, failed } => match failed {
                Ok(Some(session)) => {
                    let (result, usage) = report_of(&session);
                    self.child_report(myself, &call, result, usage);
                }
                Ok(None) | Err(_) => self.child_failed(myself, &call, child, &why),
            },
        }
    }

    /// Respawns a failed child from its last checkpoint (after the backoff).
    pub(super) async fn restart_child(&mut self, myself: &ActorRef<SessionMsg>, child: SessionId) {
        if self.live_child(child).is_some() {
            return;
        }
        let Some(call) = self.running_call_of(child) else {
            self.child_restarts.forget(&child);
            return;
        };
        tracing::info!(session_id = %child, "restarting child session");
        match self.resume_child(myself, child, false).await {
            Ok(_) => {}
            Err(SessionError::Internal(missing)) => {
                self.child_failed(myself, &call, child, &missing)
            }
            // A respawn that fails counts as another failure.
            Err(e) => {
                let down = crate::supervision::store_down_error(&e);
                Box::pin(self.on_child_failed(myself, child, format!("restart failed: {e}"), down))
                    .await
            }
        }
    }

    /// After a transition of a child session: tell the parent when the turn
    /// ended, and when a propagating child starts or stops waiting. A report
    /// that cannot be sent is not lost: the parent reads this session's
    /// checkpoint when its actor stops (see the module docs).
    pub(super) fn report_to_parent(&self, before: SessionStatus) {
        let (Some(parent), Some(link)) = (&self.parent, &self.session.header.parent) else {
            return;
        };
        let now = self.session.header.status;
        let active = |s: SessionStatus| {
            matches!(s, SessionStatus::Running | SessionStatus::AwaitingApproval)
        };
        let waiting = |s: SessionStatus| s == SessionStatus::AwaitingApproval;
        let msg = if active(before) && !active(now) {
            let (result, usage) = report_of(&self.session);
            SessionMsg::ChildFinished {
                call_id: link.call_id.clone(),
                attempt: link.attempt,
                result,
                usage,
            }
        } else if link.propagate && waiting(before) != waiting(now) {
            SessionMsg::ChildWaiting {
                call_id: link.call_id.clone(),
                waiting: waiting(now),
            }
        } else {
            return;
        };
        if parent.cast(msg).is_err() {
            tracing::warn!(
                session_id = %self.session.header.id,
                "the parent session stopped before this report; it reads the checkpoint instead"
            );
        }
    }
}
