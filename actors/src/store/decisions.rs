//! The per-tenant decision index (the decision history of
//! `GET /v1/decisions`): one row per recorded decision, derived from a
//! checkpoint's `decision_recorded` events by the store in the same write
//! as the checkpoint, and paged newest first.
//!
//! This module owns the index's contract, which every store keeps and a
//! storage-format rewrite must carry over:
//!
//! - **What a row is**: [`DecisionRow`], built only by [`decision_rows`]
//!   from the checkpoint that records the decision (never from memory, never
//!   later): who, when, the session (id, root, agent, its own title), the
//!   call and its tool, the kind of decision, the reason of a denial, the
//!   argument diff of an edit, and the sequence number of the event that
//!   recorded it.
//! - **When it exists**: a row is visible exactly when the checkpoint that
//!   carries its event is. A store writes it in the same atomic write as the
//!   checkpoint (memory, PostgreSQL), or, where a checkpoint is made atomic
//!   by its header (sled), before the header and trusted only when the
//!   session's committed log holds the very event (`seq`, call, time).
//! - **Order and position**: newest first by ([`DecisionRow::at_ms`],
//!   session id bytes, call id bytes), descending; a [`DecisionPosition`]
//!   names a row, and a page after it holds the rows strictly older.
//! - **Pages**: a page holds at most `limit` rows that match the query's
//!   filters (agent, tool and decider, each exact); it may hold fewer, even
//!   none, while [`DecisionPage::next`] is set (a store may bound the rows it
//!   examines per page); only `next: None` says the listing is over.
//! - **Tenants**: a query names its tenant; rows of other tenants are never
//!   answered, whatever the cursor.
//! - **Purge**: purging a session removes its rows with it.
//!
//! It deliberately knows no storage: keys and tables are the stores'.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Checkpoint;
use crate::model::{
    Decision, DecisionRecord, EventKind, SessionId, ToolCallId, ToolCallRecord, TranscriptEntry,
};

/// What kind of decision a row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// A person approved the call as proposed.
    Approve,
    /// A person approved the call with edited arguments (see `args_diff`).
    ApproveWithEdit,
    /// A person denied the call.
    Deny,
    /// Nobody decided before the deadline: denied by the system.
    Timeout,
    /// The session's standing rule for the tool answered (see `approved`).
    Rule,
}

impl DecisionKind {
    /// The kind of `record`: a rule's by `rule:…`, a timeout's by `system`.
    pub fn of(record: &DecisionRecord) -> Self {
        let by = record.by.as_deref().unwrap_or("");
        match &record.decision {
            _ if by.starts_with("rule:") => Self::Rule,
            Decision::Deny { .. } if by == "system" => Self::Timeout,
            Decision::Deny { .. } => Self::Deny,
            d if d.edits() => Self::ApproveWithEdit,
            Decision::Approve { .. } => Self::Approve,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::ApproveWithEdit => "approve_with_edit",
            Self::Deny => "deny",
            Self::Timeout => "timeout",
            Self::Rule => "rule",
        }
    }
}

/// One recorded decision as the index keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRow {
    /// The session's tenant.
    pub tenant: String,
    /// When the decision was accepted, ms since the epoch.
    pub at_ms: i64,
    /// The session that owns the call.
    pub session_id: SessionId,
    /// The root of its tree.
    pub root_session_id: SessionId,
    /// The session's agent.
    pub agent: String,
    /// The session's own title (a child usually has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The call.
    pub call_id: ToolCallId,
    /// Its tool.
    pub tool: String,
    /// What was decided.
    pub decision: DecisionKind,
    /// Whether the call was allowed to run.
    pub approved: bool,
    /// Who decided (a token's subject, `system`, `rule:allow|reject`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// A denial's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// An edit's argument diff (as in the decision record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_diff: Option<Value>,
    /// The sequence number of the `decision_recorded` event in the
    /// session's log.
    pub seq: u64,
}

impl DecisionRow {
    /// This row's place in the order.
    pub fn position(&self) -> DecisionPosition {
        DecisionPosition {
            at_ms: self.at_ms,
            session_id: self.session_id,
            call_id: self.call_id.clone(),
        }
    }
}

/// A row's place in the index's order (newest first): the cursor of a page.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DecisionPosition {
    /// The row's time.
    pub at_ms: i64,
    /// Its session.
    pub session_id: SessionId,
    /// Its call.
    pub call_id: ToolCallId,
}

