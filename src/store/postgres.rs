//! The PostgreSQL checkpoint store of cluster mode: [`PgStore`], the
//! same [`CheckpointStore`] contract as the sled store, shared by every node
//! of a cluster.
//!
//! It owns the SQL: the schema and its embedded migrations (`schema`), one
//! statement per checkpoint and one transaction per group of checkpoints
//! (`writer`: group commit), the reads, and the rows of cluster membership
//! and ownership (`nodes`, `leases`) with the conditional updates that move
//! them. The sled store's guarantees carry over:
//!
//! - **One atomic write per checkpoint, of what changed only**: the header
//!   row (the commit record), the new transcript entries, events and queued
//!   messages, the dequeued range, the metadata once, in one statement
//!   (data-modifying CTEs); checkpoints arriving together share one
//!   transaction, so one commit (one WAL flush) confirms them all.
//! - **Fencing**: every checkpoint statement writes only if the tree's
//!   lease row still names this node with the epoch this node claimed
//!   (`FOR SHARE`, so a concurrent claim waits for it or makes it write
//!   nothing). A write that finds another epoch lands nothing, and the
//!   caller gets [`StoreError::NotOwner`]. Before that, a node whose own
//!   lease (its heartbeat) ran out by its own clock refuses to write at all.
//! - Blobs over 64 KiB, content-addressed, shared; `schema_version` refused
//!   when newer (per header, and for the whole database at open); the effect
//!   journal lives in the header's open calls, as with sled.
//! - `durability = "os"` maps to `synchronous_commit = off`.
//! - **Retention**: `scan` walks the sessions by id; `purge` deletes a
//!   terminal session whole in one transaction (nothing half-purged to
//!   finish later, unlike sled), with the blobs no other transcript row
//!   names and the lease of a tree left empty. Only the owner of a live
//!   tree purges it (it alone knows whether the session's actor still runs).
//!
//! The heartbeat renews this node's membership on a connection of its own,
//! never waiting for the pool: a node busy writing must not lose its
//! sessions for want of a connection. Joining ([`PgStore::join`]) refuses a
//! URL that a live node already advertises. Every connection asks the
//! server to end a transaction left idle for half the lease, so a node
//! stopped mid-transaction cannot hold lease rows against a takeover.
//!
//! Transient failures (the database restarting, a dropped connection) are
//! retried for a while, writes included: a checkpoint statement is
//! idempotent (upserts of the same rows, a delete of the same range), so
//! re-running one whose commit went unconfirmed changes nothing. Past the
//! retry budget the error is [`StoreError::Unavailable`].
//!
//! It deliberately owns no cluster behaviour (heartbeat cadence, failover,
//! routing): `crate::cluster` drives it through the methods here.

mod schema;
mod webhooks;
mod writer;

/// The newest schema migration this binary knows (`overseer --version`).
pub fn latest_migration() -> i32 {
    schema::latest()
}

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use overseer_actors::model::{
    Event, QueuedMessage, SessionHeader, SessionId, SessionIdHasher, SessionStatus, TranscriptEntry,
};
use overseer_actors::store::{
    decision_rows, Checkpoint, CheckpointStore, DecisionPage, DecisionQuery, DecisionRow,
    SessionSummary, StoreError, StoredSession,
};
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;
use uuid::Uuid;

use super::codec::{self, corrupt};
use super::Durability;
use writer::Writer;

/// The environment variable holding the database URL.
pub const DATABASE_URL_ENV: &str = "OVERSEER_DATABASE_URL";

/// The channel on which checkpoints announce new events to other nodes.
pub const EVENTS_CHANNEL: &str = "overseer_events";

/// The `application_name` of a node's heartbeat connection.
pub const HEARTBEAT_APPLICATION: &str = "overseer-heartbeat";

/// Default of [`PgOptions::pool_size`] (`[store] pool_size`).
pub const DEFAULT_POOL_SIZE: usize = 16;

/// How long a read is retried across transient failures.
const READ_RETRY: Duration = Duration::from_secs(5);

/// How a [`PgStore`] is opened.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `fsync`: a checkpoint is confirmed once its commit is flushed
    /// (`synchronous_commit = on`); `os`: once committed (`off`).
    pub durability: Durability,
    /// Most connections the pool opens (checkpoints, reads, claims); the
    /// heartbeat and the event relay each have one more of their own.
    pub pool_size: usize,
    /// A node whose heartbeat is older than this is dead (`[cluster]
    /// lease_secs`); this node stops writing earlier than that, by its own
    /// clock.
    pub lease: Duration,
    /// How long a checkpoint is retried across transient failures before
    /// it fails as [`StoreError::Unavailable`].
    pub write_retry: Duration,
    /// How long opening waits for the database.
    pub connect_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Fsync,
            pool_size: DEFAULT_POOL_SIZE,
            lease: Duration::from_secs(10),
            write_retry: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Why the store could not be opened. Messages name the database as
/// `host:port/dbname`, never the password.
#[derive(Debug, thiserror::Error)]
pub enum PgOpenError {
    /// Not a PostgreSQL connection string.
    #[error("{DATABASE_URL_ENV} is not a PostgreSQL connection string (expected postgres://user:password@host:port/dbname): {0}")]
    InvalidUrl(String),
    /// The database did not answer.
    #[error("cannot connect to PostgreSQL at {target} (from {DATABASE_URL_ENV}): {reason}")]
    Unreachable {
        /// `host:port/dbname`.
        target: String,
        /// Why.
        reason: String,
    },
    /// Migrated by a newer binary.
    #[error("the database's schema is version {found}, but this binary knows at most version {supported}; upgrade overseer to use it (the database was left untouched)")]
    SchemaTooNew {
        /// The version found.
        found: i32,
        /// The newest this binary knows.
        supported: i32,
    },
    /// A migration failed.
    #[error("cannot migrate the database schema: {0}")]
    Migration(String),
}

/// Who owns a session's tree, as the database says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// No such session.
    NoSession,
    /// This node.
    Here,
    /// Nobody, or a node whose heartbeat is older than the lease: whoever
    /// activates it takes it.
    Claimable,
    /// Another live node.
    Node {
        /// Its id.
        id: Uuid,
        /// Its advertised URL.
        url: String,
    },
}

/// One node as `overseer cluster status` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NodeStatus {
    /// Node id.
    pub id: Uuid,
    /// Advertised URL.
    pub url: String,
    /// Whether its heartbeat is within the lease (a dead node's row stays,
    /// marked dead, until the live nodes prune it after
    /// `cluster.dead_node_retention_secs`).
    pub alive: bool,
    /// Seconds since its last heartbeat.
    pub heartbeat_age_secs: f64,
    /// Active sessions (running or awaiting approval, children included)
    /// in the trees whose lease it holds: on a dead node, what is still to
    /// be taken over. Idle and finished sessions are not counted.
    pub active_sessions: i64,
}

/// A root whose owner is gone, found by [`PgStore::claimable_roots`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Orphan {
    /// The root session.
    pub root: SessionId,
    /// The node its lease names (`None`: never owned, or released).
    pub owner: Option<Uuid>,
    /// Seconds since its dead owner's last heartbeat (`None`: never owned,
    /// or the owner's row is gone).
    pub dead_for_secs: Option<f64>,
}

