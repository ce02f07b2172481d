//! Reading a session's transcript and events: from its checkpoint records
//! ([`Kind::Records`](super::trees::Kind), layout 5: one per checkpoint,
//! `id ‖ events_end ‖ entries_end` → `store::record`'s encoding of the
//! checkpoint's new entries and events), or, in a directory of an older
//! layout opened only to be read (`store check`, `sessions --data`, a
//! backup or `store copy` of a stopped directory) and as the source of the
//! migration to layout 5 (`migrate5`), from the per-entry transcript rows
//! and per-checkpoint event rows of layouts 1 to 4. [`Trees::per_checkpoint`]
//! says which; every call here works on both.
//!
//! Every read is bounded by what the session's header commits, read first:
//! a record's key is the header's counters after its checkpoint, so the
//! records a header commits are exactly those keyed at or below its own
//! counters, whatever checkpoints land while they are read.
//!
//! It owns no writes: records are written by `group_commit` (one per
//! checkpoint, in the group's batch), `migrate5` and removed by `purge`.

use std::sync::Arc;

use overseer_actors::model::{Event, EventKind, SessionId, TranscriptEntry};
use overseer_actors::store::{DecisionPosition, StoreError};

use super::io;
use super::layout;
use super::trees::{Trees, ViewIter};
use crate::store::codec::{self, corrupt};
use crate::store::record;

impl Trees {
    /// The records of `id` a header with these counters commits, from the
    /// one keyed at or after `(events_from, 0)`, in checkpoint order.
    fn records_of(
        &self,
        id: &SessionId,
        events_from: u64,
        last_event_seq: u64,
        transcript_len: u64,
    ) -> ViewIter {
        self.records.range(
            layout::record_key(id, events_from, 0)
                ..=layout::record_key(id, last_event_seq, transcript_len),
        )
    }

    /// One record's entries and events, large results read back from the
    /// blobs.
    fn expand(&self, id: &SessionId, bytes: &[u8]) -> Result<record::Expanded, StoreError> {
        record::decode(id, bytes)?.expand(id, |hash| {
            self.blobs
                .get(hash.as_bytes())
                .map_err(|e| io(format_args!("reading blob {hash} of session {id}"), e))
        })
    }

    /// The whole transcript of `id` its header commits (`len` entries; the
    /// header's `last_event_seq` bounds the records read), every entry
    /// present, or the session named as corrupt.
    pub(super) fn transcript(
        &self,
        id: &SessionId,
        len: u64,
        last_event_seq: u64,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        let read = |e| io(format_args!("reading the transcript of session {id}"), e);
        let mut transcript: Vec<Arc<TranscriptEntry>> =
            Vec::with_capacity(usize::try_from(len.min(4096)).unwrap_or(0));
        if len == 0 {
            return Ok(transcript);
        }
        if self.per_checkpoint {
            for item in self.records_of(id, 0, last_event_seq, len) {
                let (_, value) = item.map_err(read)?;
                for (idx, entry) in self.expand(id, &value)?.entries {
                    let at = usize::try_from(idx).unwrap_or(usize::MAX);
                    match at.cmp(&transcript.len()) {
                        std::cmp::Ordering::Equal => transcript.push(entry),
                        // Written again by a later checkpoint (as layout 4
                        // rewrote the row): the later wins.
                        std::cmp::Ordering::Less => transcript[at] = entry,
                        std::cmp::Ordering::Greater => {
                            return Err(corrupt(
                                id,
                                format!("transcript entry {} is missing", transcript.len()),
                            ))
                        }
                    }
                }
            }
            transcript.truncate(usize::try_from(len).unwrap_or(usize::MAX));
        } else {
            let range = layout::seq_key(id, 0)..=layout::seq_key(id, len - 1);
            for item in self.transcript.range(range) {
                let (key, value) = item.map_err(read)?;
                let expected = transcript.len() as u64;
                let idx =
                    layout::seq_of(&key).ok_or_else(|| corrupt(id, "malformed transcript key"))?;
                if idx != expected {
                    return Err(corrupt(
                        id,
                        format!("transcript entry {expected} is missing"),
                    ));
                }
                transcript.push(self.legacy_entry(id, idx, &value)?);
            }
        }
        if transcript.len() as u64 != len {
            return Err(corrupt(
                id,
                format!(
                    "the header counts {len} transcript entries but {} are stored",
                    transcript.len()
                ),
            ));
        }
        Ok(transcript)
    }

