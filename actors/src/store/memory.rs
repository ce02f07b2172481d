//! An in-memory [`CheckpointStore`]: the same contract as the sled store,
//! without durability. For unit tests and for embedding overseer where
//! persistence is not wanted.
//!
//! Like the durable stores it keeps each distinct agent configuration once,
//! by hash, counted by the sessions whose header names it: a session's
//! header holds the store's copy, and the copy goes with its last user.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::model::{
    Event, QueuedMessage, SessionHeader, SessionId, SessionStatus, SharedConfig, TranscriptEntry,
    SCHEMA_VERSION,
};

use super::{
    decision_rows, Checkpoint, CheckpointStore, DecisionPage, DecisionPosition, DecisionQuery,
    DecisionRow, SessionSummary, StoreError, StoredSession,
};

#[derive(Default)]
struct Inner {
    headers: BTreeMap<SessionId, SessionHeader>,
    transcripts: BTreeMap<SessionId, Vec<Arc<TranscriptEntry>>>,
    events: BTreeMap<SessionId, Vec<Event>>,
    metadata: BTreeMap<SessionId, Value>,
    queues: BTreeMap<SessionId, BTreeMap<u64, QueuedMessage>>,
    /// The decision index: (tenant, position) → row.
    decisions: BTreeMap<(String, DecisionPosition), DecisionRow>,
    /// Interned configurations: hash → the one copy and how many sessions'
    /// headers name it.
    configs: HashMap<[u8; 32], (SharedConfig, usize)>,
    checkpoints: u64,
    /// Most headers a page of `list_by_status` holds, below what was asked.
    page_cap: Option<usize>,
    /// Calls of `list_by_status` so far.
    listings: u64,
}

/// In-memory store. Cloning shares the data.
#[derive(Clone, Default)]
pub struct MemStore {
    // A std mutex: every critical section is a few map operations, never held
    // across an await.
    inner: Arc<Mutex<Inner>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of checkpoints written so far.
    pub fn checkpoints(&self) -> u64 {
        self.lock().checkpoints
    }

    /// Number of `list_by_status` calls begun so far.
    pub fn listings(&self) -> u64 {
        self.lock().listings
    }

    /// From now on, `list_by_status` answers pages of at most `n` headers
    /// whatever is asked (as the contract allows), so that tests can make
    /// a listing span many pages with a few sessions.
    pub fn cap_pages(&self, n: usize) {
        self.lock().page_cap = Some(n.max(1));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked mid-operation on
        // plain maps; the data is still usable for a test store.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait::async_trait]
impl CheckpointStore for MemStore {
    async fn checkpoint(&self, cp: Checkpoint) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let id = cp.header.id;
        // As the durable stores do: a session last written by a newer binary
        // is never overwritten (it is refused whole, nothing written).
        if let Some(known) = inner.headers.get(&id) {
            check_version(known)?;
        }
        for row in decision_rows(&cp) {
            inner
                .decisions
                .insert((row.tenant.clone(), row.position()), row);
        }
        let transcript = inner.transcripts.entry(id).or_default();
        for (idx, entry) in cp.entries {
            let idx = idx as usize;
            if idx < transcript.len() {
                transcript[idx] = entry;
            } else {
                transcript.push(entry);
            }
        }
        inner
            .events
            .entry(id)
            .or_default()
            .extend(cp.events.iter().cloned());
        if let Some(metadata) = cp.metadata {
            inner.metadata.insert(id, metadata);
        }
        let queue = inner.queues.entry(id).or_default();
        queue.extend(cp.queued);
        for seq in cp.dequeued {
            queue.remove(&seq);
        }
        let mut header = cp.header;
        let previous = inner.headers.get(&id).map(|h| h.config.clone());
        header.config = inner.intern(&header.config, previous);
        inner.headers.insert(id, header);
        inner.checkpoints += 1;
        Ok(())
    }

    async fn load(&self, id: SessionId) -> Result<Option<StoredSession>, StoreError> {
        let inner = self.lock();
        let Some(header) = inner.headers.get(&id).cloned() else {
            return Ok(None);
        };
        check_version(&header)?;
        let transcript = inner.transcripts.get(&id).cloned().unwrap_or_default();
        let metadata = inner.metadata.get(&id).cloned().unwrap_or(Value::Null);
        let queue = &header.queue;
        let inbox = inner
            .queues
            .get(&id)
            .map(|q| {
                q.range(queue.head..queue.next)
                    .map(|(_, m)| m.clone())
                    .collect()
            })
            .unwrap_or_default();
        Ok(Some(StoredSession {
            header,
            transcript,
            metadata,
            inbox,
            needs_rewrite: false,
        }))
    }

    async fn load_header(&self, id: SessionId) -> Result<Option<SessionHeader>, StoreError> {
        let inner = self.lock();
        match inner.headers.get(&id) {
            Some(h) => {
                check_version(h)?;
                Ok(Some(h.clone()))
            }
            None => Ok(None),
        }
    }

    async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .events
            .get(&id)
            .map(|evs| {
                evs.iter()
                    .filter(|e| e.seq > after)
                    .take(limit)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn list_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let mut inner = self.lock();
        inner.listings += 1;
        inner
            .headers
            .values()
            .filter(|h| after.is_none_or(|a| h.id > a))
            .filter(|h| statuses.is_empty() || statuses.contains(&h.status))
            .take(inner.page_cap.map_or(limit, |cap| limit.min(cap)))
            .map(listed)
            .collect()
    }

    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let inner = self.lock();
        inner
            .headers
            .values()
            .filter(|h| h.tenant == tenant && after.is_none_or(|a| h.id > a))
            .take(limit)
            .map(listed)
            .collect()
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn decisions(
        &self,
        tenant: &str,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        let inner = self.lock();
        let limit = query.limit.max(1);
        let mut rows = inner
            .decisions
            .iter()
            .rev()
            .filter(|((t, p), row)| t == tenant && query.after_cursor(p) && query.matches(row))
            .map(|(_, row)| row.clone())
            .take(limit + 1);
        let page: Vec<DecisionRow> = rows.by_ref().take(limit).collect();
        let next = match rows.next() {
            Some(_) => page.last().map(DecisionRow::position),
            None => None,
        };
        Ok(DecisionPage { rows: page, next })
    }

    async fn entries(
        &self,
        id: SessionId,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        let inner = self.lock();
        let Some(transcript) = inner.transcripts.get(&id) else {
            return Ok(Vec::new());
        };
        let end = usize::try_from(range.end)
            .unwrap_or(usize::MAX)
            .min(transcript.len());
        let start = usize::try_from(range.start).unwrap_or(usize::MAX).min(end);
        Ok(transcript[start..end].to_vec())
    }

    async fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let inner = self.lock();
        let start = match after {
            Some(id) => Bound::Excluded(id),
            None => Bound::Unbounded,
        };
        inner
            .headers
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|(_, h)| listed(h))
            .collect()
    }