/// What one failover round decides by: the database's clock at the start
/// of the round and the nodes alive by it. Every page of the round is read
/// against the same instant, so a node that dies during the round counts
/// as alive (or dead) for all of it.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundView {
    /// The database's `now()`, in seconds since the Unix epoch.
    pub at: f64,
    /// Nodes whose heartbeat was within the lease at `at`, by id.
    pub live: Vec<Uuid>,
}

/// Another live node already advertises the URL a node would join with.
#[derive(Debug, Clone, PartialEq)]
pub struct UrlTaken {
    /// That node's id.
    pub node: Uuid,
    /// Seconds since its last heartbeat.
    pub heartbeat_age_secs: f64,
    /// Its last heartbeat, in seconds since the Unix epoch (a later one
    /// proves it is still beating).
    pub heartbeat_at: f64,
}

/// A lease this node holds: the epoch its checkpoints are conditional on.
#[derive(Debug, Clone, Copy)]
struct Lease {
    epoch: i64,
    since: Instant,
}

/// This node's own view of its membership lease: until when, by its own
/// monotonic clock, it may act on the leases it holds.
struct NodeClock {
    base: Instant,
    /// Milliseconds after `base`; 0 = not valid (never joined, or lapsed).
    valid_until_ms: AtomicU64,
}

impl NodeClock {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            valid_until_ms: AtomicU64::new(0),
        }
    }

    fn valid(&self) -> bool {
        let now = self.base.elapsed().as_millis() as u64;
        now < self.valid_until_ms.load(Ordering::Acquire)
    }

    fn extend_to(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.base).as_millis() as u64;
        self.valid_until_ms.store(ms, Ordering::Release);
    }

    fn expire(&self) {
        self.valid_until_ms.store(0, Ordering::Release);
    }
}

/// The PostgreSQL store. Cloning is cheap and shares the pool.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    config: tokio_postgres::Config,
    target: String,
    node: Uuid,
    options: PgOptions,
    leases: DashMap<SessionId, Lease, SessionIdHasher>,
    clock: NodeClock,
    writer: Writer,
    /// The heartbeat's own connection, outside the pool (see
    /// [`PgStore::heartbeat`]); empty until the first heartbeat and after a
    /// failed one.
    heartbeat_conn: std::sync::Mutex<Option<tokio_postgres::Client>>,
    /// Request-response exchanges with the database this store waited on.
    round_trips: Arc<AtomicU64>,
    /// Webhooks: when set, checkpoints insert the deliveries of their events.
    webhooks: std::sync::OnceLock<Arc<crate::webhooks::Subscriptions>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("database", &self.inner.target)
            .field("node", &self.inner.node)
            .finish_non_exhaustive()
    }
}

/// `host:port/dbname` of a connection config, for messages.
fn describe_target(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("(default database)");
    format!("{host}:{port}/{db}")
}

/// Whether a database error is worth retrying: the connection, not the
/// statement, failed.
fn transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        return code.code().starts_with("08")
            || [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::TOO_MANY_CONNECTIONS,
            ]
            .contains(code);
    }
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

/// A database error as a store error.
pub(crate) fn map_pg(e: tokio_postgres::Error) -> StoreError {
    if transient(&e) {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Io(format!("database error: {e}"))
    }
}

fn map_pool(e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => map_pg(e),
        other => StoreError::Unavailable(format!("no database connection: {other}")),
    }
}

fn is_retryable(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_))
}

