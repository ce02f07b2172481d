//! The gate: which opening of the database readers use right now, and
//! whether the store takes writes.
//!
//! After a write or a flush fails, sled holds in memory writes that never
//! reached the disk (and sled 0.34 refuses every later write until the
//! database is opened again). Whoever sees the failure closes the gate before
//! telling anyone, so no reader sees those writes from then on: a session
//! actor restarted after its failed checkpoint reloads what is durable, not
//! what it was told failed. The writer opens the directory again once the
//! disk takes data, and installs the new opening, for reads at once, and for
//! writes once a write and a flush went through (see `group_commit`).
//!
//! Nobody waits for the gate longer than it takes to reopen: a read waits
//! only while the writer is actually reopening the directory (a fraction of
//! a second, bounded by the read's own deadline); otherwise, while the store
//! is down, every read and write fails at once with
//! [`StoreError::Unavailable`], which callers answer as "retry shortly".
//!
//! It logs the outage: a warning when the store stops taking writes, a
//! reminder at most every [`REMINDER`] while it lasts (how long, how many
//! writes were refused, why the last attempt to recover failed), and an info
//! line when it takes writes again.
//!
//! It deliberately decides nothing about when to reopen; that is the writer's.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use overseer_actors::store::StoreError;

use super::trees::Generation;

/// How long a read waits for the writer to finish reopening the directory
/// before failing.
pub(super) const READ_WAIT: Duration = Duration::from_secs(2);
/// Least time between two log lines about one outage.
pub(super) const REMINDER: Duration = Duration::from_secs(60);

pub(super) struct Gate {
    dir: PathBuf,
    slot: Mutex<Slot>,
    changed: Condvar,
}

struct Slot {
    /// What readers use; `None` while the directory is not open (after a
    /// failure, until a reopen succeeds).
    current: Option<Arc<Generation>>,
    /// Set while the writer reopens the directory: only then do reads wait.
    reopening: bool,
    /// Set while the store does not take writes.
    outage: Option<Outage>,
}

struct Outage {
    since: Instant,
    cause: String,
    /// When the outage was last logged.
    logged: Instant,
    /// Writes refused since then.
    refused: u64,
    /// Why the last attempt to take writes again failed.
    last_attempt: Option<String>,
}

