//! The session actor: one per live session. It owns the session's in-memory
//! state, runs the pure transitions of [`crate::machine`], checkpoints each
//! one, and only then carries out its effects (third invariant).
//!
//! It supervises the session's tool-call actors and its child sessions;
//! provider streams run in tasks of their own and report back as messages,
//! so the mailbox never blocks on a model, a tool or another session (the second
//! invariant of ARCHITECTURE.md) and a cancel is handled at once in every phase. It
//! deliberately does not restart itself: its supervisor (the orchestrator
//! for a root, the parent's actor for a child) reloads the last checkpoint
//! and respawns it.
//!
//! At rest (idle, everything durable) it keeps only the header and queue:
//! the transcript and metadata are released and read back from the store
//! before the next input that needs them (`rest`).

mod delegate;
mod rest;
mod task;

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::Value;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::error::SessionError;
use crate::machine::{Dispatched, Effect, Input, Session};
use crate::messages::{crashed, SessionMsg, ToolCallMsg};
use crate::model::{CallState, Notification, SessionId, ToolCallId};
use crate::provider::{ProviderError, ProviderEvent, ProviderRequest};
use crate::runtime::Runtime;
use crate::store::StoreError;
use crate::supervision::Restarts;
use crate::tool::ToolContext;
use crate::tool_call::{ToolCallActor, ToolCallArgs};

/// The actor.
pub(crate) struct SessionActor;

/// Startup arguments: the session as last checkpointed, the runtime, and the
/// parent's actor for a child session.
pub(crate) struct SessionArgs {
    /// The session.
    pub session: Session,
    /// Shared services.
    pub runtime: Arc<Runtime>,
    /// The parent session's actor (its supervisor), for a child.
    pub parent: Option<ActorRef<SessionMsg>>,
}

/// A live child session actor, as its parent knows it.
struct Child {
    id: SessionId,
    actor: ActorRef<SessionMsg>,
}

/// The actor's state.
pub(crate) struct SessionState {
    session: Session,
    runtime: Arc<Runtime>,
    parent: Option<ActorRef<SessionMsg>>,
    stream: Option<JoinHandle<()>>,
    stream_attempt: u64,
    tools: HashMap<ActorId, (ToolCallId, u32, ActorRef<ToolCallMsg>)>,
    span: tracing::Span,
    /// Messages handled so far; an idle timer only hibernates the session if
    /// nothing happened since it was armed.
    activity: u64,
    /// Live child session actors.
    children: HashMap<ActorId, Child>,
    /// Restarts of this session's children, for the restart policy.
    child_restarts: Restarts,
    /// Set once this actor drains (hibernation, or its session ended).
    draining: bool,
    /// This actor's id, to disarm its idle timer when it goes.
    me: ActorId,
    /// Whether this actor has an idle timer armed (an entry in the
    /// runtime's idle queue, see [`crate::timers::IdleTimers`]): replaced
    /// when re-armed, dropped when the session is busy again or the actor
    /// goes. Only a change is written to the shared queue.
    idle_armed: bool,
    /// This actor's share of the gauges; dropped with the state, however
    /// the actor ends.
    gauges: crate::metrics::SessionGauges,
    /// Open GenAI spans (empty while telemetry is off).
    genai: crate::genai::SessionSpans,
}

impl Drop for SessionState {
    fn drop(&mut self) {
        self.runtime
            .tenant_live_changed(&self.session.header.tenant, false);
        // A stream task is not an actor: nothing else would stop it.
        if let Some(h) = self.stream.take() {
            h.abort();
        }
        if self.idle_armed {
            self.runtime.idle.disarm(self.session.header.id, self.me);
        }
    }
}

impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SessionArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut session = args.session;
        args.runtime.share_config(&mut session.header);
        let h = &session.header;
        let span = tracing::info_span!("session", session_id = %h.id, root_session_id = %h.root_id, agent = %h.agent);
        let gauges = crate::metrics::SessionGauges::start(&session);
        args.runtime.tenant_live_changed(&h.tenant, true);
        Ok(SessionState {
            session,
            runtime: args.runtime,
            parent: args.parent,
            stream: None,
            stream_attempt: 0,
            tools: HashMap::new(),
            span,
            activity: 0,
            children: HashMap::new(),
            child_restarts: Restarts::default(),
            draining: false,
            me: myself.get_id(),
            idle_armed: false,
            gauges,
            genai: Default::default(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Resume here rather than by a message to ourselves, so no request can
        // be handled before the in-flight work is re-established.
        let span = state.span.clone();
        let id = state.session.header.id;
        // A predecessor that died between a checkpoint and publishing its
        // events left subscribers behind: publish what they missed.
        if let Some(last) = state.runtime.hub.last_published(id) {
            if last < state.session.header.last_event_seq {
                if let Ok(missed) = state.runtime.store.events_after(id, last, usize::MAX).await {
                    for e in missed {
                        state.runtime.hub.publish(id, Notification::Event(e));
                    }
                }
            }
        }
        let journal = state
            .runtime
            .journal
            .known(id, &state.session.header.open_calls);
        let _ = state
            .transition(&myself, Input::Resume { journal })
            .instrument(span)
            .await?;
        state.arm_idle_timer(&myself);
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // A drained actor may have accepted, from its queue, work that
        // outlives it (a message that started a turn just as it hibernated):
        // whoever supervises it brings it back. A child's parent does that
        // when it sees the child stop; a root wakes itself.
        if state.parent.is_none()
            && !state.runtime.is_shutting_down()
            && !state.session.header.status.is_terminal()
            && !state.is_idle()
        {
            state
                .runtime
                .wake_after(state.session.header.id, myself.clone());
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let SessionMsg::Rest(n) = msg {
            // Not an input: nothing happened to the session, so it neither
            // counts as activity nor re-arms the idle timer.
            if n == state.activity {
                state.release_at_rest();
            }
            return Ok(());
        }
        let hibernate = match msg {
            SessionMsg::Hibernate(n) => Some(n == state.activity),
            SessionMsg::HibernateIfIdle => Some(true),
            _ => None,
        };
        if let Some(quiet) = hibernate {
            if quiet && state.is_idle() && !state.draining {
                state
                    .runtime
                    .metrics
                    .hibernations
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                metrics::counter!(crate::metrics::SESSION_HIBERNATIONS_TOTAL).increment(1);
                tracing::debug!(session_id = %state.session.header.id, "hibernating");
                // Drain, not stop: messages already queued are still handled,
                // later sends are refused and the router re-activates the
                // session from its checkpoint once this actor has stopped.
                state.draining = true;
                myself.drain()?;
            }
            return Ok(());
        }
        state.activity += 1;
        let span = state.span.clone();
        // Boxed: ractor keeps this future inside the actor's message loop,
        // which lives as long as the actor, so its size is held by every
        // live session, idle or not (see `the_futures_of_every_message_stay_small`).
        let result = Box::pin(state.on_input(&myself, msg).instrument(span)).await;
        state.arm_idle_timer(&myself);
        state.rest_at_once();
        result
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Overridden on purpose: the default would stop this session whenever
        // one of its tool-call actors stops, even normally.
        let span = state.span.clone();
        // Boxed for the reason `handle` is.
        let result = Box::pin(state.on_supervision(&myself, event).instrument(span)).await;
        // A child or tool that stopped may be what kept this session awake.
        state.arm_idle_timer(&myself);
        state.rest_at_once();
        result
    }
}

impl SessionState {
    /// What `handle` does with a message other than a hibernation request:
    /// first takes back what the session released at rest, if the message
    /// needs it (see [`rest`]). Until that read returns, this actor handles
    /// nothing else, so no message is ever handled on a released session;
    /// the read holds up this session's mailbox alone, as a checkpoint does.
    async fn on_input(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        msg: SessionMsg,
    ) -> Result<(), ActorProcessingErr> {
        if self.session.is_released() && rest::needs_session(&msg, self.stream_attempt) {
            if let Err(why) = self.restore().await {
                return self.unrestored(msg, why);
            }
        }
        self.on_message(myself, msg).await
    }

    /// What `on_input` does with a message once the session holds what it needs.
    async fn on_message(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        msg: SessionMsg,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SessionMsg::Traced(traceparent, msg) => {
                self.genai.traced(traceparent);
                Box::pin(self.on_message(myself, *msg)).await
            }
            SessionMsg::Send(text, message_id, reply) => {
                self.rpc(myself, Input::Message { text, message_id }, reply)
                    .await
            }
            SessionMsg::Decide(sub, reply) => {
                self.rpc(myself, Input::Decide(sub), reply).await?;
                crate::fault_point!(AfterDecisionAck, &self.session.header);
                Ok(())
            }
            SessionMsg::Cancel(reply) => self.rpc(myself, Input::Cancel, reply).await,
            SessionMsg::CancelFromParent => {
                self.transition(myself, Input::Cancel).await.map(|_| ())
            }
            SessionMsg::Done(reply) => self.rpc(myself, Input::Done, reply).await,
            SessionMsg::Interrupt(reply) => self.rpc(myself, Input::Interrupt, reply).await,
            SessionMsg::SetModel(model, reply) => {
                let route = self.runtime.provider.describe_route(&model);
                self.rpc(myself, Input::SetModel { model, route }, reply)
                    .await
            }
            SessionMsg::SetToolRule((tool, rule, by), reply) => {
                let input = Input::SetToolRule { tool, rule, by };
                self.rpc(myself, input, reply).await
            }
            SessionMsg::ActivateSkill((name, body, by), reply) => {
                let input = Input::ActivateSkill { name, body, by };
                self.rpc(myself, input, reply).await
            }
            SessionMsg::ExpireInput(idle_since_ms) => self
                .transition(myself, Input::ExpireInput { idle_since_ms })
                .await
                .map(|_| ()),
            SessionMsg::Get(reply) => {
                let _ = reply.send(self.session.to_stored());
                Ok(())
            }
            SessionMsg::GetHeader(reply) => {
                let _ = reply.send(self.session.header.clone());
                Ok(())
            }
            SessionMsg::ActivateChild(child, reply) => {
                // Boxed, like every rare path with a large future (see
                // `execute`): the common messages' futures stay small.
                Box::pin(self.activate_child(myself, child, reply)).await;
                Ok(())
            }
            SessionMsg::Provider { attempt, event } => {
                if attempt != self.stream_attempt {
                    return Ok(());
                }
                crate::fault_point!(MidStream, &self.session.header);
                self.transition(myself, Input::Provider(event))
                    .await
                    .map(|_| ())
            }
            SessionMsg::StreamEnded { attempt, result } => {
                if attempt != self.stream_attempt {
                    return Ok(());
                }
                self.stream = None;
                self.transition(myself, Input::StreamEnded(result))
                    .await
                    .map(|_| ())
            }
            SessionMsg::ToolFinished {
                call_id,
                attempt,
                result,
            } => {
                self.tools
                    .retain(|_, (id, a, _)| !(id == &call_id && *a == attempt));
                self.transition(
                    myself,
                    Input::ToolFinished {
                        call_id,
                        attempt,
                        result,
                    },
                )
                .await
                .map(|_| ())
            }
            SessionMsg::ApprovalTimeout {
                call_id,
                deadline_ms,
            } => self
                .transition(
                    myself,
                    Input::ApprovalTimedOut {
                        call_id,
                        deadline_ms,
                    },
                )
                .await
                .map(|_| ()),
            SessionMsg::Hibernate(_) | SessionMsg::HibernateIfIdle | SessionMsg::Rest(_) => Ok(()),
            SessionMsg::ChildFinished {
                call_id,
                attempt,
                result,
                usage,
            } => self
                .transition(
                    myself,
                    Input::ChildFinished {
                        call_id,
                        attempt,
                        result,
                        usage,
                    },
                )
                .await
                .map(|_| ()),
            SessionMsg::ChildWaiting { call_id, waiting } => self
                .transition(myself, Input::ChildWaiting { call_id, waiting })
                .await
                .map(|_| ()),
            SessionMsg::RestartChild(child) => {
                Box::pin(self.restart_child(myself, child)).await;
                Ok(())
            }
            #[cfg(feature = "fault-injection")]
            SessionMsg::InjectedPanic => panic!("injected fault at DuringTool"),
        }
    }

    /// What `handle_supervisor_evt` does with an event.
    async fn on_supervision(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        event: SupervisionEvent,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                if let Some(e) = crate::ownership::not_owner(&err) {
                    // The tree lives on another node now: this
                    // actor goes too, and is not restarted.
                    if let Some(child) = self.children.remove(&cell.get_id()) {
                        self.forget_child_actor(&child);
                    }
                    return Err(Box::new(e) as ActorProcessingErr);
                }
                if let Some(child) = self.children.remove(&cell.get_id()) {
                    self.forget_child_actor(&child);
                    let down = crate::supervision::store_down(&err);
                    Box::pin(self.on_child_failed(myself, child.id, err.to_string(), down)).await;
                } else if let Some((call_id, attempt, _)) = self.tools.remove(&cell.get_id()) {
                    tracing::warn!(tool_call_id = %call_id, "tool crashed: {err}");
                    let input = Input::ToolFinished {
                        call_id,
                        attempt,
                        result: Err(crashed(&err.to_string())),
                    };
                    let _ = self.transition(myself, input).await?;
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if let Some(child) = self.children.remove(&cell.get_id()) {
                    self.forget_child_actor(&child);
                    Box::pin(self.child_stopped(myself, child.id)).await;
                } else {
                    self.tools.remove(&cell.get_id());
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Nothing in flight and waiting on someone else: safe to hibernate.
    fn is_idle(&self) -> bool {
        self.session.is_settled()
            && self.stream.is_none()
            && self.tools.is_empty()
            && self.children.is_empty()
    }

    fn arm_idle_timer(&mut self, myself: &ActorRef<SessionMsg>) {
        if self.draining {
            return;
        }
        if self.session.header.status.is_terminal()
            && self.tools.is_empty()
            && self.children.is_empty()
        {
            // Nothing more can happen to a terminal session: release its
            // actor (requests already queued are still answered; later
            // ones are answered from the store).
            self.draining = true;
            let _ = myself.drain();
            return;
        }
        if self.is_idle() && self.runtime.times_idleness() {
            // Idle from now: re-armed after every message, so the idle time
            // counts from the last thing that happened.
            self.runtime
                .arm_idle(self.session.header.id, myself.clone(), self.activity);
            self.idle_armed = true;
        } else if self.idle_armed {
            self.runtime.idle.disarm(self.session.header.id, self.me);
            self.idle_armed = false;
        }
    }

    /// Runs a request-carrying input and answers it only after its checkpoint.
    async fn rpc(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        input: Input,
        reply: RpcReplyPort<Result<(), SessionError>>,
    ) -> Result<(), ActorProcessingErr> {
        match self.transition(myself, input).await {
            Ok(Ok(())) => {
                let _ = reply.send(Ok(()));
                Ok(())
            }
            Ok(Err(e)) => {
                let _ = reply.send(Err(e));
                Ok(())
            }
            Err(fatal) => {
                // The checkpoint failed: tell the caller nothing was accepted,
                // then fail so the supervisor restarts us from the last
                // durable state (or, if another node owns the session now,
                // lets it go: the caller is told so, to go to the owner).
                let _ = reply.send(Err(match fatal.downcast_ref::<StoreError>() {
                    // Another node owns it (the caller goes there), or the
                    // store is down for now (the caller retries): the
                    // caller is told which.
                    Some(e) if e.is_not_owner() || e.is_unavailable() => {
                        SessionError::Store(e.clone())
                    }
                    _ => SessionError::Unavailable {
                        id: self.session.header.id,
                        reason: fatal.to_string(),
                    },
                }));
                Err(fatal)
            }
        }
    }

    /// Apply → checkpoint → publish → execute effects. The outer `Err` is fatal
    /// for the actor (a failed checkpoint); the inner one is the caller's.
    async fn transition(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        input: Input,
    ) -> Result<Result<(), SessionError>, ActorProcessingErr> {
        if self.session.is_released() {
            // A backstop: messages restore in `on_input` (where a request
            // that cannot be restored for is answered); a supervision
            // event of a session at rest has no child or tool to be about.
            self.restore().await.map_err(rest::Unrestored::into_fatal)?;
        }
        let before = self.session.header.status;
        let tools = self.runtime.tools_for(self.session.header.id);
        let ctx = self
            .runtime
            .ctx_for(&tools, &self.session.header.config.model);
        let effects = match self.session.apply(input, ctx) {
            Ok(fx) => fx,
            Err(e) => return Ok(Err(e)),
        };
        let id = self.session.header.id;
        let now_ms = self.runtime.now_ms();
        self.genai.follow(&mut self.session.header, now_ms);
        // Journal the dispatches before their intent becomes durable: if this
        // actor dies between the checkpoint and the spawn, its restart knows
        // the tools never started and dispatches them instead of asking.
        for effect in &effects {
            if let Effect::Dispatch {
                call_id, attempt, ..
            } = effect
            {
                self.runtime
                    .journal
                    .record(id, call_id.clone(), *attempt, Dispatched::NotStarted);
            }
        }
        if self.session.is_dirty() {
            let checkpoint = self.session.checkpoint();
            crate::metrics::checkpoint(self.runtime.store.as_ref(), checkpoint)
                .await
                .map_err(|e| -> ActorProcessingErr { Box::new(e) })?;
            crate::fault_point!(AfterCheckpoint, &self.session.header);
            let events = self.session.mark_persisted();
            self.gauges.checkpointed(&self.session, &events);
            for event in events {
                self.runtime.hub.publish(id, Notification::Event(event));
            }
        }
        // What the runtime holds for this session follows its checkpoint:
        // journal entries of calls no longer running, and timers of calls no
        // longer waiting for a decision, have served.
        let header = &self.session.header;
        if header.status.is_terminal() {
            self.runtime.forget(id);
        } else {
            self.runtime.journal.retain_running(id, &header.open_calls);
            self.runtime.timers.retain(
                id,
                header
                    .open_calls
                    .iter()
                    .filter(|c| c.state == CallState::AwaitingApproval)
                    .map(|c| &c.id),
            );
        }
        for effect in effects {
            self.execute(myself, effect).await;
        }
        if before != self.session.header.status {
            self.report_to_parent(before);
        }
        Ok(Ok(()))
    }

    async fn execute(&mut self, myself: &ActorRef<SessionMsg>, effect: Effect) {
        match effect {
            Effect::StartStream(request) => self.start_stream(myself, request),
            Effect::StopStream => {
                self.stream_attempt += 1;
                if let Some(h) = self.stream.take() {
                    h.abort();
                }
            }
            Effect::Dispatch {
                call_id,
                name,
                arguments,
                attempt,
                idempotency_key,
            } => {
                self.dispatch(myself, call_id, name, arguments, attempt, idempotency_key)
                    .await
            }
            Effect::KillTools => {
                // Their journal entries go with the transition that killed
                // them (the calls are no longer running).
                for (_, (_, _, actor)) in self.tools.drain() {
                    actor.kill();
                }
            }
            Effect::Delegate {
                call_id,
                attempt,
                child,
                args,
                grant,
            } => {
                self.genai.delegation(&call_id, &args.agent);
                // Boxed: spawning a child is rare and its future is large
                // (~9 KB); inline, every message's future would carry it,
                // allocated and copied per message (`benches/PROFILE.md`).
                Box::pin(self.delegate(myself, call_id, attempt, child, args, grant)).await
            }
            Effect::RunTask {
                call_id,
                attempt,
                child,
                args,
                grant,
            } => {
                // Boxed, like `Delegate`.
                Box::pin(self.run_task(myself, call_id, attempt, child, args, grant)).await
            }
            Effect::CancelChild(child) => Box::pin(self.cancel_child(child)).await,
            Effect::ArmApprovalTimer {
                call_id,
                deadline_ms,
                after,
            } => {
                self.runtime.arm_approval_timer(
                    self.session.header.id,
                    call_id,
                    deadline_ms,
                    after,
                );
            }
            Effect::Delta(text) => self.runtime.hub.publish(
                self.session.header.id,
                Notification::TextDelta {
                    session_id: self.session.header.id,
                    text,
                },
            ),
        }
    }

    fn start_stream(&mut self, myself: &ActorRef<SessionMsg>, request: ProviderRequest) {
        self.stream_attempt += 1;
        if let Some(h) = self.stream.take() {
            h.abort();
        }
        let attempt = self.stream_attempt;
        let me = myself.clone();
        let provider = self.runtime.provider.clone();
        let mut chat = self
            .genai
            .chat(&request, self.session.header.config.route.as_ref());
        let chat_span = chat.span();
        let task = async move {
            // Dropped unfinished if this task is aborted: a cancelled stream.
            let mut meter = crate::metrics::ProviderStream::start(&request.model);
            let result = drive_stream(provider.as_ref(), request, |event| {
                meter.event(&event);
                chat.event(&event);
                me.cast(SessionMsg::Provider { attempt, event }).is_ok()
            })
            .await;
            meter.finish(&result);
            chat.finish(&result);
            // The session is gone (cancelled, crashed): nobody to tell.
            let _ = me.cast(SessionMsg::StreamEnded { attempt, result });
        };
        self.stream = Some(tokio::spawn(
            task.instrument(chat_span).instrument(self.span.clone()),
        ));
    }

    /// Reports a tool's outcome to ourselves. If this actor is already
    /// stopping the report is not lost: the call is still running in the
    /// checkpoint, and the next activation resumes it.
    fn report_to_self(&self, myself: &ActorRef<SessionMsg>, msg: SessionMsg) {
        if myself.cast(msg).is_err() {
            tracing::warn!(
                session_id = %self.session.header.id,
                "a report arrived while the session stopped; its next activation resumes the call"
            );
        }
    }

    async fn dispatch(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        call_id: ToolCallId,
        name: String,
        arguments: Value,
        attempt: u32,
        idempotency_key: String,
    ) {
        crate::fault_point!(BeforeToolDispatch, &self.session.header);
        let span = self.genai.tool(&call_id, &name, &arguments);
        let header = &self.session.header;
        let Some(tool) = self.runtime.tools_for(header.id).get(&name) else {
            self.report_to_self(
                myself,
                SessionMsg::ToolFinished {
                    call_id,
                    attempt,
                    result: Err(crate::tool::not_available(&name)),
                },
            );
            return;
        };
        let args = ToolCallArgs {
            runtime: self.runtime.clone(),
            tool,
            ctx: ToolContext {
                session_id: header.id,
                tenant: header.tenant.clone(),
                agent: header.agent.clone(),
                call_id: call_id.clone(),
                idempotency_key,
                attempt,
                scope: crate::tool::CallScope {
                    sub: header.created_by.clone(),
                    root_session_id: Some(header.root_id),
                    parent_session_id: header.parent.as_ref().map(|p| p.session_id),
                    allowed_tools: header.config.tools.clone(),
                },
            },
            arguments,
            session: myself.clone(),
            span,
        };
        let failure = match Actor::spawn_linked(None, ToolCallActor, args, myself.get_cell()).await
        {
            Ok((actor, _)) => {
                if actor.cast(ToolCallMsg::Run).is_ok() {
                    self.tools
                        .insert(actor.get_id(), (call_id.clone(), attempt, actor));
                    return;
                }
                crashed("tool-call actor stopped before it ran")
            }
            Err(e) => crashed(&format!("could not start tool-call actor: {e}")),
        };
        self.report_to_self(
            myself,
            SessionMsg::ToolFinished {
                call_id,
                attempt,
                result: Err(failure),
            },
        );
    }
}

/// Drives one provider stream to its end, handing each event to `emit`
/// (which returns false when the receiver is gone). A stream that stops
/// without a finish event is a provider error, never a silent success.
pub(crate) async fn drive_stream(
    provider: &dyn crate::provider::Provider,
    request: ProviderRequest,
    mut emit: impl FnMut(ProviderEvent) -> bool,
) -> Result<(), ProviderError> {
    let mut stream = provider.stream(request).await?;
    while let Some(item) = stream.next().await {
        let event = item?;
        let done = matches!(event, ProviderEvent::Done(_));
        if !emit(event) {
            return Ok(());
        }
        if done {
            return Ok(());
        }
    }
    Err(ProviderError::BadResponse(
        "the stream ended without a finish".into(),
    ))
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;
    use crate::runtime::Admission;

    /// The size of the future `make` would return, without calling it.
    fn future_size<F: Future>(_make: impl FnOnce() -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// What a future on a common path may take: it is built and copied at
    /// every message, so the rare, large paths (spawning a child, waking
    /// one, a restart, waking a session from the store) are boxed where they
    /// are awaited. Before that, a session's `handle` took 10.3 KB and
    /// `Overseer::submit` 5.5 KB.
    const SMALL: usize = 4096;

    /// What the actor's own handler futures may take. ractor boxes an
    /// actor's message loop once and keeps the handler futures inside it
    /// for the actor's whole life, so their size is memory every live
    /// session holds, idle or not: they box their bodies. Before that, the
    /// loop of a session actor took 7,040 bytes (release build).
    const RESIDENT: usize = 512;

    #[test]
    #[allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
    fn the_futures_of_every_message_stay_small() {
        let handle = future_size(|| {
            let state: &'static mut SessionState = unreachable!();
            let myself: ActorRef<SessionMsg> = unreachable!();
            let msg: SessionMsg = unreachable!();
            SessionActor.handle(myself, msg, state)
        });
        let supervision = future_size(|| {
            let state: &'static mut SessionState = unreachable!();
            let myself: ActorRef<SessionMsg> = unreachable!();
            let event: SupervisionEvent = unreachable!();
            SessionActor.handle_supervisor_evt(myself, event, state)
        });
        let route = future_size(|| {
            let runtime: &'static Runtime = unreachable!();
            runtime.activate_with(SessionId::generate(), Admission::Check)
        });
        let create = future_size(|| {
            let overseer: &'static crate::Overseer = unreachable!();
            overseer.create_session(crate::CreateSession::default())
        });
        for (what, size, most) in [
            ("SessionActor::handle", handle, RESIDENT),
            ("SessionActor::handle_supervisor_evt", supervision, RESIDENT),
            ("Runtime::activate_with", route, SMALL),
            ("Overseer::create_session", create, SMALL),
        ] {
            assert!(
                size <= most,
                "{what}'s future is {size} bytes (at most {most})"
            );
        }
    }
}
