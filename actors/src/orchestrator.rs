//! The orchestrator: root of the actor tree and supervisor of root sessions.
//!
//! It owns spawning root session actors (one per session id, never two) and
//! restarting them from their last checkpoint when they fail, under the
//! policy of [`crate::supervision`]. It never spawns a child session: a child
//! is always its parent's actor's (see [`crate::session`]); the orchestrator
//! only cancels, in the store, children whose parent will never resume them.
//! It deliberately does no session I/O on the hot path: creating a session is
//! checkpointed by the caller before the spawn request arrives, so creates
//! share flushes instead of queueing here. Nor does it wait on the store in
//! its mailbox for a restart or an orphan: the reload (read and claim) and
//! the orphan's cancel run in tasks of their own that report back as
//! messages, so every other root's spawn goes on meanwhile. The one store
//! write it waits for is the rare one past a root's restart limit (recording
//! the session failed, [`Runtime::on_actor_failed`]). It never dies of a
//! child's failure: every supervision path logs and goes on.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::error::SessionError;
use crate::machine::Session;
use crate::messages::{OrchestratorMsg, SessionMsg};
use crate::model::SessionId;
use crate::runtime::{AfterFailure, Runtime};
use crate::session::{SessionActor, SessionArgs};
use crate::store::StoredSession;
use crate::supervision::Restarts;

/// The actor.
pub(crate) struct OrchestratorActor;

/// Startup arguments.
pub(crate) struct OrchestratorArgs {
    /// Shared services.
    pub runtime: Arc<Runtime>,
}

/// State.
pub(crate) struct OrchestratorState {
    runtime: Arc<Runtime>,
    by_actor: HashMap<ActorId, SessionId>,
    restarts: Restarts,
    /// Roots whose restart is reading the store now; an actor spawned for
    /// one meanwhile (a request activated it, from a later read) makes the
    /// reload stale.
    reloading: HashSet<SessionId>,
    /// Orphans being cancelled in the store, with everyone waiting for it:
    /// one cancel per orphan at a time.
    cancelling: HashMap<SessionId, Vec<RpcReplyPort<Result<(), SessionError>>>>,
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
            reloading: HashSet::new(),
            cancelling: HashMap::new(),
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
            OrchestratorMsg::Restart { id, reason } => state.restart(&myself, id, reason),
            // Boxed: rare, and its future would otherwise be allocated and
            // copied with every message's.
            OrchestratorMsg::Reloaded { id, reason, loaded } => {
                Box::pin(state.reloaded(&myself, id, reason, loaded)).await
            }
            OrchestratorMsg::CancelOrphan(id, reply) => state.cancel_orphan(&myself, id, reply),
            OrchestratorMsg::OrphanCancelled(id, result) => {
                for reply in state.cancelling.remove(&id).unwrap_or_default() {
                    let _ = reply.send(result.clone());
                }
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
                    // Another node owns the tree now: it resumes it.
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
                // A restart still reading the store is superseded.
                self.reloading.remove(&id);
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

    /// Starts a restart: the session is read (and, in cluster mode,
    /// claimed) in a task of its own, which reports [`OrchestratorMsg::Reloaded`].
    fn restart(&mut self, myself: &ActorRef<OrchestratorMsg>, id: SessionId, reason: String) {
        if self.runtime.live.contains_key(&id) || !self.reloading.insert(id) {
            return; // activated by a request meanwhile, or already reloading
        }
        let runtime = Arc::clone(&self.runtime);
        off_the_mailbox(myself, id, reload(runtime, id), move |loaded| {
            OrchestratorMsg::Reloaded { id, reason, loaded }
        });
    }

    /// A restart's read is over: spawn the session from it, unless a request
    /// activated it meanwhile (that actor, from a later read, is the session).
    async fn reloaded(
        &mut self,
        myself: &ActorRef<OrchestratorMsg>,
        id: SessionId,
        reason: String,
        loaded: Result<Option<Box<StoredSession>>, SessionError>,
    ) {
        if !self.reloading.remove(&id) || self.runtime.live.contains_key(&id) {
            return;
        }
        let loaded = match loaded {
            Ok(Some(stored)) => *stored,
            Ok(None) => {
                self.restarts.forget(&id);
                return;
            }
            Err(e @ (SessionError::Terminal { .. } | SessionError::NotFound(_))) => {
                tracing::info!(session_id = %id, "not restarting: {e}");
                self.restarts.forget(&id);
                return;
            }
            Err(SessionError::Store(e)) if e.is_not_owner() => {
                // Another node owns the tree now: it resumes it.
                tracing::info!(session_id = %id, "not restarting: {e}");
                self.restarts.forget(&id);
                return;
            }
            Err(e) => {
                // A respawn that fails counts as another failure (unless the
                // store is down); it never takes the orchestrator down.
                let down = crate::supervision::store_down_error(&e);
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

    /// Cancels an orphan in the store in a task of its own (one at a time
    /// per orphan: a second request waits for the first's answer).
    fn cancel_orphan(
        &mut self,
        myself: &ActorRef<OrchestratorMsg>,
        id: SessionId,
        reply: RpcReplyPort<Result<(), SessionError>>,
    ) {
        if self.runtime.live.contains_key(&id) {
            // Activated meanwhile by its parent: not an orphan.
            let _ = reply.send(Ok(()));
            return;
        }
        match self.cancelling.entry(id) {
            Entry::Occupied(mut waiting) => waiting.get_mut().push(reply),
            Entry::Vacant(slot) => {
                slot.insert(vec![reply]);
                let runtime = Arc::clone(&self.runtime);
                let cancel = async move { runtime.cancel_in_store(id).await };
                off_the_mailbox(myself, id, cancel, move |result| {
                    OrchestratorMsg::OrphanCancelled(id, result)
                });
            }
        }
    }
}

/// A restart's read of the session from the store, with the claim of its
/// tree in cluster mode (which reads it again when the lease is new).
async fn reload(
    runtime: Arc<Runtime>,
    id: SessionId,
) -> Result<Option<Box<StoredSession>>, SessionError> {
    if runtime.is_shutting_down() {
        return Ok(None); // nothing is restarted at shutdown
    }
    match runtime.store.load(id).await? {
        Some(stored) if stored.header.status.is_terminal() => Ok(Some(Box::new(stored))),
        Some(stored) => runtime.claimed(id, stored).await.map(|s| Some(Box::new(s))),
        None => Ok(None),
    }
}

/// Runs store work for the orchestrator in a task of its own and reports
/// its outcome as the message `report` makes: the mailbox goes on meanwhile.
/// A panic in the work is reported as an error (a task of ours is not
/// supervised by ractor); a report to an orchestrator that has stopped
/// (shutdown) is dropped.
fn off_the_mailbox<T: Send + 'static>(
    myself: &ActorRef<OrchestratorMsg>,
    id: SessionId,
    work: impl Future<Output = Result<T, SessionError>> + Send + 'static,
    report: impl FnOnce(Result<T, SessionError>) -> OrchestratorMsg + Send + 'static,
) {
    let myself = myself.clone();
    tokio::spawn(async move {
        let outcome = AssertUnwindSafe(work)
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                Err(SessionError::Internal(format!(
                    "the store work for session {id} panicked"
                )))
            });
        let _ = myself.cast(report(outcome));
    });
}
