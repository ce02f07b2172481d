//! `GET /v1/decisions?cursor=&limit=&agent=&tool=&by=`: the caller's
//! tenant's decision history, newest first, from the store's decision index
//! (never from memory): who decided, when, which session (id, root, agent,
//! title), which call and tool, what was decided (approve,
//! approve_with_edit, deny, timeout, rule), a denial's reason and an edit's
//! argument diff.
//!
//! This module owns the wire shape ([`DecisionItem`]) and the cursor, an
//! opaque position in the index (its text form is the store port's
//! [`DecisionPosition::encode`]). It deliberately stores nothing: rows are
//! written by the store with the checkpoint that records each decision (the
//! contract is in `overseer_actors::store`), so a decision made anywhere
//! (this API, the CLI, the page, ACP, a timeout, a standing rule) is here
//! once it is durable, on every node of a cluster.
//!
//! A page may hold fewer rows than `limit` (even none) while `next_cursor`
//! is set: the store bounds the rows it examines per page, so a rare filter
//! is answered in steps. Only `next_cursor: null` ends the history.

use std::collections::HashMap;

use axum::extract::State;
use axum::Json;
use overseer_actors::model::SessionId;
use overseer_actors::store::{DecisionKind, DecisionPosition, DecisionQuery, DecisionRow};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::extract::{ApiQuery, Authorized, Read};
use super::{ApiError, AppState};

/// Default page size.
const DEFAULT_PAGE: usize = 50;
/// Largest page size.
const MAX_PAGE: usize = 200;

/// One decision as the history shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DecisionItem {
    /// When it was accepted, ms since the epoch.
    pub at_ms: i64,
    /// Who decided: a token's subject, `system` (a timeout), or
    /// `rule:allow|reject` (a standing rule).
    pub by: Option<String>,
    /// The session that owns the call.
    pub session_id: SessionId,
    /// The root of its tree.
    pub root_session_id: SessionId,
    /// The owning session's agent.
    pub agent: String,
    /// The session's title, or its root's when it has none of its own.
    pub title: Option<String>,
    /// The call.
    pub call_id: String,
    /// Its tool.
    pub tool: String,
    /// `approve`, `approve_with_edit`, `deny`, `timeout` or `rule`.
    pub decision: DecisionKind,
    /// Whether the call was allowed to run.
    pub approved: bool,
    /// A denial's reason.
    pub reason: Option<String>,
    /// An edit's diff: `{key: {"from", "to"}}`, `{key: {"from", "removed": true}}`.
    pub args_diff: Option<Value>,
}

/// A page of `GET /v1/decisions` (described for the OpenAPI document; the
/// handler builds it as a JSON value).
#[derive(Serialize, utoipa::ToSchema)]
#[allow(dead_code)]
pub(super) struct DecisionPage {
    decisions: Vec<DecisionItem>,
    next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct DecisionsQuery {
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    by: Option<String>,
}

/// A filter: an empty value is no filter (a form's empty field).
fn filter(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// `GET /v1/decisions` → `{decisions: [...], next_cursor}`.
#[utoipa::path(
    get, path = "/v1/decisions", tag = "tenant",
    params(DecisionsQuery),
    responses(
        (status = 200, description = "The tenant's decisions, newest first", body = DecisionPage),
        (status = 400, description = "Invalid query", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn list(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Read>,
    ApiQuery(q): ApiQuery<DecisionsQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit: must be between 1 and {MAX_PAGE}"),
        ));
    }
    let before = match q.cursor.as_deref() {
        None => None,
        Some(raw) => Some(DecisionPosition::decode(raw).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_query",
                format!(
                    "cursor: '{raw}' is not a cursor of this list; pass the next_cursor of a previous page"
                ),
            )
        })?),
    };
    let query = DecisionQuery {
        before,
        limit,
        agent: filter(q.agent),
        tool: filter(q.tool),
        by: filter(q.by),
    };
    let runtime = state.overseer();
    let page = runtime.store().decisions(&principal.tenant, &query).await?;
    // A child's decisions carry its root's title (the one a person gave).
    let mut roots: HashMap<SessionId, Option<String>> = HashMap::new();
    let mut items = Vec::with_capacity(page.rows.len());
    for row in page.rows {
        let title = match &row.title {
            Some(t) => Some(t.clone()),
            None if row.root_session_id != row.session_id => {
                match roots.get(&row.root_session_id) {
                    Some(t) => t.clone(),
                    None => {
                        let header = runtime.store().load_header(row.root_session_id).await?;
                        let title = header
                            .filter(|h| h.tenant == principal.tenant)
                            .and_then(|h| h.title);
                        roots.insert(row.root_session_id, title.clone());
                        title
                    }
                }
            }
            None => None,
        };
        items.push(item(row, title));
    }
    Ok(Json(json!({
        "decisions": items,
        "next_cursor": page.next.map(|p| p.encode()),
    })))
}

fn item(row: DecisionRow, title: Option<String>) -> DecisionItem {
    DecisionItem {
        at_ms: row.at_ms,
        by: row.by,
        session_id: row.session_id,
        root_session_id: row.root_session_id,
        agent: row.agent,
        title,
        call_id: row.call_id.0,
        tool: row.tool,
        decision: row.decision,
        approved: row.approved,
        reason: row.reason,
        args_diff: row.args_diff,
    }
}
