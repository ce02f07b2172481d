//! The move of a store directory from layout 4 to layout 5: each session's
//! per-entry transcript rows ([`Kind::Transcript`]) and per-checkpoint event
//! rows ([`Kind::Events`]) turned into a checkpoint record
//! ([`Kind::Records`], read by `records`), then those rows removed. `open`
//! runs it when a directory of an older layout is first opened for serving
//! (after `migrate` for one older than 4) and stamps the layout once it
//! returns.
//!
//! A session becomes ONE record holding everything its header commits (its
//! entries below `transcript_len`, its events up to `last_event_seq`),
//! keyed by those counters: layout 4 does not say which entries each
//! checkpoint wrote, and one record is the session as one checkpoint would
//! have written it (PostgreSQL's migration 6 does the same). Rows past a
//! header's counters (what a layout-3 crash left) are not converted and go
//! with the rest. Its next checkpoints add records of their own.
//!
//! Resumable, as `migrate` is: sessions are converted in id order, in
//! chunks, each applied with one `apply_batch` together with the progress
//! marker ([`PROGRESS_KEY`] in [`Kind::Meta`]: the last session converted),
//! so the marker and the records it covers are recovered together or not
//! at all, and flushed, so a kill loses no chunk applied before it;
//! converting a session again writes the same record under the same key.
//! The old rows are removed only once every session is converted (the
//! marker then says so), in chunks too, each one batch, flushed; removing
//! a row already gone does nothing, so that phase is simply done again. A reader of the directory meanwhile (`store check`, `sessions
//! --data`) reads the old rows until the marker says converted, and the
//! records from then on (`open`).
//!
//! It owns the conversion only: the records' encoding is `store::record`'s,
//! and reading the old rows is `records`'.

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use overseer_actors::model::{SessionId, TranscriptEntry};
use overseer_actors::store::StoreError;
use sled::{Batch, IVec, Tree};

use super::layout;
use super::trees::{Kind, Trees, View, DATA_TREE};
use crate::store::codec::corrupt;
use crate::store::record;

/// The key of [`Kind::Meta`] holding how far a migration got: one byte,
/// [`CONVERTING`] or [`CONVERTED`], then (converting) the id of the last
/// session converted (none: nothing yet).
pub(super) const PROGRESS_KEY: &[u8] = b"migrate5";
const CONVERTING: u8 = 0;
const CONVERTED: u8 = 1;

/// Most sessions, and bytes, one chunk converts; most old rows one chunk
/// removes. Built for fault injection, a few, so that a test's small store
/// is converted and cleared in several chunks and a kill lands inside
/// each phase.
#[cfg(not(feature = "fault-injection"))]
const CHUNK_SESSIONS: usize = 256;
#[cfg(feature = "fault-injection")]
const CHUNK_SESSIONS: usize = 2;
#[cfg(not(feature = "fault-injection"))]
const CHUNK_ROWS: usize = 1024;
#[cfg(feature = "fault-injection")]
const CHUNK_ROWS: usize = 4;
const CHUNK_BYTES: usize = 1024 * 1024;

/// How far a migration got: the phase, and the last session converted.
fn progress(data: &Tree) -> sled::Result<(u8, Option<SessionId>)> {
    let raw = View::new(data, Kind::Meta).get(PROGRESS_KEY)?;
    Ok(match raw.as_deref().and_then(<[u8]>::split_first) {
        None => (CONVERTING, None),
        Some((&phase, rest)) => (phase, layout::id_from(rest)),
    })
}

fn marker(phase: u8, last: Option<&SessionId>) -> Vec<u8> {
    let mut value = vec![phase];
    value.extend_from_slice(last.map_or(&[][..], |id| id.as_bytes()));
    value
}

/// Whether a migration converted every session already (only removing the
/// old rows and the stamp may be left).
pub(super) fn converted(data: &Tree) -> sled::Result<bool> {
    Ok(progress(data)?.0 >= CONVERTED)
}

/// The counters of a header, read leniently: a header of any schema has
/// them (0 when absent).
#[derive(serde::Deserialize)]
struct Counters {
    #[serde(default)]
    transcript_len: u64,
    #[serde(default)]
    last_event_seq: u64,
}

