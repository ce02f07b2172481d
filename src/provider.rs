//! Real LLM providers: model routes, credentials, and the adapters that
//! turn the [`Provider`] port of `overseer-actors` into HTTP requests.
//!
//! This module owns what every HTTP provider shares: the [`RouteConfig`] a
//! model route is configured with, the [`KeySource`] that holds (and can
//! re-read) an API key, [`build_provider`] which checks a route at start-up,
//! and the mapping of HTTP failures onto [`ProviderError`]. The wire formats
//! live in [`openai`] and [`anthropic`], the SSE framing in `sse`, the error
//! policy (retries, key refresh) in [`retry`].
//!
//! It deliberately does not leak any wire type: a provider's own wire types
//! stay on its side of the boundary, and the actor tree only ever sees
//! [`ProviderEvent`](overseer_actors::provider::ProviderEvent)s. It also does
//! not decide which agent uses which route: that is configuration's job.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use overseer_actors::error::chain as error_chain;
use overseer_actors::provider::{Provider, ProviderError};
use overseer_actors::scripted::ScriptedProvider;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::scenario::{self, ScenarioLoadError};
use overflow::{overflow_sizes, says_context_overflow};

pub mod anthropic;
mod context;
pub mod openai;
mod overflow;
pub mod retry;
mod routes;
mod sse;

pub use context::known_context_window;

pub use anthropic::AnthropicProvider;
pub use openai::OpenAiProvider;
pub use retry::{RetryPolicy, RetryingProvider};
pub use routes::RoutedProvider;

/// Default request timeout: how long to wait for the response headers.
pub const DEFAULT_TIMEOUT_SECS: u64 = 120;
/// Default idle timeout: the longest gap between two bytes of a stream.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 60;
/// Default output limit (`max_tokens`) of every openai and anthropic route
/// (Anthropic's API requires one; on an OpenAI-compatible server it stops a
/// small model that loops from running until the server's context is
/// full). A route whose context window is known gets at most half of it.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The former name of [`DEFAULT_MAX_TOKENS`].
pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = DEFAULT_MAX_TOKENS;
/// Default of `max_retry_after_secs`: the longest `retry-after` honoured.
pub const DEFAULT_MAX_RETRY_AFTER_SECS: u64 = 60;
/// Default base URL of the `openai` provider.
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Default base URL of the `anthropic` provider.
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";

/// Which wire format a route speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Plays a scenario file; no network, no key.
    #[default]
    Scripted,
    /// Any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama,
    /// llama.cpp's server, LiteLLM).
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

impl ProviderKind {
    /// The name used in config files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scripted => "scripted",
            Self::Openai => "openai",
            Self::Anthropic => "anthropic",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProviderKind {
    type Err = ProviderConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "scripted" => Ok(Self::Scripted),
            "openai" => Ok(Self::Openai),
            "anthropic" => Ok(Self::Anthropic),
            other => Err(ProviderConfigError::Invalid {
                field: "provider",
                message: format!(
                    "unknown provider '{other}' (expected scripted, openai or anthropic)"
                ),
            }),
        }
    }
}

fn default_timeout_secs() -> u64 {
    DEFAULT_TIMEOUT_SECS
}

fn default_idle_timeout_secs() -> u64 {
    DEFAULT_IDLE_TIMEOUT_SECS
}

fn default_max_retry_after_secs() -> u64 {
    DEFAULT_MAX_RETRY_AFTER_SECS
}

fn is_default_max_retry_after(secs: &u64) -> bool {
    *secs == DEFAULT_MAX_RETRY_AFTER_SECS
}

