//! The session actor: one per live session. It owns the session's in-memory
//! state, runs the pure transitions of [`machine`], checkpoints each one, and
//! only then carries out its effects (§3, third invariant).
//!
//! It supervises the session's tool-call actors; provider streams run in tasks
//! of their own and report back as messages, so the mailbox never blocks on a
//! model or a tool (§3, second invariant) and a cancel is handled at once in
//! every phase. It deliberately does not restart itself: the orchestrator
//! reloads the last checkpoint and respawns it (§10).

mod delegate;
pub mod machine;

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::Value;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::error::SessionError;
use crate::model::{now_ms, Notification, Submission, ToolCallId};
use crate::provider::{ProviderError, ProviderEvent, ProviderRequest};
use crate::runtime::Runtime;
use crate::store::StoredSession;
use crate::tool::ToolContext;
use crate::tool_call::{crashed, ToolCallActor, ToolCallArgs, ToolCallMsg};
use machine::{Ctx, Dispatched, Effect, Input, Session};

/// The actor.
pub struct SessionActor;

/// Messages. RPC variants carry their reply port last.
pub enum SessionMsg {
    /// A user message (with an optional idempotency id); acknowledged once
    /// checkpointed.
    Send(
        String,
        Option<String>,
        RpcReplyPort<Result<(), SessionError>>,
    ),
    /// Decisions; acknowledged once checkpointed.
    Decide(Submission, RpcReplyPort<Result<(), SessionError>>),
    /// Cancel the session (and its subtree).
    Cancel(RpcReplyPort<Result<(), SessionError>>),
    /// Mark the session completed.
    Done(RpcReplyPort<Result<(), SessionError>>),
    /// The current state.
    Get(RpcReplyPort<StoredSession>),
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
    /// An approval deadline passed.
    ApprovalTimeout(ToolCallId),
    /// The idle timer armed after message number `n` fired.
    Hibernate(u64),
    /// A child session ended its turn.
    ChildFinished {
        /// This session's `delegate_task` call.
        call_id: ToolCallId,
        /// Its attempt.
        attempt: u32,
        /// The child's result.
        result: Result<Value, Value>,
        /// What the child's subtree spent.
        usage: crate::model::Usage,
    },
    /// A propagating child started or stopped waiting for a decision.
    ChildWaiting {
        /// This session's `delegate_task` call.
        call_id: ToolCallId,
        /// Whether it waits.
        waiting: bool,
    },
    /// Respawn a failed child from its checkpoint (after backoff).
    RestartChild(crate::model::SessionId),
    /// Fault injection: panic now (sent by a tool-call actor at `during_tool`).
    #[cfg(feature = "fault-injection")]
    InjectedPanic,
}

/// Startup arguments: the session as last checkpointed, and the runtime.
pub struct SessionArgs {
    /// The session.
    pub session: Session,
    /// Shared services.
    pub runtime: Arc<Runtime>,
}

/// The actor's state.
pub struct SessionState {
    session: Session,
    runtime: Arc<Runtime>,
    stream: Option<JoinHandle<()>>,
    stream_attempt: u64,
    tools: HashMap<ActorId, (ToolCallId, u32, ActorRef<ToolCallMsg>)>,
    span: tracing::Span,
    /// Messages handled so far; an idle timer only hibernates the session if
    /// nothing happened since it was armed.
    activity: u64,
    /// Live child sessions by actor: (child id, our call, its attempt).
    children: HashMap<ActorId, (crate::model::SessionId, ToolCallId, u32)>,
    /// Restarts of each child, for the policy of §10.
    child_restarts: HashMap<crate::model::SessionId, crate::supervision::RestartHistory>,
    /// Monotonic origin for restart windows.
    epoch: tokio::time::Instant,
    /// This actor's share of the gauges; dropped with the state, however
    /// the actor ends.
    gauges: crate::metrics::SessionGauges,
}

impl Drop for SessionState {
    fn drop(&mut self) {
        // A stream task is not an actor: nothing else would stop it.
        if let Some(h) = self.stream.take() {
            h.abort();
        }
    }
}

impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: SessionArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let h = &args.session.header;
        let span = tracing::info_span!("session", session_id = %h.id, root_session_id = %h.root_id, agent = %h.agent);
        let gauges = crate::metrics::SessionGauges::start(&args.session);
        Ok(SessionState {
            session: args.session,
            runtime: args.runtime,
            stream: None,
            stream_attempt: 0,
            tools: HashMap::new(),
            span,
            activity: 0,
            children: HashMap::new(),
            child_restarts: HashMap::new(),
            epoch: tokio::time::Instant::now(),
            gauges,
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
            .session
            .header
            .open_calls
            .iter()
            .filter_map(|c| {
                let entry = state.runtime.journal.get(&(id, c.id.clone()))?;
                Some((c.id.clone(), entry.0, entry.1.clone()))
            })
            .collect();
        let _ = state
            .transition(&myself, Input::Resume { journal })
            .instrument(span)
            .await?;
        state.arm_idle_timer(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let SessionMsg::Hibernate(n) = msg {
            if n == state.activity && state.is_idle() {
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
                myself.drain()?;
            }
            return Ok(());
        }
        state.activity += 1;
        let span = state.span.clone();
        let result = async {
            match msg {
                SessionMsg::Send(text, message_id, reply) => {
                    state
                        .rpc(&myself, Input::Message { text, message_id }, reply)
                        .await
                }
                SessionMsg::Decide(sub, reply) => {
                    state.rpc(&myself, Input::Decide(sub), reply).await?;
                    crate::fault_point!(AfterDecisionAck, &state.session.header);
                    Ok(())
                }
                SessionMsg::Cancel(reply) => state.rpc(&myself, Input::Cancel, reply).await,
                SessionMsg::Done(reply) => state.rpc(&myself, Input::Done, reply).await,
                SessionMsg::Get(reply) => {
                    let _ = reply.send(StoredSession {
                        header: state.session.header.clone(),
                        transcript: state.session.transcript.clone(),
                    });
                    Ok(())
                }
                SessionMsg::Provider { attempt, event } => {
                    if attempt != state.stream_attempt {
                        return Ok(());
                    }
                    crate::fault_point!(MidStream, &state.session.header);
                    state
                        .transition(&myself, Input::Provider(event))
                        .await
                        .map(|_| ())
                }
                SessionMsg::StreamEnded { attempt, result } => {
                    if attempt != state.stream_attempt {
                        return Ok(());
                    }
                    state.stream = None;
                    state
                        .transition(&myself, Input::StreamEnded(result))
                        .await
                        .map(|_| ())
                }
                SessionMsg::ToolFinished {
                    call_id,
                    attempt,
                    result,
                } => {
                    state
                        .tools
                        .retain(|_, (id, a, _)| !(id == &call_id && *a == attempt));
                    let key = (state.session.header.id, call_id.clone());
                    let _ = state
                        .transition(
                            &myself,
                            Input::ToolFinished {
                                call_id,
                                attempt,
                                result,
                            },
                        )
                        .await?;
                    // Recorded durably now: the journal entry has served.
                    state
                        .runtime
                        .journal
                        .remove_if(&key, |_, (a, _)| *a == attempt);
                    Ok(())
                }
                SessionMsg::ApprovalTimeout(call_id) => state
                    .transition(&myself, Input::ApprovalTimedOut { call_id })
                    .await
                    .map(|_| ()),
                SessionMsg::Hibernate(_) => Ok(()),
                SessionMsg::ChildFinished {
                    call_id,
                    attempt,
                    result,
                    usage,
                } => state
                    .transition(
                        &myself,
                        Input::ChildFinished {
                            call_id,
                            attempt,
                            result,
                            usage,
                        },
                    )
                    .await
                    .map(|_| ()),
                SessionMsg::ChildWaiting { call_id, waiting } => state
                    .transition(&myself, Input::ChildWaiting { call_id, waiting })
                    .await
                    .map(|_| ()),
                SessionMsg::RestartChild(child) => {
                    state.restart_child(&myself, child).await;
                    Ok(())
                }
                #[cfg(feature = "fault-injection")]
                SessionMsg::InjectedPanic => panic!("injected fault at DuringTool"),
            }
        }
        .instrument(span)
        .await;
        state.arm_idle_timer(&myself);
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
        if let SupervisionEvent::ActorFailed(cell, err) = &event {
            if state.children.contains_key(&cell.get_id()) {
                let span = state.span.clone();
                state
                    .on_child_failed(&myself, cell, err.to_string())
                    .instrument(span)
                    .await;
                return Ok(());
            }
        }
        if let SupervisionEvent::ActorTerminated(cell, _, _) = &event {
            if let Some((child, _, _)) = state.children.remove(&cell.get_id()) {
                let stale = cell.get_id();
                state
                    .runtime
                    .live
                    .remove_if(&child, |_, r| r.get_id() == stale);
                return Ok(());
            }
        }
        if let SupervisionEvent::ActorFailed(cell, err) = event {
            if let Some((call_id, attempt, _)) = state.tools.remove(&cell.get_id()) {
                tracing::warn!(tool_call_id = %call_id, "tool crashed: {err}");
                let input = Input::ToolFinished {
                    call_id,
                    attempt,
                    result: Err(crashed(&err.to_string())),
                };
                let span = state.span.clone();
                let _ = state.transition(&myself, input).instrument(span).await?;
            }
        } else if let SupervisionEvent::ActorTerminated(cell, _, _) = event {
            state.tools.remove(&cell.get_id());
        }
        Ok(())
    }
}

impl SessionState {
    /// Nothing in flight and waiting on someone else: safe to hibernate.
    fn is_idle(&self) -> bool {
        use crate::model::SessionStatus::{AwaitingApproval, AwaitingInput};
        matches!(self.session.header.status, AwaitingInput | AwaitingApproval)
            && self.stream.is_none()
            && self.tools.is_empty()
            && self.children.is_empty()
            && self
                .session
                .header
                .open_calls
                .iter()
                .all(|c| c.state != crate::model::CallState::Running)
    }

    fn arm_idle_timer(&self, myself: &ActorRef<SessionMsg>) {
        if self.session.header.status.is_terminal()
            && self.tools.is_empty()
            && self.children.is_empty()
        {
            // Nothing more can happen to a terminal session: release its
            // actor (requests already queued are still answered; later
            // ones are answered from the store).
            let _ = myself.drain();
            return;
        }
        if let Some(after) = self.runtime.config.idle_hibernate {
            if self.is_idle() {
                let n = self.activity;
                myself.send_after(after, move || SessionMsg::Hibernate(n));
            }
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
                // durable state.
                let _ = reply.send(Err(SessionError::Unavailable {
                    id: self.session.header.id,
                    reason: fatal.to_string(),
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
        let ctx = Ctx {
            tools: &self.runtime.tools,
            now_ms: now_ms(),
        };
        let before = self.session.header.status;
        let effects = match self.session.apply(input, ctx) {
            Ok(fx) => fx,
            Err(e) => return Ok(Err(e)),
        };
        // Journal the dispatches before their intent becomes durable: if this
        // actor dies between the checkpoint and the spawn, its restart knows
        // the tools never started and dispatches them instead of asking.
        for effect in &effects {
            if let Effect::Dispatch {
                call_id, attempt, ..
            } = effect
            {
                self.runtime.journal.insert(
                    (self.session.header.id, call_id.clone()),
                    (*attempt, Dispatched::NotStarted),
                );
            }
        }
        if self.session.is_dirty() {
            let checkpoint = self.session.checkpoint();
            crate::metrics::checkpoint(self.runtime.store.as_ref(), checkpoint)
                .await
                .map_err(|e| -> ActorProcessingErr { Box::new(e) })?;
            let id = self.session.header.id;
            crate::fault_point!(AfterCheckpoint, &self.session.header);
            let events = self.session.mark_persisted();
            self.gauges.checkpointed(&self.session, &events);
            for event in events {
                self.runtime.hub.publish(id, Notification::Event(event));
            }
        }
        for effect in effects {
            self.execute(myself, effect).await;
        }
        if self.session.header.parent.is_some() && before != self.session.header.status {
            self.report_to_parent(before).await;
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
                for (_, (call_id, attempt, actor)) in self.tools.drain() {
                    actor.kill();
                    let key = (self.session.header.id, call_id);
                    self.runtime
                        .journal
                        .remove_if(&key, |_, (a, _)| *a == attempt);
                }
            }
            Effect::Delegate {
                call_id,
                attempt,
                child,
                args,
                grant,
            } => {
                self.delegate(myself, call_id, attempt, child, args, grant)
                    .await
            }
            Effect::CancelChild(child) => {
                // Downwards only, so this call cannot deadlock with the child.
                if let Err(e) = self.runtime.route(child, SessionMsg::Cancel).await {
                    tracing::debug!(session_id = %child, "child not cancelled: {e}");
                }
            }
            Effect::ArmApprovalTimer { call_id, after } => {
                self.runtime
                    .arm_approval_timer(self.session.header.id, call_id, after);
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
        let task = async move {
            // Dropped unfinished if this task is aborted: a cancelled stream.
            let mut meter = crate::metrics::ProviderStream::start(&request.model);
            let result = drive_stream(provider.as_ref(), request, |event| {
                meter.event(&event);
                me.cast(SessionMsg::Provider { attempt, event }).is_ok()
            })
            .await;
            meter.finish(&result);
            let _ = me.cast(SessionMsg::StreamEnded { attempt, result });
        };
        self.stream = Some(tokio::spawn(task.instrument(self.span.clone())));
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
        let header = &self.session.header;
        let Some(tool) = self.runtime.tools.get(&name) else {
            let _ = myself.cast(SessionMsg::ToolFinished {
                call_id,
                attempt,
                result: Err(crate::tool::not_available(&name)),
            });
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
        };
        match Actor::spawn_linked(None, ToolCallActor, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                if actor.cast(ToolCallMsg::Run).is_ok() {
                    self.tools.insert(actor.get_id(), (call_id, attempt, actor));
                } else {
                    let _ = myself.cast(SessionMsg::ToolFinished {
                        call_id,
                        attempt,
                        result: Err(crashed("tool-call actor stopped before it ran")),
                    });
                }
            }
            Err(e) => {
                let _ = myself.cast(SessionMsg::ToolFinished {
                    call_id,
                    attempt,
                    result: Err(crashed(&format!("could not start tool-call actor: {e}"))),
                });
            }
        }
    }
}

/// Drives one provider stream to its end, handing each event to `emit`
/// (which returns false when the receiver is gone). A stream that stops
/// without a finish event is a provider error, never a silent success.
pub async fn drive_stream(
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
