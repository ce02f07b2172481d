//! Group commit: the writer and flusher threads behind [`super::SledStore`],
//! and the store's recovery from write failures.
//!
//! Async tasks hand an encoded checkpoint to the *writer* thread and await a
//! oneshot reply; they never touch sled's write path nor wait on a disk. The
//! writer takes whatever is queued (up to [`MAX_GROUP`]) and writes it,
//! numbered (`commit_seq`), as one atomic `sled::Batch` on the store's one
//! tree (see [`apply`] and the parent module), and then either replies at
//! once (`os`) or passes the
//! replies to the *flusher* thread (`fsync`). The flusher takes every reply
//! passed to it so far, flushes once, records the group number it covered
//! beside the database (`sidecar`), and releases them all: each of them
//! belongs to a group that was applied before it was handed over, so that one
//! flush covers them all. While it flushes, the writer applies the next
//! groups, which the next flush covers. Nobody waits for a timer: under load,
//! groups grow by themselves to match how long applying and flushing take.
//!
//! When a write or a flush fails (a full disk, an I/O error), sled 0.34
//! refuses every later write until the database is opened again, and holds in
//! memory writes that may never reach the disk. Whoever sees the failure
//! closes the `gate` first (no reader sees those writes any more), then fails
//! the callers concerned with [`StoreError::Unavailable`]; nothing was
//! confirmed to them, so nothing confirmed is lost. From then on every write
//! is refused at once, and the writer tries to recover with a growing delay
//! (at most [`MAX_BACKOFF`]), never blocking on it, so it keeps answering:
//!
//! 1. it checks that the disk takes a file of [`SPACE_PROBE_BYTES`] again.
//!    Nothing touches sled before that: opening sled on a full disk makes it
//!    write a snapshot, which fails, and sled 0.34 then leaves an empty
//!    `snap.*.generating` file that it takes for a damaged snapshot at every
//!    later open (`open` removes such leftovers, but not opening at all on a
//!    full disk is what keeps the outage from getting worse);
//! 2. it waits, without blocking, until nobody else holds the failed
//!    opening (a read in progress, the flusher), waking sled's own waiters
//!    if that takes long (see [`kick`]), then closes it, which releases
//!    sled's lock on the directory;
//! 3. it opens the directory again — sled recovers what is durable, in
//!    which each checkpoint is whole or absent — installs it for readers and
//!    tries a write and a flush on it; once they go through, the gate opens
//!    for writes.
//!
//! So a long outage costs one small probe every few seconds, and the store
//! takes writes again within [`MAX_BACKOFF`] and a reopen of the disk taking
//! data again.
//!
//! Purges (`purge`) are writes too, so the writer runs them, after the
//! checkpoints of the group they arrive in, numbered as a group of their
//! own and confirmed like checkpoints.
//!
//! This module deliberately owns neither the encoding (`codec` prepares the
//! bytes on the caller's side) nor reads (readers go to sled directly), nor
//! what a flush does on disk (`durable`), nor opening (`open`).

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use overseer_actors::model::{SessionId, SessionIdHasher, SCHEMA_VERSION};
use overseer_actors::store::StoreError;

use super::codec::{self, corrupt};
use super::gate::Gate;
use super::layout::{self, Prepared};
use super::open::{self, catch_sled_panic, OpenError, Purpose, COMMIT_KEY};
use super::purge::{self, PurgeError};
use super::sidecar::Sidecar;
use super::trees::{Generation, Trees};
use super::webhooks::Feed;
use super::{Durability, StoreOptions};

/// Most checkpoints in one group, and most bytes: bounds how long the first
/// checkpoint of a group waits for the last to be written.
const MAX_GROUP: usize = 256;
const MAX_GROUP_BYTES: usize = 4 * 1024 * 1024;

/// How often an idle writer looks whether the flusher saw a failure, so that
/// recovery starts without waiting for the next write.
const IDLE_TICK: Duration = Duration::from_millis(500);
/// Delay before the second attempt to recover, doubled after each failed
/// attempt up to [`MAX_BACKOFF`]. The first attempt is immediate. An
/// attempt while the disk is still full costs one write of
/// [`SPACE_PROBE_BYTES`] (refused), so a short ceiling is cheap, and it
/// bounds how long after the disk takes data again writes are refused.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often the writer looks again whether readers and the flusher have
/// let go of a failed opening it waits to close (sled's lock on the
/// directory is released only then).
const RELEASE_POLL: Duration = Duration::from_millis(10);
/// How long they may hold it before the writer wakes sled's waiters (see
/// [`kick`]).
const RELEASE_KICK: Duration = Duration::from_secs(1);
/// The file written (and removed) to see whether the disk takes data again
/// before a database that reads fine is closed to be reopened, and its size:
/// about what sled needs to take a write (a log segment and a snapshot).
const SPACE_PROBE: &str = "overseer.space-probe";
const SPACE_PROBE_BYTES: usize = 1024 * 1024;
/// The key of `meta` the health check (and a recovery) writes.
pub(super) const HEALTH_KEY: &[u8] = b"health_check";

/// Where a caller waits for its outcome.
pub(super) struct Reply {
    tx: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
    /// The caller's slot in the bounded queue of commands: held until the
    /// command's work is done, so commands queued or being written never
    /// exceed the bound (see `SledStore`'s `MAX_PENDING_COMMANDS`).
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Reply {
    /// A reply to `tx`, releasing `slot` once sent (or dropped).
    pub(super) fn new(
        tx: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Self {
        Self { tx, _slot: slot }
    }

    /// Sends the outcome; `Err` gives it back when the caller is gone.
    /// The slot is released first: the command's work is done, and a caller
    /// that has its outcome finds its slot free again.
    pub(super) fn send(
        self,
        outcome: Result<(), StoreError>,
    ) -> Result<(), Result<(), StoreError>> {
        let Self { tx, _slot: slot } = self;
        drop(slot);
        tx.send(outcome)
    }
}

/// What async tasks send to the writer.
pub(super) enum Command {
    /// Apply this checkpoint (and flush it, under `fsync`).
    Checkpoint(Box<Prepared>, Reply),
    /// Make everything applied so far durable.
    Flush(Reply),
    /// Write a key of `meta`, read it back, and flush: whether the store
    /// takes writes now (`/readyz`).
    Health(Reply),
    /// Delete a terminal session whole (see `purge`).
    Purge(SessionId, Reply),
}

/// What the writer, the flusher and the readers share.
pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) options: StoreOptions,
    pub(super) gate: Gate,
    pub(super) flushes: AtomicU64,
    /// Fault injection: while set, the disk behaves as if full (see
    /// [`super::SledStore::simulate_full_disk`]).
    pub(super) full: AtomicBool,
}

