//! The OpenAPI 3.1 document of the HTTP API, generated from the code:
//! every handler carries a `#[utoipa::path]` attribute (its method, path,
//! parameters, body, responses and scopes) and the router is built from
//! those attributes (`utoipa_axum::routes!` in [`super::routes`]), so a
//! route cannot be served without being in the document. Served at
//! `GET /openapi.json` (unauthenticated: it describes shapes, holds no
//! data, and clients generating code need it before they hold a token)
//! and printed by `overseer openapi`.
//!
//! This module owns the document's frame (info, the `bearer` security
//! scheme, the error shape) and the responses every route shares, added in
//! [`document`] from what each operation declares: 401 where a token is
//! required, 403 where a scope is, the body errors (400, 408, 413, 415)
//! on every POST and DELETE, the edge's 414 and 431 everywhere, the
//! in-flight cap's 503 and the 500 of an internal failure. The scopes
//! are the security requirement of each operation (`bearer` with the scope
//! as its role, as OpenAPI 3.1 allows for non-OAuth schemes).
//!
//! `schemas` holds types that exist only to describe bodies the handlers
//! build as JSON values (lists, the webhook views); the domain types
//! (`SessionHeader`, transcript entries, events, decisions) derive their
//! schemas where they are defined. It deliberately decides no status or
//! shape itself: the handlers do, and the contract tests
//! (`tests/openapi.rs`, `tests/common/contract.rs`) hold every response the
//! test suite receives to this document.

pub(super) mod schemas;

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, ResponseBuilder};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "overseer",
        description = "A supervised actor tree hosting many concurrent LLM agent sessions. \
                       Errors are `{\"error\": {\"code\", \"message\", \"details\"?}}`; \
                       scopes are the roles of the `bearer` (JWT) requirement. Another method on a path \
                       answers 405, another path 404, both in the error shape."
    ),
    components(schemas(schemas::ErrorBody)),
    tags(
        (name = "sessions", description = "Sessions, their messages, approvals and controls"),
        (name = "tenant", description = "Tenant-wide views: the approval inbox, decisions, events, the caller"),
        (name = "library", description = "Stored tasks, skills and forks"),
        (name = "webhooks", description = "Webhook endpoints and their deliveries"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
        (name = "ui", description = "The approval inbox's page (static files)")
    )
)]
pub(super) struct ApiDoc;

/// The document: the routes' operations plus the responses they share.
pub fn document() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = super::routes().split_for_parts();
    frame(&mut doc);
    doc
}

/// The document as pretty JSON (what `/openapi.json` serves and
/// `overseer openapi` prints), built once.
pub fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        // The document is plain data (string keys): serializing it cannot
        // fail; an empty object stands in rather than a panic path.
        serde_json::to_string_pretty(&document()).unwrap_or_else(|_| String::from("{}"))
    })
}

/// `GET /openapi.json`.
#[utoipa::path(
    get, path = "/openapi.json", tag = "operations",
    responses(
        (status = 200, description = "This document (OpenAPI 3.1)", content_type = "application/json", body = Object)
    )
)]
pub(super) async fn serve_document() -> axum::response::Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document_json(),
    )
        .into_response()
}

/// The shared responses, named in `components.responses`.
const SHARED: &[(&str, &str, &str)] = &[
    (
        "400",
        "BadRequest",
        "The request cannot be accepted as written (body, query, path or a header): the message names what is wrong",
    ),
    (
        "401",
        "Unauthorized",
        "No token, or a token that is malformed, expired or not signed by a trusted key (`WWW-Authenticate: Bearer`)",
    ),
    ("403", "Forbidden", "The token lacks the scope this route needs"),
    ("408", "RequestTimeout", "The request body did not arrive in time"),
    ("413", "PayloadTooLarge", "The body exceeds 1 MiB, or a field its limit"),
    ("414", "UriTooLong", "The request target (path and query) exceeds 8 KiB"),
    ("415", "UnsupportedMediaType", "A body without `Content-Type: application/json`"),
    ("431", "HeadersTooLarge", "The request head exceeds 32 KiB or 100 header fields"),
    (
        "500",
        "Internal",
        "An internal failure (a corrupt record, a bug); nothing was applied",
    ),
    (
        "503",
        "Unavailable",
        "The server is over its in-flight limit, the session or store is unavailable, or (cluster) the session cannot be written on this node now; always with `Retry-After`",
    ),
];

