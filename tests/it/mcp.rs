//! MCP servers as tools, against real servers nobody on the team wrote:
//! `@modelcontextprotocol/server-everything` over stdio and over streamable
//! HTTP, and `@modelcontextprotocol/server-filesystem` on a temp directory,
//! installed from npm into `tests/node_modules` by the tests themselves
//! (`common::npm`: `npm ci --prefix tests` when missing or out of date).
//!
//! What is checked: tool listing (names, schemas, approval from annotations
//! and overrides), calls through a full agent turn with a human approval,
//! error results (`isError` and refused arguments), the scope token on the
//! HTTP transport (through a recording proxy), concurrent calls, a stdio
//! server that dies mid-session: its tools fail at once as unavailable while
//! it cannot restart, and work again once the supervisor has reconnected; an
//! HTTP server restarted between two calls (a new MCP session, the call
//! retried once); error texts that read as sentences, not Rust.
//! Nothing is timed: every wait is bounded only to turn a hang into a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::until_event as until;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use overseer::scope_token::ScopeTokens;
use overseer::tools::mcp::{McpHub, McpServerConfig, McpServerStatus, McpToolOverride};
use overseer_actors::model::{
    AgentConfig, CallState, Decision, EventKind, Notification, SessionId, StopReason, Submission,
    ToolCallId, TranscriptEntry,
};
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::store::MemStore;
use overseer_actors::tool::{CallScope, Tool, ToolContext, ToolRegistry};
use overseer_actors::{CreateSession, Overseer, RuntimeConfig};
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// Bound of any single wait: only turns a hang into a failure.
const PATIENCE: Duration = Duration::from_secs(60);

const SECRET: &[u8] = b"mcp-test-scope-token-secret-32-bytes";

// ---- the installed servers ---------------------------------------------------

/// `dist/index.js` of an installed `@modelcontextprotocol/<package>` (the
/// test's `init` installed them).
fn server_js(package: &str) -> String {
    let js = common::npm::tests_dir()
        .join("node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js");
    assert!(
        js.is_file(),
        "{} is missing although tests/node_modules is installed from tests/package-lock.json",
        js.display()
    );
    js.display().to_string()
}

fn everything_stdio(name: &str) -> McpServerConfig {
    McpServerConfig::stdio(name, "node", &[&server_js("server-everything"), "stdio"])
}

fn filesystem(dir: &Path) -> McpServerConfig {
    McpServerConfig::stdio(
        "filesystem",
        "node",
        &[&server_js("server-filesystem"), &dir.display().to_string()],
    )
}

/// `server-everything` in its streamable HTTP mode on a free loopback port;
/// killed when dropped.
struct HttpEverything {
    child: tokio::process::Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl HttpEverything {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::start_on(port).await
    }