impl Gate {
    pub(super) fn new(dir: PathBuf, generation: Arc<Generation>) -> Self {
        Self {
            dir,
            slot: Mutex::new(Slot {
                current: Some(generation),
                reopening: false,
                outage: None,
            }),
            changed: Condvar::new(),
        }
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The opening to read from, waiting up to [`READ_WAIT`] while the
    /// directory is being reopened.
    pub(super) fn get(&self) -> Result<Arc<Generation>, StoreError> {
        self.get_by(Instant::now() + READ_WAIT)
    }

    /// The opening to read from. While the directory is being reopened it
    /// waits until `deadline` (a read waits from when it was asked for, see
    /// `readers`); while it is not open and nobody reopens it (the disk
    /// still refuses data) it fails at once.
    pub(super) fn get_by(&self, deadline: Instant) -> Result<Arc<Generation>, StoreError> {
        let mut slot = self.slot();
        loop {
            if let Some(current) = &slot.current {
                return Ok(current.clone());
            }
            let now = Instant::now();
            if !slot.reopening || now >= deadline {
                return Err(self.unreadable(&slot));
            }
            slot = self
                .changed
                .wait_timeout(slot, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn unreadable(&self, slot: &Slot) -> StoreError {
        let (secs, cause) = slot.outage.as_ref().map_or((0, "unknown"), |o| {
            (o.since.elapsed().as_secs(), o.cause.as_str())
        });
        let state = if slot.reopening {
            "is being reopened"
        } else {
            "is closed until the disk takes data again"
        };
        StoreError::Unavailable(format!(
            "the store in {} {state} after a write failure ({cause}, {secs} s ago); it recovers \
             on its own",
            self.dir.display()
        ))
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

    /// The writer starts reopening the directory: `held` (if it is what
    /// readers use) is taken away from them, and reads wait for the new
    /// opening instead of failing.
    pub(super) fn begin_reopen(&self, held: Option<&Arc<Generation>>) {
        let mut slot = self.slot();
        if let (Some(current), Some(held)) = (&slot.current, held) {
            if Arc::ptr_eq(current, held) {
                slot.current = None;
            }
        }
        slot.reopening = true;
    }

    /// A reopen (or the check before it) failed with `cause`: reads waiting
    /// for it fail now, and the next reminder says why.
    pub(super) fn reopen_failed(&self, cause: &str) {
        let mut slot = self.slot();
        slot.reopening = false;
        if let Some(outage) = &mut slot.outage {
            outage.last_attempt = Some(cause.to_owned());
        }
        drop(slot);
        self.changed.notify_all();
    }

    fn start_outage(&self, slot: &mut Slot, cause: &str) {
        if slot.outage.is_none() {
            tracing::warn!(
                dir = %self.dir.display(),
                error = %cause,
                "the store stopped taking writes; requests that need it are answered 503 until \
                 it recovers, which it does on its own once the disk takes data again"
            );
            let now = Instant::now();
            slot.outage = Some(Outage {
                since: now,
                cause: cause.to_owned(),
                logged: now,
                refused: 0,
                last_attempt: None,
            });
        }
    }

    /// Logs that the outage goes on, if it was last logged [`REMINDER`] ago
    /// or more. The writer calls it on every turn of its loop.
    pub(super) fn remind(&self) {
        let mut slot = self.slot();
        let Some(outage) = &mut slot.outage else {
            return;
        };
        if outage.logged.elapsed() < REMINDER {
            return;
        }
        tracing::warn!(
            dir = %self.dir.display(),
            for_secs = outage.since.elapsed().as_secs(),
            refused = outage.refused,
            error = %outage.cause,
            last_attempt = outage.last_attempt.as_deref().unwrap_or("none yet"),
            "the store still does not take writes; it keeps retrying"
        );
        outage.logged = Instant::now();
        outage.refused = 0;
    }

    /// Installs a new opening for readers. `writable`: a write and a flush
    /// went through on it, which ends an outage.
    pub(super) fn install(&self, generation: Arc<Generation>, writable: bool, cause: &str) {
        let mut slot = self.slot();
        slot.current = Some(generation);
        slot.reopening = false;
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
            if let Some(outage) = &mut slot.outage {
                outage.last_attempt = Some(cause.to_owned());
            }
        }
        drop(slot);
        self.changed.notify_all();
    }

    /// The outage going on, in a line, if there is one.
    pub(super) fn outage(&self) -> Option<String> {
        let slot = self.slot();
        let outage = slot.outage.as_ref()?;
        Some(format!(
            "the store in {} does not take writes (for {} s, since: {})",
            self.dir.display(),
            outage.since.elapsed().as_secs(),
            outage.cause
        ))
    }

    /// The error a write gets during an outage (and counts it for the next
    /// reminder).
    pub(super) fn unwritable(&self) -> StoreError {
        let mut slot = self.slot();
        let (secs, cause) = match &mut slot.outage {
            Some(o) => {
                o.refused += 1;
                (o.since.elapsed().as_secs(), o.cause.clone())
            }
            None => (0, "unknown".to_owned()),
        };
        StoreError::Unavailable(format!(
            "the store in {} does not take writes (for {secs} s, since: {cause}); nothing was \
             written, it recovers on its own",
            self.dir.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;

    use super::*;
    use crate::store::sled::open::{open, Purpose};
    use crate::store::StoreOptions;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn count(&self, needle: &str) -> usize {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .lines()
                .filter(|l| l.contains(needle))
                .count()
        }
    }

    /// One warning when the store stops taking writes, however many
    /// failures follow; a reminder only once [`REMINDER`] has passed since
    /// the last line (with how many writes were refused meanwhile); one
    /// info line when it takes writes again.
    #[test]
    fn an_outage_is_logged_once_then_reminded_at_most_every_minute() {
        let dir = tempfile::tempdir().unwrap();
        let generation = Arc::new(
            open(dir.path(), &StoreOptions::default(), Purpose::Serve)
                .unwrap()
                .generation,
        );
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let gate = Gate::new(dir.path().to_owned(), generation.clone());
            for _ in 0..5 {
                gate.close(&generation, "No space left on device");
                let _ = gate.unwritable();
                gate.remind();
            }
            assert_eq!(lines.count("stopped taking writes"), 1);
            assert_eq!(lines.count("still does not take writes"), 0);
            // A minute later by the outage's own clock.
            {
                let mut slot = gate.slot();
                let outage = slot.outage.as_mut().unwrap();
                outage.logged = Instant::now().checked_sub(REMINDER).unwrap();
            }
            gate.remind();
            gate.remind();
            assert_eq!(lines.count("still does not take writes"), 1);
            assert_eq!(lines.count("refused=5"), 1, "the reminder counts refusals");
            gate.install(generation.clone(), true, "");
            gate.remind();
            assert_eq!(lines.count("takes writes again"), 1);
            assert_eq!(lines.count("still does not take writes"), 1);
            assert_eq!(lines.count("stopped taking writes"), 1);
        });
    }
}
