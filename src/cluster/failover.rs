//! Failover: taking over the active sessions of dead nodes (and of nobody),
//! and taking back this node's own after it dropped them.
//!
//! Every `heartbeat_secs` a node asks the store for active roots whose owner
//! is gone, takes their leases in one conditional statement (several nodes
//! may look at once; each root goes to exactly one), and activates the ones
//! it took, `failover_concurrency` at a time. A node that has just resumed
//! after dropping its leases also re-activates the active roots whose lease
//! still names it. It owns no SQL (the store's) and no resume logic (the
//! actors': an activation is a restart from the checkpoint).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use futures::StreamExt;

use super::Inner;

/// Roots examined per query.
const BATCH: usize = 256;

/// The failover loop.
pub(super) async fn run(inner: Weak<Inner>) {
    loop {
        let Some(node) = inner.upgrade() else { return };
        let every = node.options.heartbeat;
        if node.store.lease_valid() {
            let resumed = node.suspended.swap(false, Ordering::AcqRel);
            take_over(&node, resumed).await;
        }
        drop(node);
        tokio::time::sleep(every).await;
    }
}

/// One round: everything claimable now, batch after batch; with `resumed`,
/// this node's own active sessions first.
pub(super) async fn take_over(node: &Arc<Inner>, resumed: bool) {
    if resumed {
        match node.store.own_unheld_roots(usize::MAX).await {
            Ok(own) if !own.is_empty() => {
                tracing::info!(sessions = own.len(), "taking back this node's sessions");
                activate(node, own.into_iter().map(|r| (r, None)).collect()).await;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot list this node's sessions"),
        }
    }
    loop {
        if !node.store.lease_valid() {
            return;
        }
        let orphans = match node.store.claimable_roots(BATCH).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for sessions to take over");
                return;
            }
        };
        if orphans.is_empty() {
            return;
        }
        let roots: Vec<_> = orphans.iter().map(|o| o.root).collect();
        let taken = match node.store.claim_many(&roots).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot take over sessions");
                return;
            }
        };
        let full = orphans.len() == BATCH;
        if taken.is_empty() && !full {
            return;
        }
        tracing::info!(
            sessions = taken.len(),
            "taking over sessions of a dead node"
        );
        let with_age = taken
            .iter()
            .map(|r| {
                let age = orphans
                    .iter()
                    .find(|o| o.root == *r)
                    .and_then(|o| o.dead_for_secs);
                (*r, age)
            })
            .collect();
        activate(node, with_age).await;
        if !full {
            return;
        }
    }
}

/// Activates roots this node holds the lease of, a bounded number at a
/// time, recording how long after its owner's last heartbeat each came back.
async fn activate(node: &Arc<Inner>, roots: Vec<(overseer_actors::model::SessionId, Option<f64>)>) {
    let started = Instant::now();
    let runtime = node.overseer.runtime().clone();
    let mut activations = futures::stream::iter(roots)
        .map(|(root, dead_for)| {
            let runtime = runtime.clone();
            async move { (root, dead_for, runtime.activate(root).await) }
        })
        .buffer_unordered(node.options.failover_concurrency.max(1));
    while let Some((root, dead_for, result)) = activations.next().await {
        match result {
            Ok(_) => {
                if let Some(secs) = dead_for {
                    metrics::histogram!(overseer_actors::metrics::CLUSTER_FAILOVER_SECONDS)
                        .record(secs + started.elapsed().as_secs_f64());
                }
            }
            Err(e) => {
                tracing::warn!(session_id = %root, error = %e, "could not take over a session")
            }
        }
    }
}
