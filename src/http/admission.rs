//! What every request passes before it is routed: the URI limit, the cap on
//! requests in flight, and the deadline on its body.
//!
//! This module owns admission: whether the server takes a request on at
//! all, and the bounded wait for its body. A request over the in-flight cap
//! is answered at once with 503 `overloaded` and `Retry-After` rather than
//! queued, so a burst costs callers a retry, never the server its memory.
//! The body is read here, whole and under [`HttpLimits::request_body_timeout`],
//! while the request holds its in-flight slot: a client that sends its body
//! slowly is answered 408 instead of holding a handler. It deliberately
//! decides nothing about what a request means; authentication, scopes and
//! the body's shape are the handlers'.
//!
//! What counts as in flight: a request from admission until its handler has
//! produced the response's head. An event stream therefore counts only
//! until its stream starts (open streams are bounded by the connection cap
//! instead), and `/healthz`, `/readyz` and `/metrics` never count, so that an
//! overloaded server still answers its probes and its scraper. In cluster
//! mode a request forwarded to another node gives its slot back once it
//! waits on that node (it then counts against the forward budget of
//! `super::routing`): local work and forwards have separate budgets.
//!
//! [`HttpLimits::request_body_timeout`]: super::HttpLimits::request_body_timeout

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::sync::OwnedSemaphorePermit;

use super::{ApiError, AppState, BODY_LIMIT_BYTES, MAX_URI_BYTES};

/// Routes outside admission control: cheap, and most needed when the server
/// is busiest.
const ALWAYS_ADMITTED: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// The in-flight slot a request was admitted with, in its extensions: the
/// cluster router gives it back early when the request goes on to wait on
/// another node.
#[derive(Clone)]
pub(super) struct AdmissionSlot(Arc<Mutex<Option<OwnedSemaphorePermit>>>);

impl AdmissionSlot {
    /// Gives the slot back now (it is given back anyway when the request
    /// ends).
    pub(super) fn release(&self) {
        let permit = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(permit);
    }
}

pub(super) async fn admit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let target = request
        .uri()
        .path_and_query()
        .map_or(0, |pq| pq.as_str().len());
    if target > MAX_URI_BYTES {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request target exceeds {} KiB", MAX_URI_BYTES / 1024),
        )
        .into_response();
    }
    if ALWAYS_ADMITTED.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let Ok(permit) = state.in_flight().clone().try_acquire_owned() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            format!(
                "the server is handling its limit of {} requests; retry shortly",
                state.limits().max_in_flight_requests
            ),
        )
        .into_response();
    };
    // Held here until the response's head (the extension's copy may be
    // dropped earlier, with the request).
    let slot = AdmissionSlot(Arc::new(Mutex::new(Some(permit))));
    let mut request = match read_body(request, &state).await {
        Ok(request) => request,
        Err(e) => return e.into_response(),
    };
    request.extensions_mut().insert(slot.clone());
    next.run(request).await
}

/// The request with its body read into memory, within the body deadline
/// and the body limit.
async fn read_body(request: Request, state: &AppState) -> Result<Request, ApiError> {
    if request.body().size_hint().exact() == Some(0) {
        return Ok(request);
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_LIMIT_BYTES as u64) {
        return Err(ApiError::payload_too_large());
    }
    let (parts, body) = request.into_parts();
    let deadline = state.limits().request_body_timeout;
    let bytes = match tokio::time::timeout(deadline, collect(body)).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} s",
                    deadline.as_secs()
                ),
            ))
        }
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// Reads a body of at most [`BODY_LIMIT_BYTES`].
async fn collect(body: Body) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            tracing::debug!(error = %e, "reading a request body failed");
            ApiError::bad_request("invalid_body", "the request body could not be read")
        })?;
        if buf.len() + chunk.len() > BODY_LIMIT_BYTES {
            return Err(ApiError::payload_too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}
