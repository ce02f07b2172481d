//! Single-flight of client-keyed requests: a create with an
//! `idempotency_key`, a message with a `message_id`.
//!
//! The durable record of a key is elsewhere: a keyed create names a session
//! id derived from the key, so the store answers whether it exists; a
//! message's `message_id` is recorded by the session (`recent_messages`), so a
//! retry after a restart or after eviction from this log is still
//! recognised. What this module adds is the in-process part: concurrent
//! duplicates wait for the first attempt instead of racing it (and share its
//! outcome), and a sequential retry after a success is answered without a
//! round trip to the session. It also tells a reused key with a different
//! request apart, by a SHA-256 digest of what the first request said.
//!
//! Memory is bounded by design: an entry holds the digest (32 bytes), never
//! the request's text; a failed attempt is forgotten as soon as its
//! concurrent duplicates have its outcome (a failure has no effect to
//! protect, so a later retry, with the same or a different text, runs
//! afresh); and at most `capacity` keys are remembered, oldest first out.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

/// How many keys are remembered before the oldest are forgotten. At about
/// 100 bytes an entry (key digest, fingerprint digest, bookkeeping) the log
/// stays near 10 MB when full.
pub(crate) const DEFAULT_CAPACITY: usize = 100_000;

/// A SHA-256 digest.
pub(crate) type Digest32 = [u8; 32];

