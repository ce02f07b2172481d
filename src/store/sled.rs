//! The sled checkpoint store: [`SledStore`], the embedded durable
//! implementation of [`CheckpointStore`]. Its keys and rows are in `layout`,
//! the values they hold in the shared `store::codec`.
//!
//! It owns the on-disk layout (version 5), one sled database in which every
//! row a checkpoint writes is in ONE tree, `data`, its key prefixed by one
//! byte naming its kind (`trees::Kind`, read through `trees::View`, which
//! puts the byte on and takes it off):
//!
//! | kind (byte)        | key after the byte               | value                         |
//! |--------------------|----------------------------------|-------------------------------|
//! | sessions (`S`)     | session id (16 bytes)            | header JSON, naming its configuration by hash |
//! | records (`C`)      | id ‖ events_end ‖ entries_end (u64 BE each: `last_event_seq`, `transcript_len` after the checkpoint) | ONE checkpoint's new transcript entries and events (`store::record`, MessagePack; read in `records`) |
//! | transcript (`T`)   | id ‖ big-endian u64 index        | layouts up to 4 only: entry JSON (in an envelope) |
//! | events (`E`)       | id ‖ big-endian u64 seq          | layouts up to 4 only: the events of one checkpoint |
//! | tenants (`N`)      | tenant bytes ‖ 0x00 ‖ id         | empty                         |
//! | active (`A`)       | id                               | empty (`running`, `awaiting_approval`) |
//! | blobs (`B`)        | sha256 hex of a tool result      | the result JSON (> 64 KiB)    |
//! | blob_refs (`R`)    | sha256 hex ‖ id                  | empty: the session references the blob |
//! | queue (`Q`)        | id ‖ big-endian u64 seq          | a queued message JSON         |
//! | metadata (`M`)     | id                               | the caller's metadata JSON    |
//! | decisions (`D`)    | tenant ‖ 0x00 ‖ time ‖ id ‖ call | a decision index row          |
//! | webhook groups (`W`) | big-endian u64 group number    | the sessions and event numbers of the group's checkpoints that owe webhook deliveries, until all are settled (`webhooks`) |
//! | webhook outbox (`O`) | id ‖ seq ‖ endpoint            | written by earlier binaries only: a webhook seed, delivered and removed (`webhooks`) |
//! | configs (`G`)      | sha256 hex of a configuration    | its JSON, once per distinct configuration (`configs`) |
//! | config refs (`g`)  | sha256 hex ‖ id                  | empty: the session's header names the configuration |
//! | meta (`m`)         | `commit_seq`, `health_check`, `purge:` ‖ id, `migrate4`, `migrate5` | big-endian u64; a nonce; the tenant of a purge under way; a migration's progress |
//!
//! and the tree `meta`, holding only `format_version` (big-endian u32),
//! where every binary, older ones included, looks for it first; and the
//! webhook delivery trees (`webhooks`, `webhook_deliveries`, `webhook_due`,
//! `webhook_sessions`; see `webhooks`), which are not session state.
//!
//! plus, beside the database, `overseer.commit`: the number of the last group
//! of checkpoints a flush confirmed (`sidecar`), checked at every open so that
//! a database that lost confirmed checkpoints (its files damaged or replaced,
//! which sled does not notice) is refused, not served. Opening turns sled's
//! panics on damaged files into one-line errors naming the directory (`open`).
//!
//! and the durability machinery: checkpoints are applied on a dedicated writer
//! thread, in groups, and under [`Durability::Fsync`] confirmed only after a
//! flush that concurrent checkpoints share (group commit, see `group_commit`;
//! what a flush does to be power-loss safe on top of sled's own, see
//! `durable`). After a failed write or flush (a full disk) the writer reopens
//! the directory on its own and the store takes writes again once the disk
//! does (`group_commit`, `gate`). Reads run on a fixed pool of reader
//! threads (`readers`), never on a runtime thread. Keys and rows are in
//! `layout`, the values in the shared `store::codec`; the offline
//! verification of `overseer store check` in `store::check`; reading a
//! directory with no server (`overseer sessions list|show --data`) in
//! `inspect`.
//!
//! Atomicity and durability: the writer applies each group of checkpoints
//! (each one's header and its ONE record, its blobs, queue, metadata,
//! decision rows, the index entries gained and lost, its row of owed webhooks, and the
//! group's number `commit_seq`) as ONE `sled::Batch` on the one tree, with one
//! `Tree::apply_batch`. sled 0.34 documents a `Batch` as "a batch of updates
//! that will be applied atomically to the Tree", and its `apply_batch`
//! seals the batch in the log so that "all updates written to the log since
//! its creation are recovered atomically" (sled 0.34.7, `src/batch.rs` and
//! `Tree::apply_batch_inner` in `src/tree.rs`); it also holds sled's write
//! lock, which every read takes shared, so a single read never sees part of
//! a group. After a crash a group is therefore in the tree whole or not at
//! all, and `commit_seq` says which groups are. A checkpoint is confirmed
//! durable only after a flush (`sync`, with `durable`'s fsyncs) that
//! follows its group's batch (`group_commit`). Readers read a session's
//! header first and its records within the header's counters (those keyed
//! at or below its `last_event_seq`, `transcript_len`): a multi-row read is
//! not one snapshot, and a record's key is the counters after its
//! checkpoint, so that is a consistent view while the session keeps
//! checkpointing (`records`).
//!
//! Memory: sled's page cache is bounded by [`StoreOptions::cache_mb`]
//! (`[store] cache_mb`); the writer remembers the header state of sessions in
//! use only (a terminal one is forgotten, and the whole is bounded). Nothing
//! here grows with the number of sessions ever stored.
//!
//! Retention: [`CheckpointStore::purge`] deletes a terminal session whole,
//! header first, with the blobs no other session references (`purge`); a
//! `blob_refs` entry is written in the batch of every checkpoint row that
//! references a blob. Layout version 2 added `blob_refs`, 3 one events row
//! per checkpoint, 4 the one tree, 5 one record per checkpoint in place of
//! the per-entry transcript rows and per-checkpoint event rows; a
//! directory of an older layout is upgraded when first opened for serving
//! (`open`, `migrate` and `migrate5`: resumable), and refused by older
//! binaries from then on (in one line: its `format_version` is newer than
//! theirs).
//!
//! It deliberately owns no session semantics: what goes into a checkpoint, and
//! when, is decided by `overseer-actors`; this module stores it and reads it
//! back exactly; which sessions are purged, and when, is the runtime's
//! retention policy.

pub(super) mod check;
mod configs;
mod durable;
mod gate;
mod group_commit;
mod inspect;
pub(super) mod layout;
mod migrate;
mod migrate5;
pub(super) mod open;
mod purge;
mod readers;
mod records;
pub(super) mod sidecar;
pub(super) mod trees;
mod webhooks;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use overseer_actors::model::{Event, SessionHeader, SessionId, SessionStatus, TranscriptEntry};
use overseer_actors::store::{
    recorded_by, Checkpoint, CheckpointStore, DecisionPage, DecisionPosition, DecisionQuery,
    DecisionRow, Resumable, SessionSummary, StoreError, StoredSession,
};
use tokio::sync::oneshot;

pub use inspect::Inspector;
pub use open::OpenError;

use super::codec::{self, corrupt};
use super::Durability;
use gate::Gate;
use group_commit::{Command, GroupCommit, Reply, Shared};
use open::Purpose;
use readers::Readers;
use trees::Trees;

/// The layout version of the trees above (not the snapshot `schema_version`,
/// which versions the JSON inside them). 3: `events` holds one row per
/// checkpoint (earlier versions: one per event, still read). 4: every kind
/// in the one tree `data`, a group one atomic batch. 5: one record per
/// checkpoint (`records`), no transcript or event rows.
pub(super) const FORMAT_VERSION: u32 = 5;

/// Most commands (checkpoints, flushes) queued for or being written by the
/// writer at once; further callers wait for a slot. Well above what group
/// commit takes per group, so it only bites when the disk cannot keep up.
const MAX_PENDING_COMMANDS: usize = 4096;
pub(super) const FORMAT_KEY: &[u8] = b"format_version";

/// The default of [`StoreOptions::cache_mb`] (`[store] cache_mb`).
pub const DEFAULT_CACHE_MB: u64 = 64;
/// The largest [`StoreOptions::cache_mb`] accepted: 64 GiB.
pub const MAX_CACHE_MB: u64 = 64 * 1024;

/// How sled stores what it writes to its log (`[store] compression`).
///
/// sled fixes this when it creates a directory and refuses to open the
/// directory with the other setting, so it applies to new directories only:
/// an existing one is opened as it was created, whatever is asked (see
/// [`SledStore::compression`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// As written: the fastest (the default).
    #[default]
    None,
    /// Every log write compressed with zstd (level 1): about a third of
    /// the disk, at several times the store writer's CPU per checkpoint,
    /// which is what bounds throughput (the figures are in the README).
    Zstd,
}

impl Compression {
    /// The other setting.
    fn other(self) -> Self {
        match self {
            Self::None => Self::Zstd,
            Self::Zstd => Self::None,
        }
    }
}

/// How a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// When a checkpoint is confirmed.
    pub durability: Durability,
    /// The most memory, in MiB, sled's page cache may hold (sled's own
    /// default is 1 GiB). Reads of sessions not in it go to the disk (and
    /// the OS's page cache). Between 1 and [`MAX_CACHE_MB`]; a value outside
    /// is clamped (the configuration rejects it with its key).
    pub cache_mb: u64,
    /// How a new directory stores its log; an existing one keeps what it
    /// was created with.
    pub compression: Compression,
    /// What opening a directory of an older layout does (`store::upgrade`).
    pub upgrade: crate::store::upgrade::Upgrade,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            durability: Durability::default(),
            cache_mb: DEFAULT_CACHE_MB,
            compression: Compression::default(),
            upgrade: crate::store::upgrade::Upgrade::default(),
        }
    }
}

impl StoreOptions {
    fn cache_bytes(&self) -> u64 {
        self.cache_mb.clamp(1, MAX_CACHE_MB) * 1024 * 1024
    }
}

