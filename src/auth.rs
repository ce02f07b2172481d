//! Authentication of API callers: bearer JWTs verified with one
//! configured key and one pinned algorithm, the claims overseer reads from
//! them, the scopes it enforces, and minting of development tokens for
//! `overseer token`.
//!
//! This module owns *who is calling and what they may do*. It deliberately
//! knows nothing of HTTP (the `http` module turns [`AuthError`] into 401/403
//! answers) nor of where keys come from beyond the one environment variable
//! of [`SECRET_ENV`]: the config module decides between a secret and a public key file
//! and hands over the bytes.
//!
//! Rules it enforces, and why:
//! - The algorithm is pinned by the configuration, never taken from the token:
//!   a token's own `alg` header only has to match it. This closes the classic
//!   `alg: none` and HS/RS confusion attacks.
//! - `exp` is required; a token without it is refused. `exp` and `nbf` are
//!   checked with a small leeway for clock skew ([`DEFAULT_LEEWAY_SECS`],
//!   configurable), not the library's default minute.
//! - `tenant` and `sub` must be non-empty and free of control characters:
//!   every stored session is owned by a tenant, every decision is recorded
//!   with who made it, and both end up in logs and terminals.
//! - A refused token is answered with a stable reason ("invalid token:
//!   expired", "invalid token: signature", …), never the JWT library's own
//!   error text, which would tell a prober which library (and version) runs.
//! - An HS256 secret must be at least 32 bytes with at least
//!   [`MIN_SECRET_DISTINCT_BYTES`] distinct byte values: 32 spaces, or a
//!   placeholder like `aaaa…`, is long but guessable.
//! - Unknown scopes in a verified token are ignored (an identity provider may
//!   issue scopes for other services); unknown scopes asked of [`mint`] are an
//!   error, since a typo there would silently produce a useless token.
//! - Which claims carry the tenant and the scopes is configurable
//!   ([`ClaimRules`]: `tenant_claim`, `scopes_claim`, a space-separated
//!   string or an array), so an identity provider's tokens work as minted;
//!   `iss` and `aud` are checked when configured, in every token mode. A
//!   missing or wrong claim is refused with its name.
//! - With `auth = "jwks"` the keys come from the identity provider's JWKS
//!   (`jwks`): fetched, cached, refetched for an unknown `kid` under a rate
//!   limit, so a key rotation needs no restart.

pub mod jwks;

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Environment variable holding the HS256 secret.
pub const SECRET_ENV: &str = "OVERSEER_JWT_SECRET";

/// Shortest accepted HS256 secret. RFC 7518 §3.2 asks for a key at least as
/// long as the hash output (32 bytes for SHA-256); a shorter one is
/// brute-forceable offline from any token.
pub const MIN_SECRET_BYTES: usize = 32;

/// Fewest distinct byte values an HS256 secret must contain. Not a measure
/// of entropy, a guard against placeholders and padding: random keys in
/// hex, base64 or raw bytes clear it by far.
pub const MIN_SECRET_DISTINCT_BYTES: usize = 8;

/// Default leeway, in seconds, when checking `exp` and `nbf`: enough for
/// ordinary clock skew between the token's issuer and this server, short
/// enough that an expired token stops working at once in practice.
pub const DEFAULT_LEEWAY_SECS: u64 = 5;

/// Longest lifetime `overseer token` mints (a year and a day): a longer TTL
/// is a typo, or an attempt at a token that never expires.
pub const MAX_TTL_SECS: u64 = 366 * 24 * 3600;

/// Tenant of every request when auth is off.
pub const LOCAL_TENANT: &str = "local";
/// Subject of every request when auth is off.
pub const ANONYMOUS_SUB: &str = "anonymous";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Read sessions, their events and pending approvals; list agents.
    SessionsRead,
    /// Create sessions, send messages, cancel, mark done.
    SessionsWrite,
    /// Decide pending tool calls.
    ApprovalsWrite,
    /// Register, list and delete the tenant's webhook endpoints and read
    /// their delivery logs.
    WebhooksWrite,
    /// Everything above.
    Admin,
}

