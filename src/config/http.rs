//! `[http]` and `[scope_tokens]`: the API server of `overseer serve` (its
//! listener, limits, TLS and how callers authenticate, with the checks of
//! those keys), and the JWTs the server sends to http tools and MCP
//! servers. It deliberately does not serve anything: `crate::http` does.

use std::path::PathBuf;
use std::time::Duration;

use super::Problem;
use crate::http::{HttpLimits, HttpOptions};
use serde::Deserialize;

/// `[scope_tokens]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeTokenSection {
    /// Env var holding the HS256 secret (at least 32 bytes). Unset variable:
    /// no token is sent.
    #[serde(default = "default_scope_secret_env")]
    pub secret_env: String,
    /// Lifetime of a token, seconds.
    #[serde(default = "default_scope_ttl")]
    pub ttl_secs: u64,
}

impl Default for ScopeTokenSection {
    fn default() -> Self {
        Self {
            secret_env: default_scope_secret_env(),
            ttl_secs: default_scope_ttl(),
        }
    }
}

fn default_scope_secret_env() -> String {
    "OVERSEER_SCOPE_TOKEN_SECRET".to_owned()
}

fn default_scope_ttl() -> u64 {
    300
}

/// How API callers authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authentication: only allowed on a loopback listener.
    None,
    /// HS256 with the secret in env `OVERSEER_JWT_SECRET`.
    #[default]
    Hs256,
    /// RS256 with the public key at `public_key_pem`.
    Rs256,
    /// ES256 with the public key at `public_key_pem`.
    Es256,
    /// The identity provider's keys, from its JWKS at `jwks_url`.
    Jwks,
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Authentication of API callers.
    #[serde(default)]
    pub auth: AuthMode,
    /// PEM public key for `rs256` / `es256`.
    #[serde(default)]
    pub public_key_pem: Option<PathBuf>,
    /// Origins allowed by CORS; empty: CORS off.
    #[serde(default)]
    pub cors_allow_origins: Vec<String>,
    /// Serve `/metrics` without a token (otherwise it needs `admin`).
    #[serde(default)]
    pub metrics_public: bool,
    /// Clock-skew leeway when checking a token's `exp` and `nbf`, seconds.
    #[serde(default = "default_jwt_leeway_secs")]
    pub jwt_leeway_secs: u64,
    /// Time for a request's head to arrive (also bounds idle keep-alive).
    #[serde(default = "default_header_read_timeout_secs")]
    pub header_read_timeout_secs: u64,
    /// Time for a request's whole body to arrive.
    #[serde(default = "default_request_body_timeout_secs")]
    pub request_body_timeout_secs: u64,
    /// A write the client does not read for this long closes the connection.
    #[serde(default = "default_idle_timeout_secs")]
    pub idle_timeout_secs: u64,
    /// Most open connections.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most requests handled at once; past it, 503 with `Retry-After`.
    #[serde(default = "default_max_in_flight_requests")]
    pub max_in_flight_requests: usize,
    /// Time open connections get to finish after SIGTERM before being dropped.
    #[serde(default = "default_shutdown_grace_secs")]
    pub shutdown_grace_secs: u64,
    /// PEM certificate chain: serve HTTPS (with `tls_key`).
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// Extra trusted CA certificates (PEM) for this server's own HTTPS
    /// requests: to other nodes (cluster) and to `jwks_url`.
    #[serde(default)]
    pub ca_bundle: Option<PathBuf>,
    /// The identity provider's JWKS URL (`auth = "jwks"`).
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// An unknown `kid` fetches the JWKS again at most once per this many
    /// seconds.
    #[serde(default = "default_jwks_min_refresh_secs")]
    pub jwks_min_refresh_secs: u64,
    /// The `iss` every token must carry (any token mode).
    #[serde(default)]
    pub issuer: Option<String>,
    /// An `aud` every token must carry (any token mode).
    #[serde(default)]
    pub audience: Option<String>,
    /// The claim holding the tenant.
    #[serde(default = "default_tenant_claim")]
    pub tenant_claim: String,
    /// The claim holding the scopes (space-separated string or array).
    #[serde(default = "default_scopes_claim")]
    pub scopes_claim: String,
}

/// Shortest `http.jwks_min_refresh_secs`: below it, tokens with made-up key
/// ids could make the server fetch the key set many times a second.
pub const MIN_JWKS_REFRESH_SECS: u64 = 1;

fn default_jwks_min_refresh_secs() -> u64 {
    60
}
fn default_tenant_claim() -> String {
    "tenant".to_owned()
}
fn default_scopes_claim() -> String {
    "scopes".to_owned()
}

impl Default for HttpSection {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            auth: AuthMode::default(),
            public_key_pem: None,
            cors_allow_origins: Vec::new(),
            metrics_public: false,
            jwt_leeway_secs: default_jwt_leeway_secs(),
            header_read_timeout_secs: default_header_read_timeout_secs(),
            request_body_timeout_secs: default_request_body_timeout_secs(),
            idle_timeout_secs: default_idle_timeout_secs(),
            max_connections: default_max_connections(),
            max_in_flight_requests: default_max_in_flight_requests(),
            shutdown_grace_secs: default_shutdown_grace_secs(),
            tls_cert: None,
            tls_key: None,
            ca_bundle: None,
            jwks_url: None,
            jwks_min_refresh_secs: default_jwks_min_refresh_secs(),
            issuer: None,
            audience: None,
            tenant_claim: default_tenant_claim(),
            scopes_claim: default_scopes_claim(),
        }
    }
}

