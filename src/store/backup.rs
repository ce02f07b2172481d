//! Backups of a store that may be serving: `overseer store backup` (from a
//! running server over `POST /v1/admin/backup`, or from a stopped store
//! directory) and `overseer store restore`.
//!
//! A backup is a directory holding a sled store (`store/`, openable by
//! `overseer serve --data DIR/store` as it is) and, written last, a manifest
//! (`overseer-backup.json`) that says it is complete: a directory without it
//! is an interrupted backup, never restored.
//!
//! Consistency, without stopping writes: the walk reads the source through
//! the [`CheckpointStore`] port, one session at a time, each as one whole
//! checkpoint ([`read_session`]: the header is the commit record, so the
//! transcript, metadata and queue it covers, and the events up to its
//! `last_event_seq`, are exactly one checkpoint's state, never half of two).
//! Every session acknowledged before the walk began is found by it (a
//! session's header, once written, stays until a purge), at a checkpoint at
//! least as new as the acknowledged one. Sessions are not in one
//! point-in-time snapshot with each other: a parent and its child may be
//! read at different checkpoints, as after a crash of the server (recovery
//! reconciles them the same way). Each copied session is written to the
//! backup as one checkpoint ([`write_session`]), through the port as well,
//! so the walk is engine-neutral (the PostgreSQL store has PostgreSQL's own
//! tools instead: `pg_dump`, point-in-time recovery; see the operations
//! docs).
//!
//! It owns the walk, the directory's shape, the manifest and its checks, and
//! the file copy of a restore. It deliberately knows no HTTP (the route is
//! `http::admin`, the command line `cli::store`) and no engine's keys. What
//! it leaves out: the webhook endpoints and their delivery logs (the
//! tenants' configuration, not sessions; see the docs page), and the
//! idempotency memory of recent requests.

use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use overseer_actors::model::{Event, QueuedMessage, SessionHeader, SessionId, TranscriptEntry};
use overseer_actors::store::{Checkpoint, CheckpointStore, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The manifest's file name, inside a backup directory.
pub const MANIFEST: &str = "overseer-backup.json";
/// The store's directory name, inside a backup directory.
pub const STORE_DIR: &str = "store";
/// The version of the manifest and of the stream of `POST /v1/admin/backup`.
pub const BACKUP_FORMAT: u32 = 1;

/// Headers read at once while walking a store.
const PAGE: usize = 256;
/// Events read at once while reading one session.
const EVENT_PAGE: usize = 4096;
/// How often a session that changed between its header and its queue
/// rows is read again (see [`read_session`]).
const READ_ATTEMPTS: usize = 5;

/// One session at one checkpoint, as a backup holds it (and as one line of
/// the backup stream carries it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionCopy {
    /// The header: the checkpoint this copy is.
    pub header: SessionHeader,
    /// The whole transcript the header covers.
    pub transcript: Vec<TranscriptEntry>,
    /// The caller's metadata (`null` when none).
    pub metadata: Value,
    /// The queued messages the header covers, oldest first.
    pub inbox: Vec<QueuedMessage>,
    /// Every event up to the header's `last_event_seq`.
    pub events: Vec<Event>,
}

/// One line of the backup stream (`application/x-ndjson`): sessions, then
/// exactly one `end` when the walk finished, or one `error` when it could
/// not. A stream that stops without either was cut: the backup is not
/// complete.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamLine {
    /// The stream's first line.
    Begin {
        /// [`BACKUP_FORMAT`].
        format: u32,
        /// When the walk began (RFC 3339): every session acknowledged
        /// before it is in the backup.
        started_at: String,
    },
    /// A session.
    Session(Box<SessionCopy>),
    /// The walk finished: how many sessions and events were sent.
    End {
        /// Sessions sent.
        sessions: u64,
        /// Events sent.
        events: u64,
    },
    /// The walk failed; nothing after it.
    Error {
        /// Why.
        message: String,
    },
}