/// Converts what is left to convert, then removes the old rows. Blocking;
/// the caller flushes and stamps the layout after.
pub(super) fn run(db: &sled::Db, dir: &Path) -> Result<(), StoreError> {
    let io = |what: &str, e: sled::Error| {
        StoreError::io(
            format!(
                "upgrading the store in {} to layout 5: {what}",
                dir.display()
            ),
            e,
        )
    };
    let data = db
        .open_tree(DATA_TREE)
        .map_err(|e| io("opening the data tree", e))?;
    // Read as layout 4: the rows being converted.
    let trees = Trees::over(db, false, false).map_err(|e| io("opening the trees", e))?;
    let (phase, last) = progress(&data).map_err(|e| io("reading the progress", e))?;
    let resumed = phase > CONVERTING || last.is_some();
    let mut sessions = 0u64;
    if phase == CONVERTING {
        let mut after = last;
        loop {
            let start = match after {
                Some(id) => Bound::Excluded(id.as_bytes().to_vec()),
                None => Bound::Unbounded,
            };
            let mut batch = Batch::default();
            let (mut n, mut bytes) = (0usize, 0usize);
            let mut end = None;
            for item in trees
                .sessions
                .range::<Vec<u8>, _>((start, Bound::Unbounded))
            {
                let (key, header) = item.map_err(|e| io("reading the sessions", e))?;
                let id =
                    layout::id_from(&key).ok_or_else(|| corrupt("sessions", "malformed key"))?;
                bytes += convert(&trees, &id, &header, &mut batch)?;
                n += 1;
                end = Some(id);
                if n >= CHUNK_SESSIONS || bytes >= CHUNK_BYTES {
                    break;
                }
            }
            let Some(id) = end else {
                break;
            };
            trees
                .meta
                .batch_insert(&mut batch, PROGRESS_KEY, marker(CONVERTING, Some(&id)));
            data.apply_batch(batch)
                .map_err(|e| io("writing a chunk of records", e))?;
            db.flush()
                .map_err(|e| io("flushing a chunk of records", e))?;
            sessions += n as u64;
            after = Some(id);
            #[cfg(feature = "fault-injection")]
            overseer_actors::fault::hit_outside_sessions(
                overseer_actors::fault::FaultPoint::StoreMigration,
            );
        }
        // Every record is durable (each chunk was flushed) before the
        // marker lets the old rows go.
        trees
            .meta
            .insert(PROGRESS_KEY, marker(CONVERTED, None))
            .map_err(|e| io("marking the records complete", e))?;
        db.flush().map_err(|e| io("flushing", e))?;
    }
    let mut removed = 0u64;
    for (view, name) in [(&trees.transcript, "transcript"), (&trees.events, "event")] {
        loop {
            let keys = view
                .iter()
                .keys()
                .take(CHUNK_ROWS)
                .collect::<Result<Vec<IVec>, _>>()
                .map_err(|e| io(&format!("reading the old {name} rows"), e))?;
            if keys.is_empty() {
                break;
            }
            let mut batch = Batch::default();
            for key in &keys {
                view.batch_remove(&mut batch, key);
            }
            data.apply_batch(batch)
                .map_err(|e| io(&format!("removing the old {name} rows"), e))?;
            db.flush()
                .map_err(|e| io(&format!("flushing the removal of old {name} rows"), e))?;
            removed += keys.len() as u64;
            #[cfg(feature = "fault-injection")]
            overseer_actors::fault::hit_outside_sessions(
                overseer_actors::fault::FaultPoint::StoreMigration,
            );
        }
    }
    tracing::info!(
        dir = %dir.display(),
        sessions,
        removed,
        resumed,
        "turned the store's transcript and event rows into one record per checkpoint (layout 5)"
    );
    Ok(())
}

/// Adds the record of session `id` (`header` its stored header) to
/// `batch`, with the blobs and blob references it needs; returns its size.
/// A session with neither entries nor events has none.
fn convert(
    trees: &Trees,
    id: &SessionId,
    header: &[u8],
    batch: &mut Batch,
) -> Result<usize, StoreError> {
    let counters: Counters = serde_json::from_slice(header)
        .map_err(|e| corrupt(id, format!("unreadable session header: {e}")))?;
    let (len, last) = (counters.transcript_len, counters.last_event_seq);
    let entries: Vec<(u64, Arc<TranscriptEntry>)> = trees
        .transcript(id, len, last)?
        .into_iter()
        .zip(0..)
        .map(|(entry, idx)| (idx, entry))
        .collect();
    let mut events = Vec::new();
    trees.committed_events(id, 1, last, |event| {
        events.push(event);
        true
    })?;
    if entries.is_empty() && events.is_empty() {
        return Ok(0);
    }
    let encoded = record::encode(id, &entries, &events)?;
    let read = |e| StoreError::io(format!("converting session {id}: reading its blobs"), e);
    // The record moves out the same large results, under the same hashes,
    // as the rows did: the blobs are there already, but a store of layout 1
    // may lack a reference; both are written when missing.
    for (hash, bytes) in encoded.blobs {
        if !trees.blobs.contains_key(hash.as_bytes()).map_err(read)? {
            trees.blobs.batch_insert(batch, hash.as_bytes(), bytes);
        }
        trees
            .blob_refs
            .batch_insert(batch, layout::blob_ref_key(&hash, id), &[][..]);
    }
    let size = encoded.bytes.len() + 32;
    trees.records.batch_insert(
        batch,
        layout::record_key(id, last, len),
        IVec::from(encoded.bytes),
    );
    Ok(size)
}