    /// Starts it on `port` (a restart reuses the port of the one before).
    async fn start_on(port: u16) -> Self {
        let js = server_js("server-everything");
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let out = std::fs::File::create(&log).unwrap();
        // Its README: `server-everything streamableHttp`, port from $PORT,
        // endpoint /mcp. Its output goes to a file: it logs every request,
        // and an unread pipe would block it.
        let child = tokio::process::Command::new("node")
            .arg(&js)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let server = Self {
            child,
            port,
            log,
            _dir: dir,
        };
        let ready = tokio::time::timeout(PATIENCE, async {
            while tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(
            ready.is_ok(),
            "server-everything did not listen on port {port}; its log:\n{}",
            server.log()
        );
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills it and waits until the process is gone (its port is free).
    async fn stop(mut self) {
        self.child.start_kill().unwrap();
        tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("server-everything did not exit")
            .unwrap();
    }
}

impl Drop for HttpEverything {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

// ---- a recording reverse proxy in front of the HTTP server --------------------

/// One request the proxy forwarded.
#[derive(Debug, Clone)]
struct Seen {
    http_method: String,
    /// JSON-RPC method of a POSTed message.
    rpc_method: Option<String>,
    authorization: Option<String>,
    body: String,
}

/// Forwards everything to `upstream`, streaming answers (SSE) back, and
/// records each request's `Authorization` header and body.
async fn recording_proxy(upstream: String) -> (String, Arc<Mutex<Vec<Seen>>>) {
    proxy(upstream, false).await
}

/// Like [`recording_proxy`]; with `spec_404`, server-everything's refusal of
/// an unknown session (400, "No valid session ID") reaches the client as the
/// 404 the MCP spec prescribes. An upstream that cannot be reached is a 502.
async fn proxy(upstream: String, spec_404: bool) -> (String, Arc<Mutex<Vec<Seen>>>) {
    use axum::body::Body;
    use axum::extract::{Request, State};
    use axum::http::StatusCode;
    use axum::response::Response;

    #[derive(Clone)]
    struct Proxy {
        upstream: String,
        client: reqwest::Client,
        seen: Arc<Mutex<Vec<Seen>>>,
        spec_404: bool,
    }

    async fn forward(State(p): State<Proxy>, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let body_text = String::from_utf8_lossy(&bytes).into_owned();
        let rpc_method = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_owned));
        p.seen.lock().unwrap().push(Seen {
            http_method: parts.method.to_string(),
            rpc_method,
            authorization: parts
                .headers
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned()),
            body: body_text,
        });
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request = p
            .client
            .request(parts.method.clone(), format!("{}{path}", p.upstream));
        for (name, value) in &parts.headers {
            if name != "host" && name != "content-length" {
                request = request.header(name, value);
            }
        }
        let answer = match request.body(bytes).send().await {
            Ok(answer) => answer,
            Err(e) => {
                return Response::builder()
                    .status(StatusCode::BAD_GATEWAY)
                    .body(Body::from(e.to_string()))
                    .unwrap()
            }
        };
        let mut response = Response::builder().status(answer.status());
        for (name, value) in answer.headers() {
            if name != "content-length" && name != "transfer-encoding" {
                response = response.header(name, value);
            }
        }
        if p.spec_404 && answer.status() == StatusCode::BAD_REQUEST {
            let text = answer.text().await.unwrap_or_default();
            if text.contains("No valid session ID") {
                response = response.status(StatusCode::NOT_FOUND);
            }
            return response.body(Body::from(text)).unwrap();
        }
        response
            .body(Body::from_stream(answer.bytes_stream()))
            .unwrap()
    }

    let seen = Arc::new(Mutex::new(Vec::new()));
    let proxy = Proxy {
        upstream,
        client: reqwest::Client::new(),
        seen: seen.clone(),
        spec_404,
    };
    let app = axum::Router::new().fallback(forward).with_state(proxy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, seen)
}

// ---- helpers -------------------------------------------------------------------

/// Every test's first line: installs the npm servers if needed (failing
/// with what to install when Node.js is missing), and sets up logging.
async fn init() {
    common::npm::installed().await;
    // reqwest (the proxy's) is built without a default TLS provider.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

async fn start_hub(configs: &[McpServerConfig], tokens: Option<ScopeTokens>) -> McpHub {
    tokio::time::timeout(PATIENCE, McpHub::start(configs, tokens))
        .await
        .expect("MCP start-up hung")
        .unwrap_or_else(|e| panic!("MCP start-up failed: {e}"))
}

fn tool(hub: &McpHub, name: &str) -> Arc<dyn Tool> {
    hub.tools()
        .into_iter()
        .find(|t| t.spec().name == name)
        .unwrap_or_else(|| {
            let names: Vec<String> = hub.specs().into_iter().map(|s| s.name).collect();
            panic!("no tool {name}; the hub has {names:?}")
        })
}

/// A call context whose scope allows `tools`.
fn ctx(tools: &[&str]) -> ToolContext {
    ToolContext {
        session_id: SessionId::generate(),
        tenant: "acme".into(),
        agent: "tester".into(),
        call_id: ToolCallId::generate(),
        idempotency_key: "key".into(),
        attempt: 1,
        scope: CallScope {
            sub: Some("alice".into()),
            allowed_tools: tools.iter().map(|t| (*t).to_owned()).collect(),
            ..CallScope::default()
        },
    }
}

async fn call(hub: &McpHub, name: &str, arguments: Value) -> Result<Value, Value> {
    let t = tool(hub, name);
    tokio::time::timeout(PATIENCE, t.call(ctx(&[name]), arguments))
        .await
        .expect("tool call hung")
        .map_err(|e| e.to_value())
}

async fn wait_status(
    hub: &McpHub,
    server: &str,
    pred: impl Fn(&McpServerStatus) -> bool,
) -> McpServerStatus {
    tokio::time::timeout(PATIENCE, hub.wait_for(server, pred))
        .await
        .unwrap_or_else(|_| panic!("server {server} never reached the awaited status"))
        .expect("unknown server")
}

/// An overseer runtime whose tools are the hub's, playing `steps` per agent.
async fn overseer(hub: &McpHub, agents: Vec<AgentConfig>, steps: Value) -> Overseer {
    let scenario =
        Scenario::from_json(&json!({"name": "mcp", "agents": steps}).to_string()).unwrap();
    Overseer::start(
        agents,
        Arc::new(MemStore::new()),
        Arc::new(ScriptedProvider::new(scenario)),
        ToolRegistry::new(hub.tools()).unwrap(),
        RuntimeConfig::default(),
    )
    .await
    .unwrap()
}

async fn create(
    ov: &Overseer,
    agent: &str,
    prompt: &str,
) -> (SessionId, broadcast::Receiver<Notification>) {
    let id = SessionId::generate();
    let rx = ov.subscribe(id);
    ov.create_session(CreateSession {
        agent: agent.into(),
        tenant: "acme".into(),
        created_by: Some("alice".into()),
        prompt: Some(prompt.into()),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    (id, rx)
}

/// Approves each call that asks, until the turn ends; returns the approved
/// tool names and the stop reason.
async fn run_turn_approving(
    ov: &Overseer,
    id: SessionId,
    rx: &mut broadcast::Receiver<Notification>,
) -> (Vec<String>, StopReason) {
    let mut approved = Vec::new();
    loop {
        let kind = until(rx, |k| {
            matches!(
                k,
                EventKind::ApprovalRequested { .. } | EventKind::TurnEnded { .. }
            )
        })
        .await;
        match kind {
            EventKind::ApprovalRequested { call_id, name, .. } => {
                ov.submit(id, Submission::one(call_id, Decision::approve()))
                    .await
                    .unwrap();
                approved.push(name);
            }
            EventKind::TurnEnded { stop_reason, .. } => return (approved, stop_reason),
            _ => unreachable!(),
        }
    }
}

async fn transcript(ov: &Overseer, id: SessionId) -> Vec<TranscriptEntry> {
    let s = ov.state(id).await.unwrap();
    s.transcript.iter().map(|e| (**e).clone()).collect()
}

fn final_text(t: &[TranscriptEntry]) -> String {
    t.iter()
        .rev()
        .find_map(|e| match e {
            TranscriptEntry::Assistant { text, .. } => Some(text.clone()),
            _ => None,
        })
        .unwrap()
}

fn tool_results(t: &[TranscriptEntry]) -> Vec<(String, CallState, Value)> {
    t.iter()
        .filter_map(|e| match e {
            TranscriptEntry::ToolResult { call } => {
                Some((call.name.clone(), call.state, call.result.clone().unwrap()))
            }
            _ => None,
        })
        .collect()
}

// ---- server-everything over stdio ------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn everything_over_stdio_lists_its_tools_and_answers_calls() {
    init().await;
    let mut config = everything_stdio("everything");
    config
        .env
        .insert("OVERSEER_MCP_TEST".into(), "passed on".into());
    config.inherit_env.push("CARGO_PKG_NAME".into());
    config.tools.insert(
        "get-sum".into(),
        McpToolOverride {
            requires_approval: true,
        },
    );
    let hub = start_hub(&[config], None).await;
    assert!(matches!(
        hub.status("everything"),
        Some(McpServerStatus::Available { pid: Some(_) })
    ));

    // Listing: prefixed names, the server's schemas, approval from
    // readOnlyHint unless overridden.
    let specs = hub.specs();
    let spec = |n: &str| specs.iter().find(|s| s.name == n).unwrap().clone();
    for name in [
        "everything__echo",
        "everything__get-sum",
        "everything__get-env",
        "everything__get-tiny-image",
    ] {
        assert!(specs.iter().any(|s| s.name == name), "{name} not listed");
    }
    let echo = spec("everything__echo");
    assert!(
        !echo.requires_approval,
        "echo is annotated readOnlyHint: true"
    );
    assert!(echo.idempotent);
    assert_eq!(echo.parameters["type"], "object");
    assert_eq!(echo.parameters["required"], json!(["message"]));
    assert_eq!(echo.parameters["properties"]["message"]["type"], "string");
    assert_eq!(echo.description, "Echoes back the input string");
    assert!(spec("everything__get-sum").requires_approval, "overridden");
    assert!(
        spec("everything__toggle-simulated-logging").requires_approval,
        "not read-only: approval by default"
    );
    // The registry accepts every listed schema, and validates against them.
    let registry = ToolRegistry::new(hub.tools()).unwrap();
    assert!(registry
        .validate("everything__echo", &json!({"message": "hi"}))
        .is_ok());
    assert!(registry.validate("everything__echo", &json!({})).is_err());

    // Text-only results are one string.
    assert_eq!(
        call(&hub, "everything__echo", json!({"message": "hi there"})).await,
        Ok(json!("Echo: hi there"))
    );
    let sum = call(&hub, "everything__get-sum", json!({"a": 2, "b": 40}))
        .await
        .unwrap();
    assert!(sum.as_str().unwrap().contains("42"), "{sum}");
    // Mixed content is the MCP content array.
    let image = call(&hub, "everything__get-tiny-image", json!({}))
        .await
        .unwrap();
    let blocks = image.as_array().unwrap();
    assert!(
        blocks
            .iter()
            .any(|b| b["type"] == "image" && b["mimeType"] == "image/png"),
        "{image}"
    );
    assert!(blocks.iter().any(|b| b["type"] == "text"));

    // The environment: the config's `env` and `inherit_env` pass, the rest
    // of overseer's environment does not.
    let env = call(&hub, "everything__get-env", json!({})).await.unwrap();
    let env = env.as_str().unwrap();
    assert!(
        env.contains("\"OVERSEER_MCP_TEST\": \"passed on\""),
        "{env}"
    );
    assert!(env.contains("\"CARGO_PKG_NAME\": \"overseer\""), "{env}");
    assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok());
    assert!(!env.contains("CARGO_MANIFEST_DIR"), "{env}");

    // Arguments the server refuses (a call that skipped the registry's
    // validation) are an error result: the server answers `isError`.
    let refused = call(&hub, "everything__echo", json!({"message": 5}))
        .await
        .unwrap_err();
    let text = refused["error"].as_str().unwrap();
    assert!(text.contains("message"), "{refused}");

    // Calls to one server run concurrently over its one connection.
    let calls = (0..16).map(|i| {
        call(
            &hub,
            "everything__echo",
            json!({"message": format!("n{i}")}),
        )
    });
    let answers = futures::future::join_all(calls).await;
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer, Ok(json!(format!("Echo: n{i}"))));
    }

