//! Opening a store directory: sled itself, the layout checks, and the
//! commit-record check, as one step that either yields an open
//! [`Generation`] or a one-line [`OpenError`] naming the directory.
//!
//! sled 0.34 panics on several kinds of damage (a truncated or overwritten
//! log, a broken snapshot) instead of returning an error; every call into
//! sled here runs under [`catch_sled_panic`], which turns such a panic into an
//! error and keeps its text out of the process's stderr. A database that sled
//! opens but that holds less than the commit record beside it says was
//! confirmed ([`sidecar`]) is refused as well: sled recovers the longest
//! valid prefix of its log without a word, so this is how a loss is noticed.
//!
//! sled 0.34 writes a snapshot to `snap.<lsn>.generating` and renames it
//! once complete; a write that fails (a full disk) leaves the file behind,
//! and sled takes the newest `snap.*` file for its snapshot, so every later
//! open would fail with "Read corrupted data" although nothing is damaged. A
//! serving open removes such leftovers first, holding the directory's lock
//! while it does ([`remove_unfinished_snapshots`]); `store check` only names
//! them.
//!
//! It is used for the first open, for every reopen after a write failure
//! (`group_commit`), and, without writing anything, by `overseer store check`.
//! It deliberately owns no reads or writes of sessions.

use std::any::Any;
use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Once;

use overseer_actors::store::StoreError;
use sled::Tree;

use super::durable::Durable;
use super::layout;
use super::sidecar;
use super::trees::{Generation, Kind, Trees, View, DATA_TREE};
use super::{Compression, StoreOptions, FORMAT_KEY, FORMAT_VERSION};
use crate::store::codec::{self, corrupt};

/// The first layout with every row in the one tree [`DATA_TREE`] (and the
/// group number in it): before, each kind had its tree, `commit_seq` in
/// `meta`.
const ONE_TREE: u32 = 4;

/// The key of [`Kind::Meta`] holding the number of the last group written.
pub(in crate::store) const COMMIT_KEY: &[u8] = b"commit_seq";

/// The database and its trees, cloned (cheaply) wherever they are used.
/// What opening a directory found.
pub(in crate::store) struct Opened {
    pub(in crate::store) generation: Generation,
    /// The number of the last group the database holds.
    pub(in crate::store) commit_seq: u64,
    /// How the directory stores its log (what it was created with).
    pub(in crate::store) compression: Compression,
}

/// Whether the open may write (a server) or must not (`store check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) enum Purpose {
    /// Stamp a new directory with the layout version and create its commit
    /// record; refuse a directory that lost commits.
    Serve,
    /// Write nothing of ours, and leave the commit record to the caller.
    Inspect,
}

/// Why a directory could not be opened. Every message is one line and names
/// the directory.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpenError {
    /// Another process (a running server) holds sled's lock.
    #[error("the store in {} is in use by another process (sled's lock on its db file is held, e.g. by a running overseer); stop that process first", dir.display())]
    Locked {
        /// The directory.
        dir: PathBuf,
    },
    /// sled panicked while opening or reading it back: its files are damaged.
    #[error("the store in {} is damaged: sled failed while opening it ({message}); `overseer store check {}` reports what is readable", dir.display(), dir.display())]
    Damaged {
        /// The directory.
        dir: PathBuf,
        /// sled's panic message, on one line.
        message: String,
    },
    /// The database holds fewer groups than were confirmed durable.
    #[error("the store in {} lost committed checkpoints: {} records group {recorded} as durable but the database ends at group {found}, so its files were damaged, truncated or replaced; `overseer store check {}` reports what is left; to open it anyway and accept the loss, delete {}", dir.display(), sidecar.display(), dir.display(), sidecar.display())]
    Lost {
        /// The directory.
        dir: PathBuf,
        /// The commit record's path.
        sidecar: PathBuf,
        /// The group the record says was confirmed.
        recorded: u64,
        /// The last group the database holds.
        found: u64,
    },
    /// The commit record itself is unreadable.
    #[error("the store in {} has an unreadable commit record: {detail}; delete it to open the store without this check", dir.display())]
    Record {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Any other failure (I/O, not a store).
    #[error("cannot open the store in {}: {detail}", dir.display())]
    Other {
        /// The directory.
        dir: PathBuf,
        /// What failed.
        detail: String,
    },
    /// Refused by a check of the layout (a newer layout version).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<OpenError> for StoreError {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Store(e) => e,
            other => StoreError::Io(other.to_string()),
        }
    }
}

