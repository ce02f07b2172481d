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
//! Idle timers follow the same pattern: an entry per idle session actor in
//! one queue, one driver per runtime (see [`IdleTimers`]), in place of a
//! sleeping task per session that a `send_after` cost. The same entry
//! serves both things idleness leads to: after the rest delay the session
//! lets go of what it can read back (`SessionMsg::Rest`), after the idle
//! time it hibernates (`SessionMsg::Hibernate`).
//!
//! This module owns the bookkeeping and the waiting only; what a timeout
//! means, and delivering it, is the runtime's and the machine's; how long a
//! session may stay idle is [`crate::limits::IdlePressure`]'s.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use ractor::ActorRef;

use crate::messages::SessionMsg;
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
pub(crate) struct ApprovalTimers {
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
    pub(crate) fn len(&self) -> usize {
        self.shared.lock().queue.len()
    }

    #[cfg(test)]
    /// Whether no timer is armed.
    pub(crate) fn is_empty(&self) -> bool {
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

// ---------------------------------------------------------------------------
// Idle timers

/// A session idle since `since`, as its entry remembers it.
struct Idle {
    actor: ActorRef<SessionMsg>,
    /// The actor's message count when it became idle (a hibernation request
    /// for an older count is ignored: something happened since).
    activity: u64,
}

#[derive(Default)]
struct IdleState {
    /// Each idle session's place in the queue.
    by_session: HashMap<SessionId, Slot, SessionIdHasher>,
    /// Idle sessions by when they became idle, earliest first.
    queue: BTreeMap<Slot, (SessionId, Idle)>,
    next: u64,
    /// The last entry asked to rest: every entry up to it has been, and
    /// every one armed since sits after it (slots only grow, see `arm`).
    rested: Option<Slot>,
}

/// What the driver reads, once each time it looks, to know how long a
/// session may stay idle (see [`crate::limits::IdlePressure`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdleLook {
    /// Live session actors now.
    pub(crate) live: usize,
    /// The live-session limit.
    pub(crate) limit: usize,
    /// The idle time without pressure; `None` never hibernates.
    pub(crate) idle: Option<std::time::Duration>,
    /// How long a session stays idle before it is asked to rest; `None`
    /// asks none (sessions release at once, or never).
    pub(crate) rest: Option<std::time::Duration>,
    /// How pressure shortens the idle time.
    pub(crate) pressure: crate::limits::IdlePressure,
}

impl IdleLook {
    /// The idle time once `taken` of the live sessions have been asked to
    /// hibernate.
    fn idle_time(&self, taken: usize) -> Option<std::time::Duration> {
        let idle = self.idle?;
        Some(
            self.pressure
                .idle_time(idle, self.live.saturating_sub(taken), self.limit),
        )
    }

    /// Whether pressure shortens the idle time now.
    fn pressed(&self) -> bool {
        matches!((self.idle_time(0), self.idle), (Some(now), Some(idle)) if now < idle)
    }
}

/// Reads an [`IdleLook`]; `None` once the runtime is gone.
pub(crate) type Look = Box<dyn Fn() -> Option<IdleLook> + Send + Sync>;

#[derive(Default)]
struct IdleShared {
    state: Mutex<IdleState>,
    /// Wakes the driver: the first entry was armed, or pressure grew (the
    /// idle time of the moment may have shortened).
    wake: Notify,
}

impl IdleShared {
    fn lock(&self) -> MutexGuard<'_, IdleState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The idle timers of live sessions: one entry per idle session actor in a
/// queue ordered by when it became idle, and one driver task per runtime.
///
/// Unlike an approval timer, an idle timer has no deadline of its own: the
/// idle time is read when the driver looks, so one that shortens under
/// pressure applies at once to every session already idle. Since every
/// entry waits the same idle time, those due are always the oldest, a
/// prefix of the queue: the driver takes them from the front, one at a
/// time, reading the idle time again after each (each one it takes is one
/// live session fewer), and sleeps until the next is due or it is woken.
#[derive(Default)]
pub(crate) struct IdleTimers {
    shared: Arc<IdleShared>,
    driver: OnceLock<AbortHandle>,
}

impl std::fmt::Debug for IdleTimers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleTimers")
            .field("armed", &self.len())
            .finish()
    }
}

