//! `http` tools: tools a user declares in config (`[[tools]]`) and
//! overseer serves by calling the user's own HTTP endpoint.
//!
//! For each call, overseer sends `{"tool", "call_id", "session_id",
//! "arguments"}` as JSON with `Authorization: Bearer <scope token>` (when
//! scope tokens are configured) and `Idempotency-Key: <ctx.idempotency_key>`.
//! The runtime keeps that key across a crash-retry, so the receiver can
//! de-duplicate a call that overseer had to dispatch twice.
//!
//! This module owns the declaration ([`HttpToolConfig`]), its start-up
//! checks (URL, header names and values, `env:NAME` header values read once
//! from the environment), the request, the mapping of every answer and
//! failure to a result or an error result, the streaming response-size cap and
//! the bounded retry of an *idempotent* tool's transport failures. It also
//! holds the small HTTP helpers the `http_request` built-in shares
//! (capped body reads, excerpts, error chains).
//!
//! It deliberately does not decide whether a call may run at all (scope and
//! approval are the runtime's; the scope token is only re-checked here so that
//! nothing is sent for a tool outside `allowed_tools`), nor enforce the
//! per-tool timeout and 10 MiB result cap: `overseer_actors::tool_call` wraps
//! every `call` in both. The tool still keeps its own deadline (the same
//! `timeout_secs`) so it never outlives that timeout, even called directly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use overseer_actors::error::chain as error_chain;
use overseer_actors::model::OnInterrupt;
use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolSpec, MAX_RESULT_BYTES};
use reqwest::header::{
    HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST,
    TRANSFER_ENCODING,
};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::scope_token::{ScopeTokenError, ScopeTokens};

/// Default `max_response_bytes`: the runtime's result cap, so a body that
/// fits is never cut here only to be accepted there.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = MAX_RESULT_BYTES;
/// Default `timeout_secs`.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// Most bytes of a non-2xx body quoted in the error result.
pub const ERROR_EXCERPT_BYTES: usize = 2 * 1024;
/// Retries after the first request of an idempotent tool.
pub const MAX_RETRIES: u32 = 3;
/// Wait before the first retry; doubles with each retry up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between two retries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The prefix of a header value read from the environment at start-up.
pub const ENV_PREFIX: &str = "env:";
/// Connect timeout of [`client`]: a dead host fails fast enough to leave time
/// for the retries of an idempotent tool within its `timeout_secs`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The `Idempotency-Key` header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// HTTP method of an `http` tool. The JSON envelope is sent as the body
/// whatever the method, since it carries the arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// `GET`.
    #[serde(alias = "get")]
    Get,
    /// `POST` (the default).
    #[default]
    #[serde(alias = "post")]
    Post,
    /// `PUT`.
    #[serde(alias = "put")]
    Put,
    /// `PATCH`.
    #[serde(alias = "patch")]
    Patch,
    /// `DELETE`.
    #[serde(alias = "delete")]
    Delete,
}

impl HttpMethod {
    fn as_method(self) -> Method {
        match self {
            Self::Get => Method::GET,
            Self::Post => Method::POST,
            Self::Put => Method::PUT,
            Self::Patch => Method::PATCH,
            Self::Delete => Method::DELETE,
        }
    }
}

/// One `http` tool as declared in config (`[[tools]]`).
///
/// ```toml
/// [[tools]]
/// name = "create_ticket"
/// description = "Opens a ticket in the tracker."
/// url = "https://tickets.internal/overseer"
/// parameters = { type = "object", properties = { title = { type = "string" } }, required = ["title"] }
/// headers = { "X-Api-Key" = "env:TICKETS_API_KEY" }
/// idempotent = true
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    /// Tool name, as the model sees it (`[A-Za-z0-9_-]`, at most 64).
    pub name: String,
    /// What it does (shown to the model).
    pub description: String,
    /// JSON Schema of the arguments.
    #[serde(default = "object_schema")]
    pub parameters: Value,
    /// Endpoint (http or https).
    pub url: String,
    /// Method (default `POST`).
    #[serde(default)]
    pub method: HttpMethod,
    /// Extra request headers. A value `env:NAME` is read from environment
    /// variable `NAME` at start-up; a missing variable fails start-up.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whether the `per_tool` policy asks a human first (default true: a
    /// declared tool is assumed to have side effects).
    #[serde(default = "yes")]
    pub requires_approval: bool,
    /// Seconds before a call fails with a timeout (default 60).
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Whether running it twice with the same arguments has one effect
    /// (default false). Only an idempotent tool is retried, here on transport
    /// errors and after a crash.
    #[serde(default)]
    pub idempotent: bool,
    /// What to do if the process stopped while it ran; unset takes the
    /// default (`retry` if idempotent, else `ask`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_interrupt: Option<OnInterrupt>,
    /// Largest response body read; a longer one fails the call (default
    /// 10 MiB).
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
}

