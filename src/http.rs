//! The HTTP API on axum: routes, the shared application state, and
//! [`serve`] with graceful shutdown.
//!
//! This module owns the wire: JSON shapes, status codes (the rule is in
//! [`error`]), authentication and scope checks per route, tenant isolation
//! (another tenant's session is a 404 everywhere), request-body limits, CORS
//! and Server-Sent Events. It deliberately holds no session logic: every
//! request becomes one call on the [`Overseer`] handle, and the handle's
//! answer (or [`SessionError`](overseer_actors::SessionError)) becomes the
//! response. It does not own the process either: signals, config and the
//! final [`Overseer::shutdown`] belong to the caller (`overseer serve`).
//!
//! Shapes: `GET /v1/sessions/{id}` and the 201 of a create answer the
//! session header's fields plus its `transcript`; list rows, cancel, done,
//! interrupt, model and rules answer the header alone (acting on a long session does not ship its
//! history back); approvals answer `{session_id, status, pending: [...]}`,
//! each pending call and each inbox card with the `warnings` of the
//! rendering rule ([`crate::render`]) beside its raw data.
//!
//! Scopes per route: reads (`GET` of sessions, tree, approvals, events,
//! agents, and the tenant-wide `/v1/approvals`, `/v1/decisions` and
//! `/v1/events`) need `sessions:read`; `/v1/me` (who the token is and what
//! it may do) needs a valid token only; create, message, cancel, done, interrupt and model
//! need `sessions:write`; deciding approvals and setting a session's
//! standing rule for a tool (`POST /v1/sessions/{id}/rules`) need
//! `approvals:write`; stored tasks, skills and forks: `GET /v1/tasks`
//! and `GET /v1/sessions/{id}/history` need `sessions:read`, `POST
//! /v1/tasks/{id}/runs`, `POST /v1/sessions/{id}/skills` and `POST
//! /v1/sessions/{id}/fork` `sessions:write`; the webhook routes
//! (`/v1/webhooks`, reads included) need `webhooks:write`;
//! `admin` implies all four. `admin` does not cross tenants, except on the
//! operator routes that are about the whole server: `/metrics` and
//! `POST /v1/admin/backup` (every tenant's sessions, streamed; `admin`). `/healthz`,
//! `/readyz` and the approval inbox's page (`/`, `/ui/*`: static files, no
//! data) are unauthenticated. `/metrics` needs `admin` unless
//! [`HttpOptions::metrics_public`] (why: see the `metrics` submodule).
//!
//! `/readyz` is 200 only once recovery has finished *and* the store takes a
//! write now ([`health_check`]), so a server whose disk fails is taken out
//! of rotation rather than failing every request. Being unauthenticated, it
//! answers a stable code and message; the store's own error goes to the log.
//!
//! Under the router, `conn` owns the connections (HTTP/1.1 only: timeouts,
//! the connection cap, shutdown with a deadline, JSON bodies for the errors
//! hyper answers itself) and `admission` what every request passes before
//! routing (the in-flight cap, the URI limit, the body deadline). The limits
//! are [`HttpLimits`]. In cluster mode `routing` sends a session's requests
//! to the node that owns it (deadline, breaker and budget of its own).
//!
//! [`health_check`]: overseer_actors::store::CheckpointStore::health_check

mod admin;
mod admission;
mod conn;
mod decisions;
mod error;
mod events;
mod extract;
mod fork;
mod idempotency;
pub(crate) mod inbox;
mod me;
mod metrics;
pub mod openapi;
mod routing;
mod sessions;
mod skills;
mod tasks;
mod tenant_events;
pub mod tls;
mod ui;
mod webhooks;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use overseer_actors::model::SessionId;
use overseer_actors::store::StoreError;
use overseer_actors::{Overseer, SessionError};
use serde_json::json;
use tokio::sync::{watch, Semaphore};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use error::{ApiError, NotOwnerResponse};
pub use routing::{
    forward_deadline, is_loopback_url, secure_enough, ForwardOptions, Routing, NODE_HEADER,
};
pub(crate) use sessions::session_json;

use crate::auth::AuthConfig;
use idempotency::{Digest32, IdempotencyLog, DEFAULT_CAPACITY};