/// One model route: which provider, where, which model, and with which key.
///
/// Meant to be embedded in the configuration as is (a `[[models]]` table or
/// an agent's route), hence `deny_unknown_fields`: a typo in a key is an
/// error, not a silently ignored setting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The route's name, by which agents refer to it; `None` for an
    /// anonymous route (built from command-line flags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Wire format.
    pub provider: ProviderKind,
    /// Endpoint root: for `openai` the part before `/chat/completions`
    /// (default `https://api.openai.com/v1`; Ollama:
    /// `http://localhost:11434/v1`), for `anthropic` the part before
    /// `/v1/messages` (default `https://api.anthropic.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Model id sent to the provider (required for `openai` and `anthropic`).
    /// The request's own `model` (the agent's route name) is not sent.
    #[serde(default)]
    pub model: String,
    /// Environment variable holding the API key; it must hold a non-empty
    /// key at start-up. Unset: no key is sent (local servers), except on the
    /// provider's own public endpoint (no `base_url`), which always needs
    /// one: there it defaults to `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Seconds to wait for a response to start (connect and headers).
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Seconds a stream may stay silent before it is cut as stalled.
    #[serde(default = "default_idle_timeout_secs")]
    pub idle_timeout_secs: u64,
    /// Extra request headers (e.g. `anthropic-beta`, an OpenRouter referer).
    /// Secrets do not belong here: config files are not secret stores.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_headers: BTreeMap<String, String>,
    /// Most output tokens per request. Unset: [`DEFAULT_MAX_TOKENS`] (4096),
    /// or half the route's context window when that is known and smaller.
    /// Sent as `max_tokens`, except to OpenAI's own endpoint (no
    /// `base_url`), which takes `max_completion_tokens` (its reasoning
    /// models refuse `max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The longest wait a server's `retry-after` (on a 429 or a 5xx) is
    /// honoured with; a server asking for longer fails the request at once,
    /// saying so, rather than leaving the turn hanging.
    #[serde(
        default = "default_max_retry_after_secs",
        skip_serializing_if = "is_default_max_retry_after"
    )]
    pub max_retry_after_secs: u64,
    /// Scenario file of a `scripted` route (default: the demo scenario).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<PathBuf>,
    /// The model's context window, in tokens: sessions compact their
    /// transcript before a request would outgrow it. Unset: the window of a
    /// well-known model id ([`known_context_window`]) or, for `scripted`,
    /// the scenario's `context_window`; else unknown, and a session compacts
    /// only once the provider reports an overflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
}

impl RouteConfig {
    /// A route of `provider` for `model` with the defaults of every other field.
    pub fn new(provider: ProviderKind, model: impl Into<String>) -> Self {
        Self {
            name: None,
            provider,
            base_url: None,
            model: model.into(),
            api_key_env: None,
            timeout_secs: DEFAULT_TIMEOUT_SECS,
            idle_timeout_secs: DEFAULT_IDLE_TIMEOUT_SECS,
            extra_headers: BTreeMap::new(),
            max_tokens: None,
            max_retry_after_secs: DEFAULT_MAX_RETRY_AFTER_SECS,
            scenario: None,
            context_window: None,
        }
    }

    /// The route's name: its `name`, else one made from what it is
    /// (`scripted`; `openai:MODEL`, with `@BASE_URL` when it has one), by
    /// which a session records it.
    pub fn label(&self) -> String {
        if let Some(name) = &self.name {
            return name.clone();
        }
        match (self.provider, &self.base_url) {
            (ProviderKind::Scripted, _) => ProviderKind::Scripted.as_str().to_owned(),
            (kind, Some(url)) => format!("{kind}:{}@{}", self.model, url.trim_end_matches('/')),
            (kind, None) => format!("{kind}:{}", self.model),
        }
    }

    /// The output limit in effect (see `max_tokens`).
    pub fn effective_max_tokens(&self) -> u32 {
        self.max_tokens.unwrap_or_else(|| {
            let window = self
                .context_window
                .or_else(|| known_context_window(&self.model));
            match window {
                Some(w) => u32::try_from(w / 2)
                    .unwrap_or(u32::MAX)
                    .clamp(1, DEFAULT_MAX_TOKENS),
                None => DEFAULT_MAX_TOKENS,
            }
        })
    }

