//! Scope tokens: the JWT overseer mints for each tool call it sends to
//! an `http` tool or an MCP server, so the receiving system can check who is
//! calling and for what, and the verification such a system (or overseer's
//! own tools layer) performs.
//!
//! Owns the claim set, minting (HS256 with a shared secret; RS256/ES256 with
//! a PEM key pair) and verification with the algorithm pinned and `exp`
//! required. It deliberately does not decide *which* tools a session may use:
//! that is the session's scope (`CallScope::allowed_tools`), computed by the
//! runtime as the intersection of an agent's tools and its parent's scope, so
//! a child's `allowed_tools` is always a subset of its parent's. Nor does it
//! authenticate API callers: that is `crate::auth`.

use std::time::Duration;

use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use overseer_actors::model::SessionId;
use overseer_actors::tool::ToolContext;
use serde::{Deserialize, Serialize};

/// The claims of a scope token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeClaims {
    /// Who started the root session (`anonymous` when unknown).
    pub sub: String,
    /// Tenant of the session.
    pub tenant: String,
    /// The calling session.
    pub session_id: SessionId,
    /// Root of its tree.
    pub root_session_id: SessionId,
    /// Its parent, for a child session.
    pub parent_session_id: Option<SessionId>,
    /// Its agent.
    pub agent: String,
    /// Tools the session may call.
    pub allowed_tools: Vec<String>,
    /// Issued at (seconds since the epoch).
    pub iat: u64,
    /// Expires at (seconds since the epoch).
    pub exp: u64,
    /// Unique token id (the call id and attempt: a retry gets a fresh token
    /// for the same idempotency key).
    pub jti: String,
}

/// Why a token could not be minted or was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeTokenError {
    /// The configured key is unusable.
    #[error("invalid scope-token key: {0}")]
    Key(String),
    /// Signing failed.
    #[error("could not mint a scope token: {0}")]
    Mint(String),
    /// The token is expired, forged, malformed or of another algorithm.
    #[error("scope token refused: {0}")]
    Invalid(String),
    /// The token does not allow this tool.
    #[error("scope token does not allow tool '{tool}' (allowed: {allowed})")]
    ToolNotAllowed {
        /// The tool asked for.
        tool: String,
        /// What the token allows.
        allowed: String,
    },
}

/// Mints and verifies scope tokens with one pinned algorithm.
#[derive(Clone)]
pub struct ScopeTokens {
    alg: Algorithm,
    encoding: EncodingKey,
    decoding: DecodingKey,
    ttl: Duration,
}

impl std::fmt::Debug for ScopeTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("ScopeTokens")
            .field("alg", &self.alg)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Shortest HS256 secret accepted: shorter ones are brute-forceable.
pub const MIN_SECRET_BYTES: usize = 32;

