//! Approval timers: one per pending approval, owned here rather than by
//! a session actor, so that a deadline still fires while its session
//! hibernates (the timer's delivery activates the session).
//!
//! Each timer is keyed by (session, call) and remembers its deadline. Arming
//! the same deadline again is a no-op; arming a different one (a call asked
//! again after an in-process restart) replaces the old timer. After every
//! checkpointed transition the session keeps only the timers of the calls that
//! still wait for a decision, so a decision, a cancel or the end of a session
//! disarms them at once and no stale timer wakes a hibernated session for
//! nothing.
//!
//! A timer is an entry in a queue ordered by when it fires, not a task: one
//! driver task per runtime sleeps until the earliest entry and hands what is
//! due to the runtime. A tokio task with its sleep and its registration cost
//! about 1.4 KB per timer and a spawn per approval, which every session
//! parked at a restart paid (131 MiB at 100,000 parked sessions).
//!
//! This module owns the bookkeeping and the waiting only; what a timeout
//! means, and delivering it, is the runtime's and the machine's.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::model::{SessionId, SessionIdHasher, ToolCallId};

/// Where a timer sits in the queue: when it fires, then a number that keeps
/// timers of the same instant apart (and in the order they were armed).
type Slot = (Instant, u64);

/// An armed timer, as its session's entry remembers it.
struct Armed {
    call: ToolCallId,
    deadline_ms: i64,
    slot: Slot,
}

/// A timer that came due: whose, which call, and the deadline it was armed
/// for (the machine ignores a timeout of a deadline it no longer has).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Due {
    pub(crate) session: SessionId,
    pub(crate) call: ToolCallId,
    pub(crate) deadline_ms: i64,
}

#[derive(Default)]
struct State {
    by_session: HashMap<SessionId, Vec<Armed>, SessionIdHasher>,
    queue: BTreeMap<Slot, Due>,
    next: u64,
}

impl State {
    fn unqueue(&mut self, armed: &[Armed]) {
        for a in armed {
            self.queue.remove(&a.slot);
        }
    }
}

/// Where the driver hands a due timer.
pub(crate) type Deliver = Box<dyn Fn(Due) + Send + Sync>;

/// What the driver task shares with the runtime's handle.
#[derive(Default)]
struct Shared {
    // A std mutex: every critical section is a few map operations, never
    // held across an await.
    state: Mutex<State>,
    /// Wakes the driver when a timer earlier than all others is armed.
    wake: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The armed approval timers of this process.
#[derive(Default)]
pub struct ApprovalTimers {
    shared: Arc<Shared>,
    /// The driver task, started with the first timer; aborted on drop.
    driver: OnceLock<AbortHandle>,
}

impl std::fmt::Debug for ApprovalTimers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalTimers")
            .field("armed", &self.len())
            .finish()
    }
}

impl ApprovalTimers {
    /// Whether a timer for this deadline is already armed.
    pub(crate) fn is_armed(&self, id: SessionId, call: &ToolCallId, deadline_ms: i64) -> bool {
        self.shared.lock().by_session.get(&id).is_some_and(|armed| {
            armed
                .iter()
                .any(|a| a.call == *call && a.deadline_ms == deadline_ms)
        })
    }

    /// Starts the driver task, which hands each timer to the function
    /// `deliver` makes when it comes due, unless it runs already (`deliver`
    /// is only called then). A tokio runtime must be current.
    pub(crate) fn start(&self, deliver: impl FnOnce() -> Deliver) {
        self.driver
            .get_or_init(|| tokio::spawn(drive(self.shared.clone(), deliver())).abort_handle());
    }

    /// Arms the timer of `call` to fire at `at`, replacing the one it had.
    /// It fires once the driver runs ([`ApprovalTimers::start`]).
    pub(crate) fn arm(&self, id: SessionId, call: ToolCallId, deadline_ms: i64, at: Instant) {
        let earliest = {
            let mut state = self.shared.lock();
            let slot = (at, state.next);
            state.next += 1;
            let armed = state.by_session.entry(id).or_default();
            let old = armed
                .iter()
                .position(|a| a.call == call)
                .map(|i| armed.swap_remove(i));
            armed.push(Armed {
                call: call.clone(),
                deadline_ms,
                slot,
            });
            if let Some(old) = old {
                state.queue.remove(&old.slot);
            }
            state.queue.insert(
                slot,
                Due {
                    session: id,
                    call,
                    deadline_ms,
                },
            );
            state.queue.first_key_value().map(|(s, _)| *s) == Some(slot)
        };
        if earliest {
            self.shared.wake.notify_one();
        }
    }

