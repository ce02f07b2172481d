//! The stored form of a session shared by every engine: the header and its
//! lenient `{schema_version}` peek (a newer snapshot is refused, not called
//! corrupt), a transcript entry (with a large tool result moved out to a
//! content-addressed blob), one checkpoint's events as one value, and when a
//! checkpoint is worth encoding off the async runtime.
//!
//! It owns no I/O and no engine: values are plain bytes (`Vec<u8>`, read
//! back from any `AsRef<[u8]>`), so the PostgreSQL store builds without sled
//! types. Keys, trees and rows are each engine's own (`sled/layout`,
//! `postgres/schema`). Everything here is a pure function of its arguments,
//! so the caller decides on which thread the (possibly large) encoding runs.

use std::sync::Arc;

use overseer_actors::model::{
    CallState, Event, EventKind, QueuedMessage, SessionHeader, SessionId, SessionStatus,
    ToolCallId, TranscriptEntry, SCHEMA_VERSION,
};
use overseer_actors::store::{Checkpoint, OpenCall, Resumable, StoreError, RESUMABLE};
use serde::{Deserialize, Serialize};
#[cfg(test)]
use sha2::{Digest, Sha256};

/// Tool results whose JSON is larger than this go to `blobs`.
pub(super) const BLOB_THRESHOLD: usize = 64 * 1024;

/// The blob a stored transcript row references, if any. Only rows that
/// mention the envelope's field are parsed: the common row is a substring
/// search, not a JSON decode.
pub(super) fn blob_of(row: &[u8]) -> Option<String> {
    const FIELD: &[u8] = b"\"result_blob\"";
    if !row.windows(FIELD.len()).any(|w| w == FIELD) {
        return None;
    }
    #[derive(Deserialize)]
    struct Envelope {
        #[serde(default)]
        result_blob: Option<String>,
    }
    serde_json::from_slice::<Envelope>(row).ok()?.result_blob
}

/// The statuses kept in the `active` index: the ones boot recovery resumes.
pub(super) fn is_active(status: SessionStatus) -> bool {
    RESUMABLE.contains(&status)
}

/// What boot recovery reads of a stored header ([`Resumable`]): the few
/// fields it needs, the rest skipped unparsed (a third of the time of
/// decoding the header whole, configuration and arguments included).
/// `None` when it needs the whole header: for the configuration's approval
/// timeout (a call awaiting approval with no deadline stored), or for the
/// right error (a newer schema, or a header that does not decode). A header
/// whose skipped fields would not decode is found when its session is
/// loaded, as a corrupt transcript is, rather than keeping every other
/// session from resuming.
pub(super) fn decode_resumable(bytes: &[u8]) -> Option<Resumable> {
    #[derive(Deserialize)]
    struct Parent {
        session_id: SessionId,
    }
    #[derive(Deserialize)]
    struct Call {
        id: ToolCallId,
        state: CallState,
        #[serde(default)]
        approval_deadline_ms: Option<i64>,
    }
    #[derive(Deserialize)]
    struct Stored {
        schema_version: u32,
        id: SessionId,
        #[serde(default)]
        parent: Option<Parent>,
        status: SessionStatus,
        #[serde(default)]
        open_calls: Vec<Call>,
    }
    let stored: Stored = serde_json::from_slice(bytes).ok()?;
    let needs_timeout = stored
        .open_calls
        .iter()
        .any(|c| c.state == CallState::AwaitingApproval && c.approval_deadline_ms.is_none());
    if stored.schema_version > SCHEMA_VERSION || needs_timeout {
        return None;
    }
    Some(Resumable {
        id: stored.id,
        parent: stored.parent.map(|p| p.session_id),
        status: stored.status,
        open_calls: stored
            .open_calls
            .into_iter()
            .map(|c| OpenCall {
                id: c.id,
                state: c.state,
                approval_deadline_ms: c.approval_deadline_ms,
            })
            .collect(),
        approval_timeout_secs: None,
    })
}

