//! Authentication of API callers (§12): bearer JWTs verified with one
//! configured key and one pinned algorithm, the claims overseer reads from
//! them, the scopes it enforces, and minting of development tokens for
//! `overseer token`.
//!
//! This module owns *who is calling and what they may do*. It deliberately
//! knows nothing of HTTP (the `http` module turns [`AuthError`] into 401/403
//! answers) nor of where keys come from beyond the one environment variable
//! of §12: the config module decides between a secret and a public key file
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
}

/// Why a token was refused, as callers are told: stable words, no library
/// text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenProblem {
    /// `exp` is in the past (beyond the leeway).
    Expired,
    /// `nbf` is in the future (beyond the leeway).
    NotYetValid,
    /// The signature does not verify with the configured key.
    Signature,
    /// Signed with another algorithm than the pinned one.
    Algorithm(Algorithm),
    /// Not three base64url parts of JSON.
    Malformed,
    /// Required claims missing or of the wrong type.
    Claims,
    /// A required claim is empty.
    EmptyClaim(&'static str),
    /// A claim contains control characters.
    ControlCharacters(&'static str),
}

impl std::fmt::Display for TokenProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Expired => f.write_str("expired"),
            Self::NotYetValid => f.write_str("not yet valid"),
            Self::Signature => f.write_str("signature"),
            Self::Algorithm(a) => write!(f, "algorithm (expected {a:?})"),
            Self::Malformed => f.write_str("malformed"),
            Self::Claims => f.write_str(
                "claims (sub, tenant and exp are required; exp and nbf are seconds since the epoch)",
            ),
            Self::EmptyClaim(c) => write!(f, "empty '{c}' claim"),
            Self::ControlCharacters(c) => write!(f, "control characters in the '{c}' claim"),
        }
    }
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
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Never print key material.
            Self::None => f.write_str("AuthConfig::None"),
            Self::Jwt(v) => write!(f, "AuthConfig::Jwt({:?})", v.algorithm),
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
            Self::None => Self::None,
            Self::Jwt(v) => {
                let mut v = Arc::unwrap_or_clone(v);
                v.validation.leeway = leeway.as_secs();
                Self::Jwt(Arc::new(v))
            }
        }
    }

    /// Whether callers must present a token.
    pub fn is_enabled(&self) -> bool {
        matches!(self, Self::Jwt(_))
    }

    /// Authenticates a request from its `Authorization` header value (if any).
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        match self {
            Self::None => Ok(Principal::local()),
            Self::Jwt(v) => {
                let header = authorization.ok_or(AuthError::MissingToken)?;
                let token = bearer_token(header).ok_or(AuthError::MalformedHeader)?;
                v.verify(token)
            }
        }
    }
}

/// A verification key with its pinned algorithm.
#[derive(Clone)]
pub struct JwtVerifier {
    algorithm: Algorithm,
    key: DecodingKey,
    validation: Validation,
}

impl JwtVerifier {
    fn new(algorithm: Algorithm, key: DecodingKey) -> Self {
        // `Validation::new` pins the one algorithm and requires `exp`.
        let mut validation = Validation::new(algorithm);
        validation.validate_nbf = true;
        validation.leeway = DEFAULT_LEEWAY_SECS;
        // No audience is configured yet; without this, a token carrying any
        // `aud` (common from identity providers) would be refused.
        validation.validate_aud = false;
        Self {
            algorithm,
            key,
            validation,
        }
    }

    /// The pinned algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Verifies a token and returns the caller.
    pub fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        use jsonwebtoken::errors::ErrorKind;
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|e| {
                let problem = match e.kind() {
                    ErrorKind::ExpiredSignature => TokenProblem::Expired,
                    ErrorKind::ImmatureSignature => TokenProblem::NotYetValid,
                    ErrorKind::InvalidSignature => TokenProblem::Signature,
                    ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                        TokenProblem::Algorithm(self.algorithm)
                    }
                    ErrorKind::MissingRequiredClaim(_) | ErrorKind::InvalidClaimFormat(_) => {
                        TokenProblem::Claims
                    }
                    // A payload that decodes but is not our claims is a
                    // claims problem; anything else is not a JWT at all.
                    ErrorKind::Json(_) if token.split('.').count() == 3 => TokenProblem::Claims,
                    _ => TokenProblem::Malformed,
                };
                tracing::debug!(error = %e, %problem, "token refused");
                AuthError::InvalidToken(problem)
            })?;
        let claims = data.claims;
        for (name, value) in [("tenant", &claims.tenant), ("sub", &claims.sub)] {
            if value.is_empty() {
                return Err(AuthError::InvalidToken(TokenProblem::EmptyClaim(name)));
            }
            if value.chars().any(is_unsafe_char) {
                return Err(AuthError::InvalidToken(TokenProblem::ControlCharacters(
                    name,
                )));
            }
        }
        let mut scopes: Vec<Scope> = claims
            .scopes
            .iter()
            .filter_map(|s| Scope::parse(s))
            .collect();
        scopes.sort();
        scopes.dedup();
        Ok(Principal {
            tenant: claims.tenant,
            sub: claims.sub,
            scopes,
            authenticated: true,
        })
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
        let p = auth.authenticate(Some(&format!("Bearer {token}"))).unwrap();
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
        assert_eq!(auth.authenticate(None), Err(AuthError::MissingToken));
        assert_eq!(
            auth.authenticate(Some("Basic abc")),
            Err(AuthError::MalformedHeader)
        );
        assert_eq!(
            auth.authenticate(Some("Bearer not.a.jwt")),
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
        let p = AuthConfig::None.authenticate(None).unwrap();
        assert_eq!(p, Principal::local());
        assert!(!p.authenticated);
    }
}
