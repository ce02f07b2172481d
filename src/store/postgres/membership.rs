//! Cluster membership on PostgreSQL: the `nodes` rows, joining (a URL a
//! live node advertises is refused), the heartbeat on a connection of its
//! own, leaving, pruning dead nodes, the shared node secret and
//! `cluster status`; and this node's own clock of its membership lease
//! ([`NodeClock`]), by which it stops writing before others may see it dead.
//!
//! It owns no lease of a tree (`leases`) and no cadence: `crate::cluster`
//! decides when to beat and prune.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use overseer_actors::store::StoreError;
use tokio_postgres::NoTls;
use uuid::Uuid;

use super::{map_pg, transient, PgStore, HEARTBEAT_APPLICATION};

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

/// This node's own view of its membership lease: until when, by its own
/// monotonic clock, it may act on the leases it holds.
pub(super) struct NodeClock {
    base: Instant,
    /// Milliseconds after `base`; 0 = not valid (never joined, or lapsed).
    valid_until_ms: AtomicU64,
}

impl NodeClock {
    pub(super) fn new() -> Self {
        Self {
            base: Instant::now(),
            valid_until_ms: AtomicU64::new(0),
        }
    }

    pub(super) fn valid(&self) -> bool {
        let now = self.base.elapsed().as_millis() as u64;
        now < self.valid_until_ms.load(Ordering::Acquire)
    }

    pub(super) fn extend_to(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.base).as_millis() as u64;
        self.valid_until_ms.store(ms, Ordering::Release);
    }

    pub(super) fn expire(&self) {
        self.valid_until_ms.store(0, Ordering::Release);
    }
}

impl PgStore {
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
                            AND s.active)
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
}
