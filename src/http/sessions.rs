//! Handlers of the session resources: create, list, show, tree, messages,
//! approvals, standing tool rules, cancel, done, interrupt, model switch,
//! and the agent list.
//!
//! This module owns the JSON shapes of requests and responses and the order
//! of checks of every route: scope first, then tenant ownership (a session of
//! another tenant is answered exactly like a missing one), then the body's
//! meaning, then one call on the [`Overseer`](overseer_actors::Overseer).
//! It deliberately does not interpret session state beyond presenting it:
//! whether a message, decision or cancel is allowed is the session's call.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use overseer_actors::model::{
    Decision, SessionHeader, SessionId, SessionStatus, Submission, ToolCallId, ToolRule,
    TranscriptEntry,
};
use overseer_actors::store::StoredSession;
use overseer_actors::{CreateSession, SessionError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::extract::{ApiJson, ApiQuery, Approve, Authorized, NoParams, Read, SessionPath, Write};
use super::idempotency::{digest, Outcome};
use super::{ApiError, AppState};
use crate::auth::Principal;

/// Default page size of `GET /v1/sessions`.
const DEFAULT_PAGE: usize = 50;
/// Largest page size of `GET /v1/sessions`.
const MAX_PAGE: usize = 200;
/// Most stored rows one list request examines. With a selective filter a
/// page may come back short (even empty) with a `next_cursor`: the client
/// keeps paging, and no single request scans a whole tenant.
const MAX_SCAN: usize = 2_000;
/// Longest accepted `message_id` or `idempotency_key`.
const MAX_CLIENT_KEY: usize = 200;

/// A session as the API shows it: its header fields, its metadata and
/// queued messages, plus the transcript. (A list row is the header alone.)
#[derive(Serialize)]
struct SessionView<'a> {
    #[serde(flatten)]
    header: &'a SessionHeader,
    #[serde(skip_serializing_if = "Value::is_null")]
    metadata: &'a Value,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    inbox: &'a [overseer_actors::model::QueuedMessage],
    transcript: Vec<&'a TranscriptEntry>,
}

/// A session as `GET /v1/sessions/{id}` shows it. Responses serialize it
/// straight to their body: building a [`Value`] first cost as much again
/// as writing the bytes (`benches/PROFILE.md`, fifth pass).
fn session_view(stored: &StoredSession) -> SessionView<'_> {
    SessionView {
        header: &stored.header,
        metadata: &stored.metadata,
        inbox: &stored.inbox,
        transcript: stored.transcript.iter().map(|e| e.as_ref()).collect(),
    }
}

/// [`session_view`] as a value: what `overseer sessions show --data`
/// prints, the same document the API returns.
pub(crate) fn session_json(stored: &StoredSession) -> Value {
    to_json(&session_view(stored))
}

/// Serializes a domain value. These types serialize infallibly (string
/// keys, no custom serializers); the fallback only avoids a panic path.
fn to_json<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_else(|e| json!({"error": e.to_string()}))
}

/// The header of `id` if it exists and belongs to the caller's tenant; a
/// 404 otherwise, identical in both cases. Asked of the session's live
/// actor when it has one (a message, not a store read and a decode on the
/// blocking pool: every request about a session starts here).
pub(super) async fn owned_header(
    state: &AppState,
    principal: &Principal,
    id: SessionId,
) -> Result<SessionHeader, ApiError> {
    match state.overseer().header(id).await {
        Ok(h) if h.tenant == principal.tenant => Ok(h),
        Ok(_) | Err(SessionError::NotFound(_)) => Err(ApiError::session_not_found(id)),
        Err(e) => Err(e.into()),
    }
}

/// The state of `id` if it belongs to the caller's tenant.
async fn owned_state(
    state: &AppState,
    principal: &Principal,
    id: SessionId,
) -> Result<StoredSession, ApiError> {
    match state.overseer().state(id).await {
        Ok(s) if s.header.tenant == principal.tenant => Ok(s),
        Ok(_) | Err(SessionError::NotFound(_)) => Err(ApiError::session_not_found(id)),
        Err(e) => Err(e.into()),
    }
}

