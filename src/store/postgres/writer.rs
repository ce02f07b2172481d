//! Group commit for the PostgreSQL store: checkpoints submitted together are
//! written in one transaction, one statement each (pipelined, so a group
//! costs about two round trips and one commit whatever its size), and each
//! caller learns whether its own checkpoint landed or was fenced.
//!
//! A few writer tasks share one bounded queue; each takes whatever is queued
//! (up to a group's limit) when it is free, so groups grow exactly when the
//! database is the bottleneck. New events are announced with one
//! `pg_notify` per group, inside the transaction, so other nodes hear of them
//! only once they are committed. A group that fails for a reason other than
//! the connection is retried one checkpoint per transaction, so one bad
//! checkpoint fails alone; one that fails on the connection is retried whole
//! until the retry budget runs out (see the parent module on idempotence).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use overseer_actors::store::StoreError;
use tokio::sync::{mpsc, oneshot, Mutex, Semaphore};
use uuid::Uuid;

use super::{map_pg, map_pool, Prepared, EVENTS_CHANNEL};

/// Most checkpoints in one transaction.
const MAX_GROUP: usize = 256;
/// Most checkpoints queued or being written at once; further callers wait.
const MAX_PENDING: usize = 4096;
/// Largest `pg_notify` payload we send (PostgreSQL's limit is 8000 bytes).
const NOTIFY_CHUNK: usize = 7_000;

/// The statement of one checkpoint: the header row and one `checkpoints`
/// row (its new entries and events as one record, when it has any), with
/// its blobs, queue changes, webhook deliveries and decision rows.
/// Everything is written only if the
/// tree's lease still has this node and this epoch (`fence`) and the stored
/// header is not of a newer schema than this binary knows (`$33`: the
/// header this binary writes would drop what it does not know), the rows of
/// the decision index its decisions add included (`x`); every other row
/// follows the header row (`FROM s`). It answers how many header rows it
/// wrote (1, or 0), whether the fence held, and the schema of the header
/// it found (to tell a fenced write from a refused one). `w` is the webhook outbox:
/// one delivery per seed (an event that goes out) and enabled endpoint of
/// the tenant that wants it, in the same statement as the event; the
/// database's endpoints decide, not any node's view of them.
const CHECKPOINT_SQL: &str = "
WITH fence AS (
    SELECT 1 AS ok FROM leases WHERE root_id = $2 AND node_id = $3 AND epoch = $4 FOR SHARE
), s AS (
    INSERT INTO sessions AS x (id, root_id, parent_id, tenant, status, schema_version,
                               last_event_seq, transcript_len, header, metadata, updated_at)
    SELECT $1, $2, $5, $6, $7, $8, $9, $10, $11, $12, now() FROM fence
    ON CONFLICT (id) DO UPDATE SET
        status = EXCLUDED.status, schema_version = EXCLUDED.schema_version,
        last_event_seq = EXCLUDED.last_event_seq, transcript_len = EXCLUDED.transcript_len,
        header = EXCLUDED.header, metadata = COALESCE(EXCLUDED.metadata, x.metadata),
        updated_at = now()
    WHERE x.schema_version <= $33
    RETURNING 1
), c AS (
    INSERT INTO checkpoints (session_id, events_end, entries_end, first_event, first_entry,
                             blobs, record)
    SELECT $1, $9, $10, $14, $15, $16, $13 FROM s
    WHERE $14::bigint IS NOT NULL OR $15::bigint IS NOT NULL
    ON CONFLICT (session_id, events_end, entries_end) DO UPDATE
        SET first_event = EXCLUDED.first_event, first_entry = EXCLUDED.first_entry,
            blobs = EXCLUDED.blobs, record = EXCLUDED.record
), b AS (
    INSERT INTO blobs (hash, data)
    SELECT u.hash, u.data FROM s, unnest($17::text[], $18::text[]) AS u(hash, data)
    ON CONFLICT (hash) DO UPDATE SET hash = EXCLUDED.hash
), q AS (
    INSERT INTO queue (session_id, seq, message)
    SELECT $1, u.seq, u.message
    FROM s, unnest($19::bigint[], $20::text[]) AS u(seq, message)
    WHERE NOT (u.seq >= $21 AND u.seq < $22)
    ON CONFLICT (session_id, seq) DO UPDATE SET message = EXCLUDED.message
), d AS (
    DELETE FROM queue
    WHERE session_id = $1 AND seq >= $21 AND seq < $22 AND EXISTS (SELECT 1 FROM s)
), w AS (
    INSERT INTO webhook_deliveries (endpoint_id, id, tenant, session_id, seed,
                                    created_at_ms, next_attempt_at_ms)
    SELECT ep.id, u.id, $6, $1, u.seed, $26, $26
    FROM s, unnest($23::text[], $24::text[], $25::text[]) AS u(id, event, seed)
    JOIN webhook_endpoints ep ON ep.tenant = $6 AND NOT ep.disabled AND u.event = ANY(ep.events)
    ON CONFLICT (endpoint_id, id) DO NOTHING
), x AS (
    INSERT INTO decisions (tenant, at_ms, session_id, call_id, agent, tool, decided_by, row_json)
    SELECT $6, u.at_ms, $1, u.call_id, $27, u.tool, u.decided_by, u.row_json
    FROM s, unnest($28::bigint[], $29::text[], $30::text[], $31::text[], $32::text[])
        AS u(at_ms, call_id, tool, decided_by, row_json)
    ON CONFLICT (tenant, at_ms, session_id, call_id) DO UPDATE SET row_json = EXCLUDED.row_json
)
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM fence),
       (SELECT schema_version FROM sessions WHERE id = $1)";

