//! What one "flush" is: enough for a checkpoint to survive a power loss, which
//! `sled::Db::flush` alone (sled 0.34) is not.
//!
//! - sled makes its log stable with `sync_file_range`, which neither persists
//!   the file's size when the log grew nor flushes the device's write cache;
//!   an `fdatasync` of the log file (`db`) on top does both.
//! - sled writes any single item over a quarter of its segment size (128 KiB:
//!   a large value, or a tree node holding several big entries) to its own
//!   file under `blobs/`, and never syncs those files. The log then points at
//!   data that may exist only in the page cache, so new files there are
//!   synced, and the directory with them, before the log is flushed.
//!
//! It deliberately does not replace sled's flush: sled still decides what to
//! write; this only makes it durable.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How old the `blobs/` directory's mtime must be before an unchanged mtime
/// is trusted to mean "no new file": well above the coarse clock tick that
/// stamps it, so that a file created in the same tick as the previous one
/// cannot go unnoticed.
const SETTLED: Duration = Duration::from_secs(1);

pub(super) struct Durable {
    db: sled::Db,
    log: File,
    blob_dir: PathBuf,
    /// Files of `blob_dir` already synced, with the length they had then (a
    /// file still being written when it was synced is synced again).
    synced: HashMap<OsString, u64>,
    /// The directory's mtime at the last scan, once settled.
    settled_mtime: Option<SystemTime>,
}

impl Durable {
    pub(super) fn new(db: sled::Db, dir: &Path) -> io::Result<Self> {
        // Opened for writing only because some systems refuse `fdatasync` on
        // a read-only descriptor; nothing is ever written through it.
        let log = File::options()
            .read(true)
            .write(true)
            .open(dir.join("db"))?;
        Ok(Self {
            db,
            log,
            blob_dir: dir.join("blobs"),
            synced: HashMap::new(),
            settled_mtime: None,
        })
    }

    /// Makes everything written to the database so far durable.
    pub(super) fn flush(&mut self) -> Result<(), String> {
        self.sync_blob_files()
            .map_err(|e| format!("syncing {}: {e}", self.blob_dir.display()))?;
        self.db
            .flush()
            .map_err(|e| format!("flushing the log: {e}"))?;
        self.log
            .sync_data()
            .map_err(|e| format!("syncing the log: {e}"))
    }

    fn sync_blob_files(&mut self) -> io::Result<()> {
        let mtime = match std::fs::metadata(&self.blob_dir) {
            Ok(meta) => meta.modified()?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if self.settled_mtime == Some(mtime) {
            return Ok(());
        }
        let settled = SystemTime::now()
            .duration_since(mtime)
            .is_ok_and(|age| age > SETTLED);

        let mut present = HashMap::with_capacity(self.synced.len());
        let mut new_names = false;
        for entry in std::fs::read_dir(&self.blob_dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let len = match entry.metadata() {
                Ok(meta) => meta.len(),
                // sled removes files of cleaned segments at any time.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            match self.synced.get(&name) {
                Some(&synced_len) if synced_len == len => {}
                known => {
                    new_names |= known.is_none();
                    match File::open(entry.path()) {
                        Ok(file) => file.sync_data()?,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
            present.insert(name, len);
        }
        if new_names {
            // The new names themselves must survive too.
            File::open(&self.blob_dir)?.sync_all()?;
        }
        self.synced = present;
        // An mtime still within a clock tick or so of now may be shared by a
        // file created after this scan: only a settled one is trusted.
        self.settled_mtime = settled.then_some(mtime);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_items_in_sled_files_are_synced_and_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new()
            .path(dir.path())
            .flush_every_ms(None)
            .open()
            .unwrap();
        let mut durable = Durable::new(db.clone(), dir.path()).unwrap();
        durable.flush().unwrap();
        assert!(durable.synced.is_empty());

        // Over sled's 128 KiB inline limit: written to a file of its own.
        db.insert(b"big", vec![7u8; 300 * 1024]).unwrap();
        durable.flush().unwrap();
        let files: Vec<_> = std::fs::read_dir(dir.path().join("blobs"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(!files.is_empty());
        for name in &files {
            assert!(durable.synced.contains_key(name), "{name:?} not synced");
        }
        durable.flush().unwrap();
    }
}
