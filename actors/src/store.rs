//! The checkpoint store port.
//!
//! This module owns the [`CheckpointStore`] trait, the unit of durability
//! ([`Checkpoint`]: one session's header plus its new transcript entries and
//! new events, written atomically) and an in-memory implementation for tests
//! and embedding. Every store keeps each distinct agent configuration once
//! (interned by its hash, see [`CheckpointStore::stored_configs`]); a
//! header read back carries its configuration whole all the same. It deliberately knows no disk format: the sled store lives
//! in the `overseer` crate (`src/store/sled.rs`, beside PostgreSQL's). The decision index every store
//! derives from checkpoints, and its contract, are in `decisions`.

mod decisions;
mod memory;

pub use decisions::{
    decision_rows, order_bits, recorded_by, DecisionKind, DecisionPage, DecisionPosition,
    DecisionQuery, DecisionRow,
};
pub use memory::MemStore;

use std::sync::Arc;

use std::ops::Range;

use serde_json::Value;

use crate::model::{
    CallState, Event, QueuedMessage, SessionHeader, SessionId, SessionStatus, ToolCallId,
    TranscriptEntry,
};

/// One atomic write: the header as it is now, plus what was appended since the
/// previous checkpoint. Its size depends on what changed, not on history.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The full (small) header.
    pub header: SessionHeader,
    /// New transcript entries with their 0-based indexes.
    pub entries: Vec<(u64, Arc<TranscriptEntry>)>,
    /// New events (seq ascending), shared with the session that made them
    /// (it publishes them once the checkpoint is durable).
    pub events: Arc<Vec<Event>>,
    /// The caller's metadata, in the one checkpoint that writes it (the
    /// first); `None` afterwards: it never changes.
    pub metadata: Option<Value>,
    /// Messages queued since the previous checkpoint, with their sequence
    /// numbers (within the header's `queue.head..queue.next`).
    pub queued: Vec<(u64, QueuedMessage)>,
    /// Sequence numbers of queued messages taken off the queue since the
    /// previous checkpoint: their rows are deleted.
    pub dequeued: Range<u64>,
}

/// A session as read back from the store.
#[derive(Debug, Clone)]
pub struct StoredSession {
    /// The header.
    pub header: SessionHeader,
    /// The whole transcript in order.
    pub transcript: Vec<Arc<TranscriptEntry>>,
    /// The caller's metadata (`null` when none was given).
    pub metadata: Value,
    /// The queued messages, oldest first (`header.queue.head..next`).
    pub inbox: Vec<QueuedMessage>,
    /// Read from an older layout that kept the metadata and the queue in the
    /// header: the next checkpoint writes them in their own rows.
    pub needs_rewrite: bool,
}

/// A lightweight row for listing and boot recovery: the header alone, without
/// the transcript, the metadata or the queue.
pub type SessionSummary = SessionHeader;

/// The statuses boot recovery resumes (see [`CheckpointStore::list_resumable`]).
pub const RESUMABLE: [SessionStatus; 2] = [SessionStatus::Running, SessionStatus::AwaitingApproval];

/// What boot recovery needs of a session it resumes: whether it is a root
/// that only waits for decisions (its approval timers are then all it
/// resumes to, see `machine::resume_of_parked`), and its parent. A store
/// may read it without decoding the whole header: recovery reads every
/// active session before the service is ready, and parsing each whole header
/// (its configuration, its calls' arguments) was most of that time.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumable {
    /// Session id.
    pub id: SessionId,
    /// The parent session of a child.
    pub parent: Option<SessionId>,
    /// Its status: one of [`RESUMABLE`].
    pub status: SessionStatus,
    /// Tool calls of the open step, in proposal order.
    pub open_calls: Vec<OpenCall>,
    /// The configuration's approval timeout, which only a call awaiting
    /// approval with no deadline stored needs (snapshots from before
    /// deadlines were recorded): `None` when the store did not read it,
    /// and then such a session is activated instead of left parked.
    pub approval_timeout_secs: Option<u64>,
}

/// What boot recovery needs of an open tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenCall {
    /// Call id.
    pub id: ToolCallId,
    /// Where the call is.
    pub state: CallState,
    /// When its approval times out, if it waits for one and that is stored.
    pub approval_deadline_ms: Option<i64>,
}