    // Outside the session's scope: refused before anything is sent.
    let echo_tool = tool(&hub, "everything__echo");
    let err = echo_tool
        .call(ctx(&["something_else"]), json!({"message": "x"}))
        .await
        .unwrap_err();
    assert_eq!(
        err.message,
        "tool 'everything__echo' is not available in this session"
    );
}

// ---- server-filesystem over stdio, through agent turns ---------------------------

#[tokio::test(flavor = "multi_thread")]
async fn filesystem_tools_run_in_an_agent_turn_with_approval_and_fail_cleanly() {
    init().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let hub = start_hub(&[filesystem(&root)], None).await;
    let specs = hub.specs();
    let spec = |n: &str| {
        specs
            .iter()
            .find(|s| s.name == n)
            .unwrap_or_else(|| panic!("{n} not listed"))
            .clone()
    };
    assert!(spec("filesystem__write_file").requires_approval);
    assert!(!spec("filesystem__read_text_file").requires_approval);

    let out = root.join("out.txt");
    let missing = root.join("missing.txt");
    let agent = AgentConfig::new(
        "files",
        &["filesystem__write_file", "filesystem__read_text_file"],
    );
    let ov = overseer(
        &hub,
        vec![agent],
        json!({"files": [
            {"text": "Writing.", "tool_calls": [{"name": "filesystem__write_file",
                "arguments": {"path": out.display().to_string(), "content": "written by overseer"}}]},
            {"text": "Reading back.", "tool_calls": [{"name": "filesystem__read_text_file",
                "arguments": {"path": out.display().to_string()}}]},
            {"text": "Read back: {{tool_result}}"},
            {"tool_calls": [{"name": "filesystem__read_text_file",
                "arguments": {"path": missing.display().to_string()}}]},
            {"text": "Failed: {{tool_result}}"}
        ]}),
    )
    .await;

    // Turn 1: the write waits for a human; once approved it runs, and the
    // read-only read does not ask.
    let (id, mut rx) = create(&ov, "files", "save a note").await;
    let (approved, stop) = run_turn_approving(&ov, id, &mut rx).await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(approved, vec!["filesystem__write_file"]);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "written by overseer"
    );
    let t = transcript(&ov, id).await;
    assert_eq!(final_text(&t), "Read back: written by overseer");
    let results = tool_results(&t);
    assert_eq!(results.len(), 2);
    assert!(
        results
            .iter()
            .all(|(_, state, _)| *state == CallState::Completed),
        "{results:?}"
    );

    // Turn 2: reading a missing file is an error result (`isError` from the
    // server) and the turn goes on.
    ov.send_message(id, "read the other one").await.unwrap();
    let (approved, stop) = run_turn_approving(&ov, id, &mut rx).await;
    assert!(approved.is_empty());
    assert_eq!(stop, StopReason::EndTurn);
    let t = transcript(&ov, id).await;
    let (name, state, result) = tool_results(&t).pop().unwrap();
    assert_eq!(name, "filesystem__read_text_file");
    assert_eq!(state, CallState::Failed);
    let error = result["error"].as_str().unwrap();
    assert!(
        error.contains("ENOENT") || error.contains("no such file"),
        "{result}"
    );
    assert!(
        final_text(&t).starts_with("Failed: {\"error\":"),
        "{}",
        final_text(&t)
    );

    // Outside the allowed directory: the server refuses, an error result.
    let outside = call(
        &hub,
        "filesystem__read_text_file",
        json!({"path": "/etc/hostname"}),
    )
    .await
    .unwrap_err();
    assert!(
        outside["error"].as_str().unwrap().contains("denied"),
        "{outside}"
    );
}

