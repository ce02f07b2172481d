//! Internals that tests reach for (feature `testing`, never enabled by the
//! `overseer` crate's normal dependency; `tests/it/layout.rs` guards that):
//! a session's actor cell, to watch where it is supervised and when it
//! stops, and the pure machine's first checkpoint after a load; and [`sim`],
//! the checkpoint simulator the store tests share.
//!
//! Nothing here is API: it may change with the internals it shows.

pub mod sim;

use ractor::ActorCell;

use crate::machine::Session;
use crate::messages::SessionMsg;
use crate::model::SessionId;
use crate::store::{Checkpoint, StoredSession};
use crate::Overseer;

/// The cell of session `id`'s live actor, if it has one.
pub fn session_cell(overseer: &Overseer, id: SessionId) -> Option<ActorCell> {
    overseer.runtime.live.get(&id).map(|r| r.get_cell())
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
