//! `GET /metrics`: the Prometheus text of the metrics `overseer_actors::metrics` names.
//!
//! This module owns the route's access rule and its answer. It deliberately
//! records and configures nothing: [`crate::metrics`] installs the recorder,
//! `overseer_actors::metrics` names and records the metrics.
//!
//! Access: when auth is on, a scrape needs the `admin` scope unless
//! [`HttpOptions::metrics_public`](super::HttpOptions::metrics_public) is set.
//! The metrics carry no session content, but they show every tenant's
//! activity (session counts, tool names, model routes), and a token of any
//! tenant should not read that; `admin` is the operator's scope. Prometheus
//! sends a bearer token from its scrape config, and a deployment that keeps
//! the port on a private network can make the route public instead. With
//! `auth = "none"` (loopback only) every caller holds every scope, so the
//! route is open.
//!
//! Without a recorder installed in the process the route answers 503
//! `metrics_unavailable`, not an empty 200: the scraper then marks the target
//! down, which shows the misconfiguration, where an empty page would pass
//! for a healthy server with nothing to report.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::extract::{Admin, Authorized};
use super::{ApiError, AppState};

#[utoipa::path(
    get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String),
        (status = 503, description = "No metrics recorder is installed in this process", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security((), ("bearer" = ["admin"]))
)]
pub(super) async fn metrics(State(state): State<AppState>, mut parts: Parts) -> Response {
    if !state.inner.options.metrics_public {
        if let Err(e) = Authorized::<Admin>::from_request_parts(&mut parts, &state).await {
            return e.into_response();
        }
    }
    let Some(handle) = crate::metrics::handle() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics_unavailable",
            "no metrics recorder is installed in this process",
        )
        .into_response();
    };
    // Rendering is synchronous and proportional to the number of series
    // (tens to a few hundred here): microseconds, not worth a blocking hop.
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        )],
        handle.render(),
    )
        .into_response()
}
