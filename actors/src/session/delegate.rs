//! The session actor's side of delegation (§7): starting, resuming,
//! supervising and cancelling child sessions, and a child's reports to its
//! parent.
//!
//! A child session is an ordinary session actor, spawned linked to its
//! parent's actor (so the parent supervises it and restarts it from its own
//! checkpoint), with its own id, checkpoints and events. It runs one turn and
//! reports its result; the parent's `delegate_task` call completes with it.
//! This module deliberately holds no rules: which calls delegate, the depth
//! and fan-out limits and budgets are decided by the pure machine.

use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorRef};
use serde_json::Value;

use super::machine::{Ctx, Input, Session};
use super::{SessionActor, SessionArgs, SessionMsg, SessionState};
use crate::delegation::{child_result, DelegateArgs};
use crate::error::SessionError;
use crate::model::{
    now_ms, ApprovalPolicy, Budget, ChildApproval, ParentLink, SessionHeader, SessionId,
    SessionStatus, ToolCallId, TranscriptEntry, Usage, SCHEMA_VERSION,
};
use crate::runtime::Runtime;
use crate::supervision::Decision;

/// What a finished (or failed) child reports to its parent.
pub(crate) fn report_of(session: &Session) -> (Result<Value, Value>, Usage) {
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
    (
        child_result(
            h.id,
            &h.agent,
            final_text,
            h.last_stop_reason,
            usage,
            failure.as_deref(),
        ),
        usage,
    )
}