/// Opens `dir` for `purpose`. Blocking.
pub(in crate::store) fn open(
    dir: &Path,
    options: &StoreOptions,
    purpose: Purpose,
) -> Result<Opened, OpenError> {
    let config = |compression: Compression| {
        let config = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_bytes())
            .use_compression(compression == Compression::Zstd)
            // zstd's fastest level: most of what compressing saves at a
            // fraction of the CPU of sled's default (5).
            .compression_factor(1);
        if options.durability == super::Durability::Fsync || purpose == Purpose::Inspect {
            // Every checkpoint is flushed explicitly; a periodic flush on top
            // would only compete with the group commit for the disk.
            config.flush_every_ms(None)
        } else {
            config
        }
    };
    let damaged = |message: String| OpenError::Damaged {
        dir: dir.to_owned(),
        message,
    };
    let other = |detail: String| OpenError::Other {
        dir: dir.to_owned(),
        detail,
    };
    if purpose == Purpose::Serve {
        remove_unfinished_snapshots(dir).map_err(|e| {
            other(format!(
                "removing the unfinished snapshot a failed write left: {e}"
            ))
        })?;
    }
    // What `store check` says about a directory sled refuses to open.
    let damaged = |message: String| {
        match purpose {
        Purpose::Inspect => match unfinished_snapshots(dir) {
            Ok(names) if !names.is_empty() => damaged(format!(
                "{message}; it holds {}, a snapshot sled never finished (a write failed, e.g. on                  a full disk): `overseer serve` removes it when it opens the store",
                names.join(", ")
            )),
            _ => damaged(message),
        },
        Purpose::Serve => damaged(message),
    }
    };
    let opened = catch_sled_panic(|| open_as_created(config, options.compression, dir));
    let (db, compression) = match opened.map_err(damaged)? {
        Ok(opened) => opened,
        Err(e) if is_lock_error(&e) => {
            return Err(OpenError::Locked {
                dir: dir.to_owned(),
            })
        }
        Err(e @ sled::Error::Corruption { .. }) => return Err(damaged(e.to_string())),
        Err(e) => return Err(other(e.to_string())),
    };
    let opened = catch_sled_panic(|| -> Result<Opened, OpenError> {
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(|e| other(format!("opening tree {name}: {e}")))
        };
        let format = tree("meta")?;
        let version = check_format(&format, dir)?;
        let legacy = version.is_some_and(|v| v < ONE_TREE);
        // Layout 3 numbered its groups in `meta`; layout 4 in the one tree,
        // with the checkpoints of the group.
        let commit_seq = if legacy {
            format.get(COMMIT_KEY)
        } else {
            View::new(&tree(DATA_TREE)?, Kind::Meta).get(COMMIT_KEY)
        }
        .map_err(|e| other(format!("reading the commit number: {e}")))?;
        let commit_seq = match commit_seq {
            None => 0,
            Some(raw) => u64::from_be_bytes(raw.as_ref().try_into().map_err(|_| {
                damaged(format!(
                    "its group number (commit_seq) is {} bytes, expected 8",
                    raw.len()
                ))
            })?),
        };
        if purpose == Purpose::Serve {
            let recorded = sidecar::read(dir).map_err(|detail| OpenError::Record {
                dir: dir.to_owned(),
                detail,
            })?;
            if let Some(recorded) = recorded.filter(|r| *r > commit_seq) {
                return Err(OpenError::Lost {
                    dir: dir.to_owned(),
                    sidecar: sidecar::path(dir),
                    recorded,
                    found: commit_seq,
                });
            }
        }
        let open_trees = |legacy: bool, per_checkpoint: bool| {
            Trees::over(&db, legacy, per_checkpoint)
                .map_err(|e| other(format!("opening its trees: {e}")))
        };
        let trees = if purpose == Purpose::Serve {
            if version.is_none_or(|v| v < FORMAT_VERSION) {
                if let Some(found) = version {
                    crate::store::upgrade::before_upgrade(
                        &db,
                        dir,
                        found,
                        FORMAT_VERSION,
                        options.upgrade,
                    )?;
                }
                upgrade(&db, version, dir)?;
            }
            let trees = open_trees(false, true)?;
            super::purge::finish_pending(&trees)
                .map_err(|e| other(format!("finishing a purge an earlier process began: {e}")))?;
            trees
        } else {
            // Read a layout-3 directory where it is, unless a migration
            // already copied it whole into the one tree; and the one tree
            // of layout 4 by its per-entry rows, unless the migration to
            // layout 5 converted every session already (it may have begun
            // dropping those rows).
            let data = tree(DATA_TREE)?;
            let progress = |e| other(format!("reading the migration's progress: {e}"));
            let copied = super::migrate::copied(&data).map_err(progress)?;
            let converted = version.is_none_or(|v| v >= FORMAT_VERSION)
                || super::migrate5::converted(&data).map_err(progress)?;
            open_trees(legacy && !copied, converted)?
        };
        let durable = Durable::new(db.clone(), dir)
            .map_err(|e| other(format!("opening its log for syncing: {e}")))?;
        Ok(Opened {
            generation: Generation::new(trees, durable),
            commit_seq,
            compression,
        })
    })
    .map_err(damaged)??;
    Ok(opened)
}

