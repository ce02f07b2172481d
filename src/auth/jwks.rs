//! Keys from an identity provider's JWKS (`[http] auth = "jwks"`): the key
//! set at `jwks_url`, fetched, cached, and fetched again when a token names
//! a key id (`kid`) the cache does not hold, so the provider rotates its
//! keys without a restart here.
//!
//! It owns the key cache and the rate limit on fetching; what a verified
//! token means (claims, scopes) is the parent module's. It deliberately
//! knows nothing of HTTP serving.
//!
//! Rules, and why:
//! - A token must name its key (`kid`) and be signed with an algorithm that
//!   key is for (the JWK's `alg`, else its type's: RSA → RS*/PS*, P-256 →
//!   ES256, P-384 → ES384, Ed25519 → EdDSA). Symmetric keys (`oct`) in a
//!   key set are ignored, and HS* tokens refused: a public key must never
//!   double as an HMAC secret.
//! - An unknown `kid` fetches the set again, at most once per kid per
//!   `min_refresh` and at most [`MAX_FETCHES_PER_WINDOW`] times per
//!   `min_refresh` in all: tokens with made-up key ids cannot make this
//!   server hammer the provider. Concurrent lookups share one fetch.
//! - The cache is replaced by each successful fetch (a key the provider
//!   removed stops working) and refetched on use once older than
//!   [`MAX_AGE`]. A failed fetch keeps the cached keys.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey};

use super::{decode_with, AuthError, ClaimRules, Principal, TokenProblem};

/// Most fetches of the key set caused by unknown key ids within one
/// `min_refresh` window.
pub const MAX_FETCHES_PER_WINDOW: usize = 5;

/// A cache older than this is fetched again when next used.
pub const MAX_AGE: Duration = Duration::from_secs(3_600);

/// Largest key set accepted, in bytes (real ones are a few KiB).
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Most unknown key ids remembered (each for `min_refresh`).
const MAX_UNKNOWN_REMEMBERED: usize = 4_096;

/// How to reach and use the key set.
#[derive(Debug, Clone)]
pub struct JwksOptions {
    /// The key set's URL (`https://`, or `http://` on loopback).
    pub url: String,
    /// An unknown `kid` fetches the set again at most once per this.
    pub min_refresh: Duration,
    /// Whole-request timeout of a fetch.
    pub fetch_timeout: Duration,
    /// Extra trusted CA certificates (PEM), for a provider behind a private
    /// CA.
    pub ca_bundle: Option<Vec<u8>>,
    /// Claims, issuer and audience.
    pub rules: ClaimRules,
    /// Leeway for `exp` and `nbf`, seconds.
    pub leeway_secs: u64,
}

/// One usable key.
struct Key {
    decoding: DecodingKey,
    algorithms: Vec<Algorithm>,
}

#[derive(Default)]
struct Cache {
    keys: HashMap<String, Arc<Key>>,
    fetched: Option<Instant>,
    /// Key ids looked for and not found, with when.
    unknown: HashMap<String, Instant>,
    /// When recent fetches for unknown key ids happened.
    recent: VecDeque<Instant>,
}

/// Verifies tokens with the identity provider's keys.
pub struct JwksVerifier {
    options: JwksOptions,
    client: reqwest::Client,
    cache: Mutex<Cache>,
    /// Held while fetching, so concurrent lookups share one fetch.
    fetching: tokio::sync::Mutex<()>,
}

