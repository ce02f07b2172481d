//! The orchestrator: root of the actor tree and supervisor of root sessions.
//!
//! It owns spawning root session actors (one per session id, never two) and
//! restarting them from their last checkpoint when they fail, under the
//! policy of [`crate::supervision`]. It never spawns a child session: a child
//! is always its parent's actor's (see [`crate::session`]); the orchestrator
//! only cancels, in the store, children whose parent will never resume them.
//! It deliberately does no session I/O on the hot path: creating a session is
//! checkpointed by the caller before the spawn request arrives, so creates
//! share flushes instead of queueing here. It never dies of a child's
//! failure: every supervision path logs and goes on.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::error::SessionError;
use crate::machine::Session;
use crate::messages::{OrchestratorMsg, SessionMsg};
use crate::model::SessionId;
use crate::runtime::{AfterFailure, Runtime};
use crate::session::{SessionActor, SessionArgs};
use crate::supervision::Restarts;

/// The actor.
pub struct OrchestratorActor;

/// Startup arguments.
pub struct OrchestratorArgs {
    /// Shared services.
    pub runtime: Arc<Runtime>,
}

/// State.
pub struct OrchestratorState {
    runtime: Arc<Runtime>,
    by_actor: HashMap<ActorId, SessionId>,
    restarts: Restarts,
}

impl Actor for OrchestratorActor {
    type Msg = OrchestratorMsg;
    type State = OrchestratorState;
    type Arguments = OrchestratorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: OrchestratorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(OrchestratorState {
            runtime: args.runtime,
            by_actor: HashMap::new(),
            restarts: Restarts::default(),
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself.stop_children_and_wait(None, None).await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            OrchestratorMsg::Spawn(session, reply) => {
                let result = state.spawn(&myself, *session).await;
                let _ = reply.send(result);
            }
            // Boxed: rare, and its future (~7.5 KB) would otherwise be
            // allocated and copied with every message's.
            OrchestratorMsg::Restart { id, reason } => {
                Box::pin(state.restart(&myself, id, reason)).await
            }
            OrchestratorMsg::CancelOrphan(id, reply) => {
                let result = if state.runtime.live.contains_key(&id) {
                    // Activated meanwhile by its parent: not an orphan.
                    Ok(())
                } else {
                    state.runtime.cancel_in_store(id).await
                };
                let _ = reply.send(result);
            }
            OrchestratorMsg::RestartHistories(reply) => {
                state.restarts.prune(&state.runtime.config.restart);
                let _ = reply.send(state.restarts.len());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                let Some(id) = state.forget(cell.get_id()) else {
                    return Ok(());
                };
                if crate::ownership::lost_ownership(&err) {
                    // Another node owns the tree now (§15): it resumes it.
                    tracing::info!(session_id = %id, "session moved to another node: {err}");
                    state.restarts.forget(&id);
                    return Ok(());
                }
                let store_down = crate::supervision::store_down(&err);
                if store_down {
                    // The store reports its own outage; one line per
                    // session would drown it.
                    tracing::debug!(session_id = %id, "session actor failed: {err}");
                } else {
                    tracing::warn!(session_id = %id, "session actor failed: {err}");
                }
                state
                    .on_failure(&myself, id, err.to_string(), store_down)
                    .await;
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if let Some(id) = state.forget(cell.get_id()) {
                    // Stopped normally (hibernated or ended): it is not in a
                    // crash loop any more.
                    state.restarts.forget(&id);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl OrchestratorState {
    async fn spawn(
        &mut self,
        myself: &ActorRef<OrchestratorMsg>,
        session: Session,
    ) -> Result<(ActorRef<SessionMsg>, bool), SessionError> {
        let id = session.header.id;
        if session.header.parent.is_some() {
            return Err(SessionError::Internal(format!(
                "session {id} is a child session: only its parent's actor starts it"
            )));
        }
        if let Some(live) = self.runtime.live.get(&id) {
            return Ok((live.clone(), false));
        }
        let args = SessionArgs {
            session,
            runtime: self.runtime.clone(),
            parent: None,
        };
        match Actor::spawn_linked(None, SessionActor, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                self.by_actor.insert(actor.get_id(), id);
                self.runtime.live.insert(id, actor.clone());
                Ok((actor, true))
            }
            Err(e) => Err(SessionError::Unavailable {
                id,
                reason: format!("could not start the session actor: {e}"),
            }),
        }
    }

    fn forget(&mut self, actor: ActorId) -> Option<SessionId> {
        let id = self.by_actor.remove(&actor)?;
        self.runtime.live.remove_if(&id, |_, r| r.get_id() == actor);
        Some(id)
    }

    async fn on_failure(
        &mut self,
        myself: &ActorRef<OrchestratorMsg>,
        id: SessionId,
        reason: String,
        store_down: bool,
    ) {
        match self
            .runtime
            .on_actor_failed(&mut self.restarts, id, &reason, store_down)
            .await
        {
            AfterFailure::RestartAfter(after) => {
                myself.send_after(after, move || OrchestratorMsg::Restart { id, reason });
            }
            // A root has nobody to report to: the failure is in its
            // checkpoint and its events.
            AfterFailure::GaveUp { .. } => {}
        }
    }

    async fn restart(&mut self, myself: &ActorRef<OrchestratorMsg>, id: SessionId, reason: String) {
        if self.runtime.live.contains_key(&id) {
            return; // already activated by a request in the meantime
        }
        let loaded = match self.runtime.store.load(id).await {
            Ok(Some(stored)) if stored.header.status.is_terminal() => stored,
            Ok(Some(stored)) => match self.runtime.claimed(id, stored).await {
                Ok(stored) => stored,
                Err(e @ (SessionError::Terminal { .. } | SessionError::NotFound(_))) => {
                    tracing::info!(session_id = %id, "not restarting: {e}");
                    self.restarts.forget(&id);
                    return;
                }
                Err(SessionError::Store(e)) if e.is_not_owner() => {
                    // Another node owns the tree now (§15): it resumes it.
                    tracing::info!(session_id = %id, "not restarting: {e}");
                    self.restarts.forget(&id);
                    return;
                }
                Err(e) => {
                    let down = crate::supervision::store_down_error(&e);
                    Box::pin(self.on_failure(myself, id, format!("reload failed: {e}"), down))
                        .await;
                    return;
                }
            },
            Ok(None) => {
                self.restarts.forget(&id);
                return;
            }
            Err(e) => {
                // A respawn that fails counts as another failure (unless the
                // store is down); it never takes the orchestrator down.
                let down = e.is_unavailable();
                Box::pin(self.on_failure(myself, id, format!("reload failed: {e}"), down)).await;
                return;
            }
        };
        if loaded.header.status.is_terminal() {
            self.restarts.forget(&id);
            return;
        }
        tracing::info!(session_id = %id, "restarting session after: {reason}");
        if let Err(e) = self.spawn(myself, Session::from_stored(loaded)).await {
            let down = crate::supervision::store_down_error(&e);
            Box::pin(self.on_failure(myself, id, e.to_string(), down)).await;
        }
    }
}
