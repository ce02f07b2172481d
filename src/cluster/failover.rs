//! Failover: taking over the active sessions of dead nodes (and of nobody),
//! and taking back this node's own after it dropped them.
//!
//! Every `heartbeat_secs` a node runs one round: it reads the database's
//! clock and the nodes alive by it, pages through the active roots whose
//! owner is gone (in id order, every page judged at that one instant), and
//! takes the ones that are its share: those whose rendezvous hash over the
//! live nodes picks it (`super::rendezvous`), plus any that another node was
//! picked for but has left unclaimed for [`PATIENCE_ROUNDS`] of this node's
//! rounds (that node may be busy, or dying too). Each page's share is taken
//! in one conditional statement (several nodes may look at once; each root
//! goes to exactly one), then everything taken is activated,
//! `failover_concurrency` at a time, and one line is logged per node taken
//! from: how many sessions, how long the activation took, how long after
//! that node's last heartbeat. A node that has just resumed after dropping
//! its leases (or whose store let a tree go because its lease had lapsed,
//! however briefly) first re-activates the active roots whose lease still
//! names it, and keeps doing so round after round until every one is back:
//! no other node takes them (their owner is alive), so a take-back that
//! failed part-way would leave them with nobody to resume them. It owns no SQL (the store's) and no resume logic (the actors': an
//! activation is a restart from the checkpoint).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use futures::StreamExt;
use overseer_actors::model::SessionId;
use overseer_actors::SessionError;
use uuid::Uuid;

use super::{rendezvous, Inner};
use crate::store::postgres::Orphan;

/// Roots examined per query.
const BATCH: usize = 256;

/// Rounds of this node a claimable root is left to the node it hashes to
/// before this node takes it anyway.
pub(super) const PATIENCE_ROUNDS: u32 = 3;

/// How many of this node's rounds each claimable root it was not picked
/// for has waited.
#[derive(Debug, Default)]
pub(super) struct Patience {
    rounds: HashMap<SessionId, u32>,
}

impl Patience {
    /// Counts one more round `root` was left to another node; whether this
    /// node should take it now.
    fn run_out(&mut self, root: SessionId) -> bool {
        let waited = self.rounds.entry(root).or_insert(0);
        *waited += 1;
        *waited > PATIENCE_ROUNDS
    }

    /// Forgets the roots that were not claimable this round (taken, or
    /// owned again).
    fn keep_only(&mut self, seen: &HashSet<SessionId>) {
        self.rounds.retain(|root, _| seen.contains(root));
    }
}

/// The failover loop.
pub(super) async fn run(inner: Weak<Inner>) {
    loop {
        let Some(node) = inner.upgrade() else { return };
        let every = node.options.heartbeat;
        if node.store.lease_valid() {
            // Both read every round (no short circuit): each clears itself.
            let resumed = node.suspended.swap(false, Ordering::AcqRel);
            let let_go = node.store.take_let_go();
            if resumed || let_go {
                node.take_back.store(true, Ordering::Release);
            }
            let owed = node.take_back.load(Ordering::Acquire);
            take_over(&node, owed).await;
        }
        drop(node);
        tokio::time::sleep(every).await;
    }
}

/// One round: this node's share of everything claimable now; with
/// `resumed`, this node's own active sessions first.
pub(super) async fn take_over(node: &Arc<Inner>, resumed: bool) {
    if resumed && take_back(node).await {
        node.take_back.store(false, Ordering::Release);
    }
    if !node.store.lease_valid() {
        return;
    }
    let view = match node.store.round_view().await {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read which nodes are alive");
            return;
        }
    };
    let me = node.store.node_id();
    let mut live = view.live;
    if !live.contains(&me) {
        // Alive by its own clock, which runs out before the database's.
        live.push(me);
    }
    let mut taken: Vec<Orphan> = Vec::new();
    let mut waiting = HashSet::new();
    let mut after = None;
    loop {
        if !node.store.lease_valid() {
            break;
        }
        let page = match node.store.claimable_roots(view.at, after, BATCH).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for sessions to take over");
                break;
            }
        };
        let Some(last) = page.last() else { break };
        after = Some(last.root);
        let share: Vec<SessionId> = {
            let mut patience = node.patience.lock().unwrap_or_else(|e| e.into_inner());
            page.iter()
                .filter(|o| {
                    if rendezvous::owner_of(o.root.0, &live) == Some(me) {
                        return true;
                    }
                    waiting.insert(o.root);
                    patience.run_out(o.root)
                })
                .map(|o| o.root)
                .collect()
        };
        if !share.is_empty() {
            match node.store.claim_many(&share).await {
                Ok(claimed) => {
                    let claimed: HashSet<SessionId> = claimed.into_iter().collect();
                    taken.extend(page.iter().filter(|o| claimed.contains(&o.root)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot take over sessions");
                    break;
                }
            }
        }
        if page.len() < BATCH {
            break;
        }
    }
    node.patience
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .keep_only(&waiting);
    if taken.is_empty() {
        return;
    }
    let started = Instant::now();
    activate(
        node,
        taken.iter().map(|o| (o.root, o.dead_for_secs)).collect(),
    )
    .await;
    let took = started.elapsed().as_secs_f64();
    for (from, (count, dead_for)) in by_previous_owner(&taken) {
        let from = match from {
            Some(id) => format!("node {id}"),
            None => "no node (never owned, or released)".to_owned(),
        };
        let since = match dead_for {
            Some(secs) => format!("{secs:.1} s after its last heartbeat"),
            None => "its heartbeat unknown".to_owned(),
        };
        tracing::info!("took over {count} session(s) from {from} in {took:.2} s ({since})");
    }
}

