//! `overseer store`: offline maintenance of a store directory. For now one
//! command, `overseer store check DIR`, which verifies a store without a
//! server (see `crate::store::check` for what it checks) and prints a
//! summary and the problems found on stdout.
//!
//! Owns the command line and the exit status only: 0 when the store is
//! healthy, non-zero when it has problems (listed) or could not be checked
//! (another process holds it, or it is not a store). It deliberately repairs
//! nothing.

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
}

/// Runs `overseer store …`.
pub fn run(args: StoreArgs) -> Result<(), StoreCliError> {
    match args.command {
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
