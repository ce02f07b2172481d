//! The I/O half of a session at rest: when the actor releases its
//! transcript and metadata, which messages read them back first, and what
//! a failed read does. The rules for what is released and when a copy read
//! back is the right one are the machine's (`crate::machine`'s `rest`).
//!
//! A session releases once it has stayed at rest (idle as for
//! hibernation, with its last checkpoint durable) for the runtime's rest
//! delay (`RuntimeConfig::rest_after`): the idle driver asks it then, with
//! the count of messages it had handled when it came to rest, and a
//! session that handled one since ignores the request. A session decided
//! or answered within the delay never reads itself back: releasing at once
//! made every quick decision a whole-session read and decode, about an
//! eighth of the instructions of an approved session. With no delay, it
//! releases as soon as a message or supervision event leaves it at rest.
//! Never when its actor starts: an actor is started (woken, restarted) for
//! the message that follows, which would read the store again at once.
//!
//! Only on a store whose reads are local ([`crate::store::CheckpointStore::reads_are_local`]):
//! a read over the network before every decision costs more than the memory
//! saves, so there sessions keep what they hold until they hibernate.
//!
//! A failed read loses nothing: the session is at rest, so the store holds
//! all of it. A request is refused (the caller retries), the session stays
//! released and the next message reads again. An input nobody waits for (a
//! timer, a child's report) must not be dropped, so the actor fails
//! instead, and its supervisor brings it back from its checkpoint, which
//! re-derives those inputs (timers re-armed, children's results re-read);
//! a store that is down delays that restart without counting against it.
//!
//! The read is no ownership check: a store another node has written to
//! since (it took the session over) gives back the entries released, and
//! the session goes on as if it had kept them, so its next checkpoint
//! meets the store's fence exactly as it would have.

use ractor::ActorProcessingErr;

use super::SessionState;
use crate::error::SessionError;
use crate::machine::RestoreError;
use crate::messages::SessionMsg;
use crate::store::StoreError;

/// Why a released session could not take back what it released.
#[derive(Debug)]
pub(super) enum Unrestored {
    /// The store could not be read.
    Store(StoreError),
    /// The store's copy is not the one released (see [`RestoreError`]).
    Diverged(RestoreError),
}

impl Unrestored {
    /// The actor's failure, as its supervisor reads it: a store error
    /// itself, so a store that is down is seen as such.
    pub(super) fn into_fatal(self) -> ActorProcessingErr {
        match self {
            Self::Store(e) => Box::new(e),
            Self::Diverged(e) => Box::new(e),
        }
    }
}

impl std::fmt::Display for Unrestored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(e) => e.fmt(f),
            Self::Diverged(e) => e.fmt(f),
        }
    }
}

/// Whether handling `msg` reads the transcript or metadata, or may
/// transition the session. The header alone answers the rest; provider
/// reports of a stream other than `stream_attempt` are ignored unread.
pub(super) fn needs_session(msg: &SessionMsg, stream_attempt: u64) -> bool {
    match msg {
        SessionMsg::Traced(_, inner) => needs_session(inner, stream_attempt),
        SessionMsg::Provider { attempt, .. } | SessionMsg::StreamEnded { attempt, .. } => {
            *attempt == stream_attempt
        }
        // Header reads, the parent's bookkeeping of its children (which
        // reads its open calls), hibernation.
        SessionMsg::GetHeader(_)
        | SessionMsg::ActivateChild(..)
        | SessionMsg::RestartChild(_)
        | SessionMsg::Hibernate(_)
        | SessionMsg::HibernateIfIdle
        | SessionMsg::Rest(_) => false,
        #[cfg(feature = "fault-injection")]
        SessionMsg::InjectedPanic => false,
        SessionMsg::Send(..)
        | SessionMsg::Decide(..)
        | SessionMsg::Cancel(_)
        | SessionMsg::CancelFromParent
        | SessionMsg::Interrupt(_)
        | SessionMsg::SetModel(..)
        | SessionMsg::SetToolRule(..)
        | SessionMsg::ExpireInput(_)
        | SessionMsg::ActivateSkill(..)
        | SessionMsg::Done(_)
        | SessionMsg::Get(_)
        | SessionMsg::ToolFinished { .. }
        | SessionMsg::ApprovalTimeout { .. }
        | SessionMsg::ChildFinished { .. }
        | SessionMsg::ChildWaiting { .. } => true,
    }
}

/// Answers `msg`'s caller with `error`, if it has one; whether it had.
/// A state read (`Get`) is dropped unanswered: its caller then reads the
/// store itself.
fn refuse(msg: SessionMsg, error: SessionError) -> bool {
    match msg {
        SessionMsg::Traced(_, inner) => refuse(*inner, error),
        SessionMsg::Send(_, _, reply)
        | SessionMsg::Decide(_, reply)
        | SessionMsg::Cancel(reply)
        | SessionMsg::Interrupt(reply)
        | SessionMsg::SetModel(_, reply)
        | SessionMsg::SetToolRule(_, reply)
        | SessionMsg::ActivateSkill(_, reply)
        | SessionMsg::Done(reply) => {
            let _ = reply.send(Err(error));
            true
        }
        SessionMsg::Get(reply) => {
            drop(reply);
            true
        }
        _ => false,
    }
}

impl SessionState {
    /// After a message: releases at once if the runtime has no rest delay.
    /// With one, the idle driver asks once the session has stayed idle
    /// that long (`SessionMsg::Rest`).
    pub(super) fn rest_at_once(&mut self) {
        if self.runtime.config.rest_after.is_zero() {
            self.release_at_rest();
        }
    }

    /// Releases the transcript and metadata if the session is at rest:
    /// idle as for hibernation, and not about to stop anyway.
    pub(super) fn release_at_rest(&mut self) {
        #[cfg(feature = "testing")]
        if crate::testing::kept_at_rest(self.session.header.id) {
            return;
        }
        if !self.draining
            && self.runtime.store.reads_are_local()
            && self.is_idle()
            && self.session.release()
        {
            tracing::trace!(session_id = %self.session.header.id, "released at rest");
        }
    }

    /// Reads the session back and takes what it released; on failure it
    /// stays released, unchanged.
    pub(super) async fn restore(&mut self) -> Result<(), Unrestored> {
        let id = self.session.header.id;
        let stored = self
            .runtime
            .store
            .load(id)
            .await
            .map_err(Unrestored::Store)?;
        self.session.restore(stored).map_err(Unrestored::Diverged)?;
        tracing::trace!(session_id = %id, "restored");
        Ok(())
    }

    /// `msg` needed what the session released, and `why` it could not be
    /// read back (see the module docs for what each case does).
    pub(super) fn unrestored(
        &self,
        msg: SessionMsg,
        why: Unrestored,
    ) -> Result<(), ActorProcessingErr> {
        let id = self.session.header.id;
        tracing::warn!(session_id = %id, "could not read the released session back: {why}");
        match why {
            Unrestored::Store(e) => {
                if refuse(msg, SessionError::Store(e.clone())) {
                    Ok(())
                } else {
                    Err(Box::new(e))
                }
            }
            // The store lost what it confirmed (or answered for another
            // session): its supervisor reloads what the store holds, and
            // the caller asks again.
            Unrestored::Diverged(e) => {
                let reason = e.to_string();
                refuse(msg, SessionError::Unavailable { id, reason });
                Err(Box::new(e))
            }
        }
    }
}