/// The names of the `snap.*.generating` files in `dir`: snapshots sled
/// began to write and never renamed into place.
fn unfinished_snapshots(dir: &Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Removes the snapshots sled began and never finished (see the module
/// docs). sled uses a snapshot only once it is renamed into place, so
/// removing one loses nothing: sled recovers from the previous snapshot and
/// its log, as after a crash in the middle of writing it. It runs under
/// sled's own lock on the `db` file, taken here for the moment, so a
/// process that holds the directory (and may be writing a snapshot right
/// now) is left alone; its open then fails as `Locked`, as it would have.
/// Returns how many were removed.
fn remove_unfinished_snapshots(dir: &Path) -> std::io::Result<usize> {
    let log = match std::fs::File::options()
        .read(true)
        .write(true)
        .open(dir.join("db"))
    {
        Ok(log) => log,
        // A new directory: sled has written nothing yet.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    match log.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(0),
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    let names = unfinished_snapshots(dir)?;
    for name in &names {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        tracing::warn!(
            dir = %dir.display(),
            file = %name,
            "removed a snapshot sled never finished (a write failed, e.g. on a full disk); \
             sled recovers from its log instead"
        );
    }
    if !names.is_empty() {
        // The removal must hold even if the process dies right after.
        std::fs::File::open(dir)?.sync_all()?;
    }
    // Dropping the file releases the lock for sled's own.
    drop(log);
    Ok(names.len())
}

/// Refuses a directory of a newer layout before anything is written to it;
/// returns the version found (`None` for a directory overseer never wrote).
fn check_format(meta: &Tree, dir: &Path) -> Result<Option<u32>, StoreError> {
    let io = |e: sled::Error| {
        StoreError::io(
            format!("reading the store format version in {}", dir.display()),
            e,
        )
    };
    let Some(raw) = meta.get(FORMAT_KEY).map_err(io)? else {
        return Ok(None);
    };
    let bytes: [u8; 4] = raw.as_ref().try_into().map_err(|_| {
        corrupt(
            "meta",
            format!("format_version is {} bytes, expected 4", raw.len()),
        )
    })?;
    let found = u32::from_be_bytes(bytes);
    if found > FORMAT_VERSION {
        return Err(corrupt(
            "meta",
            format!(
                "the store in {} has format version {found}, but this binary reads at most \
                 {FORMAT_VERSION}; upgrade overseer to open it",
                dir.display()
            ),
        ));
    }
    Ok(Some(found))
}

/// Brings a directory of an older layout (or a new one) to
/// [`FORMAT_VERSION`], then stamps it. Version 1 had no `blob_refs`: every
/// blob a transcript row names gets its reference, so that a purge never
/// deletes a blob a session written before the upgrade still uses. Versions
/// 1 and 2 may hold event rows no header commits, which are removed. These
/// two steps work on the old trees and are idempotent. Then every layout
/// before 4 is moved into the one tree (`migrate`, resumable), and every
/// layout before 5 has its per-entry transcript rows and per-checkpoint
/// event rows turned into one record per session (`migrate5`, resumable).
/// Stamped only
/// once complete and flushed, so an upgrade cut short is redone or resumed.
/// A new directory has nothing to convert.
fn upgrade(db: &sled::Db, found: Option<u32>, dir: &Path) -> Result<(), StoreError> {
    let write = |what: &str, e: sled::Error| {
        StoreError::io(
            format!(
                "upgrading the store in {} to format version {FORMAT_VERSION}: {what}",
                dir.display()
            ),
            e,
        )
    };
    if let Some(found) = found {
        let copied = super::migrate::copied(
            &db.open_tree(DATA_TREE)
                .map_err(|e| write("opening the data tree", e))?,
        )
        .map_err(|e| write("reading the migration's progress", e))?;
        if found < ONE_TREE {
            // Once copied, the old trees may be partly dropped already:
            // only the rest of the migration is left.
            if !copied {
                let trees =
                    Trees::over(db, true, false).map_err(|e| write("opening the old trees", e))?;
                legacy_upgrades(&trees, found, dir)
                    .map_err(|e| write("converting the old trees", e))?;
            }
            super::migrate::run(db, dir).map_err(|e| write("moving into one tree", e))?;
        }
        // Then one record per checkpoint (layout 5).
        super::migrate5::run(db, dir)?;
    }
    db.flush().map_err(|e| write("flushing", e))?;
    db.open_tree("meta")
        .and_then(|meta| meta.insert(FORMAT_KEY, &FORMAT_VERSION.to_be_bytes()[..]))
        .map_err(|e| write("writing the format version", e))?;
    db.flush().map_err(|e| write("flushing", e))?;
    if found.is_some_and(|f| f < ONE_TREE) {
        super::migrate::tidy(db).map_err(|e| write("tidying the old meta tree", e))?;
    }
    Ok(())
}

/// The conversions of layouts 1 and 2, on their own trees.
fn legacy_upgrades(trees: &Trees, found: u32, dir: &Path) -> Result<(), sled::Error> {
    if found == 1 {
        let mut refs = 0u64;
        for item in trees.transcript.iter() {
            let (key, row) = item?;
            let (Some(hash), Some(id)) = (
                codec::blob_of(&row),
                key.get(..16).and_then(layout::id_from),
            ) else {
                continue;
            };
            trees
                .blob_refs
                .insert(layout::blob_ref_key(&hash, &id), &[][..])?;
            refs += 1;
        }
        tracing::info!(
            dir = %dir.display(),
            blob_refs = refs,
            "upgrading the store from format version 1: added blob references"
        );
    }
    if found < 3 {
        let removed = drop_uncommitted_events(trees)?;
        tracing::info!(
            dir = %dir.display(),
            rows = removed,
            "upgrading the store from format version {found}: removed event rows no header commits"
        );
    }
    Ok(())
}

/// Removes the event rows past each session's `last_event_seq`: what a
/// crash left of a checkpoint cut short before its header. Layouts 1 and 2
/// wrote one row per event, so such leftovers could lie inside the range of
/// a later batch (layout 3 keys a batch by its first event, which a
/// leftover of its own layout always shares, so the batch replaces it);
/// reading finds the row holding an event as the last one keyed at or below
/// it, and must not find a leftover there.
fn drop_uncommitted_events(trees: &Trees) -> Result<u64, sled::Error> {
    let mut removed = 0;
    for item in trees.sessions.iter() {
        let (key, header) = item?;
        let (Some(id), Ok(peek)) = (
            layout::id_from(&key),
            serde_json::from_slice::<codec::Peek>(&header),
        ) else {
            continue;
        };
        // A header without the bound commits no event: leave its rows for
        // `store check` to report rather than guess.
        let Some(past) = peek.last_event_seq.and_then(|last| last.checked_add(1)) else {
            continue;
        };
        let range = layout::seq_key(&id, past)..=layout::seq_key(&id, u64::MAX);
        for row in trees.events.range(range) {
            let (key, _) = row?;
            trees.events.remove(key)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Opens sled with the compression `wanted`, or with the other one when the
/// directory was created with that: sled fixes it at creation and refuses
/// the other (`Unsupported`, naming `use_compression`), and a setting meant
/// for new directories must not make an existing one unusable.
fn open_as_created(
    config: impl Fn(Compression) -> sled::Config,
    wanted: Compression,
    dir: &Path,
) -> sled::Result<(sled::Db, Compression)> {
    match open_retrying(&config(wanted)) {
        Err(sled::Error::Unsupported(message)) if message.contains("use_compression") => {
            let found = wanted.other();
            tracing::info!(
                dir = %dir.display(),
                "the store was created with compression {found:?}, which it keeps \
                 ([store] compression applies to new directories)"
            );
            open_retrying(&config(found)).map(|db| (db, found))
        }
        other => other.map(|db| (db, wanted)),
    }
}

/// Opens sled, waiting briefly while the directory's lock is still held: a
/// store dropped a moment ago in this process (a restart, a reopen, a test)
/// releases it only once sled's background threads have let go of it.
pub(in crate::store) fn open_retrying(config: &sled::Config) -> sled::Result<sled::Db> {
    let mut tries = 0;
    loop {
        match config.open() {
            Err(e) if is_lock_error(&e) && tries < 60 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// sled reports a held lock as a plain `Other` I/O error with this text.
fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

thread_local! {
    /// Set while this thread runs [`catch_sled_panic`]: the panic hook stays
    /// quiet, since the panic becomes an error that says the same in one line.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, turning a panic into its message on one line. The default panic
/// hook would print sled's panic (with a backtrace, if enabled) before the
/// error is reported; a hook installed once, process-wide, skips that for
/// threads inside this function and defers to the previous hook otherwise.
pub(in crate::store) fn catch_sled_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    outcome.map_err(|payload| one_line(&panic_message(payload.as_ref())))
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