/// The sled checkpoint store. Cloning is cheap and shares the database.
#[derive(Clone)]
pub struct SledStore {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    /// Slots of the bounded queue of commands to the writer: a caller waits
    /// here (asynchronously) when the writer is this far behind, so a burst
    /// of checkpoints back-pressures the session actors instead of growing
    /// an unbounded queue in memory.
    slots: Arc<tokio::sync::Semaphore>,
    /// Fewest free slots seen after taking one (tests: was the bound hit?).
    #[cfg(test)]
    least_free: std::sync::atomic::AtomicUsize,
    /// Where point reads run. Its threads hold the opening too, so it is
    /// dropped (they are joined) before the writer below, for the reason
    /// given there.
    readers: Readers,
    // Dropping it joins the writer and flusher threads, which hold database
    // handles of their own: once the last `SledStore` is dropped, the
    // directory is closed (and its lock released), so it can be reopened at
    // once, e.g. by a restarted runtime or a test.
    commit: GroupCommit,
    /// Webhooks (`webhooks`): which tenants' events go out. Unset: none.
    webhooks: std::sync::OnceLock<Arc<crate::webhooks::Subscriptions>>,
    /// The deliveries this process's checkpoints owe (`webhooks`).
    feed: Arc<webhooks::Feed>,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.inner.shared.dir)
            .field("options", &self.inner.shared.options)
            .finish_non_exhaustive()
    }
}

fn io(
    context: impl std::fmt::Display,
    e: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    StoreError::io(context.to_string(), e)
}

impl SledStore {
    /// Opens (creating if needed) the store in `dir` with the default
    /// options but `durability`. Blocking; call at start-up.
    pub fn open(dir: &Path, durability: Durability) -> Result<Self, StoreError> {
        Self::open_with(
            dir,
            &StoreOptions {
                durability,
                ..StoreOptions::default()
            },
        )
    }

    /// Opens (creating if needed) the store in `dir`. Blocking; call at
    /// start-up.
    ///
    /// Refused, each with a one-line error naming the directory: a directory
    /// written by a newer layout version (left untouched); one another
    /// process holds open; one whose files sled cannot read (sled's panic
    /// is caught); and one that holds fewer checkpoints than were confirmed
    /// durable (see [`OpenError`]).
    pub fn open_with(dir: &Path, options: &StoreOptions) -> Result<Self, StoreError> {
        let opened = open::open(dir, options, Purpose::Serve)?;
        let generation = Arc::new(opened.generation);
        let shared = Arc::new(Shared {
            dir: dir.to_owned(),
            // Reopens (after a write failure) ask for what the directory has.
            options: StoreOptions {
                compression: opened.compression,
                ..*options
            },
            gate: Gate::new(dir.to_owned(), generation.clone()),
            flushes: Default::default(),
            full: Default::default(),
        });
        let feed = Arc::new(webhooks::Feed::new());
        let commit =
            GroupCommit::start(shared.clone(), generation, opened.commit_seq, feed.clone())?;
        let readers = Readers::start(shared.clone())?;
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                readers,
                commit,
                slots: Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_COMMANDS)),
                webhooks: std::sync::OnceLock::new(),
                feed,
                #[cfg(test)]
                least_free: std::sync::atomic::AtomicUsize::new(usize::MAX),
            }),
        })
    }

    /// A handle that tells, without keeping the store open, what it has not
    /// confirmed yet (for a shutdown that will not wait for ever).
    pub fn watch(&self) -> StoreWatch {
        StoreWatch {
            slots: self.inner.slots.clone(),
            shared: Arc::downgrade(&self.inner.shared),
        }
    }

    /// Number of flushes performed so far: far fewer than checkpoints under
    /// concurrent load with [`Durability::Fsync`], zero with [`Durability::Os`]
    /// unless [`CheckpointStore::flush`] is called.
    pub fn flush_count(&self) -> u64 {
        self.inner.shared.flushes.load(Ordering::Relaxed)
    }

    /// How this directory stores its log: what it was created with, which
    /// is what was asked for only if the directory was new.
    pub fn compression(&self) -> Compression {
        self.inner.shared.options.compression
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.inner
            .shared
            .gate
            .get()?
            .trees
            .db
            .size_on_disk()
            .map_err(|e| io("measuring the store", e))
    }

    /// Fault injection, for tests of the recovery from a full disk: while
    /// `full`, every flush fails with `ENOSPC` after sled has taken the
    /// writes in memory, which is where a real full disk makes them fail
    /// (those of checkpoints, of [`CheckpointStore::flush`] and
    /// [`CheckpointStore::health_check`], and the store's own attempts to
    /// take writes again), and so does the store's check that the disk takes
    /// data again. Setting it back to `false` is space returning. Nothing but
    /// tests calls it.
    pub fn simulate_full_disk(&self, full: bool) {
        self.inner.shared.full.store(full, Ordering::Release);
    }

    /// Runs a point read (one session's rows) on the store's reader threads
    /// (see `readers`): a miss in sled's cache reads the disk, so reads never
    /// run on a runtime thread.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Trees) -> Result<T, StoreError> + Send + 'static,
    {
        self.inner
            .readers
            .read(move |generation| f(&generation.trees))
            .await
    }

    /// Runs a listing (a page of headers, or every active one) on tokio's
    /// blocking pool instead: it can take long (recovery's, or the inbox's
    /// over every session awaiting approval, reads a header per session),
    /// and the few readers must stay free for the point reads that activate
    /// sessions. Listings are rare, so a thread each costs little.
    async fn list<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Trees) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let generation = inner.shared.gate.get()?;
            f(&generation.trees)
        })
        .await
        .map_err(|e| io("store listing task", e))?
    }

    /// Sends a command to the writer and waits for its outcome.
    async fn send(
        &self,
        make: impl FnOnce(Reply) -> Command,
        what: impl FnOnce() -> String,
    ) -> Result<(), StoreError> {
        let slot = self
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Io("the store is closed".into()))?;
        #[cfg(test)]
        self.inner.least_free.fetch_min(
            self.inner.slots.available_permits(),
            std::sync::atomic::Ordering::Relaxed,
        );
        let (tx, rx) = oneshot::channel();
        self.inner.commit.submit(make(Reply::new(tx, Some(slot))))?;
        // If this future is dropped after the submit, the command still
        // completes; only its outcome goes unobserved.
        rx.await.map_err(|_| {
            StoreError::Unavailable(format!(
                "the store writer stopped before confirming {}",
                what()
            ))
        })?
    }

    /// The opening readers use now (tests look inside it).
    #[cfg(test)]
    fn current(&self) -> Arc<trees::Generation> {
        self.inner.shared.gate.get().unwrap()
    }
}

/// What a [`SledStore`] has not confirmed yet, readable after it is gone
/// (see [`SledStore::watch`]).
#[derive(Clone)]
pub struct StoreWatch {
    slots: Arc<tokio::sync::Semaphore>,
    shared: std::sync::Weak<Shared>,
}

impl StoreWatch {
    /// Writes (checkpoints, flushes, purges, health checks) handed to the
    /// store and not answered yet: none of them was acknowledged to anyone.
    pub fn unconfirmed(&self) -> usize {
        MAX_PENDING_COMMANDS.saturating_sub(self.slots.available_permits())
    }

    /// Why the store does not take writes, if it does not (and is still
    /// open).
    pub fn outage(&self) -> Option<String> {
        self.shared.upgrade()?.gate.outage()
    }
}

/// Most rows of the decision index one page examines (see
/// `Trees::decisions`).
const DECISION_SCAN: usize = 4096;

/// Rows decoded at once by one thread at least (below it, one thread
/// decodes them all: starting threads would cost more).
const DECODE_CHUNK: usize = 4096;

