//! `overseer store`: offline maintenance of a store directory.
//! `overseer store check DIR` verifies a store without a server (see
//! `crate::store::check` for what it checks) and prints a summary and the
//! problems found on stdout; `overseer store copy --from DIR --to postgres`
//! copies every session of a store directory into the database of
//! `OVERSEER_DATABASE_URL` (cluster mode; see `crate::store::copy`);
//! `overseer store backup --to DIR` takes a backup from a running server
//! (`--url`, over `POST /v1/admin/backup`) or a stopped store directory
//! (`--data`), and `overseer store restore --from DIR --to STORE` puts one
//! back (see `crate::store::backup`).
//!
//! Owns the command line and the exit status only: 0 when the store is
//! healthy (or the copy complete), non-zero when it has problems (listed) or
//! could not be read (another process holds it, or it is not a store). It
//! deliberately repairs nothing.

use std::io::Write;
use std::path::PathBuf;

use crate::store::{self, OpenError};

/// `overseer store` subcommands.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: StoreCommand,
}

/// What `overseer store` does.
#[derive(Debug, clap::Subcommand)]
pub enum StoreCommand {
    /// Verify a store directory offline: that sled opens it, its layout
    /// version, its commit record, every session's transcript entries,
    /// events and blobs, and the indexes. Exits 0 when healthy, 1 with the
    /// problems listed otherwise. Stop the server first: a running server
    /// holds the directory's lock.
    Check {
        /// The store directory (`store.data_dir` of the server).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Copy every session of a store directory (transcripts, events,
    /// metadata, queued messages) into PostgreSQL, at OVERSEER_DATABASE_URL.
    /// Sessions already there are left alone, so running it again copies
    /// nothing twice. Stop the server that uses DIR first.
    Copy {
        /// The store directory to read.
        #[arg(long, value_name = "DIR")]
        from: PathBuf,
        /// Where to: `postgres` (the database of OVERSEER_DATABASE_URL).
        #[arg(long, value_name = "STORE", value_parser = ["postgres"])]
        to: String,
    },
    /// Back up a sled store into a new directory while its server serves
    /// (--url) or from a stopped store (--data). Every session acknowledged
    /// before the backup began is in it, each at one whole checkpoint. The
    /// backup is a store directory (`DIR/store`) plus `DIR/overseer-backup.json`,
    /// written last: without it the backup is not complete. In cluster mode
    /// back PostgreSQL up with pg_dump instead.
    Backup {
        /// Where from.
        #[command(flatten)]
        source: BackupSource,
        /// The new backup directory (missing or empty).
        #[arg(long, value_name = "DIR")]
        to: PathBuf,
    },
    /// Restore a backup into a store directory, after checking it (its
    /// manifest, and `store check` of its store). Stop the server that uses
    /// STORE first.
    Restore {
        /// The backup directory (what `store backup --to` wrote).
        #[arg(long, value_name = "DIR")]
        from: PathBuf,
        /// The store directory to restore into (missing or empty).
        #[arg(long, value_name = "STORE")]
        to: PathBuf,
        /// Restore into a non-empty STORE: it is moved aside to
        /// `STORE.replaced-<unix seconds>` first (never deleted).
        #[arg(long)]
        force: bool,
    },
}

/// Where `overseer store backup` reads from.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct BackupSource {
    /// A running server's base URL (token with the `admin` scope in
    /// OVERSEER_TOKEN): it streams a consistent backup while it serves.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// A stopped server's store directory, opened directly.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
}

