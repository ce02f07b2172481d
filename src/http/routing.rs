//! Routing of API requests to the node that owns the session (cluster
//! mode).
//!
//! An axum middleware in front of the session routes (`/v1/sessions/{id}`
//! and everything under it but `/events`, which any node serves from the
//! store and the relay). For each request it asks who owns the session's
//! tree: this node, nobody, or a dead node → served here (an activation here
//! claims it); another live node → forwarded to it over its own HTTP API,
//! with the caller's headers and body untouched plus a node credential, and
//! its answer (status, headers, body) returned as it is, so the caller sees
//! exactly what a single node would answer, idempotency included. A
//! forwarded request is never forwarded again. If a request served here
//! finds that the session moved meanwhile (nothing was written, the answer
//! is a `not_owner` 503), it is forwarded to the new owner once.
//!
//! A hung owner must not take this node down with it, so forwarding is
//! bounded three ways:
//!
//! - **A deadline below the lease** ([`forward_deadline`]): an owner that
//!   has not answered by then is answered for with 503 `owner_unreachable`
//!   (the caller retries; by the time the lease runs out another node owns
//!   the session).
//! - **A breaker per owner** (`breaker`): after a forward to a node got no
//!   answer, forwards to it fail fast (the same 503, with `Retry-After` set
//!   to the rest of the cool-down, one heartbeat) until a probe answers.
//! - **A budget of its own**: a forward holds a slot of
//!   `cluster.max_in_flight_forwards` while it waits on the owner, and gives
//!   back the slot of local work it was admitted with
//!   ([`AdmissionSlot`](super::admission::AdmissionSlot)); past that budget
//!   the answer is 503 `overloaded` at once. So forwards piling up on a slow
//!   owner never starve this node's own sessions, and neither budget holds
//!   up `/healthz`, `/readyz` or `/metrics` (admission never counts them).
//!
//! Over a network, nodes talk HTTPS: a node's advertise URL is `https://`
//! when it serves TLS, and `[http] ca_bundle` adds a private CA to the
//! roots forwards trust. A forward carries the caller's bearer token, so a
//! node refuses to send it over plain HTTP to a non-loopback address
//! (500 `insecure_forward`, naming `cluster.allow_plain_http`, the option
//! that allows it on a network the operator trusts).
//!
//! The node credential is a short-lived HS256 token signed with a secret
//! the nodes share through the database (only nodes can read it); it only
//! marks a request as coming from a node. The caller's own token is still
//! what the owner authenticates and authorises.
//!
//! It lives under `http` (not `cluster`) because it is a layer of this
//! router: `cluster` builds a [`Routing`] and hands it over through
//! [`HttpOptions::cluster`](super::HttpOptions::cluster), and nothing here
//! imports `cluster` back.

mod breaker;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use overseer_actors::metrics::{
    CLUSTER_FORWARDED_REQUESTS_TOTAL as FORWARDED, CLUSTER_FORWARDS_IN_FLIGHT as IN_FLIGHT,
};
use overseer_actors::model::SessionId;
use overseer_actors::Overseer;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Semaphore;
use uuid::Uuid;

use super::admission::AdmissionSlot;
use super::{ApiError, NotOwnerResponse, BODY_LIMIT_BYTES, MAX_COUNT_LIMIT};
use crate::store::postgres::{Owner, PgStore};
use breaker::Breakers;

/// The header carrying a node credential on forwarded requests.
pub const NODE_HEADER: &str = "x-overseer-node";

/// How long a node credential is valid.
const CREDENTIAL_TTL_SECS: u64 = 60;

/// The longest a forward waits for the owner when the lease leaves room:
/// an owner's own answer is bounded by its actor call timeout, and a
/// request it takes longer than this over is better retried.
const MAX_FORWARD_DEADLINE: Duration = Duration::from_secs(35);

/// How long a forward may wait for the owner's whole answer: `requested`
/// (the owner's call timeout plus a margin), but never more than half the
/// lease (and at least 1 s), so a caller whose owner hung learns it, and
/// retries, well before the lease runs out and the session moves.
pub fn forward_deadline(requested: Duration, lease: Duration) -> Duration {
    requested
        .min(MAX_FORWARD_DEADLINE)
        .min(lease / 2)
        .max(Duration::from_secs(1))
}