/// The few header fields the store needs before (or instead of) decoding a
/// whole header. Deliberately lenient (status as a plain string, tenant
/// optional) so that a header written by a newer binary still yields its
/// `schema_version` and can be refused with a clear error rather than a
/// decoding failure.
#[derive(Debug, Deserialize)]
pub(super) struct Peek {
    pub(super) schema_version: u32,
    #[serde(default)]
    pub(super) tenant: Option<String>,
    #[serde(default)]
    pub(super) status: Option<String>,
    /// The last event the header commits (`events_after` reads no further).
    #[serde(default)]
    pub(super) last_event_seq: Option<u64>,
}

impl Peek {
    pub(super) fn status_is(&self, status: SessionStatus) -> bool {
        self.status.as_deref() == Some(status.as_str())
    }

    /// Whether the header this peek came from is in the `active` index.
    pub(super) fn is_active(&self) -> bool {
        self.status_is(SessionStatus::Running) || self.status_is(SessionStatus::AwaitingApproval)
    }
}

pub(super) fn corrupt(session: impl ToString, detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        session: session.to_string(),
        detail: detail.to_string(),
    }
}

/// Reads the peek of a stored header and refuses a newer schema.
pub(super) fn peek(id: &SessionId, bytes: &[u8]) -> Result<Peek, StoreError> {
    let peek: Peek = serde_json::from_slice(bytes)
        .map_err(|e| corrupt(id, format!("unreadable session header: {e}")))?;
    if peek.schema_version > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            session: *id,
            found: peek.schema_version,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(peek)
}

/// Decodes a stored header; a newer snapshot is refused as such, not
/// reported as corrupt. The common header is parsed once: only one that is
/// newer or does not decode is peeked at, for the right error (boot
/// recovery decodes every active header, so a second parse each was a
/// third of its time).
pub(super) fn decode_header(id: &SessionId, bytes: &[u8]) -> Result<SessionHeader, StoreError> {
    match serde_json::from_slice::<SessionHeader>(bytes) {
        Ok(header) if header.schema_version <= SCHEMA_VERSION => Ok(header),
        decoded => {
            peek(id, bytes)?;
            decoded.map_err(|e| corrupt(id, format!("unreadable session header: {e}")))
        }
    }
}

/// How a transcript entry is stored. The envelope (rather than a marker value
/// inside the tool result) keeps the round trip exact for every result a tool
/// can return, including one that happens to look like a marker.
// Layout 4's writers (this and `encode_entry`, `StoredEventOut`,
// `encode_events`): layout 5 writes `record`s; tests still build
// directories of the older layout with them.
#[cfg(test)]
#[derive(Serialize)]
struct StoredEntryOut<'a> {
    entry: &'a TranscriptEntry,
    #[serde(skip_serializing_if = "Option::is_none")]
    result_blob: Option<&'a str>,
}

#[derive(Deserialize)]
struct StoredEntryIn {
    entry: TranscriptEntry,
    #[serde(default)]
    result_blob: Option<String>,
}

/// Whether encoding `cp` may take long enough (megabytes of tool result to
/// serialize and hash) that it should leave the async runtime's threads.
/// Only tool results are unbounded; every other field is small. A result is
/// sized by a walk that stops once it passes [`LARGE_RESULT`], so the common
/// small result is encoded in place: the hop to the blocking pool (a thread
/// wake-up and a task) costs more than encoding it.
pub(super) fn may_be_large(cp: &Checkpoint) -> bool {
    let results = cp
        .header
        .open_calls
        .iter()
        .filter_map(|c| c.result.as_ref())
        .chain(cp.entries.iter().filter_map(|(_, e)| match &**e {
            TranscriptEntry::ToolResult { call } => call.result.as_ref(),
            _ => None,
        }));
    let mut budget = LARGE_RESULT;
    results.into_iter().any(|r| !fits(r, &mut budget))
}

/// Tool results (all of one checkpoint's together) up to about this many
/// bytes of JSON are encoded on the caller's thread.
const LARGE_RESULT: usize = 16 * 1024;

/// Whether `v`'s JSON fits in `budget` bytes, roughly (strings by their
/// length, scalars and punctuation by a few bytes each), spending what it
/// measured; it stops as soon as it does not fit.
pub(super) fn fits(v: &serde_json::Value, budget: &mut usize) -> bool {
    use serde_json::Value;
    let cost = match v {
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.len() + 2,
        Value::Object(o) => o.keys().map(|k| k.len() + 4).sum::<usize>() + 2,
        _ => 8,
    };
    let Some(left) = budget.checked_sub(cost) else {
        return false;
    };
    *budget = left;
    match v {
        Value::Array(a) => a.iter().all(|x| fits(x, budget)),
        Value::Object(o) => o.values().all(|x| fits(x, budget)),
        _ => true,
    }
}