    /// What a session records of the route (`EffectiveConfig::route`): the
    /// route as configured, under its [`label`](Self::label). It holds no
    /// secret (a key comes from the environment, by `api_key_env`'s name).
    pub fn describe(&self) -> Value {
        let mut route = self.clone();
        if route.provider != ProviderKind::Scripted {
            route.scenario = None;
        }
        let mut value = serde_json::to_value(&route).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            // What the model is asked for, and how many tokens it may say.
            if route.provider != ProviderKind::Scripted {
                map.insert("max_tokens".into(), route.effective_max_tokens().into());
            }
            map.insert("label".into(), route.label().into());
        }
        value
    }

    /// The route a session recorded with [`describe`](Self::describe), if it
    /// is one made without a name (from `[provider]` or `overseer run`'s
    /// flags): only such a route may be rebuilt from a session's record,
    /// since no configuration holds it. A named route lives in the
    /// configuration, or is gone.
    pub fn from_description(value: &Value) -> Option<Self> {
        let mut value = value.clone();
        if let Value::Object(map) = &mut value {
            map.remove("label");
        }
        let route: Self = serde_json::from_value(value).ok()?;
        route.name.is_none().then_some(route)
    }

    /// The base URL in effect (the configured one, or the provider's default),
    /// without a trailing slash.
    pub fn effective_base_url(&self) -> &str {
        let url = match (&self.base_url, self.provider) {
            (Some(url), _) => url.as_str(),
            (None, ProviderKind::Anthropic) => DEFAULT_ANTHROPIC_BASE_URL,
            (None, _) => DEFAULT_OPENAI_BASE_URL,
        };
        url.trim_end_matches('/')
    }

    /// The variable the key is read from, if any (see `api_key_env`).
    pub fn effective_api_key_env(&self) -> Option<&str> {
        match (&self.api_key_env, &self.base_url, self.provider) {
            (Some(var), _, _) => Some(var),
            (None, None, ProviderKind::Openai) => Some("OPENAI_API_KEY"),
            (None, None, ProviderKind::Anthropic) => Some("ANTHROPIC_API_KEY"),
            (None, _, _) => None,
        }
    }

    /// Checks every value that can be checked without the environment.
    /// Reports the first problem, naming its field.
    pub fn validate(&self) -> Result<(), ProviderConfigError> {
        let invalid = |field: &'static str, message: String| {
            Err(ProviderConfigError::Invalid { field, message })
        };
        if self.context_window == Some(0) {
            return invalid("context_window", "must be at least 1 (tokens)".into());
        }
        if self.provider == ProviderKind::Scripted {
            return Ok(());
        }
        if self.model.trim().is_empty() {
            return invalid(
                "model",
                format!("a {} route needs a model id", self.provider),
            );
        }
        let base = self.effective_base_url();
        match reqwest::Url::parse(base) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            Ok(url) => {
                return invalid(
                    "base_url",
                    format!("'{base}' must use http or https, not {}", url.scheme()),
                )
            }
            Err(e) => return invalid("base_url", format!("'{base}' is not a URL: {e}")),
        }
        if self.timeout_secs == 0 {
            return invalid("timeout_secs", "must be at least 1".into());
        }
        if self.idle_timeout_secs == 0 {
            return invalid("idle_timeout_secs", "must be at least 1".into());
        }
        if self.max_tokens == Some(0) {
            return invalid("max_tokens", "must be at least 1".into());
        }
        if self.max_retry_after_secs > 3600 {
            return invalid(
                "max_retry_after_secs",
                "must be at most 3600 (a turn should not wait an hour on one server)".into(),
            );
        }
        if let Some(var) = &self.api_key_env {
            if var.trim().is_empty() || var.contains('=') || var.contains('\0') {
                return invalid(
                    "api_key_env",
                    format!("'{var}' is not an environment variable name"),
                );
            }
        }
        header_map(&self.extra_headers)?;
        Ok(())
    }
}