/// The manifest of a complete backup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`BACKUP_FORMAT`].
    pub format: u32,
    /// The overseer version that wrote it.
    pub overseer: String,
    /// Where it was taken from (a server's URL or a store directory).
    pub source: String,
    /// When the walk began (RFC 3339).
    pub started_at: String,
    /// When the backup was complete (RFC 3339).
    pub finished_at: String,
    /// Sessions in it.
    pub sessions: u64,
    /// Events in it.
    pub events: u64,
}

/// What went wrong with a backup or a restore; every message is one line
/// that names the directory or the file.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The target of a backup exists and holds something.
    #[error("{}: exists and is not empty; a backup goes into a new or empty directory", .0.display())]
    TargetNotEmpty(PathBuf),
    /// The target of a restore exists and holds something.
    #[error("{}: exists and is not empty; restore into a new or empty directory, or pass --force to move it aside", .0.display())]
    RestoreTargetNotEmpty(PathBuf),
    /// The target of a restore is held by a running process.
    #[error("{}: in use by another process (a running overseer holds its lock); stop it before restoring into it", .0.display())]
    InUse(PathBuf),
    /// The source of a restore is not a backup.
    #[error("{}: not an overseer backup: {why}", dir.display())]
    NotABackup {
        /// The directory.
        dir: PathBuf,
        /// What is wrong (which file is missing or unreadable).
        why: String,
    },
    /// The backup's store failed its check.
    #[error("{}: the backup's store has {count} problem(s): {first}; `overseer store check {}` lists them", dir.display(), dir.display())]
    Damaged {
        /// The store directory inside the backup.
        dir: PathBuf,
        /// How many problems.
        count: usize,
        /// The first.
        first: String,
    },
    /// A file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Reading the source or writing the backup's store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The backup's store could not be opened or checked.
    #[error(transparent)]
    Open(#[from] super::OpenError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads session `id` from `store` as one whole checkpoint, or `None` when
/// it does not exist (purged since it was listed).
///
/// The header is read first and commits what is read after it: transcript
/// entries below its length (never rewritten), events up to its
/// `last_event_seq` (later ones are dropped here), metadata (written once).
/// Only the queue rows can go while they are read (a turn that starts takes
/// its message off the queue), which a store reports as a missing row: the
/// session is then read again, from a newer header.
pub async fn read_session(
    store: &dyn CheckpointStore,
    id: SessionId,
) -> Result<Option<SessionCopy>, StoreError> {
    let mut attempt = 0;
    let stored = loop {
        attempt += 1;
        match store.load(id).await {
            Ok(stored) => break stored,
            Err(StoreError::Corrupt { .. }) if attempt < READ_ATTEMPTS => continue,
            Err(e) => return Err(e),
        }
    };
    let Some(stored) = stored else {
        return Ok(None);
    };
    let last = stored.header.last_event_seq;
    let mut events = Vec::new();
    let mut after = 0;
    while after < last {
        let page = store.events_after(id, after, EVENT_PAGE).await?;
        let Some(tail) = page.last().map(|e| e.seq) else {
            break;
        };
        events.extend(page.into_iter().filter(|e| e.seq <= last));
        after = tail;
    }
    if events.len() as u64 != last || events.last().is_some_and(|e| e.seq != last) {
        return Err(StoreError::Corrupt {
            session: id.to_string(),
            detail: format!(
                "the header commits events up to {last} but {} were read",
                events.len()
            ),
        });
    }
    Ok(Some(SessionCopy {
        transcript: stored.transcript.iter().map(|e| (**e).clone()).collect(),
        header: stored.header,
        metadata: stored.metadata,
        inbox: stored.inbox,
        events,
    }))
}

/// Walks every session of `store` in id order, handing each, read by
/// [`read_session`], to `each` before the next is read. Returns the
/// number of sessions and events handed over.
pub async fn walk<F, Fut, E>(store: &dyn CheckpointStore, mut each: F) -> Result<(u64, u64), E>
where
    F: FnMut(SessionCopy) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: From<StoreError>,
{
    let (mut sessions, mut events) = (0u64, 0u64);
    let mut after = None;
    loop {
        let page = store.scan(after, PAGE).await?;
        let Some(last) = page.last() else {
            return Ok((sessions, events));
        };
        after = Some(last.id);
        for header in page {
            let Some(copy) = read_session(store, header.id).await? else {
                continue;
            };
            sessions += 1;
            events += copy.events.len() as u64;
            each(copy).await?;
        }
    }
}

/// Writes `copy` into `store` as one checkpoint: the session as it was,
/// with its transcript, events, metadata and queue (the store derives its
/// indexes, the decision index included, from them as from any checkpoint).
pub async fn write_session(
    store: &dyn CheckpointStore,
    copy: SessionCopy,
) -> Result<(), StoreError> {
    let q = copy.header.queue;
    let checkpoint = Checkpoint {
        entries: copy
            .transcript
            .into_iter()
            .enumerate()
            .map(|(i, e)| (i as u64, Arc::new(e)))
            .collect(),
        events: Arc::new(copy.events),
        metadata: Some(copy.metadata),
        queued: (q.head..).zip(copy.inbox).collect(),
        dequeued: q.head..q.head,
        header: copy.header,
    };
    store.checkpoint(checkpoint).await
}

/// Whether `dir` is missing or an empty directory.
fn is_vacant(dir: &Path) -> Result<bool, BackupError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(io(dir)(e)),
    }
}