/// The newest checkpoint schema this binary writes over (`$33`).
static KNOWN_SCHEMA: i32 = overseer_actors::model::SCHEMA_VERSION as i32;

/// What became of one checkpoint of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Written.
    Landed,
    /// The lease's epoch had moved on: nothing of it was written.
    Fenced,
    /// The stored header is of this newer schema: nothing was written.
    TooNew(u32),
}

/// What the writers count.
#[derive(Clone)]
struct Counters {
    commits: Arc<AtomicU64>,
    round_trips: Arc<AtomicU64>,
}

struct Job {
    prepared: Prepared,
    reply: oneshot::Sender<Result<Outcome, StoreError>>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

/// The writers' queue.
pub(super) struct Writer {
    tx: mpsc::UnboundedSender<Job>,
    slots: Arc<Semaphore>,
    commits: Arc<AtomicU64>,
}

impl Writer {
    /// Starts `writers` tasks writing through `pool`.
    pub(super) fn start(
        pool: Pool,
        writers: usize,
        retry: Duration,
        round_trips: Arc<AtomicU64>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(Mutex::new(rx));
        let commits = Arc::new(AtomicU64::new(0));
        for _ in 0..writers {
            let counters = Counters {
                commits: commits.clone(),
                round_trips: round_trips.clone(),
            };
            tokio::spawn(run(pool.clone(), rx.clone(), retry, counters));
        }
        Self {
            tx,
            slots: Arc::new(Semaphore::new(MAX_PENDING)),
            commits,
        }
    }