impl JwksVerifier {
    /// A verifier for `options` (nothing fetched yet: see
    /// [`JwksVerifier::prefetch`]).
    pub fn new(options: JwksOptions) -> Result<Self, AuthError> {
        let mut client = reqwest::Client::builder()
            .timeout(options.fetch_timeout)
            .redirect(reqwest::redirect::Policy::limited(3));
        if let Some(pem) = &options.ca_bundle {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| AuthError::InvalidKey(format!("http.ca_bundle: {e}")))?;
            for cert in certs {
                client = client.add_root_certificate(cert);
            }
        }
        let client = client
            .build()
            .map_err(|e| AuthError::InvalidKey(format!("JWKS client: {e}")))?;
        Ok(Self {
            options,
            client,
            cache: Mutex::new(Cache::default()),
            fetching: tokio::sync::Mutex::new(()),
        })
    }

    /// The key set's URL.
    pub fn url(&self) -> &str {
        &self.options.url
    }

    /// Fetches the key set now (at start, so the first request does not
    /// wait for it); returns how many usable keys it holds.
    pub async fn prefetch(&self) -> Result<usize, AuthError> {
        let _fetching = self.fetching.lock().await;
        self.fetch_into_cache(None).await
    }

    /// Verifies a token and returns the caller.
    pub async fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::InvalidToken(TokenProblem::Malformed))?;
        if matches!(
            header.alg,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
        ) {
            return Err(AuthError::InvalidToken(TokenProblem::KeyAlgorithm));
        }
        let kid = header
            .kid
            .ok_or(AuthError::InvalidToken(TokenProblem::NoKeyId))?;
        let key = match self.cached(&kid, Instant::now()) {
            Lookup::Found(key) => key,
            Lookup::Stale(key) => self.refresh_stale(&kid).await.unwrap_or(key),
            Lookup::Missing => self.fetch_for(&kid).await?,
        };
        if !key.algorithms.contains(&header.alg) {
            return Err(AuthError::InvalidToken(TokenProblem::KeyAlgorithm));
        }
        let validation = self
            .options
            .rules
            .validation(header.alg, self.options.leeway_secs);
        decode_with(
            token,
            &key.decoding,
            &validation,
            header.alg,
            &self.options.rules,
        )
    }

    fn cached(&self, kid: &str, now: Instant) -> Lookup {
        let Ok(cache) = self.cache.lock() else {
            return Lookup::Missing;
        };
        match cache.keys.get(kid) {
            Some(key)
                if cache
                    .fetched
                    .is_some_and(|t| now.duration_since(t) > MAX_AGE) =>
            {
                Lookup::Stale(key.clone())
            }
            Some(key) => Lookup::Found(key.clone()),
            None => Lookup::Missing,
        }
    }

    /// A fresh copy of a stale cache (the old key when the fetch fails or
    /// another task fetched meanwhile and the key is gone).
    async fn refresh_stale(&self, kid: &str) -> Option<Arc<Key>> {
        let _fetching = self.fetching.lock().await;
        if let Lookup::Found(key) = self.cached(kid, Instant::now()) {
            return Some(key);
        }
        if let Err(e) = self.fetch_into_cache(None).await {
            tracing::warn!(error = %e, "the JWKS could not be refreshed; using the cached keys");
            return None;
        }
        match self.cached(kid, Instant::now()) {
            Lookup::Found(key) | Lookup::Stale(key) => Some(key),
            Lookup::Missing => None,
        }
    }

    /// The key `kid` after fetching the set for it, within the rate limit.
    async fn fetch_for(&self, kid: &str) -> Result<Arc<Key>, AuthError> {
        let unknown = || AuthError::InvalidToken(TokenProblem::UnknownKey);
        if !self.may_fetch(kid, Instant::now()) {
            return Err(unknown());
        }
        let _fetching = self.fetching.lock().await;
        // Another lookup may have fetched while this one waited.
        match self.cached(kid, Instant::now()) {
            Lookup::Found(key) | Lookup::Stale(key) => return Ok(key),
            Lookup::Missing => {}
        }
        if !self.may_fetch(kid, Instant::now()) {
            return Err(unknown());
        }
        self.fetch_into_cache(Some(kid)).await?;
        match self.cached(kid, Instant::now()) {
            Lookup::Found(key) | Lookup::Stale(key) => Ok(key),
            Lookup::Missing => Err(unknown()),
        }
    }

    /// Whether an unknown `kid` may fetch the set now.
    fn may_fetch(&self, kid: &str, now: Instant) -> bool {
        let Ok(mut cache) = self.cache.lock() else {
            return false;
        };
        rate_allows(&mut cache, kid, now, self.options.min_refresh)
    }

    /// Fetches the set and replaces the cache with it; `for_kid` is the
    /// unknown key id that caused the fetch (counted by the rate limit).
    async fn fetch_into_cache(&self, for_kid: Option<&str>) -> Result<usize, AuthError> {
        let started = Instant::now();
        if let (Some(kid), Ok(mut cache)) = (for_kid, self.cache.lock()) {
            cache.recent.push_back(started);
            if cache.unknown.len() >= MAX_UNKNOWN_REMEMBERED {
                cache.unknown.clear();
            }
            // Remembered before the answer: a failed fetch counts too.
            cache.unknown.insert(kid.to_owned(), started);
        }
        let set = self.fetch().await?;
        let keys = usable_keys(&set);
        let count = keys.len();
        if let Ok(mut cache) = self.cache.lock() {
            for kid in keys.keys() {
                cache.unknown.remove(kid);
            }
            cache.keys = keys;
            cache.fetched = Some(Instant::now());
        }
        tracing::info!(url = %self.options.url, keys = count, "fetched the identity provider's key set");
        Ok(count)
    }

    async fn fetch(&self) -> Result<JwkSet, AuthError> {
        let unavailable = |why: String| AuthError::KeysUnavailable(why);
        let response = self
            .client
            .get(&self.options.url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| unavailable(format!("GET {}: {e}", self.options.url)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(unavailable(format!(
                "GET {} answered {status}",
                self.options.url
            )));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_BODY_BYTES as u64)
        {
            return Err(unavailable(format!(
                "the key set at {} is over {MAX_BODY_BYTES} bytes",
                self.options.url
            )));
        }
        let body = response
            .bytes()
            .await
            .map_err(|e| unavailable(format!("reading {}: {e}", self.options.url)))?;
        if body.len() > MAX_BODY_BYTES {
            return Err(unavailable(format!(
                "the key set at {} is over {MAX_BODY_BYTES} bytes",
                self.options.url
            )));
        }
        serde_json::from_slice(&body).map_err(|e| {
            unavailable(format!(
                "{} is not a JWK set ({{\"keys\": [...]}}): {e}",
                self.options.url
            ))
        })
    }
}

