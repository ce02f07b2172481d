//! A session as the runtime writes it, without the runtime: the checkpoint
//! simulator of the store tests (the sled store's unit tests, `tests/store.rs`
//! and the `CheckpointStore` contract of `tests/it/store_contract.rs`), so
//! that every store is fed checkpoints of one shape. It speaks only the port's
//! types (`model`, `store::Checkpoint`), which is why it lives beside them.
//!
//! It deliberately does not run the session machine: a test states what
//! happened (a message, an event, a status) and gets the checkpoint the
//! runtime would write for it, each carrying only what is new since the
//! previous one. Test support only: it panics on any failure.

// A test that cannot build its session or write a checkpoint has failed;
// panicking there is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ops::Range;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::model::{
    AgentConfig, CallState, Event, EventKind, QueuedMessage, SessionHeader, SessionId,
    SessionStatus, ToolCallId, ToolCallRecord, TranscriptEntry, Usage, SCHEMA_VERSION,
};
use crate::store::{Checkpoint, CheckpointStore, StoredSession};

/// A simulated session: what it holds, what its stores must hold once every
/// checkpoint is written, and what its next checkpoint carries.
#[derive(Clone)]
pub struct Sim {
    /// The header as of the last change.
    pub header: SessionHeader,
    /// The whole transcript so far.
    pub transcript: Vec<Arc<TranscriptEntry>>,
    /// How much of `transcript` earlier checkpoints carried.
    pub persisted: usize,
    /// Every event checkpointed so far.
    pub events: Vec<Event>,
    /// Events for the next checkpoint.
    pub pending: Vec<Event>,
    /// The caller's metadata (written with the first checkpoint).
    pub metadata: Value,
    /// Whether a checkpoint carried the metadata already.
    pub metadata_written: bool,
    /// The queue as the store must hold it.
    pub inbox: Vec<QueuedMessage>,
    /// Messages queued since the previous checkpoint.
    pub queued: Vec<(u64, QueuedMessage)>,
    /// Queue positions taken off since the previous checkpoint.
    pub dequeued: Range<u64>,
}

impl Sim {
    /// A new session of agent `a` for `tenant`, titled, with non-ASCII
    /// metadata, its `session_created` event pending.
    pub fn new(tenant: &str) -> Self {
        let id = SessionId::generate();
        // Built from JSON with only the fields a snapshot must carry, so that
        // fields added later (which must default, for old snapshots to load)
        // do not break the tests.
        let mut header: SessionHeader = serde_json::from_value(json!({
            "schema_version": SCHEMA_VERSION,
            "id": id,
            "tenant": tenant,
            "agent": "a",
            "root_id": id,
            "status": "pending",
            "created_at_ms": 1,
            "updated_at_ms": 1,
            "config": AgentConfig::new("a", &["current_time"]).effective(),
            "usage": Usage::default(),
            "turn": 0,
            "step": 0,
            "transcript_len": 0,
            "last_event_seq": 0,
        }))
        .unwrap();
        header.title = Some("t".into());
        let mut sim = Self {
            header,
            transcript: Vec::new(),
            persisted: 0,
            events: Vec::new(),
            pending: Vec::new(),
            metadata: json!({"k": [1, 2], "note": "ünïcode ✓"}),
            metadata_written: false,
            inbox: Vec::new(),
            queued: Vec::new(),
            dequeued: 0..0,
        };
        sim.emit(EventKind::SessionCreated { agent: "a".into() });
        sim
    }

    /// Continues from what a store holds, as a restarted actor would.
    pub fn resumed(stored: &StoredSession) -> Self {
        Self {
            header: stored.header.clone(),
            transcript: stored.transcript.clone(),
            persisted: stored.transcript.len(),
            events: Vec::new(),
            pending: Vec::new(),
            metadata: stored.metadata.clone(),
            metadata_written: true,
            inbox: stored.inbox.clone(),
            queued: Vec::new(),
            dequeued: 0..0,
        }
    }

    /// The session's id.
    pub fn id(&self) -> SessionId {
        self.header.id
    }

    /// Appends a transcript entry.
    pub fn push(&mut self, entry: TranscriptEntry) {
        self.transcript.push(Arc::new(entry));
        self.header.transcript_len = self.transcript.len() as u64;
    }

