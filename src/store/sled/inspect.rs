//! Reading a store directory with no server: [`Inspector`], behind
//! `overseer sessions list|show --data DIR` and `overseer store copy`
//! (which reads a directory of an older layout where it is, never
//! upgrading it).
//!
//! It opens the directory the way `overseer store check` does (no write of
//! ours: no layout stamp, no upgrade, no purge finished, no commit record;
//! sled itself rewrites its snapshot file on open) and reads sessions with
//! the same code a server reads them with, so what it shows is what a server
//! on the directory would show. A directory a running server holds is
//! refused ([`OpenError::Locked`]), never waited for.
//!
//! It deliberately has no write path and no async: it is for one command
//! that reads and exits.

use std::path::Path;

use overseer_actors::model::{Event, SessionId};
use overseer_actors::store::{SessionSummary, StoreError, StoredSession};

use super::open::{self, OpenError, Opened, Purpose};
use super::StoreOptions;

/// A store directory opened for reading only.
pub struct Inspector {
    opened: Opened,
}

impl Inspector {
    /// Opens the store in `dir`. Blocking. Refused, in one line naming the
    /// directory: a directory that holds no store (nothing is created
    /// there), one another process holds, one sled cannot read.
    pub fn open(dir: &Path) -> Result<Self, OpenError> {
        if !dir.join("db").is_file() {
            return Err(OpenError::Other {
                dir: dir.to_owned(),
                detail: "it holds no sled database (no db file): not a store directory".into(),
            });
        }
        let opened = open::open(dir, &StoreOptions::default(), Purpose::Inspect)?;
        Ok(Self { opened })
    }

    /// A session as a server would load it, or `None`.
    pub fn load(&self, id: SessionId) -> Result<Option<StoredSession>, StoreError> {
        self.opened.generation.trees.session(&id)
    }

    /// The session's events numbered above `after`, at most `limit`, as a
    /// server would read them.
    pub fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        self.opened.generation.trees.events_after(&id, after, limit)
    }

    /// Headers of every session, ascending by id, after `after`, at most
    /// `limit`.
    pub fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.opened.generation.trees.scan(after, limit)
    }
}
