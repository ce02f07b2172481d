//! Routing of API requests to the node that owns the session (§15).
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
//! The node credential is a short-lived HS256 token signed with a secret
//! the nodes share through the database (only nodes can read it); it only
//! marks a request as coming from a node. The caller's own token is still
//! what the owner authenticates and authorises.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use overseer_actors::model::SessionId;
use overseer_actors::Overseer;
use serde::{Deserialize, Serialize};

use crate::http::{ApiError, NotOwnerResponse};
use crate::store::postgres::{Owner, PgStore};

/// The header carrying a node credential on forwarded requests.
pub const NODE_HEADER: &str = "x-overseer-node";

/// How long a node credential is valid.
const CREDENTIAL_TTL_SECS: u64 = 60;

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
}

impl std::fmt::Debug for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routing")
            .field("node", &self.inner.store.node_id())
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

impl Routing {
    pub(super) fn new(
        store: PgStore,
        overseer: Overseer,
        secret: &[u8],
        timeout: Duration,
    ) -> Result<Self, String> {
        let encoding =
            EncodingKey::from_secret(secret).map_err(|e| format!("node credential key: {e}"))?;
        let decoding =
            DecodingKey::from_secret(secret).map_err(|e| format!("node credential key: {e}"))?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(2))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("HTTP client for forwarding: {e}"))?;
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                overseer,
                encoding,
                decoding,
                validation,
                client,
            }),
        })
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

    /// Sends the request to the owner at `url` and returns its answer.
    async fn forward(
        &self,
        id: SessionId,
        url: &str,
        parts: &axum::http::request::Parts,
        body: Bytes,
    ) -> Response {
        let target = format!(
            "{}{}",
            url.trim_end_matches('/'),
            parts.uri.path_and_query().map_or("/", |p| p.as_str())
        );
        let credential = match self.credential() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot mint a node credential");
                return unreachable(id);
            }
        };
        let mut headers = without_hop_by_hop(&parts.headers);
        headers.remove(NODE_HEADER);
        let sent = self
            .inner
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
                match resp.bytes().await {
                    Ok(bytes) => Some((status, headers, bytes)),
                    Err(e) => {
                        tracing::warn!(session_id = %id, %url, error = %e, "the owner's answer broke off");
                        None
                    }
                }
            }
            Err(e) => {
                tracing::warn!(session_id = %id, %url, error = %e, "cannot reach the session's owner");
                None
            }
        };
        let Some((status, headers, bytes)) = answer else {
            metrics::counter!(
                overseer_actors::metrics::CLUSTER_FORWARDED_REQUESTS_TOTAL,
                "outcome" => "unreachable"
            )
            .increment(1);
            return unreachable(id);
        };
        metrics::counter!(
            overseer_actors::metrics::CLUSTER_FORWARDED_REQUESTS_TOTAL,
            "outcome" => "ok"
        )
        .increment(1);
        let mut response = Response::new(Body::from(bytes));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}

/// The 503 when the owner did not answer (it may have just died: once its
/// lease runs out, a retry is served by whichever node receives it).
fn unreachable(id: SessionId) -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "owner_unreachable",
        format!("the node that owns session {id} did not answer; retry shortly"),
    )
    .into_response()
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
pub(crate) async fn route(
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
    let body = match axum::body::to_bytes(body, crate::http::BODY_LIMIT_BYTES).await {
        Ok(b) => b,
        Err(_) => return ApiError::payload_too_large().into_response(),
    };
    let inner = &routing.inner;
    let here = inner.overseer.runtime().live.contains_key(&id) && inner.store.lease_valid();
    if !here {
        match inner.store.owner(id).await {
            Ok(Owner::Node { url, .. }) => return routing.forward(id, &url, &parts, body).await,
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
        Ok(Owner::Node { url, .. }) => routing.forward(id, &url, &parts, body).await,
        _ => response,
    }
}
