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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ActivateBody {
    name: String,
}

/// `POST /v1/sessions/{id}/skills`.
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
