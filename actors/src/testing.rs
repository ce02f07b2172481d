//! Internals that tests reach for (feature `testing`, never enabled by the
//! `overseer` crate's normal dependency; `tests/it/layout.rs` guards that):
//! a session's actor cell, to watch where it is supervised and when it
//! stops, a hibernation raced by a decision, and the pure machine's first checkpoint after a load; and [`sim`],
//! the checkpoint simulator the store tests share.
//!
//! Nothing here is API: it may change with the internals it shows.

pub mod sim;

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