impl Scope {
    /// Every scope, in wire order.
    pub const ALL: [Scope; 5] = [
        Scope::SessionsRead,
        Scope::SessionsWrite,
        Scope::ApprovalsWrite,
        Scope::WebhooksWrite,
        Scope::Admin,
    ];

    /// The wire name (`sessions:read`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionsRead => "sessions:read",
            Self::SessionsWrite => "sessions:write",
            Self::ApprovalsWrite => "approvals:write",
            Self::WebhooksWrite => "webhooks:write",
            Self::Admin => "admin",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|sc| sc.as_str() == s)
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The claims overseer reads from (and writes into) a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Who is calling; recorded as `approved_by` on decisions.
    pub sub: String,
    /// Which tenant's sessions the caller sees.
    pub tenant: String,
    /// Granted scopes (wire names).
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Expiry, seconds since the epoch. Required.
    pub exp: u64,
    /// Issued at, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    /// Not before, seconds since the epoch: checked when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
}

/// An authenticated caller, as the API sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Tenant.
    pub tenant: String,
    /// Subject.
    pub sub: String,
    /// Known scopes granted.
    pub scopes: Vec<Scope>,
    /// Whether this caller was authenticated (false when auth is off). With
    /// auth off, identity claims in a request body may stand in for the
    /// token's, since there is no token to contradict them.
    pub authenticated: bool,
}

impl Principal {
    /// The caller of a server running without auth: tenant `local`, subject
    /// `anonymous`, every scope.
    pub fn local() -> Self {
        Self {
            tenant: LOCAL_TENANT.to_owned(),
            sub: ANONYMOUS_SUB.to_owned(),
            scopes: Scope::ALL.to_vec(),
            authenticated: false,
        }
    }

    /// Whether the caller holds `scope` (`admin` implies every scope).
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope) || self.scopes.contains(&Scope::Admin)
    }

    /// `Ok` if the caller holds `scope`, else [`AuthError::MissingScope`].
    pub fn require(&self, scope: Scope) -> Result<(), AuthError> {
        if self.allows(scope) {
            Ok(())
        } else {
            Err(AuthError::MissingScope(scope))
        }
    }
}

/// Why a caller was refused, or why an auth configuration is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization: Bearer …` header.
    #[error("missing bearer token: send 'Authorization: Bearer <JWT>'")]
    MissingToken,
    /// The header is present but not a bearer token.
    #[error("malformed Authorization header: expected 'Bearer <JWT>'")]
    MalformedHeader,
    /// The token is not valid: expired, not yet valid, bad signature, wrong
    /// algorithm, malformed, missing or bad claims.
    #[error("invalid token: {0}")]
    InvalidToken(TokenProblem),
    /// The token is valid but lacks a scope the request needs.
    #[error("the token lacks the '{0}' scope")]
    MissingScope(Scope),
    /// The signing or verification key is unusable.
    #[error("invalid auth key: {0}")]
    InvalidKey(String),
    /// `mint` was asked for a scope that does not exist.
    #[error("unknown scope '{0}' (known: sessions:read, sessions:write, approvals:write, webhooks:write, admin)")]
    UnknownScope(String),
    /// A required claim value is empty.
    #[error("the '{0}' claim must not be empty")]
    EmptyClaim(&'static str),
    /// A claim value contains control characters (a newline, an escape…).
    #[error("the '{0}' claim must not contain control characters")]
    InvalidClaim(&'static str),
    /// `mint` was asked for no scope at all.
    #[error("at least one scope is required (known: sessions:read, sessions:write, approvals:write, webhooks:write, admin)")]
    NoScopes,
    /// `mint` was asked for a lifetime out of range.
    #[error("the TTL must be between 1 and {max} seconds, got {got}")]
    InvalidTtl {
        /// What was asked.
        got: u64,
        /// The longest allowed.
        max: u64,
    },
    /// The secret environment variable is unset.
    #[error("{SECRET_ENV} is not set")]
    SecretMissing,
    /// The identity provider's key set could not be fetched (and none is
    /// cached for the token's key): the server's problem, not the caller's.
    #[error("the identity provider's keys (http.jwks_url) are unavailable: {0}")]
    KeysUnavailable(String),
}

/// Why a token was refused, as callers are told: stable words, no library
/// text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenProblem {
    /// `exp` is in the past (beyond the leeway).
    Expired,
    /// `nbf` is in the future (beyond the leeway).
    NotYetValid,
    /// The signature does not verify with the configured key.
    Signature,
    /// Signed with another algorithm than the pinned one.
    Algorithm(Algorithm),
    /// Signed with an algorithm the key it names does not sign with (or a
    /// symmetric one, never accepted with a JWKS).
    KeyAlgorithm,
    /// Not three base64url parts of JSON.
    Malformed,
    /// Claims that are not a JSON object of the expected types.
    Claims,
    /// A required claim is absent.
    MissingClaim(String),
    /// A claim has the wrong type or value (`iss`, `aud`, a scopes claim
    /// that is neither a string nor an array of strings, …).
    WrongClaim(String),
    /// A required claim is empty.
    EmptyClaim(String),
    /// A claim contains control characters.
    ControlCharacters(String),
    /// The token names no key (`kid`) while the keys come from a JWKS.
    NoKeyId,
    /// The token's `kid` is not in the identity provider's key set.
    UnknownKey,
}