/// Why a route cannot be used. Reported at start-up, before any request.
#[derive(Debug, thiserror::Error)]
pub enum ProviderConfigError {
    /// A field has an unusable value.
    #[error("invalid model route: {field}: {message}")]
    Invalid {
        /// The offending field of [`RouteConfig`].
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The route names a key variable that holds no key.
    #[error(
        "environment variable {var} is not set or empty: it must hold the API key of this {provider} route (api_key_env = \"{var}\")"
    )]
    MissingKey {
        /// The variable.
        var: String,
        /// The route's provider.
        provider: ProviderKind,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client of the {provider} provider: {message}")]
    Client {
        /// The route's provider.
        provider: ProviderKind,
        /// Why.
        message: String,
    },
    /// A scripted route's scenario could not be loaded.
    #[error(transparent)]
    Scenario(#[from] ScenarioLoadError),
}

/// Where an API key comes from, shared by a provider (which reads it for
/// every request) and its [`RetryingProvider`] (which re-reads it once after
/// an authentication failure): a rotated key is picked up without a
/// restart, and a key is never looked up in the environment on the hot path.
pub struct KeySource {
    var: Option<String>,
    // A plain lock: it is held only to copy a short string, never across an
    // await.
    key: RwLock<Option<String>>,
    env: Env,
}

/// Where variables are read from: the process environment in production; a
/// map in tests, which must not change the process's (tests run in
/// parallel).
pub type Env = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The process environment.
pub fn process_env() -> Env {
    Arc::new(|var: &str| std::env::var(var).ok())
}

impl KeySource {
    /// No key: requests carry no credentials (local servers).
    pub fn none() -> Self {
        Self {
            var: None,
            key: RwLock::new(None),
            env: process_env(),
        }
    }

    /// A key given directly (embedding, tests); it cannot be refreshed.
    pub fn fixed(key: impl Into<String>) -> Self {
        Self {
            var: None,
            key: RwLock::new(Some(key.into())),
            env: process_env(),
        }
    }

    /// The key held by `var` in the process environment, which must be set
    /// and non-empty.
    pub fn from_env(var: &str, provider: ProviderKind) -> Result<Self, ProviderConfigError> {
        Self::from_var(var, provider, process_env())
    }

    /// The key held by `var` in `env`, which must be set and non-empty;
    /// [`KeySource::reload`] reads `env` again.
    pub fn from_var(
        var: &str,
        provider: ProviderKind,
        env: Env,
    ) -> Result<Self, ProviderConfigError> {
        let key = read_env(&env, var).ok_or_else(|| ProviderConfigError::MissingKey {
            var: var.to_owned(),
            provider,
        })?;
        Ok(Self {
            var: Some(var.to_owned()),
            key: RwLock::new(Some(key)),
            env,
        })
    }

    /// The variable the key comes from, if any.
    pub fn var(&self) -> Option<&str> {
        self.var.as_deref()
    }

    /// The current key, if any.
    pub fn current(&self) -> Option<String> {
        self.key.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Re-reads the key from its variable. Fails, leaving the old key in
    /// place, when there is no variable or it no longer holds a key.
    pub fn reload(&self) -> Result<(), String> {
        let Some(var) = &self.var else {
            return Err("the key does not come from an environment variable".into());
        };
        let key = read_env(&self.env, var)
            .ok_or_else(|| format!("environment variable {var} is not set"))?;
        *self.key.write().unwrap_or_else(|p| p.into_inner()) = Some(key);
        Ok(())
    }
}

// By hand, so the key itself never reaches a log line.
impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let has_key = self.key.read().map(|k| k.is_some()).unwrap_or(false);
        f.debug_struct("KeySource")
            .field("var", &self.var)
            .field("key", &if has_key { "<redacted>" } else { "<none>" })
            .finish()
    }
}

fn read_env(env: &Env, var: &str) -> Option<String> {
    env(var)
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
}

