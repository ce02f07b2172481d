//! Cluster mode: many `overseer serve` nodes over one PostgreSQL
//! database. [`Cluster`] is one node's membership in it.
//!
//! It owns the behaviour of a node among others, over the rows the
//! PostgreSQL store keeps (`crate::store::postgres`):
//!
//! - **Membership**: a node joins only if no live node already advertises
//!   its URL (two nodes behind one URL would forward each other's requests
//!   to one of them for ever): it refuses to start, in one line, once it has
//!   seen that node heartbeat again; a crashed node's row, whose heartbeats
//!   stopped, is waited out instead (at most the lease), so a node restarted
//!   on its old address joins. Then a heartbeat every `heartbeat_secs`, on a
//!   database connection of its own (a pool busy with checkpoints never
//!   delays it, and nothing else in its loop waits on the pool); a node
//!   whose heartbeat is older than `lease_secs` is dead, is listed as dead
//!   by `overseer cluster status`, and its row is pruned by the live nodes
//!   after `dead_node_retention_secs`. A node stops acting on its leases
//!   before that by its own clock: when its last successful heartbeat is too
//!   old (paused, partitioned, database unreachable) it forgets every lease
//!   and drops every session actor at once, writing nothing; the store
//!   already refuses its writes from that moment. Once it heartbeats again it
//!   takes back whatever is still its own.
//! - **Failover** (`failover`): each node looks for active root sessions
//!   (running, awaiting approval) whose owner is dead or that nobody owns,
//!   takes its share of them (`rendezvous`: each root goes to the live node
//!   that hashes highest with it, so survivors split a dead node's sessions
//!   evenly without talking to each other) in one conditional statement per
//!   page (a new epoch each, so whatever the old owner still tries to write
//!   is refused), activates them a bounded number at a time, and logs one
//!   line per dead node it took from. A root left unclaimed by the node it
//!   hashes to (busy, or dying too) is taken by anyone after a few rounds.
//!   Activation re-arms approval timers and sorts in-flight tool calls per
//!   `on_interrupt`, as after a restart.
//! - **Routing** (`crate::http`'s routing layer, built here): every API
//!   request about a session goes to the node that owns it, over the nodes'
//!   own HTTP API with a node credential, within a deadline below the lease
//!   and behind a breaker per owner; a session with no live owner is served
//!   (and so claimed) by the node that received the request. Event streams
//!   are served by any node.
//! - **Relay** (`relay`): events another node checkpointed reach this
//!   node's event streams through `LISTEN`/`NOTIFY`.
//!
//! It deliberately owns no SQL and no session logic: the store owns the
//! rows, the actor tree owns the sessions (`overseer_actors::ownership` for
//! what the tree does when a session is not its to write).

mod failover;
mod relay;
mod rendezvous;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use overseer_actors::Overseer;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::http::{ForwardOptions, Routing};
use crate::store::postgres::{PgStore, UrlTaken};

/// How a node takes part.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The URL other nodes reach this node's API at.
    pub advertise_url: String,
    /// Seconds between heartbeats.
    pub heartbeat: Duration,
    /// Sessions activated at once when taking over.
    pub failover_concurrency: usize,
    /// How long a forwarded request may take (the owner's own call timeout
    /// plus a margin); capped below the lease (`crate::http::forward_deadline`).
    pub forward_timeout: Duration,
    /// Most requests forwarded to owners at once (apart from the budget of
    /// local work).
    pub max_in_flight_forwards: usize,
    /// How long a dead node's row is kept (listed as dead) before the live
    /// nodes prune it.
    pub dead_node_retention: Duration,
    /// Extra trusted CA certificates (PEM) for other nodes' `https://` URLs.
    pub ca_bundle: Option<Vec<u8>>,
    /// Forward over plain HTTP to non-loopback nodes too.
    pub allow_plain_http: bool,
}