    /// Disarms every timer of `id` whose call is not among `pending`.
    pub(crate) fn retain<'a>(
        &self,
        id: SessionId,
        pending: impl Iterator<Item = &'a ToolCallId> + Clone,
    ) {
        let mut state = self.shared.lock();
        let Some(armed) = state.by_session.get_mut(&id) else {
            return;
        };
        let (keep, gone): (Vec<Armed>, Vec<Armed>) = std::mem::take(armed)
            .into_iter()
            .partition(|a| pending.clone().any(|p| *p == a.call));
        if keep.is_empty() {
            state.by_session.remove(&id);
        } else {
            *armed = keep;
        }
        state.unqueue(&gone);
    }

    /// Disarms every timer of a session (it ended).
    pub(crate) fn disarm_session(&self, id: SessionId) {
        let mut state = self.shared.lock();
        if let Some(armed) = state.by_session.remove(&id) {
            state.unqueue(&armed);
        }
    }

    /// Timers armed now, over all sessions.
    pub fn len(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// Whether no timer is armed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the timers due at `now` out, earliest first.
    #[cfg(test)]
    fn take_due(&self, now: Instant) -> Vec<Due> {
        take_due(&mut self.shared.lock(), now)
    }
}

impl Drop for ApprovalTimers {
    fn drop(&mut self) {
        if let Some(driver) = self.driver.get() {
            driver.abort();
        }
    }
}

/// Takes the timers due at `now` out of `state`, earliest first.
fn take_due(state: &mut State, now: Instant) -> Vec<Due> {
    let mut due = Vec::new();
    while let Some(entry) = state.queue.first_entry() {
        if entry.key().0 > now {
            break;
        }
        let slot = *entry.key();
        let fired = entry.remove();
        if let Some(armed) = state.by_session.get_mut(&fired.session) {
            armed.retain(|a| a.slot != slot);
            if armed.is_empty() {
                state.by_session.remove(&fired.session);
            }
        }
        due.push(fired);
    }
    due
}

/// The driver: sleeps until the earliest timer (or until an earlier one is
/// armed), hands what is due to `deliver`, and again, until aborted.
async fn drive(shared: Arc<Shared>, deliver: Deliver) {
    loop {
        let (due, next) = {
            let mut state = shared.lock();
            let due = take_due(&mut state, Instant::now());
            (due, state.queue.first_key_value().map(|(s, _)| s.0))
        };
        for d in due {
            deliver(d);
        }
        // An arm between the check above and the wait below leaves a
        // permit, so the wait returns at once and the queue is read again.
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = shared.wake.notified() => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn call(n: u32) -> ToolCallId {
        ToolCallId(format!("call_{n}"))
    }

    #[tokio::test(start_paused = true)]
    async fn timers_are_entries_of_one_driver_not_tasks() {
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = tasks();
        let timers = ApprovalTimers::default();
        timers.start(|| Box::new(|_| {}));
        let at = Instant::now() + Duration::from_secs(60);
        for n in 0..1_000 {
            timers.arm(SessionId::generate(), call(n), 1, at);
        }
        assert_eq!(timers.len(), 1_000);
        assert_eq!(tasks(), before + 1, "one driver for every timer");
        drop(timers);
        // The aborted driver is released once the scheduler gets to it.
        for _ in 0..100 {
            if tasks() == before {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(tasks(), before, "dropping the timers stops the driver");
    }

    #[tokio::test(start_paused = true)]
    async fn rearming_replaces_and_retain_disarms_what_no_longer_waits() {
        let timers = ApprovalTimers::default();
        let id = SessionId::generate();
        let now = Instant::now();
        let secs = Duration::from_secs;
        timers.arm(id, call(1), 10, now + secs(10));
        timers.arm(id, call(2), 20, now + secs(20));
        assert!(timers.is_armed(id, &call(1), 10));
        // Asked again with a new deadline: one timer, at the new deadline.
        timers.arm(id, call(1), 30, now + secs(30));
        assert!(!timers.is_armed(id, &call(1), 10));
        assert!(timers.is_armed(id, &call(1), 30));
        assert_eq!(timers.len(), 2);
        assert!(timers.take_due(now + secs(15)).is_empty());

        timers.retain(id, [call(2)].iter());
        assert_eq!(timers.len(), 1);
        let due = timers.take_due(now + secs(40));
        let expected = Due {
            session: id,
            call: call(2),
            deadline_ms: 20,
        };
        assert_eq!(due, vec![expected]);
        assert!(timers.is_empty());
        assert!(!timers.is_armed(id, &call(2), 20));

        timers.arm(id, call(3), 5, now);
        timers.disarm_session(id);
        assert!(timers.is_empty());
        assert!(timers.take_due(now + secs(99)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_driver_fires_in_deadline_order_and_wakes_for_an_earlier_timer() {
        let timers = ApprovalTimers::default();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        timers.start(move || {
            Box::new(move |d: Due| {
                let _ = tx.send(d.deadline_ms);
            })
        });
        let start = Instant::now();
        let id = SessionId::generate();
        timers.arm(id, call(1), 300, start + Duration::from_secs(300));
        // Armed while the driver sleeps for the one above: it must not wait
        // for that one first.
        tokio::task::yield_now().await;
        timers.arm(id, call(2), 100, start + Duration::from_secs(100));
        timers.arm(id, call(3), 200, start + Duration::from_secs(200));
        for expected in [100, 200, 300] {
            assert_eq!(rx.recv().await, Some(expected));
            assert_eq!(start.elapsed(), Duration::from_secs(expected as u64));
        }
        assert!(timers.is_empty());
    }
}
