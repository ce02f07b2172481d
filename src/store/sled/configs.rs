//! Interned agent configurations in the sled store: each distinct
//! configuration is one row of [`Kind::Configs`](super::trees::Kind)
//! (`G`: sha256 hex → JSON), and each session whose stored header names it
//! one row of [`Kind::ConfigRefs`](super::trees::Kind) (`g`: sha256 hex ‖
//! id → empty), like blobs and their references. Both are written in the
//! batch of the checkpoint that takes the configuration up (a session's
//! first, or a change of configuration), so a header never names a
//! configuration that is not there; a checkpoint under the configuration
//! its session already had writes neither.
//!
//! References by session rather than a counter: a purge cut short by a
//! crash is finished again from its marker (`purge`), and removing a
//! session's reference is idempotent where decrementing a count is not.
//! Whether anyone else still names a configuration is a prefix walk that
//! stops at the first other reference. The header, its reference and, when
//! it was the last, the configuration go in one batch (`remove_header`).
//!
//! It owns the rows and their upkeep; the encoding of a header naming its
//! configuration is the shared `store::configs`'s, the group's batch
//! `group_commit`'s.

use std::collections::{HashMap, HashSet};

use overseer_actors::model::{SessionHeader, SessionId};
use overseer_actors::store::StoreError;
use sled::IVec;

use super::trees::Trees;
use crate::store::configs;

/// `sha256 hex ‖ id`: a session's reference to a configuration. By hash
/// first, so whether anyone else names it is one prefix walk.
pub(super) fn ref_key(hash: &str, id: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(hash.len() + 16);
    key.extend_from_slice(hash.as_bytes());
    key.extend_from_slice(id.as_bytes());
    key
}

impl Trees {
    /// Decodes a stored header with the configuration it names (see
    /// `store::configs`), shared with every header read since the store
    /// opened that names it; a header embedding its configuration as it is.
    pub(in crate::store) fn decode_header(
        &self,
        id: &SessionId,
        bytes: &[u8],
    ) -> Result<SessionHeader, StoreError> {
        configs::decode_header_kept(id, bytes, &self.decoded_configs, |hash| {
            self.configs.get(hash.as_bytes()).map_err(|e| {
                StoreError::io(format!("reading configuration {hash} of session {id}"), e)
            })
        })
    }
}

/// What the sessions of one group did with configurations: net per
/// session over the group (its stored configuration before the group, the
/// one its last checkpoint names), like the indexes.
#[derive(Default)]
pub(super) struct Changes {
    /// (hash, session): the session takes the configuration up.
    taken: Vec<(String, SessionId)>,
    /// (hash, session): the session no longer names the configuration.
    left: Vec<(String, SessionId)>,
    /// The JSON of every configuration taken up.
    json: HashMap<String, IVec>,
}

impl Changes {
    /// Session `id` named `before` (`None`: no header, or one embedding its
    /// configuration) and names `after` (hash, JSON) once the group is
    /// written.
    pub(super) fn record(&mut self, id: SessionId, before: Option<&str>, after: &(String, IVec)) {
        let (hash, json) = after;
        if before == Some(hash.as_str()) {
            return;
        }
        self.taken.push((hash.clone(), id));
        self.json
            .entry(hash.clone())
            .or_insert_with(|| json.clone());
        if let Some(old) = before {
            self.left.push((old.to_owned(), id));
        }
    }
}

/// The rows a group writes for its [`Changes`]: (key, value) to insert and
/// keys to remove, per kind.
#[derive(Default)]
pub(super) struct Rows {
    pub(super) configs: Vec<(IVec, IVec)>,
    pub(super) configs_removed: Vec<IVec>,
    pub(super) refs: Vec<(IVec, IVec)>,
    pub(super) refs_removed: Vec<IVec>,
}

/// Turns a group's changes into rows: a reference per session taking a
/// configuration up, the configuration itself when it is not stored yet;
/// the reference of each session leaving one, and the configuration when
/// nobody names it any more: neither a stored reference the group leaves
/// alone nor one the group adds. Reads only (the writer is the only one
/// writing, so what it reads stays true until its batch is applied).
pub(super) fn rows(trees: &Trees, changes: Changes) -> Result<Rows, String> {
    let Changes { taken, left, json } = changes;
    let mut rows = Rows::default();
    let read = |what: &str, e: sled::Error| format!("reading {what}: {e}");
    let mut taken_hashes = HashSet::new();
    for (hash, id) in &taken {
        rows.refs
            .push((ref_key(hash, id).into(), IVec::from(&[][..])));
        taken_hashes.insert(hash.as_str());
    }
    for hash in &taken_hashes {
        let stored = trees
            .configs
            .contains_key(hash.as_bytes())
            .map_err(|e| read(&format!("configuration {hash}"), e))?;
        if !stored {
            if let Some(value) = json.get(*hash) {
                rows.configs.push((hash.as_bytes().into(), value.clone()));
            }
        }
    }
    let removed: HashSet<Vec<u8>> = left.iter().map(|(hash, id)| ref_key(hash, id)).collect();
    let mut checked = HashSet::new();
    for (hash, id) in &left {
        rows.refs_removed.push(ref_key(hash, id).into());
        if taken_hashes.contains(hash.as_str()) || !checked.insert(hash.as_str()) {
            continue;
        }
        // At most as many keys as the group removes are skipped.
        let mut named = false;
        for key in trees.config_refs.scan_prefix(hash.as_bytes()).keys() {
            let key = key.map_err(|e| read(&format!("the references to {hash}"), e))?;
            if !removed.contains(key.as_ref()) {
                named = true;
                break;
            }
        }
        if !named {
            rows.configs_removed.push(hash.as_bytes().into());
        }
    }
    Ok(rows)
}

