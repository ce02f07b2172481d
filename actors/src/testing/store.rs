//! [`TestStore`]: the in-memory store with the faults and probes the
//! actor tests need, shared so each test file does not grow its own
//! forwarding copy of the port. Everything is forwarded to a [`MemStore`]
//! unless a test asked for otherwise:
//!
//! - counts: the reads of whole sessions ([`TestStore::loads`]), and what
//!   each checkpoint wrote ([`TestStore::written`]);
//! - failures: the next N reads or checkpoints fail as
//!   [`StoreError::Unavailable`] (a store down for a while), or the next
//!   checkpoint of one session fails as [`StoreError::Io`];
//! - holds: reads or checkpoints of a held session wait until it is let go
//!   (a slow disk for one session), with a notification when one starts
//!   waiting.
//!
//! Test support only: a poisoned lock panics.

// A test whose own probe fails has failed; panicking there is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore};

use crate::model::{Event, SessionHeader, SessionId, SessionStatus, TranscriptEntry};
use crate::store::{
    Checkpoint, CheckpointStore, DecisionPage, DecisionQuery, MemStore, SessionSummary, StoreError,
    StoredSession,
};

/// The in-memory store with faults and probes (see the module docs).
/// Clones share everything.
#[derive(Clone, Default)]
pub struct TestStore {
    inner: MemStore,
    probes: Arc<Probes>,
}

/// What one checkpoint wrote: the indexes of its transcript entries and
/// the sequence numbers of its events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Transcript entry indexes, in the order written.
    pub entries: Vec<u64>,
    /// Event sequence numbers, in the order written.
    pub events: Vec<u64>,
}

#[derive(Default)]
struct Probes {
    loads: Mutex<HashMap<SessionId, u64>>,
    written: Mutex<HashMap<SessionId, Vec<Written>>>,
    failing_loads: AtomicU32,
    failing_checkpoints: AtomicU32,
    doomed: Mutex<HashSet<SessionId>>,
    held_loads: Gate,
    held_checkpoints: Gate,
    remote_reads: AtomicBool,
}

/// Sessions whose operations wait, and the wake-ups of those waiting.
struct Gate {
    held: Mutex<HashSet<SessionId>>,
    /// Permits are only a wake-up; the set decides.
    open: Semaphore,
    entered: Notify,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            held: Mutex::default(),
            open: Semaphore::new(0),
            entered: Notify::new(),
        }
    }
}

impl Gate {
    fn hold(&self, id: SessionId) {
        self.held.lock().unwrap().insert(id);
    }

    fn release(&self, id: SessionId) {
        self.held.lock().unwrap().remove(&id);
        self.open.add_permits(1_000);
    }

    async fn pass(&self, id: SessionId) {
        if !self.held.lock().unwrap().contains(&id) {
            return;
        }
        self.entered.notify_one();
        while self.held.lock().unwrap().contains(&id) {
            if let Ok(p) = self.open.acquire().await {
                p.forget();
            }
        }
    }
}