/// A backup being written into a new directory.
pub struct BackupWriter {
    dir: PathBuf,
    store: super::SledStore,
    source: String,
    started_at: String,
}

impl BackupWriter {
    /// Creates the backup directory `dir` (which must be missing or empty)
    /// and its store. Blocking.
    pub fn create(dir: &Path, source: String) -> Result<Self, BackupError> {
        if !is_vacant(dir)? {
            return Err(BackupError::TargetNotEmpty(dir.to_owned()));
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        // Checkpoints are flushed once, at the end: the backup is complete
        // only with its manifest, written after that flush.
        let store = super::SledStore::open(&dir.join(STORE_DIR), super::Durability::Os)?;
        Ok(Self {
            dir: dir.to_owned(),
            store,
            source,
            started_at: now(),
        })
    }

    /// Sets when the walk began (a server's stream says).
    pub fn started_at(&mut self, at: String) {
        self.started_at = at;
    }

    /// Writes one session.
    pub async fn write(&self, copy: SessionCopy) -> Result<(), BackupError> {
        write_session(&self.store, copy).await?;
        Ok(())
    }

    /// Gives up: closes the store and removes the directory (it was missing
    /// or empty before [`BackupWriter::create`]).
    pub async fn abandon(self) {
        let (store, dir) = (self.store, self.dir);
        let removed = tokio::task::spawn_blocking(move || {
            drop(store);
            std::fs::remove_dir_all(&dir).map_err(|e| (dir, e))
        })
        .await;
        if let Ok(Err((dir, e))) = removed {
            tracing::warn!(dir = %dir.display(), error = %e, "could not remove the incomplete backup");
        }
    }

    /// Makes the store durable, closes it and writes the manifest: from
    /// then on the directory is a backup. Returns the manifest.
    pub async fn finish(self, sessions: u64, events: u64) -> Result<Manifest, BackupError> {
        self.store.flush().await?;
        let store = self.store;
        let manifest = Manifest {
            format: BACKUP_FORMAT,
            overseer: env!("CARGO_PKG_VERSION").to_owned(),
            source: self.source,
            started_at: self.started_at,
            finished_at: now(),
            sessions,
            events,
        };
        let dir = self.dir;
        let written = manifest.clone();
        tokio::task::spawn_blocking(move || {
            // Closing joins the store's threads: blocking.
            drop(store);
            write_manifest(&dir, &written)
        })
        .await
        .map_err(|e| BackupError::Store(StoreError::Io(e.to_string())))??;
        Ok(manifest)
    }
}

/// Writes the manifest durably: to a temporary name, synced, renamed, and
/// the directory synced, so a crash leaves either no manifest or a whole one.
fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), BackupError> {
    let path = dir.join(MANIFEST);
    let tmp = dir.join(format!("{MANIFEST}.tmp"));
    let text = serde_json::to_vec_pretty(manifest)
        .map_err(|e| BackupError::Store(StoreError::Io(e.to_string())))?;
    let mut file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// Takes a backup of a stopped store directory `from` into `to`, through
/// the same walk a server's backup takes. `from` must hold a store (nothing
/// is created there) of any layout this binary reads: it is read where it
/// is ([`Stopped`]), never upgraded by a backup, and the backup is of this
/// binary's layout.
pub async fn backup_dir(from: &Path, to: &Path) -> Result<Manifest, BackupError> {
    if !from.join("db").is_file() {
        return Err(BackupError::NotABackup {
            dir: from.to_owned(),
            why: "it holds no sled database (no db file): not a store directory".into(),
        });
    }
    let (source_dir, target) = (from.to_owned(), to.to_owned());
    let (source, writer) = tokio::task::spawn_blocking(move || {
        let source = super::Inspector::open(&source_dir)
            .map_err(|e| BackupError::Store(StoreError::io(source_dir.display().to_string(), e)))?;
        let writer = BackupWriter::create(&target, source_dir.display().to_string())?;
        Ok::<_, BackupError>((source, writer))
    })
    .await
    .map_err(|e| BackupError::Store(StoreError::Io(e.to_string())))??;
    let source = Stopped(Arc::new(source));
    let (sessions, events) = walk(&source, |copy| writer.write(copy)).await?;
    writer.finish(sessions, events).await
}

/// A stopped store directory read where it is, through the reads the walk
/// makes (each on a blocking thread): the port over the [`Inspector`],
/// which writes nothing, so an older layout is read as it is.
///
/// [`Inspector`]: super::Inspector
struct Stopped(Arc<super::Inspector>);

impl Stopped {
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&super::Inspector) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inspector = self.0.clone();
        tokio::task::spawn_blocking(move || f(&inspector))
            .await
            .map_err(|e| StoreError::Io(format!("reading the store: {e}")))?
    }
}

