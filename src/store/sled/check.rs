//! `overseer store check DIR`: verifying a store directory offline.
//!
//! It opens the directory the way a server would, minus every write of its
//! own (sled 0.34 has no read-only mode: opening rewrites sled's snapshot
//! file, a page index derived from the log, and nothing else), and checks
//! what a server relies on: that sled can open it at all, the layout version,
//! the commit record beside it (`sidecar`: a database holding fewer groups
//! than were confirmed lost some), every session header, the transcript
//! entries, events and blobs each header covers (present, in sequence and
//! decodable; each blob referenced in `blob_refs` by the session, or a purge
//! of another session would delete it), and the indexes (every session in its tenant's, every running
//! or waiting one in `active`). Rows no header covers and stale index entries
//! are what a crash normally leaves and are not problems.
//!
//! It deliberately repairs nothing: it reports, and the operator decides.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use overseer_actors::model::{SessionId, SCHEMA_VERSION};

use super::layout;
use super::open::{self, catch_sled_panic, OpenError, Purpose, COMMIT_KEY};
use super::trees::Trees;
use super::{sidecar, StoreOptions, FORMAT_KEY, FORMAT_VERSION};
use crate::store::codec;

/// At most this many problems are listed (the count says how many more).
const MAX_LISTED: usize = 50;

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// The directory checked.
    pub dir: PathBuf,
    /// What the store holds, one line each.
    pub summary: Vec<String>,
    /// What is wrong, one line each; empty when the store is healthy.
    pub problems: Vec<String>,
}

impl CheckReport {
    /// Whether nothing is wrong.
    pub fn is_healthy(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, text: impl Into<String>) {
        self.problems.push(text.into());
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "store {}", self.dir.display())?;
        for line in &self.summary {
            writeln!(f, "  {line}")?;
        }
        if self.problems.is_empty() {
            return writeln!(f, "healthy");
        }
        writeln!(f, "{} problem(s):", self.problems.len())?;
        for p in self.problems.iter().take(MAX_LISTED) {
            writeln!(f, "  - {p}")?;
        }
        if self.problems.len() > MAX_LISTED {
            writeln!(f, "  … and {} more", self.problems.len() - MAX_LISTED)?;
        }
        Ok(())
    }
}

/// Checks the store in `dir`. Blocking. An error means it could not be
/// checked at all (no such store, or another process holds it open); damage,
/// including damage that keeps sled from opening it, is a problem in the
/// report.
pub fn check(dir: &Path) -> Result<CheckReport, OpenError> {
    if !dir.join("db").is_file() {
        return Err(OpenError::Other {
            dir: dir.to_owned(),
            detail: "it holds no sled database (no db file): not a store directory".into(),
        });
    }
    let mut report = CheckReport {
        dir: dir.to_owned(),
        ..CheckReport::default()
    };
    let recorded = match sidecar::read(dir) {
        Ok(r) => r,
        Err(e) => {
            report.problem(format!("the commit record is unreadable: {e}"));
            None
        }
    };
    let options = StoreOptions::default();
    let opened = match open::open(dir, &options, Purpose::Inspect) {
        Ok(opened) => opened,
        Err(e @ OpenError::Locked { .. }) => return Err(e),
        Err(OpenError::Damaged { message, .. }) => {
            report.problem(format!("sled fails while opening the database: {message}"));
            return Ok(report);
        }
        Err(e) => {
            report.problem(format!("the database does not open: {e}"));
            return Ok(report);
        }
    };
    let trees = opened.generation.trees.clone();
    let found = opened.commit_seq;
    match recorded {
        Some(recorded) if recorded > found => report.problem(format!(
            "lost committed checkpoints: {} records group {recorded} as durable but the \
             database ends at group {found}",
            sidecar::path(dir).display()
        )),
        Some(recorded) => report
            .summary
            .push(format!("last group {found} (commit record: {recorded})")),
        None => report.summary.push(format!(
            "last group {found} (no commit record: a loss would go unnoticed)"
        )),
    }
    if let Err(message) = catch_sled_panic(|| verify(&trees, &mut report)) {
        report.problem(format!("sled failed while reading the database: {message}"));
    }
    drop(trees);
    drop(opened);
    Ok(report)
}

/// Reports a failed sled read and stops the scan it came from: a sled
/// iterator that hit damaged data may yield the same error forever.
macro_rules! or_stop {
    ($report:expr, $result:expr, $what:expr) => {
        match $result {
            Ok(v) => v,
            Err(e) => {
                $report.problem(format!("{}: {e}", $what));
                break;
            }
        }
    };
}