/// How a node forwards requests to owners.
#[derive(Debug, Clone)]
pub struct ForwardOptions {
    /// The deadline asked for (capped by [`forward_deadline`]).
    pub deadline: Duration,
    /// Most forwards waiting on owners at once.
    pub max_in_flight: usize,
    /// How long an owner that did not answer is not tried again (the
    /// heartbeat interval: by then it has heartbeat again, or not).
    pub cooldown: Duration,
    /// Extra trusted CA certificates (PEM) for owners' `https://` URLs.
    pub ca_bundle: Option<Vec<u8>>,
    /// Forward over plain HTTP to non-loopback owners too
    /// (`cluster.allow_plain_http`).
    pub allow_plain_http: bool,
}

/// The router. Cheap to clone.
#[derive(Clone)]
pub struct Routing {
    inner: Arc<Inner>,
}

struct Inner {
    store: PgStore,
    overseer: Overseer,
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    client: reqwest::Client,
    deadline: Duration,
    forwards: Arc<Semaphore>,
    max_forwards: usize,
    breakers: Breakers,
    allow_plain_http: bool,
}

impl std::fmt::Debug for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routing")
            .field("node", &self.inner.store.node_id())
            .field("deadline", &self.inner.deadline)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct NodeClaims {
    sub: String,
    iat: u64,
    exp: u64,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Why a forward got no answer from the owner.
enum Unanswered {
    /// Nothing was sent: the owner's breaker is open.
    BreakerOpen { retry_after: Duration },
    /// Sent, and no (whole) answer within the deadline.
    NoAnswer { retry_after: Duration },
}

impl Routing {
    /// A router for the node of `store`, signing node credentials with
    /// `secret`.
    pub fn new(
        store: PgStore,
        overseer: Overseer,
        secret: &[u8],
        options: ForwardOptions,
    ) -> Result<Self, String> {
        let encoding =
            EncodingKey::from_secret(secret).map_err(|e| format!("node credential key: {e}"))?;
        let decoding =
            DecodingKey::from_secret(secret).map_err(|e| format!("node credential key: {e}"))?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        let deadline = forward_deadline(options.deadline, store.lease());
        let mut client = reqwest::Client::builder()
            // The whole exchange, the answer's body included.
            .timeout(deadline)
            .connect_timeout(deadline.min(Duration::from_secs(2)))
            .redirect(reqwest::redirect::Policy::none());
        if let Some(pem) = &options.ca_bundle {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("http.ca_bundle: not PEM certificates: {e}"))?;
            for cert in certs {
                client = client.add_root_certificate(cert);
            }
        }
        let client = client
            .build()
            .map_err(|e| format!("HTTP client for forwarding: {e}"))?;
        let max_forwards = options.max_in_flight.clamp(1, MAX_COUNT_LIMIT);
        metrics::gauge!(IN_FLIGHT).set(0.0);
        for outcome in [
            "ok",
            "unreachable",
            "breaker_open",
            "overloaded",
            "insecure",
        ] {
            metrics::counter!(FORWARDED, "outcome" => outcome).increment(0);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                overseer,
                encoding,
                decoding,
                validation,
                client,
                deadline,
                forwards: Arc::new(Semaphore::new(max_forwards)),
                max_forwards,
                breakers: Breakers::new(options.cooldown),
                allow_plain_http: options.allow_plain_http,
            }),
        })
    }

    /// How long a forward waits for the owner.
    pub fn deadline(&self) -> Duration {
        self.inner.deadline
    }

    fn credential(&self) -> Result<String, jsonwebtoken::errors::Error> {
        let now = now_secs();
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &NodeClaims {
                sub: self.inner.store.node_id().to_string(),
                iat: now,
                exp: now + CREDENTIAL_TTL_SECS,
            },
            &self.inner.encoding,
        )
    }

    fn verify(&self, token: &str) -> bool {
        jsonwebtoken::decode::<NodeClaims>(token, &self.inner.decoding, &self.inner.validation)
            .is_ok()
    }

    /// Sends the request to `owner` at `url` and returns its answer, or
    /// the 503 that stands for it.
    async fn forward(
        &self,
        id: SessionId,
        owner: Uuid,
        url: &str,
        parts: &axum::http::request::Parts,
        body: Bytes,
    ) -> Response {
        let inner = &self.inner;
        if !inner.allow_plain_http && !secure_enough(url) {
            tracing::error!(
                session_id = %id, node = %owner, %url,
                "refused to forward a request over plain HTTP to a non-loopback node"
            );
            metrics::counter!(FORWARDED, "outcome" => "insecure").increment(1);
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "insecure_forward",
                format!(
                    "session {id} is served by node {owner} at {url}, and this node refuses to \
                     forward the caller's bearer token to it over plain HTTP (not loopback): \
                     give the nodes https:// advertise URLs (http.tls_cert, http.tls_key), or \
                     set cluster.allow_plain_http = true on a network you trust"
                ),
            )
            .into_response();
        }
        let ticket = match inner.breakers.admit(owner, Instant::now()) {
            Ok(ticket) => ticket,
            Err(retry_after) => {
                metrics::counter!(FORWARDED, "outcome" => "breaker_open").increment(1);
                return unreachable(id, Unanswered::BreakerOpen { retry_after });
            }
        };
        let Ok(_forward_slot) = inner.forwards.clone().try_acquire_owned() else {
            metrics::counter!(FORWARDED, "outcome" => "overloaded").increment(1);
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                format!(
                    "this node is already forwarding its limit of {} requests to other nodes; retry shortly",
                    inner.max_forwards
                ),
            )
            .into_response();
        };
        // Waiting on another node is not local work: the slot this request
        // was admitted with goes back to this node's own sessions.
        if let Some(slot) = parts.extensions.get::<AdmissionSlot>() {
            slot.release();
        }
        let _counted = InFlight::start();
        let target = format!(
            "{}{}",
            url.trim_end_matches('/'),
            parts.uri.path_and_query().map_or("/", |p| p.as_str())
        );
        let credential = match self.credential() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot mint a node credential");
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "this node cannot sign requests to other nodes",
                )
                .into_response();
            }
        };
        let mut headers = without_hop_by_hop(&parts.headers);
        headers.remove(NODE_HEADER);
        let sent = inner
            .client
            .request(parts.method.clone(), &target)
            .headers(headers)
            .header(NODE_HEADER, credential)
            .body(body)
            .send()
            .await;
        let answer = match sent {
            Ok(resp) => {
                let status = resp.status();
                let headers = without_hop_by_hop(resp.headers());
                resp.bytes().await.map(|bytes| (status, headers, bytes))
            }
            Err(e) => Err(e),
        };
        let (status, headers, bytes) = match answer {
            Ok(answer) => answer,
            Err(e) => {
                let retry_after = ticket.unanswered(Instant::now());
                tracing::warn!(
                    session_id = %id, node = %owner, %url, error = %e,
                    "the session's owner did not answer; forwards to it fail fast for {} s",
                    retry_after.as_secs()
                );
                metrics::counter!(FORWARDED, "outcome" => "unreachable").increment(1);
                return unreachable(id, Unanswered::NoAnswer { retry_after });
            }
        };
        ticket.answered();
        metrics::counter!(FORWARDED, "outcome" => "ok").increment(1);
        let mut response = Response::new(Body::from(bytes));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}

