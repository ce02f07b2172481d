//! Which Chromium the browser tests run: the one a person configured
//! (`OVERSEER_TEST_CHROMIUM=/path/to/chromium`), or else the headless
//! Chromium that ships inside the npm package `@sparticuz/chromium`
//! (pinned in `tests/package.json`), unpacked by the tests themselves so
//! `cargo test` needs nothing installed first but Node.js and npm.
//!
//! [`executable`] installs `tests/node_modules` ([`super::npm::installed`]),
//! then runs the package's own unpacker (`await chromium.executablePath()`,
//! a two-line ES module run by `node`) into
//! `tests/node_modules/.overseer-chromium/`, once per process and under the
//! same exclusive lock as `npm ci` (`tests/.npm-ci.lock`): test binaries run
//! at the same time. The unpacker writes into `$TMPDIR`; it is pointed at a
//! fresh directory beside the final one, renamed into place only when it
//! finished, so a killed unpack never looks like a browser. `npm ci` deletes
//! `node_modules`, so a changed lock file unpacks again.
//!
//! What cannot be found or unpacked fails every browser test with one line
//! saying what to do; none is skipped.
//!
//! It deliberately does not start the browser (that is `tests/ui/browser.rs`),
//! and never downloads anything but through `npm ci`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::npm::{self, Programs, INSTALL_HINT};

/// The variable naming a Chromium to use instead of the npm package's. Read,
/// never set, by the tests.
pub const ENV: &str = "OVERSEER_TEST_CHROMIUM";

/// Where in `node_modules` the package's Chromium is unpacked.
const UNPACKED: &str = ".overseer-chromium";

/// The file an unpack leaves last: its presence means a finished unpack.
const DONE: &str = ".unpacked";

/// The unpacker: the package's `executablePath()` inflates its Brotli
/// archives (the browser, its fonts, SwiftShader) into `os.tmpdir()` and
/// answers the browser's path.
const UNPACK_JS: &str = r#"import chromium from "@sparticuz/chromium";
process.stdout.write(await chromium.executablePath());"#;

/// Where a Chromium comes from; it decides the flags it is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chromium {
    /// `@sparticuz/chromium`'s build: chrome-headless-shell for a sandbox
    /// without a GPU, which needs `--single-process` and SwiftShader.
    Package(PathBuf),
    /// A Chromium named by [`ENV`] (e.g. Debian's `/usr/bin/chromium`).
    Configured(PathBuf),
}

impl Chromium {
    pub fn path(&self) -> &Path {
        match self {
            Self::Package(p) | Self::Configured(p) => p,
        }
    }
}

/// The Chromium of this run: [`ENV`]'s when it is set, else the npm
/// package's, unpacked if needed. Panics with a one-line message (what to
/// install or set) when there is none. The blocking work runs off the async
/// threads; the first caller in a process does it, the others wait for its
/// answer.
pub async fn executable() -> Chromium {
    static READY: OnceLock<Result<Chromium, String>> = OnceLock::new();
    if READY.get().is_none() && std::env::var_os(ENV).is_none() {
        npm::installed().await;
    }
    let ready = tokio::task::spawn_blocking(|| {
        READY
            .get_or_init(|| {
                locate(
                    std::env::var_os(ENV),
                    &npm::tests_dir(),
                    Programs::default(),
                )
            })
            .clone()
    })
    .await
    .expect("the Chromium unpack task panicked");
    ready.unwrap_or_else(|message| panic!("{message}"))
}

/// The Chromium to run: `configured` (the value of [`ENV`]) when given,
/// else the one unpacked from `tests/node_modules` of `tests_dir` (which
/// must be installed). Blocks.
pub fn locate(
    configured: Option<OsString>,
    tests_dir: &Path,
    programs: Programs<'_>,
) -> Result<Chromium, String> {
    match configured {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            if path.is_file() {
                Ok(Chromium::Configured(path))
            } else {
                Err(format!(
                    "{ENV} names {}, which is not a file; point it at a Chromium executable (e.g. /usr/bin/chromium) or unset it to use the npm package's",
                    path.display()
                ))
            }
        }
        _ => unpacked(tests_dir, programs).map(Chromium::Package),
    }
}

/// The package's Chromium under `dir/node_modules`, unpacked unless an
/// earlier run finished that, holding `dir/.npm-ci.lock` meanwhile. Blocks.
pub fn unpacked(dir: &Path, programs: Programs<'_>) -> Result<PathBuf, String> {
    let _lock = npm::lock(dir)?;
    let modules = dir.join("node_modules");
    let target = modules.join(UNPACKED);
    let browser = target.join("chromium");
    if target.join(DONE).is_file() && browser.is_file() {
        return Ok(browser);
    }
    let package = modules.join("@sparticuz/chromium/package.json");
    if !package.is_file() {
        return Err(format!(
            "{} is missing although tests/node_modules is installed from tests/package-lock.json; delete tests/node_modules and run the tests again",
            package.display()
        ));
    }
    let partial = modules.join(format!("{UNPACKED}.partial"));
    for stale in [&partial, &target] {
        if stale.exists() {
            std::fs::remove_dir_all(stale)
                .map_err(|e| format!("cannot remove {}: {e}", stale.display()))?;
        }
    }
    std::fs::create_dir_all(&partial)
        .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
    let output = Command::new(programs.node)
        .args(["--input-type=module", "-e", UNPACK_JS])
        .current_dir(dir)
        .env("TMPDIR", &partial)
        .output()
        .map_err(|e| {
            format!(
                "the browser tests cannot run `{}` ({e}): {INSTALL_HINT}",
                programs.node
            )
        })?;
    let answered = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if !output.status.success() || answered != partial.join("chromium") {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or("no message");
        return Err(format!(
            "unpacking Chromium from @sparticuz/chromium failed ({}, answered '{}'): {last}; or set {ENV} to a Chromium executable",
            output.status,
            answered.display()
        ));
    }
    std::fs::write(partial.join(DONE), "")
        .map_err(|e| format!("cannot write in {}: {e}", partial.display()))?;
    std::fs::rename(&partial, &target).map_err(|e| {
        format!(
            "cannot rename {} to {}: {e}",
            partial.display(),
            target.display()
        )
    })?;
    Ok(browser)
}
