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
//! - `exp` is required; a token without it is refused.
//! - `tenant` and `sub` must be non-empty: every stored session is owned by a
//!   tenant, and every decision is recorded with who made it.
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
    /// Everything above.
    Admin,
}

impl Scope {
    /// Every scope, in wire order.
    pub const ALL: [Scope; 4] = [
        Scope::SessionsRead,
        Scope::SessionsWrite,
        Scope::ApprovalsWrite,
        Scope::Admin,
    ];

    /// The wire name (`sessions:read`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionsRead => "sessions:read",
            Self::SessionsWrite => "sessions:write",
            Self::ApprovalsWrite => "approvals:write",
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
    /// The token has expired.
    #[error("the token has expired")]
    Expired,
    /// The token is not valid (bad signature, wrong algorithm, missing claim…).
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// The token is valid but lacks a scope the request needs.
    #[error("the token lacks the '{0}' scope")]
    MissingScope(Scope),
    /// The signing or verification key is unusable.
    #[error("invalid auth key: {0}")]
    InvalidKey(String),
    /// `mint` was asked for a scope that does not exist.
    #[error("unknown scope '{0}' (known: sessions:read, sessions:write, approvals:write, admin)")]
    UnknownScope(String),
    /// A required claim value is empty.
    #[error("the '{0}' claim must not be empty")]
    EmptyClaim(&'static str),
    /// The secret environment variable is unset.
    #[error("{SECRET_ENV} is not set")]
    SecretMissing,
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
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(
            |e| match e.kind() {
                ErrorKind::ExpiredSignature => AuthError::Expired,
                ErrorKind::InvalidAlgorithm => AuthError::InvalidToken(format!(
                    "the token is not signed with {:?}",
                    self.algorithm
                )),
                _ => AuthError::InvalidToken(e.to_string()),
            },
        )?;
        let claims = data.claims;
        if claims.tenant.is_empty() {
            return Err(AuthError::InvalidToken(
                "the 'tenant' claim is empty".into(),
            ));
        }
        if claims.sub.is_empty() {
            return Err(AuthError::InvalidToken("the 'sub' claim is empty".into()));
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

/// Mints an HS256 token (for `overseer token`): `iat` now, `exp` now + `ttl`.
pub fn mint(
    secret: &[u8],
    tenant: &str,
    sub: &str,
    scopes: &[String],
    ttl: Duration,
) -> Result<String, AuthError> {
    check_secret(secret)?;
    if tenant.is_empty() {
        return Err(AuthError::EmptyClaim("tenant"));
    }
    if sub.is_empty() {
        return Err(AuthError::EmptyClaim("sub"));
    }
    if let Some(bad) = scopes.iter().find(|s| Scope::parse(s).is_none()) {
        return Err(AuthError::UnknownScope(bad.clone()));
    }
    let now = jsonwebtoken::get_current_timestamp();
    let claims = Claims {
        sub: sub.to_owned(),
        tenant: tenant.to_owned(),
        scopes: scopes.to_vec(),
        exp: now.saturating_add(ttl.as_secs()),
        iat: Some(now),
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
        assert!(matches!(
            auth.authenticate(Some("Bearer not.a.jwt")),
            Err(AuthError::InvalidToken(_))
        ));
    }

    #[test]
    fn no_auth_is_the_local_tenant_with_every_scope() {
        let p = AuthConfig::None.authenticate(None).unwrap();
        assert_eq!(p, Principal::local());
        assert!(!p.authenticated);
    }
}