impl Shared {
    /// Flushes `generation`, or fails as a full disk would.
    fn flush(&self, generation: &Generation) -> Result<(), String> {
        if self.full.load(Ordering::Acquire) {
            return Err(format!("syncing the log: {} (simulated)", no_space()));
        }
        generation.flush()
    }

    /// Whether the directory takes a file of [`SPACE_PROBE_BYTES`] again.
    fn space_probe(&self) -> std::io::Result<()> {
        if self.full.load(Ordering::Acquire) {
            return Err(no_space());
        }
        let path = self.dir.join(SPACE_PROBE);
        let outcome = (|| {
            let mut file = std::fs::File::create(&path)?;
            file.write_all(&vec![0u8; SPACE_PROBE_BYTES])?;
            file.sync_all()
        })();
        let removed = std::fs::remove_file(&path);
        outcome.and(removed)
    }
}

fn no_space() -> std::io::Error {
    std::io::Error::from_raw_os_error(28)
}

/// Replies the flusher releases after one flush of `generation`, which
/// covers every group up to `seq`.
struct Batch {
    generation: Arc<Generation>,
    seq: u64,
    replies: Vec<Reply>,
}

/// Handle on the two threads. Dropping it stops them after they have finished
/// everything already queued.
pub(super) struct GroupCommit {
    // Field order matters: `tx` drops first, which ends the writer's loop (and
    // in turn the flusher's), then `_threads` joins them (only its drop matters).
    tx: Sender<Command>,
    _threads: Threads,
}

impl GroupCommit {
    /// Starts the threads on `generation`, whose last group is `seq`.
    pub(super) fn start(
        shared: Arc<Shared>,
        generation: Arc<Generation>,
        seq: u64,
        feed: Arc<Feed>,
    ) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel::<Command>();
        let (flush_tx, flush_rx) = mpsc::channel::<Batch>();
        let sidecar = Sidecar::open(&shared.dir, seq).map_err(|e| {
            StoreError::io(
                format!(
                    "cannot write the commit record of the store in {}",
                    shared.dir.display()
                ),
                e,
            )
        })?;

        let flusher = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("overseer-store-flusher".into())
                .spawn(move || run_flusher(&shared, &flush_rx, sidecar))
                .map_err(|e| StoreError::io("cannot start the store flusher thread", e))?
        };
        let writer = Writer {
            feed,
            durability: shared.options.durability,
            shared,
            flush_tx,
            cache: Cache::default(),
            seq,
            state: State::Writable(generation),
            reported: None,
        };
        let writer = std::thread::Builder::new()
            .name("overseer-store-writer".into())
            .spawn(move || writer.run(&rx))
            .map_err(|e| StoreError::io("cannot start the store writer thread", e))?;
        Ok(Self {
            tx,
            // Writer first: the flusher only stops once the writer is gone.
            _threads: Threads(vec![writer, flusher]),
        })
    }

    /// Queues a command. Never blocks (the channel is unbounded; callers are
    /// bounded by awaiting their own reply).
    pub(super) fn submit(&self, cmd: Command) -> Result<(), StoreError> {
        self.tx
            .send(cmd)
            .map_err(|_| StoreError::Unavailable("the store writer thread has stopped".into()))
    }
}

struct Threads(Vec<JoinHandle<()>>);

impl Drop for Threads {
    fn drop(&mut self) {
        join_within(self.0.drain(..), JOIN_WAIT, "store");
    }
}

/// How long dropping the store waits for one of its threads to end.
pub(super) const JOIN_WAIT: Duration = Duration::from_secs(10);

/// Joins `handles` in order, each within `wait`. A thread still running
/// then is stuck (inside sled, see [`kick`]) and is left behind with an
/// error line: whoever drops the store (a shutdown) must not hang with it.
pub(super) fn join_within(
    handles: impl Iterator<Item = JoinHandle<()>>,
    wait: Duration,
    what: &str,
) {
    for handle in handles {
        let deadline = Instant::now() + wait;
        while !handle.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if !handle.is_finished() {
            tracing::error!(
                thread = handle.thread().name().unwrap_or("?"),
                "a {what} thread did not stop within {} s; leaving it behind",
                wait.as_secs()
            );
            continue;
        }
        if handle.join().is_err() {
            tracing::error!("a {what} thread panicked");
        }
    }
}

/// Whether the writer takes writes.
enum State {
    Writable(Arc<Generation>),
    /// Writes are refused until a recovery attempt succeeds.
    Unwritable {
        /// The opening still held: the failed one (already out of the gate,
        /// waiting to be closed), or a reopening that reads fine but has not
        /// taken a write yet (in the gate, for readers).
        held: Option<Arc<Generation>>,
        next_try: Instant,
        backoff: Duration,
        /// Since when the writer waits for others to let go of `held`, and
        /// whether it woke sled's waiters already.
        releasing: Option<(Instant, bool)>,
    },
}

impl State {
    /// Writes refused, a first recovery attempt due now.
    fn failed(held: Option<Arc<Generation>>) -> Self {
        Self::Unwritable {
            held,
            next_try: Instant::now(),
            backoff: FIRST_BACKOFF,
            releasing: None,
        }
    }
}

struct Writer {
    shared: Arc<Shared>,
    /// Where the webhook deliveries a group owes go once it is applied.
    feed: Arc<Feed>,
    flush_tx: Sender<Batch>,
    durability: Durability,
    cache: Cache,
    /// The number of the last group written to the current generation.
    seq: u64,
    state: State,
    /// The lasting reopen failure last logged, so that it is logged once.
    reported: Option<String>,
}

/// The commands of one group, by kind.
#[derive(Default)]
struct Group {
    checkpoints: Vec<(Box<Prepared>, Reply)>,
    flushes: Vec<Reply>,
    health: Vec<Reply>,
    purges: Vec<(SessionId, Reply)>,
}

impl Group {
    fn add(&mut self, cmd: Command) -> usize {
        match cmd {
            Command::Checkpoint(p, reply) => {
                let size = p.size();
                self.checkpoints.push((p, reply));
                size
            }
            Command::Flush(reply) => {
                self.flushes.push(reply);
                0
            }
            Command::Health(reply) => {
                self.health.push(reply);
                0
            }
            Command::Purge(id, reply) => {
                self.purges.push((id, reply));
                0
            }
        }
    }

