//! `/v1/webhooks`: a tenant's webhook endpoints and their delivery logs
//!, all under the `webhooks:write` scope (`admin` implies it): an
//! endpoint's URL and log are the tenant's configuration, which a token
//! that only reads sessions has no business seeing.
//!
//! - `POST /v1/webhooks` `{url, events?, description?}`: 201 with the
//!   endpoint and its signing secret (`whsec_…`), shown this once; 400
//!   naming the field (an address the SSRF rules refuse says which rule).
//! - `GET /v1/webhooks`: `{webhooks: [...]}`, without secrets.
//! - `GET /v1/webhooks/{id}`: one endpoint, with `disabled: {at_ms, reason}`
//!   once deliveries to it were given up.
//! - `DELETE /v1/webhooks/{id}`: 204; its pending deliveries go with it.
//! - `POST /v1/webhooks/{id}/enable`: takes a disabled endpoint back into
//!   service (200 with the endpoint); events from then on reach it.
//! - `POST /v1/webhooks/{id}/rotate` `{grace_secs?}` (`{}` for the
//!   default): a new signing secret,
//!   shown this once; the old one keeps signing beside it (two
//!   space-separated signatures) for `grace_secs` (default a day, at most
//!   a week, 0: none).
//! - An `{id}` that is not a UUID is a 400, like the session routes'.
//! - `GET /v1/webhooks/{id}/deliveries?cursor=&limit=`: its delivery log,
//!   newest first: `webhook-id`, event, session, status, attempts, last
//!   error and status code, next attempt.
//!
//! Another tenant's endpoint is a 404, like an unknown one. This module owns
//! the wire shapes only; the rules are `crate::webhooks`'.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::extract::{ApiJson, ApiQuery, Authorized, Hooks, NoParams};
use super::{ApiError, AppState};
use std::time::Duration;

use crate::webhooks::{
    Delivery, Endpoint, EventType, NewEndpoint, WebhookError, Webhooks, DEFAULT_ROTATION_GRACE,
};

/// Default page of the delivery log.
const DEFAULT_PAGE: usize = 50;
/// Largest page of the delivery log.
const MAX_PAGE: usize = 200;

impl From<WebhookError> for ApiError {
    fn from(e: WebhookError) -> Self {
        match e {
            WebhookError::Target(t) => {
                ApiError::bad_request("invalid_webhook_url", format!("url: {t}"))
            }
            WebhookError::Invalid {
                field: "id",
                message,
            } => ApiError::bad_request("invalid_id", format!("path segment 'id': {message}")),
            WebhookError::Invalid { field, message } => {
                ApiError::bad_request("invalid_request", format!("{field}: {message}"))
            }
            WebhookError::NotFound(id) => ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no webhook endpoint {id}"),
            ),
            WebhookError::Store(e) => e.into(),
        }
    }
}

fn hooks(state: &AppState) -> Result<&std::sync::Arc<Webhooks>, ApiError> {
    state.webhooks().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "webhooks are disabled on this server ([webhooks] enabled = false)",
        )
    })
}

/// An endpoint as the API shows it: everything but the secret.
fn view(e: &Endpoint) -> Value {
    json!({
        "id": e.id,
        "url": e.url,
        "events": e.events,
        "description": e.description,
        "created_by": e.created_by,
        "created_at_ms": e.created_at_ms,
        "enabled": e.disabled.is_none(),
        "disabled": e.disabled,
        "previous_secret_until_ms": e.previous_secret.as_ref().map(|p| p.until_ms),
    })
}

fn delivery_view(d: &Delivery) -> Value {
    json!({
        "webhook_id": d.seed.id,
        "event": d.seed.event,
        "session_id": d.seed.session_id,
        "event_seq": d.seed.seq,
        "status": d.status,
        "attempts": d.attempts,
        "created_at_ms": d.created_at_ms,
        "next_attempt_at_ms": (d.status == crate::webhooks::DeliveryStatus::Pending)
            .then_some(d.next_attempt_at_ms),
        "last_attempt_at_ms": d.last_attempt_at_ms,
        "last_status_code": d.last_status_code,
        "last_error": d.last_error,
        "delivered_at_ms": d.delivered_at_ms,
    })
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = WebhookCreate)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateBody {
    url: String,
    #[serde(default)]
    events: Option<Vec<String>>,
    #[serde(default)]
    description: Option<String>,
}

/// `POST /v1/webhooks`.
#[utoipa::path(
    post, path = "/v1/webhooks", tag = "webhooks",
    request_body = CreateBody,
    responses(
        (status = 201, description = "The endpoint, with its secret (shown once)", body = crate::http::openapi::schemas::WebhookWithSecret),
        (status = 400, description = "Invalid body: a URL the target rules refuse, an unknown event", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "Webhooks are disabled on this server", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["webhooks:write"]))
)]
pub(super) async fn create(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Hooks>,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Response, ApiError> {
    let hooks = hooks(&state)?;
    let mut events = Vec::new();
    for name in body.events.unwrap_or_default() {
        let event = EventType::parse(&name).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_request",
                format!(
                    "events: unknown event '{name}' (known: {})",
                    EventType::ALL.map(EventType::as_str).join(", ")
                ),
            )
        })?;
        events.push(event);
    }
    let endpoint = hooks
        .register(
            &principal.tenant,
            NewEndpoint {
                url: body.url,
                events,
                description: body.description,
                created_by: Some(principal.sub.clone()),
            },
        )
        .await?;
    let mut shown = view(&endpoint);
    shown["secret"] = json!(endpoint.secret);
    Ok((StatusCode::CREATED, Json(shown)).into_response())
}

