//! Ownership of sessions by one node among several (cluster mode), as
//! far as the actor tree sees it.
//!
//! The store port carries ownership ([`CheckpointStore::claim`] before an
//! actor of a tree starts, every checkpoint fenced by the tree's epoch,
//! [`StoreError::NotOwner`] when this node may not write): this module owns
//! what the tree does about it. An actor whose checkpoint was refused as not
//! owned fails with that error, and its supervisor lets it go instead of
//! restarting it (a restart would resume, and could dispatch, on a node that
//! no longer owns the session); and a node that lost its lease altogether
//! drops every actor at once ([`Overseer::drop_actors`]). It deliberately
//! knows no database, node or lease: those are the edge's (`overseer::cluster`).
//!
//! [`CheckpointStore::claim`]: crate::store::CheckpointStore::claim

use ractor::ActorProcessingErr;

use crate::model::SessionId;
use crate::store::StoreError;
use crate::Overseer;

/// The [`StoreError::NotOwner`] an actor failed with, if that is why.
pub(crate) fn not_owner(err: &ActorProcessingErr) -> Option<StoreError> {
    err.downcast_ref::<StoreError>()
        .filter(|e| e.is_not_owner())
        .cloned()
}

/// Whether an actor failed because its session belongs to another node.
pub(crate) fn lost_ownership(err: &ActorProcessingErr) -> bool {
    not_owner(err).is_some()
}

impl Overseer {
    /// Stops every session actor at once and writes nothing: for a node
    /// whose lease on its sessions ran out by its own clock, whose
    /// in-memory state may be stale and whose every write would be refused.
    /// Each root actor is killed with its whole subtree (and their tool-call
    /// actors); what the runtime held for them (the registry of live actors,
    /// effect-journal entries, approval timers) is dropped, so nothing of
    /// theirs is dispatched or delivered from here again. Sessions are
    /// resumed from their checkpoints by whichever node claims them next,
    /// this one included. Returns how many sessions had a live actor.
    pub async fn drop_actors(&self) -> usize {
        let rt = &self.runtime;
        let Ok(orchestrator) = rt.orchestrator() else {
            return 0;
        };
        // Every session with an actor now, roots and children alike (the
        // orchestrator forgets the roots as they stop; nobody forgets the
        // children, whose parents are killed with them).
        let ids: Vec<SessionId> = rt.live.iter().map(|e| *e.key()).collect();
        let roots = orchestrator.get_cell().get_children();
        for root in &roots {
            root.kill();
        }
        for root in &roots {
            if root.wait(Some(rt.config.call_timeout)).await.is_err() {
                tracing::warn!("a killed session actor did not stop in time");
            }
        }
        for id in &ids {
            if let Some((_, actor)) = rt.live.remove(id) {
                actor.kill();
            }
            rt.forget(*id);
        }
        tracing::warn!(sessions = ids.len(), "dropped every session actor");
        ids.len()
    }
}
