//! The PostgreSQL schema of the cluster store, as embedded, versioned
//! migrations: each is applied once, in order, in its own transaction, under
//! an advisory lock so that nodes starting together never race; the versions
//! applied are recorded in `overseer_migrations`. A database migrated by a
//! newer binary (a version this one does not know) is refused at open, never
//! written.
//!
//! Tables (JSON is stored as `text`, exactly as serde wrote it; records as
//! `bytea`):
//!
//! | table | row |
//! |---|---|
//! | `sessions` | one per session: the header (the commit record of its checkpoints), the columns queries need (`root_id`, `parent_id`, `tenant`, `status`, `schema_version`, `last_event_seq`, `transcript_len`, `config_hash`: the configuration the header names, migration 7), the metadata |
//! | `configs` | sha256 hex → an agent configuration's JSON, once per distinct configuration, deleted by the purge of the last session naming it (migration 7) |
//! | `checkpoints` | `(session_id, events_end, entries_end)` → one checkpoint's new transcript entries and events as one record (`crate::store::record`, MessagePack); `first_event`/`first_entry` say which it holds, `blobs` the blobs its entries name (indexed: a purge deletes a blob no row names) (migration 6) |
//! | `queue` | `(session_id, seq)` → a message queued behind a running turn |
//! | `blobs` | sha256 hex → tool result over 64 KiB |
//! | `decisions` | `(tenant, at_ms, session_id, call_id)` → a row of the decision index (migration 4) |
//! | `leases` | `root_id` → the node owning the tree and its fencing `epoch` |
//! | `nodes` | node id → advertised URL, heartbeat time |
//! | `overseer_meta` | `node_secret`: the key of node-to-node credentials |
//! | `webhook_endpoints` | a tenant's webhook endpoint: the columns the checkpoint's join needs (`tenant`, `events`, `disabled`) and the endpoint (migration 5) |
//! | `webhook_deliveries` | `(endpoint_id, id)` → one webhook message to one endpoint: inserted by the checkpoint that records its event, then its attempts, status and the node's claim (`lease_node`, `lease_until_ms`) (migration 5) |
//!
//! Migration 6 also moves data: layout 2's `transcript` and `events` rows
//! (one row per entry and per event) become one `checkpoints` row per
//! session, encoded here in Rust inside the migration's transaction, and
//! the two tables are dropped; a migration cut short leaves the database
//! as it was.
//!
//! It owns DDL and that one move; the statements that read and write these
//! tables are in the sibling modules.

use std::sync::Arc;

use deadpool_postgres::Pool;
use overseer_actors::model::{Event, SessionId, TranscriptEntry};
use uuid::Uuid;

use super::codec;
use super::{map_pg, PgOpenError};
use crate::store::record;

/// One migration: its version, its SQL (several statements) and what it
/// does in Rust after the SQL, in the same transaction.
struct Migration {
    version: i32,
    sql: &'static str,
    then: Option<Step>,
}

/// Data a migration moves in Rust (what SQL alone cannot encode).
#[derive(Clone, Copy)]
enum Step {
    /// Migration 6: layout 2's rows into one record per session.
    RowsToRecords,
}

