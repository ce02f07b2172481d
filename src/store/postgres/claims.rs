//! Claims of single trees, grouped: a tree's lease is taken before an actor
//! of it starts here (creation, activation, restart), and claims that
//! arrive together are taken by one statement in one transaction instead of
//! one each. A burst of new sessions then costs the database one commit per
//! group rather than one per session, as checkpoints do (`writer`).
//!
//! Each claim waits in a queue; the first to find no group under way starts
//! a task that takes whatever is queued (up to [`MAX_GROUP`] roots, each
//! once), claims them with one multi-row upsert, records the leases it got,
//! answers each waiter and takes the next group, until the queue is empty.
//! The task, not a caller, runs the group, so a caller that gives up
//! strands nobody.
//!
//! It owns no lease semantics of its own: what may be taken (nobody's, this
//! node's, a dead node's) is the statement's, as for failover's
//! `claim_many` (`leases`), and the fence every checkpoint passes is
//! `leases`'s too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use overseer_actors::model::SessionId;
use overseer_actors::store::StoreError;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::leases::Owner;
use super::{map_pg, retrying, session_id, PgStore, READ_RETRY};

/// Most roots one claim statement takes.
const MAX_GROUP: usize = 1024;

/// Takes each root once (sorted: concurrent groups of two nodes lock lease
/// rows in one order) if nobody holds it, this node holds it already, or its
/// holder's heartbeat is older than the lease (`$3` seconds). Answers, per
/// root taken, its new epoch and whether its row was created just now.
const CLAIM_SQL: &str = "
INSERT INTO leases AS l (root_id, node_id, epoch)
SELECT r, $2, 1 FROM unnest($1::uuid[]) AS r
ON CONFLICT (root_id) DO UPDATE
  SET node_id = EXCLUDED.node_id, epoch = l.epoch + 1, claimed_at = now()
  WHERE l.node_id IS NULL OR l.node_id = $2 OR NOT EXISTS (
    SELECT 1 FROM nodes n WHERE n.id = l.node_id
      AND n.heartbeat_at > now() - make_interval(secs => $3))
RETURNING root_id, epoch, (xmax = 0)";

/// What a claim learns: the epoch taken and whether the lease row is new,
/// or `None` when another live node holds it.
type Taken = Option<(i64, bool)>;

struct Waiter {
    root: SessionId,
    reply: oneshot::Sender<Result<Taken, StoreError>>,
}

/// The claims waiting for a group, and whether a task is taking them.
#[derive(Default)]
pub(super) struct ClaimQueue {
    waiting: std::sync::Mutex<Vec<Waiter>>,
    draining: AtomicBool,
}

impl ClaimQueue {
    /// Queues a claim; `true` when the caller must start the task.
    fn push(&self, waiter: Waiter) -> bool {
        self.lock().push(waiter);
        !self.draining.swap(true, Ordering::AcqRel)
    }