impl std::fmt::Display for TokenProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Expired => f.write_str("expired"),
            Self::NotYetValid => f.write_str("not yet valid"),
            Self::Signature => f.write_str("signature"),
            Self::Algorithm(a) => write!(f, "algorithm (expected {a:?})"),
            Self::KeyAlgorithm => f.write_str(
                "algorithm (not one the signing key named by 'kid' is used with)",
            ),
            Self::Malformed => f.write_str("malformed"),
            Self::Claims => f.write_str(
                "claims (sub, tenant and exp are required; exp and nbf are seconds since the epoch)",
            ),
            Self::MissingClaim(c) => write!(f, "missing '{c}' claim"),
            Self::WrongClaim(c) => write!(f, "wrong '{c}' claim"),
            Self::EmptyClaim(c) => write!(f, "empty '{c}' claim"),
            Self::ControlCharacters(c) => write!(f, "control characters in the '{c}' claim"),
            Self::NoKeyId => f.write_str("no 'kid' (key id) in the header"),
            Self::UnknownKey => f.write_str(
                "unknown 'kid': no key of the identity provider's key set has it",
            ),
        }
    }
}

/// Which claims carry what, and which issuer and audience a token must
/// name. The defaults read `tenant` and `scopes` and check neither `iss`
/// nor `aud`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRules {
    /// The claim holding the tenant (a string). A name with dots that is
    /// not a claim itself is a path into nested objects (`org.id`).
    pub tenant_claim: String,
    /// The claim holding the scopes: a space-separated string (OAuth 2's
    /// `scope`) or an array of strings.
    pub scopes_claim: String,
    /// The `iss` a token must carry, if set.
    pub issuer: Option<String>,
    /// An `aud` a token must carry (`aud` may be a list), if set.
    pub audience: Option<String>,
}

impl Default for ClaimRules {
    fn default() -> Self {
        Self {
            tenant_claim: "tenant".to_owned(),
            scopes_claim: "scopes".to_owned(),
            issuer: None,
            audience: None,
        }
    }
}