// ---- create -----------------------------------------------------------------

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = SessionCreate)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateBody {
    agent: String,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    /// Makes the create idempotent (1 to 200 bytes, no control characters).
    #[serde(default)]
    idempotency_key: Option<String>,
    /// Refused with a pointer to `idempotency_key`: the server chooses ids.
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    auto_complete: bool,
    /// Appended to the agent's instructions, on a new line.
    #[serde(default)]
    instructions: Option<String>,
    /// A subset of the agent's tools.
    #[serde(default)]
    tools: Option<Vec<String>>,
    /// One of the configured model routes.
    #[serde(default)]
    model: Option<String>,
    /// A lower step limit.
    #[serde(default)]
    max_steps: Option<u32>,
    /// A shorter approval timeout.
    #[serde(default)]
    approval_timeout_secs: Option<u64>,
    /// Tighter spending limits.
    #[serde(default)]
    budget: Option<overseer_actors::model::Budget>,
    /// A JSON Schema each answer must match (in place of the agent's).
    #[serde(default)]
    output_schema: Option<Value>,
}

/// The caller's W3C `traceparent`, if well-formed: the session's turn
/// becomes a child of its span. A malformed one is ignored, as the Trace
/// Context recommendation requires (the turn starts a trace of its own).
fn traceparent(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?.trim();
    overseer_actors::model::is_traceparent(value).then(|| value.to_owned())
}