/// The body limit: bodies over 1 MiB are refused with 413.
pub const BODY_LIMIT_BYTES: usize = 1024 * 1024;

/// Longest request target (path and query) accepted; longer is a 414.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Largest request head (request line and headers) accepted; larger is a 431.
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// Most header fields in a request; more is a 431.
pub const MAX_HEADERS: usize = 100;

/// Upper bound of `max_connections` and `max_in_flight_requests` (far above
/// what one process serves; it keeps permit arithmetic in range).
pub const MAX_COUNT_LIMIT: usize = 65_535;

/// Tunables of the HTTP edge.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Origins allowed by CORS. Empty (the default) disables CORS entirely;
    /// `"*"` allows any origin. Each entry is an origin such as
    /// `https://console.example.com`.
    pub cors_allow_origins: Vec<String>,
    /// Serve `GET /metrics` without authentication even when auth is on
    /// (for a scraper on a private network). Off by default: a scrape then
    /// needs a token with the `admin` scope.
    pub metrics_public: bool,
    /// Timeouts and caps of connections and requests.
    pub limits: HttpLimits,
    /// Cluster mode: requests about a session go to the node that
    /// owns it. `None` on a single node.
    pub cluster: Option<Routing>,
    /// Model routes a session may be created with or switched to besides
    /// the ones agents use (`overseer serve` passes the `[[models]]` names).
    pub model_routes: Vec<String>,
    /// Webhooks: the `/v1/webhooks` routes answer 404 without them.
    pub webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    /// TLS on the listener (`tls`); `None`: plain HTTP/1.1.
    pub tls: Option<Arc<tls::Tls>>,
}

/// How long the server waits for a client and how much it takes at once.
/// Every wait on a client is bounded, and so is everything a client can make
/// the server hold (connections, requests in flight, buffered bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// A request's head (request line and headers) must arrive within this,
    /// or the connection is closed without an answer (there is no request to
    /// answer). It also bounds how long an idle keep-alive connection waits
    /// for its next request.
    pub header_read_timeout: Duration,
    /// A request's whole body must arrive within this, or the answer is a
    /// 408 `request_timeout`.
    pub request_body_timeout: Duration,
    /// A response (or event stream) the client stops reading: once a write
    /// has made no progress for this long, the connection is closed.
    pub idle_timeout: Duration,
    /// Most open connections. At the cap the server stops accepting: new
    /// connections wait in the listen backlog until one closes (an idle or
    /// stalled one closes within the timeouts above).
    pub max_connections: usize,
    /// Most requests being handled at once (an event stream counts until its
    /// response has started; `/healthz` and `/metrics` never count). Past
    /// it: 503 `overloaded` with `Retry-After`.
    pub max_in_flight_requests: usize,
    /// After a shutdown begins, open connections get this long to finish
    /// their request; then they are dropped. Checkpoints are unaffected:
    /// what a handler had acknowledged is already durable.
    pub shutdown_grace: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            request_body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 512,
            max_in_flight_requests: 128,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl HttpLimits {
    /// Checks the limits, naming the first invalid one.
    pub fn validate(&self) -> Result<(), HttpError> {
        let durations = [
            ("header_read_timeout", self.header_read_timeout),
            ("request_body_timeout", self.request_body_timeout),
            ("idle_timeout", self.idle_timeout),
        ];
        for (name, value) in durations {
            if value.is_zero() {
                return Err(HttpError::InvalidLimit(name, "must be at least 1 s"));
            }
        }
        let counts = [
            ("max_connections", self.max_connections),
            ("max_in_flight_requests", self.max_in_flight_requests),
        ];
        for (name, value) in counts {
            if value == 0 || value > MAX_COUNT_LIMIT {
                return Err(HttpError::InvalidLimit(name, "must be between 1 and 65535"));
            }
        }
        Ok(())
    }
}

impl HttpOptions {
    /// Checks the options, naming the first invalid value.
    pub fn validate(&self) -> Result<(), HttpError> {
        self.limits.validate()?;
        self.cors_layer().map(|_| ())
    }

