//! Operator routes (`admin` scope): `POST /v1/admin/backup`, a consistent
//! backup of a serving store, streamed as the response body.
//!
//! Why a stream rather than the server writing a directory on its own
//! machine: the backup lands where the operator (or the backup host) runs
//! `overseer store backup --url …`, the server needs no write access
//! outside its data directory (the systemd unit allows it nothing else),
//! and no path from a request ever reaches the server's file system. The
//! body is `application/x-ndjson`, one [`StreamLine`] a line: `begin`, one
//! `session` each (one whole checkpoint, see `store::backup`), then `end`
//! with the counts, or `error`. A body that stops without `end` was cut,
//! and the client keeps no manifest for it. Writes go on while it runs.
//!
//! The walk reads every tenant's sessions: `admin` is the operator's scope
//! (as for `/metrics`), and a token that holds it is a key to the whole
//! store. In cluster mode the sessions are in PostgreSQL, whose own tools
//! back it up consistently (`pg_dump`, continuous archiving): the route
//! answers 409 `backup_in_database` with that pointer.
//!
//! It owns the route, the stream and its framing; the walk is
//! `store::backup`'s, the client `cli::store`'s.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use overseer_actors::store::StoreError;
use tokio::sync::mpsc;

use super::extract::{Admin, Authorized};
use super::{ApiError, AppState};
use crate::store::backup::{self, StreamLine, BACKUP_FORMAT};

/// The content type of the backup stream.
pub const NDJSON: &str = "application/x-ndjson";

/// Lines buffered between the walk and the connection: the walk waits for
/// a slow client instead of holding the store in memory.
const BUFFERED_LINES: usize = 8;

/// Why a walk stopped early.
enum Stop {
    Store(StoreError),
    /// The client went away: nothing to report to.
    Gone,
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

fn line(line: &StreamLine) -> Bytes {
    // Only derived `Serialize` of plain data: cannot fail; an empty line
    // (which the client reports as unreadable) if it ever did.
    let mut bytes = serde_json::to_vec(line).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// `POST /v1/admin/backup` → 200 and the backup stream.
#[utoipa::path(
    post, path = "/v1/admin/backup", tag = "operations",
    responses(
        (status = 200, description = "The backup stream: one JSON object per line (a header naming the format, the records, a trailer)", content_type = "application/x-ndjson", body = String),
        (status = 409, description = "Cluster mode: back the database up with pg_dump", body = crate::http::openapi::schemas::ErrorBody)
    ),
    security(("bearer" = ["admin"]))
)]
pub(super) async fn backup(
    State(state): State<AppState>,
    Authorized(principal, _): Authorized<Admin>,
) -> Result<Response, ApiError> {
    if state.inner.options.cluster.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "backup_in_database",
            "this server keeps its sessions in PostgreSQL: back the database up with pg_dump, or \
             with continuous archiving for point-in-time recovery (docs: operations, backup and \
             restore)",
        ));
    }
    let store = state.overseer().store().clone();
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(BUFFERED_LINES);
    let started_at = backup::now();
    tracing::info!(sub = %principal.sub, tenant = %principal.tenant, "backup started");
    tokio::spawn(async move {
        let begin = StreamLine::Begin {
            format: BACKUP_FORMAT,
            started_at,
        };
        if tx.send(Ok(line(&begin))).await.is_err() {
            return;
        }
        let walked = backup::walk(&*store, |copy| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(line(&StreamLine::Session(Box::new(copy)))))
                    .await
                    .map_err(|_| Stop::Gone)
            }
        })
        .await;
        let last = match walked {
            Ok((sessions, events)) => {
                tracing::info!(sessions, events, "backup streamed");
                StreamLine::End { sessions, events }
            }
            Err(Stop::Gone) => {
                tracing::warn!("backup stopped: the client went away");
                return;
            }
            Err(Stop::Store(e)) => {
                tracing::error!(error = %e, "backup failed");
                StreamLine::Error {
                    message: e.to_string(),
                }
            }
        };
        let _ = tx.send(Ok(line(&last))).await;
    });
    Ok((
        [(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON))],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response())
}
