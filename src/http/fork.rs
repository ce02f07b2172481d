//! Forks over HTTP: `POST /v1/sessions/{id}/fork {at?}` → 201 with
//! the new session (its `forked_from` says `{session, at, index}`), and
//! `GET /v1/sessions/{id}/history` → the points a fork can start from.
//!
//! `at` is an event sequence number (`{"at": 42}` or `{"at": {"seq": 42}}`)
//! or a transcript index (`{"at": {"index": 7}}`: the fork keeps the first
//! 7 entries); without it, the source's latest checkpoint. The fork is a
//! root session of the same tenant; another tenant's source is a 404, as
//! everywhere. The source is only read.

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use overseer_actors::ForkAt;

use super::extract::{Authorized, Read, SessionPath, Write};
use super::sessions::{owned_header, session_json};
use super::{ApiError, AppState};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum At {
    Seq(u64),
    Point(AtPoint),
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct AtPoint {
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    index: Option<u64>,
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ForkBody {
    #[serde(default)]
    at: Option<At>,
}

fn fork_at(body: &ForkBody) -> Result<ForkAt, ApiError> {
    match &body.at {
        None => Ok(ForkAt::Latest),
        Some(At::Seq(s)) => Ok(ForkAt::Seq(*s)),
        Some(At::Point(AtPoint {
            seq: Some(s),
            index: None,
        })) => Ok(ForkAt::Seq(*s)),
        Some(At::Point(AtPoint {
            seq: None,
            index: Some(i),
        })) => Ok(ForkAt::Index(*i)),
        Some(At::Point(_)) => Err(ApiError::bad_request(
            "invalid_body",
            "at: give one of an event sequence number ({\"seq\": N}) or a transcript index ({\"index\": N})",
        )),
    }
}

/// `POST /v1/sessions/{id}/fork`.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/fork", tag = "library",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    request_body = Option<ForkBody>,
    responses(
        (status = 201, description = "The fork, a new root session (with `Location`)", body = crate::http::openapi::schemas::Session),
        (status = 400, description = "Invalid body (`at`) or id", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "The session's state forbids it (terminal, busy, already decided, key reused)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:write"]))
)]
pub(super) async fn fork(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Write>,
    SessionPath(id): SessionPath,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: ForkBody = optional_body(&body)?;
    let at = fork_at(&body)?;
    owned_header(&state, &principal, id).await?;
    let overseer = state.overseer();
    let fork = overseer.fork(id, at, Some(principal.sub.clone())).await?;
    let stored = overseer.state(fork).await?;
    let mut response = (StatusCode::CREATED, Json(session_json(&stored))).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/sessions/{fork}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /v1/sessions/{id}/history` → `{session_id, points: [{seq, index,
/// at_ms, kind: "turn_ended"|"tool_result", …}]}`.
#[utoipa::path(
    get, path = "/v1/sessions/{id}/history", tag = "library",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    responses(
        (status = 200, description = "The points a fork can start from", body = crate::http::openapi::schemas::History),
        (status = 400, description = "The path's id is not a UUID", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn history(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Read>,
    SessionPath(id): SessionPath,
) -> Result<Json<Value>, ApiError> {
    owned_header(&state, &principal, id).await?;
    let points = state.overseer().history(id).await?;
    Ok(Json(json!({"session_id": id, "points": points})))
}

/// A JSON body that may be left out (an empty body is `T::default()`);
/// a malformed one is a 400 naming what is wrong.
pub(super) fn optional_body<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("invalid JSON body: {e}")))
}
