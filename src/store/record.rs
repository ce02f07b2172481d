//! The per-checkpoint record of layout 4 (storage format 3 of issue 28),
//! shared by every engine: one checkpoint's new transcript entries and its
//! events as one compact binary value (MessagePack through `rmp-serde`),
//! with events that repeat what an entry of the same record holds (the
//! assistant's text, proposed arguments, the decision, the tool result, a
//! user message, a summary…) stored as a reference to that entry instead.
//!
//! Decoding is exact: [`Record::expand`] gives back exactly the entries and
//! events that were encoded (a reference is only written when the event's
//! fields equal the entry's; anything else is stored whole). A large tool
//! result leaves the record for a content-addressed blob as in `codec`
//! (same threshold, same hash, same JSON bytes, so the blobs of both
//! layouts are one set).
//!
//! It owns no I/O, no keys and no engine: the caller stores the bytes where
//! its layout says (sled `id ‖ seq`, a PostgreSQL row) and looks blobs up
//! for [`Record::expand`]. The header stays JSON beside the record (the
//! lenient `codec::peek` of a newer schema depends on it); JSON also stays
//! the format of everything a person or a client reads (the API, `sessions
//! show`, `store check`, `store copy`).

use std::sync::Arc;

use overseer_actors::model::{Event, EventKind, ProposedCall, SessionId, TranscriptEntry};
use overseer_actors::store::StoreError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::codec::{corrupt, BLOB_THRESHOLD};

/// The record format this binary writes (every record's `v` field).
pub(super) const RECORD_VERSION: u8 = 1;

