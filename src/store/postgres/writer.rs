//! Group commit for the PostgreSQL store: checkpoints submitted together are
//! written in one transaction by one statement (a multi-row write per kind
//! of row, from arrays; a second statement only for a session with two
//! checkpoints in the group, pipelined), so a group costs about three round
//! trips and one commit whatever its size, and each caller learns whether
//! its own checkpoint landed, was fenced or was refused.
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

/// A configuration's advisory lock, as SQL arguments of
/// `pg_advisory_xact_lock[_shared]`: one class for all configurations and
/// the first 32 bits of the hash `$hash` names (two hashes sharing them only
/// wait for each other). Every statement that locks a configuration names
/// its lock through this one place.
macro_rules! config_lock {
    ($hash:literal) => {
        concat!("1870029670, ('x' || left(", $hash, ", 8))::bit(32)::int")
    };
}

/// The statement of a group of checkpoints (of distinct sessions): one
/// multi-row write per kind, from arrays (`unnest`), whatever the group's
/// size. Per checkpoint (`i`, one element each): the header row and, when
/// it has anything new, one `checkpoints` row (its entries and events as
/// one record); then its blobs, queue changes, webhook deliveries and
/// decision rows, each kind's rows for the whole group in one array tagged
/// with the checkpoint's ordinal. A checkpoint is written only if its
/// tree's lease still has this node and its epoch (`fence`, `FOR SHARE`;
/// each distinct tree's lease looked up by its key, `LATERAL`, so the
/// planner cannot choose to read every lease the node holds, which it did
/// for large groups whenever its statistics lagged behind the node's
/// leases) and the stored header is not of a newer schema than this binary
/// knows (`$21`: the header this binary writes would drop what it does not
/// know); every other row follows its header row's write (`w`). It answers,
/// per checkpoint in order, whether its header was written, whether the
/// fence held, and the schema of the header it found (to tell a fenced
/// write from a refused one). The webhook deliveries (`h`) join the
/// tenant's enabled endpoints in the database: no node's view decides.
///
/// The configuration a header names (`g`, see `store::configs`) is
/// inserted only by a checkpoint whose session did not name it before the
/// statement (`old`: every part of one statement sees the database as it
/// was before it): a first checkpoint, a change of configuration, a header
/// from before migration 7. A purge deletes a configuration no session
/// names (`purge`), so such a checkpoint must not lose its configuration to
/// a purge running at the same time. It takes the configuration's advisory
/// lock, shared (`gk`, in hash order, before `g` inserts anything: `g`'s
/// one-time filter reads all of `gk` first), and a purge takes the same
/// lock exclusively ([`LOCK_CONFIGS`]) before it asks whether any session
/// names the configuration. So either the purge waits for this commit and
/// then sees the new session's row (read committed: its next statement's
/// snapshot), or it committed first and this checkpoint, having waited,
/// finds the row gone and inserts it anew (`ON CONFLICT DO NOTHING` skips
/// only a row that is there). Checkpoints share the lock with each other:
/// a burst of new sessions of one configuration does not commit one group
/// at a time, as it did while the lock was the row's own (an upsert).
/// Any other checkpoint's session already names the configuration in a
/// committed row, which keeps it from every purge's `NOT EXISTS` but that
/// session's own. The last column says which configuration a session left
/// (its row before the statement): see [`DELETE_LEFT_CONFIGS`].
const GROUP_SQL: &str = concat!(
    "
WITH i AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::bigint[], $4::uuid[], $5::text[],
                         $6::text[], $7::integer[], $8::bigint[], $9::bigint[], $10::text[],
                         $11::text[], $12::bytea[], $13::bigint[], $14::bigint[], $15::text[],
                         $16::bigint[], $17::bigint[], $18::bigint[], $19::text[], $38::text[],
                         $39::text[])
        WITH ORDINALITY AS u(id, root, epoch, parent, tenant, status, sv, les, tl, header,
                             metadata, record, fev, fen, rblobs, dq_from, dq_to, now_ms, agent,
                             chash, config, ord)
), fence AS (
    SELECT l.root_id, l.epoch
    FROM (SELECT DISTINCT root, epoch FROM i ORDER BY root) r,
    LATERAL (SELECT l.root_id, l.epoch FROM leases l
             WHERE l.root_id = r.root AND l.epoch = r.epoch AND l.node_id = $20
             FOR SHARE) l
), s AS (
    INSERT INTO sessions AS x (id, root_id, parent_id, tenant, status, schema_version,
                               last_event_seq, transcript_len, header, config_hash, metadata,
                               updated_at)
    SELECT i.id, i.root, i.parent, i.tenant, i.status, i.sv, i.les, i.tl, i.header, i.chash,
           i.metadata, now()
    FROM i JOIN fence f ON f.root_id = i.root AND f.epoch = i.epoch
    ON CONFLICT (id) DO UPDATE SET
        status = EXCLUDED.status, schema_version = EXCLUDED.schema_version,
        last_event_seq = EXCLUDED.last_event_seq, transcript_len = EXCLUDED.transcript_len,
        header = EXCLUDED.header, config_hash = EXCLUDED.config_hash,
        metadata = COALESCE(EXCLUDED.metadata, x.metadata), updated_at = now()
    WHERE x.schema_version <= $21
    RETURNING x.id
), w AS (
    SELECT i.* FROM i JOIN s ON s.id = i.id
), c AS (
    INSERT INTO checkpoints (session_id, events_end, entries_end, first_event, first_entry,
                             blobs, record)
    SELECT w.id, w.les, w.tl, w.fev, w.fen, w.rblobs::text[], w.record FROM w
    WHERE w.fev IS NOT NULL OR w.fen IS NOT NULL
    ON CONFLICT (session_id, events_end, entries_end) DO UPDATE
        SET first_event = EXCLUDED.first_event, first_entry = EXCLUDED.first_entry,
            blobs = EXCLUDED.blobs, record = EXCLUDED.record
), gt AS (
    SELECT DISTINCT ON (w.chash) w.chash, w.config
    FROM w LEFT JOIN sessions old ON old.id = w.id
    WHERE old.config_hash IS DISTINCT FROM w.chash
    ORDER BY w.chash
), gk AS (
    SELECT pg_advisory_xact_lock_shared(",
    config_lock!("gt.chash"),
    ")
    FROM gt
), g AS (
    INSERT INTO configs (hash, config)
    SELECT gt.chash, gt.config FROM gt
    WHERE (SELECT count(*) FROM gk) >= 0
    ON CONFLICT (hash) DO NOTHING
), b AS (
    INSERT INTO blobs (hash, data)
    SELECT DISTINCT ON (u.hash) u.hash, u.data
    FROM unnest($22::bigint[], $23::text[], $24::text[]) AS u(ord, hash, data)
    JOIN w ON w.ord = u.ord
    ORDER BY u.hash
    ON CONFLICT (hash) DO UPDATE SET hash = EXCLUDED.hash
), q AS (
    INSERT INTO queue (session_id, seq, message)
    SELECT w.id, u.seq, u.message
    FROM unnest($25::bigint[], $26::bigint[], $27::text[]) AS u(ord, seq, message)
    JOIN w ON w.ord = u.ord
    WHERE NOT (u.seq >= w.dq_from AND u.seq < w.dq_to)
    ON CONFLICT (session_id, seq) DO UPDATE SET message = EXCLUDED.message
), d AS (
    DELETE FROM queue USING w
    WHERE queue.session_id = w.id AND queue.seq >= w.dq_from AND queue.seq < w.dq_to
), h AS (
    INSERT INTO webhook_deliveries (endpoint_id, id, tenant, session_id, seed,
                                    created_at_ms, next_attempt_at_ms)
    SELECT ep.id, u.id, w.tenant, w.id, u.seed, w.now_ms, w.now_ms
    FROM unnest($28::bigint[], $29::text[], $30::text[], $31::text[]) AS u(ord, id, event, seed)
    JOIN w ON w.ord = u.ord
    JOIN webhook_endpoints ep
      ON ep.tenant = w.tenant AND NOT ep.disabled AND u.event = ANY(ep.events)
    ON CONFLICT (endpoint_id, id) DO NOTHING
), x AS (
    INSERT INTO decisions (tenant, at_ms, session_id, call_id, agent, tool, decided_by, row_json)
    SELECT w.tenant, u.at_ms, w.id, u.call_id, w.agent, u.tool, u.decided_by, u.row_json
    FROM unnest($32::bigint[], $33::bigint[], $34::text[], $35::text[], $36::text[],
                $37::text[]) AS u(ord, at_ms, call_id, tool, decided_by, row_json)
    JOIN w ON w.ord = u.ord
    ON CONFLICT (tenant, at_ms, session_id, call_id) DO UPDATE SET row_json = EXCLUDED.row_json
)
SELECT EXISTS (SELECT 1 FROM s WHERE s.id = i.id),
       EXISTS (SELECT 1 FROM fence f WHERE f.root_id = i.root AND f.epoch = i.epoch),
       (SELECT x.schema_version FROM sessions x WHERE x.id = i.id),
       (SELECT x.config_hash FROM sessions x
        WHERE x.id = i.id AND x.config_hash IS DISTINCT FROM i.chash)
FROM i ORDER BY i.ord"
);

