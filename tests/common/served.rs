//! `overseer serve` as a child process, for the tests that drive the real
//! binary: started on a free loopback port, ready once it prints its
//! `listening on` line, its stderr kept, killed (SIGKILL) when dropped.
//!
//! The wait for readiness is bounded without a watchdog thread: a reader
//! thread owns the child's stderr and hands the address over a channel, so
//! a child that never listens is killed at [`PATIENCE`], its stderr closes
//! and the reader ends with it. It deliberately knows nothing of the
//! child's configuration: callers pass the command, arguments and
//! environment they need ([`command`] is the common start).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};

use super::PATIENCE;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_overseer");

/// `overseer serve --listen 127.0.0.1:0`, for the caller to add its
/// `--data` / `--config` and environment to.
pub fn command() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0"]);
    cmd
}

/// A running `overseer serve`.
pub struct Served {
    pub child: Child,
    /// `http://<address>` (or another scheme per [`Served::start_with`]).
    pub url: String,
    /// Its stderr, line by line, as far as it has come.
    pub log: Arc<Mutex<Vec<String>>>,
    /// Its stderr lines not yet looked at by [`Served::until_line`].
    lines: Mutex<std::sync::mpsc::Receiver<String>>,
}

impl Served {
    /// Spawns `cmd` (its stdio replaced) and waits until it listens.
    pub fn start(cmd: Command) -> anyhow::Result<Self> {
        Self::start_with(cmd, "http", PATIENCE)
    }

    /// [`Served::start`], its URL with `scheme`, giving it `patience` to
    /// listen (a migration at start-up may want more than [`PATIENCE`]).
    pub fn start_with(cmd: Command, scheme: &str, patience: Duration) -> anyhow::Result<Self> {
        match Self::launch(cmd, scheme, patience)? {
            Ok(served) => Ok(served),
            Err((why, _, log)) => bail!("overseer serve never listened ({why}):\n{log}"),
        }
    }

    /// [`Served::start`] for a server that may end before it listens (a
    /// fault at start-up): then its exit status and whole stderr. Not
    /// listening within [`PATIENCE`] is still an error.
    pub fn start_or_exit(cmd: Command) -> anyhow::Result<Result<Self, (ExitStatus, String)>> {
        match Self::launch(cmd, "http", PATIENCE)? {
            Ok(served) => Ok(Ok(served)),
            Err((RecvTimeoutError::Disconnected, status, log)) => Ok(Err((status, log))),
            Err((why, _, log)) => bail!("overseer serve never listened ({why}):\n{log}"),
        }
    }

    /// Spawns `cmd` and waits for its `listening on` line; else (it ended,
    /// or `patience` passed and it was killed) why, its status and stderr.
    #[allow(clippy::type_complexity)]
    fn launch(
        mut cmd: Command,
        scheme: &str,
        patience: Duration,
    ) -> anyhow::Result<Result<Self, (RecvTimeoutError, ExitStatus, String)>> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawn overseer serve")?;
        let stderr = child.stderr.take().context("stderr")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (lines_tx, lines) = std::sync::mpsc::channel();
        let sink = log.clone();
        let scheme = scheme.to_owned();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("listening on ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(format!("{scheme}://{addr}"));
                    }
                }
                let _ = lines_tx.send(line.clone());
                if let Ok(mut l) = sink.lock() {
                    l.push(line);
                }
            }
        });
        match rx.recv_timeout(patience) {
            Ok(url) => Ok(Ok(Self {
                child,
                url,
                log,
                lines: Mutex::new(lines),
            })),
            Err(why) => {
                let _ = child.kill();
                let status = child.wait().context("wait for overseer serve")?;
                // The reader ends with the process's stderr: then the log is
                // whole.
                while lines.recv_timeout(PATIENCE).is_ok() {}
                let log = log.lock().map(|l| l.join("\n")).unwrap_or_default();
                Ok(Err((why, status, log)))
            }
        }
    }

    /// The address it listens on (`host:port`).
    pub fn addr(&self) -> &str {
        self.url.split_once("://").map_or(&self.url, |(_, a)| a)
    }

    /// Waits for a stderr line matching `pred`, consuming the lines before
    /// it (from the first, the first time); fails if the process ends or
    /// [`PATIENCE`] passes first.
    pub fn until_line(&self, pred: impl Fn(&str) -> bool) -> anyhow::Result<String> {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = Vec::new();
        loop {
            match lines.recv_timeout(PATIENCE) {
                Ok(line) if pred(&line) => return Ok(line),
                Ok(line) => seen.push(line),
                Err(e) => bail!("no such line on stderr ({e}); got:\n{}", seen.join("\n")),
            }
        }
    }

    /// Sends it `sig` (`-HUP`, `-STOP`, …).
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
    }

    /// `kill -9`, and the exit reaped.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM; panics unless it exits 0 (a graceful shutdown) within
    /// [`PATIENCE`].
    pub fn sigterm(&mut self) {
        let status = self.sigterm_status();
        assert!(status.success(), "graceful shutdown exits 0: {status:?}");
    }

    /// SIGTERM, and the process's end within [`PATIENCE`] (else it is killed
    /// and the test fails): its exit status and its whole stderr (waiting
    /// for the stderr to close, which a child it left running would hold).
    pub fn terminate(&mut self) -> (ExitStatus, String) {
        let status = self.sigterm_status();
        // The reader thread drops its sender once stderr is closed, after
        // keeping the last line: then the log is whole.
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        while lines.recv_timeout(PATIENCE).is_ok() {}
        drop(lines);
        (status, self.log())
    }

    /// SIGTERM, and its exit status within [`PATIENCE`].
    fn sigterm_status(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => {
                    let _ = self.child.kill();
                    panic!(
                        "overseer serve did not exit within {PATIENCE:?} of SIGTERM:\n{}",
                        self.log()
                    );
                }
                Err(e) => panic!("waiting for overseer serve: {e}"),
            }
        }
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