impl HttpToolConfig {
    /// A declaration with the defaults, for code and tests.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        url: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters: object_schema(),
            url: url.into(),
            method: HttpMethod::default(),
            headers: BTreeMap::new(),
            requires_approval: true,
            timeout_secs: DEFAULT_TIMEOUT_SECS,
            idempotent: false,
            on_interrupt: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// The declaration as the runtime sees it.
    pub fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
            requires_approval: self.requires_approval,
            timeout_secs: self.timeout_secs,
            idempotent: self.idempotent,
            on_interrupt: self.on_interrupt,
        }
    }
}

fn object_schema() -> Value {
    json!({"type": "object"})
}

fn yes() -> bool {
    true
}

fn default_timeout_secs() -> u64 {
    DEFAULT_TIMEOUT_SECS
}

fn default_max_response_bytes() -> usize {
    DEFAULT_MAX_RESPONSE_BYTES
}

/// Why an `http` tool could not be set up (all start-up errors name the tool).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpToolError {
    /// The name is not one a provider accepts.
    #[error("http tool '{0}': the name must be 1 to 64 characters of A-Z, a-z, 0-9, '_' or '-'")]
    InvalidName(String),
    /// The URL is unusable.
    #[error("http tool '{tool}': invalid url '{url}': {reason}")]
    InvalidUrl {
        /// Tool name.
        tool: String,
        /// The configured URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// A header value names an environment variable that is not set.
    #[error("http tool '{tool}': header '{header}' reads environment variable '{var}', which is not set")]
    MissingEnv {
        /// Tool name.
        tool: String,
        /// Header name.
        header: String,
        /// Variable name.
        var: String,
    },
    /// A header name or value is not valid HTTP.
    #[error("http tool '{tool}': header '{header}': {reason}")]
    InvalidHeader {
        /// Tool name.
        tool: String,
        /// Header name.
        header: String,
        /// Why.
        reason: String,
    },
    /// Another setting is out of range.
    #[error("http tool '{tool}': {field} {reason}")]
    Invalid {
        /// Tool name.
        tool: String,
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("could not build the HTTP client of http tools: {0}")]
    Client(String),
}

/// The HTTP client `http` tools are meant to share: rustls with aws-lc-rs,
/// a connect timeout, and no redirects followed, because a tool endpoint
/// that redirects is answered as a non-2xx (a `POST` with side effects must
/// not silently become a `GET` elsewhere).
pub fn client() -> Result<reqwest::Client, HttpToolError> {
    // reqwest is built without a bundled crypto provider; installing it
    // twice is a harmless no-op (see `crate::provider`).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("overseer/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| HttpToolError::Client(error_chain(&e)))
}

/// Builds every declared `http` tool on one shared [`client`], failing on
/// the first bad declaration (start-up errors name the tool).
pub fn http_tools(
    configs: &[HttpToolConfig],
    tokens: Option<&ScopeTokens>,
) -> Result<Vec<Arc<dyn Tool>>, HttpToolError> {
    let client = client()?;
    configs
        .iter()
        .map(|cfg| {
            HttpTool::new(cfg.clone(), tokens.cloned(), client.clone())
                .map(|tool| Arc::new(tool) as Arc<dyn Tool>)
        })
        .collect()
}

/// An `http` tool, ready to call.
pub struct HttpTool {
    spec: ToolSpec,
    url: Url,
    /// Scheme, host and port only: what error messages show, since the path
    /// or query of a configured URL may carry a secret.
    origin: String,
    method: Method,
    /// Configured headers, resolved and validated at start-up.
    headers: HeaderMap,
    tokens: Option<ScopeTokens>,
    client: reqwest::Client,
    max_response_bytes: usize,
}

impl std::fmt::Debug for HttpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values may be credentials: names only.
        f.debug_struct("HttpTool")
            .field("name", &self.spec.name)
            .field("origin", &self.origin)
            .field("method", &self.method)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("scope_tokens", &self.tokens.is_some())
            .finish_non_exhaustive()
    }
}