fn read_only() -> StoreError {
    StoreError::Io("a stopped store is read, never written, by a backup".into())
}

#[async_trait::async_trait]
impl CheckpointStore for Stopped {
    async fn checkpoint(&self, _: Checkpoint) -> Result<(), StoreError> {
        Err(read_only())
    }

    async fn load(
        &self,
        id: SessionId,
    ) -> Result<Option<overseer_actors::store::StoredSession>, StoreError> {
        self.read(move |s| s.load(id)).await
    }

    async fn load_header(&self, id: SessionId) -> Result<Option<SessionHeader>, StoreError> {
        Ok(self.load(id).await?.map(|s| s.header))
    }

    async fn events_after(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        self.read(move |s| s.events_after(id, after, limit)).await
    }

    async fn list_by_status(
        &self,
        _: &[overseer_actors::model::SessionStatus],
        _: Option<SessionId>,
        _: usize,
    ) -> Result<Vec<overseer_actors::store::SessionSummary>, StoreError> {
        Err(StoreError::Io("a backup walks by scan only".into()))
    }

    async fn list_tenant(
        &self,
        _: &str,
        _: Option<SessionId>,
        _: usize,
    ) -> Result<Vec<overseer_actors::store::SessionSummary>, StoreError> {
        Err(StoreError::Io("a backup walks by scan only".into()))
    }