/// What an HTTP provider needs to reach its endpoint: resolved from a
/// [`RouteConfig`] by [`build_provider`], or built directly by an embedder
/// (or a test that wants sub-second timeouts).
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Endpoint root without a trailing slash.
    pub base_url: String,
    /// Model id.
    pub model: String,
    /// The key.
    pub keys: Arc<KeySource>,
    /// How long to wait for a response to start.
    pub timeout: Duration,
    /// The longest silence tolerated inside a stream.
    pub idle_timeout: Duration,
    /// Extra headers sent with every request.
    pub headers: HeaderMap,
    /// Output token cap.
    pub max_tokens: Option<u32>,
    /// Send the cap as `max_completion_tokens` (OpenAI's own endpoint)
    /// rather than `max_tokens` (what compatible servers read).
    pub max_completion_tokens: bool,
    /// The model's context window in tokens; `None`: the known window of
    /// `model`, if any ([`known_context_window`]).
    pub context_window: Option<u64>,
}

impl Endpoint {
    /// An endpoint with default timeouts, no key and no extra headers.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            model: model.into(),
            keys: Arc::new(KeySource::none()),
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            idle_timeout: Duration::from_secs(DEFAULT_IDLE_TIMEOUT_SECS),
            headers: HeaderMap::new(),
            max_tokens: None,
            max_completion_tokens: false,
            context_window: None,
        }
    }

    /// The context window in effect: the configured one, else the known
    /// window of the model id.
    pub fn effective_context_window(&self) -> Option<u64> {
        self.context_window
            .or_else(|| known_context_window(&self.model))
    }

    /// The HTTP client for this endpoint.
    fn client(&self, provider: ProviderKind) -> Result<reqwest::Client, ProviderConfigError> {
        // reqwest is built without a bundled crypto provider; the binary
        // installs aws-lc-rs, but a library user may not have, and building a
        // client without one fails. Installing twice is a harmless no-op.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        reqwest::Client::builder()
            .connect_timeout(self.timeout)
            .user_agent(concat!("overseer/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ProviderConfigError::Client {
                provider,
                message: error_chain(&e),
            })
    }

    /// POSTs `body` to `path` with the provider's own `headers` (then the
    /// route's extra headers, which replace same-named ones so a route can
    /// pin another `anthropic-version`), and returns the response once it is
    /// known to be a success; any failure is already mapped to a
    /// [`ProviderError`].
    async fn post<B: Serialize + Sync>(
        &self,
        client: &reqwest::Client,
        path: &str,
        headers: HeaderMap,
        body: &B,
    ) -> Result<reqwest::Response, ProviderError> {
        let url = format!("{}{path}", self.base_url);
        let mut request = client
            .post(&url)
            .json(body)
            .headers(headers)
            .headers(self.headers.clone());
        // Inside the request's `chat` span (telemetry on): the provider's
        // own tracing joins the session's trace.
        if let Some(traceparent) = crate::telemetry::traceparent() {
            request = request.header("traceparent", traceparent);
        }
        let response = match tokio::time::timeout(self.timeout, request.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                return Err(ProviderError::Transport(format!(
                    "POST {url}: {}",
                    error_chain(&e.without_url())
                )))
            }
            Err(_) => {
                return Err(ProviderError::Transport(format!(
                    "POST {url}: no response within {} s",
                    self.timeout.as_secs_f64()
                )))
            }
        };
        let status = response.status();
        if status.is_success() {
            // A JSON answer to a streaming request is a server that ignored
            // `stream: true` (or hides an error behind a 200): say so rather
            // than report an empty stream.
            let json = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            if json {
                let body = read_excerpt(response, self.timeout).await;
                return Err(ProviderError::BadResponse(format!(
                    "expected an event stream, got JSON: {}",
                    error_message(&body)
                )));
            }
            return Ok(response);
        }
        let retry_after = retry_after(response.headers());
        let body = read_excerpt(response, self.timeout).await;
        Err(status_error(status.as_u16(), retry_after, &body))
    }
}

