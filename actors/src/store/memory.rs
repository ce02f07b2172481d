//! An in-memory [`CheckpointStore`]: the same contract as the sled store,
//! without durability. For unit tests and for embedding overseer where
//! persistence is not wanted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::model::{
    Event, QueuedMessage, SessionHeader, SessionId, SessionStatus, TranscriptEntry, SCHEMA_VERSION,
};

use super::{Checkpoint, CheckpointStore, SessionSummary, StoreError, StoredSession};

#[derive(Default)]
struct Inner {
    headers: BTreeMap<SessionId, SessionHeader>,
    transcripts: BTreeMap<SessionId, Vec<Arc<TranscriptEntry>>>,
    events: BTreeMap<SessionId, Vec<Event>>,
    metadata: BTreeMap<SessionId, Value>,
    queues: BTreeMap<SessionId, BTreeMap<u64, QueuedMessage>>,
    checkpoints: u64,
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
        let transcript = inner.transcripts.entry(id).or_default();
        for (idx, entry) in cp.entries {
            let idx = idx as usize;
            if idx < transcript.len() {
                transcript[idx] = entry;
            } else {
                transcript.push(entry);
            }
        }
        inner.events.entry(id).or_default().extend(cp.events);
        if let Some(metadata) = cp.metadata {
            inner.metadata.insert(id, metadata);
        }
        let queue = inner.queues.entry(id).or_default();
        queue.extend(cp.queued);
        for seq in cp.dequeued {
            queue.remove(&seq);
        }
        inner.headers.insert(id, cp.header);
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
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .headers
            .values()
            .filter(|h| statuses.is_empty() || statuses.contains(&h.status))
            .cloned()
            .collect())
    }

    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .headers
            .values()
            .filter(|h| h.tenant == tenant && after.is_none_or(|a| h.id > a))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .headers
            .values()
            .filter(|h| after.is_none_or(|a| h.id > a))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn purge(&self, id: SessionId) -> Result<(), StoreError> {
        let mut inner = self.lock();
        match inner.headers.get(&id) {
            None => return Ok(()),
            Some(h) if !h.status.is_terminal() => {
                return Err(StoreError::Io(format!(
                    "session {id} is {} and cannot be purged",
                    h.status
                )))
            }
            Some(_) => {}
        }
        inner.headers.remove(&id);
        inner.transcripts.remove(&id);
        inner.events.remove(&id);
        inner.metadata.remove(&id);
        inner.queues.remove(&id);
        Ok(())
    }
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