    fn cors_layer(&self) -> Result<Option<CorsLayer>, HttpError> {
        if self.cors_allow_origins.is_empty() {
            return Ok(None);
        }
        let origin = if self.cors_allow_origins.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            let values = self
                .cors_allow_origins
                .iter()
                .map(|o| {
                    HeaderValue::from_str(o)
                        .ok()
                        .filter(|_| o.starts_with("http://") || o.starts_with("https://"))
                        .ok_or_else(|| HttpError::InvalidOrigin(o.clone()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            AllowOrigin::list(values)
        };
        Ok(Some(
            CorsLayer::new()
                .allow_origin(origin)
                .allow_methods([Method::GET, Method::POST, Method::DELETE])
                .allow_headers([
                    header::AUTHORIZATION,
                    header::CONTENT_TYPE,
                    HeaderName::from_static("last-event-id"),
                ]),
        ))
    }
}

/// Why the HTTP edge refused to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// `auth = "none"` on a listener other people can reach.
    #[error("auth = \"none\" is only allowed on a loopback listener, but the server would listen on {0}; configure a JWT key (OVERSEER_JWT_SECRET or a public key) or listen on 127.0.0.1")]
    OpenListenerWithoutAuth(SocketAddr),
    /// A CORS origin that is not an `http(s)://host[:port]` header value.
    #[error("invalid CORS origin '{0}': expected e.g. https://console.example.com or \"*\"")]
    InvalidOrigin(String),
    /// A limit out of range.
    #[error("invalid HTTP limit {0}: {1}")]
    InvalidLimit(&'static str, &'static str),
}

impl From<HttpError> for std::io::Error {
    fn from(e: HttpError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// Refuses to run without auth on a non-loopback address.
pub fn check_listener(addr: SocketAddr, auth: &AuthConfig) -> Result<(), HttpError> {
    if auth.is_enabled() || addr.ip().to_canonical().is_loopback() {
        Ok(())
    } else {
        Err(HttpError::OpenListenerWithoutAuth(addr))
    }
}

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    overseer: Overseer,
    auth: AuthConfig,
    options: HttpOptions,
    ready: AtomicBool,
    shutdown_tx: watch::Sender<bool>,
    in_flight: Arc<Semaphore>,
    creates: IdempotencyLog<SessionId, SessionError>,
    /// Keyed by session and a digest of the `message_id`.
    messages: IdempotencyLog<(SessionId, Digest32), SessionError>,
    /// Per-tenant replay buffers of `GET /v1/events`.
    tenant_feeds: Arc<tenant_events::TenantFeeds>,
}

impl AppState {
    /// State with default options. Not ready until [`AppState::set_ready`].
    pub fn new(overseer: Overseer, auth: AuthConfig) -> Self {
        Self::with_options(overseer, auth, HttpOptions::default())
    }

    /// State with the given options. Not ready until [`AppState::set_ready`].
    pub fn with_options(overseer: Overseer, auth: AuthConfig, options: HttpOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                overseer,
                auth,
                in_flight: Arc::new(Semaphore::new(
                    options
                        .limits
                        .max_in_flight_requests
                        .clamp(1, MAX_COUNT_LIMIT),
                )),
                options,
                ready: AtomicBool::new(false),
                shutdown_tx: watch::channel(false).0,
                creates: IdempotencyLog::new(DEFAULT_CAPACITY),
                messages: IdempotencyLog::new(DEFAULT_CAPACITY),
                tenant_feeds: Arc::default(),
            }),
        }
    }

    /// The in-process API.
    pub fn overseer(&self) -> &Overseer {
        &self.inner.overseer
    }

    /// How callers are authenticated.
    pub fn auth(&self) -> &AuthConfig {
        &self.inner.auth
    }

