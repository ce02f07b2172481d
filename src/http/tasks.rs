//! Stored tasks over HTTP: `GET /v1/tasks` lists them, and `POST
//! /v1/tasks/{id}/runs {context?, title?, skills?}` runs one as a root
//! session of the caller's tenant (201 with the session, like a create).
//!
//! An unknown task is a 404 naming it; a context its `input_schema` refuses
//! is a 400 `invalid_context` naming the field (`details.field`). The task's
//! skills (and `skills`) are activated by the caller, who is a person: a
//! skill that needs trust is allowed here. Running the task is the
//! [`Overseer`](overseer_actors::Overseer)'s.

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use overseer_actors::TaskRun;

use super::extract::{Authorized, Read, Write};
use super::fork::optional_body;
use super::sessions::session_json;
use super::{ApiError, AppState};

/// `GET /v1/tasks` → `{tasks: [{id, description, agent, skills,
/// instructions, input_schema?, output_schema?}]}`.
#[utoipa::path(
    get, path = "/v1/tasks", tag = "library",
    responses(
        (status = 200, description = "The stored tasks", body = crate::http::openapi::schemas::TaskList)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn list(
    State(state): State<AppState>,
    Authorized(_, _): Authorized<Read>,
) -> Json<Value> {
    let tasks: Vec<Value> = state
        .overseer()
        .tasks()
        .map(|t| serde_json::to_value(t.as_ref()).unwrap_or(Value::Null))
        .collect();
    Json(json!({ "tasks": tasks }))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RunBody {
    /// What this run is about (checked against the task's `input_schema`).
    #[serde(default)]
    context: Option<Value>,
    #[serde(default)]
    title: Option<String>,
    /// Skills to activate besides the task's own.
    #[serde(default)]
    skills: Vec<String>,
    #[serde(default)]
    auto_complete: bool,
}

/// `POST /v1/tasks/{id}/runs` → 201 with the new session.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/runs", tag = "library",
    params(("id" = String, Path, description = "The task")),
    request_body = Option<RunBody>,
    responses(
        (status = 201, description = "The run's session (with `Location`)", body = crate::http::openapi::schemas::Session),
        (status = 400, description = "Invalid body, or a context its `input_schema` refuses", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such task", body = crate::http::openapi::schemas::ErrorBody),
        (status = 429, description = "The tenant's session quota is full (`Retry-After`)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:write"]))
)]
pub(super) async fn run(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Write>,
    Path(task): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: RunBody = optional_body(&body)?;
    let overseer = state.overseer();
    let id = overseer
        .run_task(TaskRun {
            task,
            context: body.context,
            tenant: principal.tenant.clone(),
            created_by: Some(principal.sub.clone()),
            title: body.title,
            id: None,
            skills: body.skills,
            auto_complete: body.auto_complete,
        })
        .await?;
    let stored = overseer.state(id).await?;
    let mut response = (StatusCode::CREATED, Json(session_json(&stored))).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/sessions/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}
