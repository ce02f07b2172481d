//! The gate: which opening of the database readers use right now, and
//! whether the store takes writes.
//!
//! After a write or a flush fails, sled holds in memory writes that never
//! reached the disk (and sled 0.34 refuses every later write until the
//! database is opened again). Whoever sees the failure closes the gate before
//! telling anyone, so no reader sees those writes from then on: a session
//! actor restarted after its failed checkpoint reloads what is durable, not
//! what it was told failed. The writer then opens the directory again and
//! installs the new opening, for reads at once, and for writes once a write
//! and a flush went through (see `group_commit`). Readers arriving while the
//! gate is closed wait a little for it to reopen.
//!
//! It logs the transitions, once each: a warning when the store stops taking
//! writes, an info line when it takes them again.
//!
//! It deliberately decides nothing about when to reopen; that is the writer's.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use overseer_actors::store::StoreError;

use super::open::Generation;

/// How long a read waits for a closed gate to reopen before failing.
pub(super) const READ_WAIT: Duration = Duration::from_secs(2);

pub(super) struct Gate {
    dir: PathBuf,
    slot: Mutex<Slot>,
    changed: Condvar,
}

struct Slot {
    /// What readers use; `None` while the writer reopens the directory (or
    /// could not yet).
    current: Option<Arc<Generation>>,
    /// Set while the store does not take writes.
    outage: Option<Outage>,
}

struct Outage {
    since: Instant,
    cause: String,
}

impl Gate {
    pub(super) fn new(dir: PathBuf, generation: Arc<Generation>) -> Self {
        Self {
            dir,
            slot: Mutex::new(Slot {
                current: Some(generation),
                outage: None,
            }),
            changed: Condvar::new(),
        }
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The opening to read from, waiting up to [`READ_WAIT`] while the gate
    /// is closed.
    pub(super) fn get(&self) -> Result<Arc<Generation>, StoreError> {
        self.get_by(Instant::now() + READ_WAIT)
    }

    /// The opening to read from, waiting until `deadline` while the gate is
    /// closed (a read waits from when it was asked for, see `readers`).
    pub(super) fn get_by(&self, deadline: Instant) -> Result<Arc<Generation>, StoreError> {
        let mut slot = self.slot();
        loop {
            if let Some(current) = &slot.current {
                return Ok(current.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Io(format!(
                    "the store in {} is being reopened after a write failure ({})",
                    self.dir.display(),
                    slot.outage.as_ref().map_or("", |o| o.cause.as_str())
                )));
            }
            slot = self
                .changed
                .wait_timeout(slot, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// After `generation` failed to write or flush: marks it failed, takes it
    /// away from readers (if it is still the current one) and starts an
    /// outage, logging it if the store was writable until now.
    pub(super) fn close(&self, generation: &Arc<Generation>, cause: &str) {
        generation.fail(cause);
        let mut slot = self.slot();
        if slot
            .current
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, generation))
        {
            slot.current = None;
        }
        self.start_outage(&mut slot, cause);
    }

    /// Takes a generation that is not failed (a reopening whose writes were
    /// not confirmed yet) away from readers, to reopen the directory.
    pub(super) fn withdraw(&self, generation: &Arc<Generation>) {
        let mut slot = self.slot();
        if slot
            .current
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, generation))
        {
            slot.current = None;
        }
    }

    fn start_outage(&self, slot: &mut Slot, cause: &str) {
        if slot.outage.is_none() {
            tracing::warn!(
                dir = %self.dir.display(),
                error = %cause,
                "the store stopped taking writes; checkpoints fail until it recovers (it retries on its own)"
            );
            slot.outage = Some(Outage {
                since: Instant::now(),
                cause: cause.to_owned(),
            });
        }
    }

    /// Installs a new opening for readers. `writable`: a write and a flush
    /// went through on it, which ends an outage.
    pub(super) fn install(&self, generation: Arc<Generation>, writable: bool, cause: &str) {
        let mut slot = self.slot();
        slot.current = Some(generation);
        if writable {
            if let Some(outage) = slot.outage.take() {
                tracing::info!(
                    dir = %self.dir.display(),
                    after_secs = outage.since.elapsed().as_secs_f64(),
                    "the store takes writes again"
                );
            }
        } else {
            self.start_outage(&mut slot, cause);
        }
        drop(slot);
        self.changed.notify_all();
    }

    /// The error a write gets during an outage.
    pub(super) fn unwritable(&self) -> StoreError {
        let slot = self.slot();
        let (secs, cause) = slot.outage.as_ref().map_or((0, "unknown"), |o| {
            (o.since.elapsed().as_secs(), o.cause.as_str())
        });
        StoreError::Io(format!(
            "the store in {} does not take writes (for {secs} s, since: {cause}); nothing was \
             written, it retries on its own",
            self.dir.display()
        ))
    }
}