impl ClusterOptions {
    /// Options with the defaults of `[cluster]` but the URL.
    pub fn new(advertise_url: impl Into<String>) -> Self {
        Self {
            advertise_url: advertise_url.into(),
            heartbeat: Duration::from_secs(2),
            failover_concurrency: 32,
            forward_timeout: Duration::from_secs(35),
            max_in_flight_forwards: 128,
            dead_node_retention: Duration::from_secs(3_600),
            ca_bundle: None,
            allow_plain_http: false,
        }
    }
}

/// Why a node could not join.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The first heartbeat failed.
    #[error("cannot join the cluster: {0}")]
    Join(String),
    /// A live node already advertises this node's URL.
    #[error("cannot join the cluster: node {node} is alive and already advertises {url} (its last heartbeat {age:.1} s ago); give each node its own cluster.advertise_url")]
    UrlTaken {
        /// The URL.
        url: String,
        /// The node that has it.
        node: Uuid,
        /// Seconds since that node's last heartbeat.
        age: f64,
    },
}

/// One node's membership. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    store: PgStore,
    overseer: Overseer,
    options: ClusterOptions,
    /// Set while the node has dropped its leases and not yet resumed.
    suspended: AtomicBool,
    /// Set while the node owes its own sessions a take-back: from its
    /// resumption after a lapse (or after the store let a tree go because
    /// the lease had lapsed, `PgStore::take_let_go`) until one round took
    /// every one of them back. A take-back that fails part-way (the
    /// database still coming up, an activation refused) is retried in the
    /// next round instead of leaving those sessions with nobody to resume
    /// them: their lease names this node, which is alive, so no other node
    /// takes them over.
    take_back: AtomicBool,
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
    routing: Routing,
    /// Failover rounds each claimable root was left to the node it hashes
    /// to (`failover`).
    patience: std::sync::Mutex<failover::Patience>,
}

impl Cluster {
    /// Joins: the first heartbeat (which must succeed, and is refused while
    /// a live node advertises the same URL), then the heartbeat, failover and
    /// relay tasks. Failover runs at once, so a node starting after a crash
    /// takes over what nobody owns before it serves.
    pub async fn join(
        store: PgStore,
        overseer: Overseer,
        options: ClusterOptions,
    ) -> Result<Self, ClusterError> {
        join_with_unique_url(&store, &options).await?;
        store
            .heartbeat(
                &options.advertise_url,
                options.heartbeat.max(Duration::from_secs(5)),
            )
            .await
            .map_err(|e| ClusterError::Join(e.to_string()))?;
        let secret = store
            .node_secret()
            .await
            .map_err(|e| ClusterError::Join(e.to_string()))?;
        let routing = Routing::new(
            store.clone(),
            overseer.clone(),
            secret.as_bytes(),
            ForwardOptions {
                deadline: options.forward_timeout,
                max_in_flight: options.max_in_flight_forwards,
                cooldown: options.heartbeat,
                ca_bundle: options.ca_bundle.clone(),
                allow_plain_http: options.allow_plain_http,
            },
        )
        .map_err(ClusterError::Join)?;
        metrics::counter!(overseer_actors::metrics::CLUSTER_CLAIMS_TOTAL).increment(0);
        for by in ["node", "database"] {
            metrics::counter!(overseer_actors::metrics::CLUSTER_FENCED_WRITES_TOTAL, "by" => by)
                .increment(0);
        }
        metrics::gauge!(overseer_actors::metrics::CLUSTER_SESSIONS_OWNED).set(0.0);
        // Listening before serving: a stream opened on this node must not
        // miss what other nodes announce before the relay would listen.
        let listening = relay::connect(&store).await.map_err(|e| {
            ClusterError::Join(format!("cannot listen for other nodes' events: {e}"))
        })?;
        let cluster = Self {
            inner: Arc::new(Inner {
                store,
                overseer,
                options,
                suspended: AtomicBool::new(false),
                take_back: AtomicBool::new(false),
                tasks: std::sync::Mutex::new(Vec::new()),
                routing,
                patience: std::sync::Mutex::default(),
            }),
        };
        // Take over what is claimable before serving.
        failover::take_over(&cluster.inner, false).await;
        let tasks = vec![
            tokio::spawn(heartbeats(Arc::downgrade(&cluster.inner))),
            tokio::spawn(failover::run(Arc::downgrade(&cluster.inner))),
            tokio::spawn(relay::run(
                cluster.inner.store.clone(),
                cluster.inner.overseer.clone(),
                listening,
            )),
        ];
        if let Ok(mut t) = cluster.inner.tasks.lock() {
            t.extend(tasks);
        }
        Ok(cluster)
    }