/// The SHA-256 digest of `parts`, each length-prefixed so that no two
/// different sequences of parts share a digest.
pub(crate) fn digest(parts: &[&[u8]]) -> Digest32 {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

struct Entry<E> {
    /// Digest of what the first request said (e.g. the message text), so a
    /// reused key with a different request is recognisable.
    fingerprint: Digest32,
    /// Which insertion this is, so that evicting a key that failed and was
    /// inserted again removes only the stale generation.
    generation: u64,
    /// The outcome of the first attempt, shared with concurrent duplicates.
    outcome: OnceCell<Result<(), E>>,
}

struct Inner<K, E> {
    entries: HashMap<K, Arc<Entry<E>>>,
    /// Insertion order, for eviction. Keys whose entry was forgotten after a
    /// failure stay here until they reach the front (bounded: see `insert`).
    order: VecDeque<(K, u64)>,
    next_generation: u64,
}

/// The outcome of [`IdempotencyLog::run`].
#[derive(Debug)]
pub(crate) enum Outcome<E> {
    /// The operation ran now, or had already succeeded under this key.
    Done,
    /// The key was used before with a different fingerprint.
    Mismatch,
    /// The operation failed (for this caller and its concurrent duplicates);
    /// the key is forgotten, so a later retry runs it again.
    Failed(E),
}

/// Keys of operations that succeeded (or are in flight).
pub(crate) struct IdempotencyLog<K, E> {
    // A std mutex: critical sections are a few map operations and are never
    // held across an await.
    inner: Mutex<Inner<K, E>>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, E: Clone> IdempotencyLog<K, E> {
    /// An empty log remembering at most `capacity` keys.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: VecDeque::new(),
                next_generation: 0,
            }),
            capacity: capacity.max(1),
        }
    }

    /// How many keys are remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K, E>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `op` once per `key`: concurrent callers with the same key wait for
    /// the first and share its outcome; callers after a success do not run it
    /// again; after a failure the key is forgotten and the next caller runs it.
    pub(crate) async fn run<F, Fut>(&self, key: K, fingerprint: &[u8], op: F) -> Outcome<E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let fingerprint = digest(&[fingerprint]);
        let entry = self.entry(&key, fingerprint);
        if entry.fingerprint != fingerprint {
            return Outcome::Mismatch;
        }
        match entry.outcome.get_or_init(op).await {
            Ok(()) => Outcome::Done,
            Err(e) => {
                let e = e.clone();
                self.forget(&key, &entry);
                Outcome::Failed(e)
            }
        }
    }

    fn entry(&self, key: &K, fingerprint: Digest32) -> Arc<Entry<E>> {
        let mut inner = self.lock();
        if let Some(e) = inner.entries.get(key) {
            return e.clone();
        }
        let generation = inner.next_generation;
        inner.next_generation += 1;
        let entry = Arc::new(Entry {
            fingerprint,
            generation,
            outcome: OnceCell::new(),
        });
        inner.entries.insert(key.clone(), entry.clone());
        inner.order.push_back((key.clone(), generation));
        // Evict the oldest while over capacity. The order queue may also hold
        // keys already forgotten after a failure; it is trimmed at twice the
        // capacity, so neither structure grows without bound.
        while inner.entries.len() > self.capacity || inner.order.len() > 2 * self.capacity {
            let Some((old, old_generation)) = inner.order.pop_front() else {
                break;
            };
            if inner
                .entries
                .get(&old)
                .is_some_and(|e| e.generation == old_generation)
            {
                inner.entries.remove(&old);
            }
        }
        entry
    }

    /// Forgets `key` if it still maps to `entry` (a failed attempt).
    fn forget(&self, key: &K, entry: &Arc<Entry<E>>) {
        let mut inner = self.lock();
        if inner
            .entries
            .get(key)
            .is_some_and(|e| Arc::ptr_eq(e, entry))
        {
            inner.entries.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overseer_actors::model::SessionId;
    use overseer_actors::SessionError;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn runs_once_per_key_and_retries_after_failure() {
        let log = IdempotencyLog::<&str, &str>::new(2);
        let runs = AtomicUsize::new(0);
        let op = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        assert!(matches!(log.run("a", b"x", op).await, Outcome::Done));
        assert!(matches!(log.run("a", b"x", op).await, Outcome::Done));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(matches!(log.run("a", b"y", op).await, Outcome::Mismatch));
        assert!(matches!(
            log.run("b", b"x", || async { Err("boom") }).await,
            Outcome::Failed("boom")
        ));
        assert!(matches!(log.run("b", b"x", op).await, Outcome::Done));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // Capacity 2: a third key evicts "a", which then runs again.
        assert!(matches!(log.run("c", b"x", op).await, Outcome::Done));
        assert!(matches!(log.run("a", b"x", op).await, Outcome::Done));
        assert_eq!(runs.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn failed_keys_are_forgotten_and_reusable_with_another_text() {
        let log = IdempotencyLog::<String, &str>::new(1_000);
        for i in 0..5_000 {
            let out = log
                .run(format!("k{i}"), &[b'x'; 4096], || async { Err("terminal") })
                .await;
            assert!(matches!(out, Outcome::Failed("terminal")));
        }
        assert_eq!(log.len(), 0, "no failed attempt is remembered");
        assert!(
            log.lock().order.len() <= 2 * 1_000,
            "the eviction queue stays bounded too"
        );
        // A key whose attempt failed is free for a different request.
        assert!(matches!(
            log.run("k7".into(), b"other text", || async { Ok(()) })
                .await,
            Outcome::Done
        ));
        assert_eq!(log.len(), 1);
    }

    #[tokio::test]
    async fn only_a_digest_of_the_request_is_kept() {
        let log = IdempotencyLog::<&str, ()>::new(10);
        let text = vec![b'z'; 1 << 20];
        assert!(matches!(
            log.run("m", &text, || async { Ok(()) }).await,
            Outcome::Done
        ));
        let entry = log.lock().entries.get("m").cloned();
        let entry = entry.unwrap();
        // Everything an entry holds, by name and type, each of a fixed
        // size: a field added to keep more (the text, the request), or a
        // digest turned into a buffer, fails to compile here. (Measuring
        // the entry's size could not see what it points to.)
        let Entry {
            fingerprint,
            generation,
            outcome,
        } = &*entry;
        let _: (&Digest32, &u64) = (fingerprint, generation);
        let _: &OnceCell<Result<(), ()>> = outcome;
        assert_eq!(*fingerprint, digest(&[&text]));
        assert_eq!(outcome.get(), Some(&Ok(())), "a success holds nothing else");
        drop(entry);
        // And the keys the API uses are fixed-size too: a session id, and a
        // session id with the digest of the client's `message_id`.
        fn keys(inner: &super::super::Inner) {
            let _: &IdempotencyLog<SessionId, SessionError> = &inner.creates;
            let _: &IdempotencyLog<(SessionId, Digest32), SessionError> = &inner.messages;
        }
        let _ = keys;
        // The same text again matches; one byte different does not.
        assert!(matches!(
            log.run("m", &text, || async { Ok(()) }).await,
            Outcome::Done
        ));
        let mut other = text.clone();
        other[12_345] = b'y';
        assert!(matches!(
            log.run("m", &other, || async { Ok(()) }).await,
            Outcome::Mismatch
        ));
    }

    #[tokio::test]
    async fn concurrent_duplicates_share_one_failure() {
        let log = IdempotencyLog::<&str, &str>::new(10);
        let runs = AtomicUsize::new(0);
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let first = log.run("k", b"t", || async {
            runs.fetch_add(1, Ordering::SeqCst);
            let _ = wait.await;
            Err("refused")
        });
        let second = async {
            // Runs once the first attempt holds the entry.
            tokio::task::yield_now().await;
            let out = log
                .run("k", b"t", || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .await;
            out
        };
        let releaser = async {
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            let _ = release.send(());
        };
        let (a, b, ()) = tokio::join!(first, second, releaser);
        assert!(matches!(a, Outcome::Failed("refused")));
        assert!(matches!(b, Outcome::Failed("refused")));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(log.len(), 0);
    }
}
