//! The orchestrator: root of the actor tree and supervisor of root sessions.
//!
//! It owns spawning session actors (one per session id, never two) and
//! restarting them from their last checkpoint when they fail, under the
//! policy of [`crate::supervision`]. It deliberately does no session I/O on
//! the hot path: creating a session is checkpointed by the caller before the
//! spawn request arrives, so creates share flushes instead of queueing here.
//! It never dies of a child's failure: every supervision path logs and goes on.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::error::SessionError;
use crate::model::SessionId;
use crate::runtime::Runtime;
use crate::session::machine::Session;
use crate::session::{SessionActor, SessionArgs, SessionMsg};
use crate::supervision::{Decision, RestartHistory};

/// The actor.
pub struct OrchestratorActor;

/// Messages.
pub enum OrchestratorMsg {
    /// Start the actor for a checkpointed session (or return the live one).
    Spawn(
        Box<Session>,
        RpcReplyPort<Result<ActorRef<SessionMsg>, SessionError>>,
    ),
    /// Respawn a failed session from its last checkpoint (sent after backoff).
    Restart {
        /// Session.
        id: SessionId,
        /// The failure that caused the restart.
        reason: String,
    },
}

/// Startup arguments.
pub struct OrchestratorArgs {
    /// Shared services.
    pub runtime: Arc<Runtime>,
}

/// State.
pub struct OrchestratorState {
    runtime: Arc<Runtime>,
    by_actor: HashMap<ActorId, SessionId>,
    restarts: HashMap<SessionId, RestartHistory>,
    epoch: tokio::time::Instant,
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
            restarts: HashMap::new(),
            epoch: tokio::time::Instant::now(),
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
            OrchestratorMsg::Restart { id, reason } => state.restart(&myself, id, reason).await,
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
                tracing::warn!(session_id = %id, "session actor failed: {err}");
                state.on_failure(&myself, id, err.to_string()).await;
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                state.forget(cell.get_id());
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
    ) -> Result<ActorRef<SessionMsg>, SessionError> {
        let id = session.header.id;
        if let Some(live) = self.runtime.live.get(&id) {
            return Ok(live.clone());
        }
        let args = SessionArgs {
            session,
            runtime: self.runtime.clone(),
        };
        match Actor::spawn_linked(None, SessionActor, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                self.by_actor.insert(actor.get_id(), id);
                self.runtime.live.insert(id, actor.clone());
                Ok(actor)
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
    ) {
        let now = self.epoch.elapsed().as_millis() as u64;
        let decision = self
            .restarts
            .entry(id)
            .or_default()
            .decide(&self.runtime.config.restart, now);
        match decision {
            Decision::Restart(after) => {
                self.runtime
                    .metrics
                    .restarts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                metrics::counter!(crate::metrics::SESSION_RESTARTS_TOTAL).increment(1);
                myself.send_after(after, move || OrchestratorMsg::Restart { id, reason });
            }
            Decision::GiveUp => {
                self.restarts.remove(&id);
                let why = format!("restart limit exceeded: {reason}");
                if let Err(e) = self.runtime.fail_session(id, &why).await {
                    tracing::error!(session_id = %id, "could not record the failure: {e}");
                }
            }
        }
    }

    async fn restart(&mut self, myself: &ActorRef<OrchestratorMsg>, id: SessionId, reason: String) {
        if self.runtime.live.contains_key(&id) {
            return; // already activated by a request in the meantime
        }
        let loaded = match self.runtime.store.load(id).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return,
            Err(e) => {
                // A respawn that fails counts as another failure; it never
                // takes the orchestrator down.
                Box::pin(self.on_failure(myself, id, format!("reload failed: {e}"))).await;
                return;
            }
        };
        if loaded.header.status.is_terminal() {
            return;
        }
        tracing::info!(session_id = %id, "restarting session after: {reason}");
        if let Err(e) = self.spawn(myself, Session::from_stored(loaded)).await {
            Box::pin(self.on_failure(myself, id, e.to_string())).await;
        }
    }
}
