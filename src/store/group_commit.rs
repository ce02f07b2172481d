//! Group commit: the writer and flusher threads behind [`super::SledStore`].
//!
//! Async tasks hand an encoded checkpoint to the *writer* thread and await a
//! oneshot reply; they never touch sled's write path nor wait on a disk. The
//! writer takes whatever is queued (up to [`MAX_GROUP`]), writes it with
//! plain sled inserts, the `sessions` headers after everything they cover, as
//! the commit record (see [`apply`] for why that keeps every checkpoint atomic
//! without a sled transaction), and then either replies at once (`os`) or
//! passes the replies to the *flusher* thread (`fsync`). The flusher takes every reply
//! passed to it so far, flushes once, and releases them all: each of them
//! belongs to a group that was applied before it was handed over, so that one
//! flush covers them all. While it flushes, the writer applies the next
//! groups, which the next flush covers. Nobody waits for a timer: under load,
//! groups grow by themselves to match how long applying and flushing take.
//!
//! This module deliberately owns neither the encoding (`codec` prepares the
//! bytes on the caller's side) nor reads (readers go to sled directly), nor
//! what a flush does on disk (`durable`).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use overseer_actors::model::{SessionId, SCHEMA_VERSION};
use overseer_actors::store::StoreError;
use sled::Tree;
use tokio::sync::oneshot;

use super::codec::{self, Prepared};
use super::durable::Durable;
use super::Durability;

/// Most checkpoints in one group, and most bytes: bounds how long the first
/// checkpoint of a group waits for the last to be written.
const MAX_GROUP: usize = 256;
const MAX_GROUP_BYTES: usize = 4 * 1024 * 1024;

/// Where a caller waits for its outcome.
pub(super) type Reply = oneshot::Sender<Result<(), StoreError>>;

/// What async tasks send to the writer.
pub(super) enum Command {
    /// Apply this checkpoint (and flush it, under `fsync`).
    Checkpoint(Box<Prepared>, Reply),
    /// Make everything applied so far durable.
    Flush(Reply),
}

/// The database and its trees, cloned (cheaply) into each thread.
#[derive(Clone)]
pub(super) struct Trees {
    pub(super) db: sled::Db,
    pub(super) sessions: Tree,
    pub(super) transcript: Tree,
    pub(super) events: Tree,
    pub(super) tenants: Tree,
    pub(super) active: Tree,
    pub(super) blobs: Tree,
    /// Test hook: when set, the writer stops each group right before its
    /// `sessions` writes (the commit record) and fails it, as a crash there
    /// would leave the trees.
    #[cfg(test)]
    pub(super) drop_headers: Arc<std::sync::atomic::AtomicBool>,
}

/// Handle on the two threads. Dropping it stops them after they have finished
/// everything already queued.
pub(super) struct GroupCommit {
    // Field order matters: `tx` drops first, which ends the writer's loop (and
    // in turn the flusher's), then `_threads` joins them (only its drop matters).
    tx: Sender<Command>,
    flushes: Arc<AtomicU64>,
    _threads: Threads,
}

impl GroupCommit {
    pub(super) fn start(
        trees: Trees,
        dir: &Path,
        durability: Durability,
    ) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel::<Command>();
        let (flush_tx, flush_rx) = mpsc::channel::<Vec<Reply>>();
        let flushes = Arc::new(AtomicU64::new(0));

        let flusher = {
            let mut durable = Durable::new(trees.db.clone(), dir).map_err(|e| {
                StoreError::Io(format!("opening the log of {}: {e}", dir.display()))
            })?;
            let flushes = flushes.clone();
            std::thread::Builder::new()
                .name("overseer-store-flusher".into())
                .spawn(move || run_flusher(&mut durable, &flush_rx, &flushes))
                .map_err(|e| {
                    StoreError::Io(format!("cannot start the store flusher thread: {e}"))
                })?
        };
        let writer = std::thread::Builder::new()
            .name("overseer-store-writer".into())
            .spawn(move || run_writer(&trees, &rx, &flush_tx, durability))
            .map_err(|e| StoreError::Io(format!("cannot start the store writer thread: {e}")))?;
        Ok(Self {
            tx,
            flushes,
            // Writer first: the flusher only stops once the writer is gone.
            _threads: Threads(vec![writer, flusher]),
        })
    }

    /// Queues a command. Never blocks (the channel is unbounded; callers are
    /// bounded by awaiting their own reply).
    pub(super) fn submit(&self, cmd: Command) -> Result<(), StoreError> {
        self.tx
            .send(cmd)
            .map_err(|_| StoreError::Io("the store writer thread has stopped".into()))
    }

    pub(super) fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }
}