/// Serializes `value` into a buffer of `guess` bytes to start with. The rows
/// a checkpoint writes are a few hundred bytes to about a kilobyte, and
/// `serde_json::to_vec` starts at 128 and doubles: three to five
/// reallocations and copies per row otherwise.
pub(super) fn to_json<T: Serialize + ?Sized>(
    value: &T,
    guess: usize,
) -> serde_json::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(guess);
    serde_json::to_writer(&mut buf, value)?;
    Ok(buf)
}

/// What [`to_json`] starts with for a header, and for the other rows.
pub(super) const HEADER_GUESS: usize = 1024;
pub(super) const ROW_GUESS: usize = 512;

/// One stored event of a batch row: the session and the sequence number
/// are the row key's, so only the time and what happened are stored.
#[cfg(test)]
type StoredEventOut<'a> = (i64, &'a EventKind);
type StoredEventIn = (i64, EventKind);

/// Encodes one checkpoint's events (seq ascending, contiguous, all of the
/// checkpoint's session) as one row keyed by the first event's sequence
/// number (layout version 3): a JSON array of `[at_ms, kind]` pairs. One
/// row per checkpoint rather than per event cuts the store's inserts by
/// half, and leaving out what the key already says (session id, seq) cuts
/// each event by about 70 bytes (`benches/PROFILE.md`).
#[cfg(test)]
pub(super) fn encode_events(
    id: &SessionId,
    events: &[Event],
) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
    let Some(first) = events.first() else {
        return Ok(None);
    };
    let stored: Vec<StoredEventOut<'_>> = events.iter().map(|e| (e.at_ms, &e.kind)).collect();
    let value = to_json(&stored, ROW_GUESS)
        .map_err(|e| corrupt(id, format!("cannot encode events from {}: {e}", first.seq)))?;
    Ok(Some((first.seq, value)))
}

/// Decodes one row of the `events` tree keyed by `seq`: a batch of layout
/// version 3 (a JSON array, its events numbered from `seq`), or a single
/// event as layouts 1 and 2 stored them (a JSON object), which stays
/// readable beside the batches written after an upgrade.
pub(super) fn decode_events(
    id: &SessionId,
    seq: u64,
    bytes: &[u8],
) -> Result<Vec<Event>, StoreError> {
    if bytes.first() == Some(&b'[') {
        let stored: Vec<StoredEventIn> = serde_json::from_slice(bytes)
            .map_err(|e| corrupt(id, format!("unreadable events from {seq}: {e}")))?;
        return Ok(stored
            .into_iter()
            .zip(seq..)
            .map(|((at_ms, kind), seq)| Event {
                session_id: *id,
                seq,
                at_ms,
                kind,
            })
            .collect());
    }
    let event: Event = serde_json::from_slice(bytes)
        .map_err(|e| corrupt(id, format!("unreadable event {seq}: {e}")))?;
    Ok(vec![event])
}

/// What a version 1 header kept that now lives beside it: the queued
/// messages and the metadata.
#[derive(Deserialize, Default)]
pub(super) struct LegacyParts {
    #[serde(default)]
    pub(super) inbox: Vec<QueuedMessage>,
    #[serde(default)]
    pub(super) metadata: serde_json::Value,
}

/// The legacy parts of a header written by schema version 1 (`None` for a
/// current header): the reader moves them out, and the session's next
/// checkpoint writes them in their own rows.
pub(super) fn legacy_parts(
    id: &SessionId,
    header: &SessionHeader,
    bytes: &[u8],
) -> Result<Option<LegacyParts>, StoreError> {
    if header.schema_version >= 2 {
        return Ok(None);
    }
    serde_json::from_slice(bytes)
        .map(Some)
        .map_err(|e| corrupt(id, format!("unreadable version 1 header: {e}")))
}