fn verify(trees: &Trees, report: &mut CheckReport) {
    let mut layout = 0;
    match trees.format.get(FORMAT_KEY) {
        Ok(Some(raw)) => match <[u8; 4]>::try_from(raw.as_ref()) {
            Ok(bytes) => {
                let version = u32::from_be_bytes(bytes);
                layout = version;
                if version > FORMAT_VERSION {
                    report.problem(format!(
                        "layout version {version} is newer than this binary's {FORMAT_VERSION}; \
                         check it with a newer overseer"
                    ));
                    return;
                }
                report.summary.push(format!("layout version {version}"));
            }
            Err(_) => report.problem(format!(
                "the layout version is {} bytes, expected 4",
                raw.len()
            )),
        },
        Ok(None) => report.problem("no layout version: not written by overseer"),
        Err(e) => report.problem(format!("reading the layout version: {e}")),
    }
    if let Ok(Some(raw)) = trees.meta.get(COMMIT_KEY) {
        if raw.len() != 8 {
            report.problem(format!(
                "the group number is {} bytes, expected 8",
                raw.len()
            ));
        }
    }

    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    let (mut sessions, mut entries, mut events) = (0u64, 0u64, 0u64);
    // What each header covers (events, entries), for the records: `None`
    // for a header that could not be read (already reported).
    let mut covered: HashMap<SessionId, Option<(u64, u64)>> = HashMap::new();
    for item in trees.sessions.iter() {
        let (key, bytes) = or_stop!(report, item, "reading the sessions tree");
        sessions += 1;
        let Some(id) = layout::id_from(&key) else {
            report.problem(format!(
                "sessions: a key of {} bytes, expected 16",
                key.len()
            ));
            continue;
        };
        covered.insert(id, None);
        let peek = match codec::peek(&id, &bytes) {
            Ok(peek) => peek,
            Err(e) => {
                report.problem(format!("session {id}: {}", detail(&e)));
                continue;
            }
        };
        if peek.schema_version > SCHEMA_VERSION {
            continue;
        }
        let header = match trees.decode_header(&id, &bytes) {
            Ok(header) => header,
            Err(e) => {
                report.problem(format!("session {id}: {}", detail(&e)));
                continue;
            }
        };
        covered.insert(id, Some((header.last_event_seq, header.transcript_len)));
        *by_status
            .entry(header.status.as_str().to_owned())
            .or_default() += 1;
        match trees.session(&id) {
            Ok(_) => entries += header.transcript_len,
            Err(e) => report.problem(format!("session {id}: {}", detail(&e))),
        }
        // From layout 2 on, a purge of another session deletes a blob that
        // has no reference from this one.
        if layout >= 2 {
            if let Err(e) = check_blob_refs(trees, &id) {
                report.problem(format!("session {id}: {e}"));
            }
        }
        if let Err(e) = super::configs::check_reference(trees, &id, &bytes) {
            report.problem(format!("session {id}: {e}"));
        }
        match check_events(trees, &id, header.last_event_seq) {
            Ok(()) => events += header.last_event_seq,
            Err(e) => report.problem(format!("session {id}: {e}")),
        }
        match trees
            .tenants
            .contains_key(layout::tenant_key(&header.tenant, &id))
        {
            Ok(true) => {}
            Ok(false) => report.problem(format!(
                "session {id} is missing from the index of tenant {:?}: listings would not show it",
                header.tenant
            )),
            Err(e) => report.problem(format!("session {id}: reading the tenants index: {e}")),
        }
        if codec::is_active(header.status) {
            match trees.active.contains_key(id.as_bytes()) {
                Ok(true) => {}
                Ok(false) => report.problem(format!(
                    "session {id} ({}) is missing from the active index: a restart would not \
                     resume it",
                    header.status
                )),
                Err(e) => report.problem(format!("session {id}: reading the active index: {e}")),
            }
        }
    }
    let mut blobs = 0u64;
    for item in trees.blobs.iter() {
        or_stop!(report, item, "reading the blobs tree");
        blobs += 1;
    }
    let mut refs = 0u64;
    for item in trees.blob_refs.iter() {
        or_stop!(report, item, "reading the blob_refs tree");
        refs += 1;
    }
    let (mut purges, mut purging) = (0u64, HashSet::new());
    for item in trees.meta.scan_prefix(layout::PURGE_PREFIX) {
        let (key, _) = or_stop!(report, item, "reading the purge markers");
        purges += 1;
        if let Some(id) = key
            .get(layout::PURGE_PREFIX.len()..)
            .and_then(layout::id_from)
        {
            purging.insert(id);
        }
    }
    let mut records = 0u64;
    if trees.per_checkpoint {
        for item in trees.records.iter() {
            let (key, _) = or_stop!(report, item, "reading the checkpoint records");
            records += 1;
            if let Err(e) = check_record_key(&key, &covered, &purging) {
                report.problem(e);
            }
        }
    }
    let statuses = by_status
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    report.summary.push(format!(
        "{sessions} session(s){}; {entries} transcript entries and {events} events covered by \
         their headers; {blobs} blob(s), {refs} blob reference(s)",
        if statuses.is_empty() {
            String::new()
        } else {
            format!(" ({statuses})")
        }
    ));
    match super::configs::count(trees) {
        Ok((configs, refs)) => report.summary.push(format!(
            "{configs} configuration(s), {refs} configuration reference(s)"
        )),
        Err(e) => report.problem(format!("reading the configurations: {e}")),
    }
    if trees.per_checkpoint {
        report
            .summary
            .push(format!("{records} checkpoint record(s)"));
    }
    if purges > 0 {
        // What a crash mid-purge leaves: invisible rows, removed when a
        // server next opens the store.
        report.summary.push(format!(
            "{purges} purge(s) under way, finished when a server next opens the store"
        ));
    }
}

