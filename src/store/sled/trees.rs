//! The trees of an open sled directory ([`Trees`]) and one opening of it
//! ([`Generation`]: the trees, how they are made durable, and why the
//! opening stopped taking writes). Opening (`open`), writing
//! (`group_commit`), purging (`purge`) and the webhook outbox (`webhooks`)
//! all work on these; none of them is owned here.

use std::sync::{Mutex, PoisonError};

use std::ops::{Bound, RangeBounds};

use sled::{IVec, Tree};

use super::durable::Durable;

/// The one sled tree of layout 4 that holds every row a checkpoint writes
/// (see `super` for why one tree).
pub(in crate::store) const DATA_TREE: &str = "data";

/// What a row of [`DATA_TREE`] is: its key's first byte. Every kind used to
/// be a tree of its own (layouts 1 to 3, named by [`Kind::legacy_tree`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) enum Kind {
    Sessions,
    Transcript,
    Events,
    Queue,
    Metadata,
    Tenants,
    Active,
    Blobs,
    BlobRefs,
    Decisions,
    /// `commit_seq`, `health_check`, purge markers (not `format_version`,
    /// which stays in the `meta` tree, where every binary looks for it).
    Meta,
    /// The webhook outbox rows checkpoints wrote before [`Kind::Hooked`]
    /// (`webhooks`): still read, to deliver what an older binary left.
    Outbox,
    /// Interned agent configurations: sha256 hex → JSON (`configs`). No
    /// layout-3 binary wrote any; a layout-3 directory made from a newer one
    /// by hand (tests) may hold them in a tree named like the kind.
    Configs,
    /// sha256 hex ‖ id → empty: a session whose header names the
    /// configuration (`configs`).
    ConfigRefs,
    /// Layout 5: one record per checkpoint (`records`), keyed by the
    /// session's counters after it. Not in [`Kind::ALL`]: no layout before
    /// 5 had it, so the move into one tree (`migrate`) has nothing of it to
    /// copy; `migrate5` writes it.
    Records,
    /// BE u64 group number → the sessions and event numbers of the group's
    /// checkpoints whose events owe webhook deliveries, until every one is
    /// settled (`webhooks`). Not in [`Kind::ALL`]: no layout before 5 had
    /// it.
    Hooked,
}

impl Kind {
    /// Every kind, in the order a migration copies them.
    pub(in crate::store) const ALL: [Kind; 14] = [
        Kind::Sessions,
        Kind::Transcript,
        Kind::Events,
        Kind::Queue,
        Kind::Metadata,
        Kind::Tenants,
        Kind::Active,
        Kind::Blobs,
        Kind::BlobRefs,
        Kind::Decisions,
        Kind::Meta,
        Kind::Outbox,
        Kind::Configs,
        Kind::ConfigRefs,
    ];

    /// The first byte of the keys of this kind in [`DATA_TREE`]. Letters,
    /// so that a hex dump reads; all below 0xff, so a kind's range ends at
    /// the next byte.
    pub(in crate::store) const fn prefix(self) -> u8 {
        match self {
            Kind::Sessions => b'S',
            Kind::Transcript => b'T',
            Kind::Events => b'E',
            Kind::Queue => b'Q',
            Kind::Metadata => b'M',
            Kind::Tenants => b'N',
            Kind::Active => b'A',
            Kind::Blobs => b'B',
            Kind::BlobRefs => b'R',
            Kind::Decisions => b'D',
            Kind::Meta => b'm',
            Kind::Outbox => b'O',
            Kind::Configs => b'G',
            Kind::ConfigRefs => b'g',
            Kind::Records => b'C',
            Kind::Hooked => b'W',
        }
    }

