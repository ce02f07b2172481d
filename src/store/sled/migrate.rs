//! The move of a store directory from layout 3 (and older, once their own
//! conversions ran) to layout 4: every row of the per-kind trees copied
//! into the one tree (`trees::DATA_TREE`) under its kind's prefix, then the
//! old trees dropped. `open` runs it when a directory of an older layout is
//! first opened for serving (after the upgrade gate, `store::upgrade`) and
//! stamps the layout once it returns.
//!
//! Resumable: rows are copied in chunks, each applied with one
//! `apply_batch` together with the progress marker ([`PROGRESS_KEY`] in
//! [`Kind::Meta`]: the kind being copied and the last key copied), so the
//! marker and the rows it covers are recovered together or not at all. A
//! process killed at any point resumes after the last chunk it applied;
//! copying a row again writes the same bytes. The old trees are dropped
//! only once every kind is copied (the marker then says so), and dropping
//! one already gone does nothing, so that phase is simply done again. The
//! old `meta` tree keeps `format_version` (every binary looks there), and
//! its other keys stay until the layout is stamped.
//!
//! It deliberately owns no conversion of the rows themselves: they are
//! copied byte for byte.

use std::ops::Bound;
use std::path::Path;

use sled::{Batch, IVec, Tree};

use super::trees::{Kind, View, DATA_TREE};
use super::FORMAT_KEY;

/// The key of [`Kind::Meta`] holding how far a migration got: one byte, the
/// index in [`Kind::ALL`] of the kind being copied (its length once all
/// are), then the last key of that kind copied (none: nothing of it yet).
pub(super) const PROGRESS_KEY: &[u8] = b"migrate4";

/// Most rows, and bytes, one chunk copies. Built for fault injection, a
/// few rows, so that a test's small store is copied in many chunks and a
/// kill lands inside a kind, not only between two.
#[cfg(not(feature = "fault-injection"))]
const CHUNK_ROWS: usize = 1024;
#[cfg(feature = "fault-injection")]
const CHUNK_ROWS: usize = 4;
const CHUNK_BYTES: usize = 1024 * 1024;

/// How far a migration got: the kind being copied, and the last key of it
/// copied.
fn progress(data: &Tree) -> sled::Result<(usize, Option<IVec>)> {
    let raw = View::new(data, Kind::Meta).get(PROGRESS_KEY)?;
    Ok(match raw {
        None => (0, None),
        Some(raw) => match raw.split_first() {
            None => (0, None),
            Some((&at, rest)) => (usize::from(at), (!rest.is_empty()).then(|| rest.into())),
        },
    })
}

fn marker(at: usize, last: Option<&[u8]>) -> Vec<u8> {
    let mut value = Vec::with_capacity(1 + last.map_or(0, <[u8]>::len));
    value.push(u8::try_from(at).unwrap_or(u8::MAX));
    value.extend_from_slice(last.unwrap_or_default());
    value
}

/// Whether a migration copied every kind already (only dropping the old
/// trees and the stamp may be left).
pub(super) fn copied(data: &Tree) -> sled::Result<bool> {
    Ok(progress(data)?.0 >= Kind::ALL.len())
}

/// Copies what is left to copy, then drops the old trees. Blocking; the
/// caller flushes and stamps the layout after.
pub(super) fn run(db: &sled::Db, dir: &Path) -> sled::Result<()> {
    let data = db.open_tree(DATA_TREE)?;
    let meta = View::new(&data, Kind::Meta);
    let (mut at, mut last) = progress(&data)?;
    let resumed = at > 0 || last.is_some();
    let mut rows = 0u64;
    while let Some(&kind) = Kind::ALL.get(at) {
        let old = db.open_tree(kind.legacy_tree())?;
        let view = View::new(&data, kind);
        let mut iter = match last.take() {
            Some(key) => old.range::<IVec, _>((Bound::Excluded(key), Bound::Unbounded)),
            None => old.iter(),
        };
        loop {
            let mut batch = Batch::default();
            let (mut n, mut bytes) = (0, 0);
            let mut end = None;
            for item in iter.by_ref() {
                let (key, value) = item?;
                // `format_version` stays where it is: see the module docs.
                if !(kind == Kind::Meta && key.as_ref() == FORMAT_KEY) {
                    n += 1;
                    bytes += key.len() + value.len();
                    view.batch_insert(&mut batch, &key, value);
                }
                end = Some(key);
                if n >= CHUNK_ROWS || bytes >= CHUNK_BYTES {
                    break;
                }
            }
            let Some(key) = end else {
                // This kind is done.
                at += 1;
                meta.insert(PROGRESS_KEY, marker(at, None))?;
                break;
            };
            meta.batch_insert(&mut batch, PROGRESS_KEY, marker(at, Some(&key)));
            data.apply_batch(batch)?;
            rows += n as u64;
            #[cfg(feature = "fault-injection")]
            overseer_actors::fault::hit_outside_sessions(
                overseer_actors::fault::FaultPoint::StoreMigration,
            );
        }
    }
    // Everything is in the one tree: what the old trees hold is a copy.
    db.flush()?;
    for kind in Kind::ALL {
        if kind != Kind::Meta {
            db.drop_tree(kind.legacy_tree())?;
            #[cfg(feature = "fault-injection")]
            overseer_actors::fault::hit_outside_sessions(
                overseer_actors::fault::FaultPoint::StoreMigration,
            );
        }
    }
    tracing::info!(
        dir = %dir.display(),
        rows,
        resumed,
        "moved the store's rows into one tree (layout 4)"
    );
    Ok(())
}

/// Removes what the old `meta` tree holds besides `format_version`, once
/// the layout is stamped (before, a resumed migration still reads its
/// `commit_seq`).
pub(super) fn tidy(db: &sled::Db) -> sled::Result<()> {
    let meta = db.open_tree("meta")?;
    for key in meta.iter().keys() {
        let key = key?;
        if key.as_ref() != FORMAT_KEY {
            meta.remove(key)?;
        }
    }
    Ok(())
}
