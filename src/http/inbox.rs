//! `GET /v1/approvals`: every pending approval of the caller's tenant, newest
//! first, cursor-paginated, each as the card the approval inbox shows (agent,
//! session title, session path, tool name and description, arguments,
//! requested-at and deadline, and why it is asked: the model's text before
//! the call and the user message of its turn, bounded) and the `warnings`
//! of the rendering rule ([`crate::render`]) about its title, tool name,
//! description, arguments and context; the data itself stays raw.
//!
//! This module owns that shape ([`ApprovalItem`], also sent live by the
//! tenant event stream) and how it is read: from the headers of the sessions
//! waiting for approval, which hold every undecided call of their open step
//! (a pending approval is checkpointed before anyone hears of it, and a
//! decision before it is acknowledged, so the store is the authority). It
//! deliberately decides nothing: decisions go through the per-session route,
//! `POST /v1/sessions/{session_id}/approvals`, to the session that owns the
//! call.
//!
//! Scaling limit: the store has no per-tenant index of waiting sessions, so a
//! request reads the headers of every session of the node in
//! `awaiting_approval` (the store's index of active sessions, all tenants)
//! and filters them here. That is fine for thousands of waiting sessions; an
//! index by (tenant, status) in the `CheckpointStore` port would make it
//! proportional to the caller's own.

use std::collections::HashMap;

use axum::extract::State;
use axum::Json;
use overseer_actors::model::{
    CallState, SessionHeader, SessionId, SessionStatus, ToolCallRecord, TranscriptEntry,
};
use overseer_actors::store::{each_page_by_status, StoreError};
use overseer_actors::Overseer;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::extract::{ApiQuery, Authorized, Read};
use super::{ApiError, AppState};
use crate::render::{Warning, Warnings};

/// Default page size.
const DEFAULT_PAGE: usize = 50;
/// Largest page size.
const MAX_PAGE: usize = 200;
/// Deepest parent chain followed (trees are bounded far below this; the
/// bound only stops a corrupt, cyclic chain).
const MAX_LINEAGE: usize = 64;

/// One session on the way from a root to the session that owns a call.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PathStep {
    /// The session.
    pub session_id: SessionId,
    /// Its agent.
    pub agent: String,
}

/// A pending approval as the inbox shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ApprovalItem {
    /// The call.
    pub call_id: String,
    /// The session that owns the call: decide it at
    /// `POST /v1/sessions/{session_id}/approvals`.
    pub session_id: SessionId,
    /// The root of its tree (the session a person started).
    pub root_session_id: SessionId,
    /// Session ids from the root down to the owner (one id for a root's own call).
    pub session_path: Vec<SessionId>,
    /// The same path with each session's agent.
    pub path: Vec<PathStep>,
    /// The owner's agent.
    pub agent: String,
    /// The title of the root session, if it has one.
    pub title: Option<String>,
    /// Tool name.
    pub name: String,
    /// Tool description (empty when the tool is no longer configured).
    pub description: String,
    /// JSON Schema of the tool's arguments (`null` when unknown).
    pub parameters: Value,
    /// Arguments to approve: as proposed, or, for a call whose outcome is
    /// unknown after a crash, those it ran with.
    pub arguments: Value,
    /// The call ran when the process stopped and nobody knows whether it
    /// took effect: approving runs it again.
    pub outcome_unknown: bool,
    /// When the model proposed the call, ms since the epoch.
    pub proposed_at_ms: i64,
    /// When a decision was asked for, ms since the epoch.
    pub requested_at_ms: i64,
    /// When an undecided call is denied, ms since the epoch.
    pub approval_deadline_ms: Option<i64>,
    /// What a person should know before deciding: hidden or
    /// direction-changing characters and words that mix scripts, each at
    /// its field (`/title`, `/name`, `/description`, `/arguments/…`).
    pub warnings: Vec<Warning>,
    /// Why the call is asked: the model's text before it and the user
    /// message that started the turn, each bounded (see [`CallContext`]).
    /// Read from the transcript's last entries when the card is made for a
    /// list or a live event; absent when they could not be found.
    pub context: Option<CallContext>,
    /// The owner's transcript length when the card was made: where the
    /// context is looked for.
    #[serde(skip)]
    transcript_len: u64,
}

/// Most bytes of each text of a card's [`CallContext`]; longer texts are
/// cut at a character boundary and marked `truncated` (the whole text is
/// in the session's transcript).
pub const CONTEXT_TEXT_BYTES: usize = 4096;
/// Most transcript entries looked at, back from the end, for a card's
/// context.
const CONTEXT_MAX_ENTRIES: u64 = 128;

/// A text of a card's context, bounded.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BoundedText {
    /// At most [`CONTEXT_TEXT_BYTES`] bytes of it.
    pub text: String,
    /// Whether `text` is only its beginning.
    pub truncated: bool,
    /// The whole text's length in bytes.
    pub bytes: usize,
}