impl ScopeTokens {
    /// HS256 with a shared secret (at least [`MIN_SECRET_BYTES`] bytes).
    pub fn hs256(secret: &[u8], ttl: Duration) -> Result<Self, ScopeTokenError> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(ScopeTokenError::Key(format!(
                "an HS256 secret needs at least {MIN_SECRET_BYTES} bytes, got {}",
                secret.len()
            )));
        }
        let key = |e: jsonwebtoken::errors::Error| ScopeTokenError::Key(e.to_string());
        Ok(Self {
            alg: Algorithm::HS256,
            encoding: EncodingKey::from_secret(secret).map_err(key)?,
            decoding: DecodingKey::from_secret(secret).map_err(key)?,
            ttl,
        })
    }

    /// RS256 or ES256 with a PEM private key (to mint) and public key (to verify).
    pub fn from_pem(
        alg: Algorithm,
        private_pem: &[u8],
        public_pem: &[u8],
        ttl: Duration,
    ) -> Result<Self, ScopeTokenError> {
        let key = |e: jsonwebtoken::errors::Error| ScopeTokenError::Key(e.to_string());
        let (encoding, decoding) = match alg {
            Algorithm::RS256 => (
                EncodingKey::from_rsa_pem(private_pem).map_err(key)?,
                DecodingKey::from_rsa_pem(public_pem).map_err(key)?,
            ),
            Algorithm::ES256 => (
                EncodingKey::from_ec_pem(private_pem).map_err(key)?,
                DecodingKey::from_ec_pem(public_pem).map_err(key)?,
            ),
            other => {
                return Err(ScopeTokenError::Key(format!(
                "algorithm {other:?} is not supported for scope tokens (use HS256, RS256 or ES256)"
            )))
            }
        };
        Ok(Self {
            alg,
            encoding,
            decoding,
            ttl,
        })
    }

    /// The claims for a call.
    pub fn claims(&self, ctx: &ToolContext, now_secs: u64) -> ScopeClaims {
        ScopeClaims {
            sub: ctx
                .scope
                .sub
                .clone()
                .unwrap_or_else(|| "anonymous".to_owned()),
            tenant: ctx.tenant.clone(),
            session_id: ctx.session_id,
            root_session_id: ctx.scope.root_session_id.unwrap_or(ctx.session_id),
            parent_session_id: ctx.scope.parent_session_id,
            agent: ctx.agent.clone(),
            allowed_tools: ctx.scope.allowed_tools.clone(),
            iat: now_secs,
            exp: now_secs.saturating_add(self.ttl.as_secs()),
            jti: format!("{}:{}", ctx.call_id, ctx.attempt),
        }
    }

    /// Mints the token for a call.
    pub fn mint(&self, ctx: &ToolContext) -> Result<String, ScopeTokenError> {
        self.encode(&self.claims(ctx, now_secs()))
    }

    /// Signs arbitrary claims (for tests of expiry and for tools that relay).
    pub fn encode(&self, claims: &ScopeClaims) -> Result<String, ScopeTokenError> {
        encode(&Header::new(self.alg), claims, &self.encoding)
            .map_err(|e| ScopeTokenError::Mint(e.to_string()))
    }

    /// Verifies a token: signature, pinned algorithm, `exp` required and in
    /// the future (no leeway: tokens are short-lived and minted here).
    pub fn verify(&self, token: &str) -> Result<ScopeClaims, ScopeTokenError> {
        let mut validation = Validation::new(self.alg);
        validation.leeway = 0;
        validation.validate_aud = false;
        decode::<ScopeClaims>(token, &self.decoding, &validation)
            .map(|d| d.claims)
            .map_err(|e| ScopeTokenError::Invalid(e.to_string()))
    }

    /// Verifies a token and that it allows `tool`: a call to a tool outside
    /// `allowed_tools` is refused before anything is sent.
    pub fn authorize(&self, token: &str, tool: &str) -> Result<ScopeClaims, ScopeTokenError> {
        let claims = self.verify(token)?;
        if !claims.allowed_tools.iter().any(|t| t == tool) {
            return Err(ScopeTokenError::ToolNotAllowed {
                tool: tool.to_owned(),
                allowed: claims.allowed_tools.join(", "),
            });
        }
        Ok(claims)
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use overseer_actors::model::ToolCallId;
    use overseer_actors::tool::CallScope;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn ctx() -> ToolContext {
        let root = SessionId::generate();
        ToolContext {
            session_id: SessionId::generate(),
            tenant: "acme".into(),
            agent: "researcher".into(),
            call_id: ToolCallId::from("call_1"),
            idempotency_key: "call_1".into(),
            attempt: 2,
            scope: CallScope {
                sub: Some("alice".into()),
                root_session_id: Some(root),
                parent_session_id: Some(root),
                allowed_tools: vec!["search".into(), "current_time".into()],
            },
        }
    }

    #[test]
    fn minted_claims_round_trip() {
        let t = ScopeTokens::hs256(SECRET, Duration::from_secs(300)).unwrap();
        let c = ctx();
        let claims = t.verify(&t.mint(&c).unwrap()).unwrap();
        assert_eq!(claims.sub, "alice");
        assert_eq!(claims.tenant, "acme");
        assert_eq!(claims.session_id, c.session_id);
        assert_eq!(Some(claims.root_session_id), c.scope.root_session_id);
        assert_eq!(claims.parent_session_id, c.scope.parent_session_id);
        assert_eq!(claims.agent, "researcher");
        assert_eq!(claims.allowed_tools, vec!["search", "current_time"]);
        assert_eq!(claims.exp - claims.iat, 300);
        assert_eq!(claims.jti, "call_1:2");
    }

    #[test]
    fn forged_expired_none_and_other_algorithms_are_refused() {
        let t = ScopeTokens::hs256(SECRET, Duration::from_secs(300)).unwrap();
        let forger = ScopeTokens::hs256(
            b"another-secret-another-secret-xx",
            Duration::from_secs(300),
        )
        .unwrap();
        let forged = forger.mint(&ctx()).unwrap();
        assert!(matches!(
            t.verify(&forged),
            Err(ScopeTokenError::Invalid(_))
        ));

        let mut claims = t.claims(&ctx(), now_secs());
        claims.iat -= 600;
        claims.exp = now_secs() - 1;
        let expired = t.encode(&claims).unwrap();
        let err = t.verify(&expired).unwrap_err();
        assert!(err.to_string().contains("ExpiredSignature"), "{err}");

        // alg "none": header {"alg":"none"} with the same payload, no signature.
        use base64_like::encode_url;
        let good = t.mint(&ctx()).unwrap();
        let payload = good.split('.').nth(1).unwrap();
        let none = format!(
            "{}.{}.",
            encode_url(br#"{"alg":"none","typ":"JWT"}"#),
            payload
        );
        assert!(t.verify(&none).is_err());

        // HS384 signed with the right secret is still refused: the algorithm is pinned.
        let hs384 = encode(
            &Header::new(Algorithm::HS384),
            &t.claims(&ctx(), now_secs()),
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap();
        assert!(t.verify(&hs384).is_err());
    }

    #[test]
    fn a_tool_outside_the_scope_is_refused() {
        let t = ScopeTokens::hs256(SECRET, Duration::from_secs(300)).unwrap();
        let token = t.mint(&ctx()).unwrap();
        assert!(t.authorize(&token, "search").is_ok());
        let err = t.authorize(&token, "delete_everything").unwrap_err();
        assert_eq!(
            err.to_string(),
            "scope token does not allow tool 'delete_everything' (allowed: search, current_time)"
        );
    }

    #[test]
    fn short_secrets_and_unsupported_algorithms_are_rejected() {
        assert!(matches!(
            ScopeTokens::hs256(b"short", Duration::from_secs(1)),
            Err(ScopeTokenError::Key(_))
        ));
        assert!(ScopeTokens::from_pem(Algorithm::HS512, b"", b"", Duration::from_secs(1)).is_err());
    }

    /// Minimal base64url (no padding) for building a hostile header in a test.
    mod base64_like {
        pub(super) fn encode_url(input: &[u8]) -> String {
            const T: &[u8; 64] =
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
            let mut out = String::new();
            for chunk in input.chunks(3) {
                let b = [
                    chunk[0],
                    *chunk.get(1).unwrap_or(&0),
                    *chunk.get(2).unwrap_or(&0),
                ];
                let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
                let chars = chunk.len() + 1;
                for i in 0..chars {
                    out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
                }
            }
            out
        }
    }
}
