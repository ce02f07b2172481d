//! The trees of an open sled directory ([`Trees`]) and one opening of it
//! ([`Generation`]: the trees, how they are made durable, and why the
//! opening stopped taking writes). Opening (`open`), writing
//! (`group_commit`), purging (`purge`) and the webhook outbox (`webhooks`)
//! all work on these; none of them is owned here.

use std::sync::{Mutex, PoisonError};

use sled::Tree;

use super::durable::Durable;

#[derive(Clone)]
pub(in crate::store) struct Trees {
    pub(in crate::store) db: sled::Db,
    pub(in crate::store) sessions: Tree,
    pub(in crate::store) transcript: Tree,
    /// `id ‖ seq` → the events of one checkpoint, numbered from `seq`
    /// (layout 3; a single event in rows written by layouts 1 and 2).
    pub(in crate::store) events: Tree,
    /// `id ‖ seq` → a queued message (schema 2).
    pub(in crate::store) queue: Tree,
    /// `id` → the session's metadata, written once (schema 2).
    pub(in crate::store) metadata: Tree,
    pub(in crate::store) tenants: Tree,
    pub(in crate::store) active: Tree,
    pub(in crate::store) blobs: Tree,
    /// `sha256 hex ‖ id` → empty: which sessions reference each blob
    /// (layout version 2), so a purge deletes only blobs nobody else uses.
    pub(in crate::store) blob_refs: Tree,
    /// `tenant ‖ 0x00 ‖ time ‖ id ‖ call` → a row of the decision index
    /// (see `layout::decision_key`).
    pub(in crate::store) decisions: Tree,
    pub(in crate::store) meta: Tree,
    /// Test hook: when set, the writer stops each group right before its
    /// `sessions` writes (the commit record) and fails it, as a crash there
    /// would leave the trees.
    #[cfg(test)]
    pub(in crate::store) drop_headers: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Test hook: when set, each purge stops right after removing the
    /// session's header, as a crash there would leave the trees.
    #[cfg(test)]
    pub(in crate::store) stop_purges: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// One opening of the directory. After a write failure the writer closes it
/// and opens the directory again: what sled holds in memory past the last
/// confirmed flush must not outlive the failure (see `gate`).
pub(in crate::store) struct Generation {
    pub(in crate::store) trees: Trees,
    durable: Mutex<Durable>,
    /// Why this generation stopped taking writes, once it has.
    failure: Mutex<Option<String>>,
}

impl Generation {
    /// A new opening over `trees`, made durable by `durable`.
    pub(in crate::store::sled) fn new(trees: Trees, durable: Durable) -> Self {
        Self {
            trees,
            durable: Mutex::new(durable),
            failure: Mutex::new(None),
        }
    }

    /// Makes everything written to this generation so far durable.
    pub(in crate::store) fn flush(&self) -> Result<(), String> {
        self.durable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush()
    }

    /// Marks this generation failed; the first cause sticks.
    pub(in crate::store) fn fail(&self, cause: &str) {
        let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if failure.is_none() {
            *failure = Some(cause.to_owned());
        }
    }

    /// Why this generation failed, if it has.
    pub(in crate::store) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