    fn fail(self, error: &StoreError) {
        let replies = self
            .checkpoints
            .into_iter()
            .map(|(_, r)| r)
            .chain(self.flushes)
            .chain(self.health)
            .chain(self.purges.into_iter().map(|(_, r)| r));
        for reply in replies {
            // A caller that stopped waiting is not an error.
            let _ = reply.send(Err(error.clone()));
        }
    }
}

impl Writer {
    fn run(mut self, rx: &Receiver<Command>) {
        loop {
            let wait = match &self.state {
                State::Writable(_) => IDLE_TICK,
                State::Unwritable { next_try, .. } => {
                    next_try.saturating_duration_since(Instant::now())
                }
            };
            let first = match rx.recv_timeout(wait) {
                Ok(cmd) => Some(cmd),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    // sled's close of a database that failed to write may
                    // panic (it syncs once more); that must not turn a
                    // clean shutdown into a panicking thread.
                    let state = std::mem::replace(&mut self.state, State::failed(None));
                    let _ = catch_sled_panic(move || drop(state));
                    return;
                }
            };
            self.notice_failure();
            if matches!(&self.state, State::Unwritable { next_try, .. } if *next_try <= Instant::now())
            {
                self.recover();
            }
            if matches!(self.state, State::Unwritable { .. }) {
                self.shared.gate.remind();
            }
            let Some(first) = first else { continue };

            let mut group = Group::default();
            let mut bytes = 0;
            let mut next = Some(first);
            while let Some(cmd) = next.take() {
                bytes += group.add(cmd);
                if group.checkpoints.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
                    next = rx.try_recv().ok();
                }
            }
            match &self.state {
                State::Writable(generation) => {
                    let generation = generation.clone();
                    self.write_group(&generation, group);
                }
                State::Unwritable { .. } => group.fail(&self.shared.gate.unwritable()),
            }
        }
    }

    /// Moves to `Unwritable` when the flusher (or anyone) failed the current
    /// generation.
    fn notice_failure(&mut self) {
        if let State::Writable(generation) = &self.state {
            if generation.failure().is_some() {
                let generation = generation.clone();
                self.failed(generation);
            }
        }
    }

    /// After `generation` failed (the gate is already closed on it).
    fn failed(&mut self, generation: Arc<Generation>) {
        // What it says about stored headers may include writes now lost,
        // and so may what the feed was given.
        self.cache.clear();
        self.feed.reset();
        self.state = State::failed(Some(generation));
    }

    fn write_group(&mut self, generation: &Arc<Generation>, group: Group) {
        let Group {
            checkpoints,
            flushes,
            health,
            purges,
        } = group;
        let (prepared, replies): (Vec<_>, Vec<_>) = checkpoints.into_iter().unzip();
        let group_seq = self.seq + 1;
        let applied = apply(&generation.trees, &mut self.cache, &prepared, group_seq);
        let mut failure = applied.failure;
        if applied.wrote && failure.is_none() {
            self.seq += 1;
        }
        // After the group's checkpoints, so a purge sees the latest header
        // of its session. Numbered as a group of its own.
        let mut purged = Vec::new();
        let mut purge_wrote = false;
        for (id, reply) in purges {
            if failure.is_some() {
                purged.push(reply);
                continue;
            }
            self.cache.forget([&id]);
            match purge::purge(&generation.trees, &id) {
                Ok(wrote) => {
                    purge_wrote |= wrote;
                    purged.push(reply);
                }
                Err(PurgeError::Refused(e)) => {
                    let _ = reply.send(Err(e));
                }
                Err(PurgeError::Io(cause)) => {
                    failure = Some(cause);
                    purged.push(reply);
                }
            }
        }
        if purge_wrote && failure.is_none() {
            match generation
                .trees
                .meta
                .insert(COMMIT_KEY, &(self.seq + 1).to_be_bytes()[..])
            {
                Ok(_) => self.seq += 1,
                Err(e) => failure = Some(format!("writing the group number: {e}")),
            }
        }
        let mut health_ok = Vec::new();
        for reply in health {
            if failure.is_some() {
                // Answered below, with the outage.
                health_ok.push(reply);
                continue;
            }
            match write_health_key(&generation.trees) {
                Ok(()) => health_ok.push(reply),
                Err(HealthError::Io(cause)) => {
                    failure = Some(cause);
                    health_ok.push(reply);
                }
                Err(HealthError::Other(e)) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        if let Some(cause) = failure {
            // Readers must stop seeing what this generation holds before
            // anyone hears of the failure (see the module docs).
            self.shared.gate.close(generation, &cause);
            self.failed(generation.clone());
            let error = self.shared.gate.unwritable();
            for (reply, outcome) in replies.into_iter().zip(applied.outcomes) {
                let _ = reply.send(outcome.and(Err(error.clone())));
            }
            for reply in flushes.into_iter().chain(health_ok).chain(purged) {
                let _ = reply.send(Err(error.clone()));
            }
            return;
        }

        // The group is applied: what it owes goes to the delivery task
        // (which sends nothing before a flush covers it).
        if applied.wrote {
            let mut rows = Vec::new();
            for (p, outcome) in prepared.into_iter().zip(&applied.outcomes) {
                if outcome.is_ok() {
                    rows.extend(p.hooks);
                }
            }
            if !rows.is_empty() {
                self.feed.push(group_seq, rows);
            }
        }
        let mut to_flush = flushes;
        to_flush.extend(health_ok);
        match self.durability {
            Durability::Fsync => to_flush.extend(purged),
            Durability::Os => {
                for reply in purged {
                    let _ = reply.send(Ok(()));
                }
            }
        }
        for (reply, outcome) in replies.into_iter().zip(applied.outcomes) {
            match (outcome, self.durability) {
                (Ok(()), Durability::Fsync) => to_flush.push(reply),
                (outcome, _) => {
                    let _ = reply.send(outcome);
                }
            }
        }
        if to_flush.is_empty() {
            return;
        }
        let batch = Batch {
            generation: generation.clone(),
            seq: self.seq,
            replies: to_flush,
        };
        if let Err(mpsc::SendError(batch)) = self.flush_tx.send(batch) {
            for reply in batch.replies {
                let _ = reply.send(Err(StoreError::Unavailable(
                    "the store flusher thread has stopped".into(),
                )));
            }
        }
    }

    /// One step towards making the store writable again (see the module
    /// docs): check the disk takes data, let go of what is held, reopen,
    /// write and flush once. Never blocks on anyone else: a step that cannot
    /// finish now reschedules itself.
    fn recover(&mut self) {
        let State::Unwritable {
            held,
            backoff,
            releasing,
            ..
        } = &mut self.state
        else {
            return;
        };
        let backoff_now = *backoff;
        let shared = self.shared.clone();
        let retry_later = |state: &mut State, held: Option<Arc<Generation>>| {
            *state = State::Unwritable {
                held,
                next_try: Instant::now() + backoff_now,
                backoff: (backoff_now * 2).min(MAX_BACKOFF),
                releasing: None,
            };
        };
        if releasing.is_none() {
            // Nothing touches sled before the disk takes data (see the
            // module docs).
            if let Err(e) = shared.space_probe() {
                let cause = format!("the disk still refuses data: {e}");
                tracing::debug!(error = %cause, "store recovery");
                shared.gate.reopen_failed(&cause);
                let held = held.take();
                retry_later(&mut self.state, held);
                return;
            }
        }
        if let Some(generation) = held.take() {
            let (since, kicked) = releasing.get_or_insert_with(|| {
                shared.gate.begin_reopen(Some(&generation));
                (Instant::now(), false)
            });
            if Arc::strong_count(&generation) > 1 {
                // A read in progress, or the flusher: look again shortly,
                // answering commands meanwhile.
                if !*kicked && since.elapsed() >= RELEASE_KICK {
                    *kicked = true;
                    kick(&generation);
                }
                let waiting = (*since, *kicked);
                self.state = State::Unwritable {
                    held: Some(generation),
                    next_try: Instant::now() + RELEASE_POLL,
                    backoff: backoff_now,
                    releasing: Some(waiting),
                };
                return;
            }
            // Closing a database sled did not itself see fail flushes it, and
            // sled panics if the final sync fails: that must not take the
            // writer down.
            if catch_sled_panic(move || drop(generation)).is_err() {
                tracing::debug!("store recovery: closing the failed database panicked");
            }
        } else {
            shared.gate.begin_reopen(None);
        }
        let opened = match open::open(&shared.dir, &shared.options, Purpose::Serve) {
            Ok(opened) => opened,
            Err(e) => {
                // Damage found on reopening will not go away by retrying:
                // said once, loudly; anything else (no space for sled's
                // snapshot yet) is the outage going on.
                let lasting = matches!(
                    e,
                    OpenError::Lost { .. } | OpenError::Damaged { .. } | OpenError::Record { .. }
                );
                let text = e.to_string();
                if lasting && self.reported.as_deref() != Some(text.as_str()) {
                    tracing::error!(error = %text, "the store cannot recover on its own");
                    self.reported = Some(text.clone());
                } else {
                    tracing::debug!(error = %text, "store recovery: reopening failed");
                }
                shared.gate.reopen_failed(&text);
                retry_later(&mut self.state, None);
                return;
            }
        };
        let generation = Arc::new(opened.generation);
        self.cache.clear();
        self.seq = opened.commit_seq;
        let probe = match write_health_key(&generation.trees) {
            Ok(()) => shared.flush(&generation),
            Err(HealthError::Io(cause)) => Err(cause),
            Err(HealthError::Other(e)) => Err(e.to_string()),
        };
        match probe {
            Ok(()) => {
                shared.gate.install(generation.clone(), true, "");
                self.state = State::Writable(generation);
                self.reported = None;
            }
            Err(cause) => {
                tracing::debug!(error = %cause, "store recovery: the reopened store refuses writes");
                shared.gate.install(generation.clone(), false, &cause);
                retry_later(&mut self.state, Some(generation));
            }
        }
    }
}

/// Wakes every thread waiting inside sled for `generation`'s log to become
/// stable, by asking for a flush from a thread of its own.
///
/// sled 0.34 records a failed log write in a flag that every waiter checks,
/// and wakes the waiters on most failure paths, but not all: when the write
/// is issued on the way out of a reservation
/// (`pagecache/logger.rs`, `Log::exit_reservation`) it sets the flag without
/// waking them, so a flush or a read that waits for that part of the log
/// (the flusher, a reader) can sleep for ever, and the failed opening is
/// never let go. A new flush sees the flag at once and wakes them all (the
/// same file, `iobuf::make_stable_inner`). It runs on a thread of its own
/// because on a database whose failure was ours rather than sled's (an
/// `fsync` of ours), sled's flush does real work.
fn kick(generation: &Generation) {
    let db = generation.trees.db.clone();
    let spawned = std::thread::Builder::new()
        .name("overseer-store-kick".into())
        .spawn(move || {
            let _ = catch_sled_panic(move || {
                let _ = db.flush();
            });
        });
    if let Err(e) = spawned {
        tracing::debug!(error = %e, "store recovery: cannot start a thread to wake sled's waiters");
    }
}

enum HealthError {
    /// The write failed: the generation is unusable.
    Io(String),
    /// It went through but did not read back.
    Other(StoreError),
}

/// Writes a fresh value under [`HEALTH_KEY`] and reads it back. The one small
/// key is rewritten in place, so the check does not grow the store.
fn write_health_key(trees: &Trees) -> Result<(), HealthError> {
    let nonce = uuid::Uuid::new_v4();
    trees
        .meta
        .insert(HEALTH_KEY, nonce.as_bytes())
        .map_err(|e| HealthError::Io(format!("writing the health check key: {e}")))?;
    match trees.meta.get(HEALTH_KEY) {
        Ok(Some(v)) if v.as_ref() == nonce.as_bytes() => Ok(()),
        Ok(_) => Err(HealthError::Other(corrupt(
            "meta",
            "the health check key did not read back as written",
        ))),
        Err(e) => Err(HealthError::Io(format!(
            "reading the health check key back: {e}"
        ))),
    }
}

fn run_flusher(shared: &Shared, rx: &Receiver<Batch>, mut sidecar: Sidecar) {
    let mut sidecar_failed = false;
    while let Ok(first) = rx.recv() {
        // Everything handed over so far was applied before it was handed
        // over, so one flush per generation covers all of it (there is more
        // than one only right after a reopen).
        let mut batches = vec![first];
        while let Ok(more) = rx.try_recv() {
            batches.push(more);
        }
        let mut runs: Vec<Batch> = Vec::new();
        for batch in batches {
            match runs.last_mut() {
                Some(run) if Arc::ptr_eq(&run.generation, &batch.generation) => {
                    run.seq = run.seq.max(batch.seq);
                    run.replies.extend(batch.replies);
                }
                _ => runs.push(batch),
            }
        }
        for run in runs {
            #[cfg(feature = "fault-injection")]
            overseer_actors::fault::hit_outside_sessions(
                overseer_actors::fault::FaultPoint::StoreFlush,
            );
            let outcome = match run.generation.failure() {
                Some(cause) => Err(cause),
                None => {
                    let outcome = shared.flush(&run.generation);
                    shared.flushes.fetch_add(1, Ordering::Relaxed);
                    outcome
                }
            };
            match &outcome {
                Ok(()) => match sidecar.record(run.seq) {
                    Ok(()) => sidecar_failed = false,
                    Err(e) if !sidecar_failed => {
                        // It only lags, which never raises a false alarm.
                        sidecar_failed = true;
                        tracing::warn!(error = %e, "cannot update the store's commit record");
                    }
                    Err(_) => {}
                },
                // Before anyone hears of it (see the module docs).
                Err(cause) => shared.gate.close(&run.generation, cause),
            }
            #[cfg(feature = "fault-injection")]
            if outcome.is_ok() {
                overseer_actors::fault::hit_outside_sessions(
                    overseer_actors::fault::FaultPoint::StoreBeforeConfirm,
                );
            }
            let outcome =
                outcome.map_err(|e| StoreError::Unavailable(format!("flushing the store: {e}")));
            for reply in run.replies {
                let _ = reply.send(outcome.clone());
            }
        }
    }
}

/// Most sessions whose header state the writer remembers (see [`Cache`]):
/// about 100 bytes each, so a few MiB at most, whatever the number of
/// sessions stored.
const CACHE_CAPACITY: usize = 64 * 1024;

/// What a checkpoint replaces, as far as the checks and the indexes are
/// concerned; `None` when the session has no header yet.
type Previous = Option<Known>;

#[derive(Clone)]
struct Known {
    schema_version: u32,
    tenant: Option<String>,
    /// `None`: the stored header is undecodable, so the index entries are
    /// rewritten unconditionally (readers cross-check them against headers).
    active: Option<bool>,
    /// The configuration the header names (`None`: it embeds one).
    config: Option<String>,
}

/// The header state of sessions the writer itself committed recently, so that
/// a checkpoint of a live session (the common case: every turn writes several)
/// does not read and parse its previous header back from sled. Correct because
/// this thread is the only writer of `sessions`: an entry is what is stored.
/// A session whose latest checkpoint is terminal is forgotten at once: it is
/// rarely written again, so the cache holds the sessions in use, not every
/// session ever finished. Bounded by [`CACHE_CAPACITY`] besides: when full it
/// is replaced by an empty one (its memory returned), and the sessions still
/// in use fill it again from disk, one read each.
#[derive(Default)]
struct Cache(ById<Previous>);

/// A map keyed by session id, hashed as the runtime's are (see
/// [`SessionIdHasher`]).
type ById<V> = HashMap<SessionId, V, SessionIdHasher>;

impl Cache {
    fn get(&self, id: &SessionId) -> Option<&Previous> {
        self.0.get(id)
    }

    fn commit(&mut self, known: ById<Previous>, terminal: &HashSet<SessionId, SessionIdHasher>) {
        if self.0.len() + known.len() > CACHE_CAPACITY {
            self.0 = ById::default();
        }
        for (id, previous) in known {
            if terminal.contains(&id) {
                self.0.remove(&id);
            } else {
                self.0.insert(id, previous);
            }
        }
    }

    /// After a failed write what is stored is unknown: read it again.
    fn forget<'a>(&mut self, ids: impl IntoIterator<Item = &'a SessionId>) {
        for id in ids {
            self.0.remove(id);
        }
    }

    /// After a reopen nothing known holds any more.
    fn clear(&mut self) {
        self.0 = ById::default();
    }
}

