//! The store's reader threads: where every point read of a
//! [`super::SledStore`] runs (a session's rows when it is activated, a
//! header, its events). Listings, which can take long, run on tokio's
//! blocking pool instead, so that they never hold up an activation.
//!
//! A sled read is usually served from its cache, but a miss reads the disk
//! (and may wait for a flush of the page it needs), so reads never run on a
//! runtime thread. They used to run on tokio's blocking pool, one task per
//! read: under load (a thousand approvals of recovered sessions in flight,
//! each activating its session from disk) the pool grew to about a hundred
//! threads, each woken for one read and put to sleep again, and the context
//! switches cost more CPU than the reads (`benches/PROFILE.md`, sixth pass).
//! A fixed pool, one thread per core, drains one queue instead: a busy
//! reader takes the next read without sleeping, and nothing grows with the
//! load but the queue.
//!
//! Every read keeps the wait it had: while the writer reopens the directory
//! after a failed write, a read waits for it until
//! [`super::gate::READ_WAIT`] after it was *submitted*, not after a reader
//! took it up, so reads queued behind a waiting one fail together instead of
//! one wait after another; while the store is down and nobody reopens it (the
//! disk is still full), reads fail at once (see `gate`).
//!
//! It deliberately knows nothing of what a read does: the store passes a
//! closure over the opening.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use overseer_actors::store::StoreError;

use super::gate::READ_WAIT;
use super::group_commit::Shared;
use super::trees::Generation;

/// One read: given the opening to read from (or why there is none), it
/// computes its result and sends it to whoever waits for it.
type Work = Box<dyn FnOnce(Result<Arc<Generation>, StoreError>) + Send>;

struct Job {
    /// Until when a closed gate is waited for.
    deadline: Instant,
    work: Work,
}

/// The reader threads and the queue they drain.
pub(super) struct Readers {
    /// `None` once dropping: the threads end when the queue closes.
    tx: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Readers {
    /// Starts [`count`] readers.
    pub(super) fn start(shared: Arc<Shared>) -> Result<Self, StoreError> {
        let n = count();
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut readers = Self {
            tx: Some(tx),
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let shared = shared.clone();
            let rx = rx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("overseer-store-reader-{i}"))
                .spawn(move || run(&shared, &rx))
                // Dropping `readers` stops the threads already started.
                .map_err(|e| StoreError::io("cannot start a store reader thread", e))?;
            readers.threads.push(thread);
        }
        Ok(readers)
    }

    /// Runs `read` on a reader thread and waits (asynchronously) for its
    /// result.
    pub(super) async fn read<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Generation) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, result) = tokio::sync::oneshot::channel();
        let work: Work = Box::new(move |generation| {
            let _ = reply.send(generation.and_then(|g| read(&g)));
        });
        let job = Job {
            deadline: Instant::now() + READ_WAIT,
            work,
        };
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(job).ok())
            .ok_or_else(|| StoreError::Io("the store's reader threads have stopped".into()))?;
        result.await.map_err(|_| {
            // The read panicked (its reply was dropped unsent); the reader
            // thread itself carries on.
            StoreError::Io("a store read failed unexpectedly (it panicked)".into())
        })?
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        // Closing the queue ends each thread once it has finished the reads
        // already queued; the threads hold the opening, so they are joined
        // before the store's directory can be reopened.
        self.tx = None;
        super::group_commit::join_within(
            self.threads.drain(..),
            super::group_commit::JOIN_WAIT,
            "store reader",
        );
    }
}

/// How many readers a store runs: one per core, at least two, so that one
/// slow read does not hold up every other.
pub(super) fn count() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

fn run(shared: &Shared, rx: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only while taking one job: a reader waiting for
        // the queue holds it, the others wait for the lock, and whichever
        // finishes a read first takes the next.
        let job = match rx.lock().unwrap_or_else(PoisonError::into_inner).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let generation = shared.gate.get_by(job.deadline);
        // A panicking read drops its reply (its caller gets an error); the
        // thread must survive it, or the pool would shrink with each one.
        if std::panic::catch_unwind(AssertUnwindSafe(|| (job.work)(generation))).is_err() {
            tracing::error!("a store read panicked");
        }
    }
}
