//! What the PostgreSQL store does when the database fails: which errors
//! are transient (the connection failed, not the statement), how database
//! and pool errors become [`StoreError`]s, and the retry loop that rides
//! out a restart or a dropped connection within a budget.
//!
//! It owns no statement: every caller decides what to retry and for how
//! long (reads for [`READ_RETRY`](super::READ_RETRY), checkpoints for the
//! configured write retry).

use std::time::{Duration, Instant};

use deadpool_postgres::PoolError;
use overseer_actors::store::StoreError;
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
        StoreError::Io(format!("database error: {e}"))
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

/// Retries `f` across transient failures for up to `budget`.
pub(super) async fn retrying<T, F, Fut>(budget: Duration, mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + budget;
    let mut pause = Duration::from_millis(25);
    loop {
        match f().await {
            Err(e) if is_retryable(&e) && Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "database unavailable; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}