/// One checkpoint's record as stored.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Record {
    #[serde(rename = "v")]
    version: u8,
    /// Transcript index of the first entry (the rest follow densely unless
    /// an entry says otherwise).
    #[serde(rename = "i", default)]
    first_entry: u64,
    #[serde(rename = "n", default)]
    entries: Vec<StoredEntry>,
    /// Sequence number of the first event (the rest follow densely unless
    /// an event says otherwise).
    #[serde(rename = "s", default)]
    first_seq: u64,
    /// Time of the first event; each event stores its distance from the one
    /// before (a small integer is one to three bytes of MessagePack).
    #[serde(rename = "t", default)]
    at_ms: i64,
    #[serde(rename = "e", default)]
    events: Vec<StoredEvent>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredEntry {
    /// Its transcript index, only when it is not the previous one's + 1.
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    idx: Option<u64>,
    /// The entry (a tool result's `result` moved to `blob` when large).
    #[serde(rename = "x")]
    entry: TranscriptEntry,
    /// sha256 hex of the tool result's JSON, stored as a blob.
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    blob: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredEvent {
    /// Its sequence number, only when it is not the previous one's + 1.
    #[serde(rename = "q", default, skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    /// `at_ms` minus the previous event's (the record's `t` for the first).
    #[serde(rename = "d", default)]
    dt: i64,
    #[serde(rename = "k")]
    kind: StoredKind,
}

/// What happened: a reference to the record's entry `e` (its position in
/// the record, not its transcript index) holding the repeated fields, plus
/// whatever the entry does not say; or the event whole.
// Boxing the whole event would cost an allocation for each one stored whole
// (most are) to save stack space in a short-lived vector.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Serialize, Deserialize)]
enum StoredKind {
    /// `AssistantMessage` whose text is assistant entry `e`'s.
    #[serde(rename = "a")]
    Assistant { e: u32, step: u32 },
    /// `ToolCallProposed` of assistant entry `e`'s call `c`.
    #[serde(rename = "p")]
    Proposed { e: u32, c: u32 },
    /// `ApprovalRequested` with assistant entry `e`'s call `c` as proposed.
    #[serde(rename = "r")]
    Approval {
        e: u32,
        c: u32,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        u: bool,
    },
    /// `DecisionRecorded`: tool-result entry `e`'s decision.
    #[serde(rename = "dc")]
    Decision { e: u32 },
    /// `ToolCallFinished`: tool-result entry `e`'s state and result.
    #[serde(rename = "f")]
    Finished { e: u32 },
    /// `MessageAccepted` of user entry `e`'s text.
    #[serde(rename = "m")]
    Message {
        e: u32,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        q: bool,
    },
    /// `Compacted`, `ModelChanged`, `SkillActivated`, `ToolRuleSet`,
    /// `Error`: every field is entry `e`'s.
    #[serde(rename = "s")]
    Same { e: u32 },
    /// Anything else, whole.
    #[serde(rename = "w")]
    Whole(EventKind),
}

/// A checkpoint's record encoded, with the large tool results it moved out
/// (sha256 hex, JSON bytes) for the caller to store as blobs.
#[derive(Debug)]
pub(super) struct Encoded {
    pub(super) bytes: Vec<u8>,
    pub(super) blobs: Vec<(String, Vec<u8>)>,
}

/// What [`Record::expand`] gives back: the checkpoint's entries with their
/// transcript indexes, and its events.
#[derive(Debug, Default)]
pub(super) struct Expanded {
    pub(super) entries: Vec<(u64, Arc<TranscriptEntry>)>,
    pub(super) events: Vec<Event>,
}

/// Encodes one checkpoint's new entries (with their transcript indexes)
/// and events (all of session `id`).
pub(super) fn encode(
    id: &SessionId,
    entries: &[(u64, Arc<TranscriptEntry>)],
    events: &[Event],
) -> Result<Encoded, StoreError> {
    let mut blobs = Vec::new();
    let mut stored_entries = Vec::with_capacity(entries.len());
    let mut next_idx = entries.first().map_or(0, |(i, _)| *i);
    for (idx, entry) in entries {
        let (entry, blob) = strip_large_result(id, entry, &mut blobs)?;
        stored_entries.push(StoredEntry {
            idx: (*idx != next_idx).then_some(*idx),
            entry,
            blob,
        });
        next_idx = idx.wrapping_add(1);
    }
    let first_seq = events.first().map_or(0, |e| e.seq);
    let at_ms = events.first().map_or(0, |e| e.at_ms);
    let (mut next_seq, mut prev_at) = (first_seq, at_ms);
    let mut stored_events = Vec::with_capacity(events.len());
    for event in events {
        if event.session_id != *id {
            return Err(corrupt(
                id,
                format!(
                    "event {} belongs to session {}",
                    event.seq, event.session_id
                ),
            ));
        }
        stored_events.push(StoredEvent {
            seq: (event.seq != next_seq).then_some(event.seq),
            dt: event.at_ms.wrapping_sub(prev_at),
            kind: refer(&event.kind, entries),
        });
        next_seq = event.seq.wrapping_add(1);
        prev_at = event.at_ms;
    }
    let record = Record {
        version: RECORD_VERSION,
        first_entry: entries.first().map_or(0, |(i, _)| *i),
        entries: stored_entries,
        first_seq,
        at_ms,
        events: stored_events,
    };
    let mut bytes = Vec::with_capacity(512);
    record
        .serialize(&mut rmp_serde::Serializer::new(&mut bytes).with_struct_map())
        .map_err(|e| corrupt(id, format!("cannot encode checkpoint record: {e}")))?;
    Ok(Encoded { bytes, blobs })
}

/// Decodes a stored record (without its blobs: see [`Record::expand`]).
/// A record of a newer format says so (the directory's format version
/// refuses a newer store at open; this is the record-level backstop).
pub(super) fn decode(id: &SessionId, bytes: &[u8]) -> Result<Record, StoreError> {
    let record: Record = rmp_serde::from_slice(bytes)
        .map_err(|e| corrupt(id, format!("unreadable checkpoint record: {e}")))?;
    if record.version > RECORD_VERSION {
        return Err(corrupt(
            id,
            format!(
                "checkpoint record format {} is newer than this binary's {RECORD_VERSION}; upgrade overseer",
                record.version
            ),
        ));
    }
    Ok(record)
}

impl Record {
    /// The sequence number of the record's first event, if it has events.
    pub(super) fn first_seq(&self) -> Option<u64> {
        (!self.events.is_empty()).then_some(self.first_seq)
    }

    /// The sequence number of the record's last event, if it has events.
    pub(super) fn last_seq(&self) -> Option<u64> {
        let mut seq = None;
        let mut next = self.first_seq;
        for event in &self.events {
            let s = event.seq.unwrap_or(next);
            seq = Some(s);
            next = s.wrapping_add(1);
        }
        seq
    }

    /// The blobs (sha256 hex) the record's entries reference.
    pub(super) fn blobs(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().filter_map(|e| e.blob.as_deref())
    }

    /// The record's entries and events, as they were encoded: large results
    /// are read back through `blob` (sha256 hex → the result's JSON), and
    /// every event's references are resolved against the entries.
    pub(super) fn expand<B: AsRef<[u8]>>(
        self,
        id: &SessionId,
        mut blob: impl FnMut(&str) -> Result<Option<B>, StoreError>,
    ) -> Result<Expanded, StoreError> {
        let mut entries: Vec<(u64, Arc<TranscriptEntry>)> = Vec::with_capacity(self.entries.len());
        let mut next_idx = self.first_entry;
        for stored in self.entries {
            let idx = stored.idx.unwrap_or(next_idx);
            next_idx = idx.wrapping_add(1);
            let entry = match stored.blob {
                None => stored.entry,
                Some(hash) => rehydrate(id, idx, stored.entry, &hash, &mut blob)?,
            };
            entries.push((idx, Arc::new(entry)));
        }
        let mut events = Vec::with_capacity(self.events.len());
        let (mut next_seq, mut at_ms) = (self.first_seq, self.at_ms);
        for (n, stored) in self.events.into_iter().enumerate() {
            let seq = stored.seq.unwrap_or(next_seq);
            next_seq = seq.wrapping_add(1);
            if n > 0 {
                at_ms = at_ms.wrapping_add(stored.dt);
            }
            let kind = resolve(stored.kind, &entries)
                .ok_or_else(|| corrupt(id, format!("event {seq} refers to a missing entry")))?;
            events.push(Event {
                session_id: *id,
                seq,
                at_ms,
                kind,
            });
        }
        Ok(Expanded { entries, events })
    }
}

/// The entry as stored: a tool result whose JSON is over the blob threshold
/// loses its result to a blob (sha256 hex of the JSON bytes).
fn strip_large_result(
    id: &SessionId,
    entry: &TranscriptEntry,
    blobs: &mut Vec<(String, Vec<u8>)>,
) -> Result<(TranscriptEntry, Option<String>), StoreError> {
    let TranscriptEntry::ToolResult { call } = entry else {
        return Ok((entry.clone(), None));
    };
    let Some(result) = &call.result else {
        return Ok((entry.clone(), None));
    };
    // Sized by the same cheap walk as `codec::may_be_large` before paying
    // for a JSON encoding: the common small result is never encoded twice.
    let mut budget = BLOB_THRESHOLD;
    if super::codec::fits(result, &mut budget) {
        return Ok((entry.clone(), None));
    }
    let json = serde_json::to_vec(result)
        .map_err(|e| corrupt(id, format!("cannot encode tool result of {}: {e}", call.id)))?;
    if json.len() <= BLOB_THRESHOLD {
        return Ok((entry.clone(), None));
    }
    let hash = hex::encode(Sha256::digest(&json));
    let mut stripped = call.clone();
    stripped.result = None;
    blobs.push((hash.clone(), json));
    Ok((TranscriptEntry::ToolResult { call: stripped }, Some(hash)))
}

fn rehydrate<B: AsRef<[u8]>>(
    id: &SessionId,
    idx: u64,
    entry: TranscriptEntry,
    hash: &str,
    blob: &mut impl FnMut(&str) -> Result<Option<B>, StoreError>,
) -> Result<TranscriptEntry, StoreError> {
    let TranscriptEntry::ToolResult { mut call } = entry else {
        return Err(corrupt(
            id,
            format!("transcript entry {idx} references blob {hash} but is not a tool result"),
        ));
    };
    let data = blob(hash)?.ok_or_else(|| {
        corrupt(
            id,
            format!("transcript entry {idx} references missing blob {hash}"),
        )
    })?;
    let result = serde_json::from_slice(data.as_ref())
        .map_err(|e| corrupt(id, format!("unreadable blob {hash} of entry {idx}: {e}")))?;
    call.result = Some(result);
    Ok(TranscriptEntry::ToolResult { call })
}

/// The stored form of `kind`: a reference to the first entry of the record
/// whose fields it repeats exactly, or the event whole.
fn refer(kind: &EventKind, entries: &[(u64, Arc<TranscriptEntry>)]) -> StoredKind {
    let pos = |f: &dyn Fn(&TranscriptEntry) -> bool| {
        entries
            .iter()
            .position(|(_, entry)| f(entry))
            .and_then(|p| u32::try_from(p).ok())
    };
    let proposed = |call_id: &_, name: &str, arguments: &_| {
        entries.iter().enumerate().find_map(|(e, (_, entry))| {
            let TranscriptEntry::Assistant { tool_calls, .. } = &**entry else {
                return None;
            };
            let c = tool_calls.iter().position(
                |ProposedCall {
                     id,
                     name: n,
                     arguments: a,
                 }| { id == call_id && n == name && a == arguments },
            )?;
            Some((u32::try_from(e).ok()?, u32::try_from(c).ok()?))
        })
    };
    let found = match kind {
        EventKind::AssistantMessage { step, text } => pos(&|entry| {
            matches!(entry, TranscriptEntry::Assistant { text: t, .. } if t == text)
        })
        .map(|e| StoredKind::Assistant { e, step: *step }),
        EventKind::ToolCallProposed {
            call_id,
            name,
            arguments,
        } => proposed(call_id, name, arguments).map(|(e, c)| StoredKind::Proposed { e, c }),
        EventKind::ApprovalRequested {
            call_id,
            name,
            arguments,
            outcome_unknown,
        } => proposed(call_id, name, arguments).map(|(e, c)| StoredKind::Approval {
            e,
            c,
            u: *outcome_unknown,
        }),
        EventKind::DecisionRecorded { call_id, record } => pos(&|entry| {
            matches!(entry, TranscriptEntry::ToolResult { call }
                if call.id == *call_id && call.decision.as_ref() == Some(record))
        })
        .map(|e| StoredKind::Decision { e }),
        EventKind::ToolCallFinished {
            call_id,
            state,
            result,
        // A `null` result is kept whole: the entry's `Option` stores it as
        // absent (in JSON as here), and the event would not get it back.
        } if !result.is_null() => pos(&|entry| {
            matches!(entry, TranscriptEntry::ToolResult { call }
                if call.id == *call_id && call.state == *state && call.result.as_ref() == Some(result))
        })
        .map(|e| StoredKind::Finished { e }),
        EventKind::MessageAccepted { text, queued } => {
            pos(&|entry| matches!(entry, TranscriptEntry::User { text: t, .. } if t == text))
                .map(|e| StoredKind::Message { e, q: *queued })
        }
        EventKind::Compacted { through, summary } => pos(&|entry| {
            matches!(entry, TranscriptEntry::Compaction { through: th, summary: s, .. }
                if th == through && s == summary)
        })
        .map(|e| StoredKind::Same { e }),
        EventKind::ModelChanged { from, to } => pos(&|entry| {
            matches!(entry, TranscriptEntry::ModelChanged { from: f, to: t, .. }
                if f == from && t == to)
        })
        .map(|e| StoredKind::Same { e }),
        EventKind::SkillActivated { name, by } => pos(&|entry| {
            matches!(entry, TranscriptEntry::SkillActivated { name: n, by: b, .. }
                if n == name && b == by)
        })
        .map(|e| StoredKind::Same { e }),
        EventKind::ToolRuleSet { tool, rule, by } => pos(&|entry| {
            matches!(entry, TranscriptEntry::ToolRuleSet { tool: t, rule: r, by: b, .. }
                if t == tool && r == rule && b == by)
        })
        .map(|e| StoredKind::Same { e }),
        EventKind::Error { message } => pos(&|entry| {
            matches!(entry, TranscriptEntry::Error { message: m, .. } if m == message)
        })
        .map(|e| StoredKind::Same { e }),
        _ => None,
    };
    found.unwrap_or_else(|| StoredKind::Whole(kind.clone()))
}

/// The event `kind` stands for, given the record's entries; `None` when it
/// refers to an entry that is not there or not of the kind it says.
fn resolve(kind: StoredKind, entries: &[(u64, Arc<TranscriptEntry>)]) -> Option<EventKind> {
    let entry = |e: u32| entries.get(usize::try_from(e).ok()?).map(|(_, x)| &**x);
    let call = |e: u32, c: u32| match entry(e)? {
        TranscriptEntry::Assistant { tool_calls, .. } => tool_calls.get(usize::try_from(c).ok()?),
        _ => None,
    };
    Some(match kind {
        StoredKind::Whole(kind) => kind,
        StoredKind::Assistant { e, step } => match entry(e)? {
            TranscriptEntry::Assistant { text, .. } => EventKind::AssistantMessage {
                step,
                text: text.clone(),
            },
            _ => return None,
        },
        StoredKind::Proposed { e, c } => {
            let call = call(e, c)?;
            EventKind::ToolCallProposed {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            }
        }
        StoredKind::Approval { e, c, u } => {
            let call = call(e, c)?;
            EventKind::ApprovalRequested {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                outcome_unknown: u,
            }
        }
        StoredKind::Decision { e } => match entry(e)? {
            TranscriptEntry::ToolResult { call } => EventKind::DecisionRecorded {
                call_id: call.id.clone(),
                record: call.decision.clone()?,
            },
            _ => return None,
        },
        StoredKind::Finished { e } => match entry(e)? {
            TranscriptEntry::ToolResult { call } => EventKind::ToolCallFinished {
                call_id: call.id.clone(),
                state: call.state,
                result: call.result.clone()?,
            },
            _ => return None,
        },
        StoredKind::Message { e, q } => match entry(e)? {
            TranscriptEntry::User { text, .. } => EventKind::MessageAccepted {
                text: text.clone(),
                queued: q,
            },
            _ => return None,
        },
        StoredKind::Same { e } => match entry(e)? {
            TranscriptEntry::Compaction {
                through, summary, ..
            } => EventKind::Compacted {
                through: *through,
                summary: summary.clone(),
            },
            TranscriptEntry::ModelChanged { from, to, .. } => EventKind::ModelChanged {
                from: from.clone(),
                to: to.clone(),
            },
            TranscriptEntry::SkillActivated { name, by, .. } => EventKind::SkillActivated {
                name: name.clone(),
                by: by.clone(),
            },
            TranscriptEntry::ToolRuleSet { tool, rule, by, .. } => EventKind::ToolRuleSet {
                tool: tool.clone(),
                rule: *rule,
                by: by.clone(),
            },
            TranscriptEntry::Error { message, .. } => EventKind::Error {
                message: message.clone(),
            },
            _ => return None,
        },
    })
}

#[cfg(test)]
#[path = "record/tests.rs"]
mod tests;