/// Retries `f` across transient failures for up to `budget`.
async fn retrying<T, F, Fut>(budget: Duration, mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + budget;
    let mut pause = Duration::from_millis(25);
    loop {
        match f().await {
            Err(e) if is_retryable(&e) && Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "database unavailable; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// Whether a planned fault skips this node's own-lease check (tests only).
#[cfg(feature = "fault-injection")]
fn own_lease_bypassed() -> bool {
    overseer_actors::fault::bypassed(overseer_actors::fault::FaultPoint::IgnoreOwnLease)
}

#[cfg(not(feature = "fault-injection"))]
fn own_lease_bypassed() -> bool {
    false
}

fn session_id(id: Uuid) -> SessionId {
    SessionId(id)
}

/// `i64` for a `u64` count or sequence (sequences never come near 2^63).
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl PgStore {
    /// Connects to the database at `url`, applies the migrations this binary
    /// knows (refusing a database migrated by a newer one) and starts the
    /// writers. The node gets a fresh id; it owns nothing and may write
    /// nothing until [`PgStore::heartbeat`] has succeeded.
    pub async fn open(url: &str, options: PgOptions) -> Result<Self, PgOpenError> {
        let mut config = tokio_postgres::Config::from_str(url)
            .map_err(|e| PgOpenError::InvalidUrl(e.to_string()))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        config.application_name("overseer");
        // A node stopped (SIGSTOP, a hung VM) inside a transaction must not
        // hold its row locks for ever: the lease rows it locked `FOR SHARE`
        // would block every takeover of its trees. The server ends such a
        // session well before the lease runs out; a healthy node never
        // idles in a transaction (each is one pipelined exchange).
        let idle = (options.lease / 2).max(Duration::from_secs(1));
        let mut server_options = config.get_options().unwrap_or_default().to_owned();
        server_options.push_str(&format!(
            " -c idle_in_transaction_session_timeout={}",
            idle.as_millis()
        ));
        if options.durability == Durability::Os {
            server_options.push_str(" -c synchronous_commit=off");
        }
        config.options(server_options.trim_start());
        let target = describe_target(&config);
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(2))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| PgOpenError::Migration(e.to_string()))?;
        // One connection now, so that a wrong URL or a database that is down
        // is a start-up error, not a failed request later.
        match pool.get().await {
            Ok(_) => {}
            Err(e) => {
                let reason = match e {
                    PoolError::Backend(e) => e.to_string(),
                    PoolError::Timeout(_) => {
                        format!("no answer within {} s", options.connect_timeout.as_secs())
                    }
                    other => other.to_string(),
                };
                return Err(PgOpenError::Unreachable { target, reason });
            }
        }
        schema::migrate(&pool).await?;
        let writers = (options.pool_size / 2).clamp(1, 4);
        let round_trips = Arc::new(AtomicU64::new(0));
        let writer = Writer::start(
            pool.clone(),
            writers,
            options.write_retry,
            round_trips.clone(),
        );
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                config,
                target,
                node: Uuid::new_v4(),
                options,
                leases: DashMap::default(),
                clock: NodeClock::new(),
                writer,
                heartbeat_conn: std::sync::Mutex::new(None),
                round_trips,
                webhooks: std::sync::OnceLock::new(),
            }),
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> Uuid {
        self.inner.node
    }

    /// `host:port/dbname`.
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// The connection settings (for a connection of its own, e.g. `LISTEN`).
    pub fn connection_config(&self) -> tokio_postgres::Config {
        self.inner.config.clone()
    }

    /// Transactions the writers committed so far: each confirms a group of
    /// checkpoints (group commit), so under load far fewer than checkpoints.
    pub fn commits(&self) -> u64 {
        self.inner.writer.commits()
    }

    /// Request-response exchanges with the database so far (a pipelined
    /// group of statements counts once): what the benchmarks report per
    /// session.
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    fn trip(&self) {
        self.inner.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// The membership lease (`lease_secs`).
    pub fn lease(&self) -> Duration {
        self.inner.options.lease
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner.pool.get().await.map_err(map_pool)
    }

    // ---- membership ----------------------------------------------------------

    /// Joins with `url`: records this node's first heartbeat, unless another
    /// node whose heartbeat is within the lease already advertises `url`
    /// (then nothing is written and that node is returned). Checked and
    /// written in one transaction under an advisory lock on the URL, so of
    /// two nodes joining with one URL at once the second sees the first.
    pub async fn join(&self, url: &str) -> Result<Result<(), UrlTaken>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(map_pg)?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&url],
        )
        .await
        .map_err(map_pg)?;
        let taken = tx
            .query_opt(
                "SELECT id, EXTRACT(EPOCH FROM now() - heartbeat_at)::float8,
                        EXTRACT(EPOCH FROM heartbeat_at)::float8
                 FROM nodes
                 WHERE url = $1 AND id <> $2
                   AND heartbeat_at > now() - make_interval(secs => $3)
                 ORDER BY heartbeat_at DESC LIMIT 1",
                &[
                    &url,
                    &self.inner.node,
                    &self.inner.options.lease.as_secs_f64(),
                ],
            )
            .await
            .map_err(map_pg)?;
        if let Some(row) = taken {
            return Ok(Err(UrlTaken {
                node: row.get(0),
                heartbeat_age_secs: row.get(1),
                heartbeat_at: row.get(2),
            }));
        }
        tx.execute(
            "INSERT INTO nodes (id, url) VALUES ($1, $2)
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), url = EXCLUDED.url",
            &[&self.inner.node, &url],
        )
        .await
        .map_err(map_pg)?;
        tx.commit().await.map_err(map_pg)?;
        Ok(Ok(()))
    }

    /// Records this node's heartbeat (joining with `url` on the first). On
    /// success this node may act on its leases until `lease` minus a margin
    /// after the heartbeat *started*, by its own clock: it stops before any
    /// other node can see it as dead.
    ///
    /// The heartbeat has a connection of its own, outside the pool: a pool
    /// taken up by checkpoint writers (a burst, statements waiting on locks)
    /// must not make a node miss its own renewal, drop every session and
    /// have them taken over while it is merely busy. A connection found
    /// closed, or that fails, is replaced (once within the call, so a
    /// database restart between two heartbeats costs no renewal).
    pub async fn heartbeat(&self, url: &str, timeout: Duration) -> Result<(), StoreError> {
        let started = Instant::now();
        let work = async {
            // Taken out of its slot while in use (no lock held across an
            // await); put back only after it worked, so a call cut short by
            // the timeout leaves a fresh connection to the next one.
            let kept = self
                .inner
                .heartbeat_conn
                .lock()
                .ok()
                .and_then(|mut slot| slot.take())
                .filter(|c| !c.is_closed());
            let client = match kept {
                Some(client) => match self.beat(&client, url).await {
                    Ok(()) => Some(client),
                    Err(e) if transient(&e) => {
                        tracing::debug!(error = %e, "the heartbeat connection was lost; reconnecting");
                        None
                    }
                    Err(e) => return Err(map_pg(e)),
                },
                None => None,
            };
            let client = match client {
                Some(client) => client,
                None => {
                    let client = self.heartbeat_connection().await?;
                    self.beat(&client, url).await.map_err(map_pg)?;
                    client
                }
            };
            if let Ok(mut slot) = self.inner.heartbeat_conn.lock() {
                *slot = Some(client);
            }
            Ok(())
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(Ok(())) => {
                let lease = self.inner.options.lease;
                let margin = (lease / 5).max(Duration::from_millis(500)).min(lease / 2);
                self.inner.clock.extend_to(started + lease - margin);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Unavailable(format!(
                "the heartbeat took more than {} ms",
                timeout.as_millis()
            ))),
        }
    }

    /// The heartbeat statement.
    async fn beat(
        &self,
        client: &tokio_postgres::Client,
        url: &str,
    ) -> Result<(), tokio_postgres::Error> {
        client
            .execute(
                "INSERT INTO nodes (id, url) VALUES ($1, $2)
                 ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), url = EXCLUDED.url",
                &[&self.inner.node, &url],
            )
            .await
            .map(|_| ())
    }

    /// A new connection for the heartbeat, named `overseer-heartbeat` in
    /// `pg_stat_activity`; it closes when its client is dropped.
    async fn heartbeat_connection(&self) -> Result<tokio_postgres::Client, StoreError> {
        let mut config = self.inner.config.clone();
        config.application_name(HEARTBEAT_APPLICATION);
        let (client, connection) = config.connect(NoTls).await.map_err(map_pg)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "the heartbeat connection ended");
            }
        });
        Ok(client)
    }

    /// Whether this node may act on its leases now (its last heartbeat is
    /// recent enough by its own clock).
    pub fn lease_valid(&self) -> bool {
        self.inner.clock.valid()
    }

    /// Whether this node must stop acting on its leases now: its own lease
    /// ran out by its own clock. With the `fault-injection` feature a
    /// planned `ignore_own_lease:N:bypass` makes it carry on regardless
    /// (the test of the database's fence).
    pub fn lease_lapsed(&self) -> bool {
        !self.inner.clock.valid() && !own_lease_bypassed()
    }

    /// Forgets every lease this node held, and stops writing until the next
    /// heartbeat: a node whose lease lapsed (paused, partitioned, slow)
    /// must assume other nodes took its sessions.
    pub fn drop_leases(&self) {
        self.inner.clock.expire();
        self.inner.leases.clear();
        self.publish_owned();
    }

    /// Forgets leases of roots `keep` does not want, held longer than
    /// `older_than` (a hibernated tree is claimed again when next
    /// activated); keeps the map to the trees in use.
    pub fn sweep_leases(&self, older_than: Duration, keep: impl Fn(SessionId) -> bool) {
        self.inner
            .leases
            .retain(|root, l| keep(*root) || l.since.elapsed() < older_than);
        self.publish_owned();
    }

    /// Trees this node holds the lease of (in memory).
    pub fn leases_held(&self) -> usize {
        self.inner.leases.len()
    }

    fn publish_owned(&self) {
        metrics::gauge!(overseer_actors::metrics::CLUSTER_SESSIONS_OWNED)
            .set(self.inner.leases.len() as f64);
    }

    /// Leaves the cluster at a graceful shutdown: gives up every lease (the
    /// other nodes take the active sessions at once, without waiting for the
    /// lease to run out) and removes this node's row.
    pub async fn leave(&self) -> Result<(), StoreError> {
        self.drop_leases();
        let client = self.client().await?;
        client
            .execute(
                "UPDATE leases SET node_id = NULL WHERE node_id = $1",
                &[&self.inner.node],
            )
            .await
            .map_err(map_pg)?;
        client
            .execute("DELETE FROM nodes WHERE id = $1", &[&self.inner.node])
            .await
            .map_err(map_pg)?;
        Ok(())
    }

    /// Removes the rows of nodes whose last heartbeat is older than `after`
    /// (never less than the lease: only dead nodes), and returns their ids.
    /// The leases they still name stay: a lease naming no node row is
    /// claimable like one naming a dead node, and its epoch still fences a
    /// node that comes back (which heartbeats its row in again).
    pub async fn prune_nodes(&self, after: Duration) -> Result<Vec<Uuid>, StoreError> {
        let after = after.max(self.inner.options.lease);
        let client = self.client().await?;
        let rows = client
            .query(
                "DELETE FROM nodes WHERE heartbeat_at < now() - make_interval(secs => $1)
                 RETURNING id",
                &[&after.as_secs_f64()],
            )
            .await
            .map_err(map_pg)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The key of node-to-node credentials, shared through the database.
    pub async fn node_secret(&self) -> Result<String, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT value FROM overseer_meta WHERE key = 'node_secret'",
                &[],
            )
            .await
            .map_err(map_pg)?;
        Ok(row.get(0))
    }

    /// Every node with its liveness and the active sessions it owns.
    pub async fn nodes(&self) -> Result<Vec<NodeStatus>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT n.id, n.url,
                        n.heartbeat_at > now() - make_interval(secs => $1),
                        EXTRACT(EPOCH FROM now() - n.heartbeat_at)::float8,
                        (SELECT count(*) FROM leases l JOIN sessions s ON s.root_id = l.root_id
                          WHERE l.node_id = n.id
                            AND s.status IN ('running', 'awaiting_approval'))
                 FROM nodes n ORDER BY n.started_at, n.id",
                &[&self.inner.options.lease.as_secs_f64()],
            )
            .await
            .map_err(map_pg)?;
        Ok(rows
            .iter()
            .map(|r| NodeStatus {
                id: r.get(0),
                url: r.get(1),
                alive: r.get(2),
                heartbeat_age_secs: r.get(3),
                active_sessions: r.get(4),
            })
            .collect())
    }

    // ---- ownership -------------------------------------------------------------

    /// Who owns the tree of session `id`.
    pub async fn owner(&self, id: SessionId) -> Result<Owner, StoreError> {
        let row = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            self.trip();
            client
                .query_opt(
                    "SELECT l.node_id, n.url,
                            COALESCE(n.heartbeat_at > now() - make_interval(secs => $2), false)
                     FROM sessions s
                     LEFT JOIN leases l ON l.root_id = s.root_id
                     LEFT JOIN nodes n ON n.id = l.node_id
                     WHERE s.id = $1",
                    &[&id.0, &self.inner.options.lease.as_secs_f64()],
                )
                .await
                .map_err(map_pg)
        })
        .await?;
        let Some(row) = row else {
            return Ok(Owner::NoSession);
        };
        let node: Option<Uuid> = row.get(0);
        let url: Option<String> = row.get(1);
        let alive: bool = row.get(2);
        Ok(match (node, url) {
            (Some(n), _) if n == self.inner.node => Owner::Here,
            (Some(n), Some(url)) if alive => Owner::Node { id: n, url },
            _ => Owner::Claimable,
        })
    }

    /// The database's clock and the nodes alive by it, for one failover
    /// round (this node among them while its lease is valid).
    pub async fn round_view(&self) -> Result<RoundView, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT EXTRACT(EPOCH FROM now())::float8,
                        COALESCE(array_agg(id ORDER BY id)
                          FILTER (WHERE heartbeat_at > now() - make_interval(secs => $1)),
                          '{}')
                 FROM nodes",
                &[&self.inner.options.lease.as_secs_f64()],
            )
            .await
            .map_err(map_pg)?;
        Ok(RoundView {
            at: row.get(0),
            live: row.get(1),
        })
    }

    /// Active roots (running or awaiting approval) whose owner was dead at
    /// `at` (a [`RoundView::at`]) or that nobody owns, in id order after
    /// `after`, at most `limit`: what failover takes, a page at a time.
    pub async fn claimable_roots(
        &self,
        at: f64,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<Orphan>, StoreError> {
        let client = self.client().await?;
        let after = after.map(|a| a.0);
        let rows = client
            .query(
                "SELECT s.id, l.node_id,
                        CASE WHEN n.id IS NULL THEN NULL
                             ELSE EXTRACT(EPOCH FROM to_timestamp($1) - n.heartbeat_at)::float8 END
                 FROM sessions s
                 LEFT JOIN leases l ON l.root_id = s.id
                 LEFT JOIN nodes n ON n.id = l.node_id
                 WHERE s.status IN ('running', 'awaiting_approval')
                   AND s.parent_id IS NULL
                   AND ($4::uuid IS NULL OR s.id > $4)
                   AND (l.node_id IS NULL OR n.id IS NULL
                        OR (n.id <> $2
                            AND n.heartbeat_at <= to_timestamp($1) - make_interval(secs => $3)))
                 ORDER BY s.id LIMIT $5",
                &[
                    &at,
                    &self.inner.node,
                    &self.inner.options.lease.as_secs_f64(),
                    &after,
                    &signed(limit as u64),
                ],
            )
            .await
            .map_err(map_pg)?;
        Ok(rows
            .iter()
            .map(|r| Orphan {
                root: session_id(r.get(0)),
                owner: r.get(1),
                dead_for_secs: r.get(2),
            })
            .collect())
    }

    /// Active roots whose lease names this node but that it holds no lease
    /// for in memory (after it dropped its leases): it takes them again.
    pub async fn own_unheld_roots(&self, limit: usize) -> Result<Vec<SessionId>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT s.id FROM leases l JOIN sessions s ON s.id = l.root_id
                 WHERE l.node_id = $1 AND s.status IN ('running', 'awaiting_approval')",
                &[&self.inner.node],
            )
            .await
            .map_err(map_pg)?;
        Ok(rows
            .iter()
            .map(|r| session_id(r.get(0)))
            .filter(|id| !self.inner.leases.contains_key(id))
            .take(limit)
            .collect())
    }

    /// Takes the leases of `roots` whose owner is still gone (another node
    /// may have been faster), in one statement. Returns the roots taken.
    pub async fn claim_many(&self, roots: &[SessionId]) -> Result<Vec<SessionId>, StoreError> {
        if !self.lease_valid() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = roots.iter().map(|r| r.0).collect();
        let client = self.client().await?;
        let rows = client
            .query(
                "INSERT INTO leases AS l (root_id, node_id, epoch)
                 SELECT unnest($1::uuid[]), $2, 1
                 ON CONFLICT (root_id) DO UPDATE
                   SET node_id = EXCLUDED.node_id, epoch = l.epoch + 1, claimed_at = now()
                   WHERE l.node_id IS NULL OR l.node_id = $2 OR NOT EXISTS (
                     SELECT 1 FROM nodes n WHERE n.id = l.node_id
                       AND n.heartbeat_at > now() - make_interval(secs => $3))
                 RETURNING root_id, epoch",
                &[
                    &ids,
                    &self.inner.node,
                    &self.inner.options.lease.as_secs_f64(),
                ],
            )
            .await
            .map_err(map_pg)?;
        let mut taken = Vec::with_capacity(rows.len());
        for r in &rows {
            let root = session_id(r.get(0));
            self.hold(root, r.get(1));
            taken.push(root);
        }
        metrics::counter!(overseer_actors::metrics::CLUSTER_CLAIMS_TOTAL, "reason" => "failover")
            .increment(taken.len() as u64);
        Ok(taken)
    }

    fn hold(&self, root: SessionId, epoch: i64) {
        self.inner.leases.insert(
            root,
            Lease {
                epoch,
                since: Instant::now(),
            },
        );
        self.publish_owned();
    }

    /// The epoch a checkpoint of `root`'s tree is written under, or why it
    /// may not be written.
    fn fence(&self, root: SessionId, session: SessionId) -> Result<i64, StoreError> {
        if self.lease_lapsed() {
            metrics::counter!(overseer_actors::metrics::CLUSTER_FENCED_WRITES_TOTAL, "by" => "node")
                .increment(1);
            return Err(StoreError::NotOwner {
                session,
                reason: "this node's lease has run out (no recent heartbeat)".into(),
            });
        }
        match self.inner.leases.get(&root) {
            Some(l) => Ok(l.epoch),
            None => {
                metrics::counter!(overseer_actors::metrics::CLUSTER_FENCED_WRITES_TOTAL, "by" => "node")
                    .increment(1);
                Err(StoreError::NotOwner {
                    session,
                    reason: "this node holds no lease on its tree".into(),
                })
            }
        }
    }

    /// A checkpoint found another epoch: the tree is another node's now.
    fn lost(&self, root: SessionId, epoch: i64) {
        self.inner.leases.remove_if(&root, |_, l| l.epoch == epoch);
        self.publish_owned();
        metrics::counter!(overseer_actors::metrics::CLUSTER_FENCED_WRITES_TOTAL, "by" => "database")
            .increment(1);
    }

    // ---- store copy --------------------------------------------------------------

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
                                       last_event_seq, transcript_len, header, metadata)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
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
                ],
            )
            .await
            .map_err(map_pg)?;
        if inserted == 0 {
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO blobs (hash, data) SELECT * FROM unnest($1::text[], $2::text[])
             ON CONFLICT (hash) DO UPDATE SET hash = EXCLUDED.hash",
            &[&prepared.blob_hashes, &prepared.blob_data],
        )
        .await
        .map_err(map_pg)?;
        tx.execute(
            "INSERT INTO transcript (session_id, idx, entry, result_blob)
             SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::text[])",
            &[
                &prepared.id,
                &prepared.entry_idx,
                &prepared.entries,
                &prepared.entry_blobs,
            ],
        )
        .await
        .map_err(map_pg)?;
        tx.execute(
            "INSERT INTO events (session_id, seq, event)
             SELECT $1, * FROM unnest($2::bigint[], $3::text[])",
            &[&prepared.id, &prepared.event_seqs, &prepared.events],
        )
        .await
        .map_err(map_pg)?;
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

    // ---- reads -----------------------------------------------------------------------

    async fn read_session(&self, id: SessionId) -> Result<Option<StoredSession>, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT s.header, s.metadata,
                        ARRAY(SELECT t.idx FROM transcript t
                              WHERE t.session_id = s.id AND t.idx < s.transcript_len
                              ORDER BY t.idx),
                        ARRAY(SELECT t.entry FROM transcript t
                              WHERE t.session_id = s.id AND t.idx < s.transcript_len
                              ORDER BY t.idx),
                        ARRAY(SELECT b.data FROM transcript t
                              LEFT JOIN blobs b ON b.hash = t.result_blob
                              WHERE t.session_id = s.id AND t.idx < s.transcript_len
                              ORDER BY t.idx),
                        ARRAY(SELECT q.seq FROM queue q WHERE q.session_id = s.id ORDER BY q.seq),
                        ARRAY(SELECT q.message FROM queue q WHERE q.session_id = s.id ORDER BY q.seq)
                 FROM sessions s WHERE s.id = $1",
            )
            .await
            .map_err(map_pg)?;
        self.trip();
        let Some(row) = client
            .query_opt(&statement, &[&id.0])
            .await
            .map_err(map_pg)?
        else {
            return Ok(None);
        };
        let header_text: String = row.get(0);
        let header = codec::decode_header(&id, header_text.as_bytes())?;
        let metadata: Option<String> = row.get(1);
        let metadata = match metadata {
            Some(m) => serde_json::from_str(&m)
                .map_err(|e| corrupt(id, format!("unreadable metadata: {e}")))?,
            None => serde_json::Value::Null,
        };
        let idx: Vec<i64> = row.get(2);
        let entries: Vec<String> = row.get(3);
        let blobs: Vec<Option<String>> = row.get(4);
        let len = header.transcript_len;
        if idx.len() as u64 != len {
            return Err(corrupt(
                id,
                format!(
                    "the header counts {len} transcript entries but {} are stored",
                    idx.len()
                ),
            ));
        }
        let mut transcript = Vec::with_capacity(entries.len());
        for (i, ((n, entry), blob)) in idx.iter().zip(&entries).zip(blobs).enumerate() {
            if *n != i as i64 {
                return Err(corrupt(id, format!("transcript entry {i} is missing")));
            }
            transcript.push(codec::decode_entry(
                &id,
                i as u64,
                entry.as_bytes(),
                |_| Ok(blob.map(String::into_bytes)),
            )?);
        }
        let seqs: Vec<i64> = row.get(5);
        let messages: Vec<String> = row.get(6);
        let q = header.queue;
        let mut inbox: Vec<QueuedMessage> = Vec::new();
        for (seq, message) in seqs.iter().zip(&messages) {
            let seq = u64::try_from(*seq).unwrap_or(u64::MAX);
            if seq < q.head || seq >= q.next {
                continue; // taken off the queue (or never committed)
            }
            let expected = q.head + inbox.len() as u64;
            if seq != expected {
                return Err(corrupt(id, format!("queued message {expected} is missing")));
            }
            inbox.push(
                serde_json::from_str(message)
                    .map_err(|e| corrupt(id, format!("unreadable queued message {seq}: {e}")))?,
            );
        }
        if inbox.len() as u64 != q.len() {
            return Err(corrupt(
                id,
                format!(
                    "the header counts {} queued messages but {} are stored",
                    q.len(),
                    inbox.len()
                ),
            ));
        }
        Ok(Some(StoredSession {
            header,
            transcript,
            metadata,
            inbox,
            needs_rewrite: false,
        }))
    }

    async fn read_header(&self, id: SessionId) -> Result<Option<SessionHeader>, StoreError> {
        let client = self.client().await?;
        self.trip();
        let row = client
            .query_opt("SELECT header FROM sessions WHERE id = $1", &[&id.0])
            .await
            .map_err(map_pg)?;
        row.map(|r| {
            let text: String = r.get(0);
            codec::decode_header(&id, text.as_bytes())
        })
        .transpose()
    }

    /// Deletes a terminal session whole, in one transaction, so a purge cut
    /// short leaves nothing behind (the sled store needs a marker for that).
    ///
    /// Locks, in this order: the session's row (`FOR UPDATE`: a checkpoint
    /// of it waits, then finds nothing to update), its tree's lease row
    /// (`FOR SHARE`: a claim waits), the blobs it names (`FOR UPDATE`, in
    /// hash order). A checkpoint that stores a blob locks its row too
    /// (`ON CONFLICT DO UPDATE`), so a blob another session is taking up
    /// just now is either seen referenced here (that checkpoint committed
    /// first) or inserted again by it (this purge committed first): never
    /// deleted under a reference.
    ///
    /// In a cluster only the node owning the tree purges (or any node once
    /// the owner is dead): the owner knows whether an actor of the session
    /// still runs. Another live owner is [`StoreError::NotOwner`].
    async fn purge_once(&self, id: SessionId) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(map_pg)?;
        self.trip();
        let Some(row) = tx
            .query_opt(
                "SELECT header, root_id FROM sessions WHERE id = $1 FOR UPDATE",
                &[&id.0],
            )
            .await
            .map_err(map_pg)?
        else {
            return Ok(());
        };
        let text: String = row.get(0);
        let root: Uuid = row.get(1);
        let header = codec::decode_header(&id, text.as_bytes())?;
        if !header.status.is_terminal() {
            return Err(StoreError::NotTerminal {
                session: id,
                status: header.status,
            });
        }
        let owner = tx
            .query_opt(
                "SELECT n.url FROM leases l JOIN nodes n ON n.id = l.node_id
                 WHERE l.root_id = $1 AND l.node_id <> $2
                   AND n.heartbeat_at > now() - make_interval(secs => $3)
                 FOR SHARE OF l",
                &[
                    &root,
                    &self.inner.node,
                    &self.inner.options.lease.as_secs_f64(),
                ],
            )
            .await
            .map_err(map_pg)?;
        if let Some(owner) = owner {
            let url: String = owner.get(0);
            return Err(StoreError::NotOwner {
                session: id,
                reason: format!("node {url} holds its lease; it purges the session"),
            });
        }
        let hashes: Vec<String> = tx
            .query(
                "SELECT hash FROM blobs WHERE hash IN (
                     SELECT result_blob FROM transcript
                     WHERE session_id = $1 AND result_blob IS NOT NULL)
                 ORDER BY hash FOR UPDATE",
                &[&id.0],
            )
            .await
            .map_err(map_pg)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for sql in [
            "DELETE FROM sessions WHERE id = $1",
            "DELETE FROM transcript WHERE session_id = $1",
            "DELETE FROM events WHERE session_id = $1",
            "DELETE FROM queue WHERE session_id = $1",
            "DELETE FROM decisions WHERE session_id = $1",
            // Its webhook deliveries (a log bounded per endpoint: no index).
            "DELETE FROM webhook_deliveries WHERE session_id = $1",
        ] {
            tx.execute(sql, &[&id.0]).await.map_err(map_pg)?;
        }
        if !hashes.is_empty() {
            // A new snapshot (read committed): sees every reference
            // committed before the locks above were granted.
            tx.execute(
                "DELETE FROM blobs b WHERE b.hash = ANY($1)
                   AND NOT EXISTS (SELECT 1 FROM transcript t WHERE t.result_blob = b.hash)",
                &[&hashes],
            )
            .await
            .map_err(map_pg)?;
        }
        // A tree whose last session is gone has no lease to keep.
        let released = tx
            .execute(
                "DELETE FROM leases l WHERE l.root_id = $1
               AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.root_id = $1)",
                &[&root],
            )
            .await
            .map_err(map_pg)?;
        tx.commit().await.map_err(map_pg)?;
        if released > 0 {
            self.inner.leases.remove(&session_id(root));
            self.publish_owned();
        }
        Ok(())
    }

    fn headers(rows: &[tokio_postgres::Row]) -> Result<Vec<SessionSummary>, StoreError> {
        rows.iter()
            .map(|r| {
                let id = session_id(r.get(0));
                let text: String = r.get(1);
                codec::decode_header(&id, text.as_bytes())
            })
            .collect()
    }
}