/// `POST /v1/sessions` → 201 with the session. With an `idempotency_key`
/// the request is idempotent: the same request again answers 201 with the
/// same session and has no second effect; a different request under the same
/// key is a 409. The session's id is derived from the caller's tenant and the
/// key ([`keyed_session_id`]), so two tenants using the same key get two
/// sessions, and no key of one tenant can reach, or reveal, another's.
#[utoipa::path(
    post, path = "/v1/sessions", tag = "sessions",
    request_body = CreateBody,
    responses(
        (status = 201, description = "The session (with `Location`); an idempotent retry answers the same", body = crate::http::openapi::schemas::Session),
        (status = 400, description = "Invalid body: unknown agent, model route or field, a bad key", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "`idempotency_key` was used for a different request", body = crate::http::openapi::schemas::ErrorBody),
        (status = 429, description = "The tenant's session quota is full (`Retry-After`)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:write"]))
)]
pub(super) async fn create(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Authorized(principal, _): Authorized<Write>,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Response, ApiError> {
    if body.id.is_some() {
        return Err(ApiError::bad_request(
            "invalid_body",
            "id: session ids are chosen by the server; send idempotency_key to make the create idempotent",
        ));
    }
    let keyed_id = match &body.idempotency_key {
        None => None,
        Some(key) => {
            check_client_key("idempotency_key", key)?;
            Some(keyed_session_id(&principal.tenant, key))
        }
    };
    let create_digest = keyed_id.map(|_| create_digest(&body));
    let metadata = body
        .metadata
        .clone()
        .map(Value::Object)
        .unwrap_or(Value::Null);
    if let Some(model) = &body.model {
        check_route(&state, model)?;
    }
    let overrides = overseer_actors::SessionOverrides {
        instructions: body.instructions.clone(),
        tools: body.tools.clone(),
        model: body.model.clone(),
        max_steps: body.max_steps,
        approval_timeout_secs: body.approval_timeout_secs,
        budget: body.budget,
        output_schema: body.output_schema.clone(),
    };
    let request = CreateSession {
        agent: body.agent.clone(),
        tenant: principal.tenant.clone(),
        created_by: Some(principal.sub.clone()),
        prompt: body.prompt.clone(),
        title: body.title.clone(),
        metadata: metadata.clone(),
        id: keyed_id,
        auto_complete: body.auto_complete,
        overrides,
        // An HTTP client has no tools of its own to give a session.
        session_tools: Vec::new(),
        create_digest: create_digest.clone(),
        trace_parent: traceparent(&headers),
    };
    let overseer = state.overseer();
    let id = match keyed_id {
        None => overseer.create_session(request).await?,
        Some(id) => {
            // Concurrent retries wait for the first attempt instead of racing
            // it into the store. The store is the durable record: a retry
            // finds the session there and is compared with it below.
            let run = state
                .creates()
                .run(id, b"", || async move {
                    match overseer.create_session(request).await {
                        Ok(_) | Err(SessionError::AlreadyExists(_)) => Ok(()),
                        Err(e) => Err(e),
                    }
                })
                .await;
            match run {
                Outcome::Done | Outcome::Mismatch => {}
                Outcome::Failed(e) => return Err(e.into()),
            }
            id
        }
    };
    let stored = overseer.state(id).await?;
    if let Some(digest) = &create_digest {
        let same = match &stored.header.create_digest {
            Some(recorded) => recorded == digest,
            // Created before the digest was recorded (issue 32).
            None => same_create(&stored, &principal, &body, &metadata),
        };
        if !same {
            return Err(ApiError::conflict(
                "already_exists",
                "idempotency_key was already used for a different request",
            ));
        }
    }
    let mut response = (StatusCode::CREATED, Json(session_view(&stored))).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/sessions/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// The id of the session a tenant's `idempotency_key` names: a name-based
/// UUID (version 8, from SHA-256, as RFC 9562 suggests for name-based ids
/// with a modern hash) of the tenant and the key. The same tenant and key
/// always give the same id; different tenants never share one, so a create
/// cannot collide with, or detect, another tenant's session. (Server-chosen
/// ids are version 7, so they never meet a derived one either.)
pub(crate) fn keyed_session_id(tenant: &str, key: &str) -> SessionId {
    let d = digest(&[
        b"overseer session idempotency key v1",
        tenant.as_bytes(),
        key.as_bytes(),
    ]);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&d[..16]);
    SessionId(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

/// Refuses a model route that is not configured, naming it and the ones
/// that are.
fn check_route(state: &AppState, model: &str) -> Result<(), ApiError> {
    let routes = state.model_routes();
    if routes.contains(&model) {
        return Ok(());
    }
    Err(ApiError::bad_request(
        "invalid_body",
        format!(
            "model: '{}' is not a configured model route (configured: {})",
            super::error::clip(model),
            routes.join(", ")
        ),
    ))
}

/// Checks a client-chosen key (`idempotency_key`, `message_id`): 1 to
/// [`MAX_CLIENT_KEY`] bytes and no control characters, so that it can be
/// logged and echoed safely.
fn check_client_key(field: &str, key: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_CLIENT_KEY {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("{field}: must be 1 to {MAX_CLIENT_KEY} bytes"),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("{field}: must not contain control characters"),
        ));
    }
    Ok(())
}

/// What a keyed create records to tell a retry from a different request:
/// the SHA-256 (hex) of every field of the request but the key itself, as
/// canonical JSON (object keys sorted at every depth, so the order a client
/// writes them in does not matter; values compared as JSON, so `1` and
/// `1.0` differ as they would in the stored session).
fn create_digest(body: &CreateBody) -> String {
    let request = json!({
        "agent": body.agent,
        "prompt": body.prompt,
        "title": body.title,
        "metadata": body.metadata,
        "auto_complete": body.auto_complete,
        "instructions": body.instructions,
        "tools": body.tools,
        "model": body.model,
        "max_steps": body.max_steps,
        "approval_timeout_secs": body.approval_timeout_secs,
        "budget": body.budget,
        "output_schema": body.output_schema,
    });
    let mut canonical = Vec::new();
    write_canonical(&request, &mut canonical);
    let d = digest(&[b"overseer create request v1", &canonical]);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// `value` as JSON with the keys of every object in sorted order.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (n, key) in keys.into_iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::String(key.clone()).to_string().as_bytes());
                out.push(b':');
                write_canonical(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

/// Whether a stored session is what `body` would have created, so a retry
/// can be answered as the original was. For sessions created before the
/// request's digest was recorded ([`create_digest`]).
fn same_create(stored: &StoredSession, p: &Principal, body: &CreateBody, metadata: &Value) -> bool {
    let h = &stored.header;
    // A prompt given at creation is the first user entry, stamped with the
    // creation time; a later message has a later stamp.
    let prompt = stored.transcript.first().and_then(|e| match e.as_ref() {
        TranscriptEntry::User { text, at_ms } if *at_ms == h.created_at_ms => Some(text.as_str()),
        _ => None,
    });
    h.tenant == p.tenant
        && h.agent == body.agent
        && h.title == body.title
        && &stored.metadata == metadata
        && h.auto_complete == body.auto_complete
        && prompt == body.prompt.as_deref()
}

// ---- list -------------------------------------------------------------------

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    #[serde(default)]
    status: Option<SessionStatus>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    cursor: Option<SessionId>,
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET /v1/sessions?status=&agent=&cursor=&limit=`: the caller's tenant's
/// sessions, ascending by id, `{sessions, next_cursor}`.
#[utoipa::path(
    get, path = "/v1/sessions", tag = "sessions",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of session headers", body = crate::http::openapi::schemas::SessionPage),
        (status = 400, description = "Invalid query", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn list(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Read>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit: must be between 1 and {MAX_PAGE}"),
        ));
    }
    let store = state.overseer().store();
    let mut sessions = Vec::new();
    let mut after = q.cursor;
    let mut scanned = 0;
    let mut next_cursor = None;
    'scan: loop {
        // Fetch more than a page when filtering, but never past the scan cap.
        let want = (limit * 2).clamp(50, 500).min(MAX_SCAN - scanned);
        let batch = store.list_tenant(&principal.tenant, after, want).await?;
        let exhausted = batch.len() < want;
        for h in batch {
            scanned += 1;
            after = Some(h.id);
            let keep = q.status.is_none_or(|s| s == h.status)
                && q.agent.as_deref().is_none_or(|a| a == h.agent);
            if keep {
                sessions.push(h);
                if sessions.len() == limit {
                    next_cursor = after;
                    break 'scan;
                }
            }
        }
        if exhausted {
            break;
        }
        if scanned >= MAX_SCAN {
            next_cursor = after;
            break;
        }
    }
    Ok(Json(
        json!({"sessions": sessions, "next_cursor": next_cursor}),
    ))
}

// ---- show, tree ---------------------------------------------------------------

/// `GET /v1/sessions/{id}`.
#[utoipa::path(
    get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    responses(
        (status = 200, description = "The session with its transcript", body = crate::http::openapi::schemas::Session),
        (status = 400, description = "The path's id is not a UUID", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn show(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Read>,
    SessionPath(id): SessionPath,
) -> Result<Response, ApiError> {
    let stored = owned_state(&state, &principal, id).await?;
    Ok(Json(session_view(&stored)).into_response())
}

/// `GET /v1/sessions/{id}/tree`: the session and its subtree: each
/// node's agent, status, stop reason, own and rolled-up usage, pending
/// approvals and children.
#[utoipa::path(
    get, path = "/v1/sessions/{id}/tree", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    responses(
        (status = 200, description = "The session and its subtree", body = crate::http::openapi::schemas::Tree),
        (status = 400, description = "The path's id is not a UUID", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn tree(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Read>,
    SessionPath(id): SessionPath,
) -> Result<Json<Value>, ApiError> {
    owned_header(&state, &principal, id).await?;
    let tree = state.overseer().tree(id).await?;
    Ok(Json(to_json(&tree)))
}

// ---- messages -----------------------------------------------------------------

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MessageBody {
    text: String,
    #[serde(default)]
    message_id: Option<String>,
}

/// `POST /v1/sessions/{id}/messages` → 202 once the message is checkpointed
/// (it starts a turn now, or queues behind the running one). A repeated
/// `message_id` with the same text is accepted once and answered the same.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/messages", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    request_body = MessageBody,
    responses(
        (status = 202, description = "Checkpointed: it starts a turn or queues behind the running one", body = crate::http::openapi::schemas::MessageAccepted),
        (status = 400, description = "Invalid body or id", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "The session is terminal, or `message_id` was used with another text", body = crate::http::openapi::schemas::ErrorBody),
        (status = 429, description = "The session's queue is full (`Retry-After`)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:write"]))
)]
pub(super) async fn message(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Authorized(principal, _): Authorized<Write>,
    SessionPath(id): SessionPath,
    ApiJson(body): ApiJson<MessageBody>,
) -> Result<Response, ApiError> {
    owned_header(&state, &principal, id).await?;
    let overseer = state.overseer();
    let trace = traceparent(&headers);
    match &body.message_id {
        None => {
            overseer
                .send_message_traced(id, body.text, None, trace)
                .await?
        }
        Some(mid) => {
            check_client_key("message_id", mid)?;
            let text = body.text.clone();
            let key = (id, digest(&[mid.as_bytes()]));
            let run = state
                .messages()
                .run(key, body.text.as_bytes(), || {
                    // Recorded by the session too, so a retry after a
                    // restart is still recognised.
                    overseer.send_message_traced(id, text, Some(mid.clone()), trace.clone())
                })
                .await;
            match run {
                Outcome::Done => {}
                Outcome::Mismatch => {
                    return Err(ApiError::conflict(
                        "message_id_reused",
                        format!(
                            "message_id '{}' was already used with a different text",
                            super::error::clip(mid)
                        ),
                    ))
                }
                Outcome::Failed(e) => return Err(e.into()),
            }
        }
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"session_id": id, "message_id": body.message_id})),
    )
        .into_response())
}

// ---- approvals ------------------------------------------------------------------

/// Every call decidable at `id` (its own, and those of descendants whose
/// requests propagate to it), each with the path of sessions that leads to
/// it: `{session_id, status, pending: [...]}`.
async fn pending_response(state: &AppState, header: SessionHeader) -> Result<Response, ApiError> {
    let (session_id, status) = (header.id, header.status);
    let pending = state.overseer().pending_approvals_in(header).await?;
    let view = PendingView {
        session_id,
        status,
        pending: pending
            .iter()
            .map(|p| PendingCall {
                call_id: &p.call.id,
                session_id: p.session_id,
                session_path: &p.path,
                name: &p.call.name,
                arguments: &p.call.arguments,
                outcome_unknown: p.call.outcome_unknown,
                proposed_at_ms: p.call.proposed_at_ms,
                approval_deadline_ms: p.call.approval_deadline_ms,
                warnings: crate::render::call_warnings(&p.call.name, &p.call.arguments),
            })
            .collect(),
    };
    Ok(Json(view).into_response())
}

/// The answer of `GET` and `POST /v1/sessions/{id}/approvals`, serialized
/// straight to the body (see [`session_view`]).
#[derive(Serialize)]
struct PendingView<'a> {
    session_id: SessionId,
    status: SessionStatus,
    pending: Vec<PendingCall<'a>>,
}

/// One call waiting for a decision, as the API shows it.
#[derive(Serialize)]
struct PendingCall<'a> {
    call_id: &'a ToolCallId,
    session_id: SessionId,
    session_path: &'a [SessionId],
    name: &'a str,
    arguments: &'a Value,
    outcome_unknown: bool,
    proposed_at_ms: i64,
    approval_deadline_ms: Option<i64>,
    /// The rendering rule's warnings about `name` and `arguments`
    /// (`crate::render`); the data itself stays raw.
    warnings: Vec<crate::render::Warning>,
}

/// `GET /v1/sessions/{id}/approvals`.
#[utoipa::path(
    get, path = "/v1/sessions/{id}/approvals", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    responses(
        (status = 200, description = "The calls decidable at this session", body = crate::http::openapi::schemas::PendingApprovals),
        (status = 400, description = "The path's id is not a UUID", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn pending(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Read>,
    SessionPath(id): SessionPath,
) -> Result<Response, ApiError> {
    let header = owned_header(&state, &principal, id).await?;
    pending_response(&state, header).await
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DecideBody {
    decisions: BTreeMap<ToolCallId, Decision>,
    #[serde(default)]
    metadata: BTreeMap<ToolCallId, Value>,
    /// Accepted for clients that send the full decision shape, but an
    /// authenticated caller's identity always comes from the token.
    #[serde(default)]
    approved_by: Option<String>,
}

/// `POST /v1/sessions/{id}/approvals` with `{decisions, metadata?}` → 200
/// with the remaining pending calls, once the decisions are checkpointed.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/approvals", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    request_body = DecideBody,
    responses(
        (status = 200, description = "Decisions checkpointed; the calls still pending", body = crate::http::openapi::schemas::PendingApprovals),
        (status = 400, description = "Invalid body: unknown call ids, stray metadata, an override the tool's schema refuses", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "A call was already decided, or the session is terminal", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["approvals:write"]))
)]
pub(super) async fn decide(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Approve>,
    SessionPath(id): SessionPath,
    ApiJson(body): ApiJson<DecideBody>,
) -> Result<Response, ApiError> {
    owned_header(&state, &principal, id).await?;
    let approved_by = match body.approved_by {
        Some(claimed) if principal.authenticated && claimed != principal.sub => {
            return Err(ApiError::bad_request(
                "invalid_body",
                format!(
                    "approved_by: '{}' differs from the token's subject '{}'; omit it, it is taken from the token",
                    super::error::clip(&claimed),
                    principal.sub
                ),
            ))
        }
        // Without auth there is no token to contradict the body.
        Some(claimed) if !principal.authenticated && !claimed.is_empty() => claimed,
        _ => principal.sub.clone(),
    };
    let submission = Submission {
        decisions: body.decisions,
        metadata: body.metadata,
        approved_by: Some(approved_by),
    };
    state.overseer().submit(id, submission).await?;
    let header = owned_header(&state, &principal, id).await?;
    pending_response(&state, header).await
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleBody {
    tool: String,
    rule: ToolRule,
}

/// `POST /v1/sessions/{id}/rules` `{tool, rule: "allow"|"reject"}` → 200
/// with the session's header: the session's later calls of that tool are
/// approved or denied without asking (an editor's allow-always or
/// reject-always). Recorded in the transcript as set by the token's
/// subject, and kept across restarts. A tool the session does not have is a
/// 400 naming it. Deciding for later calls is deciding approvals, hence the
/// scope `approvals:write`.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/rules", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    request_body = RuleBody,
    responses(
        (status = 200, description = "The session's header", body = overseer_actors::model::SessionHeader),
        (status = 400, description = "Invalid body, or a tool the session does not have", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "The session's state forbids it (terminal, busy, already decided, key reused)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["approvals:write"]))
)]
pub(super) async fn set_rule(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Approve>,
    SessionPath(id): SessionPath,
    ApiJson(body): ApiJson<RuleBody>,
) -> Result<Json<Value>, ApiError> {
    owned_header(&state, &principal, id).await?;
    state
        .overseer()
        .set_tool_rule(id, &body.tool, body.rule, Some(principal.sub.clone()))
        .await?;
    header_json(&state, &principal, id).await
}

// ---- cancel, done -------------------------------------------------------------------

/// `POST /v1/sessions/{id}/cancel` → 200 with the session's header (as in
/// the list; the transcript is `GET /v1/sessions/{id}`'s, so that acting on a
/// long session does not ship its whole history back).
#[utoipa::path(
    post, path = "/v1/sessions/{id}/cancel", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    responses(
        (status = 200, description = "The session's header", body = overseer_actors::model::SessionHeader),
        (status = 400, description = "A body with parameters, or a bad id", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "The session's state forbids it (terminal, busy, already decided, key reused)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:write"]))
)]
pub(super) async fn cancel(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Write>,
    SessionPath(id): SessionPath,
    _: NoParams,
) -> Result<Json<Value>, ApiError> {
    owned_header(&state, &principal, id).await?;
    state.overseer().cancel(id).await?;
    header_json(&state, &principal, id).await
}

/// `POST /v1/sessions/{id}/done` → 200 with the session's header.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/done", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    responses(
        (status = 200, description = "The session's header", body = overseer_actors::model::SessionHeader),
        (status = 400, description = "A body with parameters, or a bad id", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "The session's state forbids it (terminal, busy, already decided, key reused)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:write"]))
)]
pub(super) async fn done(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Write>,
    SessionPath(id): SessionPath,
    _: NoParams,
) -> Result<Json<Value>, ApiError> {
    owned_header(&state, &principal, id).await?;
    state.overseer().done(id).await?;
    header_json(&state, &principal, id).await
}

/// `POST /v1/sessions/{id}/interrupt` → 200 with the session's header: the
/// running turn stops (its stream, tools and children; pending approvals
/// closed), its partial text is kept, it ends with `interrupted`, and the
/// session waits for the next message. Without a running turn nothing
/// changes.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/interrupt", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    responses(
        (status = 200, description = "The session's header", body = overseer_actors::model::SessionHeader),
        (status = 400, description = "A body with parameters, or a bad id", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "The session's state forbids it (terminal, busy, already decided, key reused)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:write"]))
)]
pub(super) async fn interrupt(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Write>,
    SessionPath(id): SessionPath,
    _: NoParams,
) -> Result<Json<Value>, ApiError> {
    owned_header(&state, &principal, id).await?;
    state.overseer().interrupt(id).await?;
    header_json(&state, &principal, id).await
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ModelBody {
    model: String,
}

/// `POST /v1/sessions/{id}/model` `{model}` → 200 with the session's
/// header: its next turns are served by this configured model route
/// (recorded in the transcript). Only between turns: 409 `session_busy`
/// while one runs.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/model", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    request_body = ModelBody,
    responses(
        (status = 200, description = "The session's header", body = overseer_actors::model::SessionHeader),
        (status = 400, description = "Not a configured model route", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "A turn is running (`session_busy`), or the session is terminal", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:write"]))
)]
pub(super) async fn set_model(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Write>,
    SessionPath(id): SessionPath,
    ApiJson(body): ApiJson<ModelBody>,
) -> Result<Json<Value>, ApiError> {
    owned_header(&state, &principal, id).await?;
    check_route(&state, &body.model)?;
    state.overseer().set_model(id, &body.model).await?;
    header_json(&state, &principal, id).await
}

pub(super) async fn header_json(
    state: &AppState,
    principal: &Principal,
    id: SessionId,
) -> Result<Json<Value>, ApiError> {
    let header = owned_state(state, principal, id).await?.header;
    Ok(Json(to_json(&header)))
}

// ---- agents ---------------------------------------------------------------------------

/// `GET /v1/agents`: the configured agents.
#[utoipa::path(
    get, path = "/v1/agents", tag = "sessions",
    responses(
        (status = 200, description = "The configured agents", body = crate::http::openapi::schemas::AgentList)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn agents(
    State(state): State<AppState>,
    Authorized(_, _): Authorized<Read>,
) -> Result<Json<Value>, ApiError> {
    let overseer = state.overseer();
    let registry = overseer.tools();
    // Each agent with the declarations of the tools in its scope (what the
    // model is told, and whether a call needs approval under `per_tool`:
    // the agent's own rule for the tool, else the tool's default).
    let agents: Vec<Value> = overseer
        .agents()
        .map(|a| {
            let effective = a.effective();
            let tools: Vec<Value> = effective
                .tools
                .iter()
                .map(|name| match registry.spec(name) {
                    Some(spec) => json!({
                        "name": spec.name,
                        "description": spec.description,
                        "parameters": spec.parameters,
                        "requires_approval": effective
                            .tool_approvals
                            .get(name)
                            .copied()
                            .unwrap_or(spec.requires_approval),
                        "timeout_secs": spec.timeout_secs,
                        "idempotent": spec.idempotent,
                    }),
                    None => json!({"name": name, "available": false}),
                })
                .collect();
            // Its skills by name and description (what its sessions'
            // prompts list), and whether only a person may activate each.
            let skills: Vec<Value> = a
                .skills
                .iter()
                .filter_map(|name| overseer.skills().get(name))
                .map(|s| {
                    json!({
                        "name": s.name,
                        "description": s.description,
                        "requires_trust": s.requires_trust,
                    })
                })
                .collect();
            let mut v = serde_json::to_value(a).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut v {
                m.insert("tool_specs".into(), Value::Array(tools));
                m.insert("skill_specs".into(), Value::Array(skills));
            }
            v
        })
        .collect();
    Ok(Json(json!({ "agents": agents })))
}