/// Whether a forward to `url` keeps the caller's token off the network in
/// clear: `https://`, or any scheme to a loopback host.
pub fn secure_enough(url: &str) -> bool {
    match reqwest::Url::parse(url) {
        Ok(u) => u.scheme() == "https" || is_loopback_url(&u),
        Err(_) => false,
    }
}

/// Whether `url`'s host is a loopback address or `localhost`.
pub fn is_loopback_url(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// Counts a forward in [`IN_FLIGHT`] while it lives (also when the caller
/// goes away and the forward is dropped mid-way).
struct InFlight;

impl InFlight {
    fn start() -> Self {
        metrics::gauge!(IN_FLIGHT).increment(1.0);
        Self
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(IN_FLIGHT).decrement(1.0);
    }
}

/// The 503 when the owner did not answer, or is not asked because it did
/// not answer recently. Once its lease runs out, a retry is served by
/// whichever node receives it.
fn unreachable(id: SessionId, why: Unanswered) -> Response {
    let (message, retry_after) = match why {
        Unanswered::BreakerOpen { retry_after } => (
            format!("the node that owns session {id} stopped answering; it was not asked again"),
            retry_after,
        ),
        Unanswered::NoAnswer { retry_after } => (
            format!("the node that owns session {id} did not answer in time"),
            retry_after,
        ),
    };
    // Whole seconds, rounded up: never "retry now" while it is open.
    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let secs = secs.max(1);
    let mut response = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "owner_unreachable",
        format!("{message}; retry in {secs} s"),
    )
    .with_details(json!({ "retry_after_secs": secs }))
    .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    response
}

