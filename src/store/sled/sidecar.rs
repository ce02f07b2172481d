//! The commit record kept beside the database: `overseer.commit`, the number
//! of the last group of checkpoints a flush confirmed durable.
//!
//! The store numbers every group it writes and stores that number inside sled
//! with the group (the `commit_seq` key of `meta`, written last). After each
//! confirmed flush this file is overwritten with the number the flush covered.
//! At open, a database holding a lower number than the file lost groups that
//! were confirmed to their callers: its files were damaged, truncated or
//! replaced, and sled cannot tell (it recovers the longest valid prefix of
//! its log, silently). The file is written without a flush of its own: after
//! a power loss it can only lag behind the database, never lead it, so it
//! never raises a false alarm; it only lets some losses go unnoticed.
//!
//! It deliberately owns only the file; when it is written and what a
//! mismatch means is decided by `open` and `group_commit`.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The file's name inside the store directory.
pub(in crate::store) const FILE_NAME: &str = "overseer.commit";

/// Width of the number: the file always has the same length, so a rewrite
/// is a small in-place overwrite that never changes its size.
const WIDTH: usize = 20;

/// Where the file of `dir` is.
pub(in crate::store) fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Reads the recorded number; `None` when there is no file.
pub(in crate::store) fn read(dir: &Path) -> Result<Option<u64>, String> {
    let path = path(dir);
    let mut text = String::new();
    match File::open(&path) {
        Ok(mut f) => {
            f.read_to_string(&mut text)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    }
    text.trim().parse().map(Some).map_err(|_| {
        format!(
            "{} is not a commit number (it holds {:?})",
            path.display(),
            text.chars().take(40).collect::<String>()
        )
    })
}

/// The open file, rewritten after every confirmed flush.
pub(in crate::store) struct Sidecar {
    file: File,
    recorded: u64,
}

impl Sidecar {
    /// Opens the file of `dir`, creating it with `seq` if it does not exist.
    /// A new file is synced, with its directory, once: later rewrites keep
    /// its size, so only their content can lag after a power loss.
    pub(in crate::store) fn open(dir: &Path, seq: u64) -> io::Result<Self> {
        let path = path(dir);
        let created = !path.exists();
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut sidecar = Self { file, recorded: 0 };
        if created || file_len(&sidecar.file)? != WIDTH as u64 + 1 {
            sidecar.write(seq)?;
            sidecar.file.sync_all()?;
            File::open(dir)?.sync_all()?;
        } else {
            sidecar.recorded = read(dir).map_err(io::Error::other)?.unwrap_or(0);
        }
        Ok(sidecar)
    }

    /// Records that everything up to group `seq` is durable. A lower number
    /// than already recorded (a flush that finished after a later one) is
    /// ignored, so the file only moves forward.
    pub(in crate::store) fn record(&mut self, seq: u64) -> io::Result<()> {
        if seq <= self.recorded {
            return Ok(());
        }
        self.write(seq)
    }

    fn write(&mut self, seq: u64) -> io::Result<()> {
        let text = format!("{seq:0WIDTH$}\n");
        self.file.write_all_at(text.as_bytes(), 0)?;
        self.recorded = seq;
        Ok(())
    }
}

fn file_len(file: &File) -> io::Result<u64> {
    Ok(file.metadata()?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_only_moves_forward_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let mut s = Sidecar::open(dir.path(), 7).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(7));
        s.record(12).unwrap();
        s.record(9).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(12));
        drop(s);
        let s = Sidecar::open(dir.path(), 3).unwrap();
        assert_eq!(s.recorded, 12, "an existing file is kept");
        std::fs::write(path(dir.path()), "garbage").unwrap();
        let e = read(dir.path()).unwrap_err();
        assert!(e.contains("not a commit number"), "{e}");
    }
}