impl BoundedText {
    fn new(text: &str) -> Self {
        let mut end = text.len().min(CONTEXT_TEXT_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        Self {
            text: text[..end].to_owned(),
            truncated: end < text.len(),
            bytes: text.len(),
        }
    }
}

/// Why a call is asked, from the owner's transcript.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct CallContext {
    /// What the model said in the step that proposed the call (or, when
    /// that step has no text, the latest text of the turn before it).
    pub model_text: Option<BoundedText>,
    /// The user message that started the turn (a child's goal).
    pub user_message: Option<BoundedText>,
}

impl ApprovalItem {
    /// The item for `call` of `owner`, whose ancestors (root first) are
    /// `lineage` (ending with the owner itself).
    pub(crate) fn new(
        runtime: &Overseer,
        owner: &SessionHeader,
        call: &ToolCallRecord,
        lineage: &[SessionHeader],
    ) -> Self {
        let spec = runtime.tools().spec(&call.name);
        let root = lineage.first().unwrap_or(owner);
        let timeout_ms = (owner.config.approval_timeout_secs as i64).saturating_mul(1000);
        let description = spec.map(|s| s.description.clone()).unwrap_or_default();
        let arguments = call.run_arguments().clone();
        let mut warnings = Warnings::new();
        if let Some(title) = &root.title {
            warnings.text("/title", title);
        }
        warnings
            .text("/name", &call.name)
            .text("/description", &description)
            .json("/arguments", &arguments);
        Self {
            call_id: call.id.to_string(),
            session_id: owner.id,
            root_session_id: root.id,
            session_path: lineage.iter().map(|h| h.id).collect(),
            path: lineage
                .iter()
                .map(|h| PathStep {
                    session_id: h.id,
                    agent: h.agent.clone(),
                })
                .collect(),
            agent: owner.agent.clone(),
            title: root.title.clone(),
            name: call.name.clone(),
            description,
            parameters: spec.map(|s| s.parameters.clone()).unwrap_or(Value::Null),
            arguments,
            outcome_unknown: call.outcome_unknown,
            proposed_at_ms: call.proposed_at_ms,
            // The deadline is set when the decision is asked for, a timeout
            // later; a re-asked call (outcome unknown) gets a new one.
            requested_at_ms: call
                .approval_deadline_ms
                .map_or(call.proposed_at_ms, |d| d.saturating_sub(timeout_ms)),
            approval_deadline_ms: call.approval_deadline_ms,
            warnings: warnings.finish(),
            context: None,
            transcript_len: owner.transcript_len,
        }
    }

    /// Fills in [`ApprovalItem::context`] from the owner's transcript: a
    /// walk back from its end, a few entries at a time, to the assistant
    /// entry that proposed the call and on to the user message of its turn
    /// (at most [`CONTEXT_MAX_ENTRIES`] entries).
    pub(crate) async fn load_context(&mut self, runtime: &Overseer) -> Result<(), StoreError> {
        let floor = self.transcript_len.saturating_sub(CONTEXT_MAX_ENTRIES);
        let mut end = self.transcript_len;
        let mut window = 4;
        let mut context = CallContext::default();
        let mut found_call = false;
        while end > floor && context.user_message.is_none() {
            let start = end.saturating_sub(window).max(floor);
            let entries = runtime.store().entries(self.session_id, start..end).await?;
            for entry in entries.iter().rev() {
                match entry.as_ref() {
                    TranscriptEntry::Assistant {
                        text, tool_calls, ..
                    } => {
                        if !found_call {
                            found_call = tool_calls.iter().any(|c| c.id.as_str() == self.call_id);
                        }
                        if found_call && context.model_text.is_none() && !text.trim().is_empty() {
                            context.model_text = Some(BoundedText::new(text));
                        }
                    }
                    TranscriptEntry::User { text, .. } if found_call => {
                        context.user_message = Some(BoundedText::new(text));
                        break;
                    }
                    _ => {}
                }
            }
            end = start;
            window = (window * 4).min(32);
        }
        // The texts are shown like the rest of the card: with warnings.
        let mut warnings = Warnings::new();
        if let Some(t) = &context.model_text {
            warnings.text("/context/model_text/text", &t.text);
        }
        if let Some(t) = &context.user_message {
            warnings.text("/context/user_message/text", &t.text);
        }
        self.warnings.extend(warnings.finish());
        self.context = Some(context);
        Ok(())
    }

    /// Position in the inbox's order: newest request first, then by call id
    /// (time-ordered) descending.
    fn key(&self) -> (i64, &str) {
        (self.requested_at_ms, self.call_id.as_str())
    }
}

/// The calls of `header` waiting for a decision.
pub(crate) fn pending_calls(header: &SessionHeader) -> impl Iterator<Item = &ToolCallRecord> {
    header
        .open_calls
        .iter()
        .filter(|c| c.state == CallState::AwaitingApproval)
}

