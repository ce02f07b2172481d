//! The reads of the PostgreSQL store: a whole session, a header, events
//! after a sequence, transcript ranges, the listings (by status, by tenant,
//! the bounded walk of retention) and the decision index. Every read is
//! bounded by what the session's header commits (`transcript_len`,
//! `last_event_seq`, the queue's range), and retried across transient
//! failures by the port's methods in the parent module.
//!
//! It owns no write: checkpoints are `writer`'s, purges `purge`'s.

use std::sync::Arc;

use overseer_actors::model::{
    Event, QueuedMessage, SessionHeader, SessionId, SessionStatus, TranscriptEntry,
};
use overseer_actors::store::{
    DecisionPage, DecisionQuery, DecisionRow, SessionSummary, StoreError, StoredSession,
};

use super::codec::corrupt;
use super::{map_pg, retrying, session_id, signed, PgStore, READ_RETRY};
use crate::store::{configs, record};

impl PgStore {
    /// A stored header joined with the configuration it names (`config`:
    /// the `configs` row of its `config_hash`, read in the same query),
    /// shared with every header this store read that names it; one that
    /// embeds its configuration (written before migration 7) as it is.
    fn decode_header(
        &self,
        id: &SessionId,
        text: &str,
        config: Option<String>,
    ) -> Result<SessionHeader, StoreError> {
        configs::decode_header_kept(id, text.as_bytes(), &self.inner.decoded_configs, |_| {
            Ok(config)
        })
    }

