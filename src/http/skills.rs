//! A person's activation of a skill in a session: `POST
//! /v1/sessions/{id}/skills {name}` → 200 with the session's header.
//!
//! A person may activate a skill that needs trust (the model may not: its
//! `activate_skill` is refused and told to ask). The skill must be one the
//! session may use (400 naming it otherwise); one already active is a 409.
//! The activation is recorded in the transcript as the token's subject's.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use super::extract::{ApiJson, Authorized, SessionPath, Write};
use super::sessions::{header_json, owned_header};
use super::{ApiError, AppState};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ActivateBody {
    name: String,
}

/// `POST /v1/sessions/{id}/skills`.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/skills", tag = "library",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404")),
    request_body = ActivateBody,
    responses(
        (status = 200, description = "The session's header", body = overseer_actors::model::SessionHeader),
        (status = 400, description = "Unknown skill, or one only a person may activate", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody),
        (status = 409, description = "The session's state forbids it (terminal, busy, already decided, key reused)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:write"]))
)]
pub(super) async fn activate(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Write>,
    SessionPath(id): SessionPath,
    ApiJson(body): ApiJson<ActivateBody>,
) -> Result<Json<Value>, ApiError> {
    owned_header(&state, &principal, id).await?;
    state
        .overseer()
        .activate_skill(id, &body.name, Some(principal.sub.clone()))
        .await?;
    header_json(&state, &principal, id).await
}
