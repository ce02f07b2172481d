//! `overseer store copy` into PostgreSQL: one session read from another
//! store written whole (its header, its transcript and every event as one
//! record, its queue and decision-index rows), in one transaction, unless
//! a session with its id is already here.
//!
//! It owns the writing side only; reading the source and the report are
//! `crate::store::copy`'s.

use overseer_actors::model::Event;
use overseer_actors::store::{Checkpoint, StoreError, StoredSession};

use super::{map_pg, prepare::prepare, PgStore};

impl PgStore {
    /// Writes one session read from another store, with all its events, as
    /// it is, unless a session with its id is already here (then nothing is
    /// written and `false` is returned): `overseer store copy`. No lease is
    /// taken: an active session is claimed by the first node that looks.
    pub async fn import(
        &self,
        stored: &StoredSession,
        events: &[Event],
    ) -> Result<bool, StoreError> {
        let checkpoint = Checkpoint {
            header: stored.header.clone(),
            entries: stored
                .transcript
                .iter()
                .enumerate()
                .map(|(i, e)| (i as u64, e.clone()))
                .collect(),
            events: events.to_vec().into(),
            metadata: (!stored.metadata.is_null()).then(|| stored.metadata.clone()),
            queued: (stored.header.queue.head..)
                .zip(stored.inbox.iter().cloned())
                .collect(),
            dequeued: 0..0,
        };
        let prepared = prepare(&checkpoint, None)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(map_pg)?;
        let inserted = tx
            .execute(
                "INSERT INTO sessions (id, root_id, parent_id, tenant, status, schema_version,
                                       last_event_seq, transcript_len, header, metadata,
                                       config_hash)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 ON CONFLICT (id) DO NOTHING",
                &[
                    &prepared.id,
                    &prepared.root,
                    &prepared.parent,
                    &prepared.tenant,
                    &prepared.status,
                    &prepared.schema_version,
                    &prepared.last_event_seq,
                    &prepared.transcript_len,
                    &prepared.header,
                    &prepared.metadata,
                    &prepared.config_hash,
                ],
            )
            .await
            .map_err(map_pg)?;
        if inserted == 0 {
            return Ok(false);
        }
        // The configuration the header names, locked as a checkpoint locks
        // it (see `writer`), so a concurrent purge cannot delete it under us.
        tx.execute(super::writer::LOCK_CONFIG_SHARED, &[&prepared.config_hash])
            .await
            .map_err(map_pg)?;
        tx.execute(
            "INSERT INTO configs (hash, config) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING",
            &[&prepared.config_hash, &prepared.config],
        )
        .await
        .map_err(map_pg)?;
        tx.execute(
            "INSERT INTO blobs (hash, data) SELECT * FROM unnest($1::text[], $2::text[])
             ON CONFLICT (hash) DO UPDATE SET hash = EXCLUDED.hash",
            &[&prepared.blob_hashes, &prepared.blob_data],
        )
        .await
        .map_err(map_pg)?;
        // The whole copied log as one record, keyed as the checkpoint that
        // wrote its header would be.
        if prepared.first_event.is_some() || prepared.first_entry.is_some() {
            tx.execute(
                "INSERT INTO checkpoints (session_id, events_end, entries_end, first_event,
                                          first_entry, blobs, record)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &prepared.id,
                    &prepared.last_event_seq,
                    &prepared.transcript_len,
                    &prepared.first_event,
                    &prepared.first_entry,
                    &prepared.record_blobs,
                    &prepared.record,
                ],
            )
            .await
            .map_err(map_pg)?;
        }
        tx.execute(
            "INSERT INTO queue (session_id, seq, message)
             SELECT $1, * FROM unnest($2::bigint[], $3::text[])",
            &[&prepared.id, &prepared.queue_seqs, &prepared.queued],
        )
        .await
        .map_err(map_pg)?;
        // The copied log's decisions, as the checkpoints that recorded them
        // would have indexed them.
        tx.execute(
            "INSERT INTO decisions (tenant, at_ms, session_id, call_id, agent, tool, decided_by, row_json)
             SELECT $1, u.at_ms, $2, u.call_id, $3, u.tool, u.decided_by, u.row_json
             FROM unnest($4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[])
                 AS u(at_ms, call_id, tool, decided_by, row_json)
             ON CONFLICT DO NOTHING",
            &[
                &prepared.tenant,
                &prepared.id,
                &prepared.agent,
                &prepared.decision_at,
                &prepared.decision_calls,
                &prepared.decision_tools,
                &prepared.decision_by,
                &prepared.decision_rows,
            ],
        )
        .await
        .map_err(map_pg)?;
        tx.commit().await.map_err(map_pg)?;
        Ok(true)
    }
}