    /// The tree this kind had to itself in layouts 1 to 3.
    pub(in crate::store) const fn legacy_tree(self) -> &'static str {
        match self {
            Kind::Sessions => "sessions",
            Kind::Transcript => "transcript",
            Kind::Events => "events",
            Kind::Queue => "queue",
            Kind::Metadata => "metadata",
            Kind::Tenants => "tenants",
            Kind::Active => "active",
            Kind::Blobs => "blobs",
            Kind::BlobRefs => "blob_refs",
            Kind::Decisions => "decisions",
            Kind::Meta => "meta",
            Kind::Outbox => "webhook_outbox",
            Kind::Configs => "configs",
            Kind::ConfigRefs => "config_refs",
            // Never trees of their own (see the variants).
            Kind::Records => "records",
            Kind::Hooked => "webhook_groups",
        }
    }
}

/// The rows of one [`Kind`]: the subset of `sled::Tree`'s API the store
/// uses, over the kind's keys in [`DATA_TREE`] with its prefix byte put in
/// front of every key given and taken off every key returned. Over a
/// directory of layout 3 opened only to read it (`store check`, `store
/// copy`), a view is the kind's own old tree, keys as they are.
#[derive(Clone)]
pub(in crate::store) struct View {
    tree: Tree,
    /// `None`: the whole tree is this kind's (a layout-3 tree).
    prefix: Option<u8>,
}

/// An iterator over a [`View`]'s rows, keys without the prefix.
pub(in crate::store) struct ViewIter {
    inner: sled::Iter,
    strip: usize,
}

impl ViewIter {
    fn strip(&self, item: sled::Result<(IVec, IVec)>) -> sled::Result<(IVec, IVec)> {
        item.map(|(k, v)| (k.subslice(self.strip, k.len() - self.strip), v))
    }

    /// The keys only.
    pub(in crate::store) fn keys(self) -> impl DoubleEndedIterator<Item = sled::Result<IVec>> {
        self.map(|item| item.map(|(k, _)| k))
    }
}

impl Iterator for ViewIter {
    type Item = sled::Result<(IVec, IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.inner.next()?;
        Some(self.strip(item))
    }
}

impl DoubleEndedIterator for ViewIter {
    fn next_back(&mut self) -> Option<Self::Item> {
        let item = self.inner.next_back()?;
        Some(self.strip(item))
    }
}

impl View {
    /// The rows of `kind` in `data` (layout 4).
    pub(in crate::store) fn new(data: &Tree, kind: Kind) -> Self {
        Self {
            tree: data.clone(),
            prefix: Some(kind.prefix()),
        }
    }

    /// A layout-3 tree as it is.
    pub(in crate::store) fn legacy(tree: Tree) -> Self {
        Self { tree, prefix: None }
    }

