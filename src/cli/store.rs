//! `overseer store`: offline maintenance of a store directory.
//! `overseer store check DIR` verifies a store without a server (see
//! `crate::store::check` for what it checks) and prints a summary and the
//! problems found on stdout; `overseer store copy --from DIR --to postgres`
//! copies every session of a store directory into the database of
//! `OVERSEER_DATABASE_URL` (cluster mode; see `crate::store::copy`).
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
    /// The source directory could not be opened.
    #[error("--from {}: {source}", dir.display())]
    Source {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: overseer_actors::store::StoreError,
    },
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Runs `overseer store …`.
pub fn run(args: StoreArgs) -> Result<(), StoreCliError> {
    match args.command {
        StoreCommand::Copy { from, to: _ } => copy(&from),
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
    let sled = store::SledStore::open(from, store::Durability::Fsync).map_err(|source| {
        StoreCliError::Source {
            dir: from.to_owned(),
            source,
        }
    })?;
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
