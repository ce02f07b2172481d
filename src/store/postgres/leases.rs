//! Ownership of session trees on PostgreSQL: the `leases` rows and their
//! fencing epochs, the leases this node holds in memory, claiming one tree
//! or many (failover), who owns a tree, the orphans a failover round takes,
//! and the check every checkpoint passes before it is written ([`PgStore`]'s
//! `fence`; the database's half is the checkpoint statement's `FOR SHARE`
//! of the lease row, in `writer`).
//!
//! It owns no membership (`membership`: heartbeats decide who is alive) and
//! no failover policy (`crate::cluster::failover`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use overseer_actors::model::SessionId;
use overseer_actors::store::StoreError;
use uuid::Uuid;

use super::{map_pg, retrying, session_id, signed, PgStore, READ_RETRY};

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

/// A lease this node holds: the epoch its checkpoints are conditional on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lease {
    pub(super) epoch: i64,
    pub(super) since: Instant,
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

impl PgStore {
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

    pub(super) fn publish_owned(&self) {
        metrics::gauge!(overseer_actors::metrics::CLUSTER_SESSIONS_OWNED)
            .set(self.inner.leases.len() as f64);
    }

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
                 WHERE s.active
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

    /// Active roots whose lease names this node and that `unheld` says it
    /// does not hold now (no actor of theirs is live here: after it dropped
    /// its leases, or let a tree go as its lease lapsed): it takes them
    /// again.
    pub async fn own_unheld_roots(
        &self,
        limit: usize,
        unheld: impl Fn(SessionId) -> bool,
    ) -> Result<Vec<SessionId>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT s.id FROM leases l JOIN sessions s ON s.id = l.root_id
                 WHERE l.node_id = $1 AND s.active",
                &[&self.inner.node],
            )
            .await
            .map_err(map_pg)?;
        Ok(rows
            .iter()
            .map(|r| session_id(r.get(0)))
            .filter(|id| unheld(*id))
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

    pub(super) fn hold(&self, root: SessionId, epoch: i64) {
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
    pub(super) fn fence(&self, root: SessionId, session: SessionId) -> Result<i64, StoreError> {
        if self.lease_lapsed() {
            metrics::counter!(overseer_actors::metrics::CLUSTER_FENCED_WRITES_TOTAL, "by" => "node")
                .increment(1);
            self.owe_take_back();
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
                // An actor running a tree this node holds no lease of: one
                // that started while its leases were being dropped (a
                // restart's read or an activation in flight when the lease
                // lapsed). It fails as not owned, and the take-back that ran
                // meanwhile skipped it as live; but its lease row may still
                // name this node, and then no other node will ever take it.
                // So a take-back is owed again, as for a lapse.
                self.owe_take_back();
                Err(StoreError::NotOwner {
                    session,
                    reason: "this node holds no lease on its tree".into(),
                })
            }
        }
    }

    /// A write or claim of a tree was refused because this node's own lease
    /// lapsed, or because this node holds no lease of the tree in memory
    /// (see `fence`): the tree is let go (its actor fails as not owned and
    /// is not restarted), though its lease row may still name this node and
    /// no other node may ever take it (this node is alive again once it
    /// heartbeats). The flag tells the failover to take this node's own
    /// sessions back ([`PgStore::own_unheld_roots`]), even when the lapse
    /// was too short for the heartbeat loop to notice and drop everything.
    /// The lease itself is kept: once the node heartbeats again, nobody
    /// having taken it, the tree's writes land again.
    pub(super) fn owe_take_back(&self) {
        self.inner.let_go.store(true, Ordering::Release);
    }

    /// Whether a tree was let go because this node's lease lapsed since the
    /// last call (see `owe_take_back`); clears it.
    pub fn take_let_go(&self) -> bool {
        self.inner.let_go.swap(false, Ordering::AcqRel)
    }

    /// A checkpoint found another epoch: the tree is another node's now.
    pub(super) fn lost(&self, root: SessionId, epoch: i64) {
        self.inner.leases.remove_if(&root, |_, l| l.epoch == epoch);
        self.publish_owned();
        metrics::counter!(overseer_actors::metrics::CLUSTER_FENCED_WRITES_TOTAL, "by" => "database")
            .increment(1);
    }
}