    /// The router of API requests (for `HttpOptions::cluster`).
    pub fn routing(&self) -> Routing {
        self.inner.routing.clone()
    }

    /// This node's id.
    pub fn node_id(&self) -> uuid::Uuid {
        self.inner.store.node_id()
    }

    /// Stops the node's cluster tasks (no more heartbeats, failover or
    /// relay). Call before stopping the actors; then [`Cluster::leave`].
    pub fn stop_tasks(&self) {
        if let Ok(mut tasks) = self.inner.tasks.lock() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
    }

    /// Leaves the cluster after a graceful shutdown: gives up every lease so
    /// that the other nodes take the active sessions at once.
    pub async fn leave(&self) -> Result<(), overseer_actors::store::StoreError> {
        self.stop_tasks();
        self.inner.store.leave().await
    }
}

/// Joins unless a live node already advertises this node's URL. A row with
/// this URL whose heartbeats go on is another node: refused. One whose
/// heartbeats have stopped (this node's own previous life, crashed) is
/// waited out until it is dead.
async fn join_with_unique_url(
    store: &PgStore,
    options: &ClusterOptions,
) -> Result<(), ClusterError> {
    let url = &options.advertise_url;
    let give_up = tokio::time::Instant::now() + store.lease() + options.heartbeat;
    let mut first: Option<UrlTaken> = None;
    loop {
        let taken = match store.join(url).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(taken)) => taken,
            Err(e) => return Err(ClusterError::Join(e.to_string())),
        };
        let beating = first
            .as_ref()
            .is_some_and(|f| f.node == taken.node && taken.heartbeat_at > f.heartbeat_at);
        if beating || tokio::time::Instant::now() > give_up {
            return Err(ClusterError::UrlTaken {
                url: url.clone(),
                node: taken.node,
                age: taken.heartbeat_age_secs,
            });
        }
        if first.as_ref().is_none_or(|f| f.node != taken.node) {
            tracing::info!(
                node = %taken.node,
                "another node's row advertises this node's URL; waiting to see whether it is alive"
            );
            first = Some(taken);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The heartbeat loop, this node's own-clock check of its lease, and the
/// pruning of dead nodes' rows.
async fn heartbeats(inner: std::sync::Weak<Inner>) {
    let mut last_prune = tokio::time::Instant::now();
    loop {
        let Some(node) = inner.upgrade() else { return };
        let every = node.options.heartbeat;
        if node.store.lease_lapsed() && !node.suspended.swap(true, Ordering::AcqRel) {
            // Whatever this node held may be another's by now: stop acting on
            // any of it before heartbeating again.
            tracing::warn!(
                "this node's lease ran out (no successful heartbeat in time): dropping every session"
            );
            node.store.drop_leases();
            node.overseer.drop_actors().await;
        }
        match node
            .store
            .heartbeat(&node.options.advertise_url, every)
            .await
        {
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
        let retention = node.options.dead_node_retention;
        if last_prune.elapsed() > (retention / 2).clamp(every, Duration::from_secs(60)) {
            last_prune = tokio::time::Instant::now();
            let overseer = &node.overseer;
            node.store
                .sweep_leases(Duration::from_secs(60), |root| overseer.is_live(root));
            // On the pool, so not in this loop: a busy pool must not hold up
            // the next heartbeat.
            let store = node.store.clone();
            tokio::spawn(async move {
                match store.prune_nodes(retention).await {
                    Ok(pruned) => {
                        for id in pruned {
                            tracing::info!(node = %id, "removed the row of a node dead for longer than dead_node_retention_secs");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "pruning dead nodes' rows failed"),
                }
            });
        }
        drop(node);
        tokio::time::sleep(every).await;
    }
}