/// One write of a group: a key and its new value, `None` to remove it.
type Write = (sled::IVec, Option<sled::IVec>);

/// The writes of one group, per kind (see [`apply`]).
#[derive(Default)]
struct Writes {
    /// The group's row of owed webhook deliveries, if it owes any
    /// (`super::webhooks`).
    hooked: Vec<Write>,
    blobs: Vec<Write>,
    blob_refs: Vec<Write>,
    records: Vec<Write>,
    queue: Vec<Write>,
    metadata: Vec<Write>,
    decisions: Vec<Write>,
    /// Interned configurations and references (`super::configs`).
    configs: super::configs::Rows,
    tenants_added: Vec<Write>,
    active_added: Vec<Write>,
    sessions: Vec<Write>,
    tenants_removed: Vec<Write>,
    active_removed: Vec<Write>,
    queue_removed: Vec<Write>,
}

/// Applies a group and returns one outcome per checkpoint. A checkpoint over
/// a header of a newer schema is refused on its own and writes nothing; the
/// others are written together.
///
/// Everything is one `sled::Batch` on the one tree, applied with one
/// `apply_batch` (see [`write`]), which sled recovers atomically: after a
/// crash the group is there whole, with its number, or not at all, and a
/// reader never sees part of it. No ordering between rows matters (layouts
/// before 4 made the header the commit record, written last). No sled
/// transaction: profiling showed its multi-tree machinery (node clones,
/// splits, allocation) was most of the writer's time, and a batch on one
/// tree needs none of it.
///
/// Index changes are computed per session over the whole group (first
/// previous state → last new state), so that a session leaving and re-entering
/// an index in one group is neither removed after being added nor the reverse.
///
/// The group is numbered `seq` (`commit_seq`) in the same batch, so that
/// the number sled recovers after a crash is that of the last group it
/// holds (see `sidecar`).
///
/// All reads happen before the writes, which is safe because this thread is
/// the only writer.
fn apply(trees: &Trees, cache: &mut Cache, group: &[Box<Prepared>], seq: u64) -> Applied {
    let mut outcomes: Vec<Result<(), StoreError>> = Vec::with_capacity(group.len());
    // Per session in this group: its state before the group, and the state
    // its latest accepted checkpoint leaves.
    let hasher = SessionIdHasher::default;
    let mut before: ById<Previous> = HashMap::with_capacity_and_hasher(group.len(), hasher());
    let mut after: ById<Previous> = HashMap::with_capacity_and_hasher(group.len(), hasher());
    let mut terminal: HashSet<SessionId, SessionIdHasher> = HashSet::with_hasher(hasher());
    let mut blobs_in_group: HashSet<&str> = HashSet::new();
    let mut writes = Writes::default();
    // What the group's checkpoints owe as webhooks (`super::webhooks`).
    let mut owed = Vec::new();
    let mut accepted = Vec::with_capacity(group.len());
    for (n, p) in group.iter().enumerate() {
        // Later checkpoints of a session in the same group see the earlier ones.
        let previous = match after.get(&p.id).or_else(|| cache.get(&p.id)) {
            Some(previous) => Ok(previous.clone()),
            None => stored_previous(trees, p),
        };
        match previous.and_then(|previous| check(trees, p, previous, &blobs_in_group)) {
            Ok((previous, new_blobs)) => {
                before.entry(p.id).or_insert(previous);
                super::webhooks::owed_entry(&mut owed, p);
                after.insert(
                    p.id,
                    Some(Known {
                        schema_version: p.schema_version,
                        tenant: Some(p.tenant.clone()),
                        active: Some(p.active),
                        config: Some(p.config.0.clone()),
                    }),
                );
                if p.terminal {
                    terminal.insert(p.id);
                } else {
                    terminal.remove(&p.id);
                }
                for &i in &new_blobs {
                    let (hash, data) = &p.blobs[i];
                    blobs_in_group.insert(hash.as_str());
                    writes
                        .blobs
                        .push((hash.as_bytes().into(), Some(data.clone())));
                }
                // Every blob the new rows name, stored before or not: the
                // reference that keeps a purge of another session from
                // deleting it.
                for (hash, _) in &p.blobs {
                    writes
                        .blob_refs
                        .push((layout::blob_ref_key(hash, &p.id).into(), Some(empty())));
                }
                if let Some((k, v)) = &p.record {
                    writes.records.push((k[..].into(), Some(v.clone())));
                }
                for (k, v) in &p.queued {
                    writes.queue.push((k[..].into(), Some(v.clone())));
                }
                if let Some(m) = &p.metadata {
                    writes
                        .metadata
                        .push((p.id.as_bytes()[..].into(), Some(m.clone())));
                }
                // Readers trust a row only once the session's log holds
                // its event.
                for (k, v) in &p.decisions {
                    writes.decisions.push((k[..].into(), Some(v.clone())));
                }
                // Rows the header no longer covers.
                for k in &p.dequeued {
                    writes.queue_removed.push((k[..].into(), None));
                }
                // A later checkpoint of the session in this group, written
                // later, replaces it.
                writes
                    .sessions
                    .push((p.id.as_bytes()[..].into(), Some(p.header.clone())));
                outcomes.push(Ok(()));
                accepted.push((n, p.id));
            }
            Err(e) => outcomes.push(Err(e)),
        }
    }
    if accepted.is_empty() {
        return Applied {
            outcomes,
            wrote: false,
            failure: None,
        };
    }

    let mut configs = super::configs::Changes::default();
    // The configuration each session's last checkpoint names, with its JSON.
    let named: ById<&(String, sled::IVec)> = group
        .iter()
        .zip(&outcomes)
        .filter(|(_, outcome)| outcome.is_ok())
        .map(|(p, _)| (p.id, &p.config))
        .collect();
    for (id, first) in &before {
        let Some(Some(last)) = after.get(id) else {
            continue;
        };
        if let Some(config) = named.get(id) {
            configs.record(
                *id,
                first.as_ref().and_then(|k| k.config.as_deref()),
                config,
            );
        }
        let key = &id.as_bytes()[..];
        let old_tenant = first.as_ref().and_then(|k| k.tenant.as_deref());
        if let Some(tenant) = last.tenant.as_deref() {
            if old_tenant != Some(tenant) {
                writes
                    .tenants_added
                    .push((layout::tenant_key(tenant, id).into(), Some(empty())));
                if let Some(old) = old_tenant {
                    writes
                        .tenants_removed
                        .push((layout::tenant_key(old, id).into(), None));
                }
            }
        }
        let was_active = match first {
            None => Some(false),
            Some(known) => known.active,
        };
        if was_active != last.active {
            if last.active == Some(true) {
                writes.active_added.push((key.into(), Some(empty())));
            } else {
                writes.active_removed.push((key.into(), None));
            }
        }
    }

    if !owed.is_empty() {
        writes
            .hooked
            .push((seq.to_be_bytes()[..].into(), Some(owed.into())));
    }
    let written = match super::configs::rows(trees, configs) {
        Ok(rows) => {
            writes.configs = rows;
            write(trees, writes, seq)
        }
        Err(e) => Err(WriteError::Io(e)),
    };
    let wrote = written.is_ok();
    let failure = match written {
        Ok(()) => {
            cache.commit(after, &terminal);
            None
        }
        Err(e) => {
            // Every accepted checkpoint shared the failed write.
            cache.forget(after.keys());
            let text = match &e {
                WriteError::Io(text) | WriteError::Hook(text) => text,
            };
            for (n, id) in &accepted {
                outcomes[*n] = Err(StoreError::Unavailable(format!(
                    "checkpoint of session {id}: {text}"
                )));
            }
            match e {
                WriteError::Io(text) => Some(text),
                WriteError::Hook(_) => None,
            }
        }
    };
    Applied {
        outcomes,
        wrote,
        failure,
    }
}