/// Takes configuration `$1`'s lock shared, as [`GROUP_SQL`] does for a
/// configuration a session takes up: for a copy's single writes.
pub(super) const LOCK_CONFIG_SHARED: &str = concat!(
    "SELECT pg_advisory_xact_lock_shared(",
    config_lock!("$1"),
    ")"
);

/// Takes the configurations `$1` (hashes) exclusively, in hash order, for
/// the transaction: once granted, every checkpoint that took one up before
/// has committed, and any that comes after waits for this transaction (see
/// [`GROUP_SQL`]). Then a statement asking whether a session names one
/// sees every such session.
pub(super) const LOCK_CONFIGS: &str = concat!(
    "SELECT pg_advisory_xact_lock(",
    config_lock!("h"),
    ")
     FROM (SELECT DISTINCT unnest($1::text[]) AS h ORDER BY 1) s"
);

/// After a group in which sessions left configurations (a change of
/// configuration): each that no session names any more is deleted, as a
/// purge does (`purge`): locked first ([`LOCK_CONFIGS`]), so a checkpoint
/// of another transaction taking it up at the same time is either seen (it
/// committed before the lock was granted; read committed gives the delete
/// a snapshot taken after) or inserts it again (see [`GROUP_SQL`]). Rare: a
/// configuration changes once or twice in a session's life, if ever.
const DELETE_LEFT_CONFIGS: &str = "DELETE FROM configs c WHERE c.hash = ANY($1)
    AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.config_hash = c.hash)";