/// A credential header built from the current key, marked sensitive so it
/// never shows in debug output.
fn key_header(
    headers: &mut HeaderMap,
    name: HeaderName,
    keys: &KeySource,
    format: impl FnOnce(&str) -> String,
) -> Result<(), ProviderError> {
    if let Some(key) = keys.current() {
        let mut value = HeaderValue::from_str(&format(&key)).map_err(|_| {
            ProviderError::Auth("the API key holds characters a header cannot carry".into())
        })?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    Ok(())
}

/// Builds the provider of a route, checking everything that can fail before
/// the first request: the values, the key variable, the HTTP client. HTTP
/// providers come wrapped in a [`RetryingProvider`] with the retry policy.
pub fn build_provider(route: &RouteConfig) -> Result<Arc<dyn Provider>, ProviderConfigError> {
    build_provider_with_env(route, process_env())
}

/// [`build_provider`], reading key variables from `env`.
pub fn build_provider_with_env(
    route: &RouteConfig,
    env: Env,
) -> Result<Arc<dyn Provider>, ProviderConfigError> {
    route.validate()?;
    match route.provider {
        ProviderKind::Scripted => {
            let path = route
                .scenario
                .clone()
                .unwrap_or_else(|| PathBuf::from(scenario::DEFAULT_SCENARIO_PATH));
            let mut scenario = scenario::resolve(&path)?;
            // The route's window, when set, is what the "model" advertises.
            if route.context_window.is_some() {
                scenario.context_window = route.context_window;
            }
            Ok(Arc::new(ScriptedProvider::new(scenario)))
        }
        ProviderKind::Openai | ProviderKind::Anthropic => {
            let keys = Arc::new(match route.effective_api_key_env() {
                Some(var) => KeySource::from_var(var, route.provider, env)?,
                None => KeySource::none(),
            });
            let endpoint = Endpoint {
                base_url: route.effective_base_url().to_owned(),
                model: route.model.clone(),
                keys: keys.clone(),
                timeout: Duration::from_secs(route.timeout_secs),
                idle_timeout: Duration::from_secs(route.idle_timeout_secs),
                headers: header_map(&route.extra_headers)?,
                max_tokens: Some(route.effective_max_tokens()),
                max_completion_tokens: route.provider == ProviderKind::Openai
                    && route.base_url.is_none(),
                context_window: route.context_window,
            };
            let inner: Arc<dyn Provider> = if route.provider == ProviderKind::Anthropic {
                Arc::new(AnthropicProvider::new(endpoint)?)
            } else {
                Arc::new(OpenAiProvider::new(endpoint)?)
            };
            let policy = RetryPolicy {
                max_retry_after: Duration::from_secs(route.max_retry_after_secs),
                ..RetryPolicy::default()
            };
            Ok(Arc::new(RetryingProvider::new(inner, Some(keys), policy)))
        }
    }
}

fn header_map(headers: &BTreeMap<String, String>) -> Result<HeaderMap, ProviderConfigError> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| ProviderConfigError::Invalid {
                field: "extra_headers",
                message: format!("'{name}' is not a valid header name"),
            })?;
        let value = HeaderValue::from_str(value).map_err(|_| ProviderConfigError::Invalid {
            field: "extra_headers",
            message: format!("the value of '{name}' is not a valid header value"),
        })?;
        map.insert(header, value);
    }
    Ok(map)
}

/// `retry-after-ms` (OpenAI) or `retry-after` in seconds. An HTTP-date is
/// ignored: the backoff schedule applies instead.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let secs = get("retry-after")?.trim().parse::<f64>().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// A tool result as the text the model reads: a JSON string verbatim (a
/// tool that answers in prose is not shown quotes and escapes), anything
/// else as compact JSON.
fn result_text(result: Option<&Value>) -> String {
    match result {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => Value::Null.to_string(),
    }
}

/// Most bytes of an error body read for its excerpt.
const MAX_ERROR_BODY: usize = 16 * 1024;
/// Most characters of an error body quoted in a message.
const EXCERPT_CHARS: usize = 400;