struct Threads(Vec<JoinHandle<()>>);

impl Drop for Threads {
    fn drop(&mut self) {
        for handle in self.0.drain(..) {
            if handle.join().is_err() {
                tracing::error!("a store thread panicked");
            }
        }
    }
}

fn run_writer(
    trees: &Trees,
    rx: &Receiver<Command>,
    flush_tx: &Sender<Vec<Reply>>,
    durability: Durability,
) {
    let mut cache = Cache::default();
    while let Ok(first) = rx.recv() {
        let mut group = Vec::new();
        let mut flush_waiters = Vec::new();
        let mut bytes = 0;
        let mut next = Some(first);
        while let Some(cmd) = next.take() {
            match cmd {
                Command::Checkpoint(p, reply) => {
                    bytes += p.size();
                    group.push((p, reply));
                }
                Command::Flush(reply) => flush_waiters.push(reply),
            }
            if group.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
                next = rx.try_recv().ok();
            }
        }

        let (prepared, replies): (Vec<_>, Vec<_>) = group.into_iter().unzip();
        let outcomes = apply(trees, &mut cache, &prepared);
        let mut to_flush = flush_waiters;
        for (reply, outcome) in replies.into_iter().zip(outcomes) {
            match (outcome, durability) {
                (Ok(()), Durability::Fsync) => to_flush.push(reply),
                (outcome, _) => {
                    // A caller that stopped waiting is not an error.
                    let _ = reply.send(outcome);
                }
            }
        }
        if to_flush.is_empty() {
            continue;
        }
        if let Err(mpsc::SendError(waiters)) = flush_tx.send(to_flush) {
            for reply in waiters {
                let _ = reply.send(Err(StoreError::Io(
                    "the store flusher thread has stopped".into(),
                )));
            }
        }
    }
}

