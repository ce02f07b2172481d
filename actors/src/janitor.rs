//! The janitor: the runtime's background walk over every stored session, in
//! bounded batches, for what no actor is awake to do — completing sessions
//! idle in `awaiting_input` past their agent's `input_timeout_secs`, and
//! purging terminal sessions older than the retention period.
//!
//! It walks the store rather than the live actors because the sessions it is
//! for are mostly on disk (hibernated, or untouched since a restart). Each
//! tick reads one batch of headers from a cursor and goes on from there; at
//! the end it starts over, so one pass over N sessions takes N / batch
//! ticks and costs one batch of reads per tick, whatever N is. It decides
//! nothing itself about a live session: an expiry is a message the session
//! checks against its own state (nothing happened since?), and only terminal
//! sessions are purged.

use std::sync::{Arc, Weak};

use tokio::task::JoinHandle;

use crate::messages::SessionMsg;
use crate::model::{SessionId, SessionStatus};
use crate::runtime::Runtime;

pub(crate) use crate::runtime::JanitorConfig;

/// What one batch did (for tests and logs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Headers read.
    pub read: usize,
    /// Sessions told their input wait expired.
    pub expired: usize,
    /// Sessions purged.
    pub purged: usize,
}

/// Starts the janitor for `runtime`; it stops when the runtime is dropped
/// or shuts down.
pub(crate) fn spawn(runtime: Weak<Runtime>, config: JanitorConfig) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut cursor: Option<SessionId> = None;
        loop {
            tokio::time::sleep(config.interval).await;
            let Some(rt) = runtime.upgrade() else { return };
            if rt.is_shutting_down() {
                return;
            }
            match sweep(&rt, cursor, config).await {
                Ok((next, swept)) => {
                    cursor = next;
                    if swept.expired + swept.purged > 0 {
                        tracing::info!(
                            expired = swept.expired,
                            purged = swept.purged,
                            "janitor batch"
                        );
                    }
                }
                // The store reports its own outage: a line every tick
                // would drown it. It goes on from where it was once the
                // store serves again.
                Err(e) if e.is_unavailable() => tracing::debug!("janitor: {e}"),
                Err(e) => {
                    tracing::warn!("janitor: {e}; retrying from the start");
                    cursor = None;
                }
            }
        }
    })
}

/// Sweeps one batch after `cursor`; returns where the next starts (`None`:
/// from the beginning again).
pub(crate) async fn sweep(
    rt: &Arc<Runtime>,
    cursor: Option<SessionId>,
    config: JanitorConfig,
) -> Result<(Option<SessionId>, Swept), crate::store::StoreError> {
    let headers = rt.store.scan(cursor, config.batch).await?;
    let mut swept = Swept {
        read: headers.len(),
        ..Swept::default()
    };
    let now = rt.now_ms();
    for h in &headers {
        match h.status {
            SessionStatus::AwaitingInput => {
                let Some(secs) = h.config.input_timeout_secs else {
                    continue;
                };
                let deadline = h
                    .updated_at_ms
                    .saturating_add((secs as i64).saturating_mul(1000));
                if now < deadline {
                    continue;
                }
                let since = h.updated_at_ms;
                // The session itself checks nothing happened since.
                match rt.deliver(h.id, || SessionMsg::ExpireInput(since)).await {
                    Ok(()) => swept.expired += 1,
                    Err(e) => tracing::debug!(session_id = %h.id, "expiry not delivered: {e}"),
                }
            }
            status if status.is_terminal() => {
                let Some(retention) = config.retention else {
                    continue;
                };
                let age = now.saturating_sub(h.updated_at_ms);
                if u128::try_from(age).unwrap_or(0) < retention.as_millis() {
                    continue;
                }
                // A terminal session's actor drains; wait for it rather
                // than purge under it.
                if rt.live.contains_key(&h.id) {
                    continue;
                }
                match rt.store.purge(h.id).await {
                    Ok(()) => {
                        swept.purged += 1;
                        rt.forget(h.id);
                    }
                    // In a cluster the node owning the tree purges it.
                    Err(e) if e.is_not_owner() => {
                        tracing::debug!(session_id = %h.id, "not purged here: {e}")
                    }
                    Err(e) if e.is_unavailable() => {
                        tracing::debug!(session_id = %h.id, "not purged now: {e}")
                    }
                    Err(e) => tracing::warn!(session_id = %h.id, "purge failed: {e}"),
                }
            }
            _ => {}
        }
    }
    let next = if headers.len() < config.batch {
        None
    } else {
        headers.last().map(|h| h.id)
    };
    Ok((next, swept))
}
