//! The PostgreSQL schema of the cluster store, as embedded, versioned
//! migrations: each is applied once, in order, in its own transaction, under
//! an advisory lock so that nodes starting together never race; the versions
//! applied are recorded in `overseer_migrations`. A database migrated by a
//! newer binary (a version this one does not know) is refused at open, never
//! written.
//!
//! Tables (all JSON is stored as `text`, exactly as serde wrote it):
//!
//! | table | row |
//! |---|---|
//! | `sessions` | one per session: the header (the commit record of its checkpoints), the columns queries need (`root_id`, `parent_id`, `tenant`, `status`, `schema_version`, `last_event_seq`, `transcript_len`), the metadata |
//! | `transcript` | `(session_id, idx)` → entry envelope; `result_blob` names a blob (indexed: a purge deletes a blob no row names) |
//! | `events` | `(session_id, seq)` → event |
//! | `queue` | `(session_id, seq)` → a message queued behind a running turn |
//! | `blobs` | sha256 hex → tool result over 64 KiB |
//! | `decisions` | `(tenant, at_ms, session_id, call_id)` → a row of the decision index (migration 4) |
//! | `leases` | `root_id` → the node owning the tree and its fencing `epoch` |
//! | `nodes` | node id → advertised URL, heartbeat time |
//! | `overseer_meta` | `node_secret`: the key of node-to-node credentials |
//! | `webhook_endpoints` | a tenant's webhook endpoint: the columns the checkpoint's join needs (`tenant`, `events`, `disabled`) and the endpoint (migration 5) |
//! | `webhook_deliveries` | `(endpoint_id, id)` → one webhook message to one endpoint: inserted by the checkpoint that records its event, then its attempts, status and the node's claim (`lease_node`, `lease_until_ms`) (migration 5) |
//!
//! It owns DDL only; the statements that read and write these tables are in
//! the parent module.

use deadpool_postgres::Pool;

use super::{map_pg, PgOpenError};

/// One migration: its version and its SQL (several statements).
struct Migration {
    version: i32,
    sql: &'static str,
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
    },
    // Retention: a purge asks whether any transcript row still names a
    // blob before deleting it.
    Migration {
        version: 2,
        sql: r#"
CREATE INDEX transcript_by_blob ON transcript (result_blob)
    WHERE result_blob IS NOT NULL;
"#,
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