/// Builds a new child session for a `delegate_task` call: the child's tools
/// are its agent's tools intersected with the parent's scope; its budget is
/// its agent's, capped by what the parent has left.
pub(crate) fn new_child(
    runtime: &Runtime,
    parent: &SessionHeader,
    call_id: &ToolCallId,
    attempt: u32,
    child: SessionId,
    args: &DelegateArgs,
    grant: Budget,
) -> Result<Session, SessionError> {
    let agent = runtime
        .agents
        .get(&args.agent)
        .ok_or_else(|| SessionError::UnknownAgent(args.agent.clone()))?;
    let mut config = agent.effective();
    config
        .tools
        .retain(|t| parent.config.tools.iter().any(|p| p == t));
    if parent.config.child_approval == ChildApproval::AutoApprove {
        config.approval = ApprovalPolicy::Auto;
    }
    if let Some(steps) = args.max_steps {
        config.max_steps = config.max_steps.min(steps.max(1));
    }
    config.budget = config.budget.min(grant);
    // The root's depth limit bounds the whole tree.
    config.max_delegation_depth = config
        .max_delegation_depth
        .min(parent.config.max_delegation_depth);
    let now = now_ms();
    let depth = parent.parent.as_ref().map_or(0, |p| p.depth) + 1;
    let header = SessionHeader {
        schema_version: SCHEMA_VERSION,
        id: child,
        tenant: parent.tenant.clone(),
        created_by: parent.created_by.clone(),
        agent: agent.name.clone(),
        title: None,
        metadata: Value::Null,
        parent: Some(ParentLink {
            session_id: parent.id,
            call_id: call_id.clone(),
            attempt,
            depth,
            propagate: parent.config.child_approval == ChildApproval::Propagate,
        }),
        root_id: parent.root_id,
        status: SessionStatus::Pending,
        created_at_ms: now,
        updated_at_ms: now,
        // A child runs one turn (§7).
        auto_complete: true,
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
    session.apply(
        Input::Message {
            message_id: None,
            text: args.first_message(),
        },
        Ctx {
            tools: &runtime.tools,
            now_ms: now,
        },
    )?;
    Ok(session)
}

impl SessionState {
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
        if let Some(live) = self.runtime.live.get(&child).map(|r| r.clone()) {
            if live.get_status() != ractor::ActorStatus::Stopped {
                return; // still running (e.g. activated by a request meanwhile)
            }
            self.runtime
                .live
                .remove_if(&child, |_, r| r.get_id() == live.get_id());
        }
        let session = match self.runtime.store.load(child).await {
            Ok(Some(stored)) => Session::from_stored(stored),
            Ok(None) => {
                match new_child(
                    &self.runtime,
                    &self.session.header,
                    &call_id,
                    attempt,
                    child,
                    &args,
                    grant,
                ) {
                    Ok(s) => {
                        let mut s = s;
                        if let Err(e) =
                            crate::metrics::checkpoint(self.runtime.store.as_ref(), s.checkpoint())
                                .await
                        {
                            self.child_failed(myself, &call_id, attempt, child, &e.to_string());
                            return;
                        }
                        for e in s.mark_persisted() {
                            self.runtime
                                .hub
                                .publish(child, crate::model::Notification::Event(e));
                        }
                        s
                    }
                    Err(e) => {
                        self.child_failed(myself, &call_id, attempt, child, &e.to_string());
                        return;
                    }
                }
            }
            Err(e) => {
                self.child_failed(myself, &call_id, attempt, child, &e.to_string());
                return;
            }
        };
        if session.header.status.is_terminal() {
            let (result, usage) = report_of(&session);
            let _ = myself.cast(SessionMsg::ChildFinished {
                call_id,
                attempt,
                result,
                usage,
            });
            return;
        }
        self.spawn_child(myself, session).await;
    }

    async fn spawn_child(&mut self, myself: &ActorRef<SessionMsg>, session: Session) {
        let Some(link) = session.header.parent.clone() else {
            return;
        };
        let id = session.header.id;
        let args = SessionArgs {
            session,
            runtime: Arc::clone(&self.runtime),
        };
        match Actor::spawn_linked(None, SessionActor, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                self.children
                    .insert(actor.get_id(), (id, link.call_id, link.attempt));
                self.runtime.live.insert(id, actor);
            }
            Err(e) => {
                let reason = format!("could not start the child session: {e}");
                self.child_failed(myself, &link.call_id, link.attempt, id, &reason);
            }
        }
    }

    fn child_failed(
        &self,
        myself: &ActorRef<SessionMsg>,
        call_id: &ToolCallId,
        attempt: u32,
        child: SessionId,
        reason: &str,
    ) {
        let agent = "subagent";
        let _ = myself.cast(SessionMsg::ChildFinished {
            call_id: call_id.clone(),
            attempt,
            result: child_result(child, agent, "", None, Usage::default(), Some(reason)),
            usage: Usage::default(),
        });
    }

    /// A child session actor failed: restart it from its checkpoint under the
    /// policy of §10, or fail it and let the parent go on.
    pub(super) async fn on_child_failed(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        cell: &ActorCell,
        reason: String,
    ) {
        let Some((child, call_id, attempt)) = self.children.remove(&cell.get_id()) else {
            return;
        };
        let stale = cell.get_id();
        self.runtime
            .live
            .remove_if(&child, |_, r| r.get_id() == stale);
        let now = self.epoch.elapsed().as_millis() as u64;
        let decision = self
            .child_restarts
            .entry(child)
            .or_default()
            .decide(&self.runtime.config.restart, now);
        match decision {
            Decision::Restart(after) => {
                self.runtime
                    .metrics
                    .restarts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                metrics::counter!(crate::metrics::SESSION_RESTARTS_TOTAL).increment(1);
                myself.send_after(after, move || SessionMsg::RestartChild(child));
            }
            Decision::GiveUp => {
                self.child_restarts.remove(&child);
                let why = format!("restart limit exceeded: {reason}");
                match self.runtime.fail_session(child, &why).await {
                    Ok(Some(failed)) => {
                        let (result, usage) = report_of(&failed);
                        let _ = myself.cast(SessionMsg::ChildFinished {
                            call_id,
                            attempt,
                            result,
                            usage,
                        });
                    }
                    _ => self.child_failed(myself, &call_id, attempt, child, &why),
                }
            }
        }
    }

    /// Respawns a failed child from its last checkpoint (after the backoff).
    pub(super) async fn restart_child(&mut self, myself: &ActorRef<SessionMsg>, child: SessionId) {
        if self.runtime.live.contains_key(&child) {
            return;
        }
        match self.runtime.store.load(child).await {
            Ok(Some(stored)) => {
                let session = Session::from_stored(stored);
                if session.header.status.is_terminal() {
                    let Some(link) = session.header.parent.clone() else {
                        return;
                    };
                    let (result, usage) = report_of(&session);
                    let _ = myself.cast(SessionMsg::ChildFinished {
                        call_id: link.call_id,
                        attempt: link.attempt,
                        result,
                        usage,
                    });
                    return;
                }
                self.spawn_child(myself, session).await;
            }
            Ok(None) => {}
            Err(e) => tracing::error!(session_id = %child, "could not reload child: {e}"),
        }
    }

    /// After a transition of a child session: tell the parent when the turn
    /// ended, and when a propagating child starts or stops waiting.
    pub(super) async fn report_to_parent(&self, before: SessionStatus) {
        let Some(link) = self.session.header.parent.clone() else {
            return;
        };
        let now = self.session.header.status;
        let active = |s: SessionStatus| {
            matches!(s, SessionStatus::Running | SessionStatus::AwaitingApproval)
        };
        let parent = link.session_id;
        if active(before) && !active(now) {
            let (result, usage) = report_of(&self.session);
            let _ = self
                .runtime
                .deliver(parent, || SessionMsg::ChildFinished {
                    call_id: link.call_id.clone(),
                    attempt: link.attempt,
                    result: result.clone(),
                    usage,
                })
                .await;
            return;
        }
        let waiting = |s: SessionStatus| s == SessionStatus::AwaitingApproval;
        if link.propagate && waiting(before) != waiting(now) {
            let _ = self
                .runtime
                .deliver(parent, || SessionMsg::ChildWaiting {
                    call_id: link.call_id.clone(),
                    waiting: waiting(now),
                })
                .await;
        }
    }
}