    async fn stored_configs(&self) -> Result<usize, StoreError> {
        Ok(self.lock().configs.len())
    }

    async fn purge(&self, id: SessionId) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let Some(header) = inner.headers.get(&id) else {
            return Ok(());
        };
        if !header.status.is_terminal() {
            return Err(StoreError::NotTerminal {
                session: id,
                status: header.status,
            });
        }
        if let Some(header) = inner.headers.remove(&id) {
            inner.release(&header.config);
        }
        inner.transcripts.remove(&id);
        inner.events.remove(&id);
        inner.metadata.remove(&id);
        inner.queues.remove(&id);
        inner.decisions.retain(|(_, p), _| p.session_id != id);
        Ok(())
    }
}

impl Inner {
    /// The stored copy of `config` for a session whose stored header runs
    /// under `previous`: counted once more when the session takes it up (its
    /// first checkpoint, or a change of configuration), the configuration
    /// it leaves counted once less.
    fn intern(&mut self, config: &SharedConfig, previous: Option<SharedConfig>) -> SharedConfig {
        let hash = config.hash();
        if let Some(previous) = &previous {
            if previous.hash() == hash {
                return previous.clone();
            }
        }
        let (stored, users) = self
            .configs
            .entry(hash)
            .or_insert_with(|| (config.clone(), 0));
        *users += 1;
        let stored = stored.clone();
        if let Some(previous) = previous {
            self.release(&previous);
        }
        stored
    }

    /// One user fewer of `config`; the copy goes with its last.
    fn release(&mut self, config: &SharedConfig) {
        let hash = config.hash();
        if let Some((_, users)) = self.configs.get_mut(&hash) {
            *users = users.saturating_sub(1);
            if *users == 0 {
                self.configs.remove(&hash);
            }
        }
    }
}

/// A header as a listing returns it: one of a newer schema fails the page
/// (boot recovery must not skip it silently), as in the durable stores.
fn listed(h: &SessionHeader) -> Result<SessionSummary, StoreError> {
    check_version(h)?;
    Ok(h.clone())
}

