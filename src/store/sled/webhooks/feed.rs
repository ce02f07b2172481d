//! The webhook feed of the sled store: the deliveries that checkpoints of
//! this process owe, held in memory from their commit until the delivery
//! task has saved each one's first outcome, by the group of checkpoints
//! that committed them, so that the group's row (`Kind::Hooked`) can go
//! once everything it owes is settled.
//!
//! Nothing here is durable, and nothing needs to be: a group of checkpoints
//! whose events go out writes one row naming them (session and event
//! numbers) in its own batch, and that row stays until every delivery it
//! owes is settled (delivered, given up, or in the log to be retried).
//! What the feed held when the process stopped is found again by a scan of
//! those rows ([`Feed::rescan_due`]), which every start begins with; so is
//! what the feed had to refuse while full ([`CAPACITY`]) or lost track of.
//! The feed decides what is owed and settled; the reads and writes that
//! follow are the parent module's.
//!
//! It deliberately holds no sled handle and does no I/O: its lock is taken
//! for a few map operations, never across a read, a write or an await.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use overseer_actors::model::SessionId;
use uuid::Uuid;

use crate::webhooks::Seed;

/// Most deliveries the feed holds before it refuses more (and a scan of the
/// group rows finds them instead): a few hundred bytes each.
pub(super) const CAPACITY: usize = 1 << 17;

/// A delivery as the feed knows it: endpoint, session, event number.
/// (The `webhook-id` follows from the last two.)
pub(in crate::store) type Owed = (Uuid, SessionId, u64);

/// The deliveries owed by this process's checkpoints, and what is settled.
#[derive(Debug)]
pub(in crate::store) struct Feed {
    state: Mutex<State>,
    /// No outbox row of an earlier binary is left (this one writes none).
    outbox_drained: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Committed, not yet taken by the delivery task, with their group.
    queue: VecDeque<(u64, Uuid, Seed)>,
    /// Queued or taken, with no outcome saved yet: the group of each.
    open: HashMap<Owed, u64>,
    /// Open deliveries per group.
    groups: HashMap<u64, u32>,
    /// Groups some of whose deliveries the feed does not hold (refused, or
    /// lost track of): only a scan may decide they are settled.
    dirty: HashSet<u64>,
    /// A scan of the group rows is due, from this key on (inclusive).
    rescan: Option<Rescan>,
}

#[derive(Debug, Default)]
struct Rescan {
    from: Vec<u8>,
    /// A group was refused since this pass began: pass again.
    again: bool,
}

impl State {
    /// Nothing known, a scan of the group rows due from the start.
    fn unknown() -> Self {
        Self {
            rescan: Some(Rescan::default()),
            ..Self::default()
        }
    }

    fn rescan_again(&mut self) {
        match &mut self.rescan {
            Some(rescan) => rescan.again = true,
            None => self.rescan = Some(Rescan::default()),
        }
    }

    /// Records `owed` of `group` as open unless it is already; whether it
    /// was not.
    fn open(&mut self, group: u64, owed: Owed) -> bool {
        if self.open.contains_key(&owed) {
            return false;
        }
        self.open.insert(owed, group);
        *self.groups.entry(group).or_default() += 1;
        true
    }
}

impl Default for Feed {
    fn default() -> Self {
        Self::new()
    }
}

/// What a delivery owes, as the feed keys it.
pub(in crate::store) fn owed(endpoint: Uuid, seed: &Seed) -> Owed {
    (endpoint, seed.session_id, seed.seq)
}