    /// `key` as stored: the prefix, then `key`.
    pub(in crate::store) fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut full = Vec::with_capacity(key.len() + 1);
        full.extend(self.prefix);
        full.extend_from_slice(key);
        full
    }

    fn bound(&self, bound: Bound<&[u8]>, end: bool) -> Bound<Vec<u8>> {
        match (bound, self.prefix) {
            (Bound::Included(k), _) => Bound::Included(self.key(k)),
            (Bound::Excluded(k), _) => Bound::Excluded(self.key(k)),
            (Bound::Unbounded, None) => Bound::Unbounded,
            (Bound::Unbounded, Some(p)) if end => Bound::Excluded(vec![p + 1]),
            (Bound::Unbounded, Some(p)) => Bound::Included(vec![p]),
        }
    }

    fn iter_of(&self, inner: sled::Iter) -> ViewIter {
        ViewIter {
            inner,
            strip: usize::from(self.prefix.is_some()),
        }
    }

    pub(in crate::store) fn get(&self, key: impl AsRef<[u8]>) -> sled::Result<Option<IVec>> {
        self.tree.get(self.key(key.as_ref()))
    }

    pub(in crate::store) fn contains_key(&self, key: impl AsRef<[u8]>) -> sled::Result<bool> {
        self.tree.contains_key(self.key(key.as_ref()))
    }

    /// Writes one row on its own: for what is not a checkpoint (purges,
    /// migrations, the health check, webhook intake). Checkpoints go
    /// through [`View::batch_insert`].
    pub(in crate::store) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<IVec>,
    ) -> sled::Result<Option<IVec>> {
        self.tree.insert(self.key(key.as_ref()), value)
    }

    pub(in crate::store) fn remove(&self, key: impl AsRef<[u8]>) -> sled::Result<Option<IVec>> {
        self.tree.remove(self.key(key.as_ref()))
    }

    /// Adds the write of a row to `batch` (which must be applied to this
    /// view's tree).
    pub(in crate::store) fn batch_insert(
        &self,
        batch: &mut sled::Batch,
        key: impl AsRef<[u8]>,
        value: impl Into<IVec>,
    ) {
        batch.insert(self.key(key.as_ref()), value);
    }

    /// How many rows the view holds (a scan of its keys under a prefix).
    pub(in crate::store) fn len(&self) -> usize {
        match self.prefix {
            None => self.tree.len(),
            Some(_) => self.iter().count(),
        }
    }

    /// Removes `keys` (without the prefix) in one atomic batch: for what is
    /// not a checkpoint (webhook intake's and outcomes' removals).
    pub(in crate::store) fn remove_all(
        &self,
        keys: impl IntoIterator<Item = impl AsRef<[u8]>>,
    ) -> sled::Result<()> {
        let mut batch = sled::Batch::default();
        for key in keys {
            self.batch_remove(&mut batch, key);
        }
        self.tree.apply_batch(batch)
    }

    /// Adds the removal of a row to `batch`.
    pub(in crate::store) fn batch_remove(&self, batch: &mut sled::Batch, key: impl AsRef<[u8]>) {
        batch.remove(self.key(key.as_ref()));
    }

    pub(in crate::store) fn iter(&self) -> ViewIter {
        match self.prefix {
            Some(p) => self.iter_of(self.tree.scan_prefix([p])),
            None => self.iter_of(self.tree.iter()),
        }
    }

    pub(in crate::store) fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> ViewIter {
        self.iter_of(self.tree.scan_prefix(self.key(prefix.as_ref())))
    }

    pub(in crate::store) fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> ViewIter {
        let start = self.bound(range.start_bound().map(AsRef::as_ref), false);
        let end = self.bound(range.end_bound().map(AsRef::as_ref), true);
        self.iter_of(self.tree.range::<Vec<u8>, _>((start, end)))
    }
}