/// Every migration this binary knows, oldest first. Append only: a
/// migration, once released, is never edited.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: r#"
CREATE TABLE overseer_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO overseer_meta (key, value)
    VALUES ('node_secret', replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

CREATE TABLE nodes (
    id           uuid PRIMARY KEY,
    url          text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sessions (
    id             uuid PRIMARY KEY,
    root_id        uuid NOT NULL,
    parent_id      uuid,
    tenant         text NOT NULL,
    status         text NOT NULL,
    schema_version integer NOT NULL,
    last_event_seq bigint NOT NULL,
    transcript_len bigint NOT NULL,
    header         text NOT NULL,
    metadata       text,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sessions_by_tenant ON sessions (tenant, id);
CREATE INDEX sessions_by_root ON sessions (root_id);
CREATE INDEX sessions_active ON sessions (status)
    WHERE status IN ('running', 'awaiting_approval');

CREATE TABLE transcript (
    session_id  uuid   NOT NULL,
    idx         bigint NOT NULL,
    entry       text   NOT NULL,
    result_blob text,
    PRIMARY KEY (session_id, idx)
);

CREATE TABLE events (
    session_id uuid   NOT NULL,
    seq        bigint NOT NULL,
    event      text   NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE queue (
    session_id uuid   NOT NULL,
    seq        bigint NOT NULL,
    message    text   NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE blobs (
    hash text PRIMARY KEY,
    data text NOT NULL
);

CREATE TABLE leases (
    root_id    uuid PRIMARY KEY,
    node_id    uuid,
    epoch      bigint NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX leases_by_node ON leases (node_id);
"#,
        then: None,
    },
    // Retention: a purge asks whether any transcript row still names a
    // blob before deleting it.
    Migration {
        version: 2,
        sql: r#"
CREATE INDEX transcript_by_blob ON transcript (result_blob)
    WHERE result_blob IS NOT NULL;
"#,
        then: None,
    },
    // Boot recovery pages through the active sessions by id
    // (`list_by_status`): in id order, a page costs its own rows instead of
    // a sort of every active session.
    Migration {
        version: 3,
        sql: r#"
CREATE INDEX sessions_active_by_id ON sessions (id)
    WHERE status IN ('running', 'awaiting_approval');
"#,
        then: None,
    },
    // The decision index (`GET /v1/decisions`): one row per recorded
    // decision, written by the checkpoint statement that records it, paged
    // per tenant newest first by its primary key; purged with its session.
    // `call_id` compares bytewise ("C"), as the other stores order it.
    Migration {
        version: 4,
        sql: r#"
CREATE TABLE decisions (
    tenant     text   NOT NULL,
    at_ms      bigint NOT NULL,
    session_id uuid   NOT NULL,
    call_id    text   COLLATE "C" NOT NULL,
    agent      text   NOT NULL,
    tool       text   NOT NULL,
    decided_by text,
    row_json   text   NOT NULL,
    PRIMARY KEY (tenant, at_ms, session_id, call_id)
);
CREATE INDEX decisions_by_session ON decisions (session_id);
"#,
        then: None,
    },
    // Webhooks: endpoints, and the outbox that is also the delivery
    // log. A checkpoint inserts its events' deliveries in its own statement
    // (joined with the tenant's enabled endpoints); nodes claim due ones
    // with `FOR UPDATE SKIP LOCKED` and a lease.
    Migration {
        version: 5,
        sql: r#"
CREATE TABLE webhook_endpoints (
    id       uuid PRIMARY KEY,
    tenant   text NOT NULL,
    events   text[] NOT NULL,
    disabled boolean NOT NULL DEFAULT false,
    endpoint text NOT NULL
);
CREATE INDEX webhook_endpoints_by_tenant ON webhook_endpoints (tenant) WHERE NOT disabled;

CREATE TABLE webhook_deliveries (
    endpoint_id        uuid    NOT NULL,
    id                 text    NOT NULL,
    tenant             text    NOT NULL,
    session_id         uuid    NOT NULL,
    seed               text    NOT NULL,
    status             text    NOT NULL DEFAULT 'pending',
    attempts           integer NOT NULL DEFAULT 0,
    created_at_ms      bigint  NOT NULL,
    next_attempt_at_ms bigint  NOT NULL,
    last_attempt_at_ms bigint,
    last_status_code   integer,
    last_error         text,
    delivered_at_ms    bigint,
    body               text,
    lease_node         uuid,
    lease_until_ms     bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint_id, id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at_ms)
    WHERE status = 'pending';
"#,
        then: None,
    },
    // Layout 3 (issue 28): one row per checkpoint. A checkpoint's new
    // transcript entries and events are one record, keyed by what its
    // header counts after it (`last_event_seq`, `transcript_len`: a
    // checkpoint with anything new moves one of them on); reads find a
    // range by `first_*` and `*_end`. The layout-2 rows are moved into one
    // record per session by `Step::RowsToRecords`, then dropped.
    Migration {
        version: 6,
        sql: r#"
CREATE TABLE checkpoints (
    session_id  uuid   NOT NULL,
    events_end  bigint NOT NULL,
    entries_end bigint NOT NULL,
    first_event bigint,
    first_entry bigint,
    blobs       text[],
    record      bytea  NOT NULL,
    PRIMARY KEY (session_id, events_end, entries_end)
);
CREATE INDEX checkpoints_by_blob ON checkpoints USING gin (blobs)
    WHERE blobs IS NOT NULL;
"#,
        then: Some(Step::RowsToRecords),
    },
    // Interned agent configurations (issue 28): each distinct configuration
    // once, by content hash; a header names its configuration by hash
    // (`store::configs`), in its text and in `sessions.config_hash`, which
    // reads join and a purge asks about (indexed: whether any session still
    // names a configuration is one probe). Headers written before keep
    // their configuration inside and a NULL hash: read as they are.
    Migration {
        version: 7,
        sql: r#"
CREATE TABLE configs (
    hash   text PRIMARY KEY,
    config text NOT NULL
);
ALTER TABLE sessions ADD COLUMN config_hash text;
CREATE INDEX sessions_by_config ON sessions (config_hash) WHERE config_hash IS NOT NULL;
"#,
        then: None,
    },
    // Header updates that stay on their page (HOT): an update that changes
    // no indexed column and finds room on the row's page writes no index
    // entry. The active-session indexes named `status` (in their predicate),
    // so every change of status (a checkpoint in two) wrote a new entry in
    // each of the table's indexes. They now name `active`, computed from the
    // status, which a session keeps from its first checkpoint to its last
    // but one; the index by status alone had no reader left. Pages are
    // filled to 60 %, leaving room on each for the next versions of its rows.
    // Nodes of the previous release keep working on this schema: they write
    // `status` as before, and their reads by `status` are still correct.
    Migration {
        version: 8,
        sql: r#"
ALTER TABLE sessions ADD COLUMN active boolean NOT NULL
    GENERATED ALWAYS AS (status IN ('running', 'awaiting_approval')) STORED;
DROP INDEX sessions_active;
DROP INDEX sessions_active_by_id;
CREATE INDEX sessions_active_by_id ON sessions (id) WHERE active;
ALTER TABLE sessions SET (fillfactor = 60);
"#,
        then: None,
    },
];

/// The newest schema version this binary knows.
pub(super) fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// An arbitrary constant: the advisory lock migrations hold.
const MIGRATION_LOCK: i64 = 0x6f76_6572_7365_6572; // "overseer"

/// Brings the database to [`latest`], or refuses one that is newer.
pub(super) async fn migrate(pool: &Pool) -> Result<(), PgOpenError> {
    let mut client = pool
        .get()
        .await
        .map_err(|e| PgOpenError::Migration(e.to_string()))?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| PgOpenError::Migration(map_pg(e).to_string()))?;
    let run = |e: tokio_postgres::Error| PgOpenError::Migration(map_pg(e).to_string());
    // Held to the end of this transaction: a second node starting now waits
    // here and then finds everything applied.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(run)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS overseer_migrations (
             version    integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(run)?;
    let applied: Option<i32> = tx
        .query_one("SELECT max(version) FROM overseer_migrations", &[])
        .await
        .map_err(run)?
        .get(0);
    let applied = applied.unwrap_or(0);
    if applied > latest() {
        return Err(PgOpenError::SchemaTooNew {
            found: applied,
            supported: latest(),
        });
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > applied) {
        tx.batch_execute(m.sql).await.map_err(run)?;
        match m.then {
            Some(Step::RowsToRecords) => rows_to_records(&tx).await?,
            None => {}
        }
        tx.execute(
            "INSERT INTO overseer_migrations (version) VALUES ($1)",
            &[&m.version],
        )
        .await
        .map_err(run)?;
    }
    tx.commit().await.map_err(run)?;
    Ok(())
}

/// Sessions moved per round trip by [`rows_to_records`].
const MOVE_PAGE: i64 = 200;

/// Migration 6's move: every session's layout-2 transcript and event rows
/// (as the layout-2 readers saw them: bounded by the header's counts),
/// encoded as one record keyed by the header's counts, a page of sessions
/// at a time; then the old tables are dropped. Large results keep their
/// blobs (the record names the same content-addressed hashes).
async fn rows_to_records(tx: &deadpool_postgres::Transaction<'_>) -> Result<(), PgOpenError> {
    let fail = |e: overseer_actors::store::StoreError| {
        PgOpenError::Migration(format!("moving layout-2 rows into records: {e}"))
    };
    let run = |e: tokio_postgres::Error| PgOpenError::Migration(map_pg(e).to_string());
    let mut after: Option<Uuid> = None;
    loop {
        let sessions = tx
            .query(
                "SELECT s.id, s.last_event_seq, s.transcript_len,
                        ARRAY(SELECT t.idx FROM transcript t
                              WHERE t.session_id = s.id AND t.idx < s.transcript_len ORDER BY t.idx),
                        ARRAY(SELECT t.entry FROM transcript t
                              WHERE t.session_id = s.id AND t.idx < s.transcript_len ORDER BY t.idx),
                        ARRAY(SELECT b.data FROM transcript t LEFT JOIN blobs b ON b.hash = t.result_blob
                              WHERE t.session_id = s.id AND t.idx < s.transcript_len ORDER BY t.idx),
                        ARRAY(SELECT e.event FROM events e
                              WHERE e.session_id = s.id AND e.seq <= s.last_event_seq ORDER BY e.seq)
                 FROM sessions s WHERE ($1::uuid IS NULL OR s.id > $1)
                 ORDER BY s.id LIMIT $2",
                &[&after, &MOVE_PAGE],
            )
            .await
            .map_err(run)?;
        let Some(last) = sessions.last() else {
            break;
        };
        after = Some(last.get(0));
        let mut ids = Vec::new();
        let mut events_end = Vec::new();
        let mut entries_end = Vec::new();
        let mut first_event: Vec<Option<i64>> = Vec::new();
        let mut first_entry: Vec<Option<i64>> = Vec::new();
        let mut blob_lists: Vec<Option<String>> = Vec::new();
        let mut records: Vec<Vec<u8>> = Vec::new();
        for row in &sessions {
            let id = SessionId(row.get(0));
            let idx: Vec<i64> = row.get(3);
            let stored: Vec<String> = row.get(4);
            let data: Vec<Option<String>> = row.get(5);
            let mut entries: Vec<(u64, Arc<TranscriptEntry>)> = Vec::with_capacity(idx.len());
            for ((n, entry), blob) in idx.iter().zip(&stored).zip(data) {
                let n = u64::try_from(*n).unwrap_or(0);
                let entry = codec::decode_entry(&id, n, entry.as_bytes(), |_| {
                    Ok(blob.map(String::into_bytes))
                })
                .map_err(fail)?;
                entries.push((n, entry));
            }
            let mut events: Vec<Event> = Vec::new();
            for text in row.get::<_, Vec<String>>(6) {
                events.push(serde_json::from_str(&text).map_err(|e| {
                    PgOpenError::Migration(format!("session {id}: unreadable event: {e}"))
                })?);
            }
            if entries.is_empty() && events.is_empty() {
                continue;
            }
            let encoded = record::encode(&id, &entries, &events).map_err(fail)?;
            ids.push(id.0);
            events_end.push(row.get::<_, i64>(1));
            entries_end.push(row.get::<_, i64>(2));
            first_event.push(
                events
                    .first()
                    .map(|e| i64::try_from(e.seq).unwrap_or(i64::MAX)),
            );
            first_entry.push(
                entries
                    .first()
                    .map(|(i, _)| i64::try_from(*i).unwrap_or(i64::MAX)),
            );
            let hashes: Vec<&str> = encoded.blobs.iter().map(|(h, _)| h.as_str()).collect();
            // A text array travels as its literal: `{h1,h2}` (hex needs no quoting).
            blob_lists.push((!hashes.is_empty()).then(|| format!("{{{}}}", hashes.join(","))));
            records.push(encoded.bytes);
        }
        tx.execute(
            "INSERT INTO checkpoints (session_id, events_end, entries_end, first_event,
                                      first_entry, blobs, record)
             SELECT u.id, u.ev, u.en, u.fe, u.fi, u.bl::text[], u.rec
             FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[],
                         $6::text[], $7::bytea[]) AS u(id, ev, en, fe, fi, bl, rec)",
            &[
                &ids,
                &events_end,
                &entries_end,
                &first_event,
                &first_entry,
                &blob_lists,
                &records,
            ],
        )
        .await
        .map_err(run)?;
    }
    tx.batch_execute("DROP TABLE transcript; DROP TABLE events;")
        .await
        .map_err(run)?;
    Ok(())
}