impl Feed {
    /// A feed whose first intake scans the group rows (what an earlier
    /// process left owed).
    pub(in crate::store) fn new() -> Self {
        Self {
            state: Mutex::new(State::unknown()),
            outbox_drained: AtomicBool::new(false),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands over the deliveries of the committed group `group`. Refused
    /// whole when the feed is full: a scan of the group rows finds them.
    pub(in crate::store) fn push(&self, group: u64, rows: Vec<(Uuid, Seed)>) {
        let mut state = self.state();
        if state.queue.len() + rows.len() > CAPACITY {
            state.dirty.insert(group);
            state.rescan_again();
            crate::webhooks::metrics::dropped("feed_full");
            return;
        }
        for (endpoint, seed) in rows {
            if state.open(group, owed(endpoint, &seed)) {
                state.queue.push_back((group, endpoint, seed));
            }
        }
    }

    /// What the feed was told may not be what is stored (a write failed,
    /// perhaps after reaching the disk, and the store was reopened): it
    /// forgets everything and lets a scan of the group rows decide.
    pub(in crate::store) fn reset(&self) {
        *self.state() = State::unknown();
    }

    /// Up to `limit` queued deliveries (they stay open until settled).
    pub(in crate::store) fn take(&self, limit: usize) -> Vec<(Uuid, Seed)> {
        let mut state = self.state();
        let n = limit.min(state.queue.len());
        let taken: Vec<(Uuid, Seed)> = state
            .queue
            .drain(..n)
            .map(|(_, endpoint, seed)| (endpoint, seed))
            .collect();
        drop(state);
        // Named here, on the delivery task, not on the session's path.
        taken
            .into_iter()
            .map(|(endpoint, seed)| (endpoint, crate::webhooks::named(seed)))
            .collect()
    }

    /// How many deliveries wait to be taken.
    pub(in crate::store) fn queued(&self) -> usize {
        self.state().queue.len()
    }

    /// Whether `owed` is queued or taken and not settled.
    pub(in crate::store) fn is_open(&self, owed: &Owed) -> bool {
        self.state().open.contains_key(owed)
    }

    /// A scan read group `group`'s row and found `rows` owed (not in the
    /// log): those not open already become open, and are returned. The
    /// group is no longer dirty: everything it owes is open or logged.
    /// `settled` is whether nothing of it is open, so its row can go.
    pub(in crate::store) fn adopt(
        &self,
        group: u64,
        rows: Vec<(Uuid, Seed)>,
    ) -> (Vec<(Uuid, Seed)>, bool) {
        let mut state = self.state();
        state.dirty.remove(&group);
        let mut out = Vec::with_capacity(rows.len());
        for (endpoint, seed) in rows {
            if state.open(group, owed(endpoint, &seed)) {
                out.push((endpoint, seed));
            }
        }
        let settled = !state.groups.contains_key(&group);
        (out, settled)
    }

    /// Settles deliveries whose outcome is saved (or that were dropped),
    /// and returns the groups now settled whole: their rows can go.
    pub(in crate::store) fn settle<'a>(
        &self,
        done: impl IntoIterator<Item = &'a Owed>,
    ) -> Vec<u64> {
        let mut state = self.state();
        let mut settled = Vec::new();
        for owed in done {
            let Some(group) = state.open.remove(owed) else {
                continue;
            };
            if let Some(n) = state.groups.get_mut(&group) {
                *n -= 1;
                if *n == 0 {
                    state.groups.remove(&group);
                    if !state.dirty.contains(&group) {
                        settled.push(group);
                    }
                }
            }
        }
        settled
    }

    /// Called at an intake with nothing in flight (`busy` empty): whatever
    /// is open but not queued was taken and never settled (an attempt that
    /// gave no outcome), so the feed forgets it and lets a scan find it
    /// again.
    pub(in crate::store) fn forget_lost(&self) {
        let mut state = self.state();
        if !state.queue.is_empty() || state.open.is_empty() {
            return;
        }
        let groups: Vec<u64> = state.groups.keys().copied().collect();
        state.dirty.extend(groups);
        state.open.clear();
        state.groups.clear();
        state.rescan_again();
    }

    /// Where a scan of the group rows is due from, if one is.
    pub(in crate::store) fn rescan_due(&self) -> Option<Vec<u8>> {
        self.state().rescan.as_ref().map(|r| r.from.clone())
    }

    /// A scan went as far as `next` (`None`: to the end of the rows).
    pub(in crate::store) fn rescanned(&self, next: Option<Vec<u8>>) {
        let mut state = self.state();
        let Some(rescan) = &mut state.rescan else {
            return;
        };
        match next {
            Some(from) => rescan.from = from,
            None if rescan.again => *rescan = Rescan::default(),
            None => state.rescan = None,
        }
    }

    /// Whether outbox rows of an earlier binary may be left.
    pub(in crate::store) fn outbox_left(&self) -> bool {
        !self.outbox_drained.load(Ordering::Acquire)
    }

    /// A look at the outbox found no row: none will come.
    pub(in crate::store) fn outbox_empty(&self) {
        self.outbox_drained.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhooks::test_seed as seed;

    #[test]
    fn a_group_is_settled_once_all_it_owes_is() {
        let feed = Feed::new();
        let (s, t, e) = (SessionId::generate(), SessionId::generate(), Uuid::now_v7());
        feed.push(7, vec![(e, seed(s, 3)), (e, seed(t, 1))]);
        feed.push(8, vec![(e, seed(s, 5))]);
        assert_eq!(feed.take(10).len(), 3);
        assert!(feed.settle([&(e, s, 3)]).is_empty(), "group 7 still owes");
        assert_eq!(feed.settle([&(e, s, 5)]), vec![8]);
        assert_eq!(feed.settle([&(e, t, 1)]), vec![7]);
        // Settling again changes nothing.
        assert!(feed.settle([&(e, t, 1)]).is_empty());
    }

    #[test]
    fn a_refused_group_is_settled_only_by_a_scan() {
        let feed = Feed::new();
        feed.rescanned(None);
        assert!(feed.rescan_due().is_none());
        let (s, e) = (SessionId::generate(), Uuid::now_v7());
        feed.push(1, vec![(e, seed(s, 1))]);
        let big: Vec<(Uuid, Seed)> = (0..CAPACITY)
            .map(|_| (Uuid::now_v7(), seed(s, 2)))
            .collect();
        feed.push(2, big);
        assert!(feed.rescan_due().is_some(), "a refusal asks for a scan");
        assert_eq!(feed.queued(), 1);
        // The scan reads group 2 and adopts what it owes.
        let (adopted, settled) = feed.adopt(2, vec![(e, seed(s, 2))]);
        assert_eq!(adopted.len(), 1);
        assert!(!settled);
        feed.take(10);
        assert_eq!(feed.settle([&(e, s, 2)]), vec![2]);
        assert_eq!(feed.settle([&(e, s, 1)]), vec![1]);
        feed.rescanned(None);
        assert!(feed.rescan_due().is_none());
    }

    #[test]
    fn a_delivery_already_open_is_not_adopted_twice_nor_queued_twice() {
        let feed = Feed::new();
        let (s, e) = (SessionId::generate(), Uuid::now_v7());
        feed.push(1, vec![(e, seed(s, 1))]);
        let (adopted, settled) = feed.adopt(1, vec![(e, seed(s, 1))]);
        assert!(adopted.is_empty() && !settled);
        feed.push(1, vec![(e, seed(s, 1))]);
        assert_eq!(feed.queued(), 1);
        assert!(feed.is_open(&(e, s, 1)));
    }

    #[test]
    fn deliveries_taken_and_never_settled_are_found_again_by_a_scan() {
        let feed = Feed::new();
        feed.rescanned(None);
        let (s, e) = (SessionId::generate(), Uuid::now_v7());
        feed.push(4, vec![(e, seed(s, 1))]);
        feed.take(1);
        feed.forget_lost();
        assert!(!feed.is_open(&(e, s, 1)));
        assert_eq!(feed.rescan_due(), Some(Vec::new()));
        // Dirty now: settling a stray outcome does not free its row.
        let (adopted, _) = feed.adopt(4, vec![(e, seed(s, 1))]);
        assert_eq!(adopted.len(), 1);
        assert_eq!(feed.settle([&(e, s, 1)]), vec![4]);
    }
}