    /// Marks recovery finished (`/readyz` answers 200 from now on).
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::SeqCst)
    }

    /// Ends every open event stream (so a graceful shutdown is not held
    /// open by clients that would otherwise listen forever) and marks the
    /// server not ready.
    pub fn begin_shutdown(&self) {
        self.set_ready(false);
        self.inner.shutdown_tx.send_replace(true);
    }

    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.inner.shutdown_tx.subscribe()
    }

    pub(crate) fn limits(&self) -> &HttpLimits {
        &self.inner.options.limits
    }

    /// Every model route a session may use: the agents' own and the extra
    /// configured ones, sorted, without repeats.
    pub(crate) fn model_routes(&self) -> Vec<&str> {
        let mut routes: Vec<&str> = self
            .overseer()
            .agents()
            .map(|a| a.model.as_str())
            .chain(self.inner.options.model_routes.iter().map(String::as_str))
            .collect();
        routes.sort_unstable();
        routes.dedup();
        routes
    }

    pub(crate) fn in_flight(&self) -> &Arc<Semaphore> {
        &self.inner.in_flight
    }

    pub(crate) fn creates(&self) -> &IdempotencyLog<SessionId, SessionError> {
        &self.inner.creates
    }

    pub(crate) fn messages(&self) -> &IdempotencyLog<(SessionId, Digest32), SessionError> {
        &self.inner.messages
    }

    pub(crate) fn tenant_feeds(&self) -> &Arc<tenant_events::TenantFeeds> {
        &self.inner.tenant_feeds
    }

    pub(crate) fn webhooks(&self) -> Option<&Arc<crate::webhooks::Webhooks>> {
        self.inner.options.webhooks.as_ref()
    }
}

/// Every route with its OpenAPI operation: the router serves what the
/// handlers' `#[utoipa::path]` attributes declare, and the document
/// ([`openapi::document`]) is made of the same attributes. A route must be
/// added here through `routes!` (never `.route`), or it would be served
/// undocumented; `tests/openapi.rs` guards that.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(ui::index))
        .routes(routes!(ui::asset))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics::metrics))
        .routes(routes!(openapi::serve_document))
        .routes(routes!(sessions::agents))
        .routes(routes!(sessions::list, sessions::create))
        .routes(routes!(sessions::show))
        .routes(routes!(sessions::tree))
        .routes(routes!(sessions::message))
        .routes(routes!(sessions::pending, sessions::decide))
        .routes(routes!(sessions::cancel))
        .routes(routes!(sessions::done))
        .routes(routes!(sessions::interrupt))
        .routes(routes!(sessions::set_model))
        .routes(routes!(sessions::set_rule))
        .routes(routes!(events::stream))
        .routes(routes!(skills::activate))
        .routes(routes!(fork::fork))
        .routes(routes!(fork::history))
        .routes(routes!(tasks::list))
        .routes(routes!(tasks::run))
        .routes(routes!(inbox::list))
        .routes(routes!(decisions::list))
        .routes(routes!(me::me))
        .routes(routes!(admin::backup))
        .routes(routes!(tenant_events::stream))
        .routes(routes!(webhooks::list, webhooks::create))
        .routes(routes!(webhooks::show, webhooks::delete))
        .routes(routes!(webhooks::deliveries))
        .routes(routes!(webhooks::enable))
        .routes(routes!(webhooks::rotate))
}

/// The API's routes over `state`. Invalid CORS origins are skipped with an
/// error log here; [`serve`] refuses them up front.
pub fn router(state: AppState) -> Router {
    let cors = match state.inner.options.cors_layer() {
        Ok(layer) => layer,
        Err(e) => {
            tracing::error!(error = %e, "CORS disabled");
            None
        }
    };
    let (router, _) = routes().split_for_parts();
    let router = router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES));
    // Inside admission (in-flight cap, body read), before the handlers.
    let router = match state.inner.options.cluster.clone() {
        Some(routing) => router.layer(axum::middleware::from_fn_with_state(
            routing,
            routing::route,
        )),
        None => router,
    };
    let router =
        router
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                admission::admit,
            ))
            .layer(axum::middleware::from_fn(ui::security_headers))
            // A 5xx is logged where it is decided (a storage failure as an
            // error; a store outage by the store, once, then a reminder a
            // minute), not once more per response: during an outage every
            // request is a 503, and a line each would drown the log.
            .layer(TraceLayer::new_for_http().on_failure(
                tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
            ))
            .with_state(state);
    match cors {
        Some(cors) => router.layer(cors),
        None => router,
    }
}