/// What [`apply`] did.
struct Applied {
    /// One per checkpoint of the group.
    outcomes: Vec<Result<(), StoreError>>,
    /// Whether the group was written (and numbered).
    wrote: bool,
    /// A write failed: sled may hold part of the group in memory, and will
    /// refuse further writes.
    failure: Option<String>,
}

enum WriteError {
    Io(String),
    /// The test hook cut the group short, as a crash would; the database
    /// itself is fine.
    Hook(String),
}

fn empty() -> sled::IVec {
    sled::IVec::from(&[][..])
}

/// Applies the writes of a group, and its number, as one `sled::Batch` on
/// the one tree (see [`apply`]). A group where everything was refused has
/// no writes at all, so it leaves the files untouched.
fn write(trees: &Trees, writes: Writes, seq: u64) -> Result<(), WriteError> {
    let Writes {
        hooked,
        blobs,
        blob_refs,
        records,
        queue,
        metadata,
        decisions,
        configs,
        tenants_added,
        active_added,
        sessions,
        tenants_removed,
        active_removed,
        queue_removed,
    } = writes;
    let kinds = [
        (&trees.hooked, hooked),
        (&trees.blobs, blobs),
        (&trees.blob_refs, blob_refs),
        (&trees.records, records),
        (&trees.queue, queue),
        (&trees.metadata, metadata),
        (&trees.decisions, decisions),
        (&trees.tenants, tenants_added),
        (&trees.active, active_added),
        (&trees.sessions, sessions),
        (&trees.tenants, tenants_removed),
        (&trees.active, active_removed),
        (&trees.queue, queue_removed),
    ];
    // sled's `Batch` keeps the last write of each key, so a key written
    // twice in a group (a session's header, checkpointed twice) ends as
    // its later write; index changes are net over the group (see `apply`),
    // so no key is both added and removed.
    let mut batch = sled::Batch::default();
    // A configuration a session takes up is written with its reference; one
    // nobody names any more is removed (never both: see `configs::rows`).
    for (key, value) in configs.configs {
        trees.configs.batch_insert(&mut batch, key, value);
    }
    for (key, value) in configs.refs {
        trees.config_refs.batch_insert(&mut batch, key, value);
    }
    for key in configs.refs_removed {
        trees.config_refs.batch_remove(&mut batch, key);
    }
    for key in configs.configs_removed {
        trees.configs.batch_remove(&mut batch, key);
    }
    for (view, writes) in kinds {
        for (key, value) in writes {
            match value {
                Some(value) => view.batch_insert(&mut batch, key, value),
                None => view.batch_remove(&mut batch, key),
            }
        }
    }
    trees
        .meta
        .batch_insert(&mut batch, COMMIT_KEY, &seq.to_be_bytes()[..]);
    #[cfg(feature = "fault-injection")]
    overseer_actors::fault::hit_outside_sessions(
        overseer_actors::fault::FaultPoint::StoreBeforeHeaders,
    );
    if crashed_before_apply(trees) {
        return Err(WriteError::Hook(
            "test hook: the group's batch was dropped".into(),
        ));
    }
    trees
        .data
        .apply_batch(batch)
        .map_err(|e| WriteError::Io(format!("writing the group's batch: {e}")))?;
    #[cfg(feature = "fault-injection")]
    overseer_actors::fault::hit_outside_sessions(
        overseer_actors::fault::FaultPoint::StoreAfterApply,
    );
    Ok(())
}