/// `GET /v1/webhooks`.
#[utoipa::path(
    get, path = "/v1/webhooks", tag = "webhooks",
    responses(
        (status = 200, description = "The tenant's endpoints", body = crate::http::openapi::schemas::WebhookList),
        (status = 404, description = "Webhooks are disabled on this server", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["webhooks:write"]))
)]
pub(super) async fn list(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Hooks>,
) -> Result<Json<Value>, ApiError> {
    let endpoints = hooks(&state)?.list(&principal.tenant).await?;
    let views: Vec<Value> = endpoints.iter().map(view).collect();
    Ok(Json(json!({ "webhooks": views })))
}

/// `GET /v1/webhooks/{id}`.
#[utoipa::path(
    get, path = "/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = uuid::Uuid, Path, description = "The endpoint")),
    responses(
        (status = 200, description = "The endpoint", body = crate::http::openapi::schemas::Webhook),
        (status = 400, description = "The id is not a UUID", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such endpoint, or webhooks are disabled", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["webhooks:write"]))
)]
pub(super) async fn show(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Hooks>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let endpoint = hooks(&state)?.get(&principal.tenant, &id).await?;
    Ok(Json(view(&endpoint)))
}

/// `DELETE /v1/webhooks/{id}`.
#[utoipa::path(
    delete, path = "/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = uuid::Uuid, Path, description = "The endpoint")),
    responses(
        (status = 204, description = "Deleted; its pending deliveries are dropped"),
        (status = 400, description = "The id is not a UUID, or a body was sent", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such endpoint, or webhooks are disabled", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["webhooks:write"]))
)]
pub(super) async fn delete(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Hooks>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    hooks(&state)?.delete(&principal.tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/webhooks/{id}/enable`.
#[utoipa::path(
    post, path = "/v1/webhooks/{id}/enable", tag = "webhooks",
    params(("id" = uuid::Uuid, Path, description = "The endpoint")),
    responses(
        (status = 200, description = "The endpoint, receiving deliveries again", body = crate::http::openapi::schemas::Webhook),
        (status = 400, description = "The id is not a UUID, or a body was sent", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such endpoint, or webhooks are disabled", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["webhooks:write"]))
)]
pub(super) async fn enable(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Hooks>,
    Path(id): Path<String>,
    _: NoParams,
) -> Result<Json<Value>, ApiError> {
    let endpoint = hooks(&state)?.enable(&principal.tenant, &id).await?;
    Ok(Json(view(&endpoint)))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RotateBody {
    #[serde(default)]
    grace_secs: Option<u64>,
}

/// `POST /v1/webhooks/{id}/rotate`.
#[utoipa::path(
    post, path = "/v1/webhooks/{id}/rotate", tag = "webhooks",
    params(("id" = uuid::Uuid, Path, description = "The endpoint")),
    request_body = RotateBody,
    responses(
        (status = 200, description = "The endpoint with its new secret; the old one signs too until `previous_secret_until_ms`", body = crate::http::openapi::schemas::WebhookWithSecret),
        (status = 400, description = "Invalid body or id", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such endpoint, or webhooks are disabled", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["webhooks:write"]))
)]
pub(super) async fn rotate(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Hooks>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<RotateBody>,
) -> Result<Json<Value>, ApiError> {
    let grace = body
        .grace_secs
        .map_or(DEFAULT_ROTATION_GRACE, Duration::from_secs);
    let endpoint = hooks(&state)?.rotate(&principal.tenant, &id, grace).await?;
    let mut shown = view(&endpoint);
    shown["secret"] = json!(endpoint.secret);
    Ok(Json(shown))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct LogQuery {
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET /v1/webhooks/{id}/deliveries?cursor=&limit=`.
#[utoipa::path(
    get, path = "/v1/webhooks/{id}/deliveries", tag = "webhooks",
    params(("id" = uuid::Uuid, Path, description = "The endpoint"), LogQuery),
    responses(
        (status = 200, description = "A page of the endpoint's delivery log, newest first", body = crate::http::openapi::schemas::DeliveryPage),
        (status = 400, description = "Invalid query or id", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such endpoint, or webhooks are disabled", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["webhooks:write"]))
)]
pub(super) async fn deliveries(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Hooks>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit: must be between 1 and {MAX_PAGE}"),
        ));
    }
    if let Some(cursor) = &q.cursor {
        let ok = cursor
            .strip_prefix("msg_")
            .is_some_and(|hex| uuid::Uuid::parse_str(hex).is_ok());
        if !ok {
            return Err(ApiError::bad_request(
                "invalid_query",
                format!("cursor: '{cursor}' is not a cursor of this log; pass the next_cursor of a previous page"),
            ));
        }
    }
    let page = hooks(&state)?
        .deliveries(&principal.tenant, &id, q.cursor.as_deref(), limit)
        .await?;
    let next_cursor = (page.len() == limit)
        .then(|| page.last().map(|d| d.seed.id.clone()))
        .flatten();
    let views: Vec<Value> = page.iter().map(delivery_view).collect();
    Ok(Json(
        json!({ "deliveries": views, "next_cursor": next_cursor }),
    ))
}
