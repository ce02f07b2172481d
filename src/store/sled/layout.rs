//! The byte layout of the sled store: the keys of its trees (ordered so
//! that a session's rows, a tenant's index entries and its decisions are
//! each one contiguous range) and the encoding of a [`Checkpoint`] into
//! ready-to-insert rows ([`Prepared`]). The values themselves are the shared
//! `codec`'s; only how they are keyed and grouped is sled's.
//!
//! It owns no I/O: everything here is a pure function of its arguments.

use overseer_actors::model::SessionId;
use overseer_actors::store::{decision_rows, order_bits, Checkpoint, DecisionPosition, StoreError};
use sled::IVec;

use crate::store::codec::{corrupt, is_active, to_json, ROW_GUESS};
use crate::store::record;

/// `id ‖ big-endian n`: the key of transcript entry `n` or event `n`. Big-endian
/// so that sled's byte order is numeric order and a session's rows are one
/// contiguous range.
pub(in crate::store) fn seq_key(id: &SessionId, n: u64) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(id.as_bytes());
    key[16..].copy_from_slice(&n.to_be_bytes());
    key
}

/// The index number at the end of a [`seq_key`].
pub(in crate::store) fn seq_of(key: &[u8]) -> Option<u64> {
    let tail: [u8; 8] = key.get(16..24)?.try_into().ok()?;
    Some(u64::from_be_bytes(tail))
}

/// `id ‖ events_end ‖ entries_end` (both big-endian): the key of a
/// checkpoint's record (layout 5), by the session's `last_event_seq` and
/// `transcript_len` after the checkpoint. Both only grow, so a session's
/// records are one range in checkpoint order, and the record holding event
/// `n` is the first keyed at or after `id ‖ n ‖ 0`.
pub(in crate::store) fn record_key(id: &SessionId, events_end: u64, entries_end: u64) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(id.as_bytes());
    key[16..24].copy_from_slice(&events_end.to_be_bytes());
    key[24..].copy_from_slice(&entries_end.to_be_bytes());
    key
}

/// `(events_end, entries_end)` of a [`record_key`].
pub(in crate::store) fn record_ends(key: &[u8]) -> Option<(u64, u64)> {
    let events: [u8; 8] = key.get(16..24)?.try_into().ok()?;
    let entries: [u8; 8] = key.get(24..32)?.try_into().ok()?;
    Some((u64::from_be_bytes(events), u64::from_be_bytes(entries)))
}

/// `tenant ‖ 0x00`: every index key of one tenant starts with this.
pub(in crate::store) fn tenant_prefix(tenant: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(tenant.len() + 17);
    key.extend_from_slice(tenant.as_bytes());
    key.push(0);
    key
}

/// `tenant ‖ 0x00 ‖ id`: ordered by id within a tenant, for cursor pagination.
pub(in crate::store) fn tenant_key(tenant: &str, id: &SessionId) -> Vec<u8> {
    let mut key = tenant_prefix(tenant);
    key.extend_from_slice(id.as_bytes());
    key
}

/// `sha256 hex ‖ id`: the key of a session's reference to a blob in
/// `blob_refs`. Keyed by the hash first, so whether anyone else still
/// references a blob is one prefix lookup.
pub(in crate::store) fn blob_ref_key(hash: &str, id: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(hash.len() + 16);
    key.extend_from_slice(hash.as_bytes());
    key.extend_from_slice(id.as_bytes());
    key
}

/// `tenant ‖ 0x00 ‖ time ‖ id ‖ call`: the key of a row of the decision
/// index (`decisions`), in the index's order within a tenant (time as
/// [`order_bits`], big-endian), so that a page newest first is a reverse
/// range walk.
pub(in crate::store) fn decision_key(tenant: &str, position: &DecisionPosition) -> Vec<u8> {
    let mut key = tenant_prefix(tenant);
    key.reserve(24 + position.call_id.0.len());
    key.extend_from_slice(&order_bits(position.at_ms).to_be_bytes());
    key.extend_from_slice(position.session_id.as_bytes());
    key.extend_from_slice(position.call_id.0.as_bytes());
    key
}

/// The first key past every [`decision_key`] of `tenant`.
pub(in crate::store) fn tenant_end(tenant: &str) -> Vec<u8> {
    let mut key = tenant.as_bytes().to_vec();
    key.push(1);
    key
}

/// The prefix of `meta` keys marking purges in progress.
pub(in crate::store) const PURGE_PREFIX: &[u8] = b"purge:";

