//! MCP servers as tool providers: the tools of every configured server,
//! stdio or streamable HTTP, exposed to agents as `server__tool`.
//!
//! [`McpHub::start`] connects to every `[[mcp_servers]]` entry at start-up
//! through the `rmcp` client, lists its tools and wraps each as an overseer
//! [`Tool`] ([`McpTool`]). The hub then keeps each connection alive: a
//! supervising task per server notices when a stdio server's process exits
//! (or any connection's task ends), marks the server unavailable, and
//! reconnects with exponential backoff (1 s doubling to 30 s, with jitter). While a server
//! is unavailable its tools fail at once with
//! `{"error": "MCP server '<name>' is unavailable: <reason>"}` instead of
//! waiting for it; the reason quotes the tail of a stdio server's stderr.
//!
//! The rules a tool follows:
//! - **Name**: `<server>__<tool>`, characters outside `[A-Za-z0-9_-]` in the
//!   tool's name replaced by `_` (what LLM APIs accept).
//! - **Schema**: the server's input schema; a missing or empty one becomes
//!   `{"type": "object"}` (and one without `type` gets `"type": "object"`); a
//!   schema that does not compile is replaced by `{"type": "object"}` with a
//!   warning, leaving validation to the server.
//! - **Approval**: the `tools` override of the config if there is one; else
//!   required unless the server annotates the tool `readOnlyHint: true`. An
//!   annotation is the server's claim, so an operator who does not trust a
//!   server overrides it to `requires_approval = true`.
//! - **Idempotent** (retried after a crash): read-only or annotated
//!   `idempotentHint: true`.
//! - **Timeout**: the server's `timeout_secs`, applied by the runtime around
//!   the call (rmcp then tells the server the call is cancelled).
//! - **Result**: text content only: the texts joined by newlines, as a JSON
//!   string; any other content: the MCP content array; no content: the
//!   structured content if any, else `""`. An `isError: true` result, a
//!   JSON-RPC error and a lost connection become error results
//!   `{"error": <text>, …}`.
//! - **Scope token**: a call to a tool outside the session's
//!   `allowed_tools` is refused before anything is sent. A streamable HTTP
//!   server receives the call's scope token as `Authorization: Bearer <token>`
//!   on its `tools/call` request (see [`http`]). A stdio server receives
//!   none: MCP over stdio has no per-request headers, and the process already
//!   runs with exactly the trust its config gave it.
//!
//! Calls to one server may run concurrently: rmcp multiplexes requests over
//! one connection.
//!
//! A streamable HTTP server that restarts forgets overseer's MCP session. rmcp
//! then opens a new session (a new `initialize`) and sends the refused
//! request once more, so the call goes through instead of waiting for its
//! timeout; [`http`] makes the refusal recognisable when a server answers it
//! with a 400 rather than the spec's 404. Error texts are plain sentences,
//! never rmcp's Rust type names (`errors`).
//!
//! Tools of a server that was unavailable at start-up (`required = false`)
//! cannot be listed. The hub then exposes only the tools named in that
//! server's `tools` overrides, with a permissive schema, so agents may list
//! them; they fail as unavailable until the server is reached.
//!
//! This module deliberately does not decide approval policy or run the
//! timeout and size cap: those are the runtime's (`overseer_actors`).

