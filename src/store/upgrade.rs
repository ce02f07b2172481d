//! The gate before an in-place layout upgrade of a sled store directory.
//!
//! A store directory of an older layout is upgraded in place when a server
//! opens it, and from then on the previous binary refuses it: a rollback
//! needs a copy of the directory as it was. So `overseer serve` refuses to
//! upgrade without `--upgrade` ([`Upgrade::Refuse`], one line saying what
//! would change and where the copy would go) and with it first copies the
//! directory to `<dir>.pre-upgrade-format-<N>` ([`Upgrade::KeepCopy`]; the
//! log says where). The copy is taken after sled has opened the directory
//! and flushed, before any migration writes, while this process holds the
//! directory's lock (nothing else writes it): it is the store as the old
//! binary left it, which that binary opens again. It is made under a
//! temporary name and renamed once complete, so an upgrade cut short and
//! started again keeps the first, whole copy rather than copying a
//! half-migrated directory.
//!
//! It owns the decision and the copy; the migrations themselves are the
//! sled store's (`sled::open`), which calls [`before_upgrade`] once, before
//! the first of them. It deliberately does not touch PostgreSQL: a
//! database's migrations are additive and recorded, and its backups are
//! PostgreSQL's own (see the operations docs).

use std::path::{Path, PathBuf};

use overseer_actors::store::StoreError;

/// What opening a store directory of an older layout does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Upgrade {
    /// Upgrade in place, keeping no copy: for tests, embedding and tools
    /// that open a store they own (the library's default).
    #[default]
    InPlace,
    /// Refuse, in one line, and write nothing (`overseer serve` without
    /// `--upgrade`, offline backups).
    Refuse,
    /// Copy the directory beside itself first, then upgrade
    /// (`overseer serve --upgrade`).
    KeepCopy,
}

/// Where the pre-upgrade copy of `dir` at layout `found` goes.
pub fn copy_path(dir: &Path, found: u32) -> Result<PathBuf, StoreError> {
    sibling(dir, &format!("pre-upgrade-format-{found}")).ok_or_else(|| {
        StoreError::Io(format!(
            "the store directory {} has no name to keep a pre-upgrade copy beside",
            dir.display()
        ))
    })
}

/// Called once by the sled store's open, with the directory open and
/// before any migration: `found` is the directory's layout, older than
/// `to`. Refuses, copies, or lets the upgrade go on, as `upgrade` says.
pub(super) fn before_upgrade(
    db: &sled::Db,
    dir: &Path,
    found: u32,
    to: u32,
    upgrade: Upgrade,
) -> Result<(), StoreError> {
    let copy = copy_path(dir, found)?;
    match upgrade {
        Upgrade::InPlace => Ok(()),
        Upgrade::Refuse => Err(StoreError::Io(format!(
            "the store in {} has layout version {found}; this binary would upgrade it in place \
             to layout {to}, after which older binaries cannot open it; start `overseer serve --upgrade` \
             once to upgrade it, keeping a copy of the directory as it is now in {}",
            dir.display(),
            copy.display()
        ))),
        Upgrade::KeepCopy => {
            if copy.exists() {
                tracing::warn!(
                    dir = %dir.display(),
                    copy = %copy.display(),
                    "a pre-upgrade copy from an earlier attempt exists: kept as it is, not taken again"
                );
                return Ok(());
            }
            db.flush().map_err(|e| {
                StoreError::io(
                    format!("flushing the store in {} before copying it", dir.display()),
                    e,
                )
            })?;
            let partial = sibling(&copy, "partial").unwrap_or_else(|| copy.clone());
            let failed = |(path, e): (PathBuf, std::io::Error)| {
                StoreError::Io(format!(
                    "keeping a pre-upgrade copy of the store in {} (in {}): {}: {e}; nothing was \
                     upgraded",
                    dir.display(),
                    copy.display(),
                    path.display()
                ))
            };
            if partial.exists() {
                std::fs::remove_dir_all(&partial).map_err(|e| failed((partial.clone(), e)))?;
            }
            copy_dir(dir, &partial).map_err(failed)?;
            std::fs::rename(&partial, &copy).map_err(|e| failed((copy.clone(), e)))?;
            tracing::warn!(
                dir = %dir.display(),
                copy = %copy.display(),
                from = found,
                to,
                "upgrading the store's layout in place; the directory as it was is kept in the \
                 copy (what the previous binary opens: restore it to roll back)"
            );
            Ok(())
        }
    }
}

/// `<dir>.<suffix>`, beside `dir`; `None` for a path without a name (`/`,
/// `..`).
pub(crate) fn sibling(dir: &Path, suffix: &str) -> Option<PathBuf> {
    let mut name = dir.file_name()?.to_os_string();
    name.push(".");
    name.push(suffix);
    Some(dir.with_file_name(name))
}

/// Copies the directory tree `from` into `to` (created), file by file,
/// each synced, then `to` itself; a failure names its path. Only for a
/// store no process writes (or one this process holds and has flushed).
pub(crate) fn copy_dir(from: &Path, to: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    let at = |path: &Path| {
        let path = path.to_owned();
        move |e| (path, e)
    };
    std::fs::create_dir_all(to).map_err(at(to))?;
    for entry in std::fs::read_dir(from).map_err(at(from))? {
        let entry = entry.map_err(at(from))?;
        let path = entry.path();
        let target = to.join(entry.file_name());
        let kind = entry.file_type().map_err(at(&path))?;
        if kind.is_dir() {
            copy_dir(&path, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&path, &target).map_err(at(&path))?;
            std::fs::File::open(&target)
                .and_then(|f| f.sync_all())
                .map_err(at(&target))?;
        }
    }
    std::fs::File::open(to)
        .and_then(|d| d.sync_all())
        .map_err(at(to))
}