fn check_version(h: &SessionHeader) -> Result<(), StoreError> {
    if h.schema_version > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            session: h.id,
            found: h.schema_version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::model::{AgentConfig, EventKind};

    fn checkpoint(tenant: &str, status: SessionStatus) -> Checkpoint {
        let id = SessionId::generate();
        let mut header = SessionHeader::new(
            id,
            tenant.into(),
            "a".into(),
            AgentConfig::new("a", &[]).effective(),
            1,
        );
        header.status = status;
        header.transcript_len = 1;
        header.last_event_seq = 1;
        Checkpoint {
            header,
            entries: vec![(
                0,
                Arc::new(TranscriptEntry::User {
                    text: "hi".into(),
                    at_ms: 1,
                }),
            )],
            events: vec![Event {
                session_id: id,
                seq: 1,
                at_ms: 1,
                kind: EventKind::SessionCreated { agent: "a".into() },
            }]
            .into(),
            metadata: Some(serde_json::json!({"k": 1})),
            queued: Vec::new(),
            dequeued: 0..0,
        }
    }

    /// A listing page by page reads the next page while the caller handles
    /// this one (boot recovery arms one page's timers meanwhile), and still
    /// hands over every page, in order, once.
    #[tokio::test]
    async fn a_listing_reads_the_next_page_while_the_caller_handles_this_one() {
        let store = MemStore::new();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let cp = checkpoint("a", SessionStatus::AwaitingApproval);
            ids.push(cp.header.id);
            store.checkpoint(cp).await.unwrap();
        }
        ids.sort();
        let mut seen = Vec::new();
        let mut begun = Vec::new();
        crate::store::each_page_by_status(&store, &[], 1, |page| {
            seen.extend(page.iter().map(|h| h.id));
            begun.push(store.listings());
        })
        .await
        .unwrap();
        assert_eq!(seen, ids);
        // While page k is handled, k + 1 listings have begun: this one's and
        // the next one's (the fourth finds nothing and ends the listing).
        assert_eq!(begun, vec![2, 3, 4]);
        assert_eq!(store.listings(), 4);
    }

    #[tokio::test]
    async fn scan_pages_and_purge_removes_a_terminal_session_only() {
        let store = MemStore::new();
        let mut ids = Vec::new();
        for (tenant, status) in [
            ("a", SessionStatus::Completed),
            ("b", SessionStatus::AwaitingInput),
            ("a", SessionStatus::Cancelled),
        ] {
            let cp = checkpoint(tenant, status);
            ids.push(cp.header.id);
            store.checkpoint(cp).await.unwrap();
        }
        ids.sort();
        let first = store.scan(None, 2).await.unwrap();
        let rest = store.scan(Some(first[1].id), 2).await.unwrap();
        let scanned: Vec<SessionId> = first.iter().chain(&rest).map(|h| h.id).collect();
        assert_eq!(scanned, ids);

        let headers = store.scan(None, 10).await.unwrap();
        let running = headers.iter().find(|h| !h.status.is_terminal()).unwrap().id;
        let err = store.purge(running).await.unwrap_err();
        assert!(matches!(err, StoreError::NotTerminal { .. }), "{err}");
        assert!(store.load(running).await.unwrap().is_some());

        let done = headers.iter().find(|h| h.status.is_terminal()).unwrap().id;
        store.purge(done).await.unwrap();
        assert!(store.load(done).await.unwrap().is_none());
        assert!(store.events_after(done, 0, 10).await.unwrap().is_empty());
        let inner = store.lock();
        assert!(!inner.transcripts.contains_key(&done));
        assert!(!inner.metadata.contains_key(&done));
        assert!(!inner.queues.contains_key(&done));
        assert_eq!(inner.headers.len(), 2);
    }

    /// As sled and PostgreSQL do: a checkpoint over a session last written
    /// by a newer binary is refused and writes nothing (the contract suite
    /// checks it on all three stores, tests/store_contract.rs).
    #[tokio::test]
    async fn a_checkpoint_over_a_newer_schema_is_refused_and_writes_nothing() {
        let store = MemStore::new();
        let mut newer = checkpoint("acme", SessionStatus::Running);
        newer.header.schema_version = SCHEMA_VERSION + 1;
        let id = newer.header.id;
        store.checkpoint(newer.clone()).await.unwrap();
        let mut current = newer;
        current.header.schema_version = SCHEMA_VERSION;
        current.header.status = SessionStatus::Cancelled;
        match store.checkpoint(current).await {
            Err(StoreError::SchemaTooNew { session, .. }) => assert_eq!(session, id),
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
        assert_eq!(store.checkpoints(), 1);
        assert_eq!(store.lock().headers[&id].status, SessionStatus::Running);
    }
}