// ---- server-everything over streamable HTTP ---------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn everything_over_streamable_http_gets_the_scope_token_and_runs_in_a_turn() {
    init().await;
    let server = HttpEverything::start().await;
    let (proxy, seen) = recording_proxy(format!("http://127.0.0.1:{}", server.port)).await;
    let tokens = ScopeTokens::hs256(SECRET, Duration::from_secs(300)).unwrap();
    let mut config = McpServerConfig::http("web", format!("{proxy}/mcp"));
    config.tools.insert(
        "echo".into(),
        McpToolOverride {
            requires_approval: true,
        },
    );
    let hub = start_hub(&[config], Some(tokens.clone())).await;
    assert_eq!(
        hub.status("web"),
        Some(McpServerStatus::Available { pid: None })
    );
    let echo = hub
        .specs()
        .into_iter()
        .find(|s| s.name == "web__echo")
        .expect("web__echo listed");
    assert!(echo.requires_approval, "overridden to ask");

    let agent = AgentConfig::new("caller", &["web__echo"]);
    let ov = overseer(
        &hub,
        vec![agent],
        json!({"caller": [
            {"text": "Echoing.", "tool_calls": [{"name": "web__echo", "arguments": {"message": "over http"}}]},
            {"text": "It said: {{tool_result}}"}
        ]}),
    )
    .await;
    let (id, mut rx) = create(&ov, "caller", "echo something").await;
    let (approved, stop) = run_turn_approving(&ov, id, &mut rx).await;
    assert_eq!(stop, StopReason::EndTurn, "server log:\n{}", server.log());
    assert_eq!(approved, vec!["web__echo"]);
    assert_eq!(
        final_text(&transcript(&ov, id).await),
        "It said: Echo: over http"
    );

    // The tools/call request carried the call's scope token as a bearer
    // token, and only in the header; nothing else carried one.
    let seen = seen.lock().unwrap().clone();
    let calls: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.rpc_method.as_deref() == Some("tools/call"))
        .collect();
    assert_eq!(calls.len(), 1, "{seen:#?}");
    let bearer = calls[0]
        .authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .unwrap_or_else(|| panic!("no bearer token: {:?}", calls[0]));
    let claims = tokens.authorize(bearer, "web__echo").unwrap();
    assert_eq!(claims.session_id, id);
    assert_eq!(claims.root_session_id, id);
    assert_eq!(claims.tenant, "acme");
    assert_eq!(claims.sub, "alice");
    assert_eq!(claims.agent, "caller");
    assert_eq!(claims.allowed_tools, vec!["web__echo"]);
    assert!(
        !calls[0].body.contains(bearer),
        "the token must not be in the body"
    );
    assert!(!calls[0].body.contains("dev.overseer/scope_token"));
    assert!(
        seen.iter()
            .filter(|s| s.rpc_method.as_deref() != Some("tools/call"))
            .all(|s| s.authorization.is_none()),
        "{seen:#?}"
    );
    assert!(seen
        .iter()
        .any(|s| s.rpc_method.as_deref() == Some("initialize")));
    assert!(seen.iter().all(|s| s.http_method != "PUT"));

    // An error result over HTTP too.
    let refused = call(&hub, "web__get-sum", json!({"a": "two"}))
        .await
        .unwrap_err();
    assert!(refused["error"].as_str().is_some(), "{refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_http_server_fails_start_up_or_is_unavailable() {
    init().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = McpServerConfig::http("gone", format!("http://127.0.0.1:{port}/mcp"));
    config.startup_timeout_secs = 10;
    let err = McpHub::start(&[config.clone()], None).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("MCP server 'gone' failed to start"),
        "{err}"
    );
    assert_plain(&err.to_string());
    config.required = false;
    config.tools.insert(
        "echo".into(),
        McpToolOverride {
            requires_approval: false,
        },
    );
    let hub = start_hub(&[config], None).await;
    let err = call(&hub, "gone__echo", json!({"message": "x"}))
        .await
        .unwrap_err();
    assert!(
        err["error"]
            .as_str()
            .unwrap()
            .starts_with("MCP server 'gone' is unavailable: "),
        "{err}"
    );
    assert_plain(err["error"].as_str().unwrap());
}