impl IdleTimers {
    /// Starts the driver task unless it runs already (`look` is only
    /// called then). A tokio runtime must be current.
    pub(crate) fn start(&self, look: impl FnOnce() -> Look) {
        self.driver
            .get_or_init(|| tokio::spawn(drive_idle(self.shared.clone(), look())).abort_handle());
    }

    /// `actor` (session `id`) is idle from `now` after message `activity`;
    /// replaces the session's entry.
    pub(crate) fn arm(
        &self,
        id: SessionId,
        actor: ActorRef<SessionMsg>,
        activity: u64,
        now: Instant,
    ) {
        let first = {
            let mut state = self.shared.lock();
            // Never before the newest entry: `now` was read before the
            // lock, and an entry placed behind the rest cursor would never
            // be asked to rest.
            let now = state
                .queue
                .last_key_value()
                .map_or(now, |(last, _)| now.max(last.0));
            let slot = (now, state.next);
            state.next += 1;
            if let Some(old) = state.by_session.insert(id, slot) {
                state.queue.remove(&old);
            }
            state.queue.insert(slot, (id, Idle { actor, activity }));
            state.queue.len() == 1
        };
        if first {
            self.shared.wake.notify_one();
        }
    }

    /// Session `id`'s actor `actor` is no longer idle (or is gone): drops
    /// its entry, unless the entry is another actor's of the same session.
    pub(crate) fn disarm(&self, id: SessionId, actor: ractor::ActorId) {
        let mut state = self.shared.lock();
        let Some(slot) = state.by_session.get(&id).copied() else {
            return;
        };
        if state
            .queue
            .get(&slot)
            .is_some_and(|(_, idle)| idle.actor.get_id() == actor)
        {
            state.queue.remove(&slot);
            state.by_session.remove(&id);
        }
    }

    /// Pressure grew: the driver reads the idle time again now.
    pub(crate) fn nudge(&self) {
        self.shared.wake.notify_one();
    }

    /// Idle session actors with an armed timer.
    pub(crate) fn len(&self) -> usize {
        self.shared.lock().queue.len()
    }

    #[cfg(test)]
    /// Whether no idle timer is armed.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for IdleTimers {
    fn drop(&mut self) {
        if let Some(driver) = self.driver.get() {
            driver.abort();
        }
    }
}

/// What the driver does after one look: the sessions to hibernate (taken
/// out of the queue), those to ask to rest (left in it), and when the next
/// one of either is due.
#[derive(Default)]
struct Taken {
    hibernate: Vec<Idle>,
    rest: Vec<(ActorRef<SessionMsg>, u64)>,
    next: Option<Instant>,
}

impl Taken {
    fn due_at(&mut self, at: Instant) {
        self.next = Some(self.next.map_or(at, |next| next.min(at)));
    }
}

/// Takes out, oldest first, the entries idle for longer than the idle time
/// at `now`, which grows by each one taken; then names, oldest first, the
/// entries past the rest cursor idle for longer than the rest delay, and
/// moves the cursor past them. Both are prefixes of the queue: every entry
/// waits the same time, counted from its slot.
fn take_idle(state: &mut IdleState, now: Instant, look: &IdleLook) -> Taken {
    let mut taken = Taken::default();
    while let Some((&slot, _)) = state.queue.first_key_value() {
        // An idle time too long to add is never reached.
        let Some(at) = look
            .idle_time(taken.hibernate.len())
            .and_then(|idle| slot.0.checked_add(idle))
        else {
            break;
        };
        if at > now {
            taken.due_at(at);
            break;
        }
        if let Some((id, idle)) = state.queue.remove(&slot) {
            state.by_session.remove(&id);
            taken.hibernate.push(idle);
        }
    }
    let Some(rest) = look.rest else {
        return taken;
    };
    let from = state.rested.map_or(Bound::Unbounded, Bound::Excluded);
    for (&slot, (_, idle)) in state.queue.range((from, Bound::Unbounded)) {
        let Some(at) = slot.0.checked_add(rest) else {
            break;
        };
        if at > now {
            taken.due_at(at);
            break;
        }
        taken.rest.push((idle.actor.clone(), idle.activity));
        state.rested = Some(slot);
    }
    taken
}