/// The newest checkpoint schema this binary writes over (`$21`).
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
    let statement = client.prepare_cached(GROUP_SQL).await.map_err(map_pg)?;
    let tx = client.transaction().await.map_err(map_pg)?;
    // One statement per wave (a wave holds each session once: a row cannot
    // be written twice by one statement), polled together so that they are
    // pipelined on the connection, in order.
    let waves = waves(jobs);
    let params: Vec<Group> = waves.iter().map(|w| Group::of(w)).collect();
    let results = futures::future::join_all(params.iter().map(|g| {
        let tx = &tx;
        let statement = &statement;
        async move { tx.query(statement, &g.params()).await }
    }))
    .await;
    let mut landed = vec![Outcome::Fenced; jobs.len()];
    // Configurations sessions of the group moved away from.
    let mut left: Vec<String> = Vec::new();
    for (wave, rows) in waves.iter().zip(results) {
        let rows = rows.map_err(map_pg)?;
        for (&(at, _), row) in wave.iter().zip(&rows) {
            let (wrote, fence, found): (bool, bool, Option<i32>) =
                (row.get(0), row.get(1), row.get(2));
            if wrote {
                left.extend(row.get::<_, Option<String>>(3));
            }
            landed[at] = match (wrote, fence, found) {
                (true, _, _) => Outcome::Landed,
                (false, true, Some(v)) if v > KNOWN_SCHEMA => {
                    Outcome::TooNew(u32::try_from(v).unwrap_or(u32::MAX))
                }
                _ => Outcome::Fenced,
            };
        }
    }
    let mut cleanup = 0;
    if !left.is_empty() {
        left.sort_unstable();
        left.dedup();
        for sql in [LOCK_CONFIGS, DELETE_LEFT_CONFIGS] {
            tx.execute(sql, &[&left]).await.map_err(map_pg)?;
            cleanup += 1;
        }
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
        .fetch_add(3 + cleanup + notifies.len() as u64, Ordering::Relaxed);
    Ok(landed)
}