#[cfg(test)]
pub(super) fn encode_entry(
    id: &SessionId,
    entry: &TranscriptEntry,
    blobs: &mut Vec<(String, Vec<u8>)>,
) -> Result<Vec<u8>, StoreError> {
    let encode = |entry: &TranscriptEntry, result_blob: Option<&str>| {
        to_json(&StoredEntryOut { entry, result_blob }, ROW_GUESS)
            .map_err(|e| corrupt(id, format!("cannot encode transcript entry: {e}")))
    };
    let whole = encode(entry, None)?;
    // A whole entry under the threshold cannot hold a result over it: the
    // common case is encoded once.
    if whole.len() <= BLOB_THRESHOLD {
        return Ok(whole);
    }
    let TranscriptEntry::ToolResult { call } = entry else {
        return Ok(whole);
    };
    let Some(result) = &call.result else {
        return Ok(whole);
    };
    let result_json = serde_json::to_vec(result)
        .map_err(|e| corrupt(id, format!("cannot encode tool result of {}: {e}", call.id)))?;
    if result_json.len() <= BLOB_THRESHOLD {
        return Ok(whole);
    }
    let hash = hex::encode(Sha256::digest(&result_json));
    // The clone copies the result once more; it only happens for the rare
    // large result, on a blocking thread (see `may_be_large`).
    let mut stripped = call.clone();
    stripped.result = None;
    let value = encode(&TranscriptEntry::ToolResult { call: stripped }, Some(&hash))?;
    blobs.push((hash, result_json));
    Ok(value)
}

/// Decodes a stored transcript entry, rehydrating a result stored in `blobs`
/// through `blob` (sha256 hex → bytes).
pub(super) fn decode_entry<B: AsRef<[u8]>>(
    id: &SessionId,
    idx: u64,
    bytes: &[u8],
    blob: impl FnOnce(&str) -> Result<Option<B>, StoreError>,
) -> Result<Arc<TranscriptEntry>, StoreError> {
    let stored: StoredEntryIn = serde_json::from_slice(bytes)
        .map_err(|e| corrupt(id, format!("unreadable transcript entry {idx}: {e}")))?;
    let Some(hash) = stored.result_blob else {
        return Ok(Arc::new(stored.entry));
    };
    let TranscriptEntry::ToolResult { mut call } = stored.entry else {
        return Err(corrupt(
            id,
            format!("transcript entry {idx} references blob {hash} but is not a tool result"),
        ));
    };
    let data = blob(&hash)?.ok_or_else(|| {
        corrupt(
            id,
            format!("transcript entry {idx} references missing blob {hash}"),
        )
    })?;
    let result = serde_json::from_slice(data.as_ref())
        .map_err(|e| corrupt(id, format!("unreadable blob {hash} of entry {idx}: {e}")))?;
    call.result = Some(result);
    Ok(Arc::new(TranscriptEntry::ToolResult { call }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use overseer_actors::model::{AgentConfig, SessionHeader, ToolCallRecord};
    use serde_json::{json, Value};

    fn with_result(result: Value) -> Checkpoint {
        let id = SessionId::generate();
        let config = AgentConfig::new("a", &["echo"]).effective();
        let header = SessionHeader::new(id, "t".into(), "a".into(), config, 0);
        let call: ToolCallRecord = serde_json::from_value(json!({
            "id": "c1", "name": "echo", "arguments": {}, "state": "completed",
            "requires_approval": false, "proposed_at_ms": 0, "result": result
        }))
        .unwrap();
        Checkpoint {
            header,
            entries: vec![(0, Arc::new(TranscriptEntry::ToolResult { call }))],
            events: Default::default(),
            metadata: None,
            queued: vec![],
            dequeued: 0..0,
        }
    }

    #[test]
    fn only_a_large_tool_result_leaves_the_callers_thread() {
        let small = json!({"echo": {"text": "hi"}, "n": [1, 2, 3]});
        assert!(!may_be_large(&with_result(small)));
        let long_string = json!({"body": "x".repeat(LARGE_RESULT)});
        assert!(may_be_large(&with_result(long_string)));
        let many_small: Vec<Value> = (0..LARGE_RESULT / 4).map(|n| json!([n])).collect();
        assert!(may_be_large(&with_result(Value::Array(many_small))));
        let just_under = json!({"body": "x".repeat(LARGE_RESULT - 64)});
        assert!(!may_be_large(&with_result(just_under)));
    }
}