/// Reads the start of an error body, bounded in size and time: a broken
/// server must not hang or flood the error path.
async fn read_excerpt(mut response: reqwest::Response, limit: Duration) -> String {
    let mut bytes = Vec::new();
    let read = async {
        while let Ok(Some(chunk)) = response.chunk().await {
            bytes.extend_from_slice(&chunk);
            if bytes.len() >= MAX_ERROR_BODY {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(limit, read).await;
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The readable part of an error body: the JSON error message of OpenAI and
/// Anthropic style bodies with its type or code, else the raw text,
/// shortened.
fn error_message(body: &str) -> String {
    if let Ok(json) = serde_json::from_str::<Value>(body) {
        let error = json.get("error").unwrap_or(&json);
        if let Some(message) = error.as_str() {
            // Ollama passes its runner's JSON error on as a string.
            if message.trim_start().starts_with('{') && message != body {
                return error_message(message);
            }
            return excerpt(message);
        }
        if let Some(message) = error.get("message").and_then(Value::as_str) {
            let kind = error
                .get("type")
                .or_else(|| error.get("code"))
                .and_then(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                });
            return match kind {
                Some(kind) => excerpt(&format!("{message} ({kind})")),
                None => excerpt(message),
            };
        }
    }
    let trimmed = body.trim();
    if trimmed.is_empty() {
        "(empty body)".into()
    } else {
        excerpt(trimmed)
    }
}

fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Maps an error status to the provider error kinds.
fn status_error(status: u16, retry_after: Option<Duration>, body: &str) -> ProviderError {
    let message = error_message(body);
    match status {
        401 | 403 => ProviderError::Auth(format!("HTTP {status}: {message}")),
        429 => ProviderError::RateLimited {
            retry_after,
            message: format!("HTTP 429: {message}"),
        },
        // A request timeout says nothing about the request itself: it is as
        // retryable as a dropped connection.
        408 => ProviderError::Transport(format!("HTTP 408: {message}")),
        // llama.cpp's server answers an overflow with a 500 ("Context size
        // has been exceeded."): a server error that no retry can mend.
        400 | 413 | 422 | 500..=599 if says_context_overflow(body) => {
            let (tokens, limit) = overflow_sizes(body);
            ProviderError::ContextOverflow {
                message,
                tokens,
                limit,
            }
        }
        500..=599 => ProviderError::Server {
            status,
            retry_after,
            message,
        },
        _ => ProviderError::BadResponse(format!("HTTP {status}: {message}")),
    }
}

/// Maps an error reported inside a stream, by its type or code, onto the
/// Provider error kinds: an overloaded or failing server is worth a retry, a refused
/// request is not.
fn stream_error(kind: &str, message: &str) -> ProviderError {
    let text = if kind.is_empty() {
        excerpt(message)
    } else {
        excerpt(&format!("{message} ({kind})"))
    };
    if let Ok(status) = kind.parse::<u16>() {
        if (400..600).contains(&status) {
            return status_error(status, None, message);
        }
    }
    let kind = kind.to_ascii_lowercase();
    if kind.contains("overloaded") {
        ProviderError::Server {
            status: 529,
            retry_after: None,
            message: text,
        }
    } else if kind.contains("rate_limit") {
        ProviderError::RateLimited {
            retry_after: None,
            message: text,
        }
    } else if kind.contains("auth") || kind.contains("permission") || kind.contains("api_key") {
        ProviderError::Auth(text)
    } else if says_context_overflow(&kind) || says_context_overflow(message) {
        let (tokens, limit) = overflow_sizes(message);
        ProviderError::ContextOverflow {
            message: text,
            tokens,
            limit,
        }
    } else if kind.contains("invalid_request")
        || kind.contains("not_found")
        || kind.contains("too_large")
    {
        ProviderError::BadResponse(format!("the provider refused the request: {text}"))
    } else if kind.contains("timeout") {
        ProviderError::Transport(text)
    } else {
        // `api_error`, `server_error` and anything unknown: the server's
        // trouble, not the request's.
        ProviderError::Server {
            status: 500,
            retry_after: None,
            message: text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_deserialize_strictly_and_with_defaults() {
        let route: RouteConfig = toml::from_str(
            r#"
            provider = "openai"
            base_url = "http://localhost:11434/v1/"
            model = "llama3.2"
            "#,
        )
        .unwrap();
        assert_eq!(route.provider, ProviderKind::Openai);
        assert_eq!(route.effective_base_url(), "http://localhost:11434/v1");
        assert_eq!(route.timeout_secs, DEFAULT_TIMEOUT_SECS);
        assert_eq!(route.idle_timeout_secs, DEFAULT_IDLE_TIMEOUT_SECS);
        route.validate().unwrap();
        let typo = toml::from_str::<RouteConfig>("provider = \"openai\"\nmodle = \"x\"");
        assert!(typo.unwrap_err().to_string().contains("modle"));
    }

    #[test]
    fn validation_names_the_field() {
        let mut route = RouteConfig::new(ProviderKind::Anthropic, "");
        let err = route.validate().unwrap_err().to_string();
        assert!(err.contains("model"), "{err}");
        route.model = "claude".into();
        route.base_url = Some("ftp://x".into());
        assert!(route
            .validate()
            .unwrap_err()
            .to_string()
            .contains("base_url"));
        route.base_url = None;
        route.extra_headers.insert("bad header".into(), "x".into());
        assert!(route
            .validate()
            .unwrap_err()
            .to_string()
            .contains("extra_headers"));
    }

    #[test]
    fn a_missing_key_is_a_start_up_error_naming_the_variable() {
        let mut route = RouteConfig::new(ProviderKind::Openai, "gpt-4o-mini");
        route.api_key_env = Some("OVERSEER_TEST_UNSET_KEY_7f3a".into());
        let err = build_provider(&route).err().unwrap().to_string();
        assert!(err.contains("OVERSEER_TEST_UNSET_KEY_7f3a"), "{err}");
        // Without a key variable, a local server needs no key...
        route.api_key_env = None;
        route.base_url = Some("http://127.0.0.1:11434/v1".into());
        assert!(build_provider(&route).is_ok());
        assert_eq!(route.effective_api_key_env(), None);
        // ...but the public endpoint does, from its conventional variable.
        route.base_url = None;
        assert_eq!(route.effective_api_key_env(), Some("OPENAI_API_KEY"));
        let anthropic = RouteConfig::new(ProviderKind::Anthropic, "claude-sonnet-4-5");
        assert_eq!(anthropic.effective_api_key_env(), Some("ANTHROPIC_API_KEY"));
    }

    #[test]
    fn statuses_map_to_the_error_kinds() {
        let e = status_error(429, Some(Duration::from_secs(2)), "{}");
        assert!(
            matches!(e, ProviderError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(2))
        );
        assert!(matches!(
            status_error(401, None, ""),
            ProviderError::Auth(_)
        ));
        assert!(matches!(
            status_error(503, Some(Duration::from_secs(3)), ""),
            ProviderError::Server { status: 503, retry_after: Some(d), .. } if d == Duration::from_secs(3)
        ));
        let body = r#"{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        assert!(matches!(
            status_error(400, None, body),
            ProviderError::ContextOverflow { message, limit: Some(8192), .. } if message.contains("8192")
        ));
        let llama = r#"{"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}"#;
        assert!(matches!(
            status_error(500, None, llama),
            ProviderError::ContextOverflow { .. }
        ));
        let e = status_error(
            404,
            None,
            r#"{"error":{"message":"no such model","type":"not_found"}}"#,
        );
        assert_eq!(
            e,
            ProviderError::BadResponse("HTTP 404: no such model (not_found)".into())
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_milliseconds() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn excerpts_cut_on_char_boundaries() {
        let long = "é".repeat(1000);
        let e = excerpt(&long);
        assert_eq!(e.chars().count(), EXCERPT_CHARS + 1);
    }
}