/// One checkpoint, encoded into the parameters of its statement.
#[derive(Debug)]
pub(crate) struct Prepared {
    id: Uuid,
    root: Uuid,
    parent: Option<Uuid>,
    tenant: String,
    status: String,
    schema_version: i32,
    last_event_seq: i64,
    transcript_len: i64,
    header: String,
    metadata: Option<String>,
    entry_idx: Vec<i64>,
    entries: Vec<String>,
    entry_blobs: Vec<Option<String>>,
    blob_hashes: Vec<String>,
    blob_data: Vec<String>,
    event_seqs: Vec<i64>,
    events: Vec<String>,
    queue_seqs: Vec<i64>,
    queued: Vec<String>,
    dequeue_from: i64,
    dequeue_to: i64,
    /// The session's agent (the decision rows' column).
    agent: String,
    /// The decision index's rows this checkpoint adds: time, call, tool,
    /// decider, row JSON (see `overseer_actors::store::decision_rows`).
    decision_at: Vec<i64>,
    decision_calls: Vec<String>,
    decision_tools: Vec<String>,
    decision_by: Vec<Option<String>>,
    decision_rows: Vec<String>,
    /// The epoch the write is conditional on (`None` only for imports).
    epoch: Option<i64>,
    /// The node writing (set by the writer).
    node: Option<Uuid>,
    /// First and last new event, to announce them.
    new_events: Option<(u64, u64)>,
    /// Webhook seeds of its events: `webhook-id`s, event types, seed JSON.
    hook_ids: Vec<String>,
    hook_events: Vec<String>,
    hook_seeds: Vec<String>,
    /// When its deliveries are queued (and first due), ms since the epoch.
    hook_now_ms: i64,
}

