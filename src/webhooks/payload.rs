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
//! Built once per delivery, at its first attempt, and kept: every retry
//! sends the same bytes. It reads the store (the owner's header, the
//! lineage of a subagent's call) but writes nothing.

use std::collections::HashMap;
use std::sync::Arc;

use overseer_actors::Runtime;
use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::{EventType, Seed};
use crate::http::inbox::{lineage, ApprovalItem};

/// The body of `seed`'s webhook.
pub(super) async fn build(runtime: &Arc<Runtime>, public_url: &str, seed: &Seed) -> String {
    let mut data = Map::new();
    data.insert("tenant".into(), json!(seed.tenant));
    data.insert("session_id".into(), json!(seed.session_id));
    data.insert("root_session_id".into(), json!(seed.root_session_id));
    data.insert("event_seq".into(), json!(seed.seq));
    match seed.event {
        EventType::ApprovalRequested | EventType::ApprovalDecided => {
            data.insert("call_id".into(), json!(seed.call_id));
            data.insert("approval".into(), card(runtime, seed).await);
            if let Some(decision) = &seed.decision {
                data.insert("decision".into(), json!(decision));
            }
        }
        EventType::SessionFinished | EventType::SessionFailed => {
            data.insert("status".into(), json!(seed.status));
            if let Some(reason) = seed.stop_reason {
                data.insert("stop_reason".into(), json!(reason));
            }
            if let Some(detail) = &seed.detail {
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
    json!({
        "type": seed.event.as_str(),
        "timestamp": timestamp,
        "data": data,
    })
    .to_string()
}

/// The inbox card of the seed's call, as it was at the event: the call the
/// checkpoint recorded, with the owner's and its ancestors' headers (which
/// say who and where; they do not change). `null` when the call or the
/// session is no longer known (purged).
async fn card(runtime: &Arc<Runtime>, seed: &Seed) -> Value {
    let Some(call) = &seed.call else {
        return Value::Null;
    };
    let Ok(Some(owner)) = runtime.store.load_header(seed.session_id).await else {
        return Value::Null;
    };
    let chain = match lineage(runtime, &mut HashMap::new(), &owner).await {
        Ok(chain) => chain,
        Err(_) => vec![owner.clone()],
    };
    let mut item = ApprovalItem::new(runtime, &owner, call, &chain);
    // Why the model asks, as the inbox shows it; a card without it still
    // says what waits, so a failed read leaves `context` null.
    if item.load_context(runtime).await.is_err() {
        item.context = None;
    }
    serde_json::to_value(item).unwrap_or(Value::Null)
}
