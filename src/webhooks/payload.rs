//! The body of a webhook, as Standard Webhooks recommends it: `type`,
//! `timestamp` (when the event happened, RFC 3339) and `data`. For an
//! approval, `data.approval` is the card of `GET /v1/approvals`
//! ([`ApprovalItem`]: agent, title, session path, tool, arguments, deadline,
//! the model's text and the user's message that led to the call)
//! as the call was when the event happened; `approval.decided` adds the
//! decision (who, when, the argument diff). `data.links` point at the
//! inbox and at the session in the web page, under the configured public
//! address.
//!
//! Built at a delivery's first attempt, from the session as the store
//! holds it (the outbox row is only a reference: [`Seed`]): the event at
//! the row's sequence number (which must still be the one the row
//! describes), the call it names (among the header's open calls, else in
//! the tool result that closed it, else as the event proposed it), the
//! decision the event recorded. Kept with the delivery: every retry sends
//! the same bytes. It reads the store (the owner's header, its events and
//! last entries, the lineage of a subagent's call) but writes nothing.
//!
//! A session purged before its webhook was built leaves nothing to build
//! from: the delivery is dropped ([`Unbuildable::Gone`], counted by reason).

use std::collections::HashMap;

use overseer_actors::model::{
    DecisionRecord, Event, EventKind, SessionHeader, ToolCallId, ToolCallRecord, TranscriptEntry,
};
use overseer_actors::store::StoreError;
use overseer_actors::Overseer;
use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::{describes, EventType, Seed};
use crate::http::inbox::{lineage, ApprovalItem};

/// Transcript entries a build looks back through for the tool result that
/// closed a call (a call's result follows it within a turn).
const CALL_LOOKBACK: u64 = 64;
/// Events a build looks back through for the request of a decided call
/// whose result it did not find.
const EVENT_LOOKBACK: u64 = 256;

