//! The one error type of the HTTP API and its wire shape,
//! `{"error": {"code", "message", "details"?}}`.
//!
//! This module owns the mapping from every refusal (session errors, auth
//! errors, extractor rejections) to exactly one status and one stable `code`.
//! It deliberately decides nothing about *when* to refuse: handlers and
//! extractors do that.
//!
//! Status rule (one rule, applied everywhere): any request whose body, query,
//! path or headers the server cannot accept as written is **400**, whether the
//! JSON is malformed, a field has the wrong type, a field is unknown, or the
//! values are well-typed but invalid (unknown agent, unknown call ids, an
//! override that fails the tool's schema). 422 is never used. The exceptions
//! are the statuses HTTP defines for a specific problem: 401 (no or bad
//! token), 403 (missing scope), 404 (unknown session, or another tenant's:
//! never 403, so existence does not leak), 409 (the request conflicts with
//! the session's state: terminal, busy, already decided, key reused), 408
//! (body not received in time), 413 (body over the limit), 414 (request
//! target too long), 415 (body without `Content-Type: application/json`),
//! 429 (a session's queue or a tenant's quota is full; with `Retry-After`),
//! 431 (request head too large), 503 (session or store unavailable, server
//! not ready or over its in-flight limit; always with `Retry-After`) and 500
//! (an internal failure: a corrupt record, a bug). A failure of the server's
//! own is never a 400. Messages of 5xx answers are stable sentences: the
//! underlying error (an I/O error, a path) is logged, never sent.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use overseer_actors::store::StoreError;
use overseer_actors::SessionError;
use serde_json::{json, Value};

use crate::auth::AuthError;

/// A refused request, ready to be sent.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Structured extras (e.g. the ids a submission got wrong).
    pub details: Option<Value>,
}

impl ApiError {
    /// An error with the given status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: None,
        }
    }

    /// A 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// A 409 with `code`.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// Adds structured details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The 404 for a session that does not exist *or belongs to another
    /// tenant*: the two must be indistinguishable.
    pub fn session_not_found(id: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("session {id} not found"),
        )
    }

    /// Maps a rejected JSON body. Axum's own messages already name the field
    /// and the problem (`decisions: invalid type: …`), so they are kept.
    pub fn from_json_rejection(rejection: JsonRejection) -> Self {
        match rejection {
            JsonRejection::JsonDataError(e) => {
                Self::bad_request("invalid_body", strip_prefix(&e.body_text()))
            }
            JsonRejection::JsonSyntaxError(e) => {
                Self::bad_request("malformed_json", strip_prefix(&e.body_text()))
            }
            JsonRejection::MissingJsonContentType(_) => Self::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "expected a JSON body with 'Content-Type: application/json'",
            ),
            JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Self::payload_too_large()
            }
            other => Self::bad_request("invalid_body", strip_prefix(&other.body_text())),
        }
    }

    /// Maps a rejected query string.
    pub fn from_query_rejection(rejection: QueryRejection) -> Self {
        Self::bad_request("invalid_query", strip_prefix(&rejection.body_text()))
    }

    /// Maps a rejected path.
    pub fn from_path_rejection(rejection: PathRejection) -> Self {
        Self::bad_request(
            "invalid_path",
            clip_quoted(&rejection.body_text(), &['`', '"']),
        )
    }

    /// The 503 of a request that needs the store while it cannot serve (a
    /// full disk, an unreachable database): it recovers on its own.
    pub fn store_unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the session store cannot serve right now (it recovers on its own); nothing was \
             changed, retry shortly",
        )
        .with_details(json!({"retry_after_secs": STORE_RETRY_AFTER_SECS}))
    }

    /// The 413 for a body over the limit.
    pub fn payload_too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "the request body exceeds the 1 MiB limit",
        )
    }
}

/// Most characters of a client's string echoed back in an error (an id, a
/// cursor, a key, a name): enough to recognise it, never the whole of a
/// 1 MiB field.
pub const ECHO_CHARS: usize = 200;

/// Most ids listed in one error (`unknown_calls` and the like).
const ECHO_IDS: usize = 50;

