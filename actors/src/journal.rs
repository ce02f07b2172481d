//! The in-memory half of the effect journal: what this process knows of
//! the tool calls it dispatched and whose results their sessions have not yet
//! recorded.
//!
//! It survives a session actor's crash (not the process's), so a restart
//! in-process neither re-runs a tool that did not start or already finished
//! nor loses its result. The durable half (intent and outcome in the
//! checkpoint) is the machine's. Entries live exactly as long as their call
//! runs: after every transition the session prunes its entries to the calls
//! still running, and a session that ends drops all of its own.

use std::collections::HashMap;

use dashmap::DashMap;

use crate::machine::Dispatched;
use crate::model::{CallState, SessionId, SessionIdHasher, ToolCallId, ToolCallRecord};

/// Dispatched calls by session, then by call: (attempt, what is known).
#[derive(Debug, Default)]
pub(crate) struct Journal {
    by_session: DashMap<SessionId, HashMap<ToolCallId, (u32, Dispatched)>, SessionIdHasher>,
}

impl Journal {
    /// Records a dispatch `attempt` about to happen (by its session, before
    /// the intent is checkpointed).
    pub(crate) fn record(&self, id: SessionId, call: ToolCallId, attempt: u32, d: Dispatched) {
        self.by_session
            .entry(id)
            .or_default()
            .insert(call, (attempt, d));
    }

    /// Records how a dispatch went (by its tool-call actor), only if its
    /// session still journals that attempt: a call its session cancelled or
    /// forgot meanwhile is not brought back.
    pub(crate) fn advance(&self, id: SessionId, call: &ToolCallId, attempt: u32, d: Dispatched) {
        if let Some(mut entries) = self.by_session.get_mut(&id) {
            if let Some(entry) = entries.get_mut(call) {
                if entry.0 == attempt {
                    entry.1 = d;
                }
            }
        }
    }

    /// What is known of the running calls among `calls`, for a resume.
    pub(crate) fn known(
        &self,
        id: SessionId,
        calls: &[ToolCallRecord],
    ) -> Vec<(ToolCallId, u32, Dispatched)> {
        let Some(entries) = self.by_session.get(&id) else {
            return Vec::new();
        };
        calls
            .iter()
            .filter_map(|c| {
                let (attempt, d) = entries.get(&c.id)?;
                Some((c.id.clone(), *attempt, d.clone()))
            })
            .collect()
    }

    /// Keeps only the entries of calls that are running now, at the attempt
    /// that runs: everything else has been recorded durably (or was
    /// cancelled) and has served.
    pub(crate) fn retain_running(&self, id: SessionId, calls: &[ToolCallRecord]) {
        let empty = match self.by_session.get_mut(&id) {
            Some(mut entries) => {
                entries.retain(|call, (attempt, _)| {
                    calls.iter().any(|c| {
                        &c.id == call && c.attempt == *attempt && c.state == CallState::Running
                    })
                });
                entries.is_empty()
            }
            None => return,
        };
        if empty {
            self.by_session.remove_if(&id, |_, e| e.is_empty());
        }
    }

    /// Forgets every entry of a session (it ended).
    pub(crate) fn forget_session(&self, id: SessionId) {
        self.by_session.remove(&id);
    }

    /// Entries held, over all sessions (for leak checks).
    pub(crate) fn len(&self) -> usize {
        self.by_session.iter().map(|e| e.len()).sum()
    }
}