/// Serves the API on `listener` until `shutdown` resolves, then stops
/// accepting, ends open event streams and gives open connections
/// [`HttpLimits::shutdown_grace`] to finish before dropping them.
///
/// `overseer` must already be recovered ([`Overseer::recover`]): the server
/// reports ready at once. The caller still owns `overseer` and should call
/// [`Overseer::shutdown`] after this returns, to stop the actors and flush
/// the store. Refuses [`AuthConfig::None`] on a non-loopback address.
pub async fn serve(
    overseer: Overseer,
    listener: tokio::net::TcpListener,
    auth: AuthConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(overseer, listener, auth, HttpOptions::default(), shutdown).await
}

/// [`serve`] with options (CORS, limits).
pub async fn serve_with(
    overseer: Overseer,
    listener: tokio::net::TcpListener,
    auth: AuthConfig,
    options: HttpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    check_listener(addr, &auth)?;
    options.validate()?;
    let limits = options.limits.clone();
    let tls = options.tls.as_ref().map(|t| t.acceptor());
    let state = AppState::with_options(overseer, auth, options);
    state.set_ready(true);
    let app = router(state.clone());
    tracing::info!(%addr, tls = tls.is_some(), "overseer API listening");
    conn::serve_connections(listener, app, &limits, &state, tls, shutdown).await;
    Ok(())
}

#[utoipa::path(
    get, path = "/healthz", tag = "operations",
    responses(
        (status = 200, description = "The process is alive", body = crate::http::openapi::schemas::Health)
    )
)]
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// How long `/readyz` waits for the store's health check. A store that takes
/// longer than this to accept one small write is not ready for traffic.
const STORE_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[utoipa::path(
    get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Recovered, and the store takes a write", body = crate::http::openapi::schemas::Health),
        (status = 503, description = "Recovering or shutting down (`not_ready`), or the store does not take writes (`store_unavailable`, with `details.reason`)", body = crate::http::openapi::schemas::ErrorBody)
    )
)]
async fn readyz(State(state): State<AppState>) -> Response {
    if !state.is_ready() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the server is recovering sessions or shutting down",
        )
        .into_response();
    }
    let store = state.overseer().store().clone();
    let (reason, why) = match tokio::time::timeout(STORE_CHECK_TIMEOUT, store.health_check()).await
    {
        Ok(Ok(())) => return Json(json!({"status": "ready"})).into_response(),
        Ok(Err(e)) => {
            if e.is_unavailable() {
                // The store reports its own outage (a warning, then a
                // reminder a minute): probes every few seconds add nothing.
                tracing::debug!(error = %e, "not ready: the store is unavailable");
            } else {
                tracing::warn!(error = %e, "not ready: store check failed");
            }
            outage_reason(&e)
        }
        Err(_) => {
            tracing::warn!(
                "not ready: the store did not complete a write within {} s",
                STORE_CHECK_TIMEOUT.as_secs()
            );
            ("slow", "the store did not complete a write in time")
        }
    };
    // The route is unauthenticated: the store's own error (paths, OS error
    // texts) is for the operator's log; whoever asks gets the kind of
    // problem only.
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        format!(
            "the store does not take writes: {why}; it recovers on its own once that is fixed \
             (details in the server log)"
        ),
    )
    .with_details(json!({
        "reason": reason,
        "retry_after_secs": crate::http::error::STORE_RETRY_AFTER_SECS,
    }))
    .into_response()
}

/// The kind of problem behind a failed store check, as a stable code and a
/// sentence that reveals no path or OS text: `/readyz` answers anyone.
fn outage_reason(e: &StoreError) -> (&'static str, &'static str) {
    let text = e.to_string();
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    if has(&[
        "No space left on device",
        "StorageFull",
        "os error 28",
        "code: 28,",
    ]) {
        ("disk_full", "the disk is full")
    } else if has(&["Disk quota exceeded", "os error 122", "code: 122,"]) {
        ("disk_quota", "the disk quota is exceeded")
    } else if has(&["Read-only file system", "os error 30", "code: 30,"]) {
        ("read_only", "the file system is read-only")
    } else if has(&["Input/output error", "os error 5)", "code: 5,"]) {
        ("io_error", "the disk reports I/O errors")
    } else if let StoreError::Unavailable(_) = e {
        ("unavailable", "the store cannot be reached or written")
    } else {
        ("write_failed", "a test write failed")
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