/// A record is committed with its header, in one batch: so its session
/// has a header (unless a purge of it is under way, which removes the
/// header first), and the header's counters reach the record's ends.
fn check_record_key(
    key: &[u8],
    covered: &HashMap<SessionId, Option<(u64, u64)>>,
    purging: &HashSet<SessionId>,
) -> Result<(), String> {
    let (Some(id), Some((events_end, entries_end))) = (
        key.get(..16).and_then(layout::id_from),
        layout::record_ends(key),
    ) else {
        return Err(format!(
            "records: a key of {} bytes, expected 32",
            key.len()
        ));
    };
    match covered.get(&id) {
        None if purging.contains(&id) => Ok(()),
        None => Err(format!(
            "session {id}: a checkpoint record (events to {events_end}, entries to \
             {entries_end}) without the session's header: no reader sees it"
        )),
        Some(Some((last_event, len))) if events_end > *last_event || entries_end > *len => {
            Err(format!(
                "session {id}: a checkpoint record (events to {events_end}, entries to \
                 {entries_end}) past what its header covers (events to {last_event}, entries \
                 to {len})"
            ))
        }
        Some(_) => Ok(()),
    }
}

/// Every blob a stored entry of `id` names (in a record, or a transcript
/// row of an older layout) has `id`'s reference.
fn check_blob_refs(trees: &Trees, id: &SessionId) -> Result<(), String> {
    for (hash, named_by) in trees.blobs_named(id).map_err(|e| detail(&e))? {
        let referenced = trees
            .blob_refs
            .contains_key(layout::blob_ref_key(&hash, id))
            .map_err(|e| format!("reading the blob references: {e}"))?;
        if !referenced {
            return Err(format!(
                "{named_by} names blob {hash} without a reference to it: purging another \
                 session could delete it"
            ));
        }
    }
    Ok(())
}

fn check_events(trees: &Trees, id: &SessionId, last: u64) -> Result<(), String> {
    if last == 0 {
        return Ok(());
    }
    let mut expected = 1;
    let mut gap = None;
    trees
        .committed_events(id, 1, last, |event| {
            if event.seq != expected {
                gap = Some(expected);
                return false;
            }
            expected += 1;
            true
        })
        .map_err(|e| detail(&e))?;
    if let Some(missing) = gap {
        return Err(format!("event {missing} is missing"));
    }
    if expected <= last {
        return Err(format!(
            "event {expected} is missing (the header counts {last})"
        ));
    }
    Ok(())
}

/// A store error without the "corrupt record for session X" prefix the
/// report already gives.
fn detail(e: &overseer_actors::store::StoreError) -> String {
    match e {
        overseer_actors::store::StoreError::Corrupt { detail, .. } => detail.clone(),
        // With its causes, down to the OS error.
        other => overseer_actors::error::chain(other),
    }
}