    /// Transactions committed so far (each holds one group of checkpoints).
    pub(super) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Writes one checkpoint with its group, and says what became of it.
    pub(super) async fn submit(
        &self,
        mut prepared: Prepared,
        node: Uuid,
    ) -> Result<Outcome, StoreError> {
        prepared.node = Some(node);
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Io("the store is closed".into()))?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job {
                prepared,
                reply,
                _slot: slot,
            })
            .map_err(|_| StoreError::Io("the store writer stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Io("the store writer stopped before confirming".into()))?
    }
}

async fn run(
    pool: Pool,
    rx: Arc<Mutex<mpsc::UnboundedReceiver<Job>>>,
    retry: Duration,
    counters: Counters,
) {
    loop {
        let mut group = Vec::new();
        {
            let mut rx = rx.lock().await;
            match rx.recv().await {
                Some(job) => group.push(job),
                None => return,
            }
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
        }
        let outcomes = write_group(&pool, &group, retry, &counters).await;
        for (job, outcome) in group.into_iter().zip(outcomes) {
            let _ = job.reply.send(outcome);
        }
    }
}

/// Writes a group, retrying across transient failures; one outcome per job.
async fn write_group(
    pool: &Pool,
    group: &[Job],
    retry: Duration,
    counters: &Counters,
) -> Vec<Result<Outcome, StoreError>> {
    let jobs: Vec<&Prepared> = group.iter().map(|j| &j.prepared).collect();
    match with_retry(retry, || transaction(pool, &jobs, counters)).await {
        Ok(landed) => landed.into_iter().map(Ok).collect(),
        Err(e) if jobs.len() > 1 && !matches!(e, StoreError::Unavailable(_)) => {
            // One checkpoint the database refused spoils the transaction:
            // write each alone, so only it fails.
            let mut out = Vec::with_capacity(jobs.len());
            for job in &jobs {
                let one = [*job];
                out.push(
                    with_retry(retry, || transaction(pool, &one, counters))
                        .await
                        .map(|v| v.first().copied().unwrap_or(Outcome::Fenced)),
                );
            }
            out
        }
        Err(e) => jobs.iter().map(|_| Err(e.clone())).collect(),
    }
}

async fn with_retry<T, F, Fut>(budget: Duration, f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let started = Instant::now();
    let result = super::retrying(budget, f).await;
    if let Err(StoreError::Unavailable(e)) = &result {
        tracing::warn!(
            waited_ms = started.elapsed().as_millis() as u64,
            "giving up on a group of checkpoints: {e}"
        );
    }
    result
}

/// One transaction: every checkpoint of the group, then the announcement of
/// their events, then the commit. Returns, per checkpoint, whether it landed.
async fn transaction(
    pool: &Pool,
    jobs: &[&Prepared],
    counters: &Counters,
) -> Result<Vec<Outcome>, StoreError> {
    let mut client = pool.get().await.map_err(map_pool)?;
    let statement = client
        .prepare_cached(CHECKPOINT_SQL)
        .await
        .map_err(map_pg)?;
    let tx = client.transaction().await.map_err(map_pg)?;
    // Polled together, so the statements are pipelined on the connection.
    let results = futures::future::join_all(jobs.iter().map(|p| {
        let params = p.params();
        let tx = &tx;
        let statement = &statement;
        async move { tx.query_one(statement, &params).await }
    }))
    .await;
    let mut landed = Vec::with_capacity(jobs.len());
    for r in results {
        let row = r.map_err(map_pg)?;
        let (wrote, fence, found): (i64, i64, Option<i32>) = (row.get(0), row.get(1), row.get(2));
        landed.push(match (wrote, fence, found) {
            (1.., _, _) => Outcome::Landed,
            (_, 1.., Some(v)) if v > KNOWN_SCHEMA => {
                Outcome::TooNew(u32::try_from(v).unwrap_or(u32::MAX))
            }
            _ => Outcome::Fenced,
        });
    }
    let mut payload = String::new();
    let mut notifies = Vec::new();
    for (p, ok) in jobs.iter().zip(&landed) {
        if let (Outcome::Landed, Some((first, last))) = (*ok, p.new_events) {
            if payload.len() > NOTIFY_CHUNK {
                notifies.push(std::mem::take(&mut payload));
            }
            if !payload.is_empty() {
                payload.push(',');
            }
            payload.push_str(&format!("{} {first} {last}", p.id));
        }
    }
    if !payload.is_empty() {
        notifies.push(payload);
    }
    for chunk in &notifies {
        tx.execute("SELECT pg_notify($1, $2)", &[&EVENTS_CHANNEL, chunk])
            .await
            .map_err(map_pg)?;
    }
    tx.commit().await.map_err(map_pg)?;
    counters.commits.fetch_add(1, Ordering::Relaxed);
    // BEGIN, the pipelined statements, each announcement, COMMIT.
    counters
        .round_trips
        .fetch_add(3 + notifies.len() as u64, Ordering::Relaxed);
    Ok(landed)
}

impl Prepared {
    fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        vec![
            &self.id,
            &self.root,
            &self.node,
            &self.epoch,
            &self.parent,
            &self.tenant,
            &self.status,
            &self.schema_version,
            &self.last_event_seq,
            &self.transcript_len,
            &self.header,
            &self.metadata,
            &self.record,
            &self.first_event,
            &self.first_entry,
            &self.record_blobs,
            &self.blob_hashes,
            &self.blob_data,
            &self.queue_seqs,
            &self.queued,
            &self.dequeue_from,
            &self.dequeue_to,
            &self.hook_ids,
            &self.hook_events,
            &self.hook_seeds,
            &self.hook_now_ms,
            &self.agent,
            &self.decision_at,
            &self.decision_calls,
            &self.decision_tools,
            &self.decision_by,
            &self.decision_rows,
            &KNOWN_SCHEMA,
        ]
    }
}