    async fn scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<overseer_actors::store::SessionSummary>, StoreError> {
        self.read(move |s| s.scan(after, limit)).await
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Checks that `dir` is a complete backup whose store passes `overseer
/// store check`; returns its manifest. Blocking.
pub fn verify(dir: &Path) -> Result<Manifest, BackupError> {
    let not = |why: String| BackupError::NotABackup {
        dir: dir.to_owned(),
        why,
    };
    if !dir.is_dir() {
        return Err(not("no such directory".into()));
    }
    let path = dir.join(MANIFEST);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not(format!(
                "it has no {MANIFEST} (a backup holds {MANIFEST} and {STORE_DIR}/; a backup cut short has no manifest)"
            )))
        }
        Err(e) => return Err(io(&path)(e)),
    };
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| not(format!("{MANIFEST} is unreadable: {e}")))?;
    if manifest.format != BACKUP_FORMAT {
        return Err(not(format!(
            "{MANIFEST} has format {}, this binary reads format {BACKUP_FORMAT}",
            manifest.format
        )));
    }
    let store = dir.join(STORE_DIR);
    if !store.join("db").is_file() {
        return Err(not(format!("it has no store ({STORE_DIR}/db is missing)")));
    }
    let report = super::check(&store)?;
    if let Some(first) = report.problems.first() {
        return Err(BackupError::Damaged {
            dir: store,
            count: report.problems.len(),
            first: first.clone(),
        });
    }
    Ok(manifest)
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq)]
pub struct Restored {
    /// The backup's manifest.
    pub manifest: Manifest,
    /// Where a non-empty target was moved (with `force`).
    pub moved_aside: Option<PathBuf>,
}

/// Restores the backup in `from` into the store directory `to`: checks the
/// backup ([`verify`]), then copies its store into `to`. A `to` that exists
/// and is not empty is refused, or with `force` renamed aside (to
/// `<to>.replaced-<unix seconds>`, never deleted). The server that will use
/// `to` must be stopped. Blocking.
pub fn restore(from: &Path, to: &Path, force: bool) -> Result<Restored, BackupError> {
    let manifest = verify(from)?;
    if is_held(to)? {
        return Err(BackupError::InUse(to.to_owned()));
    }
    let mut moved_aside = None;
    if !is_vacant(to)? {
        if !force {
            return Err(BackupError::RestoreTargetNotEmpty(to.to_owned()));
        }
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let aside = sibling(to, &format!("replaced-{secs}"))?;
        std::fs::rename(to, &aside).map_err(io(to))?;
        moved_aside = Some(aside);
    } else if to.exists() {
        std::fs::remove_dir(to).map_err(io(to))?;
    }
    // Copied beside the target and renamed into place: a restore cut short
    // leaves no half store where the server looks.
    let partial = sibling(to, "restoring")?;
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(&partial))?;
    }
    copy_dir(&from.join(STORE_DIR), &partial)?;
    std::fs::rename(&partial, to).map_err(io(to))?;
    Ok(Restored {
        manifest,
        moved_aside,
    })
}

/// Whether a process holds the sled lock of the store in `dir` (a server
/// serving it): its `db` file's lock is taken for a moment to see.
fn is_held(dir: &Path) -> Result<bool, BackupError> {
    let path = dir.join("db");
    let file = match std::fs::File::options().read(true).write(true).open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(&path)(e)),
    };
    match file.try_lock() {
        Ok(()) => Ok(false),
        Err(std::fs::TryLockError::WouldBlock) => Ok(true),
        Err(std::fs::TryLockError::Error(e)) => Err(io(&path)(e)),
    }
}

/// `<dir>.<suffix>`, beside `dir`.
fn sibling(dir: &Path, suffix: &str) -> Result<PathBuf, BackupError> {
    super::upgrade::sibling(dir, suffix).ok_or_else(|| BackupError::Io {
        path: dir.to_owned(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "needs a directory name (not `/`, `.` or `..`)",
        ),
    })
}

/// Copies the directory tree `from` into `to` (see `upgrade::copy_dir`).
fn copy_dir(from: &Path, to: &Path) -> Result<(), BackupError> {
    super::upgrade::copy_dir(from, to).map_err(|(path, source)| BackupError::Io { path, source })
}

/// Now, in RFC 3339.
pub fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
