//! The PostgreSQL checkpoint store of cluster mode: [`PgStore`], the
//! same [`CheckpointStore`] contract as the sled store, shared by every node
//! of a cluster.
//!
//! It owns the SQL, a file per concept: the schema and its embedded
//! migrations (`schema`), a checkpoint's encoding (`prepare`), one
//! transaction and one statement per group of checkpoints (`writer`: group
//! commit), the reads (`read`), retention (`purge`), `store copy`'s
//! writes (`import`), the rows of cluster membership (`membership`: `nodes`,
//! heartbeats) and ownership (`leases`: claims and fencing; `claims`: the
//! claims of single trees made together, taken by one statement) with the
//! conditional updates that move them, the webhook outbox (`webhooks`), and
//! what a failure is retried as (`retry`). This file holds the store itself:
//! opening it and the port's methods. The sled store's guarantees carry
//! over:
//!
//! - **One atomic write per checkpoint, of what changed only**: the header
//!   row, one `checkpoints` row holding the new transcript entries and
//!   events as one record (layout 3, `crate::store::record`; migration 6
//!   moved layout 2's row per entry and per event into it), queued
//!   messages, the dequeued range, the metadata once, in one transaction
//!   (data-modifying CTEs, every row conditional on its header row's
//!   write); checkpoints arriving together share the transaction and the
//!   statement (one multi-row write per kind of row), so one commit (one
//!   WAL flush) confirms them all. Atomicity is PostgreSQL's
//!   transaction: readers need no commit record and filter nothing.
//! - **Fencing**: every checkpoint statement writes only if the tree's
//!   lease row still names this node with the epoch this node claimed
//!   (`FOR SHARE`, so a concurrent claim waits for it or makes it write
//!   nothing). A write that finds another epoch lands nothing, and the
//!   caller gets [`StoreError::NotOwner`]. Before that, a node whose own
//!   lease (its heartbeat) ran out by its own clock refuses to write at all.
//! - Blobs over 64 KiB, content-addressed, shared; `schema_version` refused
//!   when newer (per header, read or written over, and for the whole
//!   database at open: a binary older than a migration refuses in one
//!   line, [`PgOpenError::SchemaTooNew`]); the effect
//!   journal lives in the header's open calls, as with sled.
//! - `durability = "os"` maps to `synchronous_commit = off`.
//! - **Retention**: `scan` walks the sessions by id; `purge` deletes a
//!   terminal session whole in one transaction (nothing half-purged to
//!   finish later, unlike sled), with the blobs no other transcript row
//!   names, its configuration if no other session names it, and the lease
//!   of a tree left empty.
//! - **Interned configurations** (migration 7): each distinct agent
//!   configuration is one `configs` row, by content hash; a header names
//!   its configuration by hash (`crate::store::configs`), inserted in the
//!   checkpoint's statement when its session takes it up, and joined back
//!   by every read. Only the owner of a live
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

mod claims;
mod import;
mod leases;
mod membership;
mod prepare;
mod purge;
mod read;
mod retry;
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
use std::time::Duration;

use dashmap::DashMap;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use overseer_actors::model::{
    Event, SessionHeader, SessionId, SessionIdHasher, SessionStatus, TranscriptEntry,
};
use overseer_actors::store::{
    Checkpoint, CheckpointStore, DecisionPage, DecisionQuery, SessionSummary, StoreError,
    StoredSession,
};
use tokio_postgres::NoTls;
use uuid::Uuid;

use super::codec;
use super::Durability;
use leases::Lease;
pub use leases::{Orphan, Owner, RoundView};
use membership::NodeClock;
pub use membership::{NodeStatus, UrlTaken};
use prepare::{prepare, Prepared};
pub(crate) use retry::map_pg;
use retry::{map_pool, retrying, transient};
use writer::{Outcome, Writer};

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
    /// Claims of single trees waiting to be taken together (`claims`).
    claims: claims::ClaimQueue,
    /// Set when a write or claim was refused because this node's own lease
    /// had lapsed (the tree it was for is let go, whether or not the
    /// heartbeat loop noticed the lapse): the node takes back its own
    /// sessions once it heartbeats again (`crate::cluster`'s failover).
    let_go: std::sync::atomic::AtomicBool,
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
    /// The configurations headers read so far name (`store::configs`).
    decoded_configs: crate::store::configs::DecodedConfigs,
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
                claims: Default::default(),
                let_go: std::sync::atomic::AtomicBool::new(false),
                clock: NodeClock::new(),
                writer,
                heartbeat_conn: std::sync::Mutex::new(None),
                round_trips,
                webhooks: std::sync::OnceLock::new(),
                decoded_configs: Default::default(),
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
}

#[async_trait::async_trait]
impl CheckpointStore for PgStore {
    /// Every read is a round trip to the database.
    fn reads_are_local(&self) -> bool {
        false
    }

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
                .map_err(|e| StoreError::io(format!("encoding the checkpoint of {id}"), e))??
        } else {
            prepare(&checkpoint, Some(epoch))?
        };
        let mut prepared = prepared;
        webhooks::add_seeds(&mut prepared, &seeds)?;
        let bytes = prepared.size();
        let wrote_hooks = !prepared.hook_ids.is_empty();
        match self.inner.writer.submit(prepared, self.inner.node).await? {
            Outcome::Landed => {
                overseer_actors::metrics::record_checkpoint_bytes(bytes);
                if let (true, Some(hooks)) = (wrote_hooks, hooks) {
                    hooks.written();
                }
                Ok(())
            }
            Outcome::TooNew(found) => Err(StoreError::SchemaTooNew {
                session: id,
                found,
                supported: overseer_actors::model::SCHEMA_VERSION,
            }),
            Outcome::Fenced => {
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
        self.read_events(id, after, limit).await
    }

    async fn list_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.read_by_status(statuses, after, limit).await
    }

    async fn list_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.read_tenant(tenant, after, limit).await
    }

    async fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        self.read_scan(after, limit).await
    }

    async fn stored_configs(&self) -> Result<usize, StoreError> {
        retrying(READ_RETRY, || async {
            let client = self.client().await?;
            let row = client
                .query_one("SELECT count(*) FROM configs", &[])
                .await
                .map_err(map_pg)?;
            Ok(usize::try_from(row.get::<_, i64>(0)).unwrap_or(usize::MAX))
        })
        .await
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
        self.read_decisions(tenant, query).await
    }

    async fn entries(
        &self,
        id: SessionId,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        self.read_entries(id, range).await
    }

    /// A round trip to the database, within the lease.
    async fn health_check(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.execute("SELECT 1", &[]).await.map_err(map_pg)?;
        Ok(())
    }

    async fn claim(&self, root: SessionId) -> Result<bool, StoreError> {
        self.claim_root(root).await
    }
}
