//! Tokens from an identity provider (`[http] auth = "jwks"`): the API over
//! a loopback socket, verifying tokens with the keys a JWKS server in the
//! test publishes, rotates and counts fetches of; issuer, audience and claim
//! mapping, also for a static key.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::get;
use common::{b64url, send, Server};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use overseer::auth::jwks::{JwksOptions, JwksVerifier};
use overseer::auth::{AuthConfig, ClaimRules};
use overseer::http::HttpOptions;
use serde_json::{json, Value};

type Result = anyhow::Result<()>;

/// A signing key of the identity provider: its private half for minting,
/// its public JWK for the key set.
struct IdpKey {
    kid: String,
    encoding: EncodingKey,
    jwk: Value,
}

impl IdpKey {
    fn new(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let encoding = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
        // Uncompressed point: 0x04 || x || y.
        let raw = pair.public_key_raw();
        assert_eq!(raw.len(), 65);
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
            "x": b64url(&raw[1..33]), "y": b64url(&raw[33..65]),
        });
        Self {
            kid: kid.to_owned(),
            encoding,
            jwk,
        }
    }

    /// A token signed by this key, naming `kid` in its header.
    fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }

    fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }
}

/// The identity provider's JWKS endpoint: serves the current key set and
/// counts how often it was fetched.
struct Idp {
    url: String,
    keys: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
}