/// Test hook: whether to stop right before the group's batch is applied,
/// as a crash there would.
#[cfg(test)]
fn crashed_before_apply(trees: &Trees) -> bool {
    trees.drop_headers.load(Ordering::Relaxed)
}

#[cfg(not(test))]
fn crashed_before_apply(_: &Trees) -> bool {
    false
}

/// Decides whether `p` may be written over `previous`, and which of its blobs
/// are new.
fn check(
    trees: &Trees,
    p: &Prepared,
    previous: Previous,
    blobs_in_group: &HashSet<&str>,
) -> Result<(Previous, Vec<usize>), StoreError> {
    if let Some(known) = &previous {
        if known.schema_version > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                session: p.id,
                found: known.schema_version,
                supported: SCHEMA_VERSION,
            });
        }
    }
    let mut new_blobs = Vec::new();
    for (i, (hash, _)) in p.blobs.iter().enumerate() {
        // Content-addressed: an existing blob already holds these bytes.
        let stored = trees.blobs.contains_key(hash.as_bytes()).map_err(|e| {
            StoreError::io(
                format!("checkpoint of session {}: reading blob {hash}", p.id),
                e,
            )
        })?;
        if !stored && !blobs_in_group.contains(hash.as_str()) {
            new_blobs.push(i);
        }
    }
    Ok((previous, new_blobs))
}

