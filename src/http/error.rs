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
//! 431 (request head too large), 503 (session unavailable, server not ready
//! or over its in-flight limit; always with `Retry-After`) and 500 (storage
//! failure). Messages of 5xx answers are stable sentences: the underlying
//! error (an I/O error, a path) is logged, never sent.

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
            other => Self::bad_request("invalid_body", other.body_text()),
        }
    }

    /// Maps a rejected query string.
    pub fn from_query_rejection(rejection: QueryRejection) -> Self {
        Self::bad_request("invalid_query", strip_prefix(&rejection.body_text()))
    }

    /// Maps a rejected path.
    pub fn from_path_rejection(rejection: PathRejection) -> Self {
        Self::bad_request("invalid_path", rejection.body_text())
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

/// Axum prefixes rejection texts with a generic sentence
/// ("Failed to deserialize the JSON body into the target type: "); the
/// specific part after it is what a client needs.
fn strip_prefix(text: &str) -> String {
    match text.split_once(": ") {
        Some((head, rest)) if head.starts_with("Failed to") => rest.to_owned(),
        _ => text.to_owned(),
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        let message = e.to_string();
        match e {
            SessionError::NotFound(id) => Self::session_not_found(id),
            SessionError::UnknownAgent(name) => {
                Self::bad_request("unknown_agent", message).with_details(json!({"agent": name}))
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
            SessionError::UnknownCalls(ids) => {
                Self::bad_request("unknown_calls", message).with_details(json!({"call_ids": ids}))
            }
            SessionError::AlreadyDecided(ids) => {
                Self::conflict("already_decided", message).with_details(json!({"call_ids": ids}))
            }
            SessionError::StrayMetadata(ids) => {
                Self::bad_request("stray_metadata", message).with_details(json!({"call_ids": ids}))
            }
            SessionError::EmptySubmission => Self::bad_request("empty_submission", message),
            SessionError::InvalidOverride { call_id, error } => {
                Self::bad_request("invalid_override", message)
                    .with_details(json!({"call_id": call_id, "error": error}))
            }
            SessionError::AlreadyExists(_) => Self::conflict("already_exists", message),
            SessionError::Conflict(_) => Self::conflict("conflict", message),
            SessionError::Invalid(_) => Self::bad_request("invalid_request", message),
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
                // Cluster mode: the session moved to another node while this
                // one served the request; nothing was written. The router
                // sends the request to the new owner (`crate::cluster`).
                tracing::info!(session_id = %session, %reason, "session owned elsewhere");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    NOT_OWNER,
                    format!("session {session} is moving to another node; retry shortly"),
                )
            }
            SessionError::Store(StoreError::Unavailable(reason)) => {
                tracing::warn!(%reason, "database unreachable while serving a request");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the database is unreachable; retry shortly",
                )
            }
            SessionError::Store(store) => {
                // The details are for operators, not for callers.
                tracing::error!(error = %store, "storage failure while serving a request");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal storage error; the request was not applied",
                )
            }
        }
    }
}

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
    fn into_response(self) -> Response {
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
            StatusCode::SERVICE_UNAVAILABLE => {
                // A restarting session is usually back within a second.
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}