mod config;
mod errors;
pub mod http;
mod stderr;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
    RequestMetaObject,
};
use rmcp::service::{QuitReason, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{IntoTransport, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{Peer, RoleClient, ServiceError, ServiceExt};
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};

use crate::backoff::Backoff;
use crate::scope_token::ScopeTokens;

pub use config::{
    validate_servers, McpConfigError, McpServerConfig, McpToolOverride, McpTransportKind, BASE_ENV,
    DEFAULT_STARTUP_TIMEOUT_SECS, DEFAULT_TIMEOUT_SECS, SEPARATOR,
};
pub use http::SCOPE_TOKEN_META_KEY;

use stderr::StderrTail;

/// How long a dead process's stderr may take to be read to its end.
const STDERR_PATIENCE: Duration = Duration::from_secs(2);
/// First pause before reconnecting; doubles per failed attempt.
const BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest pause between reconnection attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Largest JSON answer accepted from an HTTP server. Above the runtime's
/// 10 MiB result cap, so an oversized result gets the runtime's error object (with
/// its size) rather than a transport error.
const MAX_HTTP_JSON_BYTES: usize = 64 * 1024 * 1024;

/// Why the MCP servers could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// A `[[mcp_servers]]` entry is invalid.
    #[error(transparent)]
    Config(#[from] McpConfigError),
    /// A required server could not be started or reached.
    #[error("MCP server '{server}' failed to start: {reason}")]
    Start {
        /// The server.
        server: String,
        /// Why, with the tail of a stdio server's stderr.
        reason: String,
    },
    /// A `tools` override names a tool the server does not list.
    #[error("mcp_servers: server '{server}': `tools` names '{tool}', which the server does not list (it lists: {listed})")]
    UnknownOverride {
        /// The server.
        server: String,
        /// The overridden name.
        tool: String,
        /// The tools it lists.
        listed: String,
    },
    /// Two tools of a server map to one exposed name.
    #[error("MCP server '{server}': tools '{first}' and '{second}' would both be exposed as '{exposed}'")]
    DuplicateTool {
        /// The server.
        server: String,
        /// One tool's name on the server.
        first: String,
        /// The other's.
        second: String,
        /// The name both map to.
        exposed: String,
    },
}

/// What a server is doing, as the hub last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpServerStatus {
    /// Connected; its tools are called.
    Available {
        /// Process id of a stdio server.
        pid: Option<u32>,
    },
    /// Not connected; its tools fail at once with this reason.
    Unavailable {
        /// Why (exit, failed start with stderr, refused connection).
        reason: String,
    },
}

/// The connection a call uses.
#[derive(Clone)]
enum Conn {
    Up {
        peer: Peer<RoleClient>,
        pid: Option<u32>,
    },
    Down {
        reason: String,
    },
}

impl Conn {
    fn status(&self) -> McpServerStatus {
        match self {
            Conn::Up { pid, .. } => McpServerStatus::Available { pid: *pid },
            Conn::Down { reason } => McpServerStatus::Unavailable {
                reason: reason.clone(),
            },
        }
    }
}

/// One configured server, shared by its tools and its supervising task.
struct Server {
    config: McpServerConfig,
    /// Current connection. A watch so observers can wait for a change; its
    /// lock is held only to clone or replace the value, never across an await.
    conn: watch::Sender<Conn>,
    /// Mints the scope token sent to an HTTP server.
    tokens: Option<ScopeTokens>,
    /// Names of the tools exposed for it (listed at start-up, or the
    /// overrides of a server unreachable then).
    listed: BTreeSet<String>,
}

impl Server {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn is_http(&self) -> bool {
        self.config.url.is_some()
    }

    fn set(&self, conn: Conn) {
        self.conn.send_replace(conn);
    }

    fn unavailable(&self, reason: impl std::fmt::Display) -> ToolError {
        ToolError::new(format!(
            "MCP server '{}' is unavailable: {reason}",
            self.name()
        ))
    }

    /// The live connection, or the error a call fails with at once.
    fn peer(&self) -> Result<Peer<RoleClient>, ToolError> {
        let conn = self.conn.borrow().clone();
        match conn {
            Conn::Up { peer, .. } if !peer.is_transport_closed() => Ok(peer),
            // The supervisor has not noticed yet; the answer is the same.
            Conn::Up { .. } => Err(self.unavailable("the connection closed")),
            Conn::Down { reason } => Err(self.unavailable(reason)),
        }
    }

    /// A failed request as an error result.
    fn call_error(&self, error: ServiceError) -> ToolError {
        match error {
            ServiceError::McpError(data) => {
                let mut details = Map::new();
                details.insert("code".into(), json!(data.code.0));
                if let Some(d) = data.data {
                    details.insert("data".into(), d);
                }
                ToolError {
                    message: format!("MCP error {}: {}", data.code.0, data.message),
                    details: Some(Value::Object(details)),
                }
            }
            ServiceError::TransportClosed => {
                self.unavailable("the connection closed during the call")
            }
            ServiceError::TransportSend(e) => self.unavailable(errors::plain(&e)),
            other => ToolError::new(format!(
                "MCP server '{}': {}",
                self.name(),
                errors::service(&other)
            )),
        }
    }
}

