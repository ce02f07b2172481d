//! Configuration: `config/overseer.toml`, then `OVERSEER_*` environment
//! variables, then command-line flags.
//!
//! This module owns the typed shape of the file, the layering, and the
//! reporting: unknown keys are errors and every invalid value is reported with
//! its key (`agents[1].approval: unknown variant 'sometimes', expected
//! auto|per_tool|always`), all problems of a file at once. It converts the
//! result into the types the runtime takes ([`AgentConfig`], [`RuntimeConfig`]).
//! It deliberately does not build what the configuration describes (store,
//! provider, tools): the binaries do, so a library user can configure the
//! runtime without this file. Secrets are never read from here. An
//! agent's own MCP servers, tool patterns and approval rules, and their
//! resolution once the servers have listed their tools, are `agent_tools`'s.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use toml::{Table, Value};

use overseer_actors::model::{AgentConfig, ApprovalPolicy, Budget, ChildApproval};
use overseer_actors::supervision::RestartPolicy;
use overseer_actors::tool::ToolRegistry;
use overseer_actors::RuntimeConfig;

use crate::http::{HttpLimits, HttpOptions, MAX_COUNT_LIMIT};
use crate::provider::{ProviderKind as RouteKind, RouteConfig};
use crate::store::{Compression, Durability, StoreOptions, DEFAULT_CACHE_MB, MAX_CACHE_MB};
use crate::tools::http_request::HttpRequestConfig;
use crate::tools::http_tool::HttpToolConfig;
use crate::tools::mcp::McpServerConfig;

mod agent_tools;
mod library;

use agent_tools::is_pattern;
pub use agent_tools::AgentMcpServer;
pub use library::{SkillsDirEntry, TaskSection};

/// Where the configuration is looked for when no path is given.
pub const DEFAULT_CONFIG_PATH: &str = "config/overseer.toml";

/// The default configuration, compiled in: used when no path is given and
/// [`DEFAULT_CONFIG_PATH`] does not exist, so the binary runs from anywhere
/// with exactly the defaults a checkout has.
pub const DEFAULT_CONFIG: &str = include_str!("../config/overseer.toml");

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[store]`.
    #[serde(default)]
    pub store: StoreSection,
    /// `[cluster]`: membership and failover when `store.kind = "postgres"`.
    #[serde(default)]
    pub cluster: ClusterSection,
    /// `[runtime]`.
    #[serde(default)]
    pub runtime: RuntimeSection,
    /// `[limits]`: what one caller can make a session or the node hold.
    #[serde(default)]
    pub limits: LimitsSection,
    /// `[provider]`.
    #[serde(default)]
    pub provider: ProviderSection,
    /// `[[models]]`: named model routes; an agent whose `model` names one is
    /// served by it, every other agent by `[provider]`.
    #[serde(default)]
    pub models: Vec<RouteConfig>,
    /// `[http]`: the API server of `overseer serve`.
    #[serde(default)]
    pub http: HttpSection,
    /// `[[tools]]`: `http` tools.
    #[serde(default)]
    pub tools: Vec<HttpToolConfig>,
    /// `[http_request]`: enables the built-in `http_request` for these hosts.
    #[serde(default)]
    pub http_request: Option<HttpRequestConfig>,
    /// `[[mcp_servers]]`: MCP servers whose tools are `server__tool`.
    #[serde(default)]
    pub mcp_servers: Vec<McpServerConfig>,
    /// `[scope_tokens]`: the JWTs sent to http tools and MCP servers.
    #[serde(default)]
    pub scope_tokens: ScopeTokenSection,
    /// `[webhooks]`: notifications to the tenants' endpoints.
    #[serde(default)]
    pub webhooks: WebhooksSection,
    /// `[[agents]]`.
    #[serde(default)]
    pub agents: Vec<AgentSection>,
    /// `[[tasks]]`: stored tasks. Those of `tasks_dir` are added
    /// when the file is loaded.
    #[serde(default)]
    pub tasks: Vec<TaskSection>,
    /// A directory of `*.toml` files, one stored task each (the keys of
    /// `[[tasks]]`; `id` defaults to the file's name without `.toml`).
    #[serde(default)]
    pub tasks_dir: Option<PathBuf>,
    /// Directories of skills in the Agent Skills format: a path, or
    /// `{ path = "...", trusted = false }` for skills only a person may
    /// activate.
    #[serde(default)]
    pub skills_dirs: Vec<SkillsDirEntry>,
    /// `[telemetry]`: traces over OTLP (off without an endpoint).
    #[serde(default)]
    pub telemetry: crate::telemetry::TelemetrySection,
    /// `[log]`: the format of log lines.
    #[serde(default)]
    pub log: crate::telemetry::LogSection,
}

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

/// `[webhooks]`: how `overseer serve` delivers webhooks.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksSection {
    /// Whether the `/v1/webhooks` routes exist and events are delivered.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The public address of this service (`https://overseer.example.com`):
    /// payloads link to its inbox page. Empty: no links.
    #[serde(default)]
    pub public_url: String,
    /// Whether endpoints may be loopback addresses (127.0.0.0/8, ::1,
    /// localhost): a receiver on the same machine (tests, development).
    #[serde(default)]
    pub allow_loopback: bool,
    /// Whether endpoints may be private addresses (10/8, 172.16/12,
    /// 192.168/16, 100.64/10, fc00::/7).
    #[serde(default)]
    pub allow_private: bool,
    /// Seconds one attempt may take.
    #[serde(default = "default_hook_timeout")]
    pub request_timeout_secs: u64,
    /// Milliseconds before the first retry; doubled (with jitter) after
    /// each failed attempt.
    #[serde(default = "default_hook_retry_initial")]
    pub retry_initial_ms: u64,
    /// Longest delay between two attempts, seconds.
    #[serde(default = "default_hook_retry_max")]
    pub retry_max_secs: u64,
    /// A delivery still failing this many seconds after its event is given
    /// up, and its endpoint disabled with the reason recorded.
    #[serde(default = "default_hook_max_age")]
    pub max_age_secs: u64,
    /// A delivery that failed this many attempts is given up likewise.
    #[serde(default = "default_hook_max_attempts")]
    pub max_attempts: u32,
    /// Attempts in flight at once on a node.
    #[serde(default = "default_hook_concurrency")]
    pub concurrency: usize,
}

impl Default for WebhooksSection {
    fn default() -> Self {
        Self {
            enabled: true,
            public_url: String::new(),
            allow_loopback: false,
            allow_private: false,
            request_timeout_secs: default_hook_timeout(),
            retry_initial_ms: default_hook_retry_initial(),
            retry_max_secs: default_hook_retry_max(),
            max_age_secs: default_hook_max_age(),
            max_attempts: default_hook_max_attempts(),
            concurrency: default_hook_concurrency(),
        }
    }
}

impl WebhooksSection {
    /// The delivery options this section describes.
    pub fn options(&self) -> crate::webhooks::WebhookOptions {
        crate::webhooks::WebhookOptions {
            public_url: self.public_url.trim_end_matches('/').to_owned(),
            targets: crate::webhooks::TargetRules {
                allow_loopback: self.allow_loopback,
                allow_private: self.allow_private,
            },
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            retry_initial: Duration::from_millis(self.retry_initial_ms),
            retry_max: Duration::from_secs(self.retry_max_secs),
            max_age: Duration::from_secs(self.max_age_secs),
            max_attempts: self.max_attempts,
            concurrency: self.concurrency,
        }
    }

    fn problems(&self, out: &mut Vec<Problem>) {
        let ranges: [(&str, u64, u64, u64); 6] = [
            (
                "webhooks.request_timeout_secs",
                self.request_timeout_secs,
                1,
                300,
            ),
            (
                "webhooks.retry_initial_ms",
                self.retry_initial_ms,
                10,
                3_600_000,
            ),
            ("webhooks.retry_max_secs", self.retry_max_secs, 1, 86_400),
            ("webhooks.max_age_secs", self.max_age_secs, 1, 7 * 86_400),
            (
                "webhooks.max_attempts",
                u64::from(self.max_attempts),
                1,
                1_000,
            ),
            ("webhooks.concurrency", self.concurrency as u64, 1, 1_024),
        ];
        for (key, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                out.push(Problem::new(
                    key,
                    format!("must be between {min} and {max}, found {value}"),
                ));
            }
        }
        if self.retry_max_secs.saturating_mul(1000) < self.retry_initial_ms {
            out.push(Problem::new(
                "webhooks.retry_max_secs",
                format!(
                    "must be at least webhooks.retry_initial_ms ({} ms), found {} s",
                    self.retry_initial_ms, self.retry_max_secs
                ),
            ));
        }
        let url = self.public_url.trim();
        if !url.is_empty() {
            let parsed = reqwest::Url::parse(url);
            let ok = parsed.as_ref().is_ok_and(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.host_str().is_some_and(|h| !h.is_empty())
                    && u.query().is_none()
                    && u.fragment().is_none()
            });
            if !ok {
                out.push(Problem::new(
                    "webhooks.public_url",
                    format!("'{url}' is not an http(s) address like https://overseer.example.com"),
                ));
            }
        }
    }
}

fn yes() -> bool {
    true
}
fn default_hook_timeout() -> u64 {
    15
}
fn default_hook_retry_initial() -> u64 {
    5_000
}
fn default_hook_retry_max() -> u64 {
    3_600
}
fn default_hook_max_age() -> u64 {
    86_400
}
fn default_hook_max_attempts() -> u32 {
    100
}
fn default_hook_concurrency() -> usize {
    16
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
fn http_edge_problems(http: &HttpSection, out: &mut Vec<Problem>) {
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

/// Which checkpoint store a node uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// The embedded sled database in `data_dir` (one node).
    #[default]
    Sled,
    /// PostgreSQL at `OVERSEER_DATABASE_URL`, shared by the nodes of a
    /// cluster.
    Postgres,
}

/// `[store]`: the embedded sled database, or PostgreSQL in cluster mode.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// `sled` (the default) or `postgres`.
    #[serde(default)]
    pub kind: StoreKind,
    /// Most connections a node opens to PostgreSQL.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// Database directory.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Flush policy of checkpoints.
    #[serde(default)]
    pub durability: Durability,
    /// Most memory sled's page cache may hold, MiB.
    #[serde(default = "default_cache_mb")]
    pub cache_mb: u64,
    /// How a new sled directory stores its log: `none` (the default) or
    /// `zstd` (sled only; an existing directory keeps what it was created
    /// with).
    #[serde(default)]
    pub compression: Compression,
    /// Terminal sessions older than this many days are purged (unset: kept).
    #[serde(default)]
    pub retention_days: Option<u64>,
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            kind: StoreKind::default(),
            pool_size: default_pool_size(),
            data_dir: default_data_dir(),
            durability: Durability::default(),
            cache_mb: default_cache_mb(),
            compression: Compression::default(),
            retention_days: None,
        }
    }
}