impl ClaimRules {
    /// A validation for `algorithm` with these rules and `leeway` seconds.
    fn validation(&self, algorithm: Algorithm, leeway: u64) -> Validation {
        // `Validation::new` pins the one algorithm and requires `exp`.
        let mut validation = Validation::new(algorithm);
        validation.validate_nbf = true;
        validation.leeway = leeway;
        let mut required = vec!["exp"];
        if let Some(iss) = &self.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        match &self.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                required.push("aud");
            }
            // Without this, a token carrying any `aud` (common from
            // identity providers) would be refused.
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        validation
    }

    /// The caller named by verified `claims`.
    fn principal(&self, claims: &serde_json::Value) -> Result<Principal, AuthError> {
        let bad = |p: TokenProblem| AuthError::InvalidToken(p);
        let text = |name: &str| -> Result<String, AuthError> {
            let value = claim(claims, name)
                .ok_or_else(|| bad(TokenProblem::MissingClaim(name.to_owned())))?;
            let value = value
                .as_str()
                .ok_or_else(|| bad(TokenProblem::WrongClaim(name.to_owned())))?;
            if value.is_empty() {
                return Err(bad(TokenProblem::EmptyClaim(name.to_owned())));
            }
            if value.chars().any(is_unsafe_char) {
                return Err(bad(TokenProblem::ControlCharacters(name.to_owned())));
            }
            Ok(value.to_owned())
        };
        let sub = text("sub")?;
        let tenant = text(&self.tenant_claim)?;
        let names: Vec<&str> = match claim(claims, &self.scopes_claim) {
            // No scopes: authenticated, allowed nothing (403 per route).
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::String(s)) => s.split_whitespace().collect(),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str())
                .collect::<Option<Vec<&str>>>()
                .ok_or_else(|| bad(TokenProblem::WrongClaim(self.scopes_claim.clone())))?,
            Some(_) => return Err(bad(TokenProblem::WrongClaim(self.scopes_claim.clone()))),
        };
        let mut scopes: Vec<Scope> = names.into_iter().filter_map(Scope::parse).collect();
        scopes.sort();
        scopes.dedup();
        Ok(Principal {
            tenant,
            sub,
            scopes,
            authenticated: true,
        })
    }
}

/// The claim `name` of `claims`: the top-level claim of that name, else,
/// for a dotted name, the path into nested objects.
fn claim<'a>(claims: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    if let Some(v) = claims.get(name) {
        return Some(v);
    }
    if !name.contains('.') {
        return None;
    }
    name.split('.').try_fold(claims, |v, part| v.get(part))
}

/// Whether the payload of `token` (already known to be a JWT) has a claim
/// `name` at its top level.
fn payload_has(token: &str, name: &str) -> bool {
    use base64::Engine;
    token
        .split('.')
        .nth(1)
        .and_then(|p| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p)
                .ok()
        })
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .is_some_and(|v| v.get(name).is_some())
}

/// Decodes and validates `token` with `key`, and maps the claims to a
/// caller under `rules`. `pinned` names the algorithm in the refusal of a
/// token signed with another.
fn decode_with(
    token: &str,
    key: &DecodingKey,
    validation: &Validation,
    pinned: Algorithm,
    rules: &ClaimRules,
) -> Result<Principal, AuthError> {
    use jsonwebtoken::errors::ErrorKind;
    let data = jsonwebtoken::decode::<serde_json::Value>(token, key, validation).map_err(|e| {
        let problem = match e.kind() {
            ErrorKind::ExpiredSignature => TokenProblem::Expired,
            ErrorKind::ImmatureSignature => TokenProblem::NotYetValid,
            ErrorKind::InvalidSignature => TokenProblem::Signature,
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                TokenProblem::Algorithm(pinned)
            }
            ErrorKind::InvalidIssuer => TokenProblem::WrongClaim("iss".to_owned()),
            ErrorKind::InvalidAudience => TokenProblem::WrongClaim("aud".to_owned()),
            // Present but not of the right type counts as missing to the
            // library (the signature was verified before this check).
            ErrorKind::MissingRequiredClaim(c) if payload_has(token, c) => {
                TokenProblem::WrongClaim(c.clone())
            }
            ErrorKind::MissingRequiredClaim(c) => TokenProblem::MissingClaim(c.clone()),
            ErrorKind::InvalidClaimFormat(c) => TokenProblem::WrongClaim(c.clone()),
            // A payload that decodes but is not our claims is a claims
            // problem; anything else is not a JWT at all.
            ErrorKind::Json(_) if token.split('.').count() == 3 => TokenProblem::Claims,
            _ => TokenProblem::Malformed,
        };
        tracing::debug!(error = %e, %problem, "token refused");
        AuthError::InvalidToken(problem)
    })?;
    if !data.claims.is_object() {
        return Err(AuthError::InvalidToken(TokenProblem::Claims));
    }
    rules.principal(&data.claims)
}