/// A tool of an MCP server, as overseer exposes it.
pub struct McpTool {
    spec: ToolSpec,
    /// Its name on the server.
    remote: String,
    server: Arc<Server>,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.spec.name)
            .field("server", &self.server.name())
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

impl McpTool {
    /// The server's name.
    pub fn server(&self) -> &str {
        self.server.name()
    }

    /// The tool's name on its server.
    pub fn remote_name(&self) -> &str {
        &self.remote
    }
}

#[async_trait::async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        // A tool outside the scope is refused before anything is sent.
        if !ctx.scope.allowed_tools.contains(&self.spec.name) {
            return Err(ToolError::new(format!(
                "tool '{}' is not available in this session",
                self.spec.name
            )));
        }
        let peer = self.server.peer()?;
        let arguments = match arguments {
            Value::Object(map) => Some(map),
            Value::Null => None,
            other => {
                return Err(ToolError::new(format!(
                    "the arguments of an MCP tool must be a JSON object, not {other}"
                )))
            }
        };
        let mut params = CallToolRequestParams::new(self.remote.clone());
        params.arguments = arguments;
        if self.server.is_http() {
            if let Some(tokens) = &self.server.tokens {
                let token = tokens
                    .mint(&ctx)
                    .map_err(|e| ToolError::new(e.to_string()))?;
                let mut meta = RequestMetaObject::new();
                meta.0
                     .0
                    .insert(SCOPE_TOKEN_META_KEY.into(), Value::String(token));
                params.meta = Some(meta);
            }
            // The call's `execute_tool` span (telemetry on), in `_meta` as
            // the OpenTelemetry MCP conventions carry it: the HTTP
            // connection is shared by every call, so no header can.
            if let Some(traceparent) = crate::telemetry::traceparent() {
                if let Ok(value) = traceparent.to_str() {
                    params
                        .meta
                        .get_or_insert_with(RequestMetaObject::new)
                        .0
                         .0
                        .insert("traceparent".into(), Value::String(value.to_owned()));
                }
            }
        }
        match peer.call_tool(params).await {
            Ok(result) => result_value(result),
            Err(e) => Err(self.server.call_error(e)),
        }
    }
}

/// An MCP tool result as overseer's result or error result (see the module
/// docs for the shapes).
pub fn result_value(result: CallToolResult) -> Result<Value, ToolError> {
    let CallToolResult {
        content,
        structured_content,
        is_error,
        ..
    } = result;
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    let only_text = texts.len() == content.len();
    if is_error == Some(true) {
        let message = if texts.is_empty() {
            "the MCP tool reported an error without a message".to_owned()
        } else {
            texts.join("\n")
        };
        let mut details = Map::new();
        if !only_text {
            details.insert("content".into(), content_json(&content)?);
        }
        if let Some(s) = structured_content {
            details.insert("structured_content".into(), s);
        }
        return Err(ToolError {
            message,
            details: (!details.is_empty()).then_some(Value::Object(details)),
        });
    }
    if content.is_empty() {
        return Ok(structured_content.unwrap_or_else(|| Value::String(String::new())));
    }
    if only_text {
        return Ok(Value::String(texts.join("\n")));
    }
    content_json(&content)
}

fn content_json(content: &[rmcp::model::ContentBlock]) -> Result<Value, ToolError> {
    serde_json::to_value(content)
        .map_err(|e| ToolError::new(format!("the MCP result could not be converted: {e}")))
}

/// The name overseer exposes for `tool` of `server`.
pub fn exposed_name(server: &str, tool: &str) -> String {
    let tool: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{server}{SEPARATOR}{tool}")
}

/// A server's input schema as a JSON Schema of an arguments object.
pub fn normalize_schema(schema: &Map<String, Value>) -> Value {
    let mut schema = schema.clone();
    if !schema.contains_key("type") {
        schema.insert("type".into(), Value::String("object".into()));
    }
    Value::Object(schema)
}