impl StoreSection {
    /// How the store is opened.
    pub fn options(&self) -> StoreOptions {
        StoreOptions {
            durability: self.durability,
            cache_mb: self.cache_mb,
            compression: self.compression,
            ..StoreOptions::default()
        }
    }
}

fn default_cache_mb() -> u64 {
    DEFAULT_CACHE_MB
}

fn default_pool_size() -> usize {
    crate::store::postgres::DEFAULT_POOL_SIZE
}

/// Largest `store.pool_size`.
pub const MAX_POOL_SIZE: usize = 1_000;

/// `[cluster]`: membership, ownership and failover of cluster mode.
/// Read only when `store.kind = "postgres"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Seconds between two heartbeats of a node.
    #[serde(default = "default_heartbeat_secs")]
    pub heartbeat_secs: u64,
    /// A node whose heartbeat is older than this many seconds is dead, and
    /// its sessions are taken over.
    #[serde(default = "default_lease_secs")]
    pub lease_secs: u64,
    /// The URL other nodes reach this one's API at; empty: `http://` and
    /// the address it listens on (which must then not be 0.0.0.0).
    #[serde(default)]
    pub advertise_url: String,
    /// Sessions one node activates at once when it takes over a dead
    /// node's sessions.
    #[serde(default = "default_failover_concurrency")]
    pub failover_concurrency: usize,
    /// Most requests a node forwards to the owners of their sessions at
    /// once, counted apart from `http.max_in_flight_requests` (its own
    /// work); past it: 503 `overloaded`.
    #[serde(default = "default_max_in_flight_forwards")]
    pub max_in_flight_forwards: usize,
    /// A dead node stays listed (as dead) by `overseer cluster status` this
    /// many seconds after its last heartbeat; then its row is removed.
    #[serde(default = "default_dead_node_retention_secs")]
    pub dead_node_retention_secs: u64,
    /// Allow forwarding requests (and the caller's bearer token) over plain
    /// HTTP to a node whose advertise URL is not on loopback. Off: such a
    /// forward is refused (use `https://` advertise URLs).
    #[serde(default)]
    pub allow_plain_http: bool,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            heartbeat_secs: default_heartbeat_secs(),
            lease_secs: default_lease_secs(),
            advertise_url: String::new(),
            failover_concurrency: default_failover_concurrency(),
            max_in_flight_forwards: default_max_in_flight_forwards(),
            dead_node_retention_secs: default_dead_node_retention_secs(),
            allow_plain_http: false,
        }
    }
}

fn default_max_in_flight_forwards() -> usize {
    128
}
fn default_dead_node_retention_secs() -> u64 {
    3_600
}

fn default_heartbeat_secs() -> u64 {
    2
}
fn default_lease_secs() -> u64 {
    10
}
fn default_failover_concurrency() -> usize {
    32
}

/// `[runtime]`: supervision and timing.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    /// Restarts allowed within the window.
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
    /// Restart-counting window, seconds.
    #[serde(default = "default_restart_window_secs")]
    pub restart_window_secs: u64,
    /// Idle time before a session hibernates, seconds.
    #[serde(default = "default_idle_hibernate_secs")]
    pub idle_hibernate_secs: u64,
    /// Percent of `limits.max_live_sessions` past which the idle time
    /// shortens (see `overseer_actors::IdlePressure`).
    #[serde(default = "default_idle_pressure_share_pct")]
    pub idle_pressure_share_pct: u8,
    /// The shortest idle time, reached at the live-session limit, seconds.
    #[serde(default = "default_idle_hibernate_floor_secs")]
    pub idle_hibernate_floor_secs: u64,
    /// How long an API call waits for a session actor, seconds.
    #[serde(default = "default_call_timeout_secs")]
    pub call_timeout_secs: u64,
    /// Share of a model's context window, percent, past which a session
    /// compacts its older transcript.
    #[serde(default = "default_compaction_threshold_pct")]
    pub compaction_threshold_pct: u8,
}

fn default_idle_pressure_share_pct() -> u8 {
    overseer_actors::IdlePressure::default().share_pct
}
fn default_idle_hibernate_floor_secs() -> u64 {
    overseer_actors::IdlePressure::default().floor.as_secs()
}
fn default_compaction_threshold_pct() -> u8 {
    overseer_actors::machine::DEFAULT_COMPACTION_THRESHOLD_PCT
}

impl Default for RuntimeSection {
    fn default() -> Self {
        Self {
            max_restarts: default_max_restarts(),
            restart_window_secs: default_restart_window_secs(),
            idle_hibernate_secs: default_idle_hibernate_secs(),
            idle_pressure_share_pct: default_idle_pressure_share_pct(),
            idle_hibernate_floor_secs: default_idle_hibernate_floor_secs(),
            call_timeout_secs: default_call_timeout_secs(),
            compaction_threshold_pct: default_compaction_threshold_pct(),
        }
    }
}

/// `[limits]`: size and admission limits (see `overseer_actors::Limits`,
/// whose defaults these are).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Live session actors past which new sessions and activations by API
    /// requests get 503.
    #[serde(default = "default_max_live_sessions")]
    pub max_live_sessions: usize,
    /// Messages one session may hold queued behind its running turn.
    #[serde(default = "default_max_queued_messages")]
    pub max_queued_messages: u64,
    /// Bytes of text one session may hold queued.
    #[serde(default = "default_max_queued_bytes")]
    pub max_queued_bytes: u64,
    /// Bytes of a session title.
    #[serde(default = "default_max_title_bytes")]
    pub max_title_bytes: u64,
    /// Bytes of a session's metadata (JSON).
    #[serde(default = "default_max_metadata_bytes")]
    pub max_metadata_bytes: u64,
    /// Live session actors one tenant may have (unset: no quota).
    #[serde(default)]
    pub max_live_sessions_per_tenant: Option<usize>,
    /// Sessions one tenant may create per UTC day (unset: no quota).
    #[serde(default)]
    pub max_sessions_per_tenant_per_day: Option<u64>,
}

impl Default for LimitsSection {
    fn default() -> Self {
        let l = overseer_actors::Limits::default();
        Self {
            max_live_sessions: l.max_live_sessions,
            max_queued_messages: l.max_queued_messages,
            max_queued_bytes: l.max_queued_bytes,
            max_title_bytes: l.max_title_bytes,
            max_metadata_bytes: l.max_metadata_bytes,
            max_live_sessions_per_tenant: l.max_live_sessions_per_tenant,
            max_sessions_per_tenant_per_day: l.max_sessions_per_tenant_per_day,
        }
    }
}

impl LimitsSection {
    /// The limits as the runtime takes them.
    pub fn to_limits(&self) -> overseer_actors::Limits {
        overseer_actors::Limits {
            max_live_sessions: self.max_live_sessions,
            max_queued_messages: self.max_queued_messages,
            max_queued_bytes: self.max_queued_bytes,
            max_title_bytes: self.max_title_bytes,
            max_metadata_bytes: self.max_metadata_bytes,
            max_live_sessions_per_tenant: self.max_live_sessions_per_tenant,
            max_sessions_per_tenant_per_day: self.max_sessions_per_tenant_per_day,
        }
    }
}

fn default_max_live_sessions() -> usize {
    overseer_actors::Limits::default().max_live_sessions
}
fn default_max_queued_messages() -> u64 {
    overseer_actors::Limits::default().max_queued_messages
}
fn default_max_queued_bytes() -> u64 {
    overseer_actors::Limits::default().max_queued_bytes
}
fn default_max_title_bytes() -> u64 {
    overseer_actors::Limits::default().max_title_bytes
}
fn default_max_metadata_bytes() -> u64 {
    overseer_actors::Limits::default().max_metadata_bytes
}

/// `[provider]`: which LLM serves the agents.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// Provider kind.
    #[serde(default)]
    pub kind: ProviderKind,
    /// Scenario file of the scripted provider.
    #[serde(default = "default_scenario")]
    pub scenario: PathBuf,
    /// `openai` / `anthropic`: endpoint root (see `RouteConfig::base_url`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// `openai` / `anthropic`: the model id sent to the provider.
    #[serde(default)]
    pub model: Option<String>,
    /// `openai` / `anthropic`: env var holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Seconds to wait for a response to start.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Seconds a stream may stay silent before it is cut.
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    /// Most output tokens per request (see `RouteConfig::max_tokens`).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The longest `retry-after` honoured (see
    /// `RouteConfig::max_retry_after_secs`). Default: 60.
    #[serde(default)]
    pub max_retry_after_secs: Option<u64>,
    /// The model's context window, in tokens (see `RouteConfig::context_window`).
    #[serde(default)]
    pub context_window: Option<u64>,
}

impl Default for ProviderSection {
    fn default() -> Self {
        Self {
            kind: ProviderKind::default(),
            scenario: default_scenario(),
            base_url: None,
            model: None,
            api_key_env: None,
            timeout_secs: None,
            idle_timeout_secs: None,
            max_tokens: None,
            max_retry_after_secs: None,
            context_window: None,
        }
    }
}