/// Takes one from `n` if it is not zero; whether it did.
fn take_one(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl TestStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the store say its reads go over the network
    /// ([`CheckpointStore::reads_are_local`]), as PostgreSQL's do.
    pub fn remote_reads(&self) {
        self.probes.remote_reads.store(true, Ordering::SeqCst);
    }

    /// The store underneath (its own probes: checkpoints written).
    pub fn inner(&self) -> &MemStore {
        &self.inner
    }

    /// Whole-session reads ([`CheckpointStore::load`]) of `id` so far,
    /// failed ones included.
    pub fn loads(&self, id: SessionId) -> u64 {
        self.probes
            .loads
            .lock()
            .unwrap()
            .get(&id)
            .copied()
            .unwrap_or(0)
    }

    /// What each checkpoint of `id` written so far carried, oldest first.
    pub fn written(&self, id: SessionId) -> Vec<Written> {
        self.probes
            .written
            .lock()
            .unwrap()
            .get(&id)
            .cloned()
            .unwrap_or_default()
    }

    /// The next `n` whole-session reads fail as unavailable.
    pub fn fail_loads(&self, n: u32) {
        self.probes.failing_loads.store(n, Ordering::SeqCst);
    }

    /// The next `n` checkpoints fail as unavailable (a disk that is full
    /// for a while).
    pub fn fail_checkpoints(&self, n: u32) {
        self.probes.failing_checkpoints.store(n, Ordering::SeqCst);
    }

    /// The next checkpoint of `id` fails as an I/O error (its actor fails
    /// and is restarted).
    pub fn doom(&self, id: SessionId) {
        self.probes.doomed.lock().unwrap().insert(id);
    }

    /// Whole-session reads of `id` wait until [`TestStore::release_loads`].
    pub fn hold_loads(&self, id: SessionId) {
        self.probes.held_loads.hold(id);
    }

    /// Lets reads of `id` through again, the waiting ones included.
    pub fn release_loads(&self, id: SessionId) {
        self.probes.held_loads.release(id);
    }

    /// Resolves once a read of a held session starts waiting.
    pub async fn load_entered(&self) {
        self.probes.held_loads.entered.notified().await
    }

    /// Checkpoints of `id` wait until [`TestStore::release_checkpoints`].
    pub fn hold_checkpoints(&self, id: SessionId) {
        self.probes.held_checkpoints.hold(id);
    }

    /// Lets checkpoints of `id` through again, the waiting ones included.
    pub fn release_checkpoints(&self, id: SessionId) {
        self.probes.held_checkpoints.release(id);
    }

    /// Resolves once a checkpoint of a held session starts waiting.
    pub async fn checkpoint_entered(&self) {
        self.probes.held_checkpoints.entered.notified().await
    }
}

#[async_trait::async_trait]
impl CheckpointStore for TestStore {
    fn reads_are_local(&self) -> bool {
        !self.probes.remote_reads.load(Ordering::SeqCst)
    }

    async fn checkpoint(&self, checkpoint: Checkpoint) -> Result<(), StoreError> {
        let id = checkpoint.header.id;
        if self.probes.doomed.lock().unwrap().remove(&id) {
            return Err(StoreError::Io("the disk refused the write (a test)".into()));
        }
        self.probes.held_checkpoints.pass(id).await;
        if take_one(&self.probes.failing_checkpoints) {
            return Err(StoreError::Unavailable("the disk is full (a test)".into()));
        }
        let written = Written {
            entries: checkpoint.entries.iter().map(|(i, _)| *i).collect(),
            events: checkpoint.events.iter().map(|e| e.seq).collect(),
        };
        self.inner.checkpoint(checkpoint).await?;
        let mut all = self.probes.written.lock().unwrap();
        all.entry(id).or_default().push(written);
        Ok(())
    }

    async fn load(&self, id: SessionId) -> Result<Option<StoredSession>, StoreError> {
        *self.probes.loads.lock().unwrap().entry(id).or_default() += 1;
        self.probes.held_loads.pass(id).await;
        if take_one(&self.probes.failing_loads) {
            return Err(StoreError::Unavailable("the store is down (a test)".into()));
        }
        self.inner.load(id).await
    }

    async fn load_header(&self, id: SessionId) -> Result<Option<SessionHeader>, StoreError> {
        self.inner.load_header(id).await
    }

    async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        self.inner.events_after(id, after, limit).await
    }

    async fn list_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.inner.list_by_status(statuses, after, limit).await
    }

    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.inner.list_tenant(tenant, after, limit).await
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush().await
    }

    async fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.inner.scan(after, limit).await
    }

    async fn decisions(
        &self,
        tenant: &str,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        self.inner.decisions(tenant, query).await
    }

    async fn entries(
        &self,
        id: SessionId,
        range: Range<u64>,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        self.inner.entries(id, range).await
    }

    async fn purge(&self, id: SessionId) -> Result<(), StoreError> {
        self.inner.purge(id).await
    }
}