fn run_flusher(durable: &mut Durable, rx: &Receiver<Vec<Reply>>, flushes: &AtomicU64) {
    while let Ok(mut waiters) = rx.recv() {
        // Everything handed over so far was applied before it was handed
        // over, so this one flush covers all of it.
        while let Ok(more) = rx.try_recv() {
            waiters.extend(more);
        }
        let outcome = durable
            .flush()
            .map_err(|e| StoreError::Io(format!("flushing the store: {e}")));
        flushes.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = &outcome {
            tracing::error!(error = %e, "store flush failed");
        }
        for reply in waiters {
            let _ = reply.send(outcome.clone());
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
}

/// The header state of sessions the writer itself committed recently, so that
/// a checkpoint of a live session (the common case: every turn writes several)
/// does not read and parse its previous header back from sled. Correct because
/// this thread is the only writer of `sessions`: an entry is what is stored.
/// Bounded by [`CACHE_CAPACITY`]: when full it is simply emptied, and the
/// sessions still in use fill it again from disk, one read each.
#[derive(Default)]
struct Cache(HashMap<SessionId, Previous>);

impl Cache {
    fn get(&self, id: &SessionId) -> Option<&Previous> {
        self.0.get(id)
    }

    fn commit(&mut self, known: HashMap<SessionId, Previous>) {
        if self.0.len() + known.len() > CACHE_CAPACITY {
            self.0.clear();
        }
        self.0.extend(known);
    }

    /// After a failed write what is stored is unknown: read it again.
    fn forget<'a>(&mut self, ids: impl IntoIterator<Item = &'a SessionId>) {
        for id in ids {
            self.0.remove(id);
        }
    }
}

/// One write of a group: a key and its new value, `None` to remove it.
type Write = (sled::IVec, Option<sled::IVec>);

/// The writes of one group, per tree and phase, in commit order (see
/// [`apply`]).
#[derive(Default)]
struct Writes {
    blobs: Vec<Write>,
    transcript: Vec<Write>,
    events: Vec<Write>,
    tenants_added: Vec<Write>,
    active_added: Vec<Write>,
    sessions: Vec<Write>,
    tenants_removed: Vec<Write>,
    active_removed: Vec<Write>,
}

/// Applies a group and returns one outcome per checkpoint. A checkpoint over
/// a header of a newer schema is refused on its own and writes nothing; the
/// others are written together.
///
/// No sled transaction: profiling showed its multi-tree machinery (node
/// clones, splits, allocation) was most of the writer's time. Not even
/// `apply_batch` (each logs a batch manifest and takes sled's global write
/// lock), since nothing needs atomicity within one tree: plain inserts, in an
/// order that makes the `sessions` header the commit record of a checkpoint:
///
/// 1. `blobs`, `transcript`, `events`, and the index entries a session gains;
/// 2. `sessions`: the headers;
/// 3. the index entries a session loses.
///
/// Readers only trust what a header covers: transcript entries below its
/// `transcript_len`, events up to its `last_event_seq`, index entries whose
/// header agrees. sled recovers a prefix of its single log, so after a crash
/// either a header is there with everything written before it, or it is not
/// and what step 1 wrote lies beyond the previous header's counters, invisible,
/// and is overwritten (same keys) by the session's next checkpoint. Indexes
/// only ever hold a superset of the truth: gained entries precede the header,
/// lost ones follow it, so a crash leaves at worst a stale entry, which
/// readers filter out by the header (never a missing one, which boot recovery
/// could not see). Concurrent readers see the same thing as a crash would.
///
/// Index changes are computed per session over the whole group (first
/// previous state → last new state), so that a session leaving and re-entering
/// an index in one group is neither removed after being added nor the reverse.
///
/// All reads happen before the writes, which is safe because this thread is
/// the only writer.
fn apply(trees: &Trees, cache: &mut Cache, group: &[Box<Prepared>]) -> Vec<Result<(), StoreError>> {
    let mut outcomes: Vec<Result<(), StoreError>> = Vec::with_capacity(group.len());
    // Per session in this group: its state before the group, and the state
    // its latest accepted checkpoint leaves.
    let mut before: HashMap<SessionId, Previous> = HashMap::new();
    let mut after: HashMap<SessionId, Previous> = HashMap::new();
    let mut blobs_in_group: HashSet<&str> = HashSet::new();
    let mut writes = Writes::default();
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
                after.insert(
                    p.id,
                    Some(Known {
                        schema_version: p.schema_version,
                        tenant: Some(p.tenant.clone()),
                        active: Some(p.active),
                    }),
                );
                for &i in &new_blobs {
                    let (hash, data) = &p.blobs[i];
                    blobs_in_group.insert(hash.as_str());
                    writes
                        .blobs
                        .push((hash.as_bytes().into(), Some(data.clone())));
                }
                for (k, v) in &p.entries {
                    writes.transcript.push((k[..].into(), Some(v.clone())));
                }
                for (k, v) in &p.events {
                    writes.events.push((k[..].into(), Some(v.clone())));
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
        return outcomes;
    }

    for (id, first) in &before {
        let Some(Some(last)) = after.get(id) else {
            continue;
        };
        let key = &id.as_bytes()[..];
        let old_tenant = first.as_ref().and_then(|k| k.tenant.as_deref());
        if let Some(tenant) = last.tenant.as_deref() {
            if old_tenant != Some(tenant) {
                writes
                    .tenants_added
                    .push((codec::tenant_key(tenant, id).into(), Some(empty())));
                if let Some(old) = old_tenant {
                    writes
                        .tenants_removed
                        .push((codec::tenant_key(old, id).into(), None));
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

    match write(trees, writes) {
        Ok(()) => cache.commit(after),
        Err(e) => {
            // Every accepted checkpoint shared the failed write.
            cache.forget(after.keys());
            for (n, id) in &accepted {
                outcomes[*n] = Err(StoreError::Io(format!("checkpoint of session {id}: {e}")));
            }
        }
    }
    outcomes
}

fn empty() -> sled::IVec {
    sled::IVec::from(&[][..])
}

/// Applies the writes of a group in commit order (see [`apply`]). A group
/// where everything was refused has no writes at all, so it leaves the files
/// untouched.
fn write(trees: &Trees, writes: Writes) -> Result<(), String> {
    let Writes {
        blobs,
        transcript,
        events,
        tenants_added,
        active_added,
        sessions,
        tenants_removed,
        active_removed,
    } = writes;
    let order = [
        (&trees.blobs, blobs, "blobs"),
        (&trees.transcript, transcript, "transcript"),
        (&trees.events, events, "events"),
        (&trees.tenants, tenants_added, "tenants"),
        (&trees.active, active_added, "active"),
        (&trees.sessions, sessions, "sessions"),
        (&trees.tenants, tenants_removed, "tenants"),
        (&trees.active, active_removed, "active"),
    ];
    for (n, (tree, writes, name)) in order.into_iter().enumerate() {
        if writes.is_empty() {
            continue;
        }
        if crashed_before(trees, n) {
            return Err("test hook: the header writes were dropped".into());
        }
        for (key, value) in writes {
            match value {
                Some(value) => tree.insert(key, value),
                None => tree.remove(key),
            }
            .map_err(|e| format!("writing {name}: {e}"))?;
        }
    }
    Ok(())
}

/// Test hook: whether to stop before phase `n` of [`write`], as a crash right
/// before the commit record (the `sessions` writes, phase 5) would.
#[cfg(test)]
fn crashed_before(trees: &Trees, n: usize) -> bool {
    n >= 5 && trees.drop_headers.load(Ordering::Relaxed)
}

#[cfg(not(test))]
fn crashed_before(_: &Trees, _: usize) -> bool {
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
            StoreError::Io(format!(
                "checkpoint of session {}: reading blob {hash}: {e}",
                p.id
            ))
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
        StoreError::Io(format!(
            "checkpoint of session {}: reading its header: {e}",
            p.id
        ))
    })?;
    let Some(bytes) = stored else {
        return Ok(None);
    };
    let known = match serde_json::from_slice::<codec::Peek>(&bytes) {
        Ok(peek) => Known {
            schema_version: peek.schema_version,
            active: Some(peek.is_active()),
            tenant: peek.tenant,
        },
        Err(_) => Known {
            schema_version: 0,
            tenant: None,
            active: None,
        },
    };
    Ok(Some(known))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trees(dir: &Path) -> Trees {
        let db = sled::Config::new().path(dir).open().unwrap();
        let open = |name: &str| db.open_tree(name).unwrap();
        Trees {
            sessions: open("sessions"),
            transcript: open("transcript"),
            events: open("events"),
            tenants: open("tenants"),
            active: open("active"),
            blobs: open("blobs"),
            drop_headers: Arc::default(),
            db,
        }
    }

    fn prepared(id: SessionId, tenant: &str, active: bool, n: u8) -> Box<Prepared> {
        Box::new(Prepared {
            id,
            schema_version: SCHEMA_VERSION,
            tenant: tenant.into(),
            active,
            header: sled::IVec::from(vec![n]),
            entries: Vec::new(),
            events: Vec::new(),
            blobs: Vec::new(),
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
        let outcomes = apply(
            &trees,
            &mut cache,
            &[prepared(a, "t1", true, 1), prepared(b, "t1", false, 1)],
        );
        assert!(outcomes.iter().all(Result::is_ok));
        let group = [
            prepared(a, "t1", false, 2),
            prepared(b, "t1", true, 2),
            prepared(a, "t2", true, 3),
            prepared(b, "t1", false, 3),
        ];
        for cache in [&mut cache, &mut Cache::default()] {
            assert!(apply(&trees, cache, &group).iter().all(Result::is_ok));
            assert!(trees.active.contains_key(a.as_bytes()).unwrap());
            assert!(!trees.active.contains_key(b.as_bytes()).unwrap());
            let tenants: Vec<_> = trees.tenants.iter().keys().map(|k| k.unwrap()).collect();
            let mut want = vec![
                sled::IVec::from(codec::tenant_key("t1", &b)),
                sled::IVec::from(codec::tenant_key("t2", &a)),
            ];
            want.sort();
            assert_eq!(tenants, want);
            assert_eq!(trees.sessions.get(a.as_bytes()).unwrap().unwrap(), vec![3]);
        }
    }
}