impl Prepared {
    /// Bytes of encoded rows this checkpoint writes (for the bytes metric).
    fn size(&self) -> u64 {
        let rows = |v: &[String]| v.iter().map(String::len).sum::<usize>();
        (self.header.len()
            + self.metadata.as_ref().map_or(0, String::len)
            + rows(&self.entries)
            + rows(&self.blob_data)
            + rows(&self.events)
            + rows(&self.queued)
            + rows(&self.decision_rows)) as u64
    }
}

fn utf8(id: &SessionId, bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|e| corrupt(id, format!("encoded JSON is not UTF-8: {e}")))
}

/// Encodes a checkpoint (pure: no I/O). Only what is new is encoded.
fn prepare(cp: &Checkpoint, epoch: Option<i64>) -> Result<Prepared, StoreError> {
    let h = &cp.header;
    let id = h.id;
    let header =
        serde_json::to_string(h).map_err(|e| corrupt(id, format!("cannot encode header: {e}")))?;
    let mut new_blobs = Vec::new();
    let mut entry_idx = Vec::with_capacity(cp.entries.len());
    let mut entries = Vec::with_capacity(cp.entries.len());
    let mut entry_blobs = Vec::with_capacity(cp.entries.len());
    for (idx, entry) in &cp.entries {
        let before = new_blobs.len();
        let value = codec::encode_entry(&id, entry, &mut new_blobs)?;
        entry_idx.push(signed(*idx));
        entries.push(utf8(&id, value)?);
        entry_blobs.push(if new_blobs.len() > before {
            new_blobs
                .last()
                .map(|(hash, _): &(String, Vec<u8>)| hash.clone())
        } else {
            None
        });
    }
    let mut blob_hashes = Vec::with_capacity(new_blobs.len());
    let mut blob_data = Vec::with_capacity(new_blobs.len());
    for (hash, data) in new_blobs {
        if blob_hashes.contains(&hash) {
            continue;
        }
        blob_hashes.push(hash);
        blob_data.push(utf8(&id, data)?);
    }
    let mut event_seqs = Vec::with_capacity(cp.events.len());
    let mut events = Vec::with_capacity(cp.events.len());
    for e in cp.events.iter() {
        event_seqs.push(signed(e.seq));
        events.push(
            serde_json::to_string(e)
                .map_err(|err| corrupt(id, format!("cannot encode event {}: {err}", e.seq)))?,
        );
    }
    let mut queue_seqs = Vec::with_capacity(cp.queued.len());
    let mut queued = Vec::with_capacity(cp.queued.len());
    for (seq, m) in &cp.queued {
        queue_seqs.push(signed(*seq));
        queued.push(
            serde_json::to_string(m)
                .map_err(|e| corrupt(id, format!("cannot encode queued message {seq}: {e}")))?,
        );
    }
    let metadata = cp
        .metadata
        .as_ref()
        .map(|m| {
            serde_json::to_string(m)
                .map_err(|e| corrupt(id, format!("cannot encode metadata: {e}")))
        })
        .transpose()?;
    let decisions = decision_rows(cp);
    let mut decision_json = Vec::with_capacity(decisions.len());
    for row in &decisions {
        decision_json.push(serde_json::to_string(row).map_err(|e| {
            corrupt(
                id,
                format!("cannot encode the decision of {}: {e}", row.call_id),
            )
        })?);
    }
    let new_events = match (cp.events.first(), cp.events.last()) {
        (Some(a), Some(b)) => Some((a.seq, b.seq)),
        _ => None,
    };
    Ok(Prepared {
        id: id.0,
        root: h.root_id.0,
        parent: h.parent.as_ref().map(|p| p.session_id.0),
        tenant: h.tenant.clone(),
        status: h.status.as_str().to_owned(),
        schema_version: i32::try_from(h.schema_version).unwrap_or(i32::MAX),
        last_event_seq: signed(h.last_event_seq),
        transcript_len: signed(h.transcript_len),
        header,
        metadata,
        entry_idx,
        entries,
        entry_blobs,
        blob_hashes,
        blob_data,
        event_seqs,
        events,
        queue_seqs,
        queued,
        dequeue_from: signed(cp.dequeued.start),
        dequeue_to: signed(cp.dequeued.end),
        agent: h.agent.clone(),
        decision_at: decisions.iter().map(|r| r.at_ms).collect(),
        decision_calls: decisions.iter().map(|r| r.call_id.0.clone()).collect(),
        decision_tools: decisions.iter().map(|r| r.tool.clone()).collect(),
        decision_by: decisions.iter().map(|r| r.by.clone()).collect(),
        decision_rows: decision_json,
        epoch,
        node: None,
        new_events,
        hook_ids: Vec::new(),
        hook_events: Vec::new(),
        hook_seeds: Vec::new(),
        hook_now_ms: 0,
    })
}