/// Splits a group into waves in which each session appears once, keeping
/// each session's checkpoints in order; each job with its position.
fn waves<'a>(jobs: &[&'a Prepared]) -> Vec<Vec<(usize, &'a Prepared)>> {
    let mut waves: Vec<Vec<(usize, &Prepared)>> = Vec::new();
    let mut seen: std::collections::HashMap<Uuid, usize> = Default::default();
    for (at, p) in jobs.iter().enumerate() {
        let wave = seen.entry(p.id).and_modify(|w| *w += 1).or_insert(0);
        if waves.len() <= *wave {
            waves.push(Vec::new());
        }
        waves[*wave].push((at, p));
    }
    waves
}

/// The parameters of one wave's statement: one array per column, one
/// element per checkpoint (or per row of a kind, tagged with the
/// checkpoint's 1-based ordinal). It borrows the checkpoints' encoded
/// rows: the driver copies each once, into the statement's message.
#[derive(Default)]
struct Group<'a> {
    ids: Vec<Uuid>,
    roots: Vec<Uuid>,
    epochs: Vec<Option<i64>>,
    parents: Vec<Option<Uuid>>,
    tenants: Vec<&'a str>,
    statuses: Vec<&'a str>,
    schema_versions: Vec<i32>,
    last_event_seqs: Vec<i64>,
    transcript_lens: Vec<i64>,
    headers: Vec<&'a str>,
    metadata: Vec<Option<&'a str>>,
    records: Vec<&'a [u8]>,
    first_events: Vec<Option<i64>>,
    first_entries: Vec<Option<i64>>,
    /// The blobs each record names, as an array literal (`{h1,h2}`: hex
    /// needs no quoting), since PostgreSQL arrays of arrays must be
    /// rectangular.
    record_blobs: Vec<Option<String>>,
    dequeue_from: Vec<i64>,
    dequeue_to: Vec<i64>,
    hook_now_ms: Vec<i64>,
    agents: Vec<&'a str>,
    node: Option<Uuid>,
    blob_ord: Vec<i64>,
    blob_hashes: Vec<&'a str>,
    blob_data: Vec<&'a str>,
    queue_ord: Vec<i64>,
    queue_seqs: Vec<i64>,
    queued: Vec<&'a str>,
    hook_ord: Vec<i64>,
    hook_ids: Vec<&'a str>,
    hook_events: Vec<&'a str>,
    hook_seeds: Vec<&'a str>,
    decision_ord: Vec<i64>,
    decision_at: Vec<i64>,
    decision_calls: Vec<&'a str>,
    decision_tools: Vec<&'a str>,
    decision_by: Vec<Option<&'a str>>,
    decision_rows: Vec<&'a str>,
    /// The configuration each header names, and its JSON (`$38`, `$39`).
    config_hashes: Vec<&'a str>,
    configs: Vec<&'a str>,
}