/// `s` as echoed in an error: cut to [`ECHO_CHARS`] characters, saying how
/// long it was.
pub(crate) fn clip(s: &str) -> String {
    let total = s.chars().count();
    if total <= ECHO_CHARS {
        return s.to_owned();
    }
    let kept: String = s.chars().take(ECHO_CHARS).collect();
    format!("{kept}… ({total} characters)")
}

/// `text` with every segment quoted by one of `quotes` (a value serde or a
/// message quotes: `` `x` ``, `"x"`, `'x'`) cut by [`clip`]. Quotes that do
/// not pair up leave the rest as it is.
fn clip_quoted(text: &str, quotes: &[char]) -> String {
    let mut text = text.to_owned();
    for &q in quotes {
        if !text.chars().any(|c| c == q) {
            continue;
        }
        let parts: Vec<&str> = text.split(q).collect();
        let last = parts.len() - 1;
        let mut out = String::with_capacity(text.len().min(4096));
        for (n, part) in parts.iter().enumerate() {
            if n > 0 {
                out.push(q);
            }
            // Odd parts sit between a pair of quotes (unless the last one
            // is unpaired).
            if n % 2 == 1 && !(n == last && last % 2 == 1) {
                out.push_str(&clip(part));
            } else {
                out.push_str(part);
            }
        }
        text = out;
    }
    text
}

/// Most characters of an error message: a last guard against an echo no
/// rule above caught.
const MAX_MESSAGE_CHARS: usize = 2_000;

/// Axum prefixes rejection texts with a generic sentence
/// ("Failed to deserialize the JSON body into the target type: "); the
/// specific part after it is what a client needs.
fn strip_prefix(text: &str) -> String {
    // serde quotes what it could not take (`unknown field `x``, `invalid
    // type: string "x"`): the client's own text, cut.
    let text = match text.split_once(": ") {
        Some((head, rest)) if head.starts_with("Failed to") => rest,
        _ => text,
    };
    // A data error starts with the path of the value (`decisions.<id>:`),
    // whose keys can be the client's too.
    match text.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') => {
            format!("{}: {}", clip(path), clip_quoted(rest, &['`', '"']))
        }
        _ => clip_quoted(text, &['`', '"']),
    }
}

/// Ids as echoed in an error: each cut by [`clip`], at most [`ECHO_IDS`].
fn echo_ids<T: std::fmt::Display>(ids: &[T]) -> Vec<String> {
    ids.iter()
        .take(ECHO_IDS)
        .map(|id| clip(&id.to_string()))
        .collect()
}