/// The spec of a listed tool under `config`.
fn listed_spec(config: &McpServerConfig, tool: &rmcp::model::Tool) -> ToolSpec {
    let hint = |f: fn(&rmcp::model::ToolAnnotations) -> Option<bool>| {
        tool.annotations.as_ref().and_then(f) == Some(true)
    };
    let read_only = hint(|a| a.read_only_hint);
    let idempotent = read_only || hint(|a| a.idempotent_hint);
    let requires_approval = config
        .tools
        .get(tool.name.as_ref())
        .map_or(!read_only, |o| o.requires_approval);
    let description = tool
        .description
        .as_ref()
        .map(|d| d.to_string())
        .or_else(|| tool.title.clone())
        .unwrap_or_default();
    ToolSpec::new(
        exposed_name(&config.name, &tool.name),
        description,
        normalize_schema(&tool.input_schema),
    )
    .with_approval(requires_approval)
    .with_timeout(config.timeout_secs)
    .idempotent(idempotent)
}

/// The spec of a tool named in the overrides of a server that could not be
/// listed at start-up.
fn placeholder_spec(config: &McpServerConfig, tool: &str, o: &McpToolOverride) -> ToolSpec {
    ToolSpec::new(
        exposed_name(&config.name, tool),
        format!(
            "Tool '{tool}' of the MCP server '{}' (unreachable at start-up, so its description and schema are unknown).",
            config.name
        ),
        json!({"type": "object"}),
    )
    .with_approval(o.requires_approval)
    .with_timeout(config.timeout_secs)
}

/// A live connection and what it listed.
struct Live {
    service: RunningService<RoleClient, ClientConfig>,
    tools: Vec<rmcp::model::Tool>,
    pid: Option<u32>,
    stderr: Option<StderrTail>,
}

impl Live {
    fn conn(&self) -> Conn {
        Conn::Up {
            peer: self.service.peer().clone(),
            pid: self.pid,
        }
    }
}

/// Why one connection attempt failed, with a stdio server's stderr.
fn failure(reason: String, stderr: Option<String>) -> String {
    match stderr {
        Some(text) if !text.is_empty() => format!("{reason}; its stderr ends with:\n{text}"),
        _ => reason,
    }
}

fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("overseer", env!("CARGO_PKG_VERSION")),
    )
}

/// The handshake and the tool listing, within `patience`.
async fn handshake<T, E, A>(
    transport: T,
    patience: Duration,
) -> Result<
    (
        RunningService<RoleClient, ClientConfig>,
        Vec<rmcp::model::Tool>,
    ),
    String,
>
where
    T: IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let attempt = async {
        let service = client_config()
            .serve(transport)
            .await
            .map_err(|e| format!("the MCP handshake failed: {}", errors::initialize(&e)))?;
        let tools = service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| format!("listing its tools failed: {}", errors::service(&e)))?;
        Ok((service, tools))
    };
    tokio::time::timeout(patience, attempt).await.map_err(|_| {
        format!(
            "no answer to the MCP handshake and tool listing within {} s",
            patience.as_secs()
        )
    })?
}

/// One attempt to start or reach a server.
async fn connect(config: &McpServerConfig) -> Result<Live, String> {
    let patience = Duration::from_secs(config.startup_timeout_secs);
    match config.transport().map_err(|e| e.to_string())? {
        McpTransportKind::Stdio { command } => connect_stdio(config, command, patience).await,
        McpTransportKind::Http { url } => {
            let client = http::reqwest_client()
                .map_err(|e| format!("could not build its HTTP client: {e}"))?;
            let transport = StreamableHttpClientTransport::with_client(
                http::ScopedClient::new(client),
                StreamableHttpClientTransportConfig::with_uri(url)
                    .reinit_on_expired_session(true)
                    .max_json_response_size(MAX_HTTP_JSON_BYTES),
            );
            let (service, tools) = handshake(transport, patience)
                .await
                .map_err(|e| format!("{e} (url {url})"))?;
            Ok(Live {
                service,
                tools,
                pid: None,
                stderr: None,
            })
        }
    }
}