    /// The next group: at most [`MAX_GROUP`] distinct roots, with every
    /// waiter for them. `None` once the queue is empty and the task may end.
    fn next_group(&self) -> Option<Vec<Waiter>> {
        loop {
            {
                let mut waiting = self.lock();
                if !waiting.is_empty() {
                    let mut roots = 0;
                    let mut seen = std::collections::HashSet::new();
                    let mut cut = waiting.len();
                    for (at, w) in waiting.iter().enumerate() {
                        if seen.insert(w.root) {
                            roots += 1;
                            if roots > MAX_GROUP {
                                cut = at;
                                break;
                            }
                        }
                    }
                    let rest = waiting.split_off(cut);
                    return Some(std::mem::replace(&mut *waiting, rest));
                }
            }
            self.draining.store(false, Ordering::Release);
            // A claim queued between the look and the store found the task
            // still draining and started none: take it up, unless a task it
            // started meanwhile already has.
            if self.lock().is_empty() || self.draining.swap(true, Ordering::AcqRel) {
                return None;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        // A panic while holding this lock leaves a list of waiters, whole.
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl PgStore {
    /// Takes the lease of `root`'s tree for this node (the port's `claim`),
    /// with whatever other claims are queued.
    pub(super) async fn claim_root(&self, root: SessionId) -> Result<bool, StoreError> {
        if !self.inner.clock.valid() {
            self.owe_take_back();
            return Err(StoreError::NotOwner {
                session: root,
                reason: "this node's lease has run out (no recent heartbeat)".into(),
            });
        }
        if self.inner.leases.contains_key(&root) {
            return Ok(false);
        }
        let (reply, answer) = oneshot::channel();
        if self.inner.claims.push(Waiter { root, reply }) {
            tokio::spawn(self.clone().drain_claims());
        }
        let taken = answer
            .await
            .map_err(|_| StoreError::Io("the claim of a tree was dropped unanswered".into()))??;
        match taken {
            Some((_, created)) => {
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

    /// Claims queued groups until none is left.
    async fn drain_claims(self) {
        while let Some(group) = self.inner.claims.next_group() {
            let mut roots: Vec<Uuid> = group.iter().map(|w| w.root.0).collect();
            roots.sort_unstable();
            roots.dedup();
            let answer = self.claim_group(&roots).await;
            for w in group {
                let _ = w.reply.send(
                    answer
                        .as_ref()
                        .map(|taken| taken.get(&w.root.0).copied())
                        .map_err(Clone::clone),
                );
            }
        }
    }

    /// One claim statement for `roots` (sorted, distinct), retried across
    /// transient failures (taking a lease this node holds again only moves
    /// its epoch on); the leases taken are held before anyone hears of them.
    async fn claim_group(&self, roots: &[Uuid]) -> Result<HashMap<Uuid, (i64, bool)>, StoreError> {
        let lease = self.inner.options.lease.as_secs_f64();
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            let statement = client.prepare_cached(CLAIM_SQL).await.map_err(map_pg)?;
            self.trip();
            client
                .query(&statement, &[&roots, &self.inner.node, &lease])
                .await
                .map_err(map_pg)
        })
        .await?;
        let mut taken = HashMap::with_capacity(rows.len());
        for r in &rows {
            let (root, epoch, created): (Uuid, i64, bool) = (r.get(0), r.get(1), r.get(2));
            self.hold(session_id(root), epoch);
            taken.insert(root, (epoch, created));
        }
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(root: SessionId) -> (Waiter, oneshot::Receiver<Result<Taken, StoreError>>) {
        let (reply, rx) = oneshot::channel();
        (Waiter { root, reply }, rx)
    }

    #[test]
    fn the_first_claim_starts_the_task_and_the_queue_ends_it_once_empty() {
        let q = ClaimQueue::default();
        let root = SessionId::generate();
        let (a, _ra) = waiter(root);
        let (b, _rb) = waiter(root);
        assert!(q.push(a), "the first claim starts the task");
        assert!(!q.push(b), "a claim queued while it runs starts none");
        let group = q.next_group().unwrap();
        assert_eq!(group.len(), 2, "both waiters of one root in one group");
        assert!(q.next_group().is_none(), "an empty queue ends the task");
        let (c, _rc) = waiter(SessionId::generate());
        assert!(q.push(c), "after it ended, the next claim starts another");
    }

    #[test]
    fn a_group_holds_at_most_its_limit_of_distinct_roots_and_leaves_the_rest_queued() {
        let q = ClaimQueue::default();
        let mut receivers = Vec::new();
        for _ in 0..MAX_GROUP + 3 {
            let (w, r) = waiter(SessionId::generate());
            q.push(w);
            receivers.push(r);
        }
        assert_eq!(q.next_group().unwrap().len(), MAX_GROUP);
        assert_eq!(q.next_group().unwrap().len(), 3);
        assert!(q.next_group().is_none());
    }
}