impl HttpTool {
    /// Checks a declaration and resolves its `env:` headers. `tokens` signs
    /// the scope token of each call; without it no `Authorization` is sent.
    pub fn new(
        cfg: HttpToolConfig,
        tokens: Option<ScopeTokens>,
        client: reqwest::Client,
    ) -> Result<Self, HttpToolError> {
        Self::with_env(cfg, tokens, client, |var| std::env::var(var).ok())
    }

    /// [`HttpTool::new`] with the environment given as a function (tests).
    pub fn with_env(
        cfg: HttpToolConfig,
        tokens: Option<ScopeTokens>,
        client: reqwest::Client,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, HttpToolError> {
        let tool = cfg.name.clone();
        if !valid_tool_name(&tool) {
            return Err(HttpToolError::InvalidName(tool));
        }
        let invalid_url = |reason: String| HttpToolError::InvalidUrl {
            tool: tool.clone(),
            url: cfg.url.clone(),
            reason,
        };
        let url = Url::parse(&cfg.url).map_err(|e| invalid_url(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid_url(format!(
                "the scheme must be http or https, not '{}'",
                url.scheme()
            )));
        }
        if url.host_str().is_none() {
            return Err(invalid_url("it has no host".into()));
        }
        if cfg.timeout_secs == 0 {
            return Err(HttpToolError::Invalid {
                tool,
                field: "timeout_secs",
                reason: "must be at least 1".into(),
            });
        }
        if cfg.max_response_bytes == 0 {
            return Err(HttpToolError::Invalid {
                tool,
                field: "max_response_bytes",
                reason: "must be at least 1".into(),
            });
        }
        let headers = resolve_headers(&tool, &cfg.headers, tokens.is_some(), env)?;
        Ok(Self {
            spec: cfg.spec(),
            origin: url.origin().ascii_serialization(),
            url,
            method: cfg.method.as_method(),
            headers,
            tokens,
            client,
            max_response_bytes: cfg.max_response_bytes,
        })
    }

    fn name(&self) -> &str {
        &self.spec.name
    }

    /// The scope token of request number `request_no` (from 1) of a call,
    /// checked to allow this tool.
    fn scope_token(
        &self,
        tokens: &ScopeTokens,
        ctx: &ToolContext,
        request_no: u32,
    ) -> Result<String, ToolError> {
        let minted = if request_no == 1 {
            tokens.mint(ctx)
        } else {
            // A retry within one dispatch is a new request: give it its own
            // `jti` so a receiver that refuses replayed tokens does not refuse
            // it. The Idempotency-Key, not the jti, ties the requests together.
            let mut claims = tokens.claims(ctx, now_secs());
            claims.jti = format!("{}:r{request_no}", claims.jti);
            tokens.encode(&claims)
        };
        let token =
            minted.map_err(|e| ToolError::new(format!("http tool '{}': {e}", self.name())))?;
        // The runtime already checks the session's scope before dispatch;
        // this is the scope guarantee that nothing leaves the process for a tool
        // the token would not allow, whoever calls the tool.
        tokens.authorize(&token, self.name()).map_err(|e| match e {
            ScopeTokenError::ToolNotAllowed { .. } => ToolError {
                message: format!("http tool '{}' refused before sending: {e}", self.name()),
                details: Some(json!({"refused": true})),
            },
            other => ToolError::new(format!("http tool '{}': {other}", self.name())),
        })?;
        Ok(token)
    }

    /// One request. `Err` carries whether the failure is worth a retry.
    async fn request(
        &self,
        ctx: &ToolContext,
        body: &[u8],
        request_no: u32,
        deadline: Instant,
    ) -> Result<Value, Failure> {
        let mut headers = self.headers.clone();
        if let Some(tokens) = &self.tokens {
            let token = self
                .scope_token(tokens, ctx, request_no)
                .map_err(Failure::fatal)?;
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                Failure::fatal(ToolError::new(format!(
                    "http tool '{}': the scope token is not a valid header value",
                    self.name()
                )))
            })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let key = HeaderValue::from_str(&ctx.idempotency_key).map_err(|_| {
            Failure::fatal(ToolError::new(format!(
                "http tool '{}': the idempotency key is not a valid header value",
                self.name()
            )))
        })?;
        headers.insert(IDEMPOTENCY_KEY, key);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if !headers.contains_key(ACCEPT) {
            headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        }
        // The call's `execute_tool` span (telemetry on) is the tool's parent.
        if let Some(traceparent) = crate::telemetry::traceparent() {
            headers.insert("traceparent", traceparent);
        }
        let request = self
            .client
            .request(self.method.clone(), self.url.clone())
            .headers(headers)
            .body(body.to_vec());
        let exchange = async {
            let mut response = request.send().await.map_err(|e| self.transport(&e))?;
            let status = response.status();
            if !status.is_success() {
                let excerpt = read_excerpt(&mut response, ERROR_EXCERPT_BYTES).await;
                return Err(Failure {
                    error: ToolError {
                        message: format!("http tool '{}' answered {status}", self.name()),
                        details: Some(json!({
                            "status": status.as_u16(),
                            "body": excerpt,
                        })),
                    },
                    retryable: matches!(
                        status,
                        StatusCode::BAD_GATEWAY
                            | StatusCode::SERVICE_UNAVAILABLE
                            | StatusCode::GATEWAY_TIMEOUT
                    ),
                });
            }
            let json = is_json(response.headers());
            let bytes = read_capped(&mut response, self.max_response_bytes)
                .await
                .map_err(|e| match e {
                    BodyError::TooLarge => Failure::fatal(too_large(
                        &format!("http tool '{}'", self.name()),
                        self.max_response_bytes,
                    )),
                    BodyError::Transport(e) => self.transport(&e),
                })?;
            self.result(json, &bytes).map_err(Failure::fatal)
        };
        match tokio::time::timeout_at(deadline, exchange).await {
            Ok(outcome) => outcome,
            // The deadline is the whole call's: a timed-out request leaves no
            // time for a retry, so it is final.
            Err(_) => Err(Failure::fatal(ToolError {
                message: format!(
                    "http tool '{}': no answer from {} within {} s",
                    self.name(),
                    self.origin,
                    self.spec.timeout_secs
                ),
                details: Some(json!({"timed_out": true})),
            })),
        }
    }

