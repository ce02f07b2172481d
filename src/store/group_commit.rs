//! Group commit: the writer and flusher threads behind [`super::SledStore`].
//!
//! Async tasks hand an encoded checkpoint to the *writer* thread and await a
//! oneshot reply; they never touch sled's write path nor wait on a disk. The
//! writer takes whatever is queued (up to [`MAX_GROUP`]), applies it as ONE
//! sled transaction (each checkpoint stays atomic: a group is a larger atomic
//! unit), and then either replies at once (`os`) or passes the replies to the
//! *flusher* thread (`fsync`). The flusher takes every reply passed to it so
//! far, flushes once, and releases them all: each of them belongs to a group
//! that was applied before it was handed over, so that one flush covers them
//! all. While it flushes, the writer applies the next groups, which the next
//! flush covers. Nobody waits for a timer: under load, groups grow by
//! themselves to match how long applying and flushing take.
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
use sled::transaction::{
    ConflictableTransactionError, TransactionError, TransactionResult, Transactional,
};
use sled::Tree;
use tokio::sync::oneshot;

use super::codec::{self, Prepared};
use super::durable::Durable;
use super::Durability;

/// Most checkpoints in one transaction, and most bytes: bounds how long one
/// transaction holds sled's global write lock, which readers wait on (at some
/// 40 µs per small checkpoint, 256 is about 10 ms).
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
        let outcomes = apply(trees, &prepared);
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

/// One checkpoint that passed the checks, with the index writes it needs.
struct Accepted<'a> {
    p: &'a Prepared,
    previous: Previous,
    new_blobs: Vec<usize>,
}

/// Applies a group and returns one outcome per checkpoint. A checkpoint over
/// a header of a newer schema is refused on its own and writes nothing; the
/// others go in ONE transaction (each stays atomic, the group is a larger
/// atomic unit), so a storage failure fails the whole group.
///
/// All reads happen before the transaction, which is safe because this thread
/// is the only writer. They serve two purposes: a group where everything is
/// refused runs no transaction at all (sled logs a batch marker even for an
/// empty one, and a refusal must leave the files untouched), and the
/// transaction itself only writes.
fn apply(trees: &Trees, group: &[Box<Prepared>]) -> Vec<Result<(), StoreError>> {
    let mut outcomes: Vec<Result<(), StoreError>> = Vec::with_capacity(group.len());
    let mut accepted = Vec::with_capacity(group.len());
    // Later checkpoints of a session in the same group see the earlier ones.
    let mut in_group: HashMap<SessionId, Previous> = HashMap::new();
    let mut blobs_in_group: HashSet<&str> = HashSet::new();
    for (n, p) in group.iter().enumerate() {
        match check(trees, p, &in_group, &blobs_in_group) {
            Ok((previous, new_blobs)) => {
                in_group.insert(
                    p.id,
                    Some(Known {
                        schema_version: p.schema_version,
                        tenant: Some(p.tenant.clone()),
                        active: Some(p.active),
                    }),
                );
                blobs_in_group.extend(new_blobs.iter().map(|&i| p.blobs[i].0.as_str()));
                outcomes.push(Ok(()));
                accepted.push((
                    n,
                    Accepted {
                        p,
                        previous,
                        new_blobs,
                    },
                ));
            }
            Err(e) => outcomes.push(Err(e)),
        }
    }
    if accepted.is_empty() {
        return outcomes;
    }

    let result: TransactionResult<(), ()> = (
        &trees.sessions,
        &trees.transcript,
        &trees.events,
        &trees.tenants,
        &trees.active,
        &trees.blobs,
    )
        .transaction(|(sessions, transcript, events, tenants, active, blobs)| {
            for (
                _,
                Accepted {
                    p,
                    previous,
                    new_blobs,
                },
            ) in &accepted
            {
                let key = &p.id.as_bytes()[..];
                sessions.insert(key, p.header.clone())?;
                for (k, v) in &p.entries {
                    transcript.insert(&k[..], v.clone())?;
                }
                for (k, v) in &p.events {
                    events.insert(&k[..], v.clone())?;
                }
                for &i in new_blobs {
                    let (hash, data) = &p.blobs[i];
                    blobs.insert(hash.as_bytes(), data.clone())?;
                }

                let old_tenant = previous.as_ref().and_then(|k| k.tenant.as_deref());
                if old_tenant != Some(p.tenant.as_str()) {
                    if let Some(old) = old_tenant {
                        tenants.remove(codec::tenant_key(old, &p.id))?;
                    }
                    tenants.insert(codec::tenant_key(&p.tenant, &p.id), &[][..])?;
                }

                let was_active = match previous {
                    None => Some(false),
                    Some(known) => known.active,
                };
                if was_active != Some(p.active) {
                    if p.active {
                        active.insert(key, &[][..])?;
                    } else {
                        active.remove(key)?;
                    }
                }
            }
            Ok::<_, ConflictableTransactionError<()>>(())
        });
    if let Err(e) = result {
        let detail = match e {
            TransactionError::Storage(e) => e.to_string(),
            TransactionError::Abort(()) => "transaction aborted".into(),
        };
        // Every accepted checkpoint shared the failed transaction.
        for (n, a) in &accepted {
            outcomes[*n] = Err(StoreError::Io(format!(
                "checkpoint of session {}: {detail}",
                a.p.id
            )));
        }
    }
    outcomes
}

/// Decides whether `p` may be written, and which of its blobs are new.
fn check(
    trees: &Trees,
    p: &Prepared,
    in_group: &HashMap<SessionId, Previous>,
    blobs_in_group: &HashSet<&str>,
) -> Result<(Previous, Vec<usize>), StoreError> {
    let previous = match in_group.get(&p.id) {
        Some(previous) => previous.clone(),
        None => stored_previous(trees, p)?,
    };
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