impl Idp {
    async fn start(keys: &[&IdpKey]) -> anyhow::Result<Self> {
        // reqwest is built without a default TLS provider (as the server
        // installs one at start).
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let set = Arc::new(Mutex::new(Value::Null));
        let fetches = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new().route(
            "/jwks",
            get({
                let set = set.clone();
                let fetches = fetches.clone();
                move || async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    let body = set.lock().unwrap().clone();
                    axum::Json(body)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/jwks", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        let idp = Self {
            url,
            keys: set,
            fetches,
        };
        idp.publish(keys);
        Ok(idp)
    }

    /// Replaces the published key set (a rotation).
    fn publish(&self, keys: &[&IdpKey]) {
        *self.keys.lock().unwrap() =
            json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// A verifier of this provider's tokens under `rules`.
    async fn auth(&self, rules: ClaimRules) -> anyhow::Result<AuthConfig> {
        let verifier = JwksVerifier::new(JwksOptions {
            url: self.url.clone(),
            // Longer than any test: within it, each unknown kid fetches once.
            min_refresh: Duration::from_secs(3_600),
            fetch_timeout: Duration::from_secs(10),
            ca_bundle: None,
            rules,
            leeway_secs: 5,
        })?;
        verifier.prefetch().await?;
        Ok(AuthConfig::Jwks(Arc::new(verifier)))
    }
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn claims(tenant: &str) -> Value {
    json!({"sub": "alice", "tenant": tenant, "scopes": ["sessions:read"], "exp": now() + 600})
}

/// `GET /v1/me` with `token`: status and body.
async fn me(s: &Server, token: &str) -> anyhow::Result<(u16, Value)> {
    send(s.get("/v1/me", token)).await
}

/// Asserts a 401 whose message contains `needle`.
async fn refused(s: &Server, token: &str, needle: &str) -> Result {
    let (status, body) = me(s, token).await?;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{needle:?} not in {message:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_accepted_after_rotation_and_an_unknown_kid_fetches_once() -> Result {
    let old = IdpKey::new("key-2026-01");
    let new = IdpKey::new("key-2026-02");
    let idp = Idp::start(&[&old]).await?;
    let s = Server::start_with(
        idp.auth(ClaimRules::default()).await?,
        HttpOptions::default(),
    )
    .await?;
    assert_eq!(idp.fetches(), 1, "fetched once at start");

    let (status, body) = me(&s, &old.sign(&claims("acme"))).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tenant"], "acme");
    assert_eq!(idp.fetches(), 1, "a known kid is served from the cache");

    // A kid the provider never published: one fetch, however often it is
    // presented, and every one of them refused.
    for _ in 0..4 {
        refused(
            &s,
            &old.sign_as("made-up", &claims("acme")),
            "unknown 'kid'",
        )
        .await?;
    }
    assert_eq!(idp.fetches(), 2, "an unknown kid fetches the set once");

    // The provider rotates: the new key replaces the old one.
    idp.publish(&[&new]);
    let (status, body) = me(&s, &new.sign(&claims("acme"))).await?;
    assert_eq!(status, 200, "a token of the rotated key: {body}");
    assert_eq!(idp.fetches(), 3, "the new kid fetched the set once");
    let (status, _) = me(&s, &new.sign(&claims("acme"))).await?;
    assert_eq!(status, 200);
    assert_eq!(idp.fetches(), 3, "and is cached from then on");

    // The retired key left the set with that fetch: its tokens are refused.
    refused(&s, &old.sign(&claims("acme")), "unknown 'kid'").await?;

    // An HMAC token naming a published key: never verified with it.
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(new.kid.clone());
    let hmac = jsonwebtoken::encode(
        &header,
        &claims("acme"),
        &EncodingKey::from_secret(new.jwk["x"].as_str().unwrap().as_bytes())?,
    )?;
    refused(&s, &hmac, "algorithm").await?;

    // A token naming no key at all.
    let mut header = Header::new(Algorithm::ES256);
    header.kid = None;
    let no_kid = jsonwebtoken::encode(&header, &claims("acme"), &new.encoding)?;
    refused(&s, &no_kid, "no 'kid'").await?;
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_audience_or_issuer_is_a_401_naming_the_claim() -> Result {
    let key = IdpKey::new("k1");
    let idp = Idp::start(&[&key]).await?;
    let rules = ClaimRules {
        issuer: Some("https://idp.example.com/".into()),
        audience: Some("overseer".into()),
        ..ClaimRules::default()
    };
    let s = Server::start_with(idp.auth(rules.clone()).await?, HttpOptions::default()).await?;
    let with = |extra: Value| {
        let mut c = claims("acme");
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let good = with(json!({"iss": "https://idp.example.com/", "aud": ["other", "overseer"]}));
    let (status, body) = me(&s, &key.sign(&good)).await?;
    assert_eq!(status, 200, "{body}");
    refused(
        &s,
        &key.sign(&with(
            json!({"iss": "https://idp.example.com/", "aud": "another-api"}),
        )),
        "wrong 'aud' claim",
    )
    .await?;
    refused(
        &s,
        &key.sign(&with(
            json!({"iss": "https://evil.example.com/", "aud": "overseer"}),
        )),
        "wrong 'iss' claim",
    )
    .await?;
    refused(
        &s,
        &key.sign(&with(json!({"iss": "https://idp.example.com/"}))),
        "missing 'aud' claim",
    )
    .await?;
    refused(
        &s,
        &key.sign(&with(json!({"aud": "overseer"}))),
        "missing 'iss' claim",
    )
    .await?;
    s.stop().await?;

    // The same checks with a static key (HS256 here).
    let hs = common::hs256().with_claims(rules);
    let s = Server::start_with(hs, HttpOptions::default()).await?;
    let sign = |c: &Value| {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            c,
            &EncodingKey::from_secret(common::SECRET.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let (status, body) = me(&s, &sign(&good)).await?;
    assert_eq!(status, 200, "{body}");
    refused(
        &s,
        &sign(&with(
            json!({"iss": "https://idp.example.com/", "aud": "nope"}),
        )),
        "wrong 'aud' claim",
    )
    .await?;
    refused(
        &s,
        &sign(&with(json!({"iss": "https://other/", "aud": "overseer"}))),
        "wrong 'iss' claim",
    )
    .await?;
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_tenant_claim_and_a_scope_string_or_array_map() -> Result {
    let key = IdpKey::new("k1");
    let idp = Idp::start(&[&key]).await?;
    let rules = ClaimRules {
        // Auth0-style namespaced claim, Keycloak-style `scope` string.
        tenant_claim: "https://overseer.example.com/org".into(),
        scopes_claim: "scope".into(),
        ..ClaimRules::default()
    };
    let s = Server::start_with(idp.auth(rules).await?, HttpOptions::default()).await?;
    let exp = now() + 600;
    let (status, body) = me(
        &s,
        &key.sign(&json!({
            "sub": "alice", "exp": exp, "tenant": "ignored",
            "https://overseer.example.com/org": "acme",
            "scope": "openid profile sessions:read approvals:write",
        })),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tenant"], "acme");
    assert_eq!(body["scopes"], json!(["sessions:read", "approvals:write"]));
    // The scope claim as an array.
    let (status, body) = me(
        &s,
        &key.sign(&json!({
            "sub": "bob", "exp": exp,
            "https://overseer.example.com/org": "globex",
            "scope": ["sessions:write"],
        })),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tenant"], "globex");
    assert_eq!(body["scopes"], json!(["sessions:write"]));
    // The tenant claim missing (the default one present does not count).
    refused(
        &s,
        &key.sign(&json!({"sub": "eve", "exp": exp, "tenant": "acme", "scope": "admin"})),
        "missing 'https://overseer.example.com/org' claim",
    )
    .await?;
    // A scope claim of the wrong type.
    refused(
        &s,
        &key.sign(&json!({"sub": "eve", "exp": exp, "https://overseer.example.com/org": "acme", "scope": 7})),
        "wrong 'scope' claim",
    )
    .await?;
    refused(
        &s,
        &key.sign(&json!({"exp": exp, "https://overseer.example.com/org": "acme"})),
        "missing 'sub' claim",
    )
    .await?;
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_identity_provider_is_a_503_not_a_401() -> Result {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let key = IdpKey::new("k1");
    // A port nobody listens on (bound, then closed).
    let url = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        format!("http://{}/jwks", l.local_addr()?)
    };
    let verifier = JwksVerifier::new(JwksOptions {
        url,
        min_refresh: Duration::from_secs(3_600),
        fetch_timeout: Duration::from_secs(10),
        ca_bundle: None,
        rules: ClaimRules::default(),
        leeway_secs: 5,
    })?;
    assert!(verifier.prefetch().await.is_err());
    let s =
        Server::start_with(AuthConfig::Jwks(Arc::new(verifier)), HttpOptions::default()).await?;
    let (status, body) = me(&s, &key.sign(&claims("acme"))).await?;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "keys_unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("http.jwks_url"),
        "{body}"
    );
    s.stop().await
}

/// `overseer serve` as a process configured with `auth = "jwks"` (and the
/// claim keys) in its file: the configuration reaches the verifier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_configured_with_jwks_accepts_the_providers_tokens() -> Result {
    let key = IdpKey::new("k1");
    let idp = Idp::start(&[&key]).await?;
    let dir = tempfile::tempdir()?;
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        r#"{"name": "s", "agents": {"a": [{"text": "hi"}]}}"#,
    )?;
    let config = dir.path().join("overseer.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\ndata_dir = {data:?}\n\n\
             [http]\nauth = \"jwks\"\njwks_url = {url:?}\nissuer = \"https://idp.example.com/\"\n\
             audience = \"overseer\"\ntenant_claim = \"org\"\nscopes_claim = \"scope\"\n\n\
             [provider]\nkind = \"scripted\"\nscenario = {scenario:?}\n\n\
             [[agents]]\nname = \"a\"\n",
            data = dir.path().join("data").display().to_string(),
            url = idp.url,
            scenario = scenario.display().to_string(),
        ),
    )?;
    let mut cmd = common::served::command();
    cmd.arg("--config").arg(&config);
    let served = common::served::Served::start(cmd)?;
    let addr = served.addr().to_owned();
    let token = key.sign(&json!({
        "sub": "alice", "org": "acme", "scope": "openid sessions:read",
        "iss": "https://idp.example.com/", "aud": "overseer", "exp": now() + 600,
    }));
    let client = reqwest::Client::new();
    let (status, body) = send(
        client
            .get(format!("http://{addr}/v1/me"))
            .bearer_auth(&token),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tenant"], "acme");
    assert_eq!(body["scopes"], json!(["sessions:read"]));
    let wrong_aud = key.sign(&json!({
        "sub": "alice", "org": "acme", "iss": "https://idp.example.com/",
        "aud": "another", "exp": now() + 600,
    }));
    let (status, body) = send(
        client
            .get(format!("http://{addr}/v1/me"))
            .bearer_auth(&wrong_aud),
    )
    .await?;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("'aud'"),
        "{body}"
    );
    drop(served);
    Ok(())
}