/// The state of the header a checkpoint is about to replace, read from disk.
fn stored_previous(trees: &Trees, p: &Prepared) -> Result<Previous, StoreError> {
    let stored = trees.sessions.get(p.id.as_bytes()).map_err(|e| {
        StoreError::io(
            format!("checkpoint of session {}: reading its header", p.id),
            e,
        )
    })?;
    let Some(bytes) = stored else {
        return Ok(None);
    };
    let known = match serde_json::from_slice::<codec::Peek>(&bytes) {
        Ok(peek) => Known {
            schema_version: peek.schema_version,
            active: Some(peek.is_active()),
            tenant: peek.tenant,
            config: crate::store::configs::hash_of(&bytes).map(str::to_owned),
        },
        Err(_) => Known {
            schema_version: 0,
            tenant: None,
            active: None,
            config: crate::store::configs::hash_of(&bytes).map(str::to_owned),
        },
    };
    Ok(Some(known))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn trees(dir: &Path) -> Trees {
        let db = sled::Config::new().path(dir).open().unwrap();
        Trees::over(&db, false, true).unwrap()
    }

    fn prepared(id: SessionId, tenant: &str, active: bool, n: u8) -> Box<Prepared> {
        Box::new(Prepared {
            id,
            schema_version: SCHEMA_VERSION,
            tenant: tenant.into(),
            active,
            terminal: false,
            header: sled::IVec::from(vec![n]),
            record: None,
            blobs: Vec::new(),
            queued: Vec::new(),
            dequeued: Vec::new(),
            metadata: None,
            hooks: Vec::new(),
            decisions: Vec::new(),
            config: ("0".repeat(64), sled::IVec::from(&b"{}"[..])),
        })
    }

    /// Index changes are netted per session over a group: leaving and
    /// re-entering `active` (or the reverse) within one group ends as the
    /// last header says, whatever the order of the phases.
    #[test]
    fn index_changes_within_one_group_net_out() {
        let dir = tempfile::tempdir().unwrap();
        let trees = trees(dir.path());
        let mut cache = Cache::default();
        let (a, b) = (SessionId::generate(), SessionId::generate());
        let applied = apply(
            &trees,
            &mut cache,
            &[prepared(a, "t1", true, 1), prepared(b, "t1", false, 1)],
            1,
        );
        assert!(applied.outcomes.iter().all(Result::is_ok));
        let group = [
            prepared(a, "t1", false, 2),
            prepared(b, "t1", true, 2),
            prepared(a, "t2", true, 3),
            prepared(b, "t1", false, 3),
        ];
        for cache in [&mut cache, &mut Cache::default()] {
            let applied = apply(&trees, cache, &group, 2);
            assert!(applied.outcomes.iter().all(Result::is_ok));
            assert!(applied.wrote && applied.failure.is_none());
            assert!(trees.active.contains_key(a.as_bytes()).unwrap());
            assert!(!trees.active.contains_key(b.as_bytes()).unwrap());
            let tenants: Vec<_> = trees.tenants.iter().keys().map(|k| k.unwrap()).collect();
            let mut want = vec![
                sled::IVec::from(layout::tenant_key("t1", &b)),
                sled::IVec::from(layout::tenant_key("t2", &a)),
            ];
            want.sort();
            assert_eq!(tenants, want);
            assert_eq!(trees.sessions.get(a.as_bytes()).unwrap().unwrap(), vec![3]);
            assert_eq!(
                trees.meta.get(COMMIT_KEY).unwrap().unwrap(),
                2u64.to_be_bytes()
            );
        }
    }

    /// Configurations are counted within a group: two sessions taking one
    /// up store it once; one left by a session stays while another names
    /// it (also one taking it up in the same group), and goes with the last.
    #[test]
    fn configurations_are_counted_within_a_group() {
        let dir = tempfile::tempdir().unwrap();
        let trees = trees(dir.path());
        let mut cache = Cache::default();
        let under = |id, config: &str, n| {
            let mut p = prepared(id, "t1", false, n);
            let hash = config.repeat(64);
            // What the writer reads back when its cache is cold.
            p.header = format!(r#"{{"schema_version":{n},"config_hash":"{hash}"}}"#)
                .into_bytes()
                .into();
            p.config = (hash, sled::IVec::from(config.as_bytes()));
            p
        };
        let stored = |trees: &Trees| -> Vec<(String, usize)> {
            trees
                .configs
                .iter()
                .keys()
                .map(|k| {
                    let hash = String::from_utf8(k.unwrap().to_vec()).unwrap();
                    let refs = trees.config_refs.scan_prefix(hash.as_bytes()).count();
                    (hash[..1].to_owned(), refs)
                })
                .collect()
        };
        let (a, b, c) = (
            SessionId::generate(),
            SessionId::generate(),
            SessionId::generate(),
        );
        let mut seq = 0;
        let mut group = |cache: &mut Cache, group: &[Box<Prepared>]| {
            seq += 1;
            let applied = apply(&trees, cache, group, seq);
            assert!(applied.outcomes.iter().all(Result::is_ok));
            assert!(applied.wrote && applied.failure.is_none());
        };
        group(&mut cache, &[under(a, "e", 1), under(b, "e", 1)]);
        assert_eq!(stored(&trees), [("e".to_owned(), 2)]);
        // Checkpoints under the same configuration change nothing.
        group(&mut cache, &[under(a, "e", 2), under(a, "e", 3)]);
        assert_eq!(stored(&trees), [("e".to_owned(), 2)]);
        // `a` moves on and back within one group: nothing either.
        group(&mut cache, &[under(a, "f", 4), under(a, "e", 5)]);
        assert_eq!(stored(&trees), [("e".to_owned(), 2)]);
        // `a` leaves it, `b` still names it.
        group(&mut cache, &[under(a, "f", 6)]);
        assert_eq!(stored(&trees), [("e".to_owned(), 1), ("f".to_owned(), 1)]);
        // `b` leaves it as `c` takes it up, in one group (from disk: the
        // cache is cold): kept. Then `c` leaves it, the last: gone.
        group(&mut Cache::default(), &[under(b, "f", 7), under(c, "e", 1)]);
        assert_eq!(stored(&trees), [("e".to_owned(), 1), ("f".to_owned(), 2)]);
        group(&mut cache, &[under(c, "f", 2)]);
        assert_eq!(stored(&trees), [("f".to_owned(), 3)]);
        assert_eq!(
            trees.configs.get("f".repeat(64)).unwrap().unwrap(),
            b"f".to_vec()
        );
    }

    /// The writer's cache holds the sessions in use: a session whose latest
    /// checkpoint is terminal leaves it (a later checkpoint reads its header
    /// from disk, as after any miss).
    #[test]
    fn terminal_sessions_leave_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let trees = trees(dir.path());
        let mut cache = Cache::default();
        let (live, done) = (SessionId::generate(), SessionId::generate());
        let mut finished = prepared(done, "t1", false, 2);
        finished.terminal = true;
        let group = [
            prepared(live, "t1", true, 1),
            prepared(done, "t1", true, 1),
            finished,
        ];
        assert!(apply(&trees, &mut cache, &group, 1)
            .outcomes
            .iter()
            .all(Result::is_ok));
        assert!(cache.get(&live).is_some());
        assert!(cache.get(&done).is_none());
        assert!(!trees.active.contains_key(done.as_bytes()).unwrap());
        // Written again (not expected, but allowed): what it replaces is
        // read back from disk.
        let group = [prepared(done, "t1", true, 3)];
        assert!(apply(&trees, &mut cache, &group, 2)
            .outcomes
            .iter()
            .all(Result::is_ok));
        assert!(trees.active.contains_key(done.as_bytes()).unwrap());
        assert!(cache.get(&done).is_some());
    }

    /// The invariant "webhooks cost a group one row, not a row per event":
    /// a group of checkpoints, three of which owe deliveries (one of them
    /// several), writes exactly one webhook row naming each of the three
    /// with its events; a group owing none writes none.
    #[test]
    fn a_group_names_what_its_checkpoints_owe_in_one_row() {
        let dir = tempfile::tempdir().unwrap();
        let trees = trees(dir.path());
        let mut cache = Cache::default();
        let seed = crate::webhooks::test_seed;
        let endpoint = uuid::Uuid::now_v7();
        let ids: Vec<SessionId> = (0..4).map(|_| SessionId::generate()).collect();
        let group: Vec<Box<Prepared>> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let mut p = prepared(*id, "t1", true, 1);
                if i > 0 {
                    p.hooks = (1..=i as u64)
                        .map(|seq| (endpoint, seed(*id, seq + 3)))
                        .collect();
                }
                p
            })
            .collect();
        assert!(apply(&trees, &mut cache, &group, 7)
            .outcomes
            .iter()
            .all(Result::is_ok));
        let rows: Vec<(sled::IVec, sled::IVec)> = trees.hooked.iter().map(Result::unwrap).collect();
        assert_eq!(rows.len(), 1, "one row for the group");
        assert_eq!(&rows[0].0[..], &7u64.to_be_bytes()[..]);
        let mut want = Vec::new();
        for (i, id) in ids.iter().enumerate().skip(1) {
            want.extend_from_slice(id.as_bytes());
            want.extend_from_slice(&4u64.to_be_bytes());
            want.extend_from_slice(&(3 + i as u64).to_be_bytes());
        }
        assert_eq!(&rows[0].1[..], &want[..]);

        let quiet = [prepared(ids[0], "t1", true, 2)];
        assert!(apply(&trees, &mut cache, &quiet, 8)
            .outcomes
            .iter()
            .all(Result::is_ok));
        assert_eq!(trees.hooked.len(), 1, "a group owing nothing writes none");
    }
}