/// `ids` as a message lists them (see [`echo_ids`]).
fn list_ids<T: std::fmt::Display>(ids: &[T]) -> String {
    let mut list = echo_ids(ids).join(", ");
    if ids.len() > ECHO_IDS {
        list.push_str(&format!(" and {} more", ids.len() - ECHO_IDS));
    }
    list
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        // Client strings inside messages of the domain (a tool name, a
        // route) are quoted: each is cut, whatever the message.
        let message = clip_quoted(&e.to_string(), &['`', '"', '\'']);
        match e {
            SessionError::NotFound(id) => Self::session_not_found(id),
            SessionError::UnknownAgent(name) => {
                Self::bad_request("unknown_agent", format!("unknown agent '{}'", clip(&name)))
                    .with_details(json!({"agent": clip(&name)}))
            }
            SessionError::UnknownTask(task) => {
                Self::new(StatusCode::NOT_FOUND, "unknown_task", message)
                    .with_details(json!({"task": task}))
            }
            SessionError::InvalidContext { field, .. } => {
                Self::bad_request("invalid_context", message).with_details(json!({"field": field}))
            }
            SessionError::Terminal { status, .. } => {
                Self::conflict("session_terminal", message).with_details(json!({"status": status}))
            }
            SessionError::Busy { status, .. } => {
                Self::conflict("session_busy", message).with_details(json!({"status": status}))
            }
            SessionError::UnknownCalls(ids) => Self::bad_request(
                "unknown_calls",
                format!("unknown tool call id(s): {}", list_ids(&ids)),
            )
            .with_details(json!({"call_ids": echo_ids(&ids)})),
            SessionError::AlreadyDecided(ids) => Self::conflict(
                "already_decided",
                format!("tool call(s) already decided: {}", list_ids(&ids)),
            )
            .with_details(json!({"call_ids": echo_ids(&ids)})),
            // The same code as a call decided by anyone else: the timeout
            // decides it; the message says so.
            SessionError::ApprovalExpired(ids) => Self::conflict(
                "already_decided",
                format!(
                    "the approval deadline of tool call(s) passed, so the timeout denies them: {}",
                    list_ids(&ids)
                ),
            )
            .with_details(json!({"call_ids": echo_ids(&ids)})),
            SessionError::StrayMetadata(ids) => Self::bad_request(
                "stray_metadata",
                format!(
                    "metadata given for tool call(s) not decided in this submission: {}",
                    list_ids(&ids)
                ),
            )
            .with_details(json!({"call_ids": echo_ids(&ids)})),
            SessionError::EmptySubmission => Self::bad_request("empty_submission", message),
            SessionError::InvalidOverride { call_id, error } => {
                Self::bad_request("invalid_override", message)
                    .with_details(json!({"call_id": call_id, "error": error}))
            }
            SessionError::AlreadyExists(_) => Self::conflict("already_exists", message),
            SessionError::Conflict(_) => Self::conflict("conflict", message),
            SessionError::Invalid(_) => Self::bad_request("invalid_request", message),
            SessionError::Internal(detail) => {
                // For the operator's log, not for the caller.
                tracing::error!(error = %detail, "internal failure while serving a request");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "an internal error occurred; the request was not applied",
                )
            }
            SessionError::Unavailable { id, reason } => {
                // The reason can be a storage error's text (a failed
                // checkpoint): for the operator's log, not for the caller.
                tracing::warn!(session_id = %id, %reason, "session unavailable");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("session {id} is temporarily unavailable; retry shortly"),
                )
            }
            SessionError::QueueFull { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "queue_full", message)
            }
            SessionError::QuotaExceeded { .. } => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
            }
            SessionError::TooLarge { what, size, limit } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
                    .with_details(json!({"field": what, "size": size, "limit": limit}))
            }
            SessionError::Overloaded {
                retry_after_secs, ..
            } => Self::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message)
                .with_details(json!({"retry_after_secs": retry_after_secs})),
            SessionError::Store(StoreError::NotOwner { session, reason }) => {
                // Cluster mode: nothing was written. Either the session moved
                // to another node while this one served the request (the
                // router sends the request to the new owner,
                // `crate::cluster`), or this node may write nothing at all
                // (its lease ran out: the database is unreachable, or the
                // node was paused). The reason says which, so a caller is
                // not told a new session is "moving".
                tracing::info!(session_id = %session, %reason, "session owned elsewhere");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    NOT_OWNER,
                    format!("session {session} cannot be written on this node now ({reason}); retry shortly"),
                )
            }
            SessionError::Store(StoreError::Unavailable(reason)) => {
                // The store reports its own outage (once, then a reminder a
                // minute); a line per refused request would drown it.
                tracing::debug!(%reason, "store unavailable while serving a request");
                Self::store_unavailable()
            }
            SessionError::Store(store) => {
                // The details are for operators, not for callers.
                tracing::error!(
                    error = %overseer_actors::error::chain(&store),
                    "storage failure while serving a request"
                );
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal storage error; the request was not applied",
                )
            }
        }
    }
}

/// The `Retry-After` of a `store_unavailable` answer: the store tries to
/// recover every 2 s at most, so sooner is rarely worth it.
pub const STORE_RETRY_AFTER_SECS: u64 = 2;

/// The `Retry-After` of a 429 or 503 that names no delay of its own: a
/// session's queue drains, and a restarting session is back, within about a
/// second.
const DEFAULT_RETRY_AFTER_SECS: u64 = 1;

/// The code of the 503 a node answers when a session it was serving turned
/// out to be owned by another node (cluster mode).
pub const NOT_OWNER: &str = "not_owner";

