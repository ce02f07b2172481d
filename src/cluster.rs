//! Cluster mode (§15): many `overseer serve` nodes over one PostgreSQL
//! database. [`Cluster`] is one node's membership in it.
//!
//! It owns the behaviour of a node among others, over the rows the
//! PostgreSQL store keeps (`crate::store::postgres`):
//!
//! - **Membership**: a heartbeat every `heartbeat_secs`, on a database
//!   connection of its own (a pool busy with checkpoints never delays it,
//!   and nothing else in its loop waits on the pool); a node whose
//!   heartbeat is older than `lease_secs` is dead. A node stops acting on its
//!   leases before that by its own clock: when its last successful heartbeat
//!   is too old (paused, partitioned, database unreachable) it forgets every
//!   lease and drops every session actor at once, writing nothing; the store
//!   already refuses its writes from that moment. Once it heartbeats again it
//!   takes back whatever is still its own.
//! - **Failover** (`failover`): each node looks for active root sessions
//!   (running, awaiting approval) whose owner is dead or that nobody owns,
//!   takes their leases in one conditional statement (a new epoch each, so
//!   whatever the old owner still tries to write is refused), and activates
//!   them, a bounded number at a time. Activation re-arms approval timers and
//!   sorts in-flight tool calls per `on_interrupt` (§9), as after a restart.
//! - **Routing** (`routing`): every API request about a session goes to the
//!   node that owns it, over the nodes' own HTTP API with a node credential;
//!   a session with no live owner is served (and so claimed) by the node that
//!   received the request. Event streams are served by any node.
//! - **Relay** (`relay`): events another node checkpointed reach this
//!   node's event streams through `LISTEN`/`NOTIFY`.
//!
//! It deliberately owns no SQL and no session logic: the store owns the
//! rows, the actor tree owns the sessions (`overseer_actors::ownership` for
//! what the tree does when a session is not its to write).

mod failover;
mod relay;
mod routing;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use overseer_actors::Overseer;
use tokio::task::JoinHandle;

use crate::store::postgres::PgStore;

pub(crate) use routing::route;
pub use routing::{Routing, NODE_HEADER};

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
    /// plus a margin).
    pub forward_timeout: Duration,
}

/// Why a node could not join.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The first heartbeat failed.
    #[error("cannot join the cluster: {0}")]
    Join(String),
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
    /// Set while the node has dropped its leases and not yet taken back its
    /// own sessions.
    suspended: AtomicBool,
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
    routing: Routing,
}

impl Cluster {
    /// Joins: the first heartbeat (which must succeed), then the heartbeat,
    /// failover and relay tasks. Failover runs at once, so a node starting
    /// after a crash takes over what nobody owns before it serves.
    pub async fn join(
        store: PgStore,
        overseer: Overseer,
        options: ClusterOptions,
    ) -> Result<Self, ClusterError> {
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
            options.forward_timeout,
        )
        .map_err(ClusterError::Join)?;
        for name in [
            overseer_actors::metrics::CLUSTER_CLAIMS_TOTAL,
            overseer_actors::metrics::CLUSTER_FENCED_WRITES_TOTAL,
            overseer_actors::metrics::CLUSTER_FORWARDED_REQUESTS_TOTAL,
        ] {
            metrics::counter!(name).increment(0);
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
                tasks: std::sync::Mutex::new(Vec::new()),
                routing,
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

/// The heartbeat loop, and this node's own-clock check of its lease.
async fn heartbeats(inner: std::sync::Weak<Inner>) {
    let mut last_prune = tokio::time::Instant::now();
    loop {
        let Some(node) = inner.upgrade() else { return };
        let every = node.options.heartbeat;
        if !node.store.lease_valid() && !node.suspended.swap(true, Ordering::AcqRel) {
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
        if last_prune.elapsed() > Duration::from_secs(60) {
            last_prune = tokio::time::Instant::now();
            let live = &node.overseer.runtime().live;
            node.store
                .sweep_leases(Duration::from_secs(60), |root| live.contains_key(&root));
            // On the pool, so not in this loop: a busy pool must not hold up
            // the next heartbeat.
            let store = node.store.clone();
            tokio::spawn(async move {
                if let Err(e) = store.prune_nodes(Duration::from_secs(86_400)).await {
                    tracing::debug!(error = %e, "pruning old node rows failed");
                }
            });
        }
        drop(node);
        tokio::time::sleep(every).await;
    }
}
