//! The in-process API of forks: a new root session from a point of
//! another's history, and the list of those points.
//!
//! The source is read from the store (its latest checkpoint and events) and
//! never written or messaged, so it may be running, hibernated or ended. The
//! fork is built by the pure `Session::fork_of` and started like a new
//! session: admitted, claimed, checkpointed whole, then spawned, whereupon
//! it resumes (asks its reopened calls again, or asks the model).

use crate::error::SessionError;
use crate::machine::{fork_points, ForkAt, ForkPoint, ForkSpec, Session};
use crate::model::{Notification, SessionId};

use super::{CreatingGuard, Overseer};

/// One point of a session's history a fork can start from.
pub type HistoryPoint = ForkPoint;

impl Overseer {
    /// Forks session `source` at `at` into a new root session of the same
    /// tenant, recorded as `forked_from` in the fork's header; returns the
    /// fork's id. Calls pending, running or not yet run at the point are
    /// asked again, never run silently.
    pub async fn fork(
        &self,
        source: SessionId,
        at: ForkAt,
        created_by: Option<String>,
    ) -> Result<SessionId, SessionError> {
        let store = &self.runtime.store;
        let stored = store
            .load(source)
            .await?
            .ok_or(SessionError::NotFound(source))?;
        let events = match at {
            ForkAt::Latest => Vec::new(),
            ForkAt::Seq(s) => {
                let upto = s.min(stored.header.last_event_seq);
                store
                    .events_after(source, 0, usize::try_from(upto).unwrap_or(usize::MAX))
                    .await?
            }
            ForkAt::Index(_) => {
                let all = stored.header.last_event_seq;
                store
                    .events_after(source, 0, usize::try_from(all).unwrap_or(usize::MAX))
                    .await?
            }
        };
        self.runtime.admit()?;
        self.runtime.admit_tenant(&stored.header.tenant)?;
        let id = SessionId::generate();
        let Some(_creating) = CreatingGuard::claim(&self.runtime, id) else {
            return Err(SessionError::AlreadyExists(id));
        };
        self.runtime.count_creation(&stored.header.tenant)?;
        let spec = ForkSpec {
            id,
            created_by,
            now_ms: self.runtime.now_ms(),
            at,
        };
        let mut session = Session::fork_of(&stored, &events, spec)?;
        drop(stored);
        if session.header.config.route.is_none() {
            let route = self
                .runtime
                .provider
                .describe_route(&session.header.config.model);
            if route.is_some() {
                session.header.config.make_mut().route = route;
            }
        }
        self.runtime.store.claim(id).await?;
        crate::metrics::checkpoint(self.runtime.store.as_ref(), session.checkpoint()).await?;
        for e in session.mark_persisted() {
            self.runtime.hub.publish(id, Notification::Event(e));
        }
        Box::pin(self.runtime.spawn_root(session)).await?;
        Ok(id)
    }

    /// The points of session `id`'s history a fork can start from: each
    /// ended turn and each tool result, with its event sequence number and
    /// transcript index.
    pub async fn history(&self, id: SessionId) -> Result<Vec<HistoryPoint>, SessionError> {
        let store = &self.runtime.store;
        let stored = store.load(id).await?.ok_or(SessionError::NotFound(id))?;
        let all = usize::try_from(stored.header.last_event_seq).unwrap_or(usize::MAX);
        let events = store.events_after(id, 0, all).await?;
        Ok(fork_points(&stored, &events))
    }
}