fn without_hop_by_hop(headers: &HeaderMap) -> HeaderMap {
    const HOP: [&str; 9] = [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    ];
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if HOP.contains(&name.as_str()) || name == header::CONTENT_LENGTH {
            continue;
        }
        out.append(HeaderName::clone(name), value.clone());
    }
    out
}

/// The session a request is about, if it is one routed to the owner.
fn routed_session(path: &str) -> Option<SessionId> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if tail == "events" {
        return None;
    }
    id.parse().ok()
}

/// The middleware.
pub(super) async fn route(
    State(routing): State<Routing>,
    request: Request,
    next: Next,
) -> Response {
    let Some(id) = routed_session(request.uri().path()) else {
        return next.run(request).await;
    };
    if let Some(value) = request.headers().get(NODE_HEADER) {
        let valid = value.to_str().is_ok_and(|t| routing.verify(t));
        if !valid {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_node_credential",
                format!("the {NODE_HEADER} header is not a valid node credential"),
            )
            .into_response();
        }
        // From another node: served here, whatever this node thinks.
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // The admission layer already read the body into memory.
    let body = match axum::body::to_bytes(body, BODY_LIMIT_BYTES).await {
        Ok(b) => b,
        Err(_) => return ApiError::payload_too_large().into_response(),
    };
    let inner = &routing.inner;
    let here = inner.overseer.is_live(id) && inner.store.lease_valid();
    if !here {
        match inner.store.owner(id).await {
            Ok(Owner::Node { id: node, url }) => {
                return routing.forward(id, node, &url, &parts, body).await
            }
            Ok(Owner::Here | Owner::Claimable | Owner::NoSession) => {}
            Err(e) => return ApiError::from(e).into_response(),
        }
    }
    let response = next
        .run(Request::from_parts(parts.clone(), Body::from(body.clone())))
        .await;
    if response.extensions().get::<NotOwnerResponse>().is_none() {
        return response;
    }
    // The session moved while this node served it; nothing was written.
    match inner.store.owner(id).await {
        Ok(Owner::Node { id: node, url }) => routing.forward(id, node, &url, &parts, body).await,
        _ => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forward_deadline_stays_below_the_lease() {
        let s = Duration::from_secs;
        // The default: call timeout 30 s + 5, lease 10 s.
        assert_eq!(forward_deadline(s(35), s(10)), s(5));
        assert_eq!(forward_deadline(s(3), s(10)), s(3));
        assert_eq!(forward_deadline(s(35), s(3)), Duration::from_millis(1_500));
        assert_eq!(forward_deadline(s(300), s(600)), MAX_FORWARD_DEADLINE);
        assert_eq!(forward_deadline(s(0), s(10)), s(1));
        for lease in 3..120 {
            assert!(
                forward_deadline(s(35), s(lease)) < s(lease),
                "lease {lease}"
            );
        }
    }

    #[test]
    fn only_a_sessions_own_routes_but_its_events_are_routed() {
        let id = SessionId(Uuid::new_v4());
        assert_eq!(routed_session(&format!("/v1/sessions/{id}")), Some(id));
        assert_eq!(
            routed_session(&format!("/v1/sessions/{id}/approvals")),
            Some(id)
        );
        assert_eq!(routed_session(&format!("/v1/sessions/{id}/events")), None);
        assert_eq!(routed_session("/v1/sessions"), None);
        assert_eq!(routed_session("/readyz"), None);
    }
}