    /// A 2xx body as the result: JSON when it says it is, else `{"text"}`.
    fn result(&self, json: bool, bytes: &[u8]) -> Result<Value, ToolError> {
        if json {
            return serde_json::from_slice(bytes).map_err(|e| ToolError {
                message: format!("http tool '{}' answered invalid JSON: {e}", self.name()),
                details: Some(json!({"body": excerpt(bytes, ERROR_EXCERPT_BYTES)})),
            });
        }
        Ok(json!({"text": String::from_utf8_lossy(bytes)}))
    }

    /// A send or body-read failure: connection refused, reset, TLS, a
    /// connect timeout. All are retryable for an idempotent tool.
    fn transport(&self, e: &reqwest::Error) -> Failure {
        let what = if e.is_connect() {
            "could not connect to"
        } else if e.is_timeout() {
            "timed out talking to"
        } else {
            "request failed to"
        };
        Failure {
            error: ToolError::new(format!(
                "http tool '{}' {what} {}: {}",
                self.name(),
                self.origin,
                transport_message(e)
            )),
            retryable: true,
        }
    }
}

/// A failed request, and whether an idempotent tool may try again.
struct Failure {
    error: ToolError,
    retryable: bool,
}

impl Failure {
    fn fatal(error: ToolError) -> Self {
        Self {
            error,
            retryable: false,
        }
    }
}

/// A reqwest error's message with its sources but without the URL: it may
/// carry a secret, and the callers name the origin already.
pub(crate) fn transport_message(e: &reqwest::Error) -> String {
    let text = error_chain(e);
    match e.url() {
        Some(url) => text.replace(&format!(" for url ({url})"), ""),
        None => text,
    }
}

/// The wait before retry number `retry` (0-based), with jitter.
pub fn backoff(retry: u32) -> Duration {
    Backoff::new(INITIAL_BACKOFF, MAX_BACKOFF).delay(retry)
}