/// Removes a session's header (`bytes` as stored) in one batch with its
/// reference to its configuration, and the configuration when no other
/// session names it: a purge's first write after its marker.
pub(super) fn remove_header(trees: &Trees, id: &SessionId, bytes: &[u8]) -> sled::Result<()> {
    let mut batch = sled::Batch::default();
    trees.sessions.batch_remove(&mut batch, id.as_bytes());
    if let Some(hash) = configs::hash_of(bytes) {
        let own = ref_key(hash, id);
        trees.config_refs.batch_remove(&mut batch, &own);
        let mut named = false;
        for key in trees
            .config_refs
            .scan_prefix(hash.as_bytes())
            .keys()
            .take(2)
        {
            if key?.as_ref() != own.as_slice() {
                named = true;
                break;
            }
        }
        if !named {
            trees.configs.batch_remove(&mut batch, hash.as_bytes());
        }
    }
    // Every view of a store being served is a kind of the one tree.
    trees.data.apply_batch(batch)
}

/// `store check`: a header naming a configuration has its reference to it
/// (or a purge of another session could delete it).
pub(super) fn check_reference(trees: &Trees, id: &SessionId, bytes: &[u8]) -> Result<(), String> {
    let Some(hash) = configs::hash_of(bytes) else {
        return Ok(());
    };
    let referenced = trees
        .config_refs
        .contains_key(ref_key(hash, id))
        .map_err(|e| format!("reading the configuration references: {e}"))?;
    if referenced {
        Ok(())
    } else {
        Err(format!(
            "its header names configuration {hash} without a reference to it: purging \
             another session could delete it"
        ))
    }
}

/// Configurations and references stored (`store check`'s summary).
pub(super) fn count(trees: &Trees) -> sled::Result<(usize, usize)> {
    let mut configs = 0;
    for item in trees.configs.iter() {
        item?;
        configs += 1;
    }
    let mut refs = 0;
    for item in trees.config_refs.iter() {
        item?;
        refs += 1;
    }
    Ok((configs, refs))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use overseer_actors::model::SessionStatus;
    use overseer_actors::store::CheckpointStore;
    use overseer_actors::testing::sim::{assert_same, Sim};

    use super::super::open;
    use super::super::{Durability, SledStore};
    use super::*;

    fn raw(dir: &Path) -> Trees {
        let db = open::open_retrying(&sled::Config::new().path(dir)).unwrap();
        Trees::over(&db, false, true).unwrap()
    }

    /// A header that embeds its configuration (written before interning)
    /// reads as it is, is interned by its next checkpoint, and a purge
    /// counts it only from then on; `store check` finds a header naming a
    /// configuration without its reference.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_header_embedding_its_configuration_reads_and_is_interned_next() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), Durability::Fsync).unwrap();
        let (mut old, mut new) = (Sim::new("acme"), Sim::new("acme"));
        old.write(&store).await;
        new.write(&store).await;
        assert_eq!(store.stored_configs().await.unwrap(), 1);
        drop(store);
        {
            // `old` as a binary before interning wrote it.
            let trees = raw(dir.path());
            let stored = trees.sessions.get(old.id().as_bytes()).unwrap().unwrap();
            let hash = configs::hash_of(&stored).unwrap().to_owned();
            let embedded = configs::join(&old.id(), &stored, |h| {
                trees.configs.get(h).map_err(|e| StoreError::io("test", e))
            })
            .unwrap();
            assert!(configs::hash_of(&embedded).is_none());
            trees
                .sessions
                .insert(old.id().as_bytes(), embedded.to_vec())
                .unwrap();
            trees.config_refs.remove(ref_key(&hash, &old.id())).unwrap();
            trees.db.flush().unwrap();
        }
        let store = SledStore::open(dir.path(), Durability::Fsync).unwrap();
        assert_same(&store.load(old.id()).await.unwrap().unwrap(), &old);
        assert_eq!(store.stored_configs().await.unwrap(), 1);

        // Purging `new`, the only one naming it: gone, and `old` (which
        // embeds it) reads on.
        new.status(SessionStatus::Completed);
        new.write(&store).await;
        store.purge(new.id()).await.unwrap();
        assert_eq!(store.stored_configs().await.unwrap(), 0);
        assert_same(&store.load(old.id()).await.unwrap().unwrap(), &old);

        // Its next checkpoint interns it; its purge takes it.
        old.status(SessionStatus::Completed);
        old.write(&store).await;
        assert_eq!(store.stored_configs().await.unwrap(), 1);
        assert_same(&store.load(old.id()).await.unwrap().unwrap(), &old);
        drop(store);
        {
            let trees = raw(dir.path());
            let stored = trees.sessions.get(old.id().as_bytes()).unwrap().unwrap();
            let hash = configs::hash_of(&stored).unwrap().to_owned();
            assert!(check_reference(&trees, &old.id(), &stored).is_ok());
            trees.config_refs.remove(ref_key(&hash, &old.id())).unwrap();
            let problem = check_reference(&trees, &old.id(), &stored).unwrap_err();
            assert!(problem.contains(&hash), "{problem}");
            trees
                .config_refs
                .insert(ref_key(&hash, &old.id()), IVec::from(&b""[..]))
                .unwrap();
            trees.db.flush().unwrap();
        }
        let store = SledStore::open(dir.path(), Durability::Fsync).unwrap();
        store.purge(old.id()).await.unwrap();
        assert_eq!(store.stored_configs().await.unwrap(), 0);
        assert!(store.load(old.id()).await.unwrap().is_none());
    }
}
