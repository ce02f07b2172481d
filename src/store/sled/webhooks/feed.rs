//! The webhook feed of the sled store: the deliveries that checkpoints of
//! this process owe, held in memory from their commit until the delivery
//! task has saved each one's first outcome, and what that settles of each
//! session, so that the session's mark (`Kind::Hooked`) can record it.
//!
//! Nothing here is durable, and nothing needs to be: a session whose events
//! go out has its mark, written in the batch of the checkpoint that first
//! needed it, and a mark says through which event everything is settled.
//! What the feed held when the process stopped is found again by a scan of
//! the marks ([`Feed::rescan_due`]), which every start begins with; so is
//! what the feed had to refuse while full ([`CAPACITY`]). The feed decides
//! which deliveries are owed and settled; the reads and writes that follow
//! are the parent module's.
//!
//! It deliberately holds no sled handle and does no I/O: its lock is taken
//! for a few map operations, never across a read, a write or an await.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use overseer_actors::model::SessionId;
use uuid::Uuid;

use crate::webhooks::{DeliveryKey, Seed};

/// Most deliveries the feed holds before it refuses more (and a scan of the
/// marks finds them instead): about 300 bytes each.
pub(super) const CAPACITY: usize = 1 << 17;

/// The deliveries owed by this process's checkpoints, and what is settled.
#[derive(Debug)]
pub(in crate::store) struct Feed {
    state: Mutex<State>,
    /// No outbox row of an earlier binary is left (this one writes none).
    outbox_drained: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Committed, not yet taken by the delivery task.
    queue: VecDeque<(Uuid, Seed)>,
    /// Queued or taken, with no outcome saved yet.
    open: HashSet<DeliveryKey>,
    /// Per session with open deliveries (or a cursor to write).
    sessions: HashMap<SessionId, Track>,
    /// A scan of the marks is due, from this key on (inclusive).
    rescan: Option<Rescan>,
}

#[derive(Debug, Default)]
struct Rescan {
    from: Vec<u8>,
    /// A delivery was refused since this pass began: pass again.
    again: bool,
}

impl State {
    /// Freezes `session`'s cursor and asks for a scan of the marks (another
    /// pass, if one is under way: it may have passed the session).
    fn refuse(&mut self, session: SessionId) {
        self.sessions.entry(session).or_default().dirty = true;
        self.rescan_again();
    }

    fn rescan_again(&mut self) {
        match &mut self.rescan {
            Some(rescan) => rescan.again = true,
            None => self.rescan = Some(Rescan::default()),
        }
    }
}

/// What the feed knows of one session.
#[derive(Debug, Default)]
struct Track {
    /// Every delivery of an event up to this one has been given to the feed.
    through: u64,
    /// Open deliveries per event.
    open: BTreeMap<u64, u32>,
    /// A delivery of this session was refused: its cursor may not move
    /// until a scan of the marks has seen the session again.
    dirty: bool,
}

impl Track {
    /// Through which event everything is settled, unless a refusal forbids
    /// saying so.
    fn settled_through(&self) -> Option<u64> {
        if self.dirty {
            return None;
        }
        Some(match self.open.keys().next() {
            Some(first) => first.saturating_sub(1),
            None => self.through,
        })
    }
}

impl Default for Feed {
    fn default() -> Self {
        Self::new()
    }
}