#[async_trait::async_trait]
impl CheckpointStore for PgStore {
    async fn checkpoint(&self, checkpoint: Checkpoint) -> Result<(), StoreError> {
        let id = checkpoint.header.id;
        let root = checkpoint.header.root_id;
        let epoch = self.fence(root, id)?;
        // The events that go out as webhooks, whoever listens: the statement
        // joins them with the endpoints table (see `writer`).
        let hooks = self.inner.webhooks.get();
        let seeds = match hooks {
            Some(_) => crate::webhooks::seeds(&checkpoint),
            None => Vec::new(),
        };
        let prepared = if codec::may_be_large(&checkpoint) {
            tokio::task::spawn_blocking(move || prepare(&checkpoint, Some(epoch)))
                .await
                .map_err(|e| StoreError::Io(format!("encoding the checkpoint of {id}: {e}")))??
        } else {
            prepare(&checkpoint, Some(epoch))?
        };
        let mut prepared = prepared;
        webhooks::add_seeds(&mut prepared, &seeds)?;
        let bytes = prepared.size();
        let wrote_hooks = !prepared.hook_ids.is_empty();
        match self.inner.writer.submit(prepared, self.inner.node).await? {
            true => {
                overseer_actors::metrics::record_checkpoint_bytes(bytes);
                if let (true, Some(hooks)) = (wrote_hooks, hooks) {
                    hooks.written();
                }
                Ok(())
            }
            false => {
                self.lost(root, epoch);
                Err(StoreError::NotOwner {
                    session: id,
                    reason: "another node took over its tree (a newer lease epoch)".into(),
                })
            }
        }
    }

