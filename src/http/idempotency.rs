//! Single-flight and replay protection for client-keyed requests: a create
//! with a client-chosen session id, a message with a `message_id`.
//!
//! This module owns *in-process* deduplication: concurrent duplicates wait for
//! the first attempt instead of racing it, and a retry after success is
//! answered without a second effect. It deliberately keeps only a bounded,
//! in-memory record: for creates the store is the durable record (the handler
//! compares a retry with the stored session), but message ids are not yet
//! recorded in the session itself, so a message retried after a server
//! restart, or after its key was evicted, is delivered again. Making that
//! durable needs the session actor to record `message_id`.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

/// How many keys are remembered before the oldest are forgotten.
pub(crate) const DEFAULT_CAPACITY: usize = 100_000;

struct Entry {
    /// What the first request said (e.g. the message text), so a reused key
    /// with a different request is recognisable.
    fingerprint: String,
    /// Initialised once the keyed operation succeeded.
    done: OnceCell<()>,
}

struct Inner<K> {
    entries: HashMap<K, Arc<Entry>>,
    order: VecDeque<K>,
}

/// The outcome of [`IdempotencyLog::run`].
#[derive(Debug)]
pub(crate) enum Outcome<E> {
    /// The operation ran now, or had already succeeded under this key.
    Done,
    /// The key was used before with a different fingerprint.
    Mismatch,
    /// The operation failed (a later retry under the same key runs it again).
    Failed(E),
}

/// Keys of operations that succeeded (or are in flight).
pub(crate) struct IdempotencyLog<K> {
    // A std mutex: critical sections are a few map operations and are never
    // held across an await.
    inner: Mutex<Inner<K>>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone> IdempotencyLog<K> {
    /// An empty log remembering at most `capacity` keys.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: VecDeque::new(),
            }),
            capacity: capacity.max(1),
        }
    }

    /// Runs `op` once per `key`: concurrent callers with the same key wait for
    /// the first; callers after a success do not run it again; after a
    /// failure the next caller runs it.
    pub(crate) async fn run<E, F, Fut>(&self, key: K, fingerprint: &str, op: F) -> Outcome<E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let entry = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match inner.entries.get(&key) {
                Some(e) => e.clone(),
                None => {
                    let e = Arc::new(Entry {
                        fingerprint: fingerprint.to_owned(),
                        done: OnceCell::new(),
                    });
                    inner.entries.insert(key.clone(), e.clone());
                    inner.order.push_back(key);
                    while inner.order.len() > self.capacity {
                        if let Some(old) = inner.order.pop_front() {
                            inner.entries.remove(&old);
                        }
                    }
                    e
                }
            }
        };
        if entry.fingerprint != fingerprint {
            return Outcome::Mismatch;
        }
        match entry.done.get_or_try_init(op).await {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::Failed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn runs_once_per_key_and_retries_after_failure() {
        let log = IdempotencyLog::new(2);
        let runs = AtomicUsize::new(0);
        let op = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<(), ()>(())
        };
        assert!(matches!(log.run("a", "x", op).await, Outcome::Done));
        assert!(matches!(log.run("a", "x", op).await, Outcome::Done));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(matches!(log.run("a", "y", op).await, Outcome::Mismatch));
        assert!(matches!(
            log.run("b", "x", || async { Err::<(), _>("boom") }).await,
            Outcome::Failed("boom")
        ));
        assert!(matches!(log.run("b", "x", op).await, Outcome::Done));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // Capacity 2: a third key evicts "a", which then runs again.
        assert!(matches!(log.run("c", "x", op).await, Outcome::Done));
        assert!(matches!(log.run("a", "x", op).await, Outcome::Done));
        assert_eq!(runs.load(Ordering::SeqCst), 4);
    }
}