/// How the API authenticates callers.
#[derive(Clone)]
pub enum AuthConfig {
    /// No authentication: every caller is [`Principal::local`]. Only allowed
    /// on a loopback listener (the `http` module refuses anything else).
    None,
    /// Bearer JWTs verified with one key and one pinned algorithm (shared:
    /// the verifier is large and every request clones the state).
    Jwt(Arc<JwtVerifier>),
    /// Bearer JWTs verified with the identity provider's keys (JWKS).
    Jwks(Arc<jwks::JwksVerifier>),
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Never print key material.
            Self::None => f.write_str("AuthConfig::None"),
            Self::Jwt(v) => write!(f, "AuthConfig::Jwt({:?})", v.algorithm),
            Self::Jwks(v) => write!(f, "AuthConfig::Jwks({})", v.url()),
        }
    }
}

impl AuthConfig {
    /// HS256 with a shared secret (at least [`MIN_SECRET_BYTES`] bytes).
    pub fn hs256(secret: &[u8]) -> Result<Self, AuthError> {
        check_secret(secret)?;
        let key =
            DecodingKey::from_secret(secret).map_err(|e| AuthError::InvalidKey(e.to_string()))?;
        Ok(Self::Jwt(Arc::new(JwtVerifier::new(Algorithm::HS256, key))))
    }

    /// HS256 with the secret from `OVERSEER_JWT_SECRET`.
    pub fn hs256_from_env() -> Result<Self, AuthError> {
        let secret = std::env::var(SECRET_ENV).map_err(|_| AuthError::SecretMissing)?;
        Self::hs256(secret.as_bytes())
    }

    /// RS256 with an RSA public key in PEM.
    pub fn rs256_pem(pem: &[u8]) -> Result<Self, AuthError> {
        let key =
            DecodingKey::from_rsa_pem(pem).map_err(|e| AuthError::InvalidKey(e.to_string()))?;
        Ok(Self::Jwt(Arc::new(JwtVerifier::new(Algorithm::RS256, key))))
    }

    /// ES256 with a P-256 public key in PEM.
    pub fn es256_pem(pem: &[u8]) -> Result<Self, AuthError> {
        let key =
            DecodingKey::from_ec_pem(pem).map_err(|e| AuthError::InvalidKey(e.to_string()))?;
        Ok(Self::Jwt(Arc::new(JwtVerifier::new(Algorithm::ES256, key))))
    }

    /// The same configuration checking `exp` and `nbf` with `leeway` for
    /// clock skew (default [`DEFAULT_LEEWAY_SECS`]).
    pub fn with_leeway(self, leeway: Duration) -> Self {
        match self {
            Self::Jwt(v) => {
                let mut v = Arc::unwrap_or_clone(v);
                v.leeway = leeway.as_secs();
                v.validation = v.rules.validation(v.algorithm, v.leeway);
                Self::Jwt(Arc::new(v))
            }
            other => other,
        }
    }

    /// The same configuration reading claims by `rules` (tenant and scopes
    /// claims, issuer and audience checked).
    pub fn with_claims(self, rules: ClaimRules) -> Self {
        match self {
            Self::Jwt(v) => {
                let mut v = Arc::unwrap_or_clone(v);
                v.validation = rules.validation(v.algorithm, v.leeway);
                v.rules = rules;
                Self::Jwt(Arc::new(v))
            }
            other => other,
        }
    }

