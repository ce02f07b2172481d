//! A checkpoint encoded into the parameters of its statement
//! ([`Prepared`]): pure (no I/O), so a large one is encoded off the async
//! runtime. Only what is new is encoded (the header names its configuration
//! by hash, `store::configs`): the new transcript entries and
//! events as one record (`crate::store::record`; a large tool result moved
//! out to a content-addressed blob), queued messages, the dequeued range,
//! the metadata once, and the rows of the decision index the checkpoint's
//! decisions add.
//!
//! It owns no SQL: the statement is `writer`'s, the import's `import`'s.

use overseer_actors::model::SessionId;
use overseer_actors::store::{decision_rows, Checkpoint, StoreError};
use uuid::Uuid;

use super::codec::corrupt;
use super::signed;
use crate::store::record;

/// One checkpoint, encoded into the parameters of its statement.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(super) id: Uuid,
    pub(super) root: Uuid,
    pub(super) parent: Option<Uuid>,
    pub(super) tenant: String,
    pub(super) status: String,
    pub(super) schema_version: i32,
    pub(super) last_event_seq: i64,
    pub(super) transcript_len: i64,
    /// The header, naming its configuration by hash (`store::configs`).
    pub(super) header: String,
    /// That hash (sha256 hex) and the configuration's JSON: a `configs`
    /// row, inserted when the session takes the configuration up.
    pub(super) config_hash: String,
    pub(super) config: String,
    pub(super) metadata: Option<String>,
    /// The checkpoint's new entries and events as one record (empty when
    /// it has neither: then no `checkpoints` row is written).
    pub(super) record: Vec<u8>,
    /// Its first event's sequence number and first entry's index, if any.
    pub(super) first_event: Option<i64>,
    pub(super) first_entry: Option<i64>,
    /// The blobs the record's entries name (`None`: none).
    pub(super) record_blobs: Option<Vec<String>>,
    /// The blobs themselves: sha256 hex and the result's JSON.
    pub(super) blob_hashes: Vec<String>,
    pub(super) blob_data: Vec<String>,
    pub(super) queue_seqs: Vec<i64>,
    pub(super) queued: Vec<String>,
    pub(super) dequeue_from: i64,
    pub(super) dequeue_to: i64,
    /// The session's agent (the decision rows' column).
    pub(super) agent: String,
    /// The decision index's rows this checkpoint adds: time, call, tool,
    /// decider, row JSON (see `overseer_actors::store::decision_rows`).
    pub(super) decision_at: Vec<i64>,
    pub(super) decision_calls: Vec<String>,
    pub(super) decision_tools: Vec<String>,
    pub(super) decision_by: Vec<Option<String>>,
    pub(super) decision_rows: Vec<String>,
    /// The epoch the write is conditional on (`None` only for imports).
    pub(super) epoch: Option<i64>,
    /// The node writing (set by the writer).
    pub(super) node: Option<Uuid>,
    /// First and last new event, to announce them.
    pub(super) new_events: Option<(u64, u64)>,
    /// Webhook seeds of its events: `webhook-id`s, event types, seed JSON.
    pub(super) hook_ids: Vec<String>,
    pub(super) hook_events: Vec<String>,
    pub(super) hook_seeds: Vec<String>,
    /// When its deliveries are queued (and first due), ms since the epoch.
    pub(super) hook_now_ms: i64,
}

impl Prepared {
    /// Bytes of encoded rows this checkpoint writes (for the bytes metric).
    pub(super) fn size(&self) -> u64 {
        let rows = |v: &[String]| v.iter().map(String::len).sum::<usize>();
        (self.header.len()
            + self.metadata.as_ref().map_or(0, String::len)
            + self.record.len()
            + rows(&self.blob_data)
            + rows(&self.queued)
            + rows(&self.decision_rows)) as u64
    }
}

fn utf8(id: &SessionId, bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|e| corrupt(id, format!("encoded JSON is not UTF-8: {e}")))
}

/// Encodes a checkpoint (pure: no I/O). Only what is new is encoded.
pub(super) fn prepare(cp: &Checkpoint, epoch: Option<i64>) -> Result<Prepared, StoreError> {
    let h = &cp.header;
    let id = h.id;
    let (header, config) = crate::store::configs::encode_header(h)?;
    let header = utf8(&id, header)?;
    let (record, new_blobs) = if cp.entries.is_empty() && cp.events.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        let encoded = record::encode(&id, &cp.entries, &cp.events)?;
        (encoded.bytes, encoded.blobs)
    };
    let mut blob_hashes = Vec::with_capacity(new_blobs.len());
    let mut blob_data = Vec::with_capacity(new_blobs.len());
    for (hash, data) in new_blobs {
        if blob_hashes.contains(&hash) {
            continue;
        }
        blob_hashes.push(hash);
        blob_data.push(utf8(&id, data)?);
    }
    let mut queue_seqs = Vec::with_capacity(cp.queued.len());
    let mut queued = Vec::with_capacity(cp.queued.len());
    for (seq, m) in &cp.queued {
        queue_seqs.push(signed(*seq));
        queued.push(
            serde_json::to_string(m)
                .map_err(|e| corrupt(id, format!("cannot encode queued message {seq}: {e}")))?,
        );
    }
    let metadata = cp
        .metadata
        .as_ref()
        .map(|m| {
            serde_json::to_string(m)
                .map_err(|e| corrupt(id, format!("cannot encode metadata: {e}")))
        })
        .transpose()?;
    let decisions = decision_rows(cp);
    let mut decision_json = Vec::with_capacity(decisions.len());
    for row in &decisions {
        decision_json.push(serde_json::to_string(row).map_err(|e| {
            corrupt(
                id,
                format!("cannot encode the decision of {}: {e}", row.call_id),
            )
        })?);
    }
    let new_events = match (cp.events.first(), cp.events.last()) {
        (Some(a), Some(b)) => Some((a.seq, b.seq)),
        _ => None,
    };
    Ok(Prepared {
        id: id.0,
        root: h.root_id.0,
        parent: h.parent.as_ref().map(|p| p.session_id.0),
        tenant: h.tenant.clone(),
        status: h.status.as_str().to_owned(),
        schema_version: i32::try_from(h.schema_version).unwrap_or(i32::MAX),
        last_event_seq: signed(h.last_event_seq),
        transcript_len: signed(h.transcript_len),
        header,
        config_hash: config.hash,
        config: utf8(&id, config.json)?,
        metadata,
        first_event: cp.events.first().map(|e| signed(e.seq)),
        first_entry: cp.entries.first().map(|(i, _)| signed(*i)),
        record_blobs: (!blob_hashes.is_empty()).then(|| blob_hashes.clone()),
        record,
        blob_hashes,
        blob_data,
        queue_seqs,
        queued,
        dequeue_from: signed(cp.dequeued.start),
        dequeue_to: signed(cp.dequeued.end),
        agent: h.agent.clone(),
        decision_at: decisions.iter().map(|r| r.at_ms).collect(),
        decision_calls: decisions.iter().map(|r| r.call_id.0.clone()).collect(),
        decision_tools: decisions.iter().map(|r| r.tool.clone()).collect(),
        decision_by: decisions.iter().map(|r| r.by.clone()).collect(),
        decision_rows: decision_json,
        epoch,
        node: None,
        new_events,
        hook_ids: Vec::new(),
        hook_events: Vec::new(),
        hook_seeds: Vec::new(),
        hook_now_ms: 0,
    })
}