/// Decodes `rows` with `decode`, in order, keeping what it returns: on as
/// many threads as the machine has when there are many (boot recovery
/// decodes every active header before the service is ready, and nothing
/// else runs then), on this one otherwise.
fn decode_all<R: Sync, T: Send>(
    rows: &[R],
    decode: impl Fn(&R) -> Result<Option<T>, StoreError> + Sync,
) -> Result<Vec<T>, StoreError> {
    let decode_part = |part: &[R]| -> Result<Vec<T>, StoreError> {
        let mut out = Vec::with_capacity(part.len());
        for row in part {
            out.extend(decode(row)?);
        }
        Ok(out)
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = rows.len().div_ceil(threads).max(DECODE_CHUNK);
    if chunk >= rows.len() {
        return decode_part(rows);
    }
    std::thread::scope(|scope| {
        let mut parts = Vec::new();
        for part in rows.chunks(chunk) {
            let decode_part = &decode_part;
            let handle = std::thread::Builder::new()
                .name("overseer-decode".into())
                .spawn_scoped(scope, move || decode_part(part))
                .map_err(|e| io("starting a thread to decode headers", e))?;
            parts.push(handle);
        }
        let mut out = Vec::with_capacity(rows.len());
        for part in parts {
            let part = part
                .join()
                .map_err(|_| StoreError::Io("a thread decoding headers panicked".into()))?;
            out.extend(part?);
        }
        Ok(out)
    })
}

/// Where a walk in id order after `after` starts (sessions' and the
/// `active` index's keys are the bare id).
fn after_bound(after: Option<SessionId>) -> std::ops::Bound<Vec<u8>> {
    match after {
        Some(id) => std::ops::Bound::Excluded(id.as_bytes().to_vec()),
        None => std::ops::Bound::Unbounded,
    }
}

impl Trees {
    fn header(&self, id: &SessionId) -> Result<Option<SessionHeader>, StoreError> {
        match self
            .sessions
            .get(id.as_bytes())
            .map_err(|e| io(format_args!("reading session {id}"), e))?
        {
            Some(bytes) => self.decode_header(id, &bytes).map(Some),
            None => Ok(None),
        }
    }

    pub(super) fn session(&self, id: &SessionId) -> Result<Option<StoredSession>, StoreError> {
        let Some(bytes) = self
            .sessions
            .get(id.as_bytes())
            .map_err(|e| io(format_args!("reading session {id}"), e))?
        else {
            return Ok(None);
        };
        let mut header = self.decode_header(id, &bytes)?;
        let legacy = codec::legacy_parts(id, &header, &bytes)?;
        // Only what the header commits (see `records`): reading the header
        // first gives a consistent view even while the session keeps
        // checkpointing.
        let transcript = self.transcript(id, header.transcript_len, header.last_event_seq)?;
        if let Some(legacy) = legacy {
            // Schema 1: the queue and the metadata were in the header. They
            // move to their own rows with the session's next checkpoint.
            header.schema_version = overseer_actors::model::SCHEMA_VERSION;
            header.queue = overseer_actors::model::QueueIndex {
                head: 0,
                next: legacy.inbox.len() as u64,
                bytes: legacy.inbox.iter().map(|m| m.text.len() as u64).sum(),
            };
            return Ok(Some(StoredSession {
                header,
                transcript,
                metadata: legacy.metadata,
                inbox: legacy.inbox,
                needs_rewrite: true,
            }));
        }
        let metadata = match self
            .metadata
            .get(id.as_bytes())
            .map_err(|e| io(format_args!("reading the metadata of session {id}"), e))?
        {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| corrupt(id, format!("unreadable metadata: {e}")))?,
            None => serde_json::Value::Null,
        };
        // The queue rows the header covers, all of them present.
        let q = header.queue;
        let mut inbox = Vec::new();
        if q.next > q.head {
            let range = layout::seq_key(id, q.head)..layout::seq_key(id, q.next);
            for item in self.queue.range(range) {
                let (key, value) =
                    item.map_err(|e| io(format_args!("reading the queue of session {id}"), e))?;
                let expected = q.head + inbox.len() as u64;
                if layout::seq_of(&key) != Some(expected) {
                    return Err(corrupt(id, format!("queued message {expected} is missing")));
                }
                inbox.push(serde_json::from_slice(&value).map_err(|e| {
                    corrupt(id, format!("unreadable queued message {expected}: {e}"))
                })?);
            }
            if inbox.len() as u64 != q.len() {
                return Err(corrupt(
                    id,
                    format!(
                        "the header counts {} queued messages but {} are stored",
                        q.len(),
                        inbox.len()
                    ),
                ));
            }
        }
        Ok(Some(StoredSession {
            header,
            transcript,
            metadata,
            inbox,
            needs_rewrite: false,
        }))
    }

    fn events_after(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let mut out = Vec::new();
        let Some(first) = after.checked_add(1) else {
            return Ok(out);
        };
        if limit == 0 {
            return Ok(out);
        }
        // Only the events the header commits: later ones may belong to a
        // checkpoint still being written, or to one a crash cut short before
        // its header (they are garbage, overwritten by the next checkpoint).
        // No header, no committed events.
        let Some(bytes) = self
            .sessions
            .get(id.as_bytes())
            .map_err(|e| io(format_args!("reading session {id}"), e))?
        else {
            return Ok(out);
        };
        // Lenient, like the listing's peek: the events of a session of a newer
        // schema stay readable as before; only the bound is needed here.
        let last = serde_json::from_slice::<codec::Peek>(&bytes)
            .map_err(|e| corrupt(id, format!("unreadable session header: {e}")))?
            .last_event_seq
            .ok_or_else(|| corrupt(id, "the session header has no last_event_seq"))?;
        if first > last {
            return Ok(out);
        }
        self.committed_events(id, first, last, |event| {
            out.push(event);
            out.len() < limit
        })?;
        Ok(out)
    }

    /// Boot recovery's page: what it needs of each active session after
    /// `after` (see [`codec::decode_resumable`]), its header decoded whole
    /// only where that needs it.
    fn resumable(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<Resumable>, StoreError> {
        self.active_page(after, limit, |id, bytes| {
            match codec::decode_resumable(bytes) {
                Some(session) => Ok(codec::is_active(session.status).then_some(session)),
                None => self.decode_header(id, bytes).map(|header| {
                    codec::is_active(header.status).then(|| Resumable::from(&header))
                }),
            }
        })
    }

    /// The sessions of the `active` index after `after`, `limit` index
    /// entries at a time, each header's bytes decoded by `decode` on every
    /// core, until a page keeps some. The index is a superset: it may name
    /// a session whose header says otherwise (a crash between a
    /// checkpoint's writes) or that has no header yet; `decode` filters on
    /// the header, so a page of index entries may come out empty, and then
    /// the next one is read.
    fn active_page<T: Send>(
        &self,
        mut after: Option<SessionId>,
        limit: usize,
        decode: impl Fn(&SessionId, &[u8]) -> Result<Option<T>, StoreError> + Sync,
    ) -> Result<Vec<T>, StoreError> {
        let limit = limit.max(1);
        loop {
            let mut rows = Vec::new();
            let mut last = None;
            for key in self
                .active
                .range::<Vec<u8>, _>((after_bound(after), std::ops::Bound::Unbounded))
                .keys()
                .take(limit)
            {
                let key = key.map_err(|e| io("reading the active index", e))?;
                let id = layout::id_from(&key)
                    .ok_or_else(|| corrupt("active index", "malformed key"))?;
                last = Some(id);
                if let Some(bytes) = self
                    .sessions
                    .get(&key)
                    .map_err(|e| io(format_args!("reading session {id}"), e))?
                {
                    rows.push((id, bytes));
                }
            }
            let page = decode_all(&rows, |(id, bytes)| decode(id, bytes))?;
            match last {
                Some(id) if page.is_empty() => after = Some(id),
                _ => return Ok(page),
            }
        }
    }

    /// A page of [`CheckpointStore::list_by_status`]: empty only when no
    /// session after `after` has one of `statuses`.
    fn by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        // A header of a newer schema fails the listing (as it fails a
        // load): boot recovery must not silently skip sessions.
        let wanted = |header: SessionHeader| {
            (statuses.is_empty() || statuses.contains(&header.status)).then_some(header)
        };
        let limit = limit.max(1);
        let via_index = !statuses.is_empty() && statuses.iter().all(|s| codec::is_active(*s));
        if via_index {
            // Only the sessions of the `active` index, not every session
            // ever stored.
            return self.active_page(after, limit, |id, bytes| {
                self.decode_header(id, bytes).map(wanted)
            });
        }
        let mut out = Vec::new();
        for item in self
            .sessions
            .range::<Vec<u8>, _>((after_bound(after), std::ops::Bound::Unbounded))
        {
            let (key, bytes) = item.map_err(|e| io("listing sessions", e))?;
            let id = layout::id_from(&key).ok_or_else(|| corrupt("sessions", "malformed key"))?;
            // Over every stored session most headers are not wanted: a
            // peek is cheaper than decoding them.
            if !statuses.is_empty() {
                let peek = codec::peek(&id, &bytes)?;
                if !statuses.iter().any(|s| peek.status_is(*s)) {
                    continue;
                }
            }
            out.extend(wanted(self.decode_header(&id, &bytes)?));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Headers in id order after `after`, at most `limit`.
    fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let mut out = Vec::new();
        for item in self
            .sessions
            .range::<Vec<u8>, _>((after_bound(after), std::ops::Bound::Unbounded))
            .take(limit)
        {
            let (key, bytes) = item.map_err(|e| io("scanning sessions", e))?;
            let id = layout::id_from(&key).ok_or_else(|| corrupt("sessions", "malformed key"))?;
            out.push(self.decode_header(&id, &bytes)?);
        }
        Ok(out)
    }

    /// Transcript entries of `id` in `range`, below the header's
    /// `transcript_len` (what it commits).
    fn entries(
        &self,
        id: &SessionId,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        let Some(header) = self.header(id)? else {
            return Ok(Vec::new());
        };
        self.transcript_range(id, range, header.transcript_len, header.last_event_seq)
    }

    /// A page of the decision index, newest first (see
    /// [`CheckpointStore::decisions`]). A row is answered only when its
    /// session's committed log holds the event that recorded it (a row a
    /// layout-3 crash left ahead of its header, migrated as is, stays
    /// unseen; layout 4 writes a row in the batch of its event). At most [`DECISION_SCAN`] rows are
    /// examined per page: a rare filter answers a short page with a `next`
    /// instead of walking a tenant's whole history in one request.
    fn decisions(&self, tenant: &str, query: &DecisionQuery) -> Result<DecisionPage, StoreError> {
        let limit = query.limit.max(1);
        let start = layout::tenant_prefix(tenant);
        let end = match &query.before {
            Some(p) => layout::decision_key(tenant, p),
            None => layout::tenant_end(tenant),
        };
        let mut headers: HashMap<SessionId, Option<SessionHeader>> = HashMap::new();
        let mut rows: Vec<DecisionRow> = Vec::new();
        let mut examined = 0usize;
        let mut last_examined: Option<DecisionPosition> = None;
        for item in self.decisions.range(start..end).rev() {
            let (_, value) =
                item.map_err(|e| io(format_args!("reading the decisions of tenant {tenant}"), e))?;
            let row: DecisionRow = serde_json::from_slice(&value)
                .map_err(|e| corrupt("decisions", format!("unreadable row: {e}")))?;
            examined += 1;
            if examined > DECISION_SCAN {
                // More may follow: the next page starts after what was seen.
                return Ok(DecisionPage {
                    rows,
                    next: last_examined,
                });
            }
            last_examined = Some(row.position());
            if row.tenant != tenant
                || !query.matches(&row)
                || !self.committed(&mut headers, &row)?
            {
                continue;
            }
            if rows.len() == limit {
                // One more matching row: there is a next page.
                let next = rows.last().map(DecisionRow::position);
                return Ok(DecisionPage { rows, next });
            }
            rows.push(row);
        }
        Ok(DecisionPage { rows, next: None })
    }

    /// Whether the committed log of `row`'s session holds the event that
    /// recorded it.
    fn committed(
        &self,
        headers: &mut HashMap<SessionId, Option<SessionHeader>>,
        row: &DecisionRow,
    ) -> Result<bool, StoreError> {
        let id = row.session_id;
        let header = match headers.entry(id) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => slot.insert(self.header(&id)?),
        };
        let Some(header) = header else {
            return Ok(false);
        };
        if header.tenant != row.tenant || header.last_event_seq < row.seq {
            return Ok(false);
        }
        let mut found = false;
        self.committed_events(&id, row.seq, row.seq, |event| {
            found = recorded_by(row, &event);
            false
        })?;
        Ok(found)
    }

    fn tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let prefix = layout::tenant_prefix(tenant);
        let start = match after {
            Some(id) => std::ops::Bound::Excluded(layout::tenant_key(tenant, &id)),
            None => std::ops::Bound::Included(prefix.clone()),
        };
        let mut out = Vec::new();
        for key in self
            .tenants
            .range::<Vec<u8>, _>((start, std::ops::Bound::Unbounded))
            .keys()
        {
            if out.len() >= limit {
                break;
            }
            let key = key.map_err(|e| io(format_args!("listing tenant {tenant}"), e))?;
            if !key.starts_with(&prefix) {
                break;
            }
            // A tenant name containing 0x00 could share this prefix; the
            // length and the header's own tenant keep tenants apart anyway.
            // The index is a superset (see the module docs): an entry without
            // a header that agrees is skipped.
            let Some(id) = layout::id_from(&key[prefix.len()..]) else {
                continue;
            };
            if let Some(header) = self.header(&id)? {
                if header.tenant == tenant {
                    out.push(header);
                }
            }
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
impl CheckpointStore for SledStore {
    async fn checkpoint(&self, checkpoint: Checkpoint) -> Result<(), StoreError> {
        let id = checkpoint.header.id;
        // The deliveries its events owe: for a tenant without endpoints
        // this is a lookup. The writer names them in its group's row and
        // hands them to the delivery task (see `webhooks`).
        let hooks = match self.inner.webhooks.get() {
            Some(subscriptions) => subscriptions.rows(&checkpoint),
            None => Vec::new(),
        };
        let mut prepared = if codec::may_be_large(&checkpoint) {
            tokio::task::spawn_blocking(move || layout::prepare(&checkpoint))
                .await
                .map_err(|e| io(format_args!("encoding the checkpoint of session {id}"), e))??
        } else {
            // Small: encoding costs microseconds, less than a hop to the
            // blocking pool.
            layout::prepare(&checkpoint)?
        };
        let owes = !hooks.is_empty();
        prepared.hooks = hooks;
        let bytes = prepared.size() as u64;
        self.send(
            |reply| Command::Checkpoint(Box::new(prepared), reply),
            || format!("the checkpoint of session {id}"),
        )
        .await?;
        overseer_actors::metrics::record_checkpoint_bytes(bytes);
        if owes {
            if let Some(subscriptions) = self.inner.webhooks.get() {
                subscriptions.written();
            }
        }
        Ok(())
    }

    async fn load(&self, id: SessionId) -> Result<Option<StoredSession>, StoreError> {
        self.read(move |trees| trees.session(&id)).await
    }

    async fn load_header(&self, id: SessionId) -> Result<Option<SessionHeader>, StoreError> {
        self.read(move |trees| trees.header(&id)).await
    }

    async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        self.read(move |trees| trees.events_after(&id, after, limit))
            .await
    }

    async fn list_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let statuses = statuses.to_vec();
        self.list(move |trees| trees.by_status(&statuses, after, limit))
            .await
    }

    async fn list_resumable(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<Resumable>, StoreError> {
        self.list(move |trees| trees.resumable(after, limit)).await
    }

    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let tenant = tenant.to_owned();
        self.list(move |trees| trees.tenant(&tenant, after, limit))
            .await
    }

    async fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.list(move |trees| trees.scan(after, limit)).await
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.send(Command::Flush, || "a flush".into()).await
    }

    async fn decisions(
        &self,
        tenant: &str,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        let (tenant, query) = (tenant.to_owned(), query.clone());
        self.list(move |trees| trees.decisions(&tenant, &query))
            .await
    }

    async fn entries(
        &self,
        id: SessionId,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        self.read(move |trees| trees.entries(&id, range)).await
    }

    /// Has the writer write a fresh value under `health_check` in `meta`,
    /// read it back and flush: that proves sled takes writes, the writer and
    /// flusher threads are alive and the disk takes a flush, which is what
    /// every checkpoint needs. The one small key is rewritten in place, so
    /// the check does not grow the store. While the store does not take
    /// writes (see `group_commit`) it fails at once; it succeeds again once
    /// the store has recovered on its own.
    async fn health_check(&self) -> Result<(), StoreError> {
        self.send(Command::Health, || "a health check".into()).await
    }

    async fn stored_configs(&self) -> Result<usize, StoreError> {
        self.read(|trees| {
            configs::count(trees)
                .map(|(configs, _)| configs)
                .map_err(|e| io("counting the configurations", e))
        })
        .await
    }

    /// Done by the writer, like a checkpoint (and under `fsync` confirmed
    /// after a flush): see `purge` for the order of its writes.
    async fn purge(&self, id: SessionId) -> Result<(), StoreError> {
        self.send(
            |reply| Command::Purge(id, reply),
            || format!("the purge of session {id}"),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::PathBuf;

    use overseer_actors::model::{
        CallState, EventKind, ToolCallId, ToolCallRecord, TranscriptEntry, SCHEMA_VERSION,
    };
    use serde_json::json;
    use sha2::{Digest, Sha256};

    use overseer_actors::store::all_by_status;
    use overseer_actors::testing::sim::{self, big_result, tool_result, Sim};

    use super::*;
    use crate::store::{check, CheckReport};

    fn open(dir: &Path) -> SledStore {
        SledStore::open(dir, Durability::Fsync).unwrap()
    }

    /// The shared check, and that sled read it from the current layout.
    fn assert_same(stored: &StoredSession, sim: &Sim) {
        sim::assert_same(stored, sim);
        assert!(!stored.needs_rewrite);
    }

    /// Every file under `dir` with the sha256 of its content.
    fn hash_dir(dir: &Path) -> BTreeMap<PathBuf, String> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    let bytes = std::fs::read(&path).unwrap();
                    out.insert(path, hex::encode(Sha256::digest(&bytes)));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(dir, &mut out);
        out
    }

    /// Boot recovery's many headers decode on several threads: in order,
    /// filtered, and one bad row fails the listing.
    #[test]
    fn many_headers_decode_on_several_threads_in_order_and_fail_as_one() {
        let rows: Vec<u64> = (0..3 * DECODE_CHUNK as u64).collect();
        let keep = |n: &u64| Ok((!n.is_multiple_of(3)).then_some(n * 2));
        let want: Vec<u64> = rows
            .iter()
            .filter(|n| !n.is_multiple_of(3))
            .map(|n| n * 2)
            .collect();
        assert_eq!(decode_all(&rows, keep).unwrap(), want);
        // A few rows: on this thread, same answer.
        assert_eq!(decode_all(&rows[..10], keep).unwrap(), want[..6].to_vec());
        // One bad row anywhere fails the whole listing.
        let bad = rows.len() as u64 - 5;
        let err = decode_all(&rows, |n: &u64| {
            if *n == bad {
                Err(StoreError::Io(format!("row {n} is bad")))
            } else {
                Ok(Some(*n))
            }
        })
        .unwrap_err();
        assert_eq!(err, StoreError::Io(format!("row {bad} is bad")));
    }

    /// The queue of commands to the writer is bounded: with room for 4,
    /// 200 concurrent checkpoints wait for slots (asynchronously) and all
    /// complete, none lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_queue_is_bounded_and_back_pressures() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        store.inner.slots.forget_permits(MAX_PENDING_COMMANDS - 4);
        let sims: Vec<Sim> = (0..200).map(|_| Sim::new("acme")).collect();
        let writes = sims.iter().cloned().map(|mut sim| {
            let store = store.clone();
            tokio::spawn(async move { store.checkpoint(sim.checkpoint()).await })
        });
        for w in futures::future::join_all(writes).await {
            w.unwrap().unwrap();
        }
        assert_eq!(
            store
                .inner
                .least_free
                .load(std::sync::atomic::Ordering::Relaxed),
            0,
            "the bound was reached"
        );
        assert_eq!(
            store.inner.slots.available_permits(),
            4,
            "every slot returned"
        );
        for sim in &sims {
            assert!(store.load(sim.id()).await.unwrap().is_some());
        }
    }

    /// Queued messages are rows beside the header: each written once, read
    /// back in order, deleted when taken; the metadata is written once and
    /// never rewritten by later checkpoints.
    #[tokio::test]
    async fn queued_messages_and_metadata_live_beside_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sim = Sim::new("acme");
        sim.status(SessionStatus::AwaitingApproval);
        sim.enqueue("first");
        sim.enqueue("second");
        store.checkpoint(sim.checkpoint()).await.unwrap();
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
        // The header does not carry them.
        let header = store.load_header(sim.id()).await.unwrap().unwrap();
        let json = serde_json::to_string(&header).unwrap();
        assert!(!json.contains("first") && !json.contains("[1,2]"), "{json}");

        let cp = sim.checkpoint();
        assert!(cp.metadata.is_none() && cp.queued.is_empty());
        sim.dequeue();
        sim.enqueue("third");
        store.checkpoint(sim.checkpoint()).await.unwrap();
        let reopened = {
            drop(store);
            open(dir.path())
        };
        let stored = reopened.load(sim.id()).await.unwrap().unwrap();
        assert_same(&stored, &sim);
        let texts: Vec<&str> = stored.inbox.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(texts, ["second", "third"]);
        // The taken row is gone from the tree, not just hidden.
        let rows = reopened
            .current()
            .trees
            .queue
            .scan_prefix(sim.id().as_bytes())
            .count();
        assert_eq!(rows, 2);
    }

    /// A version 1 header kept the queue and the metadata inside it: it is
    /// read with them, flagged for rewriting, and the next checkpoint moves
    /// them to their rows.
    #[tokio::test]
    async fn a_version_1_header_is_read_and_rewritten_in_the_new_layout() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let sim = Sim::new("acme");
        let id = sim.id();
        let mut v1 = serde_json::to_value(&sim.header).unwrap();
        v1["schema_version"] = json!(1);
        v1["metadata"] = json!({"k": "v"});
        v1["inbox"] = json!([{"text": "waiting", "at_ms": 3}]);
        v1["recent_messages"] = json!([{"id": "m-1", "text_hash": 42}]);
        store
            .current()
            .trees
            .sessions
            .insert(id.as_bytes(), serde_json::to_vec(&v1).unwrap())
            .unwrap();
        let stored = store.load(id).await.unwrap().unwrap();
        assert!(stored.needs_rewrite);
        assert_eq!(stored.metadata, json!({"k": "v"}));
        assert_eq!(stored.inbox[0].text, "waiting");
        assert_eq!(stored.header.queue.len(), 1);
        assert_eq!(stored.header.schema_version, SCHEMA_VERSION);
        assert_eq!(
            stored.header.recent_messages[0].id.as_deref(),
            Some("m-1"),
            "a version 1 message id is still recognised"
        );
        // The machine writes everything that moved with its next checkpoint.
        let checkpoint = overseer_actors::testing::checkpoint_after_load(stored)
            .expect("loading a version 1 record moves what it rewrites");
        store.checkpoint(checkpoint).await.unwrap();
        let again = store.load(id).await.unwrap().unwrap();
        assert!(!again.needs_rewrite);
        assert_eq!(again.metadata, json!({"k": "v"}));
        assert_eq!(again.inbox[0].text, "waiting");
    }

    #[tokio::test]
    async fn round_trip_of_header_transcript_and_events() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sim = Sim::new("acme");
        sim.user("hello");
        sim.status(SessionStatus::Running);
        sim.push(TranscriptEntry::Assistant {
            text: "calling".into(),
            tool_calls: Vec::new(),
            at_ms: 8,
            finish_reason: None,
        });
        store.checkpoint(sim.checkpoint()).await.unwrap();

        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
        assert_eq!(
            store.load_header(sim.id()).await.unwrap(),
            Some(sim.header.clone())
        );
        assert_eq!(
            store.events_after(sim.id(), 0, 100).await.unwrap(),
            sim.events
        );

        sim.push(tool_result(json!({"time": "now"})));
        sim.status(SessionStatus::AwaitingInput);
        store.checkpoint(sim.checkpoint()).await.unwrap();
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
        assert_eq!(
            store.events_after(sim.id(), 0, 100).await.unwrap(),
            sim.events
        );

        let unknown = SessionId::generate();
        assert!(store.load(unknown).await.unwrap().is_none());
        assert!(store.load_header(unknown).await.unwrap().is_none());
        assert!(store.events_after(unknown, 0, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_fresh_store_on_the_same_directory_reads_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let mut sim = Sim::new("acme");
        let store = open(dir.path());
        sim.user("fetch it");
        sim.push(tool_result(big_result()));
        sim.push(tool_result(json!({"small": true})));
        sim.status(SessionStatus::AwaitingApproval);
        store.checkpoint(sim.checkpoint()).await.unwrap();
        drop(store);

        let store = open(dir.path());
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
        assert_eq!(
            store.events_after(sim.id(), 0, 100).await.unwrap(),
            sim.events
        );
        // The large result went to `blobs`; the checkpoint's record only
        // names it.
        let generation = store.current();
        let trees = &generation.trees;
        assert_eq!(trees.blobs.len(), 1);
        let records: Vec<_> = trees
            .records
            .scan_prefix(sim.id().as_bytes())
            .map(|r| r.unwrap().1)
            .collect();
        assert_eq!(records.len(), 1);
        assert!(
            records[0].len() < 4096,
            "record is {} bytes",
            records[0].len()
        );
        assert_eq!(
            all_by_status(&store, &[SessionStatus::AwaitingApproval], 2)
                .await
                .unwrap(),
            vec![sim.header.clone()]
        );
    }

    fn open_compressed(dir: &Path, compression: Compression) -> SledStore {
        let options = StoreOptions {
            compression,
            ..StoreOptions::default()
        };
        SledStore::open_with(dir, &options).unwrap()
    }

    /// Writes `n` sessions of a few checkpoints each, as a turn would.
    async fn write_sessions(store: &SledStore, n: usize) -> Vec<Sim> {
        let mut sims = Vec::new();
        for i in 0..n {
            let mut sim = Sim::new("acme");
            sim.user(&format!(
                "question {i}: what time is it where the sessions run?"
            ));
            sim.status(SessionStatus::Running);
            store.checkpoint(sim.checkpoint()).await.unwrap();
            sim.push(tool_result(json!({"utc": "2026-12-02T08:00:00Z", "i": i})));
            sim.status(SessionStatus::AwaitingInput);
            store.checkpoint(sim.checkpoint()).await.unwrap();
            sims.push(sim);
        }
        sims
    }

    /// sled 0.34 writes a snapshot to `snap.<lsn>.generating` and renames
    /// it when complete; when the write fails (a full disk) the file stays,
    /// and sled takes it for its newest snapshot at every later open, which
    /// then fails as damaged: the store would never open again, not even
    /// after space returns. `store check` names the file; a serving open
    /// removes it and finds everything that was written.
    #[tokio::test]
    async fn a_snapshot_sled_never_finished_does_not_keep_the_store_from_opening() {
        let dir = tempfile::tempdir().unwrap();
        let sims = {
            let store = open(dir.path());
            write_sessions(&store, 20).await
        };
        // What a snapshot write cut short by a full disk leaves behind.
        let leftover = dir.path().join("snap.7FFFFFFFFFFFFFFF.generating");
        std::fs::write(&leftover, b"").unwrap();

        let report = check(dir.path()).unwrap();
        assert!(!report.is_healthy());
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains("snap.7FFFFFFFFFFFFFFF.generating")
                    && p.contains("never finished")),
            "{report}"
        );
        assert!(
            leftover.exists(),
            "store check must not change the directory"
        );

        let store = open(dir.path());
        assert!(!leftover.exists());
        for sim in &sims {
            assert_same(&store.load(sim.id()).await.unwrap().unwrap(), sim);
        }
        let mut sim = sims[0].clone();
        sim.user("and again?");
        store.checkpoint(sim.checkpoint()).await.unwrap();
        assert!(check_after_drop(store, dir.path()).is_healthy());
    }

    /// `store check` of `dir` once `store` is closed.
    fn check_after_drop(store: SledStore, dir: &Path) -> CheckReport {
        drop(store);
        check(dir).unwrap()
    }

    #[tokio::test]
    async fn a_directory_keeps_the_compression_it_was_created_with() {
        for created in [Compression::Zstd, Compression::None] {
            let dir = tempfile::tempdir().unwrap();
            let store = open_compressed(dir.path(), created);
            assert_eq!(store.compression(), created);
            let sims = write_sessions(&store, 3).await;
            drop(store);

            // Asked for the other setting, the directory opens as created,
            // with everything in it, and keeps taking writes.
            let store = open_compressed(dir.path(), created.other());
            assert_eq!(store.compression(), created, "created with {created:?}");
            for sim in &sims {
                assert_same(&store.load(sim.id()).await.unwrap().unwrap(), sim);
            }
            let more = write_sessions(&store, 1).await;
            drop(store);

            // sled itself refuses the other setting: the log really is
            // written as created.
            let other = sled::Config::new()
                .path(dir.path())
                .use_compression(created.other() == Compression::Zstd)
                .open();
            assert!(
                matches!(&other, Err(sled::Error::Unsupported(m)) if m.contains("use_compression")),
                "created with {created:?}: {:?}",
                other.map(|_| ())
            );

            // The offline check and the inspector open it too.
            let report = check(dir.path()).unwrap();
            assert!(report.problems.is_empty(), "{:?}", report.problems);
            let store = open(dir.path());
            for sim in sims.iter().chain(&more) {
                assert_same(&store.load(sim.id()).await.unwrap().unwrap(), sim);
            }
        }
    }

    #[tokio::test]
    async fn a_compressed_store_takes_less_disk_for_the_same_sessions() {
        let mut sizes = Vec::new();
        for compression in [Compression::None, Compression::Zstd] {
            let dir = tempfile::tempdir().unwrap();
            let store = open_compressed(dir.path(), compression);
            let before = store.size_on_disk().unwrap();
            write_sessions(&store, 400).await;
            store.flush().await.unwrap();
            sizes.push(store.size_on_disk().unwrap() - before);
        }
        // The sessions' JSON repeats itself (keys, the configuration), so
        // zstd takes well over a third off; the margin is wide on purpose.
        assert!(
            sizes[1] * 3 < sizes[0] * 2,
            "none: {} bytes, zstd: {} bytes",
            sizes[0],
            sizes[1]
        );
    }

    #[tokio::test]
    async fn identical_large_results_share_one_blob() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut a = Sim::new("acme");
        let mut b = Sim::new("acme");
        a.push(tool_result(big_result()));
        b.push(tool_result(big_result()));
        b.push(tool_result(big_result()));
        store.checkpoint(a.checkpoint()).await.unwrap();
        store.checkpoint(b.checkpoint()).await.unwrap();
        assert_eq!(store.current().trees.blobs.len(), 1);
        assert_same(&store.load(a.id()).await.unwrap().unwrap(), &a);
        assert_same(&store.load(b.id()).await.unwrap().unwrap(), &b);
    }

    #[tokio::test]
    async fn events_after_paginates_within_one_session() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sim = Sim::new("acme");
        let mut other = Sim::new("acme");
        for turn in 1..=24 {
            sim.emit(EventKind::TurnStarted { turn });
            other.emit(EventKind::TurnStarted { turn });
        }
        store.checkpoint(sim.checkpoint()).await.unwrap();
        store.checkpoint(other.checkpoint()).await.unwrap();
        assert_eq!(sim.events.len(), 25);

        let mut seen = Vec::new();
        let mut after = 0;
        loop {
            let page = store.events_after(sim.id(), after, 10).await.unwrap();
            if page.is_empty() {
                break;
            }
            assert!(page.len() <= 10);
            after = page.last().unwrap().seq;
            seen.extend(page);
        }
        assert_eq!(seen, sim.events);
        let page = store.events_after(sim.id(), 10, 10).await.unwrap();
        assert_eq!(
            page.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (11..=20).collect::<Vec<_>>()
        );
        assert!(store
            .events_after(sim.id(), 25, 10)
            .await
            .unwrap()
            .is_empty());
        assert!(store
            .events_after(sim.id(), u64::MAX, 10)
            .await
            .unwrap()
            .is_empty());
        assert!(store.events_after(sim.id(), 0, 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn list_tenant_paginates_by_id_and_keeps_tenants_apart() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut want = Vec::new();
        // Tenants whose names are prefixes of one another.
        for tenant in [
            "acme", "acme", "acm", "acme2", "acme", "acme\0x", "acme", "acme",
        ] {
            let mut sim = Sim::new(tenant);
            store.checkpoint(sim.checkpoint()).await.unwrap();
            if tenant == "acme" {
                want.push(sim.header.clone());
            }
        }
        want.sort_by_key(|h| h.id);

        let mut got = Vec::new();
        let mut cursor = None;
        loop {
            let page = store.list_tenant("acme", cursor, 2).await.unwrap();
            if page.is_empty() {
                break;
            }
            assert!(page.len() <= 2);
            cursor = page.last().map(|h| h.id);
            got.extend(page);
        }
        assert_eq!(got, want);
        assert_eq!(store.list_tenant("acm", None, 10).await.unwrap().len(), 1);
        assert_eq!(store.list_tenant("acme2", None, 10).await.unwrap().len(), 1);
        assert_eq!(
            store.list_tenant("acme\0x", None, 10).await.unwrap().len(),
            1
        );
        assert!(store
            .list_tenant("other", None, 10)
            .await
            .unwrap()
            .is_empty());
        assert!(store.list_tenant("acme", None, 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn list_by_status_for_recovery_reads_the_active_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sims: Vec<Sim> = [
            SessionStatus::Running,
            SessionStatus::AwaitingApproval,
            SessionStatus::AwaitingInput,
            SessionStatus::Completed,
        ]
        .into_iter()
        .map(|status| {
            let mut sim = Sim::new("acme");
            sim.status(status);
            sim
        })
        .collect();
        for sim in &mut sims {
            store.checkpoint(sim.checkpoint()).await.unwrap();
        }
        let recovery = [SessionStatus::Running, SessionStatus::AwaitingApproval];
        let ids = |headers: Vec<SessionHeader>| {
            headers.into_iter().map(|h| h.id).collect::<BTreeSet<_>>()
        };
        let active_keys = || {
            store
                .current()
                .trees
                .active
                .iter()
                .keys()
                .map(|k| layout::id_from(&k.unwrap()).unwrap())
                .collect::<BTreeSet<_>>()
        };

        assert_eq!(active_keys(), BTreeSet::from([sims[0].id(), sims[1].id()]));
        assert_eq!(
            ids(all_by_status(&store, &recovery, 2).await.unwrap()),
            BTreeSet::from([sims[0].id(), sims[1].id()])
        );

        // Leaving awaiting_approval leaves the index.
        sims[1].status(SessionStatus::AwaitingInput);
        store.checkpoint(sims[1].checkpoint()).await.unwrap();
        assert_eq!(active_keys(), BTreeSet::from([sims[0].id()]));
        assert_eq!(
            ids(all_by_status(&store, &recovery, 2).await.unwrap()),
            BTreeSet::from([sims[0].id()])
        );
        assert_eq!(
            ids(all_by_status(&store, &[SessionStatus::AwaitingInput], 2)
                .await
                .unwrap()),
            BTreeSet::from([sims[1].id(), sims[2].id()])
        );
        assert_eq!(all_by_status(&store, &[], 2).await.unwrap().len(), 4);

        // Recovery does not scan `sessions`: a running header that bypassed
        // the index (written raw) is invisible to it, but not to a scan.
        let mut raw = Sim::new("acme");
        raw.status(SessionStatus::Running);
        store
            .current()
            .trees
            .sessions
            .insert(
                raw.id().as_bytes(),
                serde_json::to_vec(&raw.header).unwrap(),
            )
            .unwrap();
        assert_eq!(
            ids(all_by_status(&store, &recovery, 2).await.unwrap()),
            BTreeSet::from([sims[0].id()])
        );
        assert_eq!(all_by_status(&store, &[], 2).await.unwrap().len(), 5);
    }

    /// Boot recovery reads a few fields of each active header, the rest
    /// skipped: what it reads agrees with the headers decoded whole, for a
    /// parked root, a parked child, a root whose tool runs and one whose
    /// call has no deadline stored (read whole for its configuration's
    /// timeout); a session that is not active is not listed.
    #[tokio::test]
    async fn recovery_reads_what_it_needs_of_each_header_as_the_whole_header_says() {
        use overseer_actors::model::{CallState, ParentLink, ToolCallId, ToolCallRecord};
        use overseer_actors::store::{each_resumable_page, Resumable, RESUMABLE};

        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let call = |n: u32, state: CallState, deadline: Option<i64>| {
            let mut c = ToolCallRecord::proposed(
                ToolCallId::from(format!("call_{n}").as_str()),
                "write_record".into(),
                json!({"key": n, "text": "\"open_calls\":[]"}),
                1,
            );
            c.state = state;
            c.approval_deadline_ms = deadline;
            c
        };
        let parked = |calls: Vec<ToolCallRecord>| {
            let mut sim = Sim::new("acme");
            sim.status(SessionStatus::AwaitingApproval);
            sim.header.open_calls = calls;
            sim
        };
        let root = parked(vec![
            call(1, CallState::AwaitingApproval, Some(5_000)),
            call(2, CallState::Approved, Some(6_000)),
        ]);
        let mut child = parked(vec![call(3, CallState::AwaitingApproval, Some(7_000))]);
        child.header.parent = Some(ParentLink {
            session_id: root.id(),
            call_id: ToolCallId::from("call_0"),
            attempt: 0,
            propagate: true,
            depth: 1,
        });
        let mut running = Sim::new("acme");
        running.status(SessionStatus::Running);
        running.header.open_calls = vec![call(4, CallState::Running, None)];
        let old = parked(vec![call(5, CallState::AwaitingApproval, None)]);
        let mut idle = Sim::new("acme");
        idle.status(SessionStatus::AwaitingInput);
        let mut sims = [root, child, running, old, idle];
        for sim in &mut sims {
            store.checkpoint(sim.checkpoint()).await.unwrap();
        }

        let mut read = Vec::new();
        each_resumable_page(&store, 2, |page| read.extend(page))
            .await
            .unwrap();
        let whole: Vec<Resumable> = all_by_status(&store, &RESUMABLE, 2)
            .await
            .unwrap()
            .iter()
            .map(Resumable::from)
            .collect();
        assert_eq!(read.len(), 4, "{read:?}");
        let timeout = Some(sims[3].header.config.approval_timeout_secs);
        for (r, w) in read.iter().zip(&whole) {
            // The configuration is read only where it is needed.
            let needed = r.id == sims[3].id();
            assert_eq!(r.approval_timeout_secs, needed.then_some(timeout).flatten());
            let r = Resumable {
                approval_timeout_secs: w.approval_timeout_secs,
                ..r.clone()
            };
            assert_eq!(&r, w);
        }
        let child_read = read.iter().find(|r| r.id == sims[1].id()).unwrap();
        assert_eq!(child_read.parent, Some(sims[0].id()));
        assert!(!read.iter().any(|r| r.id == sims[4].id()));
    }

    #[tokio::test]
    async fn a_page_of_active_sessions_is_empty_only_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sims = Vec::new();
        for _ in 0..7 {
            let mut sim = Sim::new("acme");
            sim.status(SessionStatus::Running);
            store.checkpoint(sim.checkpoint()).await.unwrap();
            sims.push(sim);
        }
        sims.sort_by_key(Sim::id);
        // Stale index entries ahead of the last session (a crash between a
        // checkpoint's writes leaves such): an index entry whose header
        // says awaiting_input, and one with no header at all.
        let trees = store.current().trees.clone();
        for sim in &mut sims[..5] {
            sim.status(SessionStatus::AwaitingInput);
            let header = serde_json::to_vec(&sim.header).unwrap();
            trees.sessions.insert(sim.id().as_bytes(), header).unwrap();
        }
        trees.sessions.remove(sims[0].id().as_bytes()).unwrap();
        assert_eq!(trees.active.len(), 7);

        let recovery = [SessionStatus::Running, SessionStatus::AwaitingApproval];
        let mut pages = Vec::new();
        let mut after = None;
        loop {
            let page = store.list_by_status(&recovery, after, 2).await.unwrap();
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            pages.push(page.iter().map(|h| h.id).collect::<Vec<_>>());
        }
        // Two pages' worth of stale entries are read past, not answered
        // as an empty page (which would end the listing); a page holds what
        // its index entries yield, at most the limit.
        assert!(pages.iter().all(|p| p.len() <= 2), "{pages:?}");
        assert_eq!(pages.concat(), vec![sims[5].id(), sims[6].id()]);
        let first = store.list_by_status(&recovery, None, 1).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].id, sims[5].id());

        // Over every session (the sessions tree, not the index) too: pages
        // in id order, at most the limit each.
        let all = store.list_by_status(&[], None, 4).await.unwrap();
        assert_eq!(all.len(), 4);
        let rest = store.list_by_status(&[], Some(all[3].id), 4).await.unwrap();
        assert_eq!(rest.len(), 2);
        let ids: Vec<_> = all.iter().chain(&rest).map(|h| h.id).collect();
        assert_eq!(ids, sims[1..].iter().map(Sim::id).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_newer_schema_is_refused_and_the_directory_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let mut sim = Sim::new("acme");
        sim.user("hi");
        sim.status(SessionStatus::Running);
        let store = open(dir.path());
        store.checkpoint(sim.checkpoint()).await.unwrap();
        drop(store);

        // What a newer binary would have left behind.
        {
            // The store just dropped may still hold the lock for a moment.
            let db = open::open_retrying(&sled::Config::new().path(dir.path())).unwrap();
            let sessions = trees::View::new(
                &db.open_tree(trees::DATA_TREE).unwrap(),
                trees::Kind::Sessions,
            );
            let mut header: serde_json::Value =
                serde_json::from_slice(&sessions.get(sim.id().as_bytes()).unwrap().unwrap())
                    .unwrap();
            header["schema_version"] = json!(SCHEMA_VERSION + 1);
            header["field_of_the_future"] = json!({"x": 1});
            sessions
                .insert(sim.id().as_bytes(), serde_json::to_vec(&header).unwrap())
                .unwrap();
            db.flush().unwrap();
        }
        let store = open(dir.path());
        // sled rewrites its snapshot file (a page index derived from the log)
        // whenever it opens a directory, so "before" is taken once it is open.
        let before = hash_dir(dir.path());
        let too_new = StoreError::SchemaTooNew {
            session: sim.id(),
            found: SCHEMA_VERSION + 1,
            supported: SCHEMA_VERSION,
        };
        assert_eq!(store.load(sim.id()).await.unwrap_err(), too_new);
        assert_eq!(store.load_header(sim.id()).await.unwrap_err(), too_new);
        assert_eq!(
            all_by_status(&store, &[SessionStatus::Running], 2)
                .await
                .unwrap_err(),
            too_new
        );
        // Boot recovery too, though it reads a few fields only.
        assert_eq!(store.list_resumable(None, 2).await.unwrap_err(), too_new);
        // Never overwritten either.
        sim.user("more");
        assert_eq!(
            store.checkpoint(sim.checkpoint()).await.unwrap_err(),
            too_new
        );
        assert!(too_new.to_string().contains("upgrade overseer"));
        store.flush().await.unwrap();
        assert_eq!(hash_dir(dir.path()), before);
        drop(store);
        assert_eq!(hash_dir(dir.path()), before);
    }

    #[tokio::test]
    async fn a_newer_store_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path()));
        {
            // The store just dropped may still hold the lock for a moment.
            let db = open::open_retrying(&sled::Config::new().path(dir.path())).unwrap();
            db.open_tree("meta")
                .unwrap()
                .insert(FORMAT_KEY, &(FORMAT_VERSION + 1).to_be_bytes()[..])
                .unwrap();
            db.flush().unwrap();
        }
        // Opening any sled directory rewrites its snapshot file (a page index
        // derived from the log) before the meta tree can be read; the data
        // (the log, `db`) and the config must not change.
        let data = |dir: &Path| {
            let mut files = hash_dir(dir);
            files.retain(|path, _| {
                !path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
            });
            files
        };
        let before = data(dir.path());
        assert!(before.keys().any(|p| p.ends_with("db")));
        let err = SledStore::open(dir.path(), Durability::Fsync).unwrap_err();
        let StoreError::Corrupt { session, detail } = &err else {
            panic!("unexpected {err:?}");
        };
        assert_eq!(session, "meta");
        assert!(
            detail.contains(&format!("format version {}", FORMAT_VERSION + 1)),
            "{detail}"
        );
        assert!(detail.contains("upgrade overseer"), "{detail}");
        assert_eq!(data(dir.path()), before);
    }

    #[tokio::test]
    async fn a_checkpoint_writes_only_what_is_new() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sim = Sim::new("acme");
        let mut other = Sim::new("acme");
        for i in 0..50 {
            sim.user(&format!("m{i}"));
            other.user(&format!("m{i}"));
        }
        store.checkpoint(sim.checkpoint()).await.unwrap();
        store.checkpoint(other.checkpoint()).await.unwrap();
        let generation = store.current();
        let trees = &generation.trees;
        let records = trees.records.len();
        assert_eq!(records, 2, "one record per checkpoint");
        assert_eq!(trees.transcript.len() + trees.events.len(), 0);

        sim.user("one more");
        sim.user("and another");
        sim.emit(EventKind::TurnStarted { turn: 1 });
        sim.emit(EventKind::TurnStarted { turn: 2 });
        sim.emit(EventKind::TurnStarted { turn: 3 });
        let cp = sim.checkpoint();
        assert_eq!(cp.entries.len(), 2);
        store.checkpoint(cp).await.unwrap();
        assert_eq!(
            trees.records.len(),
            records + 1,
            "a checkpoint's entries and events are one record"
        );
        assert_eq!(trees.sessions.len(), 2);
        assert_eq!(trees.tenants.len(), 2);
        assert_eq!(
            store.entries(sim.id(), 49..52).await.unwrap(),
            sim.transcript[49..52].to_vec()
        );

        // A checkpoint with nothing new rewrites only the header.
        store.checkpoint(sim.checkpoint()).await.unwrap();
        assert_eq!(trees.records.len(), records + 1);
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_fsync_checkpoints_share_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        const TASKS: usize = 200;
        const ROUNDS: usize = 5;
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut sim = Sim::new("acme");
                    sim.status(SessionStatus::Running);
                    for i in 0..ROUNDS {
                        sim.user(&format!("m{i}"));
                        store.checkpoint(sim.checkpoint()).await.unwrap();
                    }
                    sim
                })
            })
            .collect();
        let mut sims = Vec::new();
        for task in tasks {
            sims.push(task.await.unwrap());
        }
        let checkpoints = (TASKS * ROUNDS) as u64;
        let flushes = store.flush_count();
        assert!(flushes > 0);
        assert!(
            flushes < checkpoints,
            "{flushes} flushes for {checkpoints} checkpoints"
        );
        for sim in &sims {
            assert_same(&store.load(sim.id()).await.unwrap().unwrap(), sim);
        }
        assert_eq!(
            all_by_status(&store, &[SessionStatus::Running], 2)
                .await
                .unwrap()
                .len(),
            TASKS
        );
    }

    #[tokio::test]
    async fn os_durability_never_flushes_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), Durability::Os).unwrap();
        let mut sim = Sim::new("acme");
        for i in 0..50 {
            sim.user(&format!("m{i}"));
            store.checkpoint(sim.checkpoint()).await.unwrap();
        }
        assert_eq!(store.flush_count(), 0);
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
        // An explicit flush (shutdown) still flushes.
        store.flush().await.unwrap();
        assert_eq!(store.flush_count(), 1);
        drop(store);
        assert_same(
            &open(dir.path()).load(sim.id()).await.unwrap().unwrap(),
            &sim,
        );
    }

    /// The crash-consistency rule of the module docs: a checkpoint whose
    /// header never made it to disk leaves only rows no reader trusts, and the
    /// session's next checkpoint overwrites them.
    /// A purge cut short right after its header (the commit record) leaves a
    /// session no reader sees, and the next open for serving removes what
    /// it left, blobs included.
    #[tokio::test]
    async fn a_purge_cut_short_after_its_header_is_finished_at_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sim = Sim::new("acme");
        sim.user("fetch");
        sim.push(tool_result(big_result()));
        sim.enqueue("later");
        sim.status(SessionStatus::Completed);
        store.checkpoint(sim.checkpoint()).await.unwrap();
        let mut other = Sim::new("acme");
        other.user("stay");
        store.checkpoint(other.checkpoint()).await.unwrap();
        store
            .current()
            .trees
            .stop_purges
            .store(true, std::sync::atomic::Ordering::Relaxed);
        store.purge(sim.id()).await.unwrap_err();
        {
            let generation = store.current();
            let trees = &generation.trees;
            assert!(store.load(sim.id()).await.unwrap().is_none());
            assert!(store
                .events_after(sim.id(), 0, 10)
                .await
                .unwrap()
                .is_empty());
            assert_eq!(
                store.list_tenant("acme", None, 10).await.unwrap(),
                vec![other.header.clone()]
            );
            // The rows are still there, invisible, and the marker says so.
            assert!(trees.records.scan_prefix(sim.id().as_bytes()).count() > 0);
            assert_eq!(trees.blobs.len(), 1);
            assert!(trees
                .meta
                .contains_key(layout::purge_key(&sim.id()))
                .unwrap());
        }
        store.flush().await.unwrap();
        drop(store);

        let store = open(dir.path());
        let generation = store.current();
        let trees = &generation.trees;
        for (name, tree) in [("records", &trees.records), ("queue", &trees.queue)] {
            assert_eq!(tree.scan_prefix(sim.id().as_bytes()).count(), 0, "{name}");
        }
        assert!(!trees.metadata.contains_key(sim.id().as_bytes()).unwrap());
        assert!(!trees
            .tenants
            .contains_key(layout::tenant_key("acme", &sim.id()))
            .unwrap());
        assert_eq!(trees.blobs.len(), 0);
        assert_eq!(trees.blob_refs.len(), 0);
        assert_eq!(trees.meta.scan_prefix(layout::PURGE_PREFIX).count(), 0);
        assert_same(&store.load(other.id()).await.unwrap().unwrap(), &other);
    }

    #[tokio::test]
    async fn scan_walks_every_session_in_bounded_pages() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut want = Vec::new();
        for tenant in ["a", "b", "a", "c", "b"] {
            let mut sim = Sim::new(tenant);
            store.checkpoint(sim.checkpoint()).await.unwrap();
            want.push(sim.header.clone());
        }
        want.sort_by_key(|h| h.id);
        let mut got = Vec::new();
        let mut after = None;
        loop {
            let page = store.scan(after, 2).await.unwrap();
            assert!(page.len() <= 2);
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            got.extend(page);
        }
        assert_eq!(got, want);
    }

    /// The invariant "a group is applied whole or not at all": a group cut
    /// short right before its batch is applied (where a crash would cut
    /// it) leaves no row at all, in memory or after a reopen, and the
    /// session goes on from its last checkpoint.
    #[tokio::test]
    // Named as ARCHITECTURE.md's invariant 9 cites it (still true: cut short
    // before its batch, a checkpoint stays invisible, since nothing is written).
    async fn a_checkpoint_cut_short_before_its_header_stays_invisible() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sim = Sim::new("acme");
        sim.user("kept 0");
        sim.user("kept 1");
        sim.status(SessionStatus::AwaitingInput);
        store.checkpoint(sim.checkpoint()).await.unwrap();
        let committed = sim.clone();

        // Entries, events and an `active` entry gained, all cut short; and a
        // new session whose very first checkpoint is cut short.
        sim.user("lost 2");
        sim.user("lost 3");
        sim.status(SessionStatus::Running);
        sim.emit(EventKind::TurnStarted { turn: 1 });
        let mut fresh = Sim::new("acme");
        fresh.status(SessionStatus::Running);
        store
            .current()
            .trees
            .drop_headers
            .store(true, std::sync::atomic::Ordering::Relaxed);
        store.checkpoint(sim.checkpoint()).await.unwrap_err();
        store.checkpoint(fresh.checkpoint()).await.unwrap_err();
        store.flush().await.unwrap();

        let recovery = [SessionStatus::Running, SessionStatus::AwaitingApproval];
        let check = |store: SledStore| {
            let committed = &committed;
            let fresh = fresh.id();
            async move {
                // Nothing of the group is there...
                let generation = store.current();
                let trees = &generation.trees;
                assert_eq!(trees.records.len(), 1);
                assert!(!trees
                    .active
                    .contains_key(committed.id().as_bytes())
                    .unwrap());
                assert!(!trees.active.contains_key(fresh.as_bytes()).unwrap());
                assert!(!trees
                    .tenants
                    .contains_key(layout::tenant_key("acme", &fresh))
                    .unwrap());
                // ...so no reader sees it.
                assert_same(
                    &store.load(committed.id()).await.unwrap().unwrap(),
                    committed,
                );
                assert_eq!(
                    store.events_after(committed.id(), 0, 100).await.unwrap(),
                    committed.events
                );
                assert!(store
                    .events_after(committed.id(), committed.header.last_event_seq, 100)
                    .await
                    .unwrap()
                    .is_empty());
                assert!(store.load(fresh).await.unwrap().is_none());
                assert!(store.events_after(fresh, 0, 100).await.unwrap().is_empty());
                assert!(all_by_status(&store, &recovery, 2)
                    .await
                    .unwrap()
                    .is_empty());
                assert_eq!(
                    store.list_tenant("acme", None, 10).await.unwrap(),
                    vec![committed.header.clone()]
                );
                store
            }
        };
        let store = check(store).await;
        drop(store);
        let store = check(open(dir.path())).await;

        // The session goes on from its last checkpoint.
        let mut sim = committed.clone();
        sim.user("new 2");
        sim.emit(EventKind::TurnStarted { turn: 7 });
        store.checkpoint(sim.checkpoint()).await.unwrap();
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
        assert_eq!(
            store.events_after(sim.id(), 0, 100).await.unwrap(),
            sim.events
        );
        sim.user("new 3");
        sim.status(SessionStatus::Running);
        store.checkpoint(sim.checkpoint()).await.unwrap();
        drop(store);
        let store = open(dir.path());
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
        assert_eq!(
            store.events_after(sim.id(), 0, 100).await.unwrap(),
            sim.events
        );
        assert_eq!(store.current().trees.records.len(), 3);
        assert_eq!(
            all_by_status(&store, &recovery, 2).await.unwrap(),
            vec![sim.header.clone()]
        );
    }

    /// A decision whose group a crash cut short before its batch leaves no
    /// row in `decisions`; the decision made again after the restart is
    /// the one listed, once.
    #[tokio::test]
    // Named as ARCHITECTURE.md's invariant 9 cites it, from layout 3, which
    // wrote the row ahead of the header; layout 4 writes neither.
    async fn a_decision_row_written_ahead_of_a_lost_header_stays_invisible() {
        use overseer_actors::model::{Decision, DecisionRecord};
        use overseer_actors::store::DecisionQuery;
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sim = Sim::new("acme");
        let mut call = ToolCallRecord::proposed(
            ToolCallId::generate(),
            "write_record".into(),
            json!({"key": 1}),
            3,
        );
        call.state = CallState::AwaitingApproval;
        sim.header.open_calls.push(call.clone());
        sim.status(SessionStatus::AwaitingApproval);
        store.checkpoint(sim.checkpoint()).await.unwrap();
        let committed = sim.clone();

        let decide = |sim: &mut Sim, by: &str, at_ms: i64| {
            sim.emit(EventKind::DecisionRecorded {
                call_id: call.id.clone(),
                record: DecisionRecord {
                    decision: Decision::approve(),
                    by: Some(by.into()),
                    at_ms,
                    metadata: None,
                    args_diff: None,
                },
            });
        };
        decide(&mut sim, "lost", 1_000);
        let trees = store.current().trees.clone();
        trees
            .drop_headers
            .store(true, std::sync::atomic::Ordering::Relaxed);
        store.checkpoint(sim.checkpoint()).await.unwrap_err();
        assert_eq!(trees.decisions.len(), 0, "nothing of the group is written");
        let all = DecisionQuery {
            limit: 10,
            ..DecisionQuery::default()
        };
        let check = |store: SledStore| async {
            let page = store.decisions("acme", &all).await.unwrap();
            assert_eq!(
                page.rows,
                Vec::new(),
                "a row without its commit is answered"
            );
            store
        };
        let store = check(store).await;
        drop(trees);
        drop(store);
        let store = check(open(dir.path())).await;

        // Decided again, at another time: that row, with the same event
        // number the lost one had, is the only one listed.
        let mut sim = committed;
        decide(&mut sim, "alice", 2_000);
        store.checkpoint(sim.checkpoint()).await.unwrap();
        let page = store.decisions("acme", &all).await.unwrap();
        assert_eq!(page.rows.len(), 1, "{:?}", page.rows);
        assert_eq!(page.rows[0].by.as_deref(), Some("alice"));
        assert_eq!(page.rows[0].tool, "write_record");
        assert_eq!(page.next, None);
    }

    /// A purge takes the session's rows out of the decision index itself,
    /// not only out of sight (readers skip rows without a header anyway).
    #[tokio::test]
    async fn a_purge_removes_the_sessions_decision_rows_from_the_tree() {
        use overseer_actors::model::{Decision, DecisionRecord};
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sims = Vec::new();
        for n in 0..2 {
            let mut sim = Sim::new("acme");
            for at_ms in [10 + n, 20 + n] {
                sim.emit(EventKind::DecisionRecorded {
                    call_id: ToolCallId::generate(),
                    record: DecisionRecord {
                        decision: Decision::deny("no"),
                        by: Some("alice".into()),
                        at_ms,
                        metadata: None,
                        args_diff: None,
                    },
                });
                // One checkpoint per decision: rows from several event rows.
                store.checkpoint(sim.checkpoint()).await.unwrap();
            }
            sim.status(SessionStatus::Completed);
            store.checkpoint(sim.checkpoint()).await.unwrap();
            sims.push(sim);
        }
        let trees = store.current().trees.clone();
        assert_eq!(trees.decisions.len(), 4);
        store.purge(sims[0].id()).await.unwrap();
        assert_eq!(
            trees.decisions.len(),
            2,
            "only the purged session's rows go"
        );
        store.purge(sims[1].id()).await.unwrap();
        assert_eq!(trees.decisions.len(), 0);
    }

    #[test]
    fn durability_reads_as_lowercase() {
        assert_eq!(Durability::default(), Durability::Fsync);
        assert_eq!(
            serde_json::from_str::<Durability>("\"os\"").unwrap(),
            Durability::Os
        );
        assert_eq!(
            serde_json::to_string(&Durability::Fsync).unwrap(),
            "\"fsync\""
        );
    }

    /// Reads run on the store's few reader threads, however many are asked
    /// for at once, and a read that panics costs its caller an error, not a
    /// reader: more panics than there are readers, and reads still work.
    #[tokio::test]
    async fn reads_run_on_a_fixed_pool_of_readers_that_outlives_a_panicking_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sim = Sim::new("acme");
        store.checkpoint(sim.checkpoint()).await.unwrap();
        let readers = readers::count();
        for _ in 0..=readers {
            let err = store
                .read::<(), _>(|_| panic!("a read that panics"))
                .await
                .unwrap_err();
            assert!(err.to_string().contains("panicked"), "{err}");
        }
        let names = futures::future::join_all(
            (0..64).map(|_| store.read(|_| Ok(std::thread::current().name().map(str::to_owned)))),
        )
        .await;
        let names: BTreeSet<String> = names.into_iter().map(|n| n.unwrap().unwrap()).collect();
        assert!(names.len() <= readers, "{names:?}");
        assert!(
            names
                .iter()
                .all(|n| n.starts_with("overseer-store-reader-")),
            "{names:?}"
        );
        assert_same(&store.load(sim.id()).await.unwrap().unwrap(), &sim);
    }

    /// Listings do not queue behind point reads: with every reader busy,
    /// recovery's listing (and a tenant's page) still goes through.
    #[tokio::test]
    async fn listings_go_through_while_every_reader_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut sim = Sim::new("acme");
        sim.status(SessionStatus::AwaitingApproval);
        store.checkpoint(sim.checkpoint()).await.unwrap();
        let readers = readers::count();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(std::sync::Mutex::new(held));
        let (busy_tx, mut busy) = tokio::sync::mpsc::unbounded_channel();
        let mut blocked = Vec::new();
        for _ in 0..readers {
            let (store, held, busy_tx) = (store.clone(), held.clone(), busy_tx.clone());
            blocked.push(tokio::spawn(async move {
                store
                    .read(move |_| {
                        busy_tx.send(()).unwrap();
                        // Each holds its reader until released.
                        let _ = held.lock().unwrap().recv();
                        Ok(())
                    })
                    .await
            }));
        }
        for _ in 0..readers {
            busy.recv().await.unwrap();
        }
        let listed = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            let active = all_by_status(&store, &[SessionStatus::AwaitingApproval], 2)
                .await
                .unwrap();
            let page = store.list_tenant("acme", None, 10).await.unwrap();
            (active, page)
        })
        .await
        .expect("a listing waited for the busy readers");
        assert_eq!(listed.0.len(), 1);
        assert_eq!(listed.1.len(), 1);
        for _ in 0..readers {
            release.send(()).unwrap();
        }
        for b in blocked {
            b.await.unwrap().unwrap();
        }
    }

    /// A read waits for the gate only while the writer reopens the
    /// directory, and only until its own deadline; while the store is down
    /// and nobody reopens it, it fails at once as `Unavailable` (HTTP 503),
    /// never after a wait. Once the gate reopens, reads go through.
    #[tokio::test]
    async fn a_read_fails_at_once_while_the_store_is_down_and_waits_only_for_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let gate = &store.inner.shared.gate;
        let generation = store.current();
        // Taken from readers, and the reopen given up: the store is down.
        gate.begin_reopen(Some(&generation));
        gate.reopen_failed("the disk still refuses data");
        let far = || std::time::Instant::now() + std::time::Duration::from_secs(3600);
        let Err(err) = gate.get_by(far()) else {
            panic!("a closed gate gave an opening");
        };
        assert!(err.is_unavailable(), "{err}");
        assert!(
            err.to_string().contains("until the disk takes data"),
            "{err}"
        );
        assert!(store
            .load(SessionId::generate())
            .await
            .unwrap_err()
            .is_unavailable());
        // Reopening: a read whose time is up fails, naming why ...
        gate.begin_reopen(None);
        let Err(err) = gate.get_by(std::time::Instant::now()) else {
            panic!("a reopening gate gave an opening");
        };
        assert!(err.to_string().contains("being reopened"), "{err}");
        // ... and one with time left gets the new opening.
        let (asked, asking) = std::sync::mpsc::channel();
        let waiting = {
            let store = store.clone();
            std::thread::spawn(move || {
                let _ = asked.send(());
                store
                    .inner
                    .shared
                    .gate
                    .get_by(far())
                    .map(|g| Arc::as_ptr(&g) as usize)
            })
        };
        asking.recv().unwrap();
        gate.install(generation.clone(), true, "");
        let got = waiting.join().unwrap().unwrap();
        assert_eq!(got, Arc::as_ptr(&generation) as usize);
        assert!(store.load(SessionId::generate()).await.unwrap().is_none());
    }
}