#[derive(Clone)]
pub(in crate::store) struct Trees {
    pub(in crate::store) db: sled::Db,
    /// [`DATA_TREE`]: every view below but in a layout-3 directory opened
    /// to be read only.
    pub(in crate::store) data: Tree,
    /// `meta`: `format_version` only (layout 4; before, everything of
    /// [`Kind::Meta`] too).
    pub(in crate::store) format: Tree,
    pub(in crate::store) sessions: View,
    /// `id ‖ idx` → one transcript entry (layouts 1 to 4; read only, and
    /// by the migration to layout 5).
    pub(in crate::store) transcript: View,
    /// `id ‖ seq` → the events of one checkpoint, numbered from `seq`
    /// (layouts 3 and 4; a single event in rows written by layouts 1 and 2;
    /// read only, and by the migration to layout 5).
    pub(in crate::store) events: View,
    /// `id ‖ events_end ‖ entries_end` → one checkpoint's record (layout 5,
    /// see `records`).
    pub(in crate::store) records: View,
    /// Whether a session's transcript and events are read from `records`
    /// (layout 5) or from `transcript` and `events` (a directory of an
    /// older layout opened to be read, and the migration's source).
    pub(in crate::store) per_checkpoint: bool,
    /// `id ‖ seq` → a queued message (schema 2).
    pub(in crate::store) queue: View,
    /// `id` → the session's metadata, written once (schema 2).
    pub(in crate::store) metadata: View,
    pub(in crate::store) tenants: View,
    pub(in crate::store) active: View,
    pub(in crate::store) blobs: View,
    /// `sha256 hex ‖ id` → empty: which sessions reference each blob
    /// (layout version 2), so a purge deletes only blobs nobody else uses.
    pub(in crate::store) blob_refs: View,
    /// `tenant ‖ 0x00 ‖ time ‖ id ‖ call` → a row of the decision index
    /// (see `layout::decision_key`).
    pub(in crate::store) decisions: View,
    pub(in crate::store) meta: View,
    /// The webhook outbox rows checkpoints of layouts 4 and 5 before
    /// webhook group rows wrote (`webhooks`): read until drained, never
    /// written.
    pub(in crate::store) outbox: View,
    /// Groups whose checkpoints' events still owe webhook deliveries
    /// ([`Kind::Hooked`]).
    pub(in crate::store) hooked: View,
    /// sha256 hex → an agent configuration's JSON, once per distinct
    /// configuration (`configs`).
    pub(in crate::store) configs: View,
    /// sha256 hex ‖ id → empty: which sessions' headers name each
    /// configuration, so a purge deletes only one nobody else names.
    pub(in crate::store) config_refs: View,
    /// The configurations headers read so far name (`store::configs`).
    pub(in crate::store) decoded_configs: std::sync::Arc<crate::store::configs::DecodedConfigs>,
    /// Test hook: when set, the writer fails each group right before it
    /// applies its batch, as a crash there would leave the tree.
    #[cfg(test)]
    pub(in crate::store) drop_headers: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Test hook: when set, each purge stops right after removing the
    /// session's header, as a crash there would leave the trees.
    #[cfg(test)]
    pub(in crate::store) stop_purges: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Trees {
    /// The views of a database: over [`DATA_TREE`] (`legacy`: false) or
    /// over the trees of layout 3 (`legacy`: true, only to read them);
    /// sessions read from their records when `per_checkpoint` (layout 5).
    pub(in crate::store) fn over(
        db: &sled::Db,
        legacy: bool,
        per_checkpoint: bool,
    ) -> sled::Result<Self> {
        let data = db.open_tree(DATA_TREE)?;
        let view = |kind: Kind| -> sled::Result<View> {
            if legacy {
                Ok(View::legacy(db.open_tree(kind.legacy_tree())?))
            } else {
                Ok(View::new(&data, kind))
            }
        };
        // A real layout-3 directory has no interned configuration: its
        // view is the (empty) kind in `data`, so that reading it makes no
        // tree there.
        let names = db.tree_names();
        let interned = |kind: Kind| -> sled::Result<View> {
            let name = kind.legacy_tree().as_bytes();
            if legacy && names.iter().any(|n| n.as_ref() == name) {
                Ok(View::legacy(db.open_tree(name)?))
            } else {
                Ok(View::new(&data, kind))
            }
        };
        Ok(Self {
            db: db.clone(),
            format: db.open_tree("meta")?,
            sessions: view(Kind::Sessions)?,
            transcript: view(Kind::Transcript)?,
            events: view(Kind::Events)?,
            // Layout 3 had none: an empty view of the one tree.
            records: View::new(&data, Kind::Records),
            per_checkpoint: per_checkpoint && !legacy,
            queue: view(Kind::Queue)?,
            metadata: view(Kind::Metadata)?,
            tenants: view(Kind::Tenants)?,
            active: view(Kind::Active)?,
            blobs: view(Kind::Blobs)?,
            blob_refs: view(Kind::BlobRefs)?,
            decisions: view(Kind::Decisions)?,
            meta: view(Kind::Meta)?,
            outbox: view(Kind::Outbox)?,
            // Layout 3 had none, like records.
            hooked: View::new(&data, Kind::Hooked),
            configs: interned(Kind::Configs)?,
            config_refs: interned(Kind::ConfigRefs)?,
            decoded_configs: Default::default(),
            data,
            #[cfg(test)]
            drop_headers: Default::default(),
            #[cfg(test)]
            stop_purges: Default::default(),
        })
    }
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
