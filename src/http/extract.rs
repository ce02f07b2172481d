//! Request extractors whose rejections are [`ApiError`]s, so axum's default
//! plain-text rejections never reach a client.
//!
//! This module owns turning raw request parts into typed values (caller,
//! session id, JSON body, query). It deliberately does no authorisation
//! beyond authentication: which scope a route needs, and whether the caller's
//! tenant owns the session, is decided by the handlers.

use std::marker::PhantomData;

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use overseer_actors::model::SessionId;
use serde::de::DeserializeOwned;

use super::{ApiError, AppState};
use crate::auth::{AuthError, Principal, Scope};

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Auth(pub Principal);

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let header = match parts.headers.get(AUTHORIZATION) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| AuthError::MalformedHeader)?),
        };
        Ok(Auth(state.auth().authenticate(header).await?))
    }
}

/// A scope a route requires, as a type, so that [`Authorized`] checks it
/// while extracting: 401 and 403 are decided before the path or the body is
/// looked at, and a caller without the scope learns nothing from a 400.
pub trait RequiredScope: Send + Sync + 'static {
    /// The scope.
    const SCOPE: Scope;
}

/// Routes that read (`sessions:read`).
pub struct Read;
/// Routes that create or drive sessions (`sessions:write`).
pub struct Write;
/// Routes that decide tool calls (`approvals:write`).
pub struct Approve;
/// Webhook routes (`webhooks:write`): registering, listing and deleting
/// endpoints and reading their delivery logs (an endpoint's URL and log
/// are the tenant's configuration, not session data a reader should see).
pub struct Hooks;
/// Operator routes (`admin`): `/metrics` unless it is public.
pub struct Admin;

impl RequiredScope for Read {
    const SCOPE: Scope = Scope::SessionsRead;
}
impl RequiredScope for Write {
    const SCOPE: Scope = Scope::SessionsWrite;
}
impl RequiredScope for Approve {
    const SCOPE: Scope = Scope::ApprovalsWrite;
}
impl RequiredScope for Hooks {
    const SCOPE: Scope = Scope::WebhooksWrite;
}
impl RequiredScope for Admin {
    const SCOPE: Scope = Scope::Admin;
}

/// An authenticated caller that holds scope `S` (or `admin`).
pub struct Authorized<S: RequiredScope>(pub Principal, pub PhantomData<S>);

impl<S: RequiredScope> FromRequestParts<AppState> for Authorized<S> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Auth(principal) = Auth::from_request_parts(parts, state).await?;
        principal.require(S::SCOPE)?;
        Ok(Authorized(principal, PhantomData))
    }
}

/// The `{id}` path segment, parsed as a session id.
#[derive(Debug, Clone, Copy)]
pub struct SessionPath(pub SessionId);

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(ApiError::from_path_rejection)?;
        raw.parse::<SessionId>().map(SessionPath).map_err(|e| {
            ApiError::bad_request(
                "invalid_id",
                format!(
                    "path segment 'id': '{}' is not a valid session id (a UUID): {e}",
                    super::error::clip(&raw)
                ),
            )
        })
    }
}

/// A JSON body. Body types opt into `deny_unknown_fields` themselves.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        axum::Json::<T>::from_request(req, state)
            .await
            .map(|axum::Json(v)| ApiJson(v))
            .map_err(ApiError::from_json_rejection)
    }
}

/// The body of a POST that takes no parameters (`cancel`, `done`,
/// `interrupt`): none at all, or an empty JSON object. Anything else is
/// refused as any JSON body would be: without `Content-Type:
/// application/json` 415, malformed 400 `malformed_json`, anything but `{}`
/// 400 `invalid_body` naming what was wrong; over the limit 413.
#[derive(Debug, Clone, Copy)]
pub struct NoParams;

impl<S: Send + Sync> FromRequest<S> for NoParams {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes =
            axum::body::Bytes::from_request(Request::from_parts(parts.clone(), body), state)
                .await
                .map_err(|e| {
                    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                        ApiError::payload_too_large()
                    } else {
                        ApiError::bad_request("invalid_body", "the request body could not be read")
                    }
                })?;
        if bytes.is_empty() {
            return Ok(NoParams);
        }
        let request = Request::from_parts(parts, axum::body::Body::from(bytes));
        let axum::Json(value) = axum::Json::<serde_json::Value>::from_request(request, state)
            .await
            .map_err(ApiError::from_json_rejection)?;
        match value {
            serde_json::Value::Object(fields) => match fields.keys().next() {
                None => Ok(NoParams),
                Some(field) => Err(ApiError::bad_request(
                    "invalid_body",
                    format!(
                        "unknown field `{}`: this request takes no parameters (send no body, or {{}})",
                        super::error::clip(field)
                    ),
                )),
            },
            other => Err(ApiError::bad_request(
                "invalid_body",
                format!(
                    "expected an empty JSON object, found {}: this request takes no parameters \
                     (send no body, or {{}})",
                    json_kind(&other)
                ),
            )),
        }
    }
}

/// What kind of JSON value `v` is, for a message.
fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A query string.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(ApiError::from_query_rejection)
    }
}