impl Feed {
    /// A feed whose first intake scans the marks (what an earlier process
    /// left owed).
    pub(in crate::store) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                rescan: Some(Rescan::default()),
                ..State::default()
            }),
            outbox_drained: AtomicBool::new(false),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands over the deliveries of a committed checkpoint of `session`
    /// whose events go through `last_seq`. Refused whole when the feed is
    /// full: a scan of the marks finds them.
    pub(in crate::store) fn push(
        &self,
        session: SessionId,
        last_seq: u64,
        rows: Vec<(Uuid, Seed)>,
    ) {
        let mut state = self.state();
        if state.queue.len() + rows.len() > CAPACITY {
            state.refuse(session);
            crate::webhooks::metrics::dropped("feed_full");
            return;
        }
        let State {
            queue,
            open,
            sessions,
            ..
        } = &mut *state;
        let track = sessions.entry(session).or_default();
        for (endpoint, seed) in rows {
            if open.insert((endpoint, seed.id.clone())) {
                *track.open.entry(seed.seq).or_default() += 1;
                queue.push_back((endpoint, seed));
            }
        }
        track.through = track.through.max(last_seq);
    }

    /// What a checkpoint of `session` owes is not known to be committed
    /// (its write failed, perhaps after reaching the disk): a scan of the
    /// marks decides.
    pub(in crate::store) fn refuse(&self, session: SessionId) {
        self.state().refuse(session);
    }

    /// Whether outbox rows of an earlier binary may be left.
    pub(in crate::store) fn outbox_left(&self) -> bool {
        !self.outbox_drained.load(Ordering::Acquire)
    }

    /// A look at the outbox found no row: none will come.
    pub(in crate::store) fn outbox_empty(&self) {
        self.outbox_drained.store(true, Ordering::Release);
    }

    /// Up to `limit` queued deliveries (they stay open until settled).
    pub(in crate::store) fn take(&self, limit: usize) -> Vec<(Uuid, Seed)> {
        let mut state = self.state();
        let n = limit.min(state.queue.len());
        state.queue.drain(..n).collect()
    }

    /// How many deliveries wait to be taken.
    pub(in crate::store) fn queued(&self) -> usize {
        self.state().queue.len()
    }

    /// Whether `key` is queued or taken and not settled.
    pub(in crate::store) fn is_open(&self, key: &DeliveryKey) -> bool {
        self.state().open.contains(key)
    }

    /// Records deliveries found by a scan of the marks as open, for a
    /// session the scan read through `last_seq`; those open already are
    /// left out of what is returned.
    pub(in crate::store) fn adopt(
        &self,
        session: SessionId,
        last_seq: u64,
        rows: Vec<(Uuid, Seed)>,
    ) -> Vec<(Uuid, Seed)> {
        let mut state = self.state();
        let State { open, sessions, .. } = &mut *state;
        let track = sessions.entry(session).or_default();
        let mut out = Vec::with_capacity(rows.len());
        for (endpoint, seed) in rows {
            if open.insert((endpoint, seed.id.clone())) {
                *track.open.entry(seed.seq).or_default() += 1;
                out.push((endpoint, seed));
            }
        }
        track.through = track.through.max(last_seq);
        track.dirty = false;
        out
    }

    /// A scan has seen `session` whole (through `last_seq`) with nothing
    /// left to send: whether its cursor may say so (nothing of it is open).
    pub(in crate::store) fn seen_whole(&self, session: SessionId, last_seq: u64) -> bool {
        let mut state = self.state();
        match state.sessions.get_mut(&session) {
            None => true,
            Some(track) => {
                track.through = track.through.max(last_seq);
                track.dirty = false;
                if track.open.is_empty() {
                    state.sessions.remove(&session);
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Settles deliveries whose outcome is saved (or that were dropped),
    /// and returns, per session concerned, through which event everything
    /// is now settled: the cursor its mark may take.
    pub(in crate::store) fn settle<'a>(
        &self,
        done: impl IntoIterator<Item = (&'a DeliveryKey, SessionId, u64)>,
    ) -> Vec<(SessionId, u64)> {
        let mut state = self.state();
        let State { open, sessions, .. } = &mut *state;
        let mut touched = Vec::new();
        for (key, session, seq) in done {
            if !open.remove(key) {
                continue;
            }
            if let Some(track) = sessions.get_mut(&session) {
                if let Some(n) = track.open.get_mut(&seq) {
                    *n -= 1;
                    if *n == 0 {
                        track.open.remove(&seq);
                    }
                }
                if !touched.contains(&session) {
                    touched.push(session);
                }
            }
        }
        let mut cursors = Vec::with_capacity(touched.len());
        for session in touched {
            let Some(track) = sessions.get(&session) else {
                continue;
            };
            if let Some(through) = track.settled_through() {
                cursors.push((session, through));
            }
            if track.open.is_empty() && !track.dirty {
                sessions.remove(&session);
            }
        }
        cursors
    }

    /// Called at an intake with nothing in flight (`busy` empty): whatever
    /// is open but not queued was taken and never settled (an attempt that
    /// panicked), so the feed forgets it and lets a scan of the marks find
    /// it again.
    pub(in crate::store) fn forget_lost(&self) {
        let mut state = self.state();
        if !state.queue.is_empty() || state.open.is_empty() {
            return;
        }
        state.open.clear();
        state.sessions.clear();
        state.rescan_again();
    }

    /// Where a scan of the marks is due from, if one is.
    pub(in crate::store) fn rescan_due(&self) -> Option<Vec<u8>> {
        self.state().rescan.as_ref().map(|r| r.from.clone())
    }

    /// A scan went as far as `next` (`None`: to the end of the marks).
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
}

#[cfg(test)]
mod tests {
    use overseer_actors::model::SessionId;

    use super::*;
    use crate::webhooks::{webhook_id, EventType};

    fn seed(session: SessionId, seq: u64) -> Seed {
        Seed {
            id: webhook_id(&session, seq, 1),
            event: EventType::ApprovalRequested,
            tenant: "acme".into(),
            session_id: session,
            root_session_id: session,
            seq,
            at_ms: 1,
            call: None,
            call_id: None,
            decision: None,
            status: None,
            stop_reason: None,
            detail: None,
        }
    }

    #[test]
    fn a_cursor_never_passes_an_unsettled_delivery() {
        let feed = Feed::new();
        let (s, e) = (SessionId::generate(), Uuid::now_v7());
        feed.push(s, 3, vec![(e, seed(s, 3))]);
        feed.push(s, 5, vec![(e, seed(s, 5))]);
        let taken = feed.take(10);
        assert_eq!(taken.len(), 2);
        let k5 = (e, webhook_id(&s, 5, 1));
        let k3 = (e, webhook_id(&s, 3, 1));
        // The later one settles first: the cursor stays before the earlier.
        assert_eq!(feed.settle([(&k5, s, 5)]), vec![(s, 2)]);
        assert_eq!(feed.settle([(&k3, s, 3)]), vec![(s, 5)]);
        // Settling again changes nothing.
        assert!(feed.settle([(&k3, s, 3)]).is_empty());
    }

    #[test]
    fn a_refused_delivery_freezes_its_session_until_a_scan_sees_it() {
        let feed = Feed::new();
        feed.rescanned(None);
        assert!(feed.rescan_due().is_none());
        let (s, e) = (SessionId::generate(), Uuid::now_v7());
        feed.push(s, 1, vec![(e, seed(s, 1))]);
        let big: Vec<(Uuid, Seed)> = (0..CAPACITY)
            .map(|_| (Uuid::now_v7(), seed(s, 2)))
            .collect();
        feed.push(s, 2, big);
        assert!(feed.rescan_due().is_some(), "a refusal asks for a scan");
        feed.take(1);
        let k1 = (e, webhook_id(&s, 1, 1));
        assert!(
            feed.settle([(&k1, s, 1)]).is_empty(),
            "no cursor while dirty"
        );
        // The scan reads the session again and adopts what it owes.
        let adopted = feed.adopt(s, 2, vec![(e, seed(s, 2))]);
        assert_eq!(adopted.len(), 1);
        let k2 = (e, webhook_id(&s, 2, 1));
        assert_eq!(feed.settle([(&k2, s, 2)]), vec![(s, 2)]);
        feed.rescanned(None);
        assert!(feed.rescan_due().is_none());
    }

    #[test]
    fn a_delivery_already_open_is_not_adopted_twice_nor_queued_twice() {
        let feed = Feed::new();
        let (s, e) = (SessionId::generate(), Uuid::now_v7());
        feed.push(s, 1, vec![(e, seed(s, 1))]);
        assert!(feed.adopt(s, 1, vec![(e, seed(s, 1))]).is_empty());
        feed.push(s, 1, vec![(e, seed(s, 1))]);
        assert_eq!(feed.queued(), 1);
        assert!(!feed.seen_whole(s, 1), "open: no cursor yet");
    }

    #[test]
    fn deliveries_taken_and_never_settled_are_found_again_by_a_scan() {
        let feed = Feed::new();
        feed.rescanned(None);
        let (s, e) = (SessionId::generate(), Uuid::now_v7());
        feed.push(s, 1, vec![(e, seed(s, 1))]);
        feed.take(1);
        feed.forget_lost();
        assert!(!feed.is_open(&(e, webhook_id(&s, 1, 1))));
        assert_eq!(feed.rescan_due(), Some(Vec::new()));
    }
}