/// The idle driver: asks the sessions idle past the idle time of the
/// moment to hibernate and those idle past the rest delay to rest, sleeps
/// until the next one is due (or until woken),
/// and again, until aborted or the runtime is gone. It says when pressure
/// begins to shorten the idle time, and when it no longer does.
async fn drive_idle(shared: Arc<IdleShared>, look: Look) {
    let mut pressed = false;
    loop {
        // Read outside the lock: it counts the live sessions.
        let Some(now_look) = look() else { return };
        let shortened = now_look.pressed();
        if shortened != pressed {
            pressed = shortened;
            if pressed {
                tracing::info!(
                    live = now_look.live,
                    limit = now_look.limit,
                    idle_secs = now_look.idle_time(0).unwrap_or_default().as_secs_f64(),
                    "live sessions past the pressure share: idle sessions hibernate sooner"
                );
            } else {
                tracing::info!(
                    live = now_look.live,
                    "pressure eased: idle sessions hibernate after the configured idle time"
                );
            }
        }
        let taken = take_idle(&mut shared.lock(), Instant::now(), &now_look);
        // Refused: the actor is already stopping.
        for idle in taken.hibernate {
            let _ = idle.actor.cast(SessionMsg::Hibernate(idle.activity));
        }
        for (actor, activity) in taken.rest {
            let _ = actor.cast(SessionMsg::Rest(activity));
        }
        match taken.next {
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

    /// What the idle driver asked a session, with the activity it named.
    #[derive(Debug, PartialEq, Eq)]
    enum Asked {
        Hibernate(u64),
        Rest(u64),
    }

    /// Stands in for a session actor: reports the hibernation and rest
    /// requests it gets.
    struct Sink(tokio::sync::mpsc::UnboundedSender<Asked>);

    impl ractor::Actor for Sink {
        type Msg = SessionMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _: ActorRef<SessionMsg>,
            (): (),
        ) -> Result<(), ractor::ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _: ActorRef<SessionMsg>,
            msg: SessionMsg,
            (): &mut (),
        ) -> Result<(), ractor::ActorProcessingErr> {
            let asked = match msg {
                SessionMsg::Hibernate(n) => Asked::Hibernate(n),
                SessionMsg::Rest(n) => Asked::Rest(n),
                _ => return Ok(()),
            };
            let _ = self.0.send(asked);
            Ok(())
        }
    }

    async fn sink() -> (
        ActorRef<SessionMsg>,
        tokio::sync::mpsc::UnboundedReceiver<Asked>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (actor, _) = ractor::Actor::spawn(None, Sink(tx), ()).await.unwrap();
        (actor, rx)
    }

    /// A look at `live` (shared with the test) under a limit of 10, 300 s
    /// idle, pressure from 5 live down to 10 s at the limit, no rest delay.
    fn look(live: Arc<std::sync::atomic::AtomicUsize>) -> Look {
        look_resting(live, None)
    }

    /// [`look`] with a rest delay.
    fn look_resting(live: Arc<std::sync::atomic::AtomicUsize>, rest: Option<Duration>) -> Look {
        Box::new(move || {
            Some(IdleLook {
                live: live.load(std::sync::atomic::Ordering::Relaxed),
                limit: 10,
                idle: Some(Duration::from_secs(300)),
                rest,
                pressure: crate::limits::IdlePressure {
                    share_pct: 50,
                    floor: Duration::from_secs(10),
                },
            })
        })
    }

    #[tokio::test(start_paused = true)]
    async fn idle_timers_are_entries_of_one_driver_not_tasks() {
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let (actor, _rx) = sink().await;
        let before = tasks();
        let idle = IdleTimers::default();
        idle.start(|| look(Arc::default()));
        for n in 0..1_000 {
            idle.arm(SessionId::generate(), actor.clone(), n, Instant::now());
        }
        assert_eq!(idle.len(), 1_000);
        assert_eq!(tasks(), before + 1, "one driver for every idle session");
        drop(idle);
        for _ in 0..100 {
            if tasks() == before {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(tasks(), before, "dropping the timers stops the driver");
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_driver_reads_the_idle_time_when_it_looks_and_takes_the_oldest_first() {
        let (actor, mut rx) = sink().await;
        let live = Arc::new(std::sync::atomic::AtomicUsize::new(2));
        let idle = IdleTimers::default();
        idle.start(|| look(live.clone()));
        let start = Instant::now();
        idle.arm(SessionId::generate(), actor.clone(), 1, start);
        tokio::time::sleep(Duration::from_secs(1)).await;
        idle.arm(SessionId::generate(), actor.clone(), 2, Instant::now());
        tokio::time::sleep(Duration::from_secs(49)).await;
        assert!(rx.try_recv().is_err(), "no pressure: 300 s");
        // At the limit the idle time is 10 s; after the oldest goes it is
        // ~20 s (9 live), which the second has been idle for too.
        live.store(10, std::sync::atomic::Ordering::Relaxed);
        idle.nudge();
        assert_eq!(rx.recv().await, Some(Asked::Hibernate(1)));
        assert_eq!(rx.recv().await, Some(Asked::Hibernate(2)));
        assert_eq!(start.elapsed(), Duration::from_secs(50), "at once");
        assert!(idle.is_empty());
        // Without pressure again, the configured idle time.
        live.store(2, std::sync::atomic::Ordering::Relaxed);
        let id = SessionId::generate();
        let armed = Instant::now();
        idle.arm(id, actor.clone(), 3, armed);
        assert_eq!(rx.recv().await, Some(Asked::Hibernate(3)));
        assert_eq!(armed.elapsed(), Duration::from_secs(300));
        // Another actor of the same session cannot disarm this one's timer.
        let (other, _rx) = sink().await;
        idle.arm(id, actor.clone(), 4, Instant::now());
        idle.disarm(id, other.get_id());
        assert_eq!(idle.len(), 1);
        idle.disarm(id, actor.get_id());
        assert!(idle.is_empty());
    }

    /// Every idle entry is asked to rest once, after the rest delay and in
    /// the order it came to rest, and stays armed for hibernation; an entry
    /// armed again (the session did something) is asked again a delay
    /// later, with its new activity, and never with the old one.
    #[tokio::test(start_paused = true)]
    async fn the_idle_driver_asks_to_rest_after_the_delay_and_keeps_the_entry_for_hibernation() {
        let (actor, mut rx) = sink().await;
        let idle = IdleTimers::default();
        idle.start(|| look_resting(Arc::new(2.into()), Some(Duration::from_secs(10))));
        let start = Instant::now();
        let (first, second) = (SessionId::generate(), SessionId::generate());
        idle.arm(first, actor.clone(), 1, start);
        tokio::time::sleep(Duration::from_secs(4)).await;
        idle.arm(second, actor.clone(), 1, Instant::now());
        tokio::time::sleep(Duration::from_secs(2)).await;
        // The second does something at 6 s: its rest counts from then.
        idle.arm(second, actor.clone(), 2, Instant::now());
        assert_eq!(rx.recv().await, Some(Asked::Rest(1)));
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert_eq!(rx.recv().await, Some(Asked::Rest(2)));
        assert_eq!(start.elapsed(), Duration::from_secs(16));
        assert_eq!(idle.len(), 2, "resting leaves both armed");
        // Asked once each: next comes the first's hibernation at 300 s.
        assert_eq!(rx.recv().await, Some(Asked::Hibernate(1)));
        assert_eq!(start.elapsed(), Duration::from_secs(300));
        assert_eq!(rx.recv().await, Some(Asked::Hibernate(2)));
        assert_eq!(start.elapsed(), Duration::from_secs(306));
        assert!(idle.is_empty());
    }
}