// ---- a stdio server that dies mid-session ----------------------------------------

/// Kills a process outright, as a crash would.
fn kill9(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stdio_server_that_dies_mid_session_is_unavailable_then_reconnected() {
    init().await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("refuse");
    // server-everything behind a launcher that refuses to start while the
    // marker exists: the test decides when a restart may succeed, so it need
    // not race the supervisor's backoff. `exec` keeps the server's pid.
    let script = r#"if [ -e "$1" ]; then echo "refusing to start: $1 exists" >&2; exit 1; fi; exec node "$2" stdio"#;
    let marker_arg = marker.display().to_string();
    let js = server_js("server-everything");
    let config = McpServerConfig::stdio("flaky", "sh", &["-c", script, "sh", &marker_arg, &js]);
    let hub = start_hub(&[config], None).await;
    let McpServerStatus::Available {
        pid: Some(first_pid),
    } = hub.status("flaky").unwrap()
    else {
        panic!("flaky should be up")
    };

    let agent = AgentConfig::new(
        "user",
        &["flaky__echo", "flaky__trigger-long-running-operation"],
    );
    let ov = overseer(
        &hub,
        vec![agent],
        json!({"user": [
            {"tool_calls": [{"name": "flaky__echo", "arguments": {"message": "one"}}]},
            {"text": "first: {{tool_result}}"},
            {"tool_calls": [{"name": "flaky__echo", "arguments": {"message": "two"}}]},
            {"text": "second: {{tool_result}}"},
            {"tool_calls": [{"name": "flaky__echo", "arguments": {"message": "three"}}]},
            {"text": "third: {{tool_result}}"}
        ]}),
    )
    .await;
    let (id, mut rx) = create(&ov, "user", "go").await;
    let (_, stop) = run_turn_approving(&ov, id, &mut rx).await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(final_text(&transcript(&ov, id).await), "first: Echo: one");

    // A call in flight when the process dies fails as unavailable, not hangs.
    std::fs::write(&marker, "").unwrap();
    let long = tool(&hub, "flaky__trigger-long-running-operation");
    let in_flight = tokio::spawn(async move {
        long.call(
            ctx(&["flaky__trigger-long-running-operation"]),
            json!({"duration": 600, "steps": 2}),
        )
        .await
    });
    kill9(first_pid);
    let err = tokio::time::timeout(PATIENCE, in_flight)
        .await
        .expect("the in-flight call hung")
        .unwrap()
        .unwrap_err();
    assert!(
        err.message
            .starts_with("MCP server 'flaky' is unavailable: "),
        "{err}"
    );

    // The supervisor sees the exit; while the server cannot restart, its
    // tools fail at once with the reason, which quotes the launcher's stderr.
    let status = wait_status(&hub, "flaky", |s| {
        matches!(s, McpServerStatus::Unavailable { reason } if reason.contains("refusing to start"))
    })
    .await;
    let McpServerStatus::Unavailable { reason } = status else {
        unreachable!()
    };
    ov.send_message(id, "again").await.unwrap();
    let (_, stop) = run_turn_approving(&ov, id, &mut rx).await;
    assert_eq!(stop, StopReason::EndTurn);
    let t = transcript(&ov, id).await;
    let (_, state, result) = tool_results(&t).pop().unwrap();
    assert_eq!(state, CallState::Failed);
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("MCP server 'flaky' is unavailable: "),
        "{result}"
    );
    assert!(error.contains("refusing to start"), "{result}");
    assert!(final_text(&t).starts_with("second: {\"error\":\"MCP server 'flaky' is unavailable"));
    assert!(reason.contains("refusing to start"), "{reason}");

    // Once it may start again, the supervisor reconnects (a new process) and
    // the same session's tools work again.
    std::fs::remove_file(&marker).unwrap();
    let status = wait_status(&hub, "flaky", |s| {
        matches!(s, McpServerStatus::Available { .. })
    })
    .await;
    let McpServerStatus::Available {
        pid: Some(second_pid),
    } = status
    else {
        panic!("{status:?}")
    };
    assert_ne!(second_pid, first_pid);
    ov.send_message(id, "once more").await.unwrap();
    let (_, stop) = run_turn_approving(&ov, id, &mut rx).await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(final_text(&transcript(&ov, id).await), "third: Echo: three");
}