async fn connect_stdio(
    config: &McpServerConfig,
    command: &str,
    patience: Duration,
) -> Result<Live, String> {
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(&config.args).env_clear().kill_on_drop(true);
    for key in BASE_ENV
        .iter()
        .copied()
        .chain(config.inherit_env.iter().map(String::as_str))
    {
        if let Some(value) = std::env::var_os(key) {
            cmd.env(key, value);
        }
    }
    cmd.envs(&config.env);
    let (process, pipe) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not run `{command}`: {e}"))?;
    let pid = process.id();
    let stderr = pipe.map(|p| StderrTail::spawn(p, config.name.clone()));
    match handshake(process, patience).await {
        Ok((service, tools)) => Ok(Live {
            service,
            tools,
            pid,
            stderr,
        }),
        Err(reason) => {
            // The failed attempt dropped the process, which kills it; what it
            // said before dying usually explains the failure.
            let text = match &stderr {
                Some(tail) => {
                    tail.settle(STDERR_PATIENCE).await;
                    Some(tail.text())
                }
                None => None,
            };
            Err(failure(reason, text))
        }
    }
}

/// The MCP servers of the configuration, connected, with their tools.
///
/// Keep it for the life of the process: dropping it stops the servers'
/// supervisors and processes, after which its tools fail as unavailable.
pub struct McpHub {
    servers: BTreeMap<String, Arc<Server>>,
    tools: Vec<Arc<McpTool>>,
    supervisors: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHub")
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .field(
                "tools",
                &self.tools.iter().map(|t| &t.spec.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl McpHub {
    /// Connects to every server (concurrently) and lists its tools.
    ///
    /// Fails if an entry is invalid, a `required` server cannot be started or
    /// reached (the error quotes a stdio server's stderr), an override names
    /// a tool its server does not list, or two tools of a server map to one
    /// name. `tokens` mints the scope tokens sent to HTTP servers; with
    /// `None` they get no `Authorization` header.
    pub async fn start(
        configs: &[McpServerConfig],
        tokens: Option<ScopeTokens>,
    ) -> Result<Self, McpError> {
        validate_servers(configs)?;
        let attempts = futures::future::join_all(configs.iter().map(connect)).await;
        // Refuse before anything is kept: dropping the other attempts' live
        // connections stops their processes.
        for (config, attempt) in configs.iter().zip(&attempts) {
            if let (true, Err(reason)) = (config.required, attempt) {
                return Err(McpError::Start {
                    server: config.name.clone(),
                    reason: reason.clone(),
                });
            }
        }
        let mut hub = Self {
            servers: BTreeMap::new(),
            tools: Vec::new(),
            supervisors: Vec::new(),
        };
        let mut starts = Vec::new();
        for (config, attempt) in configs.iter().zip(attempts) {
            let conn = match &attempt {
                Ok(live) => live.conn(),
                Err(reason) => {
                    tracing::warn!(mcp_server = %config.name, "MCP server unavailable at start-up, retrying in the background: {reason}");
                    Conn::Down {
                        reason: reason.clone(),
                    }
                }
            };
            let specs = match &attempt {
                Ok(live) => server_specs(config, &live.tools)?,
                Err(_) => config
                    .tools
                    .iter()
                    .map(|(name, o)| (name.clone(), placeholder_spec(config, name, o)))
                    .collect(),
            };
            let server = Arc::new(Server {
                config: config.clone(),
                conn: watch::Sender::new(conn),
                tokens: tokens.clone(),
                listed: specs.iter().map(|(remote, _)| remote.clone()).collect(),
            });
            for (remote, spec) in specs {
                hub.tools.push(Arc::new(McpTool {
                    spec,
                    remote,
                    server: server.clone(),
                }));
            }
            hub.servers.insert(config.name.clone(), server.clone());
            starts.push((server, attempt.ok()));
        }
        // Spawned only once every check passed, so a failed start leaves no
        // task behind.
        for (server, live) in starts {
            hub.supervisors.push(tokio::spawn(supervise(server, live)));
        }
        Ok(hub)
    }

    /// Every tool of every server, for the tool registry.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools
            .iter()
            .map(|t| t.clone() as Arc<dyn Tool>)
            .collect()
    }

    /// The declarations of every tool (for listings).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }

    /// Names of the configured servers.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.servers.keys().map(String::as_str)
    }

    /// What the server `name` is doing now.
    pub fn status(&self, name: &str) -> Option<McpServerStatus> {
        let server = self.servers.get(name)?;
        let status = server.conn.borrow().status();
        Some(status)
    }

    /// Waits until the status of `name` satisfies `pred`; `None` for an
    /// unknown server. Waits as long as it takes: callers bound it.
    pub async fn wait_for(
        &self,
        name: &str,
        pred: impl Fn(&McpServerStatus) -> bool,
    ) -> Option<McpServerStatus> {
        let mut rx = self.servers.get(name)?.conn.subscribe();
        let status = rx.wait_for(|c| pred(&c.status())).await.ok()?.status();
        Some(status)
    }
}

impl Drop for McpHub {
    fn drop(&mut self) {
        for server in self.servers.values() {
            server.set(Conn::Down {
                reason: "overseer's MCP hub was shut down".into(),
            });
        }
        // Dropping each supervisor's connection stops its process (kill on drop).
        for task in &self.supervisors {
            task.abort();
        }
    }
}

/// The specs of the tools a server listed, keyed by their names on it;
/// checks overrides and exposed names.
fn server_specs(
    config: &McpServerConfig,
    listed: &[rmcp::model::Tool],
) -> Result<Vec<(String, ToolSpec)>, McpError> {
    let names: BTreeSet<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    if let Some(tool) = config.tools.keys().find(|t| !names.contains(t.as_str())) {
        return Err(McpError::UnknownOverride {
            server: config.name.clone(),
            tool: tool.clone(),
            listed: names.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    let mut exposed: BTreeMap<String, String> = BTreeMap::new();
    let mut specs = Vec::new();
    for tool in listed {
        let mut spec = listed_spec(config, tool);
        if let Some(first) = exposed.insert(spec.name.clone(), tool.name.to_string()) {
            return Err(McpError::DuplicateTool {
                server: config.name.clone(),
                first,
                second: tool.name.to_string(),
                exposed: spec.name,
            });
        }
        // The registry refuses a schema it cannot compile, which would fail
        // every tool for one server's mistake: fall back to any object.
        if let Err(e) =
            ToolRegistry::new(vec![Arc::new(SchemaProbe(spec.clone())) as Arc<dyn Tool>])
        {
            tracing::warn!(mcp_server = %config.name, tool = %tool.name, "unusable input schema, accepting any object: {e}");
            spec.parameters = json!({"type": "object"});
        }
        specs.push((tool.name.to_string(), spec));
    }
    Ok(specs)
}

/// A stand-in that lets the registry compile a schema before it is used.
struct SchemaProbe(ToolSpec);

#[async_trait::async_trait]
impl Tool for SchemaProbe {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    async fn call(&self, _ctx: ToolContext, _arguments: Value) -> Result<Value, ToolError> {
        Err(ToolError::new("not callable"))
    }
}

/// Pause before reconnection attempt `failures + 1`, with jitter (every
/// session's server restarting at once must not reconnect in lockstep).
fn backoff(failures: u32) -> Duration {
    Backoff::new(BACKOFF_START, BACKOFF_MAX).delay(failures)
}

/// Keeps one server connected: waits for its connection to end, marks it
/// unavailable with the reason, and reconnects with backoff.
async fn supervise(server: Arc<Server>, mut live: Option<Live>) {
    let mut failures: u32 = 0;
    loop {
        if let Some(Live {
            service, stderr, ..
        }) = live.take()
        {
            let quit = service.waiting().await;
            let what = if server.is_http() {
                "the connection ended"
            } else {
                "the server process exited"
            };
            let reason = match quit {
                Ok(QuitReason::Closed) => what.to_owned(),
                Ok(QuitReason::Cancelled) => format!("{what} (cancelled)"),
                Ok(QuitReason::JoinError(e)) | Err(e) => format!("its connection task failed: {e}"),
                Ok(_) => what.to_owned(),
            };
            let text = match &stderr {
                Some(tail) => {
                    tail.settle(STDERR_PATIENCE).await;
                    Some(tail.text())
                }
                None => None,
            };
            let reason = failure(reason, text);
            tracing::warn!(mcp_server = %server.name(), "MCP server lost, reconnecting: {reason}");
            server.set(Conn::Down { reason });
            failures = 0;
        }
        tokio::time::sleep(backoff(failures)).await;
        match connect(&server.config).await {
            Ok(new) => {
                tracing::info!(mcp_server = %server.name(), "MCP server connected");
                // The registry was built from the first listing: a changed
                // list cannot add or remove tools now, so say so.
                let listed: BTreeSet<String> =
                    new.tools.iter().map(|t| t.name.to_string()).collect();
                if listed != server.listed {
                    tracing::warn!(
                        mcp_server = %server.name(),
                        "the server's tools changed since start-up (now: {}); overseer keeps the start-up list until it restarts",
                        listed.into_iter().collect::<Vec<_>>().join(", ")
                    );
                }
                server.set(new.conn());
                live = Some(new);
                failures = 0;
            }
            Err(reason) => {
                tracing::warn!(mcp_server = %server.name(), "MCP server still unavailable: {reason}");
                server.set(Conn::Down { reason });
                failures = failures.saturating_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ContentBlock, ToolAnnotations};

    fn tool(name: &str, schema: Value, annotations: Option<ToolAnnotations>) -> rmcp::model::Tool {
        let Value::Object(schema) = schema else {
            panic!("schema must be an object")
        };
        let mut t = rmcp::model::Tool::new(name.to_owned(), "does things", Arc::new(schema));
        t.annotations = annotations;
        t
    }

    #[test]
    fn names_are_prefixed_and_sanitized() {
        assert_eq!(exposed_name("fs", "read_file"), "fs__read_file");
        assert_eq!(exposed_name("ev", "get-sum"), "ev__get-sum");
        assert_eq!(exposed_name("ev", "ns.tool/x"), "ev__ns_tool_x");
    }

    #[test]
    fn schemas_are_normalized() {
        assert_eq!(normalize_schema(&Map::new()), json!({"type": "object"}));
        let Value::Object(props) = json!({"properties": {"a": {"type": "string"}}}) else {
            unreachable!()
        };
        assert_eq!(
            normalize_schema(&props),
            json!({"type": "object", "properties": {"a": {"type": "string"}}})
        );
    }

    #[test]
    fn approval_follows_read_only_hints_and_overrides() {
        let mut config = McpServerConfig::stdio("s", "x", &[]);
        let ro = Some(ToolAnnotations::new().read_only(true));
        let listed = vec![
            tool("look", json!({}), ro.clone()),
            tool("write", json!({}), None),
            tool("look_but_ask", json!({}), ro),
        ];
        config.tools.insert(
            "look_but_ask".into(),
            McpToolOverride {
                requires_approval: true,
            },
        );
        let specs: BTreeMap<String, ToolSpec> = server_specs(&config, &listed)
            .unwrap()
            .into_iter()
            .collect();
        assert!(!specs["look"].requires_approval);
        assert!(specs["look"].idempotent);
        assert!(specs["write"].requires_approval);
        assert!(!specs["write"].idempotent);
        assert!(specs["look_but_ask"].requires_approval);
        assert_eq!(specs["look"].name, "s__look");
        assert_eq!(specs["look"].parameters, json!({"type": "object"}));
        assert_eq!(specs["look"].timeout_secs, 60);

        config.tools.insert(
            "nope".into(),
            McpToolOverride {
                requires_approval: false,
            },
        );
        let err = server_specs(&config, &listed).unwrap_err();
        assert!(matches!(err, McpError::UnknownOverride { ref tool, .. } if tool == "nope"));
    }

    #[test]
    fn colliding_names_and_broken_schemas() {
        let config = McpServerConfig::stdio("s", "x", &[]);
        let err = server_specs(
            &config,
            &[tool("a.b", json!({}), None), tool("a/b", json!({}), None)],
        )
        .unwrap_err();
        assert!(matches!(err, McpError::DuplicateTool { .. }), "{err}");
        let specs = server_specs(
            &config,
            &[tool(
                "bad",
                json!({"type": "object", "properties": 5}),
                None,
            )],
        )
        .unwrap();
        assert_eq!(specs[0].1.parameters, json!({"type": "object"}));
    }

    #[test]
    fn results_map_to_values_and_errors() {
        let text = |s: &str| ContentBlock::text(s);
        let ok = |content: Vec<ContentBlock>| CallToolResult::success(content);
        assert_eq!(
            result_value(ok(vec![text("a"), text("b")])).unwrap(),
            json!("a\nb")
        );
        let image = ContentBlock::image("aGk=", "image/png");
        let mixed = result_value(ok(vec![text("see"), image])).unwrap();
        assert_eq!(mixed[0]["type"], "text");
        assert_eq!(mixed[1]["type"], "image");
        assert_eq!(result_value(ok(vec![])).unwrap(), json!(""));
        let structured = CallToolResult::structured(json!({"t": 1}));
        assert!(result_value(structured).is_ok());

        let err = result_value(CallToolResult::error(vec![text("no such file")])).unwrap_err();
        assert_eq!(err.to_value(), json!({"error": "no such file"}));
        let err = result_value(CallToolResult::error(vec![])).unwrap_err();
        assert!(err.message.contains("without a message"));
    }

    #[test]
    fn protocol_and_transport_errors_map_to_error_results() {
        // The npm servers answer every tool failure with `isError`, so the
        // JSON-RPC error path is pinned here.
        let server = Server {
            config: McpServerConfig::stdio("s", "x", &[]),
            conn: watch::Sender::new(Conn::Down {
                reason: "it exited".into(),
            }),
            tokens: None,
            listed: BTreeSet::new(),
        };
        let e = server.call_error(ServiceError::McpError(rmcp::ErrorData::new(
            rmcp::model::ErrorCode(-32602),
            "Tool nope not found",
            Some(json!({"hint": 1})),
        )));
        assert_eq!(
            e.to_value(),
            json!({"error": "MCP error -32602: Tool nope not found", "code": -32602, "data": {"hint": 1}})
        );
        let e = server.call_error(ServiceError::TransportClosed);
        assert_eq!(
            e.message,
            "MCP server 's' is unavailable: the connection closed during the call"
        );
        let Err(e) = server.peer() else {
            panic!("a down server has no peer")
        };
        assert_eq!(e.message, "MCP server 's' is unavailable: it exited");
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        for (failures, base) in [(0, 1), (1, 2), (4, 16), (5, 30), (50, 30)] {
            let wait = backoff(failures);
            let (lo, hi) = (
                Duration::from_secs(base),
                Duration::from_secs((2 * base).min(30)),
            );
            assert!(wait >= lo && wait <= hi, "{failures}: {wait:?}");
        }
    }

    #[tokio::test]
    async fn a_required_server_that_cannot_start_fails_start_up_with_its_stderr() {
        let config = McpServerConfig::stdio(
            "broken",
            "sh",
            &["-c", "echo 'cannot open the database' >&2; exit 3"],
        );
        let err = McpHub::start(std::slice::from_ref(&config), None)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("MCP server 'broken' failed to start"),
            "{text}"
        );
        assert!(text.contains("cannot open the database"), "{text}");

        let missing = McpServerConfig::stdio("missing", "/nonexistent/overseer-mcp", &[]);
        let err = McpHub::start(&[missing], None).await.unwrap_err();
        assert!(err.to_string().contains("could not run"), "{err}");

        // Not required: start-up goes on, the server is unavailable, and the
        // tools named in its overrides fail at once with the reason.
        let mut optional = config;
        optional.required = false;
        optional.tools.insert(
            "query".into(),
            McpToolOverride {
                requires_approval: false,
            },
        );
        let hub = McpHub::start(&[optional], None).await.unwrap();
        let tools = hub.tools();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].spec().name, "broken__query");
        let Some(McpServerStatus::Unavailable { reason }) = hub.status("broken") else {
            panic!("should be unavailable")
        };
        assert!(reason.contains("cannot open the database"), "{reason}");
        let ctx = ToolContext {
            session_id: overseer_actors::model::SessionId::generate(),
            tenant: "t".into(),
            agent: "a".into(),
            call_id: overseer_actors::model::ToolCallId::generate(),
            idempotency_key: "k".into(),
            attempt: 1,
            scope: overseer_actors::tool::CallScope {
                allowed_tools: vec!["broken__query".into()],
                ..Default::default()
            },
        };
        let err = tools[0].call(ctx.clone(), json!({})).await.unwrap_err();
        assert!(
            err.message
                .starts_with("MCP server 'broken' is unavailable: "),
            "{err}"
        );
        // Outside the scope: refused before anything else.
        let mut outside = ctx;
        outside.scope.allowed_tools.clear();
        let err = tools[0].call(outside, json!({})).await.unwrap_err();
        assert_eq!(
            err.message,
            "tool 'broken__query' is not available in this session"
        );
    }
}