/// Why `overseer store` failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreCliError {
    /// The directory could not be checked at all.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The check found problems (listed on stdout).
    #[error("the store in {} has {count} problem(s), listed above", dir.display())]
    Damaged {
        /// The directory.
        dir: PathBuf,
        /// How many.
        count: usize,
    },
    /// The report could not be written (e.g. stdout closed).
    #[error("cannot write the report: {0}")]
    Output(std::io::Error),
    /// `--from` is not a directory.
    #[error("--from {}: no such directory", .0.display())]
    NoDirectory(PathBuf),
    /// `OVERSEER_DATABASE_URL` is not set.
    #[error("{0}: not set; export the cluster's database URL (postgres://user:password@host:5432/dbname)")]
    NoDatabaseUrl(&'static str),
    /// The database could not be opened.
    #[error(transparent)]
    Database(#[from] crate::store::postgres::PgOpenError),
    /// Reading or writing a session failed.
    #[error("the copy stopped: {0}; run it again to go on (sessions already copied are skipped)")]
    Copy(overseer_actors::store::StoreError),
    /// Neither `--url` nor `--data` (clap requires one; kept for callers
    /// that build the arguments themselves).
    #[error("store backup: give --url URL (a running server) or --data DIR (a stopped store)")]
    NoSource,
    /// A backup or restore failed.
    #[error(transparent)]
    Backup(#[from] crate::store::backup::BackupError),
    /// The server refused the backup or could not be reached.
    #[error("{url}: {source}")]
    Server {
        /// The server.
        url: String,
        /// Why.
        source: super::client::ClientError,
    },
    /// The backup stream broke off or held something unreadable.
    #[error("the backup stream from {url} {why}; nothing was kept in {}", to.display())]
    Stream {
        /// The server.
        url: String,
        /// What went wrong.
        why: String,
        /// The backup directory (removed).
        to: PathBuf,
    },
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Runs `overseer store …`.
pub fn run(args: StoreArgs) -> Result<(), StoreCliError> {
    match args.command {
        StoreCommand::Copy { from, to: _ } => copy(&from),
        StoreCommand::Backup { source, to } => backup(source, &to),
        StoreCommand::Restore { from, to, force } => {
            let restored = crate::store::backup::restore(&from, &to, force)?;
            let mut out = std::io::stdout().lock();
            if let Some(aside) = &restored.moved_aside {
                writeln!(
                    out,
                    "moved what was in {} to {}",
                    to.display(),
                    aside.display()
                )
                .map_err(StoreCliError::Output)?;
            }
            writeln!(
                out,
                "restored {} session(s) with {} event(s) (backup of {} taken at {}) into {}",
                restored.manifest.sessions,
                restored.manifest.events,
                restored.manifest.source,
                restored.manifest.started_at,
                to.display()
            )
            .and_then(|()| out.flush())
            .map_err(StoreCliError::Output)
        }
        StoreCommand::Check { dir } => {
            let report = store::check(&dir)?;
            let mut out = std::io::stdout().lock();
            write!(out, "{report}")
                .and_then(|()| out.flush())
                .map_err(StoreCliError::Output)?;
            if report.is_healthy() {
                Ok(())
            } else {
                Err(StoreCliError::Damaged {
                    dir,
                    count: report.problems.len(),
                })
            }
        }
    }
}

/// `overseer store copy --from DIR --to postgres`.
fn copy(from: &std::path::Path) -> Result<(), StoreCliError> {
    use crate::store::postgres::{PgOptions, PgStore, DATABASE_URL_ENV};
    // Opening would create a missing directory: a mistyped path must not
    // become an empty store that copies nothing, successfully.
    if !from.is_dir() {
        return Err(StoreCliError::NoDirectory(from.to_owned()));
    }
    let url = std::env::var(DATABASE_URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or(StoreCliError::NoDatabaseUrl(DATABASE_URL_ENV))?;
    // Read where it is, whatever its layout: a copy never upgrades its source.
    let sled = store::Inspector::open(from)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(StoreCliError::Runtime)?;
    let report = rt.block_on(async {
        let pg = PgStore::open(&url, PgOptions::default()).await?;
        store::copy::copy(&sled, &pg)
            .await
            .map_err(StoreCliError::Copy)
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "copied {} session(s) with {} event(s) from {}; {} already in the database, left alone",
        report.copied,
        report.events,
        from.display(),
        report.present
    )
    .and_then(|()| out.flush())
    .map_err(StoreCliError::Output)
}

/// `overseer store backup`.
fn backup(source: BackupSource, to: &std::path::Path) -> Result<(), StoreCliError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(StoreCliError::Runtime)?;
    let manifest = match (source.url, source.data) {
        (_, Some(data)) => rt.block_on(crate::store::backup::backup_dir(&data, to))?,
        (Some(url), None) => rt.block_on(backup_from_server(&url, to))?,
        (None, None) => return Err(StoreCliError::NoSource),
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "backed up {} session(s) with {} event(s) from {} into {} (every session acknowledged before {} is in it)",
        manifest.sessions,
        manifest.events,
        manifest.source,
        to.display(),
        manifest.started_at
    )
    .and_then(|()| out.flush())
    .map_err(StoreCliError::Output)
}

/// Reads the backup stream of the server at `url` into the new backup
/// directory `to`. The directory is checked before the server is asked, and
/// removed again if the stream does not end whole.
async fn backup_from_server(
    url: &str,
    to: &std::path::Path,
) -> Result<crate::store::backup::Manifest, StoreCliError> {
    use crate::store::backup::{BackupError, BackupWriter, StreamLine};
    let vacant = {
        let to = to.to_owned();
        tokio::task::spawn_blocking(move || match std::fs::read_dir(&to) {
            Ok(mut entries) => Ok(entries.next().is_none()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
            Err(source) => Err(BackupError::Io { path: to, source }),
        })
        .await
        .map_err(|e| StoreCliError::Output(std::io::Error::other(e)))??
    };
    if !vacant {
        return Err(BackupError::TargetNotEmpty(to.to_owned()).into());
    }
    let client = super::client::Client::from_env(url);
    let mut resp = client
        .post_stream("/v1/admin/backup")
        .await
        .map_err(|source| StoreCliError::Server {
            url: url.to_owned(),
            source,
        })?;
    let mut writer = {
        let (to, source) = (to.to_owned(), url.to_owned());
        tokio::task::spawn_blocking(move || BackupWriter::create(&to, source))
            .await
            .map_err(|e| StoreCliError::Output(std::io::Error::other(e)))??
    };
    let broken = |why: String| StoreCliError::Stream {
        url: url.to_owned(),
        why,
        to: to.to_owned(),
    };
    let mut buffer: Vec<u8> = Vec::new();
    let (mut sessions, mut events) = (0u64, 0u64);
    let outcome: Result<(u64, u64), StoreCliError> = async {
        loop {
            let chunk = resp
                .chunk()
                .await
                .map_err(|e| broken(format!("broke off: {e}")))?;
            let Some(chunk) = chunk else {
                return Err(broken(format!(
                    "ended after {sessions} session(s) without its end line (the server stopped?)"
                )));
            };
            buffer.extend_from_slice(&chunk);
            while let Some(newline) = buffer.iter().position(|b| *b == b'\n') {
                let raw: Vec<u8> = buffer.drain(..=newline).collect();
                let line: StreamLine = serde_json::from_slice(&raw)
                    .map_err(|e| broken(format!("held an unreadable line: {e}")))?;
                match line {
                    StreamLine::Begin { format, started_at } => {
                        if format != crate::store::backup::BACKUP_FORMAT {
                            return Err(broken(format!(
                                "is format {format}; this binary reads format {}",
                                crate::store::backup::BACKUP_FORMAT
                            )));
                        }
                        writer.started_at(started_at);
                    }
                    StreamLine::Session(copy) => {
                        sessions += 1;
                        events += copy.events.len() as u64;
                        writer.write(*copy).await?;
                    }
                    StreamLine::End {
                        sessions: sent,
                        events: sent_events,
                    } => {
                        if (sent, sent_events) != (sessions, events) {
                            return Err(broken(format!(
                                "says it sent {sent} session(s) and {sent_events} event(s), but {sessions} and {events} arrived"
                            )));
                        }
                        return Ok((sessions, events));
                    }
                    StreamLine::Error { message } => {
                        return Err(broken(format!("failed on the server: {message}")));
                    }
                }
            }
        }
    }
    .await;
    match outcome {
        Ok((sessions, events)) => Ok(writer.finish(sessions, events).await?),
        Err(e) => {
            writer.abandon().await;
            Err(e)
        }
    }
}