enum Lookup {
    Found(Arc<Key>),
    Stale(Arc<Key>),
    Missing,
}

/// The rate limit on fetches for unknown key ids: none for a kid looked for
/// within `window`, and at most [`MAX_FETCHES_PER_WINDOW`] in any `window`.
fn rate_allows(cache: &mut Cache, kid: &str, now: Instant, window: Duration) -> bool {
    while cache
        .recent
        .front()
        .is_some_and(|t| now.duration_since(*t) >= window)
    {
        cache.recent.pop_front();
    }
    if cache
        .unknown
        .get(kid)
        .is_some_and(|t| now.duration_since(*t) < window)
    {
        return false;
    }
    cache.recent.len() < MAX_FETCHES_PER_WINDOW
}

/// The keys of `set` this server verifies with, by key id: signing keys
/// with a `kid`, of a type and algorithm it supports; the rest is skipped
/// (a provider may publish encryption keys or types unknown here).
fn usable_keys(set: &JwkSet) -> HashMap<String, Arc<Key>> {
    let mut out = HashMap::new();
    for jwk in &set.keys {
        let Some(kid) = &jwk.common.key_id else {
            continue;
        };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let algorithms = algorithms_of(jwk);
        if algorithms.is_empty() {
            continue;
        }
        match DecodingKey::from_jwk(jwk) {
            Ok(decoding) => {
                out.insert(
                    kid.clone(),
                    Arc::new(Key {
                        decoding,
                        algorithms,
                    }),
                );
            }
            Err(e) => tracing::warn!(%kid, error = %e, "skipping an unusable key of the JWKS"),
        }
    }
    out
}

/// The algorithms `jwk` verifies: its `alg` if named, else those of its
/// key type. Empty for symmetric keys and types not supported.
fn algorithms_of(jwk: &Jwk) -> Vec<Algorithm> {
    use Algorithm as A;
    let by_type: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => {
            vec![A::RS256, A::RS384, A::RS512, A::PS256, A::PS384, A::PS512]
        }
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => vec![A::ES256],
            EllipticCurve::P384 => vec![A::ES384],
            _ => Vec::new(),
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            vec![A::EdDSA]
        }
        _ => Vec::new(),
    };
    let named = match jwk.common.key_algorithm {
        None => return by_type,
        Some(KeyAlgorithm::RS256) => A::RS256,
        Some(KeyAlgorithm::RS384) => A::RS384,
        Some(KeyAlgorithm::RS512) => A::RS512,
        Some(KeyAlgorithm::PS256) => A::PS256,
        Some(KeyAlgorithm::PS384) => A::PS384,
        Some(KeyAlgorithm::PS512) => A::PS512,
        Some(KeyAlgorithm::ES256) => A::ES256,
        Some(KeyAlgorithm::ES384) => A::ES384,
        Some(KeyAlgorithm::EdDSA) => A::EdDSA,
        Some(_) => return Vec::new(),
    };
    if by_type.contains(&named) {
        vec![named]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_kid_fetches_once_per_window_and_all_kids_share_a_cap() {
        let mut cache = Cache::default();
        let t0 = Instant::now();
        let window = Duration::from_secs(60);
        assert!(rate_allows(&mut cache, "a", t0, window));
        cache.recent.push_back(t0);
        cache.unknown.insert("a".into(), t0);
        // The same kid again within the window: no fetch.
        assert!(!rate_allows(
            &mut cache,
            "a",
            t0 + Duration::from_secs(59),
            window
        ));
        // Once the window has passed: one more.
        assert!(rate_allows(&mut cache, "a", t0 + window, window));
        // Other kids, up to the cap within one window.
        let mut cache = Cache::default();
        for i in 0..MAX_FETCHES_PER_WINDOW {
            let kid = format!("k{i}");
            assert!(rate_allows(&mut cache, &kid, t0, window), "{kid}");
            cache.recent.push_back(t0);
            cache.unknown.insert(kid, t0);
        }
        assert!(!rate_allows(&mut cache, "another", t0, window));
        assert!(rate_allows(&mut cache, "another", t0 + window, window));
    }

    #[test]
    fn symmetric_keys_and_encryption_keys_are_never_used() {
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"},
            {"kty": "EC", "kid": "enc", "use": "enc", "crv": "P-256",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "EC", "kid": "sig", "crv": "P-256",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
             "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}
        ]}))
        .unwrap();
        let keys = usable_keys(&set);
        assert_eq!(keys.keys().collect::<Vec<_>>(), vec!["sig"]);
        assert_eq!(keys["sig"].algorithms, vec![Algorithm::ES256]);
    }
}