impl ProviderSection {
    /// The default route every agent without a `[[models]]` route uses.
    pub fn route(&self) -> RouteConfig {
        let kind = match self.kind {
            ProviderKind::Scripted => RouteKind::Scripted,
            ProviderKind::Openai => RouteKind::Openai,
            ProviderKind::Anthropic => RouteKind::Anthropic,
        };
        let mut route = RouteConfig::new(kind, self.model.clone().unwrap_or_default());
        route.base_url.clone_from(&self.base_url);
        route.api_key_env.clone_from(&self.api_key_env);
        if let Some(t) = self.timeout_secs {
            route.timeout_secs = t;
        }
        if let Some(t) = self.idle_timeout_secs {
            route.idle_timeout_secs = t;
        }
        route.max_tokens = self.max_tokens;
        if let Some(secs) = self.max_retry_after_secs {
            route.max_retry_after_secs = secs;
        }
        route.context_window = self.context_window;
        if kind == RouteKind::Scripted {
            route.scenario = Some(self.scenario.clone());
        }
        route
    }
}

/// Provider kinds this binary can build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// Plays a scenario file; no network, no key.
    #[default]
    Scripted,
    /// Any OpenAI-compatible chat-completions endpoint.
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

/// One `[[agents]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// Unique name.
    pub name: String,
    /// Model route.
    #[serde(default = "default_model")]
    pub model: String,
    /// System instructions.
    #[serde(default)]
    pub instructions: String,
    /// Tools the agent may call: names, or patterns where `*` stands for
    /// any run of characters (`"fs__*"`), expanded at start-up.
    #[serde(default)]
    pub tools: Vec<String>,
    /// MCP servers whose every tool this agent may call: `[[mcp_servers]]`
    /// names, or inline tables (servers of this agent only).
    #[serde(default)]
    pub mcp_servers: Vec<AgentMcpServer>,
    /// Approval policy.
    #[serde(default)]
    pub approval: ApprovalPolicy,
    /// Most steps in one turn.
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    /// Run a step's approved calls concurrently.
    #[serde(default)]
    pub parallel_tool_calls: bool,
    /// Seconds before an undecided call is denied.
    #[serde(default = "default_approval_timeout_secs")]
    pub approval_timeout_secs: u64,
    /// Agents this one may delegate to with the built-in `delegate_task`.
    #[serde(default)]
    pub subagents: Vec<String>,
    /// Children's approvals: "propagate" (decided at the root) or "auto_approve".
    #[serde(default)]
    pub child_approval: ChildApproval,
    /// Deepest allowed delegation (root = 0).
    #[serde(default = "default_max_delegation_depth")]
    pub max_delegation_depth: u32,
    /// Most live children per session.
    #[serde(default = "default_max_children")]
    pub max_children: u32,
    /// Spending limits: `{ max_tokens, max_tool_calls, max_steps, max_wall_clock_secs }`.
    #[serde(default)]
    pub budget: Budget,
    /// JSON Schema the final answer of each turn must match.
    #[serde(default)]
    pub output_schema: Option<serde_json::Value>,
    /// Complete a session idle in awaiting_input this long.
    #[serde(default)]
    pub input_timeout_secs: Option<u64>,
    /// Per-tool approval rules overriding the tools' defaults (keys are
    /// names or patterns of the agent's tools; a name wins over a pattern).
    #[serde(default)]
    pub tool_approvals: std::collections::BTreeMap<String, bool>,
    /// Skills its sessions may use: names, or patterns where `*` stands
    /// for any run of characters, expanded at start-up.
    #[serde(default)]
    pub skills: Vec<String>,
    /// Stored tasks it may run with `run_task`: ids or patterns.
    #[serde(default)]
    pub tasks: Vec<String>,
}

fn default_max_delegation_depth() -> u32 {
    3
}

fn default_max_children() -> u32 {
    8
}

impl AgentSection {
    /// The agent as the runtime takes it.
    pub fn to_agent_config(&self) -> AgentConfig {
        AgentConfig {
            name: self.name.clone(),
            model: self.model.clone(),
            instructions: self.instructions.clone(),
            tools: self.tools.clone(),
            approval: self.approval,
            max_steps: self.max_steps,
            parallel_tool_calls: self.parallel_tool_calls,
            approval_timeout_secs: self.approval_timeout_secs,
            subagents: self.subagents.clone(),
            child_approval: self.child_approval,
            max_delegation_depth: self.max_delegation_depth,
            max_children: self.max_children,
            budget: self.budget,
            output_schema: self.output_schema.clone(),
            input_timeout_secs: self.input_timeout_secs,
            tool_approvals: self.tool_approvals.clone(),
            skills: self.skills.clone(),
            tasks: self.tasks.clone(),
        }
    }
}

fn default_data_dir() -> PathBuf {
    PathBuf::from("data")
}
fn default_max_restarts() -> u32 {
    3
}
fn default_restart_window_secs() -> u64 {
    60
}
fn default_idle_hibernate_secs() -> u64 {
    300
}
fn default_call_timeout_secs() -> u64 {
    30
}
fn default_scenario() -> PathBuf {
    PathBuf::from(crate::scenario::DEFAULT_SCENARIO_PATH)
}
fn default_model() -> String {
    "scripted".into()
}
fn default_max_steps() -> u32 {
    10
}
fn default_approval_timeout_secs() -> u64 {
    86_400
}

/// One invalid value (or unknown key), named by its key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Key path (`agents[1].approval`), or `VAR (key)` for the environment.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl Problem {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Why the configuration could not be loaded. Every message is one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{origin}:{line}:{column}: invalid TOML: {message}")]
    Syntax {
        /// The file (or `built-in defaults`).
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// Unknown keys or invalid values, all of them.
    #[error("{origin}: {}", join_problems(problems))]
    Invalid {
        /// The file, `built-in defaults` or `environment`.
        origin: String,
        /// Every problem found.
        problems: Vec<Problem>,
    },
}

