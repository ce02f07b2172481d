//! A session at rest: letting go of what the store already holds, and
//! taking it back.
//!
//! A session that waits for someone else (a message, a decision) with
//! everything it holds checkpointed and durable keeps, in memory, only what
//! routing and cheap queries read: its header (status, open calls,
//! counters, where its queue is) and its queued messages. Its transcript and
//! metadata are exactly what the store reads back, so [`Session::release`]
//! drops them and [`Session::restore`] takes them back from a load before
//! the next transition. The counters that say where the next checkpoint
//! starts (entries persisted, queue rows, metadata written) are kept
//! untouched, so a restored session writes only what is new.
//!
//! Pure like the rest of the machine: the actor (`crate::session`) decides
//! when, does the read, and keeps a released session away from
//! [`Session::apply`], which refuses one anyway rather than transition on a
//! transcript that is not there.

use serde_json::Value;

use super::Session;
use crate::model::{SessionId, SessionStatus};
use crate::store::StoredSession;

/// Why a released session could not take back its transcript: the store's
/// copy is not the one it let go of. Nothing changed; the session stays
/// released.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum RestoreError {
    /// The store no longer holds the session.
    #[error("session {0} is no longer in the store")]
    Missing(SessionId),
    /// The store does not hold what was released (it lost entries that
    /// were confirmed durable, or answered for another session).
    #[error("the stored copy of session {id} is not the one it released: {detail}")]
    Diverged {
        /// The session.
        id: SessionId,
        /// What differs.
        detail: String,
    },
}

impl Session {
    /// Whether the session is at rest with nothing unwritten: it waits for
    /// a message or a decision (not terminal), its last checkpoint is
    /// durable (not dirty, no events pending) and no stream is half-read.
    pub(crate) fn is_at_rest(&self) -> bool {
        use SessionStatus::{AwaitingApproval, AwaitingInput, Pending};
        matches!(
            self.header.status,
            AwaitingApproval | AwaitingInput | Pending
        ) && self.is_settled()
            && !self.dirty
            && self.pending_events.is_empty()
            && self.partial.text.is_empty()
            && self.partial.calls.is_empty()
    }

    /// Whether the transcript and metadata are released (see the module docs).
    pub(crate) fn is_released(&self) -> bool {
        self.released
    }

    /// Lets go of the transcript and metadata if the session is at rest;
    /// whether it released them now.
    pub(crate) fn release(&mut self) -> bool {
        if self.released || !self.is_at_rest() {
            return false;
        }
        // Not `clear()`: the point is to give the buffer back.
        self.transcript = Vec::new();
        self.metadata = Value::Null;
        self.released = true;
        true
    }