    /// Whether callers must present a token.
    pub fn is_enabled(&self) -> bool {
        !matches!(self, Self::None)
    }

    /// Authenticates a request from its `Authorization` header value (if
    /// any). Async for the JWKS mode, whose key set may have to be fetched.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        let token = match self {
            Self::None => return Ok(Principal::local()),
            Self::Jwt(_) | Self::Jwks(_) => {
                let header = authorization.ok_or(AuthError::MissingToken)?;
                bearer_token(header).ok_or(AuthError::MalformedHeader)?
            }
        };
        match self {
            Self::None => Ok(Principal::local()),
            Self::Jwt(v) => v.verify(token),
            Self::Jwks(v) => v.verify(token).await,
        }
    }
}

/// A verification key with its pinned algorithm.
#[derive(Clone)]
pub struct JwtVerifier {
    algorithm: Algorithm,
    key: DecodingKey,
    leeway: u64,
    rules: ClaimRules,
    validation: Validation,
}

impl JwtVerifier {
    fn new(algorithm: Algorithm, key: DecodingKey) -> Self {
        let rules = ClaimRules::default();
        Self {
            algorithm,
            key,
            leeway: DEFAULT_LEEWAY_SECS,
            validation: rules.validation(algorithm, DEFAULT_LEEWAY_SECS),
            rules,
        }
    }

    /// The pinned algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Verifies a token and returns the caller.
    pub fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        decode_with(
            token,
            &self.key,
            &self.validation,
            self.algorithm,
            &self.rules,
        )
    }
}

/// Whether `c` may not appear in a tenant or subject: control characters
/// (newlines, escapes) and the bidirectional overrides that reorder how text
/// is displayed.
pub(crate) fn is_unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Mints an HS256 token (for `overseer token`): `iat` now, `exp` now + `ttl`.
/// Refuses what would make a useless or dangerous token: no scope, an
/// unknown scope, a TTL of 0 or over [`MAX_TTL_SECS`], an empty tenant or
/// subject or one with control characters, a weak secret.
pub fn mint(
    secret: &[u8],
    tenant: &str,
    sub: &str,
    scopes: &[String],
    ttl: Duration,
) -> Result<String, AuthError> {
    check_secret(secret)?;
    for (name, value) in [("tenant", tenant), ("sub", sub)] {
        if value.is_empty() {
            return Err(AuthError::EmptyClaim(name));
        }
        if value.chars().any(is_unsafe_char) {
            return Err(AuthError::InvalidClaim(name));
        }
    }
    if scopes.is_empty() {
        return Err(AuthError::NoScopes);
    }
    if let Some(bad) = scopes.iter().find(|s| Scope::parse(s).is_none()) {
        return Err(AuthError::UnknownScope(bad.clone()));
    }
    let ttl = ttl.as_secs();
    if ttl == 0 || ttl > MAX_TTL_SECS {
        return Err(AuthError::InvalidTtl {
            got: ttl,
            max: MAX_TTL_SECS,
        });
    }
    let now = jsonwebtoken::get_current_timestamp();
    let claims = Claims {
        sub: sub.to_owned(),
        tenant: tenant.to_owned(),
        scopes: scopes.to_vec(),
        exp: now + ttl,
        iat: Some(now),
        nbf: None,
    };
    let key = EncodingKey::from_secret(secret).map_err(|e| AuthError::InvalidKey(e.to_string()))?;
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key)
        .map_err(|e| AuthError::InvalidKey(e.to_string()))
}

fn check_secret(secret: &[u8]) -> Result<(), AuthError> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(AuthError::InvalidKey(format!(
            "the HS256 secret must be at least {MIN_SECRET_BYTES} bytes (got {})",
            secret.len()
        )));
    }
    let mut seen = [false; 256];
    for b in secret {
        seen[usize::from(*b)] = true;
    }
    let distinct = seen.iter().filter(|s| **s).count();
    if distinct < MIN_SECRET_DISTINCT_BYTES {
        return Err(AuthError::InvalidKey(format!(
            "the HS256 secret has only {distinct} distinct byte value(s), at least {MIN_SECRET_DISTINCT_BYTES} are required: it looks like a placeholder, not a random key (generate one with: head -c 32 /dev/urandom | base64)"
        )));
    }
    Ok(())
}

