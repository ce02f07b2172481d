//! `GET /v1/sessions/{id}/events`: a session's events as Server-Sent Events.
//!
//! This module owns the stream contract: `id:` is the event's sequence
//! number, `event:` its type, `data:` its JSON. A client resumes with
//! `Last-Event-ID` (or `?after=N`; the header wins, since a browser's
//! `EventSource` keeps the original URL when it reconnects) and receives
//! every later event exactly once, in order: the handler subscribes to live
//! notifications *first*, then replays the stored log, then forwards live
//! events, skipping those the replay already covered (events are published
//! only after they are checkpointed, so the replay and the subscription
//! overlap instead of leaving a gap). Text deltas are sent live only, as
//! `event: text_delta` without an id: they are never stored, and the step's
//! full text arrives in its `assistant_message` event. (Known gap: a delta
//! carries no step number, so in the instant a client connects, a delta of a
//! step whose `assistant_message` the replay already sent can still arrive;
//! treat `assistant_message` as authoritative.)
//!
//! A slow client never blocks a session: the live buffer is bounded (the
//! hub's broadcast channel), and a client that falls behind it is
//! disconnected; it reconnects with its last id and replays from the store.
//! The module deliberately keeps no per-client state beyond that buffer.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use overseer_actors::model::{Event, Notification};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::extract::{ApiQuery, Authorized, Read, SessionPath};
use super::sessions::owned_header;
use super::{ApiError, AppState};

/// Stored events fetched per replay read.
const REPLAY_PAGE: usize = 512;
/// Comment lines keep idle connections (and proxies) from timing out.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    #[serde(default)]
    after: Option<u64>,
}

/// The SSE form of a stored event.
fn sse_event(e: &Event) -> SseEvent {
    let value = serde_json::to_value(e).unwrap_or_else(|err| json!({"error": err.to_string()}));
    let kind = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("event")
        .to_owned();
    SseEvent::default()
        .id(e.seq.to_string())
        .event(kind)
        .data(value.to_string())
}

/// `GET /v1/sessions/{id}/events[?after=N]` with optional `Last-Event-ID`.
#[utoipa::path(
    get, path = "/v1/sessions/{id}/events", tag = "sessions",
    params(("id" = overseer_actors::model::SessionId, Path, description = "The session (a UUID); another tenant's is a 404"), EventsQuery, ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event")),
    responses(
        (status = 200, description = "Server-Sent Events: each `data` is an event (its `type` is the SSE event name, its `seq` the id); replayed after `after` or `Last-Event-ID`", content_type = "text/event-stream", body = overseer_actors::model::Event),
        (status = 400, description = "Invalid `after`, `Last-Event-ID` or id", body = crate::http::openapi::schemas::ErrorBody),
        (status = 404, description = "No such session (or another tenant's)", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["sessions:read"]))
)]
pub(super) async fn stream(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Read>,
    SessionPath(id): SessionPath,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    owned_header(&state, &principal, id).await?;
    let after = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_last_event_id",
                    "Last-Event-ID: expected the decimal id of an event of this stream",
                )
            })?,
        None => q.after.unwrap_or(0),
    };
    let overseer = state.overseer().clone();
    let mut shutdown = state.shutdown_signal();
    // Subscribe before reading the log: an event checkpointed after the read
    // is then certain to arrive live.
    let mut live = overseer.subscribe(id);
    // The first page is read before answering, so a store failure is a
    // status code rather than a silently empty stream.
    let first = overseer.events_after(id, after, REPLAY_PAGE).await?;

    let events = async_stream::stream! {
        let mut last = after;
        let mut page = first;
        loop {
            let full = page.len() == REPLAY_PAGE;
            for e in page {
                last = e.seq;
                yield Ok(sse_event(&e));
            }
            if !full {
                break;
            }
            page = match overseer.events_after(id, last, REPLAY_PAGE).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(session_id = %id, error = %e, "event replay failed; closing the stream");
                    return;
                }
            };
        }
        if *shutdown.borrow_and_update() {
            return;
        }
        loop {
            let received = tokio::select! {
                // Both a shutdown and a dropped state end the stream.
                _ = shutdown.changed() => return,
                r = live.recv() => r,
            };
            match received {
                Ok(Notification::Event(e)) => {
                    if e.seq <= last {
                        continue;
                    }
                    if e.seq > last + 1 {
                        // Not expected (publication follows the checkpoint),
                        // but if a notification was ever skipped, fill the
                        // hole from the log rather than leave one.
                        let missing = (e.seq - last - 1) as usize;
                        match overseer.events_after(id, last, missing.min(REPLAY_PAGE)).await {
                            Ok(fill) => {
                                for f in fill.into_iter().filter(|f| f.seq < e.seq) {
                                    last = f.seq;
                                    yield Ok(sse_event(&f));
                                }
                            }
                            Err(_) => return,
                        }
                        if e.seq > last + 1 {
                            // Still a hole: let the client resume from the log.
                            return;
                        }
                    }
                    last = e.seq;
                    yield Ok(sse_event(&e));
                }
                Ok(Notification::TextDelta { text, .. }) => {
                    yield Ok(SseEvent::default()
                        .event("text_delta")
                        .data(json!({ "text": text }).to_string()));
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::debug!(session_id = %id, missed, "event stream client fell behind; disconnecting it so it resumes by id");
                    return;
                }
                Err(RecvError::Closed) => return,
            }
        }
    };
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}