    /// Takes back what [`Session::release`] let go of from `stored`, the
    /// session as the store reads it now: the entries it released (the
    /// first `transcript_len`, which the store keeps in place) and the
    /// metadata. The header in memory stays this session's own, exactly as
    /// if it had never released: whether the store has moved on since
    /// (another node took the session over) is for the store's fence to
    /// answer at the next checkpoint, not for this read. Refused, changing
    /// nothing, when the store does not hold what was released (the
    /// session is gone, or fewer entries are stored). Restoring a session
    /// that is not released does nothing.
    pub(crate) fn restore(&mut self, stored: Option<StoredSession>) -> Result<(), RestoreError> {
        if !self.released {
            return Ok(());
        }
        let id = self.header.id;
        let mut stored = stored.ok_or(RestoreError::Missing(id))?;
        let len = stored.transcript.len();
        let diverged = |detail: String| Err(RestoreError::Diverged { id, detail });
        if stored.header.id != id {
            return diverged(format!(
                "the store answered with session {}",
                stored.header.id
            ));
        }
        if len < self.persisted_entries
            || self.persisted_entries as u64 != self.header.transcript_len
        {
            return diverged(format!(
                "{len} transcript entries stored, {} released",
                self.header.transcript_len
            ));
        }
        stored.transcript.truncate(self.persisted_entries);
        self.transcript = stored.transcript;
        self.metadata = stored.metadata;
        self.released = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::tests::{approve, ctx, msg, registry, session};
    use super::*;

    /// A session parked on an approval, its checkpoints all durable, and
    /// what the store holds of it.
    fn parked() -> (Session, StoredSession) {
        let tools = registry();
        let mut s = session().with_metadata(json!({"k": "v"}));
        s.metadata_persisted = false;
        for input in [msg("go")]
            .into_iter()
            .chain(super::super::tests::calls(&["ask"]))
        {
            s.apply(input, ctx(&tools, 3)).unwrap();
            s.mark_persisted();
        }
        assert_eq!(s.header.status, SessionStatus::AwaitingApproval);
        let stored = s.to_stored();
        (s, stored)
    }

    #[test]
    fn a_session_at_rest_releases_and_restores_to_the_same_state() {
        let (mut s, stored) = parked();
        let before = format!("{:?}", s.to_stored());
        assert!(s.release());
        assert!(s.is_released());
        assert!(s.transcript.is_empty() && s.metadata.is_null());
        assert!(!s.release(), "released once");
        s.restore(Some(stored)).unwrap();
        assert!(!s.is_released());
        assert_eq!(format!("{:?}", s.to_stored()), before);
    }

    #[test]
    fn a_busy_or_unwritten_session_keeps_its_transcript() {
        let tools = registry();
        let mut s = session();
        s.apply(msg("go"), ctx(&tools, 1)).unwrap();
        assert!(!s.release(), "its checkpoint is not written yet");
        s.mark_persisted();
        assert_eq!(s.header.status, SessionStatus::Running);
        assert!(!s.release(), "a turn is running");
        assert!(!s.transcript.is_empty());
    }

    #[test]
    fn a_released_session_refuses_inputs_and_a_stale_copy() {
        let tools = registry();
        let (mut s, stored) = parked();
        assert!(s.release());
        let input = approve(&s);
        assert!(s.apply(input, ctx(&tools, 4)).is_err());
        assert!(!s.is_dirty(), "a refused input changes nothing");

        let mut stale = stored.clone();
        stale.transcript.pop();
        assert!(matches!(
            s.restore(Some(stale)),
            Err(RestoreError::Diverged { .. })
        ));
        assert_eq!(s.restore(None), Err(RestoreError::Missing(s.header.id)));
        assert!(s.is_released(), "still released after every refusal");
        s.restore(Some(stored)).unwrap();
    }

    /// A store that moved on (another node took the session over and
    /// wrote more) gives back the entries released, no more: the session
    /// goes on as if it had never released, and its next checkpoint meets
    /// the store's fence as it would have.
    #[test]
    fn a_store_that_moved_on_gives_back_what_was_released() {
        let (mut s, stored) = parked();
        let before = format!("{:?}", s.to_stored());
        assert!(s.release());
        let mut moved = stored.clone();
        moved.header.last_event_seq += 5;
        moved.transcript.push(moved.transcript[0].clone());
        s.restore(Some(moved)).unwrap();
        assert_eq!(format!("{:?}", s.to_stored()), before);
    }

    #[test]
    fn a_restored_session_checkpoints_only_what_is_new() {
        let tools = registry();
        let (mut s, stored) = parked();
        let (len, seq) = (s.transcript.len() as u64, s.header.last_event_seq);
        assert!(s.release());
        s.restore(Some(stored)).unwrap();
        let input = approve(&s);
        s.apply(input, ctx(&tools, 5)).unwrap();
        let cp = s.checkpoint();
        assert!(cp.metadata.is_none(), "the metadata was written before");
        assert!(
            cp.entries
                .iter()
                .map(|(i, _)| *i)
                .eq(len..s.header.transcript_len),
            "entries continue from {len}: {:?}",
            cp.entries.iter().map(|(i, _)| *i).collect::<Vec<_>>()
        );
        assert!(
            cp.events
                .iter()
                .map(|e| e.seq)
                .eq(seq + 1..=s.header.last_event_seq),
            "events continue from {seq}"
        );
        assert!(!cp.events.is_empty());
    }
}