#[async_trait::async_trait]
impl Tool for HttpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        let deadline = Instant::now() + Duration::from_secs(self.spec.timeout_secs);
        let envelope = json!({
            "tool": self.spec.name,
            "call_id": ctx.call_id,
            "session_id": ctx.session_id,
            "arguments": arguments,
        });
        let body = serde_json::to_vec(&envelope).map_err(|e| {
            ToolError::new(format!(
                "http tool '{}': the arguments are not serializable: {e}",
                self.name()
            ))
        })?;
        let mut request_no = 1;
        loop {
            let failure = match self.request(&ctx, &body, request_no, deadline).await {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            let retry = request_no - 1;
            // Never retry a tool that may have side effects: the first
            // request may have reached it even when the answer did not.
            let give_up = !self.spec.idempotent || !failure.retryable || retry >= MAX_RETRIES;
            let wait = backoff(retry);
            if give_up || Instant::now() + wait >= deadline {
                let mut error = failure.error;
                if request_no > 1 {
                    let mut details = match error.details.take() {
                        Some(Value::Object(map)) => map,
                        _ => serde_json::Map::new(),
                    };
                    details.insert("attempts".into(), json!(request_no));
                    error.details = Some(Value::Object(details));
                }
                return Err(error);
            }
            tracing::debug!(
                tool = %self.spec.name,
                request_no,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                error = %failure.error,
                "retrying an idempotent http tool"
            );
            tokio::time::sleep(wait).await;
            request_no += 1;
        }
    }
}

/// Tool names the providers accept (OpenAI: `^[a-zA-Z0-9_-]{1,64}$`).
fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Validates configured headers and reads their `env:` values.
fn resolve_headers(
    tool: &str,
    configured: &BTreeMap<String, String>,
    with_tokens: bool,
    env: impl Fn(&str) -> Option<String>,
) -> Result<HeaderMap, HttpToolError> {
    let mut map = HeaderMap::new();
    for (name, raw) in configured {
        let invalid = |reason: String| HttpToolError::InvalidHeader {
            tool: tool.to_owned(),
            header: name.clone(),
            reason,
        };
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid("not a valid header name".into()))?;
        // These are overseer's to set: a configured one would be silently
        // replaced, or (Host, lengths) break the request.
        let reserved = header == IDEMPOTENCY_KEY
            || header == CONTENT_TYPE
            || header == CONTENT_LENGTH
            || header == TRANSFER_ENCODING
            || header == HOST
            || (with_tokens && header == AUTHORIZATION);
        if reserved {
            return Err(invalid(
                "is set by overseer and cannot be configured".to_owned()
                    + if header == AUTHORIZATION {
                        " while scope tokens are on"
                    } else {
                        ""
                    },
            ));
        }
        let value = match raw.strip_prefix(ENV_PREFIX) {
            Some(var) => env(var).ok_or_else(|| HttpToolError::MissingEnv {
                tool: tool.to_owned(),
                header: name.clone(),
                var: var.to_owned(),
            })?,
            None => raw.clone(),
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            // Never echo the value: it is likely a credential.
            invalid("the value holds characters a header cannot carry".into())
        })?;
        // Configured values are often credentials: keep them out of any
        // debug output.
        value.set_sensitive(true);
        map.append(header, value);
    }
    Ok(map)
}

// ---- helpers shared with `http_request` -------------------------------------

/// Why a body could not be read in full.
pub(crate) enum BodyError {
    /// It is longer than the cap.
    TooLarge,
    /// The connection failed while reading.
    Transport(reqwest::Error),
}

