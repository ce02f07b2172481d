//! The `overseer` binary: parses the command line and hands over to
//! [`overseer::cli`].
//!
//! It owns only process-wide set-up (the TLS crypto provider, logging, and,
//! with the `fault-injection` feature, the planned fault) and the
//! exit status; it deliberately holds no behaviour, so everything it runs is
//! reachable, and testable, from the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // reqwest and jsonwebtoken are built without a default rustls provider so
    // that the binary picks one, once: aws-lc-rs. "Already installed" (by an
    // embedding host) is fine.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = overseer::cli::Cli::parse();
    // Logging starts in `execute`: its format is in the configuration.
    // Test builds only: the planned fault is process-wide, so it is armed
    // here, once, before any actor runs.
    #[cfg(feature = "fault-injection")]
    if let Err(error) = overseer::cli::arm_faults() {
        overseer::cli::report(&error);
        return ExitCode::FAILURE;
    }
    match overseer::cli::execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            overseer::cli::report(&error);
            ExitCode::from(error.exit_code())
        }
    }
}
