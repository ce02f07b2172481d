//! Purging a session from the sled store (retention): its header, and
//! then every row it owns in every tree (its rows of the decision index
//! too), and the blobs no other session references.
//!
//! The order keeps the header the commit record, as for checkpoints: the
//! header goes first, so from then on the session does not exist for any
//! reader, and whatever rows a crash leaves behind are invisible (nothing
//! covers them). To make sure those rows do not stay for ever, a marker in
//! `meta` (`purge: ‖ id` → tenant) is written before the header is removed
//! and removed after the last row: a purge cut short is finished when the
//! directory is next opened for serving (`finish_pending`). Blobs are
//! released while the records that name them are still there, so a
//! finished-again purge finds them too; a blob is deleted once no
//! `blob_refs` entry names it any more. The header goes in one batch with
//! the session's reference to its configuration, and the configuration
//! with it when no other session names it (`configs`).
//!
//! Runs on the writer thread only (`group_commit`), like every other write,
//! and at open, before the writer starts. It deliberately decides nothing
//! about *which* sessions to purge: that is the runtime's retention policy.

use std::collections::BTreeSet;

use overseer_actors::model::SessionId;
use overseer_actors::store::StoreError;

use super::layout;
use super::trees::{Trees, View};

/// Why a purge did not complete.
pub(super) enum PurgeError {
    /// Refused before anything was written (not terminal, a header of a
    /// newer schema or one that does not decode).
    Refused(StoreError),
    /// sled failed midway: the database takes no more writes until reopened
    /// (the marker makes the reopened store finish the purge).
    Io(String),
}

fn io(what: impl std::fmt::Display, e: sled::Error) -> PurgeError {
    PurgeError::Io(format!("{what}: {e}"))
}

/// Purges session `id`. Returns whether anything was written (nothing for a
/// session that does not exist and has no purge pending).
pub(super) fn purge(trees: &Trees, id: &SessionId) -> Result<bool, PurgeError> {
    let marker = layout::purge_key(id);
    let stored = trees
        .sessions
        .get(id.as_bytes())
        .map_err(|e| io(format_args!("purging session {id}: reading its header"), e))?;
    let tenant = match stored {
        Some(bytes) => {
            let header = trees
                .decode_header(id, &bytes)
                .map_err(PurgeError::Refused)?;
            if !header.status.is_terminal() {
                return Err(PurgeError::Refused(StoreError::NotTerminal {
                    session: *id,
                    status: header.status,
                }));
            }
            trees
                .meta
                .insert(&marker, header.tenant.as_bytes())
                .map_err(|e| io(format_args!("purging session {id}: marking it"), e))?;
            // With its reference to its configuration, and the
            // configuration if it was the last to name it (`configs`).
            super::configs::remove_header(trees, id, &bytes)
                .map_err(|e| io(format_args!("purging session {id}: removing its header"), e))?;
            header.tenant
        }
        None => match trees
            .meta
            .get(&marker)
            .map_err(|e| io(format_args!("purging session {id}: reading its marker"), e))?
        {
            Some(tenant) => String::from_utf8_lossy(&tenant).into_owned(),
            None => return Ok(false),
        },
    };
    if stopped_after_header(trees) {
        return Err(PurgeError::Refused(StoreError::Io(
            "test hook: the purge stopped after the header".into(),
        )));
    }
    remove_rows(trees, id, &tenant)?;
    // Its webhook deliveries too (their log is indexed by session).
    super::webhooks::purge_deliveries(trees, id).map_err(|e| {
        io(
            format_args!("purging session {id}: its webhook deliveries"),
            e,
        )
    })?;
    trees
        .meta
        .remove(&marker)
        .map_err(|e| io(format_args!("purging session {id}: removing its marker"), e))?;
    Ok(true)
}