fn join_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Values given as command-line flags; they win over file and environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--data`.
    pub data_dir: Option<PathBuf>,
    /// Durability (no `run` flag sets it; for the server's flags).
    pub durability: Option<Durability>,
    /// `--scenario`.
    pub scenario: Option<PathBuf>,
}

/// How to load the configuration.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// An explicit file (`--config`): it must exist. Without it,
    /// [`DEFAULT_CONFIG_PATH`] is used if present, else [`DEFAULT_CONFIG`].
    pub path: Option<PathBuf>,
    /// Flag values.
    pub overrides: Overrides,
}

/// The environment variables that override scalar keys, with those keys.
/// An empty variable counts as unset, as container runtimes often set them so.
pub const ENV_OVERRIDES: &[(&str, &str)] = &[
    ("OVERSEER_STORE_KIND", "store.kind"),
    ("OVERSEER_DATA_DIR", "store.data_dir"),
    ("OVERSEER_DURABILITY", "store.durability"),
    ("OVERSEER_STORE_CACHE_MB", "store.cache_mb"),
    ("OVERSEER_STORE_COMPRESSION", "store.compression"),
    ("OVERSEER_MAX_RESTARTS", "runtime.max_restarts"),
    (
        "OVERSEER_RESTART_WINDOW_SECS",
        "runtime.restart_window_secs",
    ),
    (
        "OVERSEER_IDLE_HIBERNATE_SECS",
        "runtime.idle_hibernate_secs",
    ),
    ("OVERSEER_CALL_TIMEOUT_SECS", "runtime.call_timeout_secs"),
    ("OVERSEER_PROVIDER", "provider.kind"),
    ("OVERSEER_SCENARIO", "provider.scenario"),
];

impl Config {
    /// Loads file, environment and flags, then validates against `tools`.
    /// Blocking (reads a file): call it before the async runtime starts or
    /// from a blocking thread.
    pub fn load(opts: &LoadOptions, tools: &ToolRegistry) -> Result<Self, ConfigError> {
        Self::load_with_env(opts, tools, |var| std::env::var_os(var))
    }

    /// [`Config::load`] with the environment supplied by the caller (tests).
    pub fn load_with_env(
        opts: &LoadOptions,
        tools: &ToolRegistry,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        let (origin, text) = match &opts.path {
            Some(path) => (path.display().to_string(), read(path)?),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                let path = Path::new(DEFAULT_CONFIG_PATH);
                (path.display().to_string(), read(path)?)
            }
            None => ("built-in defaults".to_owned(), DEFAULT_CONFIG.to_owned()),
        };
        let mut config = Self::parse(&text, &origin)?;
        config.apply_env(env)?;
        config.apply_overrides(&opts.overrides);
        config.load_tasks_dir()?;
        let problems = config.problems(tools);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid { origin, problems })
        }
    }

    /// The telemetry settings in force: `[telemetry]` overridden by the
    /// standard `OTEL_*` variables of `env`; `None` when traces are off.
    pub fn telemetry_settings(
        &self,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Option<crate::telemetry::Settings>, ConfigError> {
        self.telemetry
            .resolve(env)
            .map_err(|problem| ConfigError::Invalid {
                origin: "environment".into(),
                problems: vec![Problem::new("telemetry", problem)],
            })
    }

    /// The compiled-in defaults, unvalidated against any tool registry.
    pub fn builtin() -> Result<Self, ConfigError> {
        Self::parse(DEFAULT_CONFIG, "built-in defaults")
    }

    /// Parses TOML text. `origin` names it in errors. Checks shape only (keys
    /// and types); see [`Config::validate`] for the rules across values.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let table: Table = toml::from_str(text).map_err(|e| syntax_error(origin, text, &e))?;
        Value::Table(table.clone())
            .try_into::<Config>()
            .map_err(|e| ConfigError::Invalid {
                origin: origin.to_owned(),
                problems: explain(&table, &e),
            })
    }

    /// Checks the rules across values: unique agent names, existing tools,
    /// limits within range.
    pub fn validate(&self, tools: &ToolRegistry, origin: &str) -> Result<(), ConfigError> {
        let problems = self.problems(tools);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: origin.to_owned(),
                problems,
            })
        }
    }

    fn problems(&self, tools: &ToolRegistry) -> Vec<Problem> {
        let mut out = Vec::new();
        if self.store.data_dir.as_os_str().is_empty() {
            out.push(Problem::new("store.data_dir", "must not be empty"));
        }
        if self.store.kind == StoreKind::Postgres && self.store.compression != Compression::None {
            out.push(Problem::new(
                "store.compression",
                "applies to the sled store only (PostgreSQL compresses large values itself); \
                 remove it or set it to \"none\"",
            ));
        }
        if !(1..=MAX_CACHE_MB).contains(&self.store.cache_mb) {
            out.push(Problem::new(
                "store.cache_mb",
                format!(
                    "must be between 1 and {MAX_CACHE_MB} (MiB), found {}",
                    self.store.cache_mb
                ),
            ));
        }
        if self.store.pool_size < 2 || self.store.pool_size > MAX_POOL_SIZE {
            out.push(Problem::new(
                "store.pool_size",
                format!(
                    "must be between 2 and {MAX_POOL_SIZE}, found {}",
                    self.store.pool_size
                ),
            ));
        }
        let c = &self.cluster;
        if c.heartbeat_secs == 0 {
            out.push(Problem::new("cluster.heartbeat_secs", "must be at least 1"));
        }
        if c.lease_secs < 2 * c.heartbeat_secs.max(1) + 1 {
            out.push(Problem::new(
                "cluster.lease_secs",
                format!(
                    "must be more than twice cluster.heartbeat_secs ({}), so that one late heartbeat does not make a live node dead; found {}",
                    c.heartbeat_secs, c.lease_secs
                ),
            ));
        }
        if c.failover_concurrency == 0 {
            out.push(Problem::new(
                "cluster.failover_concurrency",
                "must be at least 1",
            ));
        }
        if c.max_in_flight_forwards == 0 || c.max_in_flight_forwards > crate::http::MAX_COUNT_LIMIT
        {
            out.push(Problem::new(
                "cluster.max_in_flight_forwards",
                format!(
                    "must be between 1 and {}, found {}",
                    crate::http::MAX_COUNT_LIMIT,
                    c.max_in_flight_forwards
                ),
            ));
        }
        if c.dead_node_retention_secs < c.lease_secs {
            out.push(Problem::new(
                "cluster.dead_node_retention_secs",
                format!(
                    "must be at least cluster.lease_secs ({}): a node is dead only after that; found {}",
                    c.lease_secs, c.dead_node_retention_secs
                ),
            ));
        }
        let http = ["http://", "https://"]
            .iter()
            .any(|p| c.advertise_url.starts_with(p));
        if !c.advertise_url.is_empty() && !http {
            out.push(Problem::new(
                "cluster.advertise_url",
                format!(
                    "'{}' is not an http(s) URL like http://10.0.0.5:8080",
                    c.advertise_url
                ),
            ));
        }
        let at_least_one = [
            (
                "runtime.restart_window_secs",
                self.runtime.restart_window_secs,
            ),
            ("runtime.call_timeout_secs", self.runtime.call_timeout_secs),
            (
                "runtime.idle_hibernate_floor_secs",
                self.runtime.idle_hibernate_floor_secs,
            ),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                out.push(Problem::new(key, "must be at least 1"));
            }
        }
        if self.store.retention_days == Some(0) {
            out.push(Problem::new(
                "store.retention_days",
                "must be at least 1 (leave it unset to keep sessions for ever)",
            ));
        }
        if !(1..=100).contains(&self.runtime.idle_pressure_share_pct) {
            out.push(Problem::new(
                "runtime.idle_pressure_share_pct",
                format!(
                    "must be between 1 and 100 (percent of limits.max_live_sessions), found {}",
                    self.runtime.idle_pressure_share_pct
                ),
            ));
        }
        if !(10..=99).contains(&self.runtime.compaction_threshold_pct) {
            out.push(Problem::new(
                "runtime.compaction_threshold_pct",
                format!(
                    "must be between 10 and 99 (percent), found {}",
                    self.runtime.compaction_threshold_pct
                ),
            ));
        }
        let l = &self.limits;
        let limits = [
            ("limits.max_live_sessions", l.max_live_sessions as u64),
            ("limits.max_queued_messages", l.max_queued_messages),
            ("limits.max_queued_bytes", l.max_queued_bytes),
            ("limits.max_title_bytes", l.max_title_bytes),
            ("limits.max_metadata_bytes", l.max_metadata_bytes),
        ];
        for (key, value) in limits {
            if value == 0 {
                out.push(Problem::new(key, "must be at least 1"));
            }
        }
        if self.provider.kind == ProviderKind::Scripted
            && self.provider.scenario.as_os_str().is_empty()
        {
            out.push(Problem::new("provider.scenario", "must not be empty"));
        }
        if self.provider.context_window == Some(0) {
            out.push(Problem::new(
                "provider.context_window",
                "must be at least 1 (tokens)",
            ));
        }
        if self.provider.max_retry_after_secs.is_some_and(|s| s > 3600) {
            out.push(Problem::new(
                "provider.max_retry_after_secs",
                "must be at most 3600",
            ));
        }
        for (i, route) in self.models.iter().enumerate() {
            match &route.name {
                None => out.push(Problem::new(
                    format!("models[{i}].name"),
                    "required: agents name a route by it",
                )),
                Some(n) if self.models[..i].iter().any(|r| r.name.as_ref() == Some(n)) => {
                    out.push(Problem::new(
                        format!("models[{i}].name"),
                        format!("duplicate route '{n}'"),
                    ))
                }
                Some(_) => {}
            }
            if let Err(e) = route.validate() {
                out.push(Problem::new(format!("models[{i}]"), e.to_string()));
            }
        }
        self.webhooks.problems(&mut out);
        for (key, problem) in self.telemetry.problems() {
            out.push(Problem::new(key, problem));
        }
        if self.http.listen.parse::<std::net::SocketAddr>().is_err() {
            out.push(Problem::new(
                "http.listen",
                format!(
                    "'{}' is not an address like 127.0.0.1:8080",
                    self.http.listen
                ),
            ));
        }
        if matches!(self.http.auth, AuthMode::Rs256 | AuthMode::Es256)
            && self.http.public_key_pem.is_none()
        {
            out.push(Problem::new(
                "http.public_key_pem",
                "required when http.auth is rs256 or es256",
            ));
        }
        let http = &self.http;
        http_edge_problems(http, &mut out);
        if http.jwt_leeway_secs > MAX_JWT_LEEWAY_SECS {
            out.push(Problem::new(
                "http.jwt_leeway_secs",
                format!("must be at most {MAX_JWT_LEEWAY_SECS}"),
            ));
        }
        let http_secs = [
            (
                "http.header_read_timeout_secs",
                http.header_read_timeout_secs,
            ),
            (
                "http.request_body_timeout_secs",
                http.request_body_timeout_secs,
            ),
            ("http.idle_timeout_secs", http.idle_timeout_secs),
        ];
        for (key, value) in http_secs {
            if value == 0 {
                out.push(Problem::new(key, "must be at least 1"));
            }
        }
        let http_counts = [
            ("http.max_connections", http.max_connections),
            ("http.max_in_flight_requests", http.max_in_flight_requests),
        ];
        for (key, value) in http_counts {
            if value == 0 || value > MAX_COUNT_LIMIT {
                out.push(Problem::new(
                    key,
                    format!("must be between 1 and {MAX_COUNT_LIMIT}"),
                ));
            }
        }
        if self.agents.is_empty() {
            out.push(Problem::new(
                "agents",
                "at least one [[agents]] table is required",
            ));
        }
        // A declared tool's schema is held to the bounds of every user
        // schema (`overseer_actors::schema`), reported here under its key.
        for (i, tool) in self.tools.iter().enumerate() {
            if let Err(e) = overseer_actors::schema::check(&tool.parameters) {
                out.push(Problem::new(
                    format!("tools[{i}].parameters"),
                    e.to_string(),
                ));
            }
        }
        self.task_problems(&mut out);
        let available = tools.names().collect::<Vec<_>>().join(", ");
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, agent) in self.agents.iter().enumerate() {
            let at = |key: &str| format!("agents[{i}].{key}");
            if agent.name.trim().is_empty() {
                out.push(Problem::new(at("name"), "must not be empty"));
            } else if let Some(first) = seen.get(agent.name.as_str()) {
                out.push(Problem::new(
                    at("name"),
                    format!(
                        "duplicate agent name '{}' (also agents[{first}])",
                        agent.name
                    ),
                ));
            } else {
                seen.insert(&agent.name, i);
            }
            if agent.max_steps == 0 {
                out.push(Problem::new(at("max_steps"), "must be at least 1"));
            }
            if agent.approval_timeout_secs == 0 {
                out.push(Problem::new(
                    at("approval_timeout_secs"),
                    "must be at least 1",
                ));
            }
            for sub in &agent.subagents {
                if !self.agents.iter().any(|a| &a.name == sub) {
                    out.push(Problem::new(
                        at("subagents"),
                        format!("agent '{}' lists unknown subagent '{sub}'", agent.name),
                    ));
                }
            }
            if agent.max_children == 0 {
                out.push(Problem::new(at("max_children"), "must be at least 1"));
            }
            if let Some(schema) = &agent.output_schema {
                if let Err(e) = overseer_actors::schema::check_output(schema) {
                    out.push(Problem::new(at("output_schema"), e.to_string()));
                }
            }
            self.agent_tool_problems(i, &mut out);
            self.agent_task_problems(i, &mut out);
            for (j, tool) in agent.tools.iter().enumerate() {
                if agent.tools[..j].contains(tool) {
                    out.push(Problem::new(
                        at("tools"),
                        format!("agent '{}' lists tool '{tool}' twice", agent.name),
                    ));
                } else if is_pattern(tool) {
                    // Checked when the servers have listed their tools.
                } else if !self.declares_tool_for(tools, agent, tool) {
                    out.push(Problem::new(
                        at("tools"),
                        format!(
                            "agent '{}' lists unknown tool '{tool}' (available: {available})",
                            agent.name
                        ),
                    ));
                }
            }
        }
        out
    }

    fn apply_env(&mut self, env: impl Fn(&str) -> Option<OsString>) -> Result<(), ConfigError> {
        // Empty counts as unset (see ENV_OVERRIDES).
        let get = |var: &str| env(var).filter(|v| !v.is_empty());
        let mut problems = Vec::new();
        if let Some(dir) = get("OVERSEER_DATA_DIR") {
            self.store.data_dir = PathBuf::from(dir);
        }
        if let Some(path) = get("OVERSEER_SCENARIO") {
            self.provider.scenario = PathBuf::from(path);
        }
        env_value(
            &get,
            "OVERSEER_STORE_KIND",
            false,
            &mut self.store.kind,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_DURABILITY",
            false,
            &mut self.store.durability,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_STORE_CACHE_MB",
            true,
            &mut self.store.cache_mb,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_STORE_COMPRESSION",
            false,
            &mut self.store.compression,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_PROVIDER",
            false,
            &mut self.provider.kind,
            &mut problems,
        );
        let rt = &mut self.runtime;
        env_value(
            &get,
            "OVERSEER_MAX_RESTARTS",
            true,
            &mut rt.max_restarts,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_RESTART_WINDOW_SECS",
            true,
            &mut rt.restart_window_secs,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_IDLE_HIBERNATE_SECS",
            true,
            &mut rt.idle_hibernate_secs,
            &mut problems,
        );
        env_value(
            &get,
            "OVERSEER_CALL_TIMEOUT_SECS",
            true,
            &mut rt.call_timeout_secs,
            &mut problems,
        );
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: "environment".into(),
                problems,
            })
        }
    }

    fn apply_overrides(&mut self, o: &Overrides) {
        if let Some(dir) = &o.data_dir {
            self.store.data_dir.clone_from(dir);
        }
        if let Some(d) = o.durability {
            self.store.durability = d;
        }
        if let Some(path) = &o.scenario {
            self.provider.scenario.clone_from(path);
        }
    }

    /// Whether `name` is a tool this configuration provides: a built-in, a
    /// `[[tools]]` entry, `http_request` when configured, or `server__tool`
    /// of a configured MCP server (checked again once the server listed its
    /// tools).
    pub fn declares_tool(&self, builtins: &ToolRegistry, name: &str) -> bool {
        builtins.spec(name).is_some()
            || self.tools.iter().any(|t| t.name == name)
            || (name == "http_request" && self.http_request.is_some())
            || name
                .split_once("__")
                .is_some_and(|(server, _)| self.mcp_servers.iter().any(|m| m.name == server))
    }

    /// Applies `overseer run`'s provider flags on top of the file and env.
    pub fn apply_provider_flags(
        &mut self,
        kind: Option<&str>,
        base_url: Option<String>,
        model: Option<String>,
        api_key_env: Option<String>,
    ) {
        match kind {
            Some("openai") => self.provider.kind = ProviderKind::Openai,
            Some("anthropic") => self.provider.kind = ProviderKind::Anthropic,
            Some("scripted") => self.provider.kind = ProviderKind::Scripted,
            _ => {}
        }
        if base_url.is_some() {
            self.provider.base_url = base_url;
        }
        if model.is_some() {
            self.provider.model = model;
        }
        if api_key_env.is_some() {
            self.provider.api_key_env = api_key_env;
        }
    }

    /// The agent named `name`.
    pub fn agent(&self, name: &str) -> Option<&AgentSection> {
        self.agents.iter().find(|a| a.name == name)
    }

    /// Names of the configured agents, in file order.
    pub fn agent_names(&self) -> Vec<&str> {
        self.agents.iter().map(|a| a.name.as_str()).collect()
    }

    /// The name of the default route (`[provider]`, with any flags
    /// applied): see `RouteConfig::label`.
    pub fn default_route_name(&self) -> String {
        self.provider.route().label()
    }

    /// Whether `name` is a `[[models]]` route.
    fn is_model_table(&self, name: &str) -> bool {
        self.models.iter().any(|m| m.name.as_deref() == Some(name))
    }

    /// The names agents give the default route: their `model` when no
    /// `[[models]]` table has it (`"scripted"`, the default). Sessions
    /// stored before routes had names of their own carry these.
    pub fn default_route_aliases(&self) -> Vec<String> {
        let default = self.default_route_name();
        let mut names: Vec<String> = self
            .agents
            .iter()
            .map(|a| a.model.clone())
            .filter(|m| !self.is_model_table(m) && *m != default)
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Every model route a session may use: the `[[models]]` names and the
    /// default route's, sorted.
    pub fn route_names(&self) -> Vec<String> {
        let mut routes: Vec<String> = self
            .models
            .iter()
            .filter_map(|m| m.name.clone())
            .chain(std::iter::once(self.default_route_name()))
            .collect();
        routes.sort_unstable();
        routes.dedup();
        routes
    }

    /// Every agent as the runtime takes it, its `model` naming the route
    /// that really serves it: a `[[models]]` name, or the default route's
    /// (so a session's configuration says `openai:llama3.2@…`, not
    /// `scripted`, when `[provider]` serves it).
    pub fn agent_configs(&self) -> Vec<AgentConfig> {
        let default = self.default_route_name();
        self.agents
            .iter()
            .map(|a| {
                let mut agent = a.to_agent_config();
                if !self.is_model_table(&agent.model) {
                    agent.model.clone_from(&default);
                }
                agent
            })
            .collect()
    }

    /// The runtime tunables. Backoff figures are the design's and not
    /// configurable.
    pub fn runtime_config(&self) -> RuntimeConfig {
        let defaults = RestartPolicy::default();
        RuntimeConfig {
            restart: RestartPolicy {
                max_restarts: self.runtime.max_restarts,
                restart_window_secs: self.runtime.restart_window_secs,
                backoff_base_ms: defaults.backoff_base_ms,
                backoff_max_ms: defaults.backoff_max_ms,
            },
            call_timeout: Duration::from_secs(self.runtime.call_timeout_secs),
            idle_hibernate: self.idle_hibernate(),
            idle_pressure: overseer_actors::IdlePressure {
                share_pct: self.runtime.idle_pressure_share_pct,
                floor: Duration::from_secs(self.runtime.idle_hibernate_floor_secs),
            },
            limits: self.limits.to_limits(),
            compaction_threshold_pct: self.runtime.compaction_threshold_pct,
            janitor: Some(overseer_actors::janitor::JanitorConfig {
                retention: self
                    .store
                    .retention_days
                    .map(|d| Duration::from_secs(d.saturating_mul(86_400))),
                ..Default::default()
            }),
        }
    }

    /// Idle time before a session hibernates; `None` (configured as 0)
    /// never hibernates.
    pub fn idle_hibernate(&self) -> Option<Duration> {
        match self.runtime.idle_hibernate_secs {
            0 => None,
            secs => Some(Duration::from_secs(secs)),
        }
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Applies one environment override, recording a problem instead of failing
/// so every bad variable is reported at once.
fn env_value<T: DeserializeOwned>(
    get: &impl Fn(&str) -> Option<OsString>,
    var: &str,
    numeric: bool,
    slot: &mut T,
    problems: &mut Vec<Problem>,
) {
    let Some(raw) = get(var) else { return };
    let key = ENV_OVERRIDES
        .iter()
        .find(|(v, _)| *v == var)
        .map_or("?", |(_, k)| *k);
    let name = format!("{var} ({key})");
    let Some(raw) = raw.to_str() else {
        problems.push(Problem::new(name, "not valid UTF-8"));
        return;
    };
    // Going through a TOML value gives the same messages as the file.
    let value = if numeric {
        match raw.trim().parse::<i64>() {
            Ok(n) => Value::Integer(n),
            Err(_) => {
                problems.push(Problem::new(
                    name,
                    format!("expected an integer, found '{raw}'"),
                ));
                return;
            }
        }
    } else {
        Value::String(raw.to_owned())
    };
    match value.try_into::<T>() {
        Ok(v) => *slot = v,
        Err(e) => problems.push(Problem::new(name, humanize(e.message()))),
    }
}

fn syntax_error(origin: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let start = e.span().map_or(0, |s| s.start).min(text.len());
    let before = text.get(..start).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    ConfigError::Syntax {
        origin: origin.to_owned(),
        line,
        column,
        message: one_line(e.message()),
    }
}

/// Finds which keys made a whole-file deserialization fail.
///
/// Serde reports *what* is wrong but not *where*; rather than depend on a
/// path-tracking deserializer, each key is tried alone (inside a minimal valid
/// table) against the same derived types, so the messages and the rules stay
/// those of the types themselves.
fn explain(table: &Table, whole: &toml::de::Error) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (key, value) in table {
        match (key.as_str(), value) {
            ("store", Value::Table(t)) => {
                problems.extend(bad_keys::<StoreSection>(t, &Table::new(), "store"))
            }
            ("cluster", Value::Table(t)) => {
                problems.extend(bad_keys::<ClusterSection>(t, &Table::new(), "cluster"))
            }
            ("runtime", Value::Table(t)) => {
                problems.extend(bad_keys::<RuntimeSection>(t, &Table::new(), "runtime"))
            }
            ("provider", Value::Table(t)) => {
                problems.extend(bad_keys::<ProviderSection>(t, &Table::new(), "provider"))
            }
            ("http", Value::Table(t)) => {
                problems.extend(bad_keys::<HttpSection>(t, &Table::new(), "http"))
            }
            ("scope_tokens", Value::Table(t)) => problems.extend(bad_keys::<ScopeTokenSection>(
                t,
                &Table::new(),
                "scope_tokens",
            )),
            ("tools" | "mcp_servers", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let bad = if key == "tools" {
                        item.clone().try_into::<HttpToolConfig>().err()
                    } else {
                        item.clone().try_into::<McpServerConfig>().err()
                    };
                    if let Some(e) = bad {
                        problems.push(problem_for(&format!("{key}[{i}]"), e.message()));
                    }
                }
            }
            ("models", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if let Err(e) = item.clone().try_into::<RouteConfig>() {
                        problems.push(problem_for(&format!("models[{i}]"), e.message()));
                    }
                }
            }
            ("agents", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    problems.extend(explain_agent(i, item));
                }
            }
            ("tasks", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if let Err(e) = item.clone().try_into::<TaskSection>() {
                        problems.push(problem_for(&format!("tasks[{i}]"), e.message()));
                    }
                }
            }
            _ => {
                let mut alone = Table::new();
                alone.insert(key.clone(), value.clone());
                if let Err(e) = Value::Table(alone).try_into::<Config>() {
                    problems.push(problem_for(key, e.message()));
                }
            }
        }
    }
    if problems.is_empty() {
        problems.push(Problem::new("(document)", humanize(whole.message())));
    }
    problems
}

fn explain_agent(i: usize, item: &Value) -> Vec<Problem> {
    let path = format!("agents[{i}]");
    let Value::Table(t) = item else {
        return vec![Problem::new(
            path,
            format!("expected a table ([[agents]]), found {}", item.type_str()),
        )];
    };
    let mut base = Table::new();
    base.insert("name".into(), Value::String("_".into()));
    let mut problems = Vec::new();
    if !t.contains_key("name") {
        problems.push(Problem::new(format!("{path}.name"), "required"));
    }
    let mut rest = t.clone();
    if let Some(servers) = rest.remove("mcp_servers") {
        problems.extend(explain_agent_servers(&path, &servers));
    }
    problems.extend(bad_keys::<AgentSection>(&rest, &base, &path));
    if problems.is_empty() {
        if let Err(e) = item.clone().try_into::<AgentSection>() {
            problems.push(Problem::new(path, humanize(e.message())));
        }
    }
    problems
}

/// An agent's `mcp_servers`, entry by entry: a name, or a table with the
/// keys of `[[mcp_servers]]` (whose own message names the bad key; serde's
/// for the pair would only say that neither shape fits).
fn explain_agent_servers(path: &str, servers: &Value) -> Vec<Problem> {
    let Value::Array(items) = servers else {
        return vec![Problem::new(
            format!("{path}.mcp_servers"),
            format!(
                "expected an array of server names or tables, found {}",
                servers.type_str()
            ),
        )];
    };
    let mut problems = Vec::new();
    for (j, item) in items.iter().enumerate() {
        let key = format!("{path}.mcp_servers[{j}]");
        match item {
            Value::String(_) => {}
            Value::Table(_) => {
                if let Err(e) = item.clone().try_into::<McpServerConfig>() {
                    problems.push(problem_for(&key, e.message()));
                }
            }
            other => problems.push(Problem::new(
                key,
                format!(
                    "expected a server name or a table with the keys of [[mcp_servers]], found {}",
                    other.type_str()
                ),
            )),
        }
    }
    problems
}

fn bad_keys<T: DeserializeOwned>(table: &Table, base: &Table, path: &str) -> Vec<Problem> {
    table
        .iter()
        .filter_map(|(k, v)| {
            let mut alone = base.clone();
            alone.insert(k.clone(), v.clone());
            Value::Table(alone)
                .try_into::<T>()
                .err()
                .map(|e| problem_for(&format!("{path}.{k}"), e.message()))
        })
        .collect()
}

fn problem_for(key: &str, message: &str) -> Problem {
    Problem::new(key, humanize(message))
}

/// Rewrites serde's messages into the house style:
/// ``unknown variant `x`, expected one of `a`, `b` `` becomes
/// `unknown variant 'x', expected a|b`, and an unknown field becomes
/// `unknown key, expected one of a, b` (the key is already in the path).
fn humanize(message: &str) -> String {
    let message = one_line(message);
    let (head, options) = if let Some((head, tail)) = message.split_once(", expected one of ") {
        let options: Vec<String> = tail
            .split(", ")
            .map(|s| s.trim_matches('`').to_owned())
            .collect();
        (head.to_owned(), options)
    } else if let Some((head, tail)) = message
        .split_once(", expected `")
        .filter(|(h, _)| h.starts_with("unknown "))
    {
        let options = tail
            .trim_end_matches('`')
            .split("` or `")
            .map(str::to_owned)
            .collect();
        (head.to_owned(), options)
    } else {
        return message.replace('`', "'");
    };
    if head.starts_with("unknown field") {
        format!("unknown key, expected one of {}", options.join(", "))
    } else {
        format!("{}, expected {}", head.replace('`', "'"), options.join("|"))
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::builtin_registry;

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    fn parse_err(text: &str) -> String {
        Config::parse(text, "test.toml").unwrap_err().to_string()
    }

    fn load_text(
        text: &str,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        let opts = LoadOptions {
            path: Some(path),
            overrides: Overrides::default(),
        };
        Config::load_with_env(&opts, &builtin_registry().unwrap(), env)
    }

    const MINIMAL: &str = "[[agents]]\nname = \"a\"\n";

    #[test]
    fn builtin_file_is_valid_and_has_the_demo_agents() {
        let c = Config::builtin().unwrap();
        c.validate(&builtin_registry().unwrap(), "built-in")
            .unwrap();
        assert_eq!(
            c.agent_names(),
            vec!["assistant", "auto", "lead", "researcher", "reviewer"]
        );
        let lead = c.agent("lead").unwrap();
        assert_eq!(lead.subagents, vec!["researcher", "reviewer"]);
        assert_eq!(lead.budget.max_steps, Some(50));
        let assistant = c.agent("assistant").unwrap();
        assert_eq!(assistant.approval, ApprovalPolicy::Always);
        assert_eq!(assistant.tools, vec!["current_time".to_owned()]);
        assert_eq!(c.agent("auto").unwrap().approval, ApprovalPolicy::Auto);
    }

    #[test]
    fn file_values_equal_the_serde_defaults() {
        // The commented file claims to show every default; hold it to that.
        let file = Config::builtin().unwrap();
        let bare = Config::parse(MINIMAL, "t").unwrap();
        assert_eq!(file.runtime, bare.runtime);
        assert_eq!(file.provider, bare.provider);
        assert_eq!(file.store, bare.store);
        assert_eq!(file.http, bare.http);
        assert_eq!(file.scope_tokens, bare.scope_tokens);
        assert_eq!(file.store.durability, Durability::Fsync);
        let a = &bare.agents[0];
        for f in &file.agents {
            assert_eq!(f.model, a.model);
            assert_eq!(f.max_steps, a.max_steps);
            assert_eq!(f.parallel_tool_calls, a.parallel_tool_calls);
            assert_eq!(f.approval_timeout_secs, a.approval_timeout_secs);
        }
        assert_eq!(a.approval, ApprovalPolicy::PerTool);
    }

    #[test]
    fn unknown_variant_names_its_key_in_house_style() {
        let e = parse_err(
            "[[agents]]\nname = \"a\"\n[[agents]]\nname = \"b\"\napproval = \"sometimes\"\n",
        );
        assert_eq!(
            e,
            "test.toml: agents[1].approval: unknown variant 'sometimes', expected auto|per_tool|always"
        );
    }

    #[test]
    fn unknown_keys_are_errors_everywhere() {
        assert!(parse_err("bogus = 1\n").contains("bogus: unknown key"));
        let e = parse_err("[store]\nbogus = 1\n");
        assert!(
            e.contains("store.bogus: unknown key, expected one of kind, pool_size, data_dir, durability, cache_mb"),
            "{e}"
        );
        let e = parse_err("[[agents]]\nname = \"a\"\ncolour = \"red\"\n");
        assert!(e.contains("agents[0].colour: unknown key"), "{e}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let e = parse_err(
            "[store]\ndurability = \"never\"\n[runtime]\nmax_restarts = -1\ncall_timeout_secs = \"x\"\n[[agents]]\nmodel = \"m\"\n",
        );
        assert!(
            e.contains("store.durability: unknown variant 'never', expected fsync|os"),
            "{e}"
        );
        assert!(e.contains("runtime.max_restarts: invalid value"), "{e}");
        assert!(e.contains("runtime.call_timeout_secs: invalid type"), "{e}");
        assert!(e.contains("agents[0].name: required"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn session_limits_are_read_and_checked_with_their_keys() {
        let text =
            "[limits]\nmax_queued_messages = 0\nmax_title_bytes = 0\n[[agents]]\nname = \"a\"\n";
        let e = load_text(text, no_env).unwrap_err().to_string();
        assert!(
            e.contains("limits.max_queued_messages: must be at least 1"),
            "{e}"
        );
        assert!(
            e.contains("limits.max_title_bytes: must be at least 1"),
            "{e}"
        );
        let text = "[limits]\nmax_live_sessions = 7\n[[agents]]\nname = \"a\"\n";
        let c = load_text(text, no_env).unwrap();
        let limits = c.runtime_config().limits;
        assert_eq!(limits.max_live_sessions, 7);
        assert_eq!(
            limits.max_queued_bytes,
            overseer_actors::Limits::default().max_queued_bytes
        );
    }

    #[test]
    fn idle_pressure_keys_reach_the_runtime_and_are_checked() {
        let c = load_text(MINIMAL, no_env).unwrap();
        assert_eq!(
            c.runtime_config().idle_pressure,
            overseer_actors::IdlePressure::default()
        );
        let text = "[runtime]\nidle_pressure_share_pct = 80\nidle_hibernate_floor_secs = 30\n[[agents]]\nname = \"a\"\n";
        let p = load_text(text, no_env)
            .unwrap()
            .runtime_config()
            .idle_pressure;
        assert_eq!((p.share_pct, p.floor), (80, Duration::from_secs(30)));
        let text = "[runtime]\nidle_pressure_share_pct = 0\nidle_hibernate_floor_secs = 0\n[[agents]]\nname = \"a\"\n";
        let e = load_text(text, no_env).unwrap_err().to_string();
        assert!(
            e.contains("runtime.idle_pressure_share_pct: must be between 1 and 100"),
            "{e}"
        );
        assert!(
            e.contains("runtime.idle_hibernate_floor_secs: must be at least 1"),
            "{e}"
        );
    }

    #[test]
    fn schemas_past_their_bounds_are_config_errors_naming_the_key() {
        let deep = |levels: usize| {
            format!(
                "{}{{ type = \"string\" }}{}",
                "{ items = ".repeat(levels - 1),
                " }".repeat(levels - 1)
            )
        };
        let max = overseer_actors::schema::MAX_SCHEMA_DEPTH;
        let text = format!(
            "[[tools]]\nname = \"t\"\ndescription = \"d\"\nurl = \"http://127.0.0.1:9/t\"\nparameters = {}\n[[agents]]\nname = \"a\"\noutput_schema = {}\n",
            deep(max + 1),
            deep(max + 1)
        );
        let e = load_text(&text, no_env).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "tools[0].parameters: nested deeper than {max} levels"
            )),
            "{e}"
        );
        assert!(
            e.contains(&format!(
                "agents[0].output_schema: nested deeper than {max} levels"
            )),
            "{e}"
        );
        let text = format!(
            "[[tools]]\nname = \"t\"\ndescription = \"d\"\nurl = \"http://127.0.0.1:9/t\"\nparameters = {}\n[[agents]]\nname = \"a\"\noutput_schema = {}\n",
            deep(max),
            deep(max)
        );
        load_text(&text, no_env).unwrap();
    }

    #[test]
    fn http_limits_are_checked_with_their_keys() {
        let text = "[http]\njwt_leeway_secs = 3600\nheader_read_timeout_secs = 0\nmax_connections = 0\nmax_in_flight_requests = 100000\n[[agents]]\nname = \"a\"\n";
        let e = load_text(text, no_env).unwrap_err().to_string();
        assert!(
            e.contains("http.jwt_leeway_secs: must be at most 300"),
            "{e}"
        );
        assert!(
            e.contains("http.header_read_timeout_secs: must be at least 1"),
            "{e}"
        );
        assert!(
            e.contains("http.max_connections: must be between 1 and 65535"),
            "{e}"
        );
        assert!(
            e.contains("http.max_in_flight_requests: must be between"),
            "{e}"
        );
        let c = Config::builtin().unwrap();
        let limits = c.http.options().limits;
        assert_eq!(limits, HttpLimits::default());
        assert_eq!(c.http.jwt_leeway(), Duration::from_secs(5));
    }

    #[test]
    fn syntax_errors_give_a_position_on_one_line() {
        let e = parse_err("[store]\ndata_dir = \n");
        assert!(e.starts_with("test.toml:2:"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn validation_names_agent_and_tool() {
        let text = "[[agents]]\nname = \"a\"\ntools = [\"current_time\", \"launch_rockets\"]\nmax_steps = 0\n[[agents]]\nname = \"a\"\n";
        let e = load_text(text, no_env).unwrap_err().to_string();
        // (The fault-injection build adds a test tool to the available list.)
        assert!(
            e.contains(
                "agents[0].tools: agent 'a' lists unknown tool 'launch_rockets' (available: current_time"
            ),
            "{e}"
        );
        assert!(e.contains("agents[0].max_steps: must be at least 1"), "{e}");
        assert!(
            e.contains("agents[1].name: duplicate agent name 'a' (also agents[0])"),
            "{e}"
        );
        let e = load_text("[store]\n", no_env).unwrap_err().to_string();
        assert!(e.contains("agents: at least one"), "{e}");
    }

    #[test]
    fn agent_servers_patterns_and_approval_rules_are_checked_naming_the_agent() {
        let text = r#"
[[mcp_servers]]
name = "shared"
command = "node"

[[agents]]
name = "a"
tools = ["current_time", "fs.*"]
mcp_servers = ["shared", "missing", { name = "own", command = "node" }, "shared"]
tool_approvals = { current_time = true, own__write = false, launch_rockets = true, "own__*" = true }

[[agents]]
name = "b"
mcp_servers = [{ name = "own", command = "node" }, { name = "shared", url = "http://127.0.0.1:1/mcp" }]

[[agents]]
name = "c"
tools = ["own__write"]
"#;
        let e = load_text(text, no_env).unwrap_err().to_string();
        for expected in [
            "agents[0].mcp_servers[1]: agent 'a' names MCP server 'missing', which no [[mcp_servers]] entry defines",
            "agents[0].mcp_servers[3]: agent 'a' lists MCP server 'shared' twice",
            "agents[0].tools: agent 'a' lists tool pattern 'fs.*', which may contain only letters, digits, '_', '-' and '*'",
            "agents[0].tool_approvals: agent 'a' sets an approval rule for 'launch_rockets', which is not one of its tools",
            "agents[1].mcp_servers[0]: agent 'b' defines MCP server 'own', which agent 'a' defines too",
            "agents[1].mcp_servers[1]: agent 'b' defines MCP server 'shared', a name [[mcp_servers]] already uses",
            // Agent a's own server is not b's.
            "agents[2].tools: agent 'c' lists unknown tool 'own__write'",
        ] {
            assert!(e.contains(expected), "missing «{expected}» in {e}");
        }
        // Rules for a's tools (own server, pattern, listed) are accepted.
        assert!(!e.contains("'own__write', which is not"), "{e}");
        assert!(!e.contains("'current_time', which is not"), "{e}");

        // A misspelt key of an inline server is named where it is.
        let e = parse_err(
            "[[agents]]\nname = \"a\"\nmcp_servers = [{ name = \"x\", comand = \"node\" }, 5]\n",
        );
        assert!(
            e.contains("agents[0].mcp_servers[0]: unknown key, expected one of"),
            "{e}"
        );
        assert!(
            e.contains("agents[0].mcp_servers[1]: expected a server name or a table"),
            "{e}"
        );
        // delegate_task has a rule only for an agent that delegates.
        let e = load_text(
            "[[agents]]\nname = \"a\"\ntool_approvals = { delegate_task = true }\n",
            no_env,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rule for 'delegate_task'"), "{e}");
        load_text(
            "[[agents]]\nname = \"a\"\nsubagents = [\"a\"]\ntool_approvals = { delegate_task = true }\n",
            no_env,
        )
        .unwrap();
    }

    /// A tool that only has a name (resolution looks at names alone).
    struct Named(overseer_actors::tool::ToolSpec);

    #[async_trait::async_trait]
    impl overseer_actors::tool::Tool for Named {
        fn spec(&self) -> &overseer_actors::tool::ToolSpec {
            &self.0
        }
        async fn call(
            &self,
            _: overseer_actors::tool::ToolContext,
            _: serde_json::Value,
        ) -> Result<serde_json::Value, overseer_actors::tool::ToolError> {
            Ok(serde_json::Value::Null)
        }
    }

    fn registry(names: &[&str]) -> ToolRegistry {
        let tools = names
            .iter()
            .map(|n| {
                let spec = overseer_actors::tool::ToolSpec::new(
                    *n,
                    "d",
                    serde_json::json!({"type": "object"}),
                );
                std::sync::Arc::new(Named(spec)) as std::sync::Arc<dyn overseer_actors::tool::Tool>
            })
            .collect();
        ToolRegistry::new(tools).unwrap()
    }

    #[test]
    fn resolution_expands_patterns_and_servers_and_keeps_own_servers_private() {
        let text = r#"
[[mcp_servers]]
name = "fs"
command = "node"

[[agents]]
name = "a"
tools = ["current_time", "fs__read*"]
mcp_servers = [{ name = "own", command = "node" }]
tool_approvals = { "own__*" = false, own__write = true, "fs__*" = true }

[[agents]]
name = "b"
tools = ["*"]
mcp_servers = ["fs"]
"#;
        let mut c = load_text(text, no_env).unwrap();
        let reg = registry(&[
            "current_time",
            "fs__read_file",
            "fs__read_dir",
            "fs__write_file",
            "own__read",
            "own__write",
        ]);
        c.resolve_agent_tools(&reg).unwrap();
        let a = c.agent("a").unwrap();
        let mut tools = a.tools.clone();
        tools.sort();
        assert_eq!(
            tools,
            [
                "current_time",
                "fs__read_dir",
                "fs__read_file",
                "own__read",
                "own__write"
            ]
        );
        let rules: Vec<(&str, bool)> = a
            .tool_approvals
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(
            rules,
            [
                ("fs__read_dir", true),
                ("fs__read_file", true),
                ("own__read", false),
                // The exact name wins over the pattern.
                ("own__write", true),
            ]
        );
        let b = c.agent("b").unwrap();
        assert!(
            b.tools.iter().all(|t| !t.starts_with("own__")),
            "{:?}",
            b.tools
        );
        assert!(b.tools.contains(&"fs__write_file".to_owned()));

        // A pattern that matches nothing, in tools or in rules, names the agent.
        let mut c = load_text(
            "[[agents]]\nname = \"solo\"\ntools = [\"current_time\", \"nothing__*\"]\n",
            no_env,
        )
        .unwrap();
        let e = c.resolve_agent_tools(&reg).unwrap_err();
        assert!(
            e.starts_with("agent 'solo': the tool pattern 'nothing__*' matches no tool"),
            "{e}"
        );
        let mut c = load_text(
            "[[agents]]\nname = \"solo\"\ntools = [\"current_time\"]\ntool_approvals = { \"fs__*\" = true }\n",
            no_env,
        )
        .unwrap();
        let e = c.resolve_agent_tools(&reg).unwrap_err();
        assert!(
            e.starts_with(
                "agent 'solo': the tool_approvals pattern 'fs__*' matches none of its tools"
            ),
            "{e}"
        );
    }

    #[test]
    fn env_overrides_file_and_flags_override_env() {
        let env = |var: &str| match var {
            "OVERSEER_DATA_DIR" => Some(OsString::from("/env/data")),
            "OVERSEER_DURABILITY" => Some(OsString::from("os")),
            "OVERSEER_MAX_RESTARTS" => Some(OsString::from("7")),
            "OVERSEER_SCENARIO" => Some(OsString::from("")),
            _ => None,
        };
        let c = load_text(MINIMAL, env).unwrap();
        assert_eq!(c.store.data_dir, PathBuf::from("/env/data"));
        assert_eq!(c.store.durability, Durability::Os);
        assert_eq!(c.runtime.max_restarts, 7);
        assert_eq!(c.runtime_config().restart.max_restarts, 7);
        // Empty means unset.
        assert_eq!(c.provider.scenario, default_scenario());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, MINIMAL).unwrap();
        let opts = LoadOptions {
            path: Some(path),
            overrides: Overrides {
                data_dir: Some("/flag/data".into()),
                ..Overrides::default()
            },
        };
        let c = Config::load_with_env(&opts, &builtin_registry().unwrap(), env).unwrap();
        assert_eq!(c.store.data_dir, PathBuf::from("/flag/data"));
    }

    #[test]
    fn bad_env_values_name_the_variable_and_key() {
        let env = |var: &str| match var {
            "OVERSEER_DURABILITY" => Some(OsString::from("sometimes")),
            "OVERSEER_CALL_TIMEOUT_SECS" => Some(OsString::from("soon")),
            _ => None,
        };
        let e = load_text(MINIMAL, env).unwrap_err().to_string();
        assert!(e.starts_with("environment: "), "{e}");
        assert!(e.contains("OVERSEER_DURABILITY (store.durability): unknown variant 'sometimes', expected fsync|os"), "{e}");
        assert!(
            e.contains(
                "OVERSEER_CALL_TIMEOUT_SECS (runtime.call_timeout_secs): expected an integer"
            ),
            "{e}"
        );
    }

    #[test]
    fn store_cache_mb_is_validated_and_reaches_the_store_options() {
        let c = load_text(MINIMAL, no_env).unwrap();
        assert_eq!(c.store.cache_mb, DEFAULT_CACHE_MB);
        assert_eq!(c.store.options().cache_mb, DEFAULT_CACHE_MB);
        let c = load_text(&format!("[store]\ncache_mb = 256\n{MINIMAL}"), no_env).unwrap();
        assert_eq!(c.store.options().cache_mb, 256);

        for bad in ["0", "65537"] {
            let e = load_text(&format!("[store]\ncache_mb = {bad}\n{MINIMAL}"), no_env)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "store.cache_mb: must be between 1 and 65536 (MiB), found {bad}"
                )),
                "{e}"
            );
        }
        let e = parse_err("[store]\ncache_mb = -5\n");
        assert!(e.contains("store.cache_mb: invalid value"), "{e}");
        let e = parse_err("[store]\ncache_mb = \"lots\"\n");
        assert!(e.contains("store.cache_mb: invalid type"), "{e}");

        let env = |var: &str| match var {
            "OVERSEER_STORE_CACHE_MB" => Some(OsString::from("32")),
            _ => None,
        };
        assert_eq!(load_text(MINIMAL, env).unwrap().store.cache_mb, 32);
        let env = |var: &str| match var {
            "OVERSEER_STORE_CACHE_MB" => Some(OsString::from("big")),
            _ => None,
        };
        let e = load_text(MINIMAL, env).unwrap_err().to_string();
        assert!(
            e.contains("OVERSEER_STORE_CACHE_MB (store.cache_mb): expected an integer"),
            "{e}"
        );
    }

    #[test]
    fn store_compression_is_validated_and_reaches_the_store_options() {
        let c = load_text(MINIMAL, no_env).unwrap();
        assert_eq!(c.store.options().compression, Compression::None);
        let c = load_text(
            &format!("[store]\ncompression = \"zstd\"\n{MINIMAL}"),
            no_env,
        )
        .unwrap();
        assert_eq!(c.store.options().compression, Compression::Zstd);

        let e = parse_err("[store]\ncompression = \"lz4\"\n");
        assert!(
            e.contains("store.compression: unknown variant 'lz4', expected none|zstd"),
            "{e}"
        );
        let env = |var: &str| match var {
            "OVERSEER_STORE_COMPRESSION" => Some(OsString::from("zstd")),
            _ => None,
        };
        assert_eq!(
            load_text(MINIMAL, env).unwrap().store.compression,
            Compression::Zstd
        );
        let env = |var: &str| match var {
            "OVERSEER_STORE_COMPRESSION" => Some(OsString::from("gzip")),
            _ => None,
        };
        let e = load_text(MINIMAL, env).unwrap_err().to_string();
        assert!(
            e.contains("OVERSEER_STORE_COMPRESSION (store.compression): unknown variant 'gzip'"),
            "{e}"
        );
        // PostgreSQL's store has no such setting: saying it is a mistake.
        let e = load_text(
            &format!("[store]\nkind = \"postgres\"\ncompression = \"zstd\"\n{MINIMAL}"),
            no_env,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("store.compression: applies to the sled store only"),
            "{e}"
        );
    }

    #[test]
    fn tls_and_identity_provider_keys_are_validated() {
        let c = load_text(
            &format!("[http]\nauth = \"jwks\"\njwks_url = \"https://idp.example.com/jwks\"\nissuer = \"https://idp.example.com/\"\naudience = \"overseer\"\ntenant_claim = \"org\"\nscopes_claim = \"scope\"\ntls_cert = \"c.pem\"\ntls_key = \"k.pem\"\n{MINIMAL}"),
            no_env,
        )
        .unwrap();
        assert_eq!(c.http.auth, AuthMode::Jwks);
        assert!(c.http.tls_files().is_some());
        assert_eq!(c.http.claim_rules().scopes_claim, "scope");
        let problems = |text: &str| {
            load_text(&format!("{text}{MINIMAL}"), no_env)
                .unwrap_err()
                .to_string()
        };
        let e = problems("[http]\nauth = \"jwks\"\ntls_cert = \"c.pem\"\njwks_min_refresh_secs = 0\ntenant_claim = \" \"\n");
        for expected in [
            "http.jwks_url: required when http.auth is jwks",
            "http.tls_key: required with http.tls_cert",
            "http.jwks_min_refresh_secs: must be at least 1",
            "http.tenant_claim: must name a claim",
        ] {
            assert!(e.contains(expected), "{expected}: {e}");
        }
        let e = problems("[http]\nauth = \"jwks\"\njwks_url = \"http://idp.example.com/jwks\"\ntls_key = \"k.pem\"\n");
        assert!(
            e.contains("http.jwks_url: 'http://idp.example.com/jwks': keys over plain HTTP"),
            "{e}"
        );
        assert!(
            e.contains("http.tls_cert: required with http.tls_key"),
            "{e}"
        );
        let e = problems("[http]\nauth = \"none\"\naudience = \"x\"\njwks_url = \"https://idp/jwks\"\nissuer = \"\"\n");
        assert!(
            e.contains("http.audience: only checked when http.auth is a token mode"),
            "{e}"
        );
        assert!(
            e.contains("http.jwks_url: only used when http.auth is jwks"),
            "{e}"
        );
        assert!(e.contains("http.issuer: must not be empty"), "{e}");
        // Loopback keys over plain HTTP are fine (a sidecar, a test).
        assert!(load_text(
            &format!(
                "[http]\nauth = \"jwks\"\njwks_url = \"http://127.0.0.1:9000/jwks\"\n{MINIMAL}"
            ),
            no_env
        )
        .is_ok());
    }

    #[test]
    fn store_kind_and_cluster_keys_are_validated() {
        let c = load_text(MINIMAL, no_env).unwrap();
        assert_eq!(c.store.kind, StoreKind::Sled);
        assert_eq!(c.cluster, ClusterSection::default());
        let c = load_text(
            &format!("[store]\nkind = \"postgres\"\npool_size = 8\n[cluster]\nheartbeat_secs = 1\nlease_secs = 3\nadvertise_url = \"http://10.0.0.5:8080\"\n{MINIMAL}"),
            no_env,
        )
        .unwrap();
        assert_eq!(c.store.kind, StoreKind::Postgres);
        assert_eq!(c.store.pool_size, 8);
        assert_eq!(c.cluster.lease_secs, 3);
        let e = parse_err("[store]\nkind = \"mysql\"\n");
        assert!(
            e.contains("store.kind: unknown variant 'mysql', expected sled|postgres"),
            "{e}"
        );
        let e = parse_err("[cluster]\nbogus = 1\n");
        assert!(e.contains("cluster.bogus: unknown key"), "{e}");
        let e = load_text(
            &format!("[cluster]\nheartbeat_secs = 5\nlease_secs = 10\nfailover_concurrency = 0\nadvertise_url = \"10.0.0.5:80\"\nmax_in_flight_forwards = 0\ndead_node_retention_secs = 9\n[store]\npool_size = 1\n{MINIMAL}"),
            no_env,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("cluster.max_in_flight_forwards: must be between 1 and 65535, found 0"),
            "{e}"
        );
        assert!(
            e.contains(
                "cluster.dead_node_retention_secs: must be at least cluster.lease_secs (10)"
            ),
            "{e}"
        );
        assert!(
            e.contains("cluster.lease_secs: must be more than twice cluster.heartbeat_secs (5)"),
            "{e}"
        );
        assert!(
            e.contains("cluster.failover_concurrency: must be at least 1"),
            "{e}"
        );
        assert!(
            e.contains("cluster.advertise_url: '10.0.0.5:80' is not an http(s) URL"),
            "{e}"
        );
        assert!(
            e.contains("store.pool_size: must be between 2 and 1000, found 1"),
            "{e}"
        );
        let env = |var: &str| match var {
            "OVERSEER_STORE_KIND" => Some(OsString::from("postgres")),
            _ => None,
        };
        assert_eq!(
            load_text(MINIMAL, env).unwrap().store.kind,
            StoreKind::Postgres
        );
        let env = |var: &str| match var {
            "OVERSEER_STORE_KIND" => Some(OsString::from("pg")),
            _ => None,
        };
        let e = load_text(MINIMAL, env).unwrap_err().to_string();
        assert!(
            e.contains("OVERSEER_STORE_KIND (store.kind): unknown variant 'pg'"),
            "{e}"
        );
    }

    #[test]
    fn explicit_missing_file_is_an_error_naming_it() {
        let opts = LoadOptions {
            path: Some("/nonexistent/overseer.toml".into()),
            overrides: Overrides::default(),
        };
        let e = Config::load_with_env(&opts, &builtin_registry().unwrap(), no_env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/overseer.toml"), "{e}");
    }

    #[test]
    fn converts_to_runtime_types() {
        let c = Config::builtin().unwrap();
        let agents = c.agent_configs();
        assert_eq!(agents[0].name, "assistant");
        assert_eq!(agents[0].max_steps, 10);
        let rc = c.runtime_config();
        assert_eq!(rc.call_timeout, Duration::from_secs(30));
        assert_eq!(rc.restart.restart_window_secs, 60);
        assert_eq!(rc.idle_hibernate, Some(Duration::from_secs(300)));
        let mut c = c;
        c.runtime.idle_hibernate_secs = 0;
        assert_eq!(c.runtime_config().idle_hibernate, None);
    }
}