/// Sessions taken per previous owner, with the longest any of them had
/// been dead for.
fn by_previous_owner(taken: &[Orphan]) -> BTreeMap<Option<Uuid>, (usize, Option<f64>)> {
    let mut out: BTreeMap<Option<Uuid>, (usize, Option<f64>)> = BTreeMap::new();
    for o in taken {
        let entry = out.entry(o.owner).or_insert((0, None));
        entry.0 += 1;
        entry.1 = match (entry.1, o.dead_for_secs) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    out
}

/// Activates this node's own active roots that it holds no lease for (it
/// let them go when its lease lapsed). Whether every one of them is back
/// (or will never need to be): `false` leaves the take-back owed, for the
/// next round.
async fn take_back(node: &Arc<Inner>) -> bool {
    #[cfg(feature = "fault-injection")]
    if overseer_actors::fault::failed(overseer_actors::fault::FaultPoint::TakeBack) {
        tracing::warn!("cannot list this node's sessions: injected fault (take_back)");
        return false;
    }
    let overseer = &node.overseer;
    let own = match node
        .store
        .own_unheld_roots(usize::MAX, |root| !overseer.is_live(root))
        .await
    {
        Ok(own) => own,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this node's sessions; trying again next round");
            return false;
        }
    };
    if own.is_empty() {
        return true;
    }
    tracing::info!(sessions = own.len(), "taking back this node's sessions");
    let n = own.len();
    let back = activate(node, own.into_iter().map(|r| (r, None)).collect()).await;
    if back == n {
        tracing::info!("took back {n} session(s) of this node");
    }
    back == n
}

/// Activates roots this node holds the lease of, a bounded number at a
/// time, recording how long after its owner's last heartbeat each came back.
/// Returns how many are settled: activated, or refused for good (ended,
/// gone, another node's); the others (the store down, this node's lease
/// lapsed again, an activation timed out) may succeed later.
async fn activate(node: &Arc<Inner>, roots: Vec<(SessionId, Option<f64>)>) -> usize {
    let started = Instant::now();
    let overseer = node.overseer.clone();
    let mut activations = futures::stream::iter(roots)
        .map(|(root, dead_for)| {
            let overseer = overseer.clone();
            async move { (root, dead_for, overseer.activate(root).await) }
        })
        .buffer_unordered(node.options.failover_concurrency.max(1));
    let mut settled = 0;
    while let Some((root, dead_for, result)) = activations.next().await {
        match result {
            Ok(_) => {
                settled += 1;
                if let Some(secs) = dead_for {
                    metrics::histogram!(overseer_actors::metrics::CLUSTER_FAILOVER_SECONDS)
                        .record(secs + started.elapsed().as_secs_f64());
                }
            }
            // Nothing to resume: it ended or is gone.
            Err(SessionError::Terminal { .. } | SessionError::NotFound(_)) => settled += 1,
            // Another node's (or refused as this node's lease lapsed again,
            // which the store reports: `PgStore::take_let_go`).
            Err(SessionError::Store(e)) if e.is_not_owner() => {
                tracing::info!(session_id = %root, error = %e, "not taking over a session");
                settled += 1;
            }
            Err(e) => {
                tracing::warn!(session_id = %root, error = %e, "could not take over a session")
            }
        }
    }
    settled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_left_to_another_node_is_taken_after_the_patience_rounds() {
        let mut p = Patience::default();
        let root = SessionId(Uuid::new_v4());
        let seen: HashSet<SessionId> = [root].into();
        for _ in 0..PATIENCE_ROUNDS {
            assert!(!p.run_out(root));
            p.keep_only(&seen);
        }
        assert!(p.run_out(root));
        // Claimed meanwhile by its node: forgotten, the count starts over.
        p.keep_only(&HashSet::new());
        assert!(!p.run_out(root));
    }

    #[test]
    fn takeovers_are_counted_per_previous_owner() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let orphan = |owner, dead_for_secs| Orphan {
            root: SessionId(Uuid::new_v4()),
            owner,
            dead_for_secs,
        };
        let taken = [
            orphan(Some(a), Some(4.5)),
            orphan(Some(a), Some(5.0)),
            orphan(Some(b), Some(6.0)),
            orphan(None, None),
        ];
        let by = by_previous_owner(&taken);
        assert_eq!(by[&Some(a)], (2, Some(5.0)));
        assert_eq!(by[&Some(b)], (1, Some(6.0)));
        assert_eq!(by[&None], (1, None));
    }
}
