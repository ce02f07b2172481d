//! What the edges (HTTP, cluster, CLI, ACP, webhooks) read of a running
//! tree besides the session calls of [`Overseer`]: the ports they gave it
//! back (store, tools), the live event fan-out, which sessions are live
//! here, the counters they export, and a [`WeakOverseer`] for background
//! tasks that must not keep the tree alive.
//!
//! It deliberately hands out no actor, mailbox or bookkeeping map: the
//! runtime's internals stay `pub(crate)`, so an edge cannot route around
//! the tree's rules (one live actor per id, admission, supervision).

use std::sync::{Arc, Weak};

use ractor::ActorRef;

use super::Overseer;
use crate::error::SessionError;
use crate::hub::EventHub;
use crate::messages::OrchestratorMsg;
use crate::model::SessionId;
use crate::runtime::{Bookkeeping, Metrics, Runtime, RuntimeConfig};
use crate::store::CheckpointStore;
use crate::tool::ToolRegistry;

impl Overseer {
    /// The checkpoint store the tree writes to (the edge's own port, handed
    /// back for the reads the session calls do not cover: listings,
    /// decision pages, transcript ranges).
    pub fn store(&self) -> &Arc<dyn CheckpointStore> {
        &self.runtime.store
    }

    /// The runtime's tools (without any session's own).
    pub fn tools(&self) -> &ToolRegistry {
        &self.runtime.tools
    }

    /// The live event fan-out (per-session and all-sessions channels).
    pub fn hub(&self) -> &EventHub {
        &self.runtime.hub
    }

    /// Whether session `id` has a live actor in this process.
    pub fn is_live(&self, id: SessionId) -> bool {
        self.runtime.live.contains_key(&id)
    }

    /// How many session actors are live in this process.
    pub fn live_sessions(&self) -> usize {
        self.runtime.live.len()
    }

    /// The ids of the sessions with a live actor in this process (what a
    /// stopping server still waits for, say).
    pub fn live_ids(&self) -> Vec<SessionId> {
        self.runtime.live.iter().map(|e| *e.key()).collect()
    }

    /// What the runtime holds per session now (see [`Bookkeeping`]).
    pub fn bookkeeping(&self) -> Bookkeeping {
        self.runtime.bookkeeping()
    }

    /// The counters the edge exports as metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.runtime.metrics
    }

    /// The configuration the tree was started with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.runtime.config
    }

    /// Now, in ms since the epoch, on the runtime's clock (which paused
    /// tokio time moves in tests).
    pub fn now_ms(&self) -> i64 {
        self.runtime.now_ms()
    }

    /// Makes session `id` live from its checkpoint if it is not (a root
    /// under the orchestrator, a child under its parent), without the
    /// admission checks of API callers: the edge's own work (a takeover of
    /// a lease, resuming a session it drives).
    pub async fn activate(&self, id: SessionId) -> Result<(), SessionError> {
        self.runtime.activate(id).await.map(|_| ())
    }

    /// A handle that does not keep the tree alive (for background tasks of
    /// the edge: webhook delivery, feeds, watchdogs).
    pub fn downgrade(&self) -> WeakOverseer {
        WeakOverseer {
            runtime: Arc::downgrade(&self.runtime),
            orchestrator: self.orchestrator.clone(),
            join: Arc::downgrade(&self.join),
        }
    }
}

/// An [`Overseer`] that does not keep the runtime alive; see
/// [`Overseer::downgrade`].
#[derive(Clone)]
pub struct WeakOverseer {
    runtime: Weak<Runtime>,
    orchestrator: ActorRef<OrchestratorMsg>,
    join: Weak<super::JoinSlot>,
}

impl WeakOverseer {
    /// The handle, while the runtime lives.
    pub fn upgrade(&self) -> Option<Overseer> {
        let runtime = self.runtime.upgrade()?;
        Some(Overseer {
            runtime,
            orchestrator: self.orchestrator.clone(),
            // Every strong handle may be gone while the actors (which hold
            // the runtime) still run: then nobody can join the tree anymore.
            join: self.join.upgrade().unwrap_or_default(),
        })
    }
}