/// The token of a `Bearer <token>` header value (scheme case-insensitive).
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn mint_then_verify_round_trips() {
        let token = mint(
            SECRET,
            "acme",
            "alice",
            &["sessions:read".into()],
            Duration::from_secs(60),
        )
        .unwrap();
        let auth = AuthConfig::hs256(SECRET).unwrap();
        let p = block_on(auth.authenticate(Some(&format!("Bearer {token}")))).unwrap();
        assert_eq!(p.tenant, "acme");
        assert_eq!(p.sub, "alice");
        assert!(p.allows(Scope::SessionsRead));
        assert!(!p.allows(Scope::SessionsWrite));
        assert!(p.authenticated);
    }

    #[test]
    fn admin_implies_every_scope() {
        let p = Principal {
            tenant: "t".into(),
            sub: "s".into(),
            scopes: vec![Scope::Admin],
            authenticated: true,
        };
        assert!(Scope::ALL.iter().all(|s| p.allows(*s)));
    }

    #[test]
    fn refuses_short_secrets_unknown_scopes_and_bad_headers() {
        assert!(matches!(
            AuthConfig::hs256(b"short"),
            Err(AuthError::InvalidKey(_))
        ));
        assert_eq!(
            mint(SECRET, "t", "s", &["root".into()], Duration::from_secs(1)),
            Err(AuthError::UnknownScope("root".into()))
        );
        let auth = AuthConfig::hs256(SECRET).unwrap();
        assert_eq!(
            block_on(auth.authenticate(None)),
            Err(AuthError::MissingToken)
        );
        assert_eq!(
            block_on(auth.authenticate(Some("Basic abc"))),
            Err(AuthError::MalformedHeader)
        );
        assert_eq!(
            block_on(auth.authenticate(Some("Bearer not.a.jwt"))),
            Err(AuthError::InvalidToken(TokenProblem::Malformed))
        );
    }

    #[test]
    fn weak_secrets_and_bad_mint_requests_are_refused() {
        let spaces = [b' '; 32];
        let e = AuthConfig::hs256(&spaces).unwrap_err().to_string();
        assert!(e.contains("distinct byte"), "{e}");
        assert!(mint(
            &[b'a'; 64],
            "t",
            "s",
            &["admin".into()],
            Duration::from_secs(1)
        )
        .is_err());
        let ok = |tenant: &str, sub: &str, scopes: &[&str], ttl: u64| {
            let scopes: Vec<String> = scopes.iter().map(|s| (*s).to_owned()).collect();
            mint(SECRET, tenant, sub, &scopes, Duration::from_secs(ttl))
        };
        assert_eq!(ok("t", "s", &[], 60), Err(AuthError::NoScopes));
        assert_eq!(
            ok("t\nx", "s", &["admin"], 60),
            Err(AuthError::InvalidClaim("tenant"))
        );
        assert_eq!(
            ok("t", "s\u{1b}[2J", &["admin"], 60),
            Err(AuthError::InvalidClaim("sub"))
        );
        assert_eq!(
            ok("t", "s", &["admin"], u64::MAX),
            Err(AuthError::InvalidTtl {
                got: u64::MAX,
                max: MAX_TTL_SECS
            })
        );
        assert!(matches!(
            ok("t", "s", &["admin"], 0),
            Err(AuthError::InvalidTtl { got: 0, .. })
        ));
        assert!(ok("t", "s", &["admin"], MAX_TTL_SECS).is_ok());
    }

    #[test]
    fn no_auth_is_the_local_tenant_with_every_scope() {
        let p = block_on(AuthConfig::None.authenticate(None)).unwrap();
        assert_eq!(p, Principal::local());
        assert!(!p.authenticated);
    }
}