// ---- an HTTP server that restarts ------------------------------------------------

/// Calls `web__echo` once, restarts the server on the same port (the new
/// process knows nothing of overseer's MCP session), and calls it again: the
/// second call succeeds after one new `initialize`, and the retried request
/// still carries the call's scope token.
async fn survives_a_restart(spec_404: bool) {
    init().await;
    let server = HttpEverything::start().await;
    let port = server.port;
    let (proxy, seen) = proxy(format!("http://127.0.0.1:{port}"), spec_404).await;
    let tokens = ScopeTokens::hs256(SECRET, Duration::from_secs(300)).unwrap();
    let mut config = McpServerConfig::http("web", format!("{proxy}/mcp"));
    // Far above the test's patience: a call that waited for the tool timeout
    // fails the test through `call`'s bound.
    config.timeout_secs = 3600;
    let hub = start_hub(&[config], Some(tokens.clone())).await;
    assert_eq!(
        call(&hub, "web__echo", json!({"message": "before"})).await,
        Ok(json!("Echo: before"))
    );

    server.stop().await;
    let server = HttpEverything::start_on(port).await;
    let after = call(&hub, "web__echo", json!({"message": "after"})).await;
    assert_eq!(
        after,
        Ok(json!("Echo: after")),
        "server log:\n{}",
        server.log()
    );
    assert_eq!(
        hub.status("web"),
        Some(McpServerStatus::Available { pid: None })
    );

    let seen = seen.lock().unwrap().clone();
    let count = |m: &str| {
        seen.iter()
            .filter(|s| s.rpc_method.as_deref() == Some(m))
            .count()
    };
    assert_eq!(count("initialize"), 2, "one re-initialization: {seen:#?}");
    // Before; refused in the old session; retried once in the new one.
    let calls: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.rpc_method.as_deref() == Some("tools/call"))
        .collect();
    assert_eq!(calls.len(), 3, "{seen:#?}");
    for c in calls {
        let bearer = c
            .authorization
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "))
            .unwrap_or_else(|| panic!("a tools/call without its scope token: {c:?}"));
        tokens.authorize(bearer, "web__echo").unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_server_that_restarts_is_reinitialized_and_the_call_retried() {
    // server-everything refuses the stale session with a 400 and a JSON-RPC
    // error without an id.
    survives_a_restart(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_server_that_answers_404_for_a_stale_session_is_reinitialized() {
    // The MCP spec's answer to an unknown session.
    survives_a_restart(true).await;
}

/// Fails if `text` reads like Rust rather than a sentence: a path, a type's
/// debug output, an `Option`.
fn assert_plain(text: &str) {
    for marker in [
        "::",
        "Transport [",
        "Transport(",
        "McpError",
        "ErrorData",
        "Error {",
        "Error(",
        "Some(",
        "None",
        "ProtocolVersion(",
    ] {
        assert!(
            !text.contains(marker),
            "'{marker}' in an error text meant for people: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn error_texts_that_reach_the_model_are_plain_sentences() {
    init().await;
    // A server that went away: the model reads why its call failed.
    let server = HttpEverything::start().await;
    let url = format!("http://127.0.0.1:{}/mcp", server.port);
    let hub = start_hub(&[McpServerConfig::http("web", &url)], None).await;
    let agent = AgentConfig::new("caller", &["web__echo"]);
    let ov = overseer(
        &hub,
        vec![agent],
        json!({"caller": [
            {"tool_calls": [{"name": "web__echo", "arguments": {"message": "anyone?"}}]},
            {"text": "Failed: {{tool_result}}"}
        ]}),
    )
    .await;
    server.stop().await;
    let (id, mut rx) = create(&ov, "caller", "echo something").await;
    let (_, stop) = run_turn_approving(&ov, id, &mut rx).await;
    assert_eq!(stop, StopReason::EndTurn);
    let t = transcript(&ov, id).await;
    let (_, state, result) = tool_results(&t).pop().unwrap();
    assert_eq!(state, CallState::Failed);
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "MCP server 'web' is unavailable: could not connect to {url}: "
        )),
        "{error}"
    );
    assert_plain(error);
    assert_plain(&final_text(&t));

    // An HTTP endpoint that is no MCP server: the start-up error, and the
    // reason its tools fail with when it is optional.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let odd = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(
            listener,
            axum::Router::new().fallback(|| async { "hello, I am a web page" }),
        )
        .await
    });
    let mut config = McpServerConfig::http("odd", &odd);
    let err = McpHub::start(std::slice::from_ref(&config), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("content type 'text/plain"), "{err}");
    assert_plain(&err);
    config.required = false;
    config.tools.insert(
        "echo".into(),
        McpToolOverride {
            requires_approval: false,
        },
    );
    let hub = start_hub(&[config], None).await;
    let err = call(&hub, "odd__echo", json!({"message": "x"}))
        .await
        .unwrap_err();
    let err = err["error"].as_str().unwrap();
    assert!(
        err.starts_with("MCP server 'odd' is unavailable: "),
        "{err}"
    );
    assert_plain(err);
}

