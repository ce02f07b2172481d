//! Request extractors whose rejections are [`ApiError`]s, so axum's default
//! plain-text rejections never reach a client.
//!
//! This module owns turning raw request parts into typed values (caller,
//! session id, JSON body, query). It deliberately does no authorisation
//! beyond authentication: which scope a route needs, and whether the caller's
//! tenant owns the session, is decided by the handlers.

use std::marker::PhantomData;

use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
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

/// Levels of nesting (objects and arrays, the body itself being the first)
/// a JSON body may have. Deep enough for every body the API takes, an
/// `output_schema` at its own bound (`overseer_actors::schema`) included;
/// below serde_json's recursion limit (128), so a deeper body is refused
/// with a sentence naming where, before anything recursive reads it.
pub const MAX_BODY_DEPTH: usize = 64;

/// A JSON body. Body types opt into `deny_unknown_fields` themselves. Its
/// nesting is bounded by [`MAX_BODY_DEPTH`], checked on the bytes before
/// they are parsed.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        // A body that is not JSON is axum's to refuse (415), as before.
        let req = if is_json_type(req.headers()) {
            let (parts, body) = req.into_parts();
            let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
                .await
                .map_err(|e| ApiError::from_json_rejection(JsonRejection::from(e)))?;
            if let Err(too_deep) = depth_within(&bytes, MAX_BODY_DEPTH) {
                return Err(ApiError::bad_request("invalid_body", too_deep.to_string()));
            }
            Request::from_parts(parts, Body::from(bytes))
        } else {
            req
        };
        axum::Json::<T>::from_request(req, state)
            .await
            .map(|axum::Json(v)| ApiJson(v))
            .map_err(ApiError::from_json_rejection)
    }
}

/// Whether the request says its body is JSON (`application/json` or a
/// `+json` type), as axum's `Json` decides it.
fn is_json_type(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A JSON text nested past the bound: where (the top-level field it is in,
/// when there is one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooDeep {
    /// The bound.
    pub limit: usize,
    /// The top-level field whose value nests too deep, cut to 64 characters.
    pub field: Option<String>,
}

impl std::fmt::Display for TooDeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{field}: nested deeper than {} levels", self.limit),
            None => write!(f, "the body is nested deeper than {} levels", self.limit),
        }
    }
}

/// Checks the nesting of a JSON text in one pass over its bytes, without
/// parsing it: brackets outside strings open and close levels. Malformed
/// text is left for the parser to refuse.
pub fn depth_within(text: &[u8], limit: usize) -> Result<(), TooDeep> {
    const FIELD_CHARS: usize = 64;
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    // The last string closed at the first level, and the field it named
    // once a ':' followed it.
    let mut string = Vec::new();
    let mut field: Option<Vec<u8>> = None;
    for &b in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                continue;
            }
            if depth == 1 && string.len() < FIELD_CHARS * 4 {
                string.push(b);
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                string.clear();
            }
            b':' if depth == 1 => field = Some(std::mem::take(&mut string)),
            b'{' | b'[' => {
                depth += 1;
                if depth > limit {
                    let field = field.map(|f| {
                        String::from_utf8_lossy(&f)
                            .chars()
                            .take(FIELD_CHARS)
                            .collect()
                    });
                    return Err(TooDeep { limit, field });
                }
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 1 {
                    field = None;
                }
            }
            _ => {}
        }
    }
    Ok(())
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
        if is_json_type(&parts.headers) {
            if let Err(too_deep) = depth_within(&bytes, MAX_BODY_DEPTH) {
                return Err(ApiError::bad_request("invalid_body", too_deep.to_string()));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(field: &str, levels: usize) -> String {
        format!(
            "{{\"agent\": \"a\", \"{field}\": {}{}}}",
            "[".repeat(levels),
            "]".repeat(levels)
        )
    }

    #[test]
    fn a_body_past_the_depth_bound_is_refused_naming_its_field() {
        // The body is level 1, so its field may hold limit - 1 levels.
        assert_eq!(depth_within(nested("x", 63).as_bytes(), 64), Ok(()));
        let err = depth_within(nested("output_schema", 64).as_bytes(), 64).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("output_schema"));
        assert_eq!(
            err.to_string(),
            "output_schema: nested deeper than 64 levels"
        );
        // Brackets inside strings, escaped quotes included, are text.
        let text = format!("{{\"a\": \"\\\"{}\", \"b\": 1}}", "[".repeat(200));
        assert_eq!(depth_within(text.as_bytes(), 4), Ok(()));
        // An array body has no field to name.
        let err = depth_within("[".repeat(10).as_bytes(), 4).unwrap_err();
        assert_eq!(err.to_string(), "the body is nested deeper than 4 levels");
        // A later field is named, not an earlier one that closed.
        let text = r#"{"a": {"b": 1}, "c": [[[[1]]]]}"#;
        let err = depth_within(text.as_bytes(), 3).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("c"));
    }
}