    /// Transcript entries of `id` in `range` that a header with these
    /// counters commits, in order (those stored; gaps are the caller's to
    /// notice). Records are walked from the session's first and decoded
    /// only where they can hold an entry of `range`; the walk stops at the
    /// first record that begins past it.
    pub(super) fn transcript_range(
        &self,
        id: &SessionId,
        range: std::ops::Range<u64>,
        len: u64,
        last_event_seq: u64,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        let read = |e| io(format_args!("reading the transcript of session {id}"), e);
        let end = range.end.min(len);
        if range.start >= end {
            return Ok(Vec::new());
        }
        if !self.per_checkpoint {
            let mut out = Vec::new();
            for item in self
                .transcript
                .range(layout::seq_key(id, range.start)..layout::seq_key(id, end))
            {
                let (key, value) = item.map_err(read)?;
                let idx =
                    layout::seq_of(&key).ok_or_else(|| corrupt(id, "malformed transcript key"))?;
                out.push(self.legacy_entry(id, idx, &value)?);
            }
            return Ok(out);
        }
        let mut found: std::collections::BTreeMap<u64, Arc<TranscriptEntry>> = Default::default();
        // Where the record being read begins: the entries end of the one
        // before it.
        let mut begins = 0;
        for item in self.records_of(id, 0, last_event_seq, len) {
            let (key, value) = item.map_err(read)?;
            let (_, entries_end) =
                layout::record_ends(&key).ok_or_else(|| corrupt(id, "malformed record key"))?;
            let from = begins;
            begins = begins.max(entries_end);
            if from >= end {
                break;
            }
            if entries_end <= range.start {
                continue;
            }
            for (idx, entry) in self.expand(id, &value)?.entries {
                if (range.start..end).contains(&idx) {
                    found.insert(idx, entry);
                }
            }
        }
        Ok(found.into_values().collect())
    }