    async fn load(&self, id: SessionId) -> Result<Option<StoredSession>, StoreError> {
        retrying(READ_RETRY, || self.read_session(id)).await
    }

    async fn load_header(&self, id: SessionId) -> Result<Option<SessionHeader>, StoreError> {
        retrying(READ_RETRY, || self.read_header(id)).await
    }

    async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            let statement = client
                .prepare_cached(
                    "SELECT e.event FROM events e
                     WHERE e.session_id = $1 AND e.seq > $2
                       AND e.seq <= (SELECT s.last_event_seq FROM sessions s WHERE s.id = $1)
                     ORDER BY e.seq LIMIT $3",
                )
                .await
                .map_err(map_pg)?;
            self.trip();
            client
                .query(&statement, &[&id.0, &signed(after), &signed(limit as u64)])
                .await
                .map_err(map_pg)
        })
        .await?;
        rows.iter()
            .map(|r| {
                let text: &str = r.get(0);
                serde_json::from_str(text)
                    .map_err(|e| corrupt(id, format!("unreadable event: {e}")))
            })
            .collect()
    }

    async fn list_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let names: Vec<String> = statuses.iter().map(|s| s.as_str().to_owned()).collect();
        let after = after.map(|a| a.0);
        let limit = signed(limit as u64);
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            if names.is_empty() {
                client
                    .query(
                        "SELECT id, header FROM sessions
                         WHERE ($1::uuid IS NULL OR id > $1)
                         ORDER BY id LIMIT $2",
                        &[&after, &limit],
                    )
                    .await
            } else {
                client
                    .query(
                        "SELECT id, header FROM sessions
                         WHERE status = ANY($1) AND ($2::uuid IS NULL OR id > $2)
                         ORDER BY id LIMIT $3",
                        &[&names, &after, &limit],
                    )
                    .await
            }
            .map_err(map_pg)
        })
        .await?;
        Self::headers(&rows)
    }

    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let after = after.map(|a| a.0);
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            client
                .query(
                    "SELECT id, header FROM sessions
                     WHERE tenant = $1 AND ($2::uuid IS NULL OR id > $2)
                     ORDER BY id LIMIT $3",
                    &[&tenant, &after, &signed(limit as u64)],
                )
                .await
                .map_err(map_pg)
        })
        .await?;
        Self::headers(&rows)
    }

    async fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let after = after.map(|a| a.0);
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            self.trip();
            client
                .query(
                    "SELECT id, header FROM sessions
                     WHERE ($1::uuid IS NULL OR id > $1)
                     ORDER BY id LIMIT $2",
                    &[&after, &signed(limit as u64)],
                )
                .await
                .map_err(map_pg)
        })
        .await?;
        Self::headers(&rows)
    }

    /// One transaction (see [`PgStore::purge_once`]), retried across
    /// transient failures: it is all or nothing, so running it again is
    /// safe.
    async fn purge(&self, id: SessionId) -> Result<(), StoreError> {
        retrying(READ_RETRY, || self.purge_once(id)).await
    }

    /// Every checkpoint is committed before it is confirmed: nothing to do.
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// One indexed query (the primary key's order); one row more than the
    /// page says whether another page follows.
    async fn decisions(
        &self,
        tenant: &str,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        let limit = query.limit.max(1);
        let before = query.before.as_ref();
        let at = before.map(|p| p.at_ms);
        let session = before.map(|p| p.session_id.0);
        let call = before.map(|p| p.call_id.0.clone());
        // Two statements rather than `$2 IS NULL OR …`, so that a later
        // page's position is a range of the primary key, not a filter.
        let sql = if before.is_some() {
            r#"SELECT row_json FROM decisions
               WHERE tenant = $1
                 AND (at_ms, session_id, call_id) < ($2::bigint, $3::uuid, $4::text COLLATE "C")
                 AND ($5::text IS NULL OR agent = $5)
                 AND ($6::text IS NULL OR tool = $6)
                 AND ($7::text IS NULL OR decided_by = $7)
               ORDER BY at_ms DESC, session_id DESC, call_id DESC
               LIMIT $8"#
        } else {
            r#"SELECT row_json FROM decisions
               WHERE tenant = $1
                 AND ($2::bigint IS NULL AND $3::uuid IS NULL AND $4::text IS NULL)
                 AND ($5::text IS NULL OR agent = $5)
                 AND ($6::text IS NULL OR tool = $6)
                 AND ($7::text IS NULL OR decided_by = $7)
               ORDER BY at_ms DESC, session_id DESC, call_id DESC
               LIMIT $8"#
        };
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            let statement = client.prepare_cached(sql).await.map_err(map_pg)?;
            self.trip();
            client
                .query(
                    &statement,
                    &[
                        &tenant,
                        &at,
                        &session,
                        &call,
                        &query.agent,
                        &query.tool,
                        &query.by,
                        &signed(limit as u64 + 1),
                    ],
                )
                .await
                .map_err(map_pg)
        })
        .await?;
        let mut page = Vec::with_capacity(rows.len().min(limit));
        for r in rows.iter().take(limit) {
            let text: &str = r.get(0);
            let row: DecisionRow = serde_json::from_str(text)
                .map_err(|e| corrupt("decisions", format!("unreadable row: {e}")))?;
            page.push(row);
        }
        let next = if rows.len() > limit {
            page.last().map(DecisionRow::position)
        } else {
            None
        };
        Ok(DecisionPage { rows: page, next })
    }

    async fn entries(
        &self,
        id: SessionId,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        if range.start >= range.end {
            return Ok(Vec::new());
        }
        let (from, to) = (signed(range.start), signed(range.end));
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            let statement = client
                .prepare_cached(
                    "SELECT t.idx, t.entry, b.data FROM transcript t
                     LEFT JOIN blobs b ON b.hash = t.result_blob
                     WHERE t.session_id = $1 AND t.idx >= $2 AND t.idx < $3
                       AND t.idx < (SELECT s.transcript_len FROM sessions s WHERE s.id = $1)
                     ORDER BY t.idx",
                )
                .await
                .map_err(map_pg)?;
            self.trip();
            client
                .query(&statement, &[&id.0, &from, &to])
                .await
                .map_err(map_pg)
        })
        .await?;
        rows.into_iter()
            .map(|r| {
                let idx: i64 = r.get(0);
                let entry: String = r.get(1);
                let blob: Option<String> = r.get(2);
                codec::decode_entry(
                    &id,
                    u64::try_from(idx).unwrap_or(0),
                    entry.as_bytes(),
                    |_| Ok(blob.map(String::into_bytes)),
                )
            })
            .collect()
    }

    /// A round trip to the database, within the lease.
    async fn health_check(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.execute("SELECT 1", &[]).await.map_err(map_pg)?;
        Ok(())
    }

    async fn claim(&self, root: SessionId) -> Result<bool, StoreError> {
        if !self.inner.clock.valid() {
            return Err(StoreError::NotOwner {
                session: root,
                reason: "this node's lease has run out (no recent heartbeat)".into(),
            });
        }
        if self.inner.leases.contains_key(&root) {
            return Ok(false);
        }
        let lease = self.inner.options.lease.as_secs_f64();
        let row = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            let statement = client
                .prepare_cached(
                    "INSERT INTO leases AS l (root_id, node_id, epoch) VALUES ($1, $2, 1)
                     ON CONFLICT (root_id) DO UPDATE
                       SET node_id = EXCLUDED.node_id, epoch = l.epoch + 1, claimed_at = now()
                       WHERE l.node_id IS NULL OR l.node_id = $2 OR NOT EXISTS (
                         SELECT 1 FROM nodes n WHERE n.id = l.node_id
                           AND n.heartbeat_at > now() - make_interval(secs => $3))
                     RETURNING epoch, (xmax = 0)",
                )
                .await
                .map_err(map_pg)?;
            self.trip();
            client
                .query_opt(&statement, &[&root.0, &self.inner.node, &lease])
                .await
                .map_err(map_pg)
        })
        .await?;
        match row {
            Some(r) => {
                let epoch: i64 = r.get(0);
                let created: bool = r.get(1);
                self.hold(root, epoch);
                let reason = if created { "create" } else { "activate" };
                metrics::counter!(overseer_actors::metrics::CLUSTER_CLAIMS_TOTAL, "reason" => reason)
                    .increment(1);
                Ok(true)
            }
            None => {
                let owner = match self.owner(root).await? {
                    Owner::Node { url, .. } => format!("node {url} holds its lease"),
                    _ => "another node took its lease just now".into(),
                };
                Err(StoreError::NotOwner {
                    session: root,
                    reason: owner,
                })
            }
        }
    }
}