    /// Appends a user message.
    pub fn user(&mut self, text: &str) {
        self.push(TranscriptEntry::User {
            text: text.into(),
            at_ms: 7,
        });
    }

    /// Adds an event (the next sequence number) to the next checkpoint.
    pub fn emit(&mut self, kind: EventKind) {
        self.header.last_event_seq += 1;
        self.pending.push(Event {
            session_id: self.header.id,
            seq: self.header.last_event_seq,
            at_ms: 9,
            kind,
        });
    }

    /// Changes the status, with its event.
    pub fn status(&mut self, status: SessionStatus) {
        self.header.status = status;
        self.emit(EventKind::StatusChanged { status });
    }

    /// A turn's worth of change: a message of `bytes` and a status change.
    pub fn step(&mut self, n: usize, bytes: usize) {
        self.user(&format!("{n} {}", "x".repeat(bytes)));
        let status = if n.is_multiple_of(2) {
            SessionStatus::Running
        } else {
            SessionStatus::AwaitingInput
        };
        self.status(status);
    }

    /// Queues a message for the session.
    pub fn enqueue(&mut self, text: &str) {
        let m = QueuedMessage {
            text: text.into(),
            at_ms: 5,
        };
        let q = &mut self.header.queue;
        self.queued.push((q.next, m.clone()));
        q.next += 1;
        q.bytes += text.len() as u64;
        self.inbox.push(m);
    }

    /// Takes the oldest queued message off the queue.
    pub fn dequeue(&mut self) {
        let m = self.inbox.remove(0);
        let q = &mut self.header.queue;
        if self.dequeued.is_empty() {
            self.dequeued = q.head..q.head;
        }
        self.dequeued.end = q.head + 1;
        q.head += 1;
        q.bytes -= m.text.len() as u64;
    }

    /// What is new since the previous checkpoint (the metadata in the first
    /// only), as the runtime would write it.
    pub fn checkpoint(&mut self) -> Checkpoint {
        let entries = self.transcript[self.persisted..]
            .iter()
            .enumerate()
            .map(|(i, e)| ((self.persisted + i) as u64, e.clone()))
            .collect();
        self.persisted = self.transcript.len();
        let events = std::mem::take(&mut self.pending);
        self.events.extend(events.iter().cloned());
        let metadata = (!self.metadata_written).then(|| self.metadata.clone());
        self.metadata_written = true;
        Checkpoint {
            header: self.header.clone(),
            entries,
            events: events.into(),
            metadata,
            queued: std::mem::take(&mut self.queued),
            dequeued: std::mem::replace(&mut self.dequeued, 0..0),
        }
    }

    /// Claims the session's tree (a no-op where there is no ownership) and
    /// writes what is new.
    pub async fn write(&mut self, store: &dyn CheckpointStore) {
        store.claim(self.header.root_id).await.unwrap();
        store.checkpoint(self.checkpoint()).await.unwrap();
    }

    /// Whether `stored` is this session's state (header and transcript).
    pub fn is(&self, stored: &StoredSession) -> bool {
        stored.header == self.header
            && stored.transcript.len() == self.transcript.len()
            && stored
                .transcript
                .iter()
                .zip(&self.transcript)
                .all(|(a, b)| **a == **b)
    }
}

/// Panics unless `stored` holds all of `sim`: header, transcript, metadata
/// and queue.
pub fn assert_same(stored: &StoredSession, sim: &Sim) {
    assert_eq!(stored.header, sim.header);
    let got: Vec<&TranscriptEntry> = stored.transcript.iter().map(|e| &**e).collect();
    let want: Vec<&TranscriptEntry> = sim.transcript.iter().map(|e| &**e).collect();
    assert_eq!(got, want);
    assert_eq!(stored.metadata, sim.metadata);
    assert_eq!(stored.inbox, sim.inbox);
}

/// A completed `http_request` call's result entry.
pub fn tool_result(result: Value) -> TranscriptEntry {
    let mut call = ToolCallRecord::proposed(
        ToolCallId::generate(),
        "http_request".into(),
        json!({"url": "https://example.com"}),
        3,
    );
    call.finish(CallState::Completed, result, 4);
    TranscriptEntry::ToolResult { call }
}

/// A tool result of over 100 KiB: large enough for the stores' blobs.
pub fn big_result() -> Value {
    json!({"status": 200, "body": "x".repeat(100 * 1024), "n": [1.5, -2, null]})
}