/// `purge: ‖ id`: the key of `meta` that marks a purge of `id` begun and
/// not finished (its value is the session's tenant).
pub(in crate::store) fn purge_key(id: &SessionId) -> Vec<u8> {
    let mut key = PURGE_PREFIX.to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

/// A session id from the 16 bytes of a key.
pub(in crate::store) fn id_from(bytes: &[u8]) -> Option<SessionId> {
    let raw: [u8; 16] = bytes.try_into().ok()?;
    Some(SessionId(uuid::Uuid::from_bytes(raw)))
}

/// One checkpoint, encoded: everything the writer thread inserts, so that it
/// only copies bytes into sled and never serializes.
#[derive(Debug)]
pub(in crate::store) struct Prepared {
    pub(in crate::store) id: SessionId,
    pub(in crate::store) schema_version: u32,
    pub(in crate::store) tenant: String,
    pub(in crate::store) active: bool,
    /// Whether the header's status is terminal (the writer then forgets it).
    pub(in crate::store) terminal: bool,
    pub(in crate::store) header: IVec,
    /// The checkpoint's new entries and events as one record
    /// ([`record_key`] → `record::encode`), if it has any.
    pub(in crate::store) record: Option<([u8; 32], IVec)>,
    /// `(sha256 hex, result JSON)` of tool results over [`BLOB_THRESHOLD`].
    pub(in crate::store) blobs: Vec<(String, IVec)>,
    /// Newly queued messages.
    pub(in crate::store) queued: Vec<([u8; 24], IVec)>,
    /// Keys of queued messages taken off the queue.
    pub(in crate::store) dequeued: Vec<[u8; 24]>,
    /// The metadata, in the checkpoint that writes it.
    pub(in crate::store) metadata: Option<IVec>,
    /// The webhook deliveries its events owe: the writer names them in its
    /// group's row (`webhooks`) and hands them to the delivery task once
    /// the group is applied.
    pub(in crate::store) hooks: Vec<(uuid::Uuid, crate::webhooks::Seed)>,
    /// Rows of the decision index its decisions add (key, row JSON).
    pub(in crate::store) decisions: Vec<(Vec<u8>, IVec)>,
    /// The configuration the header names (sha256 hex, JSON): written,
    /// with the session's reference, only when the session takes it up
    /// (`configs`).
    pub(in crate::store) config: (String, IVec),
}

impl Prepared {
    /// Bytes this checkpoint will insert, to bound the size of one group.
    pub(in crate::store) fn size(&self) -> usize {
        self.header.len()
            + self.record.as_ref().map_or(0, |(_, v)| v.len() + 32)
            + self
                .blobs
                .iter()
                .map(|(k, v)| v.len() + k.len())
                .sum::<usize>()
            + self.queued.iter().map(|(_, v)| v.len() + 24).sum::<usize>()
            + self.metadata.as_ref().map_or(0, |m| m.len())
            + self
                .decisions
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
            + self.config.1.len()
    }
}

/// Encodes a checkpoint. Only the new entries and events are encoded, so the
/// cost follows what changed, not the transcript's length.
pub(in crate::store) fn prepare(cp: &Checkpoint) -> Result<Prepared, StoreError> {
    let id = cp.header.id;
    let (header, config) = crate::store::configs::encode_header(&cp.header)?;
    let (record, blobs) = prepare_record(cp)?;
    let mut queued = Vec::with_capacity(cp.queued.len());
    for (seq, message) in &cp.queued {
        let value = serde_json::to_vec(message)
            .map_err(|e| corrupt(id, format!("cannot encode queued message {seq}: {e}")))?;
        queued.push((seq_key(&id, *seq), IVec::from(value)));
    }
    let metadata = match &cp.metadata {
        Some(m) => {
            Some(IVec::from(serde_json::to_vec(m).map_err(|e| {
                corrupt(id, format!("cannot encode metadata: {e}"))
            })?))
        }
        None => None,
    };
    let mut decisions = Vec::new();
    for row in decision_rows(cp) {
        let value = to_json(&row, ROW_GUESS).map_err(|e| {
            corrupt(
                id,
                format!("cannot encode the decision of {}: {e}", row.call_id),
            )
        })?;
        decisions.push((
            decision_key(&row.tenant, &row.position()),
            IVec::from(value),
        ));
    }
    Ok(Prepared {
        id,
        schema_version: cp.header.schema_version,
        tenant: cp.header.tenant.clone(),
        active: is_active(cp.header.status),
        terminal: cp.header.status.is_terminal(),
        header: IVec::from(header),
        record,
        blobs,
        queued,
        dequeued: cp.dequeued.clone().map(|seq| seq_key(&id, seq)).collect(),
        metadata,
        hooks: Vec::new(),
        decisions,
        config: (config.hash, IVec::from(config.json)),
    })
}

/// The record of a checkpoint with new entries or events, and the large
/// tool results it moved to blobs (each hash once).
type PreparedRecord = (Option<([u8; 32], IVec)>, Vec<(String, IVec)>);

fn prepare_record(cp: &Checkpoint) -> Result<PreparedRecord, StoreError> {
    if cp.entries.is_empty() && cp.events.is_empty() {
        return Ok((None, Vec::new()));
    }
    let id = cp.header.id;
    let encoded = record::encode(&id, &cp.entries, &cp.events)?;
    let key = record_key(&id, cp.header.last_event_seq, cp.header.transcript_len);
    let mut blobs: Vec<(String, IVec)> = Vec::with_capacity(encoded.blobs.len());
    for (hash, data) in encoded.blobs {
        if !blobs.iter().any(|(h, _)| *h == hash) {
            blobs.push((hash, IVec::from(data)));
        }
    }
    Ok((Some((key, IVec::from(encoded.bytes))), blobs))
}