impl DecisionPosition {
    /// A compact, opaque text form (hex of time ‖ session ‖ call), for
    /// cursors that travel through URLs.
    pub fn encode(&self) -> String {
        let mut bytes = Vec::with_capacity(24 + self.call_id.0.len());
        bytes.extend_from_slice(&order_bits(self.at_ms).to_be_bytes());
        bytes.extend_from_slice(self.session_id.0.as_bytes());
        bytes.extend_from_slice(self.call_id.0.as_bytes());
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The inverse of [`DecisionPosition::encode`]; `None` for anything
    /// else.
    pub fn decode(text: &str) -> Option<Self> {
        if !text.len().is_multiple_of(2) || text.len() < 50 {
            return None;
        }
        let bytes = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        let time: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
        let session: [u8; 16] = bytes.get(8..24)?.try_into().ok()?;
        let call = std::str::from_utf8(bytes.get(24..)?).ok()?;
        if call.is_empty() {
            return None;
        }
        Some(Self {
            at_ms: from_order_bits(u64::from_be_bytes(time)),
            session_id: SessionId(uuid::Uuid::from_bytes(session)),
            call_id: ToolCallId(call.to_owned()),
        })
    }
}

/// `at_ms` as an unsigned number in the same order (the sign bit flipped),
/// for big-endian keys.
pub fn order_bits(at_ms: i64) -> u64 {
    (at_ms as u64) ^ (1 << 63)
}

fn from_order_bits(bits: u64) -> i64 {
    (bits ^ (1 << 63)) as i64
}

/// A page request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecisionQuery {
    /// Only rows older than this one (the previous page's `next`).
    pub before: Option<DecisionPosition>,
    /// Most rows in the page (at least 1).
    pub limit: usize,
    /// Only this agent's sessions.
    pub agent: Option<String>,
    /// Only calls of this tool.
    pub tool: Option<String>,
    /// Only decisions by this decider.
    pub by: Option<String>,
}

impl DecisionQuery {
    /// Whether `row` passes the filters (not the position).
    pub fn matches(&self, row: &DecisionRow) -> bool {
        self.agent.as_ref().is_none_or(|a| *a == row.agent)
            && self.tool.as_ref().is_none_or(|t| *t == row.tool)
            && self.by.as_ref().is_none_or(|b| Some(b) == row.by.as_ref())
    }

    /// Whether `position` comes after the cursor (is older).
    pub fn after_cursor(&self, position: &DecisionPosition) -> bool {
        self.before.as_ref().is_none_or(|b| position < b)
    }
}

/// A page of the index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecisionPage {
    /// Rows, newest first.
    pub rows: Vec<DecisionRow>,
    /// Where the next page starts, or `None` when there is no more.
    pub next: Option<DecisionPosition>,
}

/// The index rows a checkpoint carries: one per `decision_recorded` event,
/// with its call found in the header's open step or, when the decision
/// closed the step, in the checkpoint's new transcript entries.
pub fn decision_rows(cp: &Checkpoint) -> Vec<DecisionRow> {
    let h = &cp.header;
    let find = |id: &ToolCallId| -> Option<&ToolCallRecord> {
        h.open_calls.iter().find(|c| &c.id == id).or_else(|| {
            cp.entries.iter().find_map(|(_, e)| match e.as_ref() {
                TranscriptEntry::ToolResult { call } if &call.id == id => Some(call),
                _ => None,
            })
        })
    };
    cp.events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::DecisionRecorded { call_id, record } => {
                let (approved, reason) = match &record.decision {
                    Decision::Approve { .. } => (true, None),
                    Decision::Deny { message } => (false, message.clone()),
                };
                Some(DecisionRow {
                    tenant: h.tenant.clone(),
                    at_ms: record.at_ms,
                    session_id: h.id,
                    root_session_id: h.root_id,
                    agent: h.agent.clone(),
                    title: h.title.clone(),
                    call_id: call_id.clone(),
                    tool: find(call_id).map(|c| c.name.clone()).unwrap_or_default(),
                    decision: DecisionKind::of(record),
                    approved,
                    by: record.by.clone(),
                    reason,
                    args_diff: record.args_diff.clone(),
                    seq: event.seq,
                })
            }
            _ => None,
        })
        .collect()
}

/// Whether `event` is the one that recorded `row` (a store that writes rows
/// ahead of their commit record checks a row against the committed log).
pub fn recorded_by(row: &DecisionRow, event: &crate::model::Event) -> bool {
    event.seq == row.seq
        && matches!(&event.kind, EventKind::DecisionRecorded { call_id, record }
            if *call_id == row.call_id && record.at_ms == row.at_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_as_opaque_text_and_keep_their_order() {
        let a = DecisionPosition {
            at_ms: -5,
            session_id: SessionId::generate(),
            call_id: ToolCallId("call_1".into()),
        };
        let b = DecisionPosition {
            at_ms: 1_700_000_000_000,
            ..a.clone()
        };
        for p in [&a, &b] {
            assert_eq!(DecisionPosition::decode(&p.encode()).as_ref(), Some(p));
        }
        assert!(a < b);
        assert!(a.encode() < b.encode(), "text order is the order");
        for bad in [
            "",
            "zz",
            "00",
            &a.encode()[..48],
            &format!("{}g", a.encode()),
        ] {
            assert_eq!(DecisionPosition::decode(bad), None, "{bad}");
        }
    }
}
