//! `overseer store copy`: every session of a sled directory into the
//! PostgreSQL store, as it is (header, whole transcript with its blobs,
//! every event, metadata, queued messages).
//!
//! A session already in the database (by id) is left alone, so a second run
//! copies nothing twice and an interrupted run can simply be run again. No
//! lease is taken: the active sessions among those copied are taken over by
//! the first node of the cluster that looks (failover), which resumes them
//! from their checkpoints. It owns the walk and the counts only; reading is
//! the sled store's, writing the PostgreSQL store's.

use overseer_actors::store::{CheckpointStore, StoreError};

use super::postgres::PgStore;
use super::SledStore;

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Sessions written.
    pub copied: usize,
    /// Sessions found already in the database, left alone.
    pub present: usize,
    /// Events written.
    pub events: usize,
}

/// Headers read at once.
const COPY_PAGE: usize = 1024;

/// Copies every session of `from` into `to`.
pub async fn copy(from: &SledStore, to: &PgStore) -> Result<CopyReport, StoreError> {
    let mut report = CopyReport::default();
    let mut after = None;
    // Page by page, so a large store is never held decoded at once.
    loop {
        let page = from.scan(after, COPY_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for header in page {
            let id = header.id;
            let Some(stored) = from.load(id).await? else {
                continue;
            };
            let events = from.events_after(id, 0, usize::MAX).await?;
            if to.import(&stored, &events).await? {
                report.copied += 1;
                report.events += events.len();
            } else {
                report.present += 1;
            }
        }
    }
    Ok(report)
}