// ---- installing the npm servers -------------------------------------------------

/// A directory with this repository's `package.json` and lock file.
fn npm_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["package.json", "package-lock.json"] {
        std::fs::copy(common::npm::tests_dir().join(name), dir.path().join(name)).unwrap();
    }
    dir
}

#[test]
fn without_node_or_npm_the_tests_fail_saying_what_to_install() {
    use common::npm::{ensure, Programs, INSTALL_HINT};
    let dir = npm_project();
    for programs in [
        Programs {
            node: "overseer-test-no-such-node",
            npm: "npm",
        },
        Programs {
            node: "node",
            npm: "overseer-test-no-such-npm",
        },
    ] {
        let message = ensure(dir.path(), programs).unwrap_err();
        assert!(message.contains(INSTALL_HINT), "{message}");
        assert!(message.contains("apt-get install nodejs npm"), "{message}");
        assert!(!message.contains('\n'), "one line: {message}");
    }
    // Node.js that is too old says so, with the same advice (a script stands
    // in for an old `node`).
    let old = dir.path().join("old-node");
    std::fs::write(&old, "#!/bin/sh\necho v18.19.0\n").unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&old)
        .status()
        .unwrap();
    let old = old.display().to_string();
    let message = ensure(
        dir.path(),
        Programs {
            node: &old,
            npm: "npm",
        },
    )
    .unwrap_err();
    assert!(message.contains("'v18.19.0'"), "{message}");
    assert!(message.contains(INSTALL_HINT), "{message}");
}