/// The headers from the root of `owner`'s tree down to `owner`. Parents are
/// looked up in `known` first, then in the store (and remembered there).
pub(crate) async fn lineage(
    runtime: &Overseer,
    known: &mut HashMap<SessionId, SessionHeader>,
    owner: &SessionHeader,
) -> Result<Vec<SessionHeader>, StoreError> {
    let mut chain = vec![owner.clone()];
    let mut next = owner.parent.as_ref().map(|p| p.session_id);
    while let Some(id) = next {
        if chain.len() >= MAX_LINEAGE {
            break;
        }
        let header = match known.get(&id) {
            Some(h) => h.clone(),
            None => match runtime.store().load_header(id).await? {
                Some(h) => {
                    known.insert(id, h.clone());
                    h
                }
                // A parent that is gone (purged): the path starts here.
                None => break,
            },
        };
        next = header.parent.as_ref().map(|p| p.session_id);
        chain.push(header);
    }
    chain.reverse();
    Ok(chain)
}

/// Headers the inbox reads at once.
const INBOX_PAGE: usize = 1024;

/// Every pending approval of `tenant`, in the inbox's order.
pub(crate) async fn tenant_approvals(
    runtime: &Overseer,
    tenant: &str,
) -> Result<Vec<ApprovalItem>, StoreError> {
    // Every tenant's waiting sessions go by, a page at a time; only this
    // tenant's stay.
    let mut known: HashMap<SessionId, SessionHeader> = HashMap::new();
    each_page_by_status(
        runtime.store().as_ref(),
        &[SessionStatus::AwaitingApproval],
        INBOX_PAGE,
        |page| {
            known.extend(
                page.into_iter()
                    .filter(|h| h.tenant == tenant)
                    .map(|h| (h.id, h)),
            );
        },
    )
    .await?;
    let owners: Vec<SessionHeader> = known
        .values()
        .filter(|h| pending_calls(h).next().is_some())
        .cloned()
        .collect();
    let mut items = Vec::new();
    for owner in owners {
        let chain = lineage(runtime, &mut known, &owner).await?;
        for call in pending_calls(&owner) {
            items.push(ApprovalItem::new(runtime, &owner, call, &chain));
        }
    }
    items.sort_by(|a, b| b.key().cmp(&a.key()));
    Ok(items)
}

/// A page of `GET /v1/approvals`, newest request first (described for the
/// OpenAPI document; the handler builds it as a JSON value).
#[derive(Serialize, utoipa::ToSchema)]
#[allow(dead_code)]
pub(super) struct ApprovalPage {
    approvals: Vec<ApprovalItem>,
    next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ApprovalsQuery {
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// A position in the inbox's order: `<requested_at_ms>.<call_id>` of the
/// last item of the previous page.
fn parse_cursor(raw: &str) -> Result<(i64, String), ApiError> {
    let invalid = || {
        ApiError::bad_request(
            "invalid_query",
            format!(
                "cursor: '{}' is not a cursor of this list; pass the next_cursor of a previous page",
                super::error::clip(raw)
            ),
        )
    };
    let (at, call) = raw.split_once('.').ok_or_else(invalid)?;
    let at = at.parse::<i64>().map_err(|_| invalid())?;
    if call.is_empty() {
        return Err(invalid());
    }
    Ok((at, call.to_owned()))
}

/// `GET /v1/approvals?cursor=&limit=`: `{approvals: [...], next_cursor}`.
#[utoipa::path(
    get, path = "/v1/approvals", tag = "tenant",
    params(ApprovalsQuery),
    responses(
        (status = 200, description = "The tenant's pending approvals, newest request first", body = ApprovalPage),
        (status = 400, description = "Invalid query", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn list(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Read>,
    ApiQuery(q): ApiQuery<ApprovalsQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit: must be between 1 and {MAX_PAGE}"),
        ));
    }
    let after = q.cursor.as_deref().map(parse_cursor).transpose()?;
    let all = tenant_approvals(state.overseer(), &principal.tenant).await?;
    let start = match &after {
        None => 0,
        Some((at, call)) => all
            .iter()
            .position(|i| i.key() < (*at, call.as_str()))
            .unwrap_or(all.len()),
    };
    let mut page: Vec<ApprovalItem> = all[start..].iter().take(limit).cloned().collect();
    // Only the page's cards: the context is a read of each owner's
    // transcript.
    let runtime = state.overseer();
    for item in &mut page {
        item.load_context(runtime).await?;
    }
    let next_cursor = match page.last() {
        Some(last) if start + page.len() < all.len() => {
            Some(format!("{}.{}", last.requested_at_ms, last.call_id))
        }
        _ => None,
    };
    Ok(Json(json!({"approvals": page, "next_cursor": next_cursor})))
}
