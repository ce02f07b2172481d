//! Internals that tests reach for (feature `testing`, never enabled by the
//! `overseer` crate's normal dependency; `tests/it/layout.rs` guards that):
//! a session's actor cell, to watch where it is supervised and when it
//! stops, a hibernation raced by a decision, the pure machine's first
//! checkpoint after a load, and sessions that keep their transcript at rest
//! (a reference run for the release at rest); [`sim`], the checkpoint
//! simulator the store tests share; and [`store`], the in-memory store with
//! the faults and probes the actor tests share.
//!
//! Nothing here is API: it may change with the internals it shows.

pub mod sim;
pub mod store;

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use ractor::ActorCell;

use crate::machine::Session;
use crate::messages::SessionMsg;
use crate::model::{SessionId, Submission};
use crate::store::{Checkpoint, StoredSession};
use crate::{Overseer, SessionError};

/// The cell of session `id`'s live actor, if it has one.
pub fn session_cell(overseer: &Overseer, id: SessionId) -> Option<ActorCell> {
    overseer.runtime.live.get(&id).map(|r| r.get_cell())
}

/// Asks session `id`'s live actor to hibernate and hands it `submission`
/// in the same breath: on a current-thread runtime nothing runs between
/// the two sends, so the actor drains with the decision already queued,
/// handles it, and stops with the work the decision started still open
/// (what happens when a message races a hibernation). `None` when `id` has
/// no live actor or the actor refused the messages; otherwise the
/// decision's answer.
pub async fn hibernate_then_decide(
    overseer: &Overseer,
    id: SessionId,
    submission: Submission,
) -> Option<Result<(), SessionError>> {
    let actor = overseer.runtime.live.get(&id).map(|r| r.clone())?;
    actor.cast(SessionMsg::HibernateIfIdle).ok()?;
    let (tx, rx) = ractor::concurrency::oneshot();
    actor.cast(SessionMsg::Decide(submission, tx.into())).ok()?;
    rx.await.ok()
}

/// Whether `cell` is a session actor's.
pub fn is_session_cell(cell: &ActorCell) -> bool {
    cell.is_message_type_of::<SessionMsg>() == Some(true)
}

/// What the machine writes with its next checkpoint after loading
/// `stored`, when loading it changed anything (an older record it
/// rewrites); `None` when nothing moved.
pub fn checkpoint_after_load(stored: StoredSession) -> Option<Checkpoint> {
    let session = Session::from_stored(stored);
    session.is_dirty().then(|| session.checkpoint())
}

/// Sessions that keep their transcript and metadata at rest: set only by
/// tests, so untouched (and never allocated) elsewhere.
static KEPT_AT_REST: OnceLock<Mutex<HashSet<SessionId>>> = OnceLock::new();

/// Session `id` (created or not yet) never releases its transcript and
/// metadata at rest: a reference run, to compare a released one with.
pub fn keep_at_rest(id: SessionId) {
    KEPT_AT_REST
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id);
}

/// Whether [`keep_at_rest`] was asked for `id`.
pub(crate) fn kept_at_rest(id: SessionId) -> bool {
    KEPT_AT_REST
        .get()
        .is_some_and(|kept| kept.lock().unwrap_or_else(|e| e.into_inner()).contains(&id))
}