#[test]
fn node_modules_is_installed_again_only_when_the_lock_file_changed() {
    use common::npm::{ensure, is_up_to_date, stamp, Install, Programs};
    let dir = npm_project();
    let path = dir.path();
    // An `npm` that cannot run shows whether an install was attempted.
    let no_npm = Programs {
        node: "node",
        npm: "overseer-test-no-such-npm",
    };
    let current = stamp(path).unwrap();
    assert!(!is_up_to_date(path, &current), "nothing installed yet");
    assert!(ensure(path, no_npm).is_err(), "a missing install runs npm");

    // A finished install of this lock file is left alone.
    let modules = path.join("node_modules");
    std::fs::create_dir(&modules).unwrap();
    std::fs::write(modules.join(".overseer-npm-ci.sha256"), &current).unwrap();
    assert!(is_up_to_date(path, &current));
    assert_eq!(ensure(path, no_npm), Ok(Install::UpToDate));

    // A changed lock file makes it out of date: npm runs again.
    let lock = path.join("package-lock.json");
    let mut text = std::fs::read_to_string(&lock).unwrap();
    text.push('\n');
    std::fs::write(&lock, text).unwrap();
    let changed = stamp(path).unwrap();
    assert_ne!(changed, current);
    assert!(!is_up_to_date(path, &changed));
    assert!(
        ensure(path, no_npm).is_err(),
        "an outdated install runs npm"
    );
}