/// Everything of `id` but its header: blob references (and the blobs left
/// without one), decision index rows, records (and the transcript and
/// event rows of older layouts, none after the migration), queue,
/// metadata, index entries.
fn remove_rows(trees: &Trees, id: &SessionId, tenant: &str) -> Result<(), PurgeError> {
    let prefix = id.as_bytes();
    // The blobs and the decision rows are found through the records that
    // name them, so they go while the records are still there (a purge
    // finished again after a crash finds the rest).
    let hashes: BTreeSet<String> = trees
        .blobs_named(id)
        .map_err(|e| PurgeError::Io(format!("purging session {id}: {e}")))?
        .into_iter()
        .map(|(hash, _)| hash)
        .collect();
    for hash in hashes {
        trees
            .blob_refs
            .remove(layout::blob_ref_key(&hash, id))
            .map_err(|e| {
                io(
                    format_args!("purging session {id}: releasing blob {hash}"),
                    e,
                )
            })?;
        let referenced = trees
            .blob_refs
            .scan_prefix(hash.as_bytes())
            .next()
            .transpose()
            .map_err(|e| {
                io(
                    format_args!("purging session {id}: reading blob {hash}'s references"),
                    e,
                )
            })?
            .is_some();
        if !referenced {
            trees.blobs.remove(hash.as_bytes()).map_err(|e| {
                io(
                    format_args!("purging session {id}: removing blob {hash}"),
                    e,
                )
            })?;
        }
    }
    remove_decisions(trees, id, tenant)?;
    for (tree, name) in [
        (&trees.records, "records"),
        (&trees.transcript, "transcript"),
        (&trees.events, "events"),
        (&trees.queue, "queue"),
    ] {
        remove_prefix(tree, prefix)
            .map_err(|e| io(format_args!("purging session {id}: removing its {name}"), e))?;
    }
    let single: [(&View, Vec<u8>, &str); 3] = [
        (&trees.metadata, prefix.to_vec(), "metadata"),
        (&trees.active, prefix.to_vec(), "active index entry"),
        (
            &trees.tenants,
            layout::tenant_key(tenant, id),
            "tenant index entry",
        ),
    ];
    for (tree, key, name) in single {
        tree.remove(key)
            .map_err(|e| io(format_args!("purging session {id}: removing its {name}"), e))?;
    }
    Ok(())
}

/// Removes the decision index's rows of `id`: one per `decision_recorded`
/// event in its log.
fn remove_decisions(trees: &Trees, id: &SessionId, tenant: &str) -> Result<(), PurgeError> {
    let positions = trees
        .decisions_recorded(id)
        .map_err(|e| io(format_args!("purging session {id}: reading its events"), e))?;
    for position in positions {
        trees
            .decisions
            .remove(layout::decision_key(tenant, &position))
            .map_err(|e| {
                io(
                    format_args!("purging session {id}: removing its decision rows"),
                    e,
                )
            })?;
    }
    Ok(())
}

/// Removes every key of `tree` that starts with `prefix`, in batches (the
/// keys of a batch are read before any is removed).
fn remove_prefix(tree: &View, prefix: &[u8]) -> Result<(), sled::Error> {
    const BATCH: usize = 1024;
    loop {
        let keys = tree
            .scan_prefix(prefix)
            .keys()
            .take(BATCH)
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Ok(());
        }
        for key in keys {
            tree.remove(key)?;
        }
    }
}

/// Finishes every purge a marker says was begun and not finished (a crash
/// cut it short). Called when a directory is opened for serving.
pub(super) fn finish_pending(trees: &Trees) -> Result<usize, String> {
    let ids = trees
        .meta
        .scan_prefix(layout::PURGE_PREFIX)
        .keys()
        .map(|k| {
            let key = k.map_err(|e| format!("reading the purge markers: {e}"))?;
            layout::id_from(&key[layout::PURGE_PREFIX.len()..])
                .ok_or_else(|| "a malformed purge marker".to_owned())
        })
        .collect::<Result<Vec<_>, _>>()?;
    for id in &ids {
        match purge(trees, id) {
            Ok(_) => {}
            Err(PurgeError::Io(e)) => return Err(e),
            // Only a header that came back, or changed, after the purge
            // began: the session stays, whole, and the purge is abandoned.
            Err(PurgeError::Refused(e)) => {
                tracing::warn!(session_id = %id, error = %e, "abandoning a purge an earlier process began");
                trees
                    .meta
                    .remove(layout::purge_key(id))
                    .map_err(|e| format!("removing the purge marker of session {id}: {e}"))?;
            }
        }
    }
    if !ids.is_empty() {
        tracing::info!(
            purges = ids.len(),
            "finished purges an earlier process began"
        );
    }
    Ok(ids.len())
}

/// Test hook: whether to stop each purge right after its header is gone, as
/// a crash there would.
#[cfg(test)]
fn stopped_after_header(trees: &Trees) -> bool {
    trees.stop_purges.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(not(test))]
fn stopped_after_header(_: &Trees) -> bool {
    false
}