impl HttpSection {
    /// The options of the HTTP edge this section describes.
    pub fn options(&self) -> HttpOptions {
        HttpOptions {
            cors_allow_origins: self.cors_allow_origins.clone(),
            metrics_public: self.metrics_public,
            limits: HttpLimits {
                header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
                request_body_timeout: Duration::from_secs(self.request_body_timeout_secs),
                idle_timeout: Duration::from_secs(self.idle_timeout_secs),
                max_connections: self.max_connections,
                max_in_flight_requests: self.max_in_flight_requests,
                shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            },
            cluster: None,
            model_routes: Vec::new(),
            webhooks: None,
            tls: None,
        }
    }

    /// The leeway for `exp` and `nbf`.
    pub fn jwt_leeway(&self) -> Duration {
        Duration::from_secs(self.jwt_leeway_secs)
    }

    /// Which claims carry the tenant and scopes, and the issuer and
    /// audience tokens must name.
    pub fn claim_rules(&self) -> crate::auth::ClaimRules {
        crate::auth::ClaimRules {
            tenant_claim: self.tenant_claim.clone(),
            scopes_claim: self.scopes_claim.clone(),
            issuer: self.issuer.clone(),
            audience: self.audience.clone(),
        }
    }

    /// The certificate and key files, when TLS is on.
    pub fn tls_files(&self) -> Option<crate::http::tls::TlsFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(crate::http::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        }
    }
}

/// Problems of `[http]`'s TLS and identity-provider keys.
pub(super) fn http_edge_problems(http: &HttpSection, out: &mut Vec<Problem>) {
    match (&http.tls_cert, &http.tls_key) {
        (Some(_), None) => out.push(Problem::new(
            "http.tls_key",
            "required with http.tls_cert (the certificate's PEM private key)",
        )),
        (None, Some(_)) => out.push(Problem::new(
            "http.tls_cert",
            "required with http.tls_key (the PEM certificate chain)",
        )),
        _ => {}
    }
    match (&http.auth, &http.jwks_url) {
        (AuthMode::Jwks, None) => out.push(Problem::new(
            "http.jwks_url",
            "required when http.auth is jwks (the identity provider's JWKS URL, e.g. https://idp.example.com/.well-known/jwks.json)",
        )),
        (AuthMode::Jwks, Some(url)) => {
            if let Err(why) = check_jwks_url(url) {
                out.push(Problem::new("http.jwks_url", why));
            }
        }
        (_, Some(_)) => out.push(Problem::new(
            "http.jwks_url",
            "only used when http.auth is jwks",
        )),
        _ => {}
    }
    if http.jwks_min_refresh_secs < MIN_JWKS_REFRESH_SECS {
        out.push(Problem::new(
            "http.jwks_min_refresh_secs",
            format!("must be at least {MIN_JWKS_REFRESH_SECS}"),
        ));
    }
    for (key, value) in [
        ("http.issuer", &http.issuer),
        ("http.audience", &http.audience),
    ] {
        match value {
            Some(v) if v.trim().is_empty() => out.push(Problem::new(
                key,
                "must not be empty (leave it out to not check it)",
            )),
            Some(_) if http.auth == AuthMode::None => out.push(Problem::new(
                key,
                "only checked when http.auth is a token mode (not none)",
            )),
            _ => {}
        }
    }
    for (key, value) in [
        ("http.tenant_claim", &http.tenant_claim),
        ("http.scopes_claim", &http.scopes_claim),
    ] {
        if value.trim().is_empty() {
            out.push(Problem::new(key, "must name a claim"));
        }
    }
}

/// Whether `url` may serve the keys tokens are trusted by: `https://`, or
/// `http://` on a loopback host (a key set over plain HTTP elsewhere could
/// be replaced on the way).
pub fn check_jwks_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("'{url}' is not a URL ({e})"))?;
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if crate::http::is_loopback_url(&parsed) => Ok(()),
        "http" => Err(format!(
            "'{url}': keys over plain HTTP could be replaced on the way; use https:// (http:// only on loopback)"
        )),
        other => Err(format!("'{url}': scheme '{other}' is not http(s)")),
    }
}

/// Longest accepted `http.jwt_leeway_secs`: more than a few minutes of skew
/// is a broken clock, and a large leeway quietly extends every token.
pub const MAX_JWT_LEEWAY_SECS: u64 = 300;

fn default_listen() -> String {
    "127.0.0.1:8080".to_owned()
}
fn default_jwt_leeway_secs() -> u64 {
    crate::auth::DEFAULT_LEEWAY_SECS
}
fn default_header_read_timeout_secs() -> u64 {
    HttpLimits::default().header_read_timeout.as_secs()
}
fn default_request_body_timeout_secs() -> u64 {
    HttpLimits::default().request_body_timeout.as_secs()
}
fn default_idle_timeout_secs() -> u64 {
    HttpLimits::default().idle_timeout.as_secs()
}
fn default_max_connections() -> usize {
    HttpLimits::default().max_connections
}
fn default_max_in_flight_requests() -> usize {
    HttpLimits::default().max_in_flight_requests
}
fn default_shutdown_grace_secs() -> u64 {
    HttpLimits::default().shutdown_grace.as_secs()
}