impl From<&SessionHeader> for Resumable {
    fn from(header: &SessionHeader) -> Self {
        Self {
            id: header.id,
            parent: header.parent.as_ref().map(|p| p.session_id),
            status: header.status,
            open_calls: header
                .open_calls
                .iter()
                .map(|c| OpenCall {
                    id: c.id.clone(),
                    state: c.state,
                    approval_deadline_ms: c.approval_deadline_ms,
                })
                .collect(),
            approval_timeout_secs: Some(header.config.approval_timeout_secs),
        }
    }
}

/// Store failures.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// The store failed in a way it describes itself, with no underlying
    /// error to keep (it is closed, a worker thread stopped, it does not
    /// support the operation). A failure of the database, the file system
    /// or the OS is [`StoreError::Backend`].
    #[error("storage failure: {0}")]
    Io(String),
    /// The underlying database, file system or OS failed. `source` is its
    /// error, kept whole (not flattened to text) so a log line or
    /// `overseer store check` can show the chain down to the OS error. The
    /// message repeats the source's own text, so code that prints only
    /// this error still says what failed. Built with [`StoreError::io`].
    #[error("storage failure: {context}: {source}")]
    Backend {
        /// What the store was doing.
        context: String,
        /// The error it got.
        #[source]
        source: Cause,
    },
    /// Stored data could not be decoded.
    #[error("corrupt record for session {session}: {detail}")]
    Corrupt {
        /// Session (or "meta").
        session: String,
        /// What failed.
        detail: String,
    },
    /// A snapshot written by a newer binary: refused, never overwritten.
    #[error("session {session} has schema_version {found}, but this binary reads at most {supported}; upgrade overseer to open it")]
    SchemaTooNew {
        /// Session id.
        session: SessionId,
        /// Version found on disk.
        found: u32,
        /// Newest version this binary reads.
        supported: u32,
    },
    /// The store cannot serve now, and will again on its own: a database
    /// shared over the network cannot be reached (it is restarting, or
    /// the network is down), or a local store stopped taking writes after a
    /// failed write or flush (a full disk, an I/O error) and recovers once
    /// the disk takes data again. Answered as "retry shortly" (HTTP 503
    /// `store_unavailable`), never as a failure of the request itself. The
    /// write may or may not have landed (a network store retries for a
    /// while first; a local one confirms nothing it did not make durable),
    /// so the caller treats it like a timeout: retry, or look at the
    /// session's state.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// Cluster mode: this node does not own the session's tree (another
    /// live node holds its lease, or this node lost it). Nothing was written;
    /// the request belongs on the owner.
    #[error("session {session} is not owned by this node: {reason}")]
    NotOwner {
        /// The session the write or claim was for.
        session: SessionId,
        /// Who owns it, or how this node lost it.
        reason: String,
    },
    /// A purge of a session that has not ended: refused, nothing deleted.
    #[error("session {session} is {status}; only a completed, failed or cancelled session can be purged")]
    NotTerminal {
        /// Session id.
        session: SessionId,
        /// Its status.
        status: SessionStatus,
    },
}

/// The error under a [`StoreError::Backend`], shared so the store error
/// stays `Clone` (a group commit answers every waiter with the same error).
/// It derefs to the error itself, which is what `source()` returns: a walk
/// of the chain meets the original error (an [`std::io::Error`] can be
/// downcast), not this wrapper. Two causes are equal when their messages
/// are: equality exists for tests that compare whole results.
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync>);