#[cfg(test)]
mod tests {
    use overseer_actors::model::EventKind;
    use overseer_actors::testing::sim::{big_result, tool_result, Sim};

    use super::*;
    use crate::store::codec;

    /// Writes `sim`'s rows as layout 4 wrote them (its writers are kept for
    /// this): the header, one transcript row per entry (a large result in
    /// its blob, referenced), one events row per checkpoint.
    fn write_layout_4(trees: &Trees, sim: &mut Sim) {
        let cp = sim.checkpoint();
        let id = sim.id();
        let mut blobs = Vec::new();
        for (idx, entry) in &cp.entries {
            let row = codec::encode_entry(&id, entry, &mut blobs).unwrap();
            trees
                .transcript
                .insert(layout::seq_key(&id, *idx), row)
                .unwrap();
        }
        for (hash, data) in blobs {
            trees.blobs.insert(hash.as_bytes(), data).unwrap();
            trees
                .blob_refs
                .insert(layout::blob_ref_key(&hash, &id), &[][..])
                .unwrap();
        }
        if let Some((first, row)) = codec::encode_events(&id, &cp.events).unwrap() {
            trees
                .events
                .insert(layout::seq_key(&id, first), row)
                .unwrap();
        }
        let header = serde_json::to_vec(&cp.header).unwrap();
        trees.sessions.insert(id.as_bytes(), header).unwrap();
    }

    /// Every session's transcript and events, read as the trees say.
    fn read(
        trees: &Trees,
        sims: &[Sim],
    ) -> Vec<(Vec<TranscriptEntry>, Vec<overseer_actors::model::Event>)> {
        sims.iter()
            .map(|sim| {
                let (len, last) = (sim.header.transcript_len, sim.header.last_event_seq);
                let transcript = trees.transcript(&sim.id(), len, last).unwrap();
                let mut events = Vec::new();
                trees
                    .committed_events(&sim.id(), 1, last, |e| {
                        events.push(e);
                        true
                    })
                    .unwrap();
                (transcript.iter().map(|e| (**e).clone()).collect(), events)
            })
            .collect()
    }

    /// Layout-4 rows of several checkpoints (a large result among them)
    /// become one record per session that reads back exactly, the old
    /// rows go, and running the migration again changes nothing.
    #[test]
    fn layout_4_rows_become_one_record_per_session_that_reads_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let old = Trees::over(&db, false, false).unwrap();
        let mut sims: Vec<Sim> = (0..5).map(|_| Sim::new("acme")).collect();
        for (n, sim) in sims.iter_mut().enumerate() {
            sim.user("hello");
            sim.emit(EventKind::TurnStarted { turn: 1 });
            write_layout_4(&old, sim);
            sim.push(tool_result(if n == 0 {
                big_result()
            } else {
                serde_json::json!({"n": n})
            }));
            sim.emit(EventKind::TurnStarted { turn: 2 });
            write_layout_4(&old, sim);
        }
        // One session with only its first event.
        let mut quiet = Sim::new("acme");
        write_layout_4(&old, &mut quiet);
        sims.push(quiet);
        let want = read(&old, &sims);
        let counts: Vec<(usize, usize)> = want.iter().map(|(t, e)| (t.len(), e.len())).collect();
        assert_eq!(counts, [(2, 3), (2, 3), (2, 3), (2, 3), (2, 3), (0, 1)]);

        run(&db, dir.path()).unwrap();
        let new = Trees::over(&db, false, true).unwrap();
        assert_eq!(read(&new, &sims), want);
        assert_eq!(new.transcript.len() + new.events.len(), 0);
        assert_eq!(new.records.len(), 6, "one per session");
        assert_eq!(new.blobs.len(), 1);
        assert_eq!(new.blob_refs.len(), 1);
        let records: Vec<(IVec, IVec)> = new.records.iter().map(Result::unwrap).collect();

        // Resumed once everything was converted: the removals again, no
        // change.
        run(&db, dir.path()).unwrap();
        let again: Vec<(IVec, IVec)> = new.records.iter().map(Result::unwrap).collect();
        assert_eq!(again, records);
        assert_eq!(read(&new, &sims), want);
    }
}