/// Why a body cannot be built.
#[derive(Debug)]
pub(super) enum Unbuildable {
    /// The session or its event is no longer stored (purged): there is
    /// nothing to send, ever. The reason, for the log and the metric label.
    Gone(&'static str),
    /// The store failed: tried again later.
    Store(StoreError),
}

impl From<StoreError> for Unbuildable {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// The body of `seed`'s webhook.
pub(super) async fn build(
    runtime: &Overseer,
    public_url: &str,
    seed: &Seed,
) -> Result<String, Unbuildable> {
    let Some(owner) = runtime.store().load_header(seed.session_id).await? else {
        return Err(Unbuildable::Gone("purged"));
    };
    let mut data = Map::new();
    data.insert("tenant".into(), json!(seed.tenant));
    data.insert("session_id".into(), json!(seed.session_id));
    data.insert("root_session_id".into(), json!(seed.root_session_id));
    data.insert("event_seq".into(), json!(seed.seq));
    match seed.event {
        EventType::ApprovalRequested | EventType::ApprovalDecided => {
            let event = event_of(runtime, seed).await?;
            let (call, decision) = call_of(runtime, &owner, seed, &event).await?;
            data.insert("call_id".into(), json!(seed.call_id));
            data.insert("approval".into(), card(runtime, &owner, &call).await);
            if let Some(decision) = decision {
                data.insert("decision".into(), json!(decision));
            }
        }
        EventType::SessionFinished | EventType::SessionFailed => {
            data.insert("status".into(), json!(seed.status));
            if let Some(reason) = seed.stop_reason {
                data.insert("stop_reason".into(), json!(reason));
            }
            let detail = seed
                .detail
                .clone()
                .or_else(|| owner.error.clone())
                .or_else(|| owner.completion_reason.clone());
            if let Some(detail) = detail {
                let key = if seed.event == EventType::SessionFailed {
                    "error"
                } else {
                    "reason"
                };
                data.insert(key.into(), json!(detail));
            }
        }
    }
    let base = public_url.trim_end_matches('/');
    if !base.is_empty() {
        data.insert(
            "links".into(),
            json!({
                "inbox": format!("{base}/#/inbox"),
                "session": format!("{base}/#/s/{}", seed.root_session_id),
            }),
        );
    }
    let timestamp = OffsetDateTime::from_unix_timestamp_nanos(i128::from(seed.at_ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok());
    Ok(json!({
        "type": seed.event.as_str(),
        "timestamp": timestamp,
        "data": data,
    })
    .to_string())
}

/// The stored event the seed refers to; gone if the session no longer has
/// it as the seed describes it.
async fn event_of(runtime: &Overseer, seed: &Seed) -> Result<Event, Unbuildable> {
    let events = runtime
        .store()
        .events_after(seed.session_id, seed.seq.saturating_sub(1), 1)
        .await?;
    match events.into_iter().next() {
        Some(event) if describes(seed, &event) => Ok(event),
        _ => Err(Unbuildable::Gone("event_gone")),
    }
}

/// The call of an approval event as it was at the event, and the decision
/// the event recorded (`approval.decided`).
async fn call_of(
    runtime: &Overseer,
    owner: &SessionHeader,
    seed: &Seed,
    event: &Event,
) -> Result<(ToolCallRecord, Option<DecisionRecord>), Unbuildable> {
    let (call_id, proposed, decision) = match &event.kind {
        EventKind::ApprovalRequested {
            call_id,
            name,
            arguments,
            outcome_unknown,
        } => (call_id, Some((name, arguments, *outcome_unknown)), None),
        EventKind::DecisionRecorded { call_id, record } => (call_id, None, Some(record.clone())),
        _ => return Err(Unbuildable::Gone("event_gone")),
    };
    let decision = seed.decision.clone().or(decision);
    // A row written before rows became references carries its call.
    if let Some(call) = &seed.call {
        return Ok((call.clone(), decision));
    }
    let mut call = match owner.open_calls.iter().find(|c| c.id == *call_id) {
        Some(call) => Some(call.clone()),
        None => closed_call(runtime, owner, call_id).await?,
    };
    if let Some((name, arguments, outcome_unknown)) = proposed {
        // As it was asked for: the arguments proposed, before any edit.
        let mut asked = call.take().unwrap_or_else(|| {
            ToolCallRecord::proposed(
                call_id.clone(),
                name.clone(),
                arguments.clone(),
                event.at_ms,
            )
        });
        asked.arguments = arguments.clone();
        asked.effective_arguments = None;
        asked.decision = None;
        asked.outcome_unknown = outcome_unknown;
        call = Some(asked);
    }
    if let Some(call) = call {
        return Ok((call, decision));
    }
    // Decided, and its result no longer among the last entries: the call as
    // the event that asked for it proposed it, the decision beside it.
    let events = runtime
        .store()
        .events_after(
            seed.session_id,
            seed.seq.saturating_sub(EVENT_LOOKBACK + 1),
            usize::try_from(EVENT_LOOKBACK).unwrap_or(usize::MAX),
        )
        .await?;
    let asked = events.iter().rev().find_map(|e| match &e.kind {
        EventKind::ApprovalRequested {
            call_id: id,
            name,
            arguments,
            outcome_unknown,
        } if id == call_id && e.seq < seed.seq => {
            let mut call =
                ToolCallRecord::proposed(id.clone(), name.clone(), arguments.clone(), e.at_ms);
            call.outcome_unknown = *outcome_unknown;
            Some(call)
        }
        _ => None,
    });
    let call = asked.unwrap_or_else(|| {
        ToolCallRecord::proposed(call_id.clone(), String::new(), Value::Null, event.at_ms)
    });
    Ok((call, decision))
}

/// The call `id` as the tool result that closed it records it, among the
/// owner's last [`CALL_LOOKBACK`] transcript entries.
async fn closed_call(
    runtime: &Overseer,
    owner: &SessionHeader,
    id: &ToolCallId,
) -> Result<Option<ToolCallRecord>, StoreError> {
    let end = owner.transcript_len;
    let start = end.saturating_sub(CALL_LOOKBACK);
    let entries = runtime.store().entries(owner.id, start..end).await?;
    Ok(entries.iter().rev().find_map(|e| match e.as_ref() {
        TranscriptEntry::ToolResult { call } if call.id == *id => Some(call.clone()),
        _ => None,
    }))
}

/// The inbox card of the call, with the owner's and its ancestors' headers
/// (which say who and where; they do not change).
async fn card(runtime: &Overseer, owner: &SessionHeader, call: &ToolCallRecord) -> Value {
    let chain = match lineage(runtime, &mut HashMap::new(), owner).await {
        Ok(chain) => chain,
        Err(_) => vec![owner.clone()],
    };
    let mut item = ApprovalItem::new(runtime, owner, call, &chain);
    // Why the model asks, as the inbox shows it; a card without it still
    // says what waits, so a failed read leaves `context` null.
    if item.load_context(runtime).await.is_err() {
        item.context = None;
    }
    serde_json::to_value(item).unwrap_or(Value::Null)
}