impl std::ops::Deref for Cause {
    type Target = dyn std::error::Error + Send + Sync;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl std::fmt::Debug for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl StoreError {
    /// A failure of the database, the file system or the OS while the store
    /// was doing `context`, keeping `source` ([`StoreError::Backend`]).
    pub fn io(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Backend {
            context: context.into(),
            source: Cause(Arc::new(source)),
        }
    }

    /// Whether this is [`StoreError::NotOwner`]: the session's tree belongs
    /// to another node, so this node must neither retry nor restart it.
    pub fn is_not_owner(&self) -> bool {
        matches!(self, Self::NotOwner { .. })
    }

    /// Whether this is [`StoreError::Unavailable`]: the store is down for
    /// now and recovers on its own, so a failure it caused is no reason to
    /// give up on a session.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Reads every session whose status is one of `statuses` (all when empty),
/// `page` headers at a time in id order, handing each page to `each` while
/// the next one is read: a listing over a whole store holds two pages at a
/// time, and what `each` does costs no time of its own as long as it is
/// quicker than the store's read (boot recovery arms a parked session's
/// timers while the store reads and decodes the next page).
pub async fn each_page_by_status<S: CheckpointStore + ?Sized>(
    store: &S,
    statuses: &[SessionStatus],
    page: usize,
    each: impl FnMut(Vec<SessionSummary>) + Send,
) -> Result<(), StoreError> {
    each_page(
        |after| store.list_by_status(statuses, after, page),
        |h| h.id,
        each,
    )
    .await
}

/// [`each_page_by_status`] over [`CheckpointStore::list_resumable`]: boot
/// recovery's walk.
pub async fn each_resumable_page<S: CheckpointStore + ?Sized>(
    store: &S,
    page: usize,
    each: impl FnMut(Vec<Resumable>) + Send,
) -> Result<(), StoreError> {
    each_page(|after| store.list_resumable(after, page), |r| r.id, each).await
}

/// Pages of `list` (what comes after an id, in id order) handed to `each`
/// while the next one is read, until a page comes back empty.
async fn each_page<T, F>(
    list: impl Fn(Option<SessionId>) -> F,
    id: impl Fn(&T) -> SessionId,
    mut each: impl FnMut(Vec<T>) + Send,
) -> Result<(), StoreError>
where
    F: std::future::Future<Output = Result<Vec<T>, StoreError>>,
{
    let mut current = list(None).await?;
    while let Some(last) = current.last() {
        let after = Some(id(last));
        // `join` polls the listing first, so the store starts reading the
        // next page before `each` takes this thread.
        let (next, ()) =
            futures::future::join(list(after), async { each(std::mem::take(&mut current)) }).await;
        current = next?;
    }
    Ok(())
}

/// [`each_page_by_status`], collected. For a few sessions (tests, tools).
pub async fn all_by_status<S: CheckpointStore + ?Sized>(
    store: &S,
    statuses: &[SessionStatus],
    page: usize,
) -> Result<Vec<SessionSummary>, StoreError> {
    let mut out = Vec::new();
    each_page_by_status(store, statuses, page, |p| out.extend(p)).await?;
    Ok(out)
}

/// Durable storage of sessions and their event logs.
///
/// `checkpoint` returns only once the write is as durable as the store's
/// configured durability promises (for `fsync`: flushed to disk). Concurrent
/// checkpoints of different sessions may share one flush.
#[async_trait::async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// Writes one checkpoint atomically.
    async fn checkpoint(&self, checkpoint: Checkpoint) -> Result<(), StoreError>;

    /// Reads a session back, or `None` if it does not exist. A snapshot with a
    /// newer `schema_version` is [`StoreError::SchemaTooNew`].
    async fn load(&self, id: SessionId) -> Result<Option<StoredSession>, StoreError>;

    /// Whether [`CheckpointStore::load`] is served on this machine (an
    /// embedded engine, memory) rather than over the network. A session at
    /// rest releases its transcript only when it is: it reads it back before
    /// its next input, and a network round trip per decision would cost a
    /// clustered node far more than the memory saves (measured: PostgreSQL's
    /// approvals per second nearly halved). Sessions of a remote store keep
    /// what they hold until they hibernate.
    fn reads_are_local(&self) -> bool {
        true
    }

    /// Reads only the header.
    async fn load_header(&self, id: SessionId) -> Result<Option<SessionHeader>, StoreError>;

    /// Events of a session with `seq > after`, ascending, at most `limit`.
    async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError>;

    /// Headers of the sessions whose status is one of `statuses` (every
    /// session when empty), ascending by id, after `after`, at most `limit`
    /// (a page may hold fewer: only an empty one says there are no more).
    /// Paged so that a listing over every active session (boot recovery,
    /// the approvals inbox) holds one page of decoded headers at a time,
    /// not all of them.
    async fn list_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError>;

    /// Boot recovery's listing: what it needs of each session whose status
    /// is one of [`RESUMABLE`], ascending by id, after `after`, at most
    /// `limit` (paged as [`Self::list_by_status`] is). A header of a newer
    /// schema fails it, as it fails a load: recovery must not skip a
    /// session. By default the headers, cut down; a store that can read
    /// these few fields without decoding the rest does so.
    async fn list_resumable(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<Resumable>, StoreError> {
        let headers = self.list_by_status(&RESUMABLE, after, limit).await?;
        Ok(headers.iter().map(Resumable::from).collect())
    }

    /// Headers of a tenant's sessions, ascending by id, after `cursor`, at most `limit`.
    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError>;

    /// Makes everything written so far durable (used at shutdown).
    async fn flush(&self) -> Result<(), StoreError>;

    /// Checks that the store takes writes now (`/readyz`). Stores with
    /// nothing that can fail (in memory) keep the default, `Ok`.
    async fn health_check(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Makes sure this process may write the tree rooted at `root`, before
    /// an actor of it starts here (activation, restart, creation). A store
    /// shared by several nodes takes the tree's lease here, with a new
    /// fencing epoch that every later checkpoint of the tree is conditional
    /// on, and answers `true` when it took it just now: what was read before
    /// may be stale, so the caller reads the session again. It fails with
    /// [`StoreError::NotOwner`] while another live node holds the lease.
    /// A store only this process writes (sled, memory) keeps the default:
    /// always its own, never re-read.
    async fn claim(&self, root: SessionId) -> Result<bool, StoreError> {
        let _ = root;
        Ok(false)
    }

    /// Headers of every session, ascending by id, after `after`, at most
    /// `limit`: a bounded walk over the whole store (retention, expiry).
    async fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let _ = (after, limit);
        Err(StoreError::Io("this store cannot be scanned".into()))
    }

    /// The tenant's decision history, newest first: a page of the decision
    /// index (see [`DecisionRow`] and the contract in `decisions`: rows are
    /// derived by the store from each checkpoint's `decision_recorded`
    /// events, in the same write, and purged with their session). A store
    /// that keeps no index keeps this default, an error.
    async fn decisions(
        &self,
        tenant: &str,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        let _ = (tenant, query);
        Err(StoreError::Io("this store keeps no decision index".into()))
    }

    /// Transcript entries of `id` whose index is in `range` and that its
    /// header commits (below `transcript_len`), in order; fewer, or none,
    /// where the range reaches past them or the session does not exist. A
    /// bounded read of a long transcript (the inbox reads the few entries
    /// before a call). The default loads the whole session.
    async fn entries(
        &self,
        id: SessionId,
        range: Range<u64>,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        let Some(stored) = self.load(id).await? else {
            return Ok(Vec::new());
        };
        let end = usize::try_from(range.end)
            .unwrap_or(usize::MAX)
            .min(stored.transcript.len());
        let start = usize::try_from(range.start).unwrap_or(usize::MAX).min(end);
        Ok(stored.transcript[start..end].to_vec())
    }

    /// How many distinct agent configurations the store holds. A store
    /// keeps each configuration once, under its content hash
    /// ([`SharedConfig::hash`](crate::model::SharedConfig::hash)), shared
    /// by every session that runs under it (a stored header names it by
    /// hash), and deletes it with the last of those sessions (`purge`), or
    /// when the last moves to another configuration. For tests of that
    /// sharing; a store that keeps configurations in its headers keeps this
    /// default, an error.
    async fn stored_configs(&self) -> Result<usize, StoreError> {
        Err(StoreError::Io(
            "this store does not keep configurations apart".into(),
        ))
    }

    /// Deletes a terminal session whole: header, transcript, events, queue,
    /// metadata, index entries (its decision rows too), the blobs no other
    /// session references, and its configuration if no other session runs
    /// under it.
    /// The header goes first, so a purge cut short leaves invisible rows,
    /// never a session with holes. Purging a session that is not terminal is
    /// refused ([`StoreError::NotTerminal`]); purging one that does not exist
    /// does nothing.
    async fn purge(&self, id: SessionId) -> Result<(), StoreError> {
        let _ = id;
        Err(StoreError::Io("this store cannot purge sessions".into()))
    }
}