impl<'a> Group<'a> {
    fn of(wave: &[(usize, &'a Prepared)]) -> Self {
        let mut g = Self::default();
        for (n, (_, p)) in wave.iter().enumerate() {
            let ord = n as i64 + 1;
            g.ids.push(p.id);
            g.roots.push(p.root);
            g.epochs.push(p.epoch);
            g.parents.push(p.parent);
            g.tenants.push(&p.tenant);
            g.statuses.push(&p.status);
            g.schema_versions.push(p.schema_version);
            g.last_event_seqs.push(p.last_event_seq);
            g.transcript_lens.push(p.transcript_len);
            g.headers.push(&p.header);
            g.metadata.push(p.metadata.as_deref());
            g.records.push(&p.record);
            g.first_events.push(p.first_event);
            g.first_entries.push(p.first_entry);
            g.record_blobs.push(
                p.record_blobs
                    .as_ref()
                    .map(|hashes| format!("{{{}}}", hashes.join(","))),
            );
            g.dequeue_from.push(p.dequeue_from);
            g.dequeue_to.push(p.dequeue_to);
            g.hook_now_ms.push(p.hook_now_ms);
            g.agents.push(&p.agent);
            g.config_hashes.push(&p.config_hash);
            g.configs.push(&p.config);
            g.node = g.node.or(p.node);
            for (hash, data) in p.blob_hashes.iter().zip(&p.blob_data) {
                g.blob_ord.push(ord);
                g.blob_hashes.push(hash);
                g.blob_data.push(data);
            }
            for (seq, message) in p.queue_seqs.iter().zip(&p.queued) {
                g.queue_ord.push(ord);
                g.queue_seqs.push(*seq);
                g.queued.push(message);
            }
            for ((id, event), seed) in p.hook_ids.iter().zip(&p.hook_events).zip(&p.hook_seeds) {
                g.hook_ord.push(ord);
                g.hook_ids.push(id);
                g.hook_events.push(event);
                g.hook_seeds.push(seed);
            }
            for i in 0..p.decision_rows.len() {
                g.decision_ord.push(ord);
                g.decision_at.push(p.decision_at[i]);
                g.decision_calls.push(&p.decision_calls[i]);
                g.decision_tools.push(&p.decision_tools[i]);
                g.decision_by.push(p.decision_by[i].as_deref());
                g.decision_rows.push(&p.decision_rows[i]);
            }
        }
        g
    }

    fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        vec![
            &self.ids,
            &self.roots,
            &self.epochs,
            &self.parents,
            &self.tenants,
            &self.statuses,
            &self.schema_versions,
            &self.last_event_seqs,
            &self.transcript_lens,
            &self.headers,
            &self.metadata,
            &self.records,
            &self.first_events,
            &self.first_entries,
            &self.record_blobs,
            &self.dequeue_from,
            &self.dequeue_to,
            &self.hook_now_ms,
            &self.agents,
            &self.node,
            &KNOWN_SCHEMA,
            &self.blob_ord,
            &self.blob_hashes,
            &self.blob_data,
            &self.queue_ord,
            &self.queue_seqs,
            &self.queued,
            &self.hook_ord,
            &self.hook_ids,
            &self.hook_events,
            &self.hook_seeds,
            &self.decision_ord,
            &self.decision_at,
            &self.decision_calls,
            &self.decision_tools,
            &self.decision_by,
            &self.decision_rows,
            &self.config_hashes,
            &self.configs,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checkpoint statement and a purge lock a configuration under one
    /// advisory lock (class and key), or neither excludes the other.
    #[test]
    fn checkpoints_and_purges_lock_configurations_in_one_class() {
        let key = |hash: &str| format!("1870029670, ('x' || left({hash}, 8))::bit(32)::int)");
        let shared = |hash| format!("pg_advisory_xact_lock_shared({}", key(hash));
        assert!(GROUP_SQL.contains(&shared("gt.chash")), "{GROUP_SQL}");
        assert!(
            LOCK_CONFIG_SHARED.contains(&shared("$1")),
            "{LOCK_CONFIG_SHARED}"
        );
        let exclusive = format!("pg_advisory_xact_lock({}", key("h"));
        assert!(LOCK_CONFIGS.contains(&exclusive), "{LOCK_CONFIGS}");
    }
}
