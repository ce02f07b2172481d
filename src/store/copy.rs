//! `overseer store copy`: every session of a sled directory into the
//! PostgreSQL store, as it is (header, whole transcript with its blobs,
//! every event, metadata, queued messages).
//!
//! A session already in the database (by id) is left alone, so a second run
//! copies nothing twice and an interrupted run can simply be run again. No
//! lease is taken: the active sessions among those copied are taken over by
//! the first node of the cluster that looks (failover), which resumes them
//! from their checkpoints. It owns the walk and the counts only; reading is
//! the sled [`Inspector`]'s (no write of ours to the source: a directory of
//! an older layout is read where it is, not upgraded), writing the
//! PostgreSQL store's.

use overseer_actors::store::StoreError;

use super::postgres::PgStore;
use super::Inspector;

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

/// Copies every session of `from` into `to`. Runs on a multi-threaded
/// runtime: the source's reads are blocking sled reads, each made with
/// `block_in_place`.
pub async fn copy(from: &Inspector, to: &PgStore) -> Result<CopyReport, StoreError> {
    use tokio::task::block_in_place;
    let mut report = CopyReport::default();
    let mut after = None;
    // Page by page, so a large store is never held decoded at once.
    loop {
        let page = block_in_place(|| from.scan(after, COPY_PAGE))?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for header in page {
            let id = header.id;
            let Some(stored) = block_in_place(|| from.load(id))? else {
                continue;
            };
            let events = block_in_place(|| from.events_after(id, 0, usize::MAX))?;
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