/// Marks (in its extensions) a response that is the `not_owner` 503, so the
/// cluster router can send the request on to the new owner.
#[derive(Debug, Clone, Copy)]
pub struct NotOwnerResponse;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        SessionError::Store(e).into()
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::MissingScope(_) => {
                Self::new(StatusCode::FORBIDDEN, "forbidden", e.to_string())
            }
            AuthError::MissingToken | AuthError::MalformedHeader | AuthError::InvalidToken(_) => {
                Self::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string())
            }
            // The identity provider is down or unreachable: the server's
            // problem, and a retry may succeed.
            AuthError::KeysUnavailable(_) => {
                tracing::error!(error = %e, "cannot verify a token");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "keys_unavailable",
                    e.to_string(),
                )
            }
            // Configuration problems should never reach a request; if one
            // does, it is the server's fault, not the caller's.
            AuthError::InvalidKey(_)
            | AuthError::EmptyClaim(_)
            | AuthError::InvalidClaim(_)
            | AuthError::UnknownScope(_)
            | AuthError::NoScopes
            | AuthError::InvalidTtl { .. }
            | AuthError::SecretMissing => {
                tracing::error!(error = %e, "auth misconfiguration while serving a request");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "authentication is misconfigured",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(mut self) -> Response {
        if self.message.chars().count() > MAX_MESSAGE_CHARS {
            let total = self.message.chars().count();
            self.message = format!(
                "{}… ({total} characters)",
                self.message
                    .chars()
                    .take(MAX_MESSAGE_CHARS)
                    .collect::<String>()
            );
        }
        let retry_after = self
            .details
            .as_ref()
            .and_then(|d| d.get("retry_after_secs"))
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_RETRY_AFTER_SECS)
            .max(1);
        let mut error = json!({"code": self.code, "message": self.message});
        if let (Some(details), Some(obj)) = (self.details, error.as_object_mut()) {
            obj.insert("details".into(), details);
        }
        let mut response = (self.status, axum::Json(json!({ "error": error }))).into_response();
        if self.code == NOT_OWNER {
            response.extensions_mut().insert(NotOwnerResponse);
        }
        match self.status {
            StatusCode::UNAUTHORIZED => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            // Every 503 and 429 says when to come back: the delay the error
            // names (`overloaded`, `store_unavailable`), or a second.
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use overseer_actors::model::{SessionId, SessionStatus};

    use super::*;

    /// One of each store error. The match has no wildcard, so a new variant
    /// does not compile until it is listed here, and so checked below.
    fn every_store_error() -> Vec<StoreError> {
        let session = SessionId::generate();
        let all = vec![
            StoreError::Io("the store is closed".into()),
            StoreError::io("reading session x", std::io::Error::from_raw_os_error(5)),
            StoreError::Corrupt {
                session: session.to_string(),
                detail: "bad row".into(),
            },
            StoreError::SchemaTooNew {
                session,
                found: 99,
                supported: 1,
            },
            StoreError::Unavailable("the database restarts".into()),
            StoreError::NotOwner {
                session,
                reason: "node b holds its lease".into(),
            },
            StoreError::NotTerminal {
                session,
                status: SessionStatus::Running,
            },
        ];
        for e in &all {
            match e {
                StoreError::Io(_)
                | StoreError::Backend { .. }
                | StoreError::Corrupt { .. }
                | StoreError::SchemaTooNew { .. }
                | StoreError::Unavailable(_)
                | StoreError::NotOwner { .. }
                | StoreError::NotTerminal { .. } => {}
            }
        }
        all
    }

    /// A failure of the store or of the runtime itself is the server's: 500
    /// or 503, never a 4xx the caller would take as its own mistake.
    #[test]
    fn internal_failures_are_500_or_503_never_4xx() {
        for e in every_store_error() {
            let text = e.to_string();
            let retry = e.is_unavailable() || e.is_not_owner();
            let api = ApiError::from(e);
            let want = if retry {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            assert_eq!(api.status, want, "{text}");
            assert!(!api.message.contains("os error"), "{text}: {}", api.message);
        }
        for e in [
            SessionError::Internal("the runtime is not started".into()),
            SessionError::Internal("the orchestrator did not answer".into()),
        ] {
            assert_eq!(ApiError::from(e).status, StatusCode::INTERNAL_SERVER_ERROR);
        }
    }
}
