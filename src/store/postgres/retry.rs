//! What the PostgreSQL store does when the database fails: which errors
//! are transient (the connection failed, not the statement), how database
//! and pool errors become [`StoreError`]s, and the retry loop that rides
//! out a restart or a dropped connection within a budget.
//!
//! It owns no statement: every caller decides what to retry and for how
//! long (reads for [`READ_RETRY`](super::READ_RETRY), checkpoints for the
//! configured write retry). The wait between attempts is the crate's one
//! backoff policy (`crate::backoff`, with jitter: the nodes of a cluster
//! and the writers of one node that lost the database together do not
//! come back to it in lockstep).

use std::time::Duration;

use crate::backoff::Backoff;
use deadpool_postgres::PoolError;
use overseer_actors::store::StoreError;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;

/// Whether a database error is worth retrying: the connection, not the
/// statement, failed.
pub(super) fn transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        return code.code().starts_with("08")
            || [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::TOO_MANY_CONNECTIONS,
            ]
            .contains(code);
    }
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

/// A database error as a store error.
pub(crate) fn map_pg(e: tokio_postgres::Error) -> StoreError {
    if transient(&e) {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::io("database error", e)
    }
}

pub(super) fn map_pool(e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => map_pg(e),
        other => StoreError::Unavailable(format!("no database connection: {other}")),
    }
}

fn is_retryable(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_))
}

/// The wait between two attempts of a statement: from 25 ms, doubling, at
/// most a second.
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(25), Duration::from_secs(1));

/// Retries `f` across transient failures for up to `budget`.
pub(super) async fn retrying<T, F, Fut>(budget: Duration, mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + budget;
    let mut retry = 0u32;
    loop {
        let pause = BACKOFF.delay(retry);
        match f().await {
            Err(e) if is_retryable(&e) && Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "database unavailable; retrying");
                tokio::time::sleep(pause).await;
                retry = retry.saturating_add(1);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::cell::Cell;

    use super::*;

    fn down() -> StoreError {
        StoreError::Unavailable("the database is restarting".into())
    }

    // Tokio's clock (paused): the waits are the policy's, not the machine's.
    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_with_growing_waits_until_one_succeeds() {
        let attempts = Cell::new(0u32);
        let started = Instant::now();
        let out = retrying(Duration::from_secs(20), || {
            attempts.set(attempts.get() + 1);
            let n = attempts.get();
            async move {
                if n < 5 {
                    Err(down())
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(out.unwrap(), 5);
        // Four waits of 25, 50, 100, 200 ms, each with up to as much again.
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(375) && waited <= Duration::from_millis(750),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_budget_the_error_is_unavailable_and_other_errors_are_not_retried() {
        let attempts = Cell::new(0u32);
        let started = Instant::now();
        let out: Result<(), _> = retrying(Duration::from_secs(3), || {
            attempts.set(attempts.get() + 1);
            async { Err(down()) }
        })
        .await;
        assert!(matches!(out, Err(StoreError::Unavailable(_))), "{out:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(attempts.get() > 3, "{}", attempts.get());

        let attempts = Cell::new(0u32);
        let out: Result<(), _> = retrying(Duration::from_secs(3), || {
            attempts.set(attempts.get() + 1);
            async { Err(StoreError::Io("a statement the database refused".into())) }
        })
        .await;
        assert!(matches!(out, Err(StoreError::Io(_))), "{out:?}");
        assert_eq!(attempts.get(), 1);
    }
}