    /// Hands `visit` the stored events of `id` numbered `first..=last`, in
    /// order, until it returns `false`. Layout 5: the records from the one
    /// keyed at `first` (the first whose `events_end` reaches it). Older
    /// layouts: rows are batches (layouts 3 and 4: one per checkpoint,
    /// keyed by its first event) or single events (layouts 1 and 2); the
    /// row holding `first` is the last one keyed at or below it. An event
    /// numbered at or below one already handed over is a copy (a record
    /// written again, or a leftover of a checkpoint a layout-3 crash cut
    /// short, since overwritten): skipped. Gaps are the caller's to notice
    /// (`seq` says where each event is).
    pub(super) fn committed_events(
        &self,
        id: &SessionId,
        first: u64,
        last: u64,
        mut visit: impl FnMut(Event) -> bool,
    ) -> Result<(), StoreError> {
        if first > last {
            return Ok(());
        }
        let read = |e| io(format_args!("reading the events of session {id}"), e);
        let mut handed = first.saturating_sub(1);
        let mut hand = |events: Vec<Event>| -> Option<()> {
            for event in events {
                if event.seq <= handed {
                    continue;
                }
                if event.seq > last {
                    return None;
                }
                handed = event.seq;
                if !visit(event) {
                    return None;
                }
            }
            Some(())
        };
        if self.per_checkpoint {
            // The record holding `last` may end past it: the walk stops at
            // the first event past `last`, not at a key.
            let records = self.records.range(
                layout::record_key(id, first, 0)..=layout::record_key(id, u64::MAX, u64::MAX),
            );
            for item in records {
                let (_, value) = item.map_err(read)?;
                if hand(self.expand(id, &value)?.events).is_none() {
                    return Ok(());
                }
            }
            return Ok(());
        }
        let start = match self
            .events
            .range(layout::seq_key(id, 0)..=layout::seq_key(id, first))
            .next_back()
            .transpose()
            .map_err(read)?
        {
            Some((key, _)) => key,
            None => layout::seq_key(id, first)[..].into(),
        };
        for item in self
            .events
            .range(start..=layout::seq_key(id, last)[..].into())
        {
            let (key, value) = item.map_err(read)?;
            let seq = layout::seq_of(&key).ok_or_else(|| corrupt(id, "malformed event key"))?;
            if hand(codec::decode_events(id, seq, &value)?).is_none() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Every blob `id`'s stored entries name (sha256 hex), with where: for
    /// the purge, which releases them, and `store check`, which wants each
    /// referenced. Every record or row of the session, committed or not.
    pub(super) fn blobs_named(&self, id: &SessionId) -> Result<Vec<(String, String)>, StoreError> {
        let mut named = Vec::new();
        if self.per_checkpoint {
            for item in self.records.scan_prefix(id.as_bytes()) {
                let (key, value) =
                    item.map_err(|e| io(format_args!("reading the records of session {id}"), e))?;
                let (events_end, entries_end) =
                    layout::record_ends(&key).ok_or_else(|| corrupt(id, "malformed record key"))?;
                for hash in record::decode(id, &value)?.blobs() {
                    named.push((
                        hash.to_owned(),
                        format!(
                            "the record of its checkpoint at transcript length {entries_end}, \
                             event {events_end}"
                        ),
                    ));
                }
            }
        } else {
            for item in self.transcript.scan_prefix(id.as_bytes()) {
                let (key, row) = item
                    .map_err(|e| io(format_args!("reading the transcript of session {id}"), e))?;
                if let Some(hash) = codec::blob_of(&row) {
                    named.push((
                        hash,
                        format!("transcript entry {}", layout::seq_of(&key).unwrap_or(0)),
                    ));
                }
            }
        }
        Ok(named)
    }

    /// The positions in the decision index of the decisions `id`'s stored
    /// events record (every record or row of the session): for the purge.
    /// A record or row that cannot be read has none to find.
    pub(super) fn decisions_recorded(
        &self,
        id: &SessionId,
    ) -> Result<Vec<DecisionPosition>, sled::Error> {
        let mut positions = Vec::new();
        let mut add = |events: Vec<Event>| {
            for event in events {
                if let EventKind::DecisionRecorded { call_id, record } = event.kind {
                    positions.push(DecisionPosition {
                        at_ms: record.at_ms,
                        session_id: *id,
                        call_id,
                    });
                }
            }
        };
        if self.per_checkpoint {
            for item in self.records.scan_prefix(id.as_bytes()) {
                let (_, value) = item?;
                // The decision is the entry's own: a stand-in for every
                // large result spares reading blobs (the purge may have
                // removed them already when it is finished again).
                if let Ok(expanded) = record::decode(id, &value)
                    .and_then(|r| r.expand(id, |_| Ok(Some(&b"null"[..]))))
                {
                    add(expanded.events);
                }
            }
        } else {
            for item in self.events.scan_prefix(id.as_bytes()) {
                let (key, value) = item?;
                let Some(seq) = layout::seq_of(&key) else {
                    continue;
                };
                if let Ok(events) = codec::decode_events(id, seq, &value) {
                    add(events);
                }
            }
        }
        Ok(positions)
    }

    /// A transcript row of layouts 1 to 4, its large result read back.
    fn legacy_entry(
        &self,
        id: &SessionId,
        idx: u64,
        value: &[u8],
    ) -> Result<Arc<TranscriptEntry>, StoreError> {
        codec::decode_entry(id, idx, value, |hash| {
            self.blobs
                .get(hash.as_bytes())
                .map_err(|e| io(format_args!("reading blob {hash} of session {id}"), e))
        })
    }
}