    pub(super) async fn read_session(
        &self,
        id: SessionId,
    ) -> Result<Option<StoredSession>, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT s.header, s.metadata,
                        ARRAY(SELECT c.record FROM checkpoints c WHERE c.session_id = s.id
                              ORDER BY c.events_end, c.entries_end),
                        ARRAY(SELECT b.hash FROM blobs b WHERE b.hash IN (
                                SELECT unnest(c.blobs) FROM checkpoints c
                                WHERE c.session_id = s.id AND c.blobs IS NOT NULL)
                              ORDER BY b.hash),
                        ARRAY(SELECT b.data FROM blobs b WHERE b.hash IN (
                                SELECT unnest(c.blobs) FROM checkpoints c
                                WHERE c.session_id = s.id AND c.blobs IS NOT NULL)
                              ORDER BY b.hash),
                        ARRAY(SELECT q.seq FROM queue q WHERE q.session_id = s.id ORDER BY q.seq),
                        ARRAY(SELECT q.message FROM queue q WHERE q.session_id = s.id ORDER BY q.seq),
                        (SELECT c.config FROM configs c WHERE c.hash = s.config_hash)
                 FROM sessions s WHERE s.id = $1",
            )
            .await
            .map_err(map_pg)?;
        self.trip();
        let Some(row) = client
            .query_opt(&statement, &[&id.0])
            .await
            .map_err(map_pg)?
        else {
            return Ok(None);
        };
        let header_text: String = row.get(0);
        let header = self.decode_header(&id, &header_text, row.get(7))?;
        let metadata: Option<String> = row.get(1);
        let metadata = match metadata {
            Some(m) => serde_json::from_str(&m)
                .map_err(|e| corrupt(id, format!("unreadable metadata: {e}")))?,
            None => serde_json::Value::Null,
        };
        let records: Vec<Vec<u8>> = row.get(2);
        let blobs = Blobs::new(row.get(3), row.get(4));
        let len = header.transcript_len;
        let mut transcript: Vec<Arc<TranscriptEntry>> = Vec::new();
        for bytes in &records {
            for (idx, entry) in expand(&id, bytes, &blobs)?.entries {
                let at = usize::try_from(idx).unwrap_or(usize::MAX);
                match at.cmp(&transcript.len()) {
                    std::cmp::Ordering::Equal => transcript.push(entry),
                    // Written again by a later checkpoint: the later wins.
                    std::cmp::Ordering::Less => transcript[at] = entry,
                    std::cmp::Ordering::Greater => {
                        return Err(corrupt(
                            id,
                            format!("transcript entry {} is missing", transcript.len()),
                        ))
                    }
                }
            }
        }
        if transcript.len() as u64 != len {
            return Err(corrupt(
                id,
                format!(
                    "the header counts {len} transcript entries but {} are stored",
                    transcript.len()
                ),
            ));
        }
        let seqs: Vec<i64> = row.get(5);
        let messages: Vec<String> = row.get(6);
        let q = header.queue;
        let mut inbox: Vec<QueuedMessage> = Vec::new();
        for (seq, message) in seqs.iter().zip(&messages) {
            let seq = u64::try_from(*seq).unwrap_or(u64::MAX);
            if seq < q.head || seq >= q.next {
                continue; // taken off the queue (or never committed)
            }
            let expected = q.head + inbox.len() as u64;
            if seq != expected {
                return Err(corrupt(id, format!("queued message {expected} is missing")));
            }
            inbox.push(
                serde_json::from_str(message)
                    .map_err(|e| corrupt(id, format!("unreadable queued message {seq}: {e}")))?,
            );
        }
        if inbox.len() as u64 != q.len() {
            return Err(corrupt(
                id,
                format!(
                    "the header counts {} queued messages but {} are stored",
                    q.len(),
                    inbox.len()
                ),
            ));
        }
        Ok(Some(StoredSession {
            header,
            transcript,
            metadata,
            inbox,
            needs_rewrite: false,
        }))
    }

    pub(super) async fn read_header(
        &self,
        id: SessionId,
    ) -> Result<Option<SessionHeader>, StoreError> {
        let client = self.client().await?;
        self.trip();
        let row = client
            .query_opt(
                "SELECT s.header, c.config FROM sessions s
                 LEFT JOIN configs c ON c.hash = s.config_hash WHERE s.id = $1",
                &[&id.0],
            )
            .await
            .map_err(map_pg)?;
        row.map(|r| {
            let text: String = r.get(0);
            self.decode_header(&id, &text, r.get(1))
        })
        .transpose()
    }

    fn headers(&self, rows: &[tokio_postgres::Row]) -> Result<Vec<SessionSummary>, StoreError> {
        rows.iter()
            .map(|r| {
                let id = session_id(r.get(0));
                let text: String = r.get(1);
                self.decode_header(&id, &text, r.get(2))
            })
            .collect()
    }

    pub(super) async fn read_events(
        &self,
        id: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            let statement = client
                .prepare_cached(
                    "SELECT c.record,
                            ARRAY(SELECT b.hash FROM blobs b WHERE b.hash = ANY(c.blobs)
                                  ORDER BY b.hash),
                            ARRAY(SELECT b.data FROM blobs b WHERE b.hash = ANY(c.blobs)
                                  ORDER BY b.hash)
                     FROM checkpoints c
                     WHERE c.session_id = $1 AND c.events_end > $2 AND c.first_event IS NOT NULL
                     ORDER BY c.events_end, c.entries_end LIMIT $3",
                )
                .await
                .map_err(map_pg)?;
            self.trip();
            // Each record holds at least one event: `limit` records hold
            // at least `limit` events after `after`, or all there are.
            client
                .query(&statement, &[&id.0, &signed(after), &signed(limit as u64)])
                .await
                .map_err(map_pg)
        })
        .await?;
        let mut events: Vec<Event> = Vec::new();
        for r in &rows {
            let bytes: &[u8] = r.get(0);
            let blobs = Blobs::new(r.get(1), r.get(2));
            for event in expand(&id, bytes, &blobs)?.events {
                let next = events.last().map_or(after, |e| e.seq);
                if event.seq > next && events.len() < limit {
                    events.push(event);
                }
            }
        }
        Ok(events)
    }

    pub(super) async fn read_by_status(
        &self,
        statuses: &[SessionStatus],
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let names: Vec<String> = statuses.iter().map(|s| s.as_str().to_owned()).collect();
        // Active statuses only (recovery's question): `active` lets the
        // planner page through the index of active sessions.
        let active = statuses
            .iter()
            .all(|s| matches!(s, SessionStatus::Running | SessionStatus::AwaitingApproval));
        // The predicate is spelled out, not a parameter: only a literal
        // `active` lets a generic plan use the partial index.
        macro_rules! by_status {
            ($active:literal) => {
                concat!(
                    "SELECT id, header,
                            (SELECT c.config FROM configs c WHERE c.hash = sessions.config_hash)
                     FROM sessions
                     WHERE ",
                    $active,
                    " status = ANY($1) AND ($2::uuid IS NULL OR id > $2)
                     ORDER BY id LIMIT $3"
                )
            };
        }
        let by_status = if active {
            by_status!("active AND")
        } else {
            by_status!("")
        };
        let after = after.map(|a| a.0);
        let limit = signed(limit as u64);
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            if names.is_empty() {
                client
                    .query(
                        "SELECT id, header,
                                (SELECT c.config FROM configs c WHERE c.hash = sessions.config_hash)
                         FROM sessions
                         WHERE ($1::uuid IS NULL OR id > $1)
                         ORDER BY id LIMIT $2",
                        &[&after, &limit],
                    )
                    .await
            } else {
                client.query(by_status, &[&names, &after, &limit]).await
            }
            .map_err(map_pg)
        })
        .await?;
        self.headers(&rows)
    }

    pub(super) async fn read_tenant(
        &self,
        tenant: &str,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        let after = after.map(|a| a.0);
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            client
                .query(
                    "SELECT id, header,
                            (SELECT c.config FROM configs c WHERE c.hash = sessions.config_hash)
                     FROM sessions
                     WHERE tenant = $1 AND ($2::uuid IS NULL OR id > $2)
                     ORDER BY id LIMIT $3",
                    &[&tenant, &after, &signed(limit as u64)],
                )
                .await
                .map_err(map_pg)
        })
        .await?;
        self.headers(&rows)
    }

    pub(super) async fn read_scan(
        &self,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionSummary>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let after = after.map(|a| a.0);
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            self.trip();
            client
                .query(
                    "SELECT id, header,
                            (SELECT c.config FROM configs c WHERE c.hash = sessions.config_hash)
                     FROM sessions
                     WHERE ($1::uuid IS NULL OR id > $1)
                     ORDER BY id LIMIT $2",
                    &[&after, &signed(limit as u64)],
                )
                .await
                .map_err(map_pg)
        })
        .await?;
        self.headers(&rows)
    }

    /// One indexed query (the primary key's order); one row more than the
    /// page says whether another page follows.
    pub(super) async fn read_decisions(
        &self,
        tenant: &str,
        query: &DecisionQuery,
    ) -> Result<DecisionPage, StoreError> {
        let limit = query.limit.max(1);
        let before = query.before.as_ref();
        let at = before.map(|p| p.at_ms);
        let session = before.map(|p| p.session_id.0);
        let call = before.map(|p| p.call_id.0.clone());
        // Two statements rather than `$2 IS NULL OR …`, so that a later
        // page's position is a range of the primary key, not a filter.
        let sql = if before.is_some() {
            r#"SELECT row_json FROM decisions
               WHERE tenant = $1
                 AND (at_ms, session_id, call_id) < ($2::bigint, $3::uuid, $4::text COLLATE "C")
                 AND ($5::text IS NULL OR agent = $5)
                 AND ($6::text IS NULL OR tool = $6)
                 AND ($7::text IS NULL OR decided_by = $7)
               ORDER BY at_ms DESC, session_id DESC, call_id DESC
               LIMIT $8"#
        } else {
            r#"SELECT row_json FROM decisions
               WHERE tenant = $1
                 AND ($2::bigint IS NULL AND $3::uuid IS NULL AND $4::text IS NULL)
                 AND ($5::text IS NULL OR agent = $5)
                 AND ($6::text IS NULL OR tool = $6)
                 AND ($7::text IS NULL OR decided_by = $7)
               ORDER BY at_ms DESC, session_id DESC, call_id DESC
               LIMIT $8"#
        };
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            let statement = client.prepare_cached(sql).await.map_err(map_pg)?;
            self.trip();
            client
                .query(
                    &statement,
                    &[
                        &tenant,
                        &at,
                        &session,
                        &call,
                        &query.agent,
                        &query.tool,
                        &query.by,
                        &signed(limit as u64 + 1),
                    ],
                )
                .await
                .map_err(map_pg)
        })
        .await?;
        let mut page = Vec::with_capacity(rows.len().min(limit));
        for r in rows.iter().take(limit) {
            let text: &str = r.get(0);
            let row: DecisionRow = serde_json::from_str(text)
                .map_err(|e| corrupt("decisions", format!("unreadable row: {e}")))?;
            page.push(row);
        }
        let next = if rows.len() > limit {
            page.last().map(DecisionRow::position)
        } else {
            None
        };
        Ok(DecisionPage { rows: page, next })
    }

    pub(super) async fn read_entries(
        &self,
        id: SessionId,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<Arc<TranscriptEntry>>, StoreError> {
        if range.start >= range.end {
            return Ok(Vec::new());
        }
        let (from, to) = (signed(range.start), signed(range.end));
        let rows = retrying(READ_RETRY, || async {
            let client = self.client().await?;
            let statement = client
                .prepare_cached(
                    "SELECT c.record,
                            ARRAY(SELECT b.hash FROM blobs b WHERE b.hash = ANY(c.blobs)
                                  ORDER BY b.hash),
                            ARRAY(SELECT b.data FROM blobs b WHERE b.hash = ANY(c.blobs)
                                  ORDER BY b.hash)
                     FROM checkpoints c
                     WHERE c.session_id = $1 AND c.first_entry IS NOT NULL
                       AND c.first_entry < $3 AND c.entries_end > $2
                     ORDER BY c.events_end, c.entries_end",
                )
                .await
                .map_err(map_pg)?;
            self.trip();
            client
                .query(&statement, &[&id.0, &from, &to])
                .await
                .map_err(map_pg)
        })
        .await?;
        let mut found: std::collections::BTreeMap<u64, Arc<TranscriptEntry>> = Default::default();
        for r in &rows {
            let bytes: &[u8] = r.get(0);
            let blobs = Blobs::new(r.get(1), r.get(2));
            for (idx, entry) in expand(&id, bytes, &blobs)?.entries {
                if range.contains(&idx) {
                    // A later checkpoint's copy of an entry wins.
                    found.insert(idx, entry);
                }
            }
        }
        Ok(found.into_values().collect())
    }
}

/// The blobs some records name, by hash.
struct Blobs(std::collections::HashMap<String, String>);

impl Blobs {
    fn new(hashes: Vec<String>, data: Vec<String>) -> Self {
        Self(hashes.into_iter().zip(data).collect())
    }
}

/// One stored record's entries and events, its large results read back
/// from `blobs`.
fn expand(id: &SessionId, bytes: &[u8], blobs: &Blobs) -> Result<record::Expanded, StoreError> {
    record::decode(id, bytes)?.expand(id, |hash| Ok(blobs.0.get(hash).map(String::as_bytes)))
}