fn shared(status: &str) -> RefOr<utoipa::openapi::Response> {
    let name = SHARED
        .iter()
        .find(|(s, _, _)| *s == status)
        .map_or("Internal", |(_, name, _)| name);
    RefOr::Ref(Ref::from_response_name(name))
}

/// Adds the security scheme, the shared responses, and to each operation
/// the responses of the edge it passes through.
fn frame(doc: &mut utoipa::openapi::OpenApi) {
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("JWT")
                .description(Some(
                    "A JWT (HS256 secret, a public key or a JWKS): `sub`, `tenant` and `scope` \
                     (space-separated: sessions:read, sessions:write, approvals:write, \
                     webhooks:write, admin)",
                ))
                .build(),
        ),
    );
    for (_, name, description) in SHARED {
        components.responses.insert(
            (*name).to_owned(),
            RefOr::T(
                ResponseBuilder::new()
                    .description(*description)
                    .content(
                        "application/json",
                        Content::new(Some(Ref::from_schema_name("ErrorBody"))),
                    )
                    .build(),
            ),
        );
    }
    unique_operation_ids(doc);
    for (path, item) in doc.paths.paths.iter_mut() {
        let unmetered = path == "/healthz" || path == "/metrics";
        let api = path.starts_with("/v1/");
        // POST and DELETE read a body even when they take no parameters
        // (an empty one, or `{}`): its errors apply to them all.
        if let Some(op) = item.post.as_mut() {
            edge_responses(op, unmetered, api, true);
        }
        if let Some(op) = item.delete.as_mut() {
            edge_responses(op, unmetered, api, true);
        }
        for op in [item.get.as_mut(), item.put.as_mut(), item.patch.as_mut()]
            .into_iter()
            .flatten()
        {
            edge_responses(op, unmetered, api, false);
        }
    }
}

/// Operation ids are the handlers' names; several modules have a `list`
/// or a `stream`, so a name used more than once gets its path appended
/// (`list_v1_sessions`): generated clients need them unique.
fn unique_operation_ids(doc: &mut utoipa::openapi::OpenApi) {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for item in doc.paths.paths.values() {
        for op in operations(item) {
            if let Some(id) = &op.operation_id {
                *seen.entry(id.clone()).or_default() += 1;
            }
        }
    }
    for (path, item) in doc.paths.paths.iter_mut() {
        let suffix: String = path
            .split('/')
            .filter(|s| !s.is_empty() && !s.starts_with('{'))
            .map(|s| s.replace(['.', '-'], "_"))
            .collect::<Vec<_>>()
            .join("_");
        for op in operations_mut(item) {
            if let Some(id) = op.operation_id.as_mut() {
                if seen.get(id.as_str()).is_some_and(|n| *n > 1) {
                    *id = format!("{id}_{suffix}");
                }
            }
        }
    }
}

fn operations(item: &utoipa::openapi::PathItem) -> impl Iterator<Item = &Operation> {
    [&item.get, &item.post, &item.delete, &item.put, &item.patch]
        .into_iter()
        .flatten()
}

fn operations_mut(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        item.get.as_mut(),
        item.post.as_mut(),
        item.delete.as_mut(),
        item.put.as_mut(),
        item.patch.as_mut(),
    ]
    .into_iter()
    .flatten()
}

fn edge_responses(op: &mut Operation, unmetered: bool, api: bool, reads_body: bool) {
    let security = serde_json::to_value(&op.security).unwrap_or_default();
    let needs_token = security.as_array().is_some_and(|reqs| {
        !reqs
            .iter()
            .any(|r| r.as_object().is_some_and(|o| o.is_empty()))
    });
    let scoped = security.as_array().is_some_and(|reqs| {
        reqs.iter().any(|r| {
            r.get("bearer")
                .and_then(|s| s.as_array())
                .is_some_and(|s| !s.is_empty())
        })
    });
    let mut add = |status: &str| {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| shared(status));
    };
    if needs_token || scoped {
        add("401");
    }
    if scoped {
        add("403");
    }
    // Refused before routing, on any route.
    add("414");
    add("431");
    if reads_body || op.request_body.is_some() {
        for status in ["400", "408", "413", "415"] {
            add(status);
        }
    }
    if !unmetered {
        add("503");
    }
    if api {
        add("500");
    }
}
