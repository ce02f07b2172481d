//! `GET /v1/me`: who the caller's token says it is (subject, tenant) and
//! what it may do, so that a client (the inbox page) offers only what the
//! server would accept: a `sessions:read` token without `approvals:write`
//! gets no decide buttons.
//!
//! It needs a valid token and no particular scope. It deliberately grants
//! nothing: every other route still checks its own scope.

use axum::Json;
use serde_json::{json, Value};

use super::extract::Auth;
use super::ApiError;
use crate::auth::Scope;

/// `GET /v1/me` → `{sub, tenant, scopes, may: {read, write, decide, admin}}`.
#[utoipa::path(
    get, path = "/v1/me", tag = "tenant",
    responses(
        (status = 200, description = "Who the token is and what it may do", body = crate::http::openapi::schemas::Me)
    ),
    security(("bearer" = []))
)]
pub(super) async fn me(Auth(principal): Auth) -> Result<Json<Value>, ApiError> {
    let may = |scope| principal.require(scope).is_ok();
    Ok(Json(json!({
        "sub": principal.sub,
        "tenant": principal.tenant,
        "scopes": principal.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "may": {
            "read": may(Scope::SessionsRead),
            "write": may(Scope::SessionsWrite),
            "decide": may(Scope::ApprovalsWrite),
            "admin": may(Scope::Admin),
        },
    })))
}
