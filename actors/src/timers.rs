//! Approval timers (§6): one per pending approval, owned here rather than by
//! a session actor, so that a deadline still fires while its session
//! hibernates (the timer's delivery activates the session).
//!
//! Each timer is keyed by (session, call) and remembers its deadline. Arming
//! the same deadline again is a no-op; arming a different one (a call asked
//! again after an in-process restart) replaces the old timer. After every
//! checkpointed transition the session keeps only the timers of the calls that
//! still wait for a decision, so a decision, a cancel or the end of a session
//! disarms them at once and no stale timer wakes a hibernated session for
//! nothing. This module owns the bookkeeping only; what a timeout means is
//! the machine's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::task::AbortHandle;

use crate::model::{SessionId, SessionIdHasher, ToolCallId};

struct Armed {
    deadline_ms: i64,
    generation: u64,
    handle: AbortHandle,
}

/// The armed approval timers of this process.
#[derive(Default)]
pub struct ApprovalTimers {
    by_session: DashMap<SessionId, HashMap<ToolCallId, Armed>, SessionIdHasher>,
    next_generation: AtomicU64,
}

impl std::fmt::Debug for ApprovalTimers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalTimers")
            .field("armed", &self.len())
            .finish()
    }
}

impl ApprovalTimers {
    /// Whether a timer for this deadline is already armed.
    pub(crate) fn is_armed(&self, id: SessionId, call: &ToolCallId, deadline_ms: i64) -> bool {
        self.by_session
            .get(&id)
            .and_then(|calls| calls.get(call).map(|a| a.deadline_ms == deadline_ms))
            .unwrap_or(false)
    }

    /// A fresh generation number for a timer about to be armed.
    pub(crate) fn generation(&self) -> u64 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    /// Records an armed timer, aborting the one it replaces.
    pub(crate) fn insert(
        &self,
        id: SessionId,
        call: ToolCallId,
        deadline_ms: i64,
        generation: u64,
        handle: AbortHandle,
    ) {
        let old = self.by_session.entry(id).or_default().insert(
            call,
            Armed {
                deadline_ms,
                generation,
                handle,
            },
        );
        if let Some(old) = old {
            old.handle.abort();
        }
    }

    /// A timer fired: forget it, unless it was replaced meanwhile.
    pub(crate) fn fired(&self, id: SessionId, call: &ToolCallId, generation: u64) {
        if let Some(mut calls) = self.by_session.get_mut(&id) {
            if calls.get(call).is_some_and(|a| a.generation == generation) {
                calls.remove(call);
            }
        }
        self.by_session.remove_if(&id, |_, calls| calls.is_empty());
    }

    /// Disarms every timer of `id` whose call is not among `pending`.
    pub(crate) fn retain<'a>(
        &self,
        id: SessionId,
        pending: impl Iterator<Item = &'a ToolCallId> + Clone,
    ) {
        let Some(mut calls) = self.by_session.get_mut(&id) else {
            return;
        };
        calls.retain(|call, armed| {
            let keep = pending.clone().any(|p| p == call);
            if !keep {
                armed.handle.abort();
            }
            keep
        });
        let empty = calls.is_empty();
        drop(calls);
        if empty {
            self.by_session.remove_if(&id, |_, calls| calls.is_empty());
        }
    }

    /// Disarms every timer of a session (it ended).
    pub(crate) fn disarm_session(&self, id: SessionId) {
        if let Some((_, calls)) = self.by_session.remove(&id) {
            for armed in calls.values() {
                armed.handle.abort();
            }
        }
    }

    /// Timers armed now, over all sessions.
    pub fn len(&self) -> usize {
        self.by_session.iter().map(|e| e.len()).sum()
    }

    /// Whether no timer is armed.
    pub fn is_empty(&self) -> bool {
        self.by_session.is_empty()
    }
}

impl Drop for ApprovalTimers {
    fn drop(&mut self) {
        for calls in self.by_session.iter() {
            for armed in calls.values() {
                armed.handle.abort();
            }
        }
    }
}