/// Reads a body of at most `cap` bytes, chunk by chunk, stopping as soon as
/// the cap would be passed: never more than `cap` bytes are buffered.
pub(crate) async fn read_capped(
    response: &mut reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, BodyError> {
    let announced = response.content_length();
    if announced.is_some_and(|len| len > cap as u64) {
        return Err(BodyError::TooLarge);
    }
    let initial = announced.map_or(0, |len| usize::try_from(len).unwrap_or(cap).min(cap));
    let mut body = Vec::with_capacity(initial);
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if body.len().saturating_add(chunk.len()) > cap {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error for a body over `cap`; `who` starts the message.
pub(crate) fn too_large(who: &str, cap: usize) -> ToolError {
    ToolError {
        message: format!("{who} answer exceeded the maximum size of {cap} bytes"),
        details: Some(json!({"max_response_bytes": cap, "truncated": true})),
    }
}

/// The first `limit` bytes of a body, as text. A broken body yields what
/// was read before it broke: an excerpt is informative, never an error.
pub(crate) async fn read_excerpt(response: &mut reqwest::Response, limit: usize) -> String {
    let mut bytes = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        bytes.extend_from_slice(&chunk);
        if bytes.len() >= limit {
            break;
        }
    }
    excerpt(&bytes, limit)
}

/// At most `limit` bytes of `bytes` as UTF-8 (lossy). A multi-byte character
/// cut by the limit is dropped rather than shown as a replacement character.
pub(crate) fn excerpt(bytes: &[u8], limit: usize) -> String {
    let cut = &bytes[..bytes.len().min(limit)];
    match std::str::from_utf8(cut) {
        Ok(text) => text.to_owned(),
        Err(e) if e.error_len().is_none() => {
            String::from_utf8_lossy(&cut[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(cut).into_owned(),
    }
}

/// Whether the response says its body is JSON (`application/json` or a
/// `+json` type).
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .is_some_and(|v| v == "application/json" || v.ends_with("+json"))
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

    #[test]
    fn config_defaults_and_unknown_fields() {
        let cfg: HttpToolConfig = toml::from_str(
            r#"
            name = "t"
            description = "d"
            url = "http://127.0.0.1:9/x"
            "#,
        )
        .unwrap();
        assert_eq!(cfg, HttpToolConfig::new("t", "d", "http://127.0.0.1:9/x"));
        assert_eq!(cfg.method, HttpMethod::Post);
        assert!(cfg.requires_approval);
        assert_eq!(cfg.timeout_secs, 60);
        assert!(!cfg.idempotent);
        assert_eq!(cfg.max_response_bytes, 10 * 1024 * 1024);
        assert_eq!(cfg.parameters, json!({"type": "object"}));
        let err = toml::from_str::<HttpToolConfig>(
            "name = \"t\"\ndescription = \"d\"\nurl = \"http://x\"\nretries = 3\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("retries"), "{err}");
    }

    /// How the config engineer may embed it: an internally tagged `[[tools]]`
    /// entry still refuses unknown fields.
    #[test]
    fn embeds_as_an_internally_tagged_tools_entry() {
        #[derive(Debug, Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        enum ToolDecl {
            Http(HttpToolConfig),
        }
        #[derive(Debug, Deserialize)]
        struct Root {
            tools: Vec<ToolDecl>,
        }
        let ok: Root = toml::from_str(
            "[[tools]]\nkind = \"http\"\nname = \"t\"\ndescription = \"d\"\nurl = \"http://x\"\nmethod = \"put\"\non_interrupt = \"fail\"\n",
        )
        .unwrap();
        let ToolDecl::Http(cfg) = &ok.tools[0];
        assert_eq!(cfg.method, HttpMethod::Put);
        assert_eq!(cfg.on_interrupt, Some(OnInterrupt::Fail));
        assert!(toml::from_str::<Root>(
            "[[tools]]\nkind = \"http\"\nname = \"t\"\ndescription = \"d\"\nurl = \"http://x\"\nbogus = 1\n"
        )
        .is_err());
    }

    #[test]
    fn backoff_doubles_from_100_ms_with_jitter_up_to_1_s() {
        for (retry, base) in [(0, 100), (1, 200), (2, 400), (4, 1000), (40, 1000)] {
            let wait = backoff(retry);
            let (lo, hi) = (
                Duration::from_millis(base),
                Duration::from_millis((2 * base).min(1000)),
            );
            assert!(wait >= lo && wait <= hi, "{retry}: {wait:?}");
        }
    }

    #[test]
    fn excerpts_cut_at_the_limit_and_at_a_character_boundary() {
        assert_eq!(excerpt(b"abcdef", 4), "abcd");
        assert_eq!(excerpt("aé".as_bytes(), 2), "a");
        assert_eq!(excerpt(b"a\xffb", 8), "a\u{fffd}b");
    }

    #[test]
    fn bad_declarations_fail_with_the_tool_named() {
        let client = reqwest::Client::new();
        let bad = |cfg: HttpToolConfig| {
            HttpTool::with_env(cfg, None, client.clone(), |_| None)
                .unwrap_err()
                .to_string()
        };
        assert!(bad(HttpToolConfig::new("a b", "d", "http://x")).contains("'a b'"));
        assert!(bad(HttpToolConfig::new("t", "d", "ftp://x/")).contains("http or https"));
        assert!(bad(HttpToolConfig::new("t", "d", "not a url")).contains("invalid url"));
        let mut cfg = HttpToolConfig::new("t", "d", "http://x");
        cfg.headers.insert("Idempotency-Key".into(), "x".into());
        assert!(bad(cfg).contains("set by overseer"));
        let mut cfg = HttpToolConfig::new("t", "d", "http://x");
        cfg.headers.insert("X-Key".into(), "bad\nvalue".into());
        let msg = bad(cfg);
        assert!(
            msg.contains("X-Key") && !msg.contains("bad\nvalue"),
            "{msg}"
        );
        let mut cfg = HttpToolConfig::new("t", "d", "http://x");
        cfg.timeout_secs = 0;
        assert!(bad(cfg).contains("timeout_secs"));
    }
}
