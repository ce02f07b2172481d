//! `http` tools and the `http_request` built-in against loopback axum
//! servers started by each test: what the server really receives (envelope,
//! scope token, idempotency key), how every kind of answer and failure maps
//! to a result, the retry of idempotent tools, the allow-list and its
//! redirects, and one full agent turn through `Overseer`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::future::BoxFuture;
use futures::FutureExt;
use overseer::scope_token::ScopeTokens;
use overseer::tools::http_request::{HttpRequestConfig, HttpRequestTool};
use overseer::tools::http_tool::{self, HttpTool, HttpToolConfig, HttpToolError};
use overseer_actors::model::{
    AgentConfig, CallState, Decision, EventKind, Notification, SessionId, SessionStatus,
    StopReason, Submission, ToolCallId, TranscriptEntry,
};
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::store::MemStore;
use overseer_actors::tool::{CallScope, Tool, ToolContext, ToolRegistry};
use overseer_actors::{CreateSession, Overseer, RuntimeConfig};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

const SECRET: &[u8] = b"http-tools-test-secret-32-bytes!!";

/// Only turns a hang into a failure; nothing is timed against it.
const PATIENCE: Duration = Duration::from_secs(60);

// ---- a recording loopback server --------------------------------------------

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// How the server answers request number `n` (from 0).
type Reply = Arc<dyn Fn(usize, &Seen) -> BoxFuture<'static, Response> + Send + Sync>;

#[derive(Clone)]
struct AppState {
    seen: Arc<Mutex<Vec<Seen>>>,
    reply: Reply,
}

struct TestServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// A server on 127.0.0.1 answering with `reply`.
    async fn start(reply: impl Fn(usize, &Seen) -> Response + Send + Sync + 'static) -> Self {
        Self::start_async(move |n, seen| {
            let response = reply(n, seen);
            async move { response }.boxed()
        })
        .await
    }

    async fn start_async(
        reply: impl Fn(usize, &Seen) -> BoxFuture<'static, Response> + Send + Sync + 'static,
    ) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let state = AppState {
            seen: seen.clone(),
            reply: Arc::new(reply),
        };
        let app = Router::new().fallback(record).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, seen, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn record(State(state): State<AppState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let seen = Seen {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
    };
    let n = {
        let mut all = state.seen.lock().unwrap();
        all.push(seen.clone());
        all.len() - 1
    };
    (state.reply)(n, &seen).await
}

fn json_reply(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// A port nobody listens on: bound, then released.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

// ---- helpers ------------------------------------------------------------------

fn tokens() -> ScopeTokens {
    ScopeTokens::hs256(SECRET, Duration::from_secs(300)).unwrap()
}

fn ctx(call: &str, allowed: &[&str], attempt: u32) -> ToolContext {
    let session = SessionId::generate();
    ToolContext {
        session_id: session,
        tenant: "acme".into(),
        agent: "ops".into(),
        call_id: ToolCallId::from(call),
        idempotency_key: call.into(),
        attempt,
        scope: CallScope {
            sub: Some("alice".into()),
            root_session_id: Some(session),
            parent_session_id: None,
            allowed_tools: allowed.iter().map(|t| (*t).to_owned()).collect(),
        },
    }
}

fn http_tool(cfg: HttpToolConfig) -> HttpTool {
    HttpTool::new(cfg, Some(tokens()), http_tool::client().unwrap()).unwrap()
}

fn cfg(name: &str, url: String) -> HttpToolConfig {
    HttpToolConfig::new(name, "a test tool", url)
}

fn error_text(e: &Value) -> &str {
    e["error"].as_str().unwrap()
}

/// A tool's result through the runtime's §8 contract (timeout, result cap).
async fn run(tool: &dyn Tool, ctx: ToolContext, args: Value) -> Result<Value, Value> {
    overseer_actors::run_tool(tool, ctx, args).await
}

// ---- http tools -------------------------------------------------------------

#[tokio::test]
async fn sends_the_envelope_a_scope_token_and_a_stable_idempotency_key_across_a_crash_retry() {
    let server = TestServer::start(|_, seen| {
        json_reply(
            StatusCode::OK,
            json!({"ticket": "T-42", "got": seen.json()["arguments"]}),
        )
    })
    .await;
    let mut config = cfg("create_ticket", server.url("/hooks/ticket?v=1"));
    config
        .headers
        .insert("X-Api-Key".into(), "env:TICKETS_KEY".into());
    config.headers.insert("X-Static".into(), "plain".into());
    let tool = HttpTool::with_env(
        config,
        Some(tokens()),
        http_tool::client().unwrap(),
        |var| (var == "TICKETS_KEY").then(|| "s3cret".to_owned()),
    )
    .unwrap();
    assert!(
        !format!("{tool:?}").contains("s3cret"),
        "no secret in debug output"
    );

    // The first dispatch, then the runtime's re-dispatch after a crash: the
    // same call id and idempotency key, the next attempt.
    let first = ctx("call_abc", &["create_ticket", "current_time"], 1);
    let mut second = first.clone();
    second.attempt = 2;
    let args = json!({"title": "disk full", "priority": 2});
    let a = run(&tool, first.clone(), args.clone()).await.unwrap();
    let b = run(&tool, second, args.clone()).await.unwrap();
    assert_eq!(a, json!({"ticket": "T-42", "got": args}));
    assert_eq!(a, b);

    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    let mut jtis = Vec::new();
    for req in &seen {
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/hooks/ticket?v=1");
        assert_eq!(req.header("content-type"), Some("application/json"));
        assert_eq!(req.header("x-api-key"), Some("s3cret"));
        assert_eq!(req.header("x-static"), Some("plain"));
        assert_eq!(req.header("idempotency-key"), Some("call_abc"));
        assert_eq!(
            req.json(),
            json!({
                "tool": "create_ticket",
                "call_id": "call_abc",
                "session_id": first.session_id,
                "arguments": args,
            })
        );
        let bearer = req.header("authorization").unwrap();
        let token = bearer.strip_prefix("Bearer ").unwrap();
        let claims = tokens().verify(token).unwrap();
        assert_eq!(claims.sub, "alice");
        assert_eq!(claims.tenant, "acme");
        assert_eq!(claims.session_id, first.session_id);
        assert_eq!(claims.root_session_id, first.session_id);
        assert_eq!(claims.parent_session_id, None);
        assert_eq!(claims.agent, "ops");
        assert_eq!(claims.allowed_tools, vec!["create_ticket", "current_time"]);
        assert!(claims.exp > claims.iat);
        jtis.push(claims.jti);
    }
    // The key ties both dispatches together; each token is its own.
    assert_eq!(jtis, vec!["call_abc:1", "call_abc:2"]);
}

#[tokio::test]
async fn a_non_json_2xx_answer_is_wrapped_as_text_and_the_method_is_configurable() {
    let server = TestServer::start(|_, _| (StatusCode::OK, "queued").into_response()).await;
    let mut config = cfg("enqueue", server.url("/q"));
    config.method = http_tool::HttpMethod::Put;
    let tool = http_tool(config);
    let result = run(&tool, ctx("c1", &["enqueue"], 1), json!({}))
        .await
        .unwrap();
    assert_eq!(result, json!({"text": "queued"}));
    assert_eq!(server.requests()[0].method, "PUT");
}

#[tokio::test]
async fn a_4xx_answer_is_an_error_with_the_status_and_a_2_kib_excerpt() {
    let server = TestServer::start(|_, _| {
        (StatusCode::UNPROCESSABLE_ENTITY, "e".repeat(5 * 1024)).into_response()
    })
    .await;
    let tool = http_tool(cfg("strict", server.url("/")));
    let err = run(&tool, ctx("c1", &["strict"], 1), json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        error_text(&err),
        "http tool 'strict' answered 422 Unprocessable Entity"
    );
    assert_eq!(err["status"], 422);
    let body = err["body"].as_str().unwrap();
    assert_eq!(body.len(), 2048);
    assert!(body.chars().all(|c| c == 'e'));
}

#[tokio::test]
async fn a_5xx_answer_is_an_error_and_a_non_idempotent_tool_is_never_retried() {
    let server = TestServer::start(|_, _| {
        json_reply(StatusCode::SERVICE_UNAVAILABLE, json!({"error": "down"}))
    })
    .await;
    let tool = http_tool(cfg("charge_card", server.url("/")));
    let err = run(&tool, ctx("c1", &["charge_card"], 1), json!({}))
        .await
        .unwrap_err();
    assert_eq!(err["status"], 503);
    assert_eq!(err["body"], r#"{"error":"down"}"#);
    assert!(err.get("attempts").is_none());
    assert_eq!(server.requests().len(), 1, "no retry: it may have effects");
}

#[tokio::test]
async fn an_idempotent_tool_is_retried_on_503_with_the_same_idempotency_key() {
    let server = TestServer::start(|n, _| {
        if n < 2 {
            json_reply(StatusCode::SERVICE_UNAVAILABLE, json!({"error": "busy"}))
        } else {
            json_reply(StatusCode::OK, json!({"done": true}))
        }
    })
    .await;
    let mut config = cfg("upsert", server.url("/"));
    config.idempotent = true;
    let tool = http_tool(config);
    let result = run(&tool, ctx("call_r", &["upsert"], 1), json!({"k": 1}))
        .await
        .unwrap();
    assert_eq!(result, json!({"done": true}));
    let seen = server.requests();
    assert_eq!(seen.len(), 3);
    assert!(seen
        .iter()
        .all(|r| r.header("idempotency-key") == Some("call_r")));
    assert!(seen.iter().all(|r| r.body == seen[0].body));
    // Each request carries its own token id, so a receiver refusing replayed
    // tokens does not refuse a retry.
    let jtis: Vec<String> = seen
        .iter()
        .map(|r| {
            let token = r
                .header("authorization")
                .unwrap()
                .trim_start_matches("Bearer ");
            tokens().verify(token).unwrap().jti
        })
        .collect();
    assert_eq!(jtis, vec!["call_r:1", "call_r:1:r2", "call_r:1:r3"]);
}

#[tokio::test]
async fn an_idempotent_tool_gives_up_after_3_retries_and_never_retries_other_statuses() {
    let always = TestServer::start(|_, _| StatusCode::BAD_GATEWAY.into_response()).await;
    let mut config = cfg("upsert", always.url("/"));
    config.idempotent = true;
    let err = run(&http_tool(config), ctx("c", &["upsert"], 1), json!({}))
        .await
        .unwrap_err();
    assert_eq!(err["status"], 502);
    assert_eq!(err["attempts"], 4);
    assert_eq!(always.requests().len(), 4, "one request and 3 retries");

    let broken = TestServer::start(|_, _| StatusCode::INTERNAL_SERVER_ERROR.into_response()).await;
    let mut config = cfg("upsert", broken.url("/"));
    config.idempotent = true;
    let err = run(&http_tool(config), ctx("c", &["upsert"], 1), json!({}))
        .await
        .unwrap_err();
    assert_eq!(err["status"], 500);
    assert_eq!(
        broken.requests().len(),
        1,
        "a 500 is an answer, not a transport error"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_with_a_clear_error() {
    let server =
        TestServer::start_async(|_, _| futures::future::pending::<Response>().boxed()).await;
    let mut config = cfg("slow", server.url("/"));
    config.timeout_secs = 1;
    let tool = http_tool(config);
    // Called directly, the tool's own deadline ends it.
    let err = tool
        .call(ctx("c1", &["slow"], 1), json!({}))
        .await
        .unwrap_err()
        .to_value();
    let origin = format!("http://127.0.0.1:{}", server.port());
    assert_eq!(
        error_text(&err),
        format!("http tool 'slow': no answer from {origin} within 1 s")
    );
    assert_eq!(err["timed_out"], true);
    // Through the runtime, it is a timeout error either way.
    let err = run(&tool, ctx("c2", &["slow"], 1), json!({}))
        .await
        .unwrap_err();
    assert!(error_text(&err).contains("1 s"), "{err}");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn connection_refused_is_an_error_result_and_retried_only_for_an_idempotent_tool() {
    let port = dead_port();
    let url = format!("http://127.0.0.1:{port}/secret-path?token=abc");
    let err = run(
        &http_tool(cfg("gone", url.clone())),
        ctx("c", &["gone"], 1),
        json!({}),
    )
    .await
    .unwrap_err();
    let text = error_text(&err);
    assert!(
        text.starts_with(&format!(
            "http tool 'gone' could not connect to http://127.0.0.1:{port}"
        )),
        "{text}"
    );
    assert!(
        !text.contains("secret-path") && !text.contains("token=abc"),
        "{text}"
    );
    assert!(err.get("attempts").is_none());

    let mut config = cfg("gone", url);
    config.idempotent = true;
    let err = run(&http_tool(config), ctx("c", &["gone"], 1), json!({}))
        .await
        .unwrap_err();
    assert!(error_text(&err).contains("could not connect"), "{err}");
    assert_eq!(err["attempts"], 4);
}

#[tokio::test]
async fn an_oversized_answer_is_cut_while_streaming() {
    // No Content-Length: the cap can only be found while reading.
    let streamed = TestServer::start(|_, _| {
        let chunks = (0..64).map(|_| Ok::<_, Infallible>(Bytes::from(vec![b'x'; 1024])));
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(futures::stream::iter(chunks)))
            .unwrap()
    })
    .await;
    let mut config = cfg("big", streamed.url("/"));
    config.max_response_bytes = 4096;
    let err = run(&http_tool(config), ctx("c", &["big"], 1), json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        error_text(&err),
        "http tool 'big' answer exceeded the maximum size of 4096 bytes"
    );
    assert_eq!(err["max_response_bytes"], 4096);
    assert_eq!(err["truncated"], true);

    // With a Content-Length over the cap, the body is not even read.
    let announced =
        TestServer::start(|_, _| json_reply(StatusCode::OK, json!({"blob": "y".repeat(10_000)})))
            .await;
    let mut config = cfg("big", announced.url("/"));
    config.max_response_bytes = 4096;
    let err = run(&http_tool(config), ctx("c", &["big"], 1), json!({}))
        .await
        .unwrap_err();
    assert!(error_text(&err).contains("4096 bytes"), "{err}");
}

#[tokio::test]
async fn a_tool_outside_allowed_tools_is_refused_before_anything_is_sent() {
    let server = TestServer::start(|_, _| json_reply(StatusCode::OK, json!({}))).await;
    let tool = http_tool(cfg("delete_everything", server.url("/")));
    let err = run(&tool, ctx("c", &["current_time"], 1), json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        error_text(&err),
        "http tool 'delete_everything' refused before sending: scope token does not allow tool 'delete_everything' (allowed: current_time)"
    );
    assert_eq!(server.requests().len(), 0);
}

#[tokio::test]
async fn without_scope_tokens_no_authorization_is_sent() {
    let server = TestServer::start(|_, _| json_reply(StatusCode::OK, json!({"ok": 1}))).await;
    let mut config = cfg("plain", server.url("/"));
    config
        .headers
        .insert("Authorization".into(), "Basic dXNlcjpwYXNz".into());
    let tool = HttpTool::new(config, None, http_tool::client().unwrap()).unwrap();
    run(&tool, ctx("c", &[], 1), json!({})).await.unwrap();
    let seen = &server.requests()[0];
    assert_eq!(seen.header("authorization"), Some("Basic dXNlcjpwYXNz"));
    assert_eq!(seen.header("idempotency-key"), Some("c"));
}

#[test]
fn a_missing_env_var_fails_start_up_naming_the_tool_the_header_and_the_var() {
    let mut config = cfg("crm", "https://crm.example/hook".into());
    config.headers.insert(
        "X-Api-Key".into(),
        "env:OVERSEER_TEST_SURELY_UNSET_VAR_7".into(),
    );
    let err = HttpTool::new(config, None, reqwest::Client::new()).unwrap_err();
    assert_eq!(
        err,
        HttpToolError::MissingEnv {
            tool: "crm".into(),
            header: "X-Api-Key".into(),
            var: "OVERSEER_TEST_SURELY_UNSET_VAR_7".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "http tool 'crm': header 'X-Api-Key' reads environment variable 'OVERSEER_TEST_SURELY_UNSET_VAR_7', which is not set"
    );
}

// ---- http_request -----------------------------------------------------------

fn http_request(allow: &[&str]) -> HttpRequestTool {
    HttpRequestTool::new(HttpRequestConfig {
        allow_hosts: allow.iter().map(|h| (*h).to_owned()).collect(),
        max_response_bytes: 64 * 1024,
        timeout_secs: 10,
        ..HttpRequestConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn http_request_reaches_an_allowed_host() {
    let server = TestServer::start(|_, seen| {
        Response::builder()
            .status(StatusCode::CREATED)
            .header("content-type", "application/json")
            .header("etag", "\"v1\"")
            .header("x-internal", "not copied")
            .body(Body::from(
                json!({"method": seen.method, "body": seen.json()}).to_string(),
            ))
            .unwrap()
    })
    .await;
    let tool = http_request(&["127.0.0.1"]);
    assert!(tool.spec().requires_approval);
    let result = run(
        &tool,
        ctx("c", &["http_request"], 1),
        json!({
            "method": "POST",
            "url": server.url("/items"),
            "headers": {"X-Trace": "t1"},
            "body": {"name": "widget"}
        }),
    )
    .await
    .unwrap();
    assert_eq!(result["status"], 201);
    assert_eq!(
        result["body"],
        json!({"method": "POST", "body": {"name": "widget"}})
    );
    assert_eq!(result["headers"]["content-type"], "application/json");
    assert_eq!(result["headers"]["etag"], "\"v1\"");
    assert!(result["headers"].get("x-internal").is_none());
    let seen = &server.requests()[0];
    assert_eq!(seen.path, "/items");
    assert_eq!(seen.header("x-trace"), Some("t1"));
    assert_eq!(seen.header("content-type"), Some("application/json"));

    // `localhost` as a name; a text answer comes back as text, and a 404 is
    // a result (the request happened), not a tool error.
    let text =
        TestServer::start(|_, _| (StatusCode::NOT_FOUND, "no such page").into_response()).await;
    let result = run(
        &http_request(&["localhost"]),
        ctx("c", &["http_request"], 1),
        json!({"method": "GET", "url": format!("http://localhost:{}/x", text.port())}),
    )
    .await
    .unwrap();
    assert_eq!(result["status"], 404);
    assert_eq!(result["body"], "no such page");
    assert_eq!(text.requests().len(), 1);
}

#[tokio::test]
async fn http_request_refuses_a_host_outside_the_list_before_connecting() {
    let server = TestServer::start(|_, _| StatusCode::OK.into_response()).await;
    let tool = http_request(&["localhost", "example.com"]);
    let err = run(
        &tool,
        ctx("c", &["http_request"], 1),
        json!({"method": "GET", "url": server.url("/")}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        error_text(&err),
        "http_request: host '127.0.0.1' is not in the allow-list (allowed: localhost, example.com)"
    );
    assert_eq!(err["host"], "127.0.0.1");
    assert_eq!(err["allow_hosts"], json!(["localhost", "example.com"]));

    // Not http(s), or a look-alike name: refused too.
    for url in [
        "file:///etc/passwd".to_owned(),
        format!("http://badexample.com:{}/", server.port()),
        format!("http://example.com.127.0.0.1.nip.io:{}/", server.port()),
    ] {
        let err = run(
            &tool,
            ctx("c", &["http_request"], 1),
            json!({"method": "GET", "url": url}),
        )
        .await
        .unwrap_err();
        assert!(error_text(&err).starts_with("http_request: "), "{err}");
    }
    assert_eq!(server.requests().len(), 0, "nothing reached the server");
}

#[tokio::test]
async fn http_request_refuses_a_redirect_off_the_list() {
    let b = TestServer::start(|_, _| (StatusCode::OK, "secret").into_response()).await;
    let target = format!("http://localhost:{}/internal", b.port());
    let a = TestServer::start(move |_, _| {
        Response::builder()
            .status(StatusCode::FOUND)
            .header("location", target.clone())
            .body(Body::empty())
            .unwrap()
    })
    .await;
    let err = run(
        &http_request(&["127.0.0.1"]),
        ctx("c", &["http_request"], 1),
        json!({"method": "GET", "url": a.url("/start")}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        error_text(&err),
        "http_request: redirect refused: host 'localhost' is not in the allow-list (allowed: 127.0.0.1)"
    );
    assert_eq!(err["status"], 302);
    assert_eq!(
        err["location"],
        format!("http://localhost:{}/internal", b.port())
    );
    assert_eq!(a.requests().len(), 1);
    assert_eq!(b.requests().len(), 0, "the redirect was not followed");
}

#[tokio::test]
async fn http_request_follows_a_redirect_within_the_list() {
    let server = TestServer::start(|_, seen| {
        if seen.path == "/old" {
            Response::builder()
                .status(StatusCode::SEE_OTHER)
                .header("location", "/new")
                .body(Body::empty())
                .unwrap()
        } else {
            json_reply(
                StatusCode::OK,
                json!({"at": seen.path, "method": seen.method}),
            )
        }
    })
    .await;
    let result = run(
        &http_request(&["127.0.0.1"]),
        ctx("c", &["http_request"], 1),
        json!({"method": "POST", "url": server.url("/old"), "body": "form"}),
    )
    .await
    .unwrap();
    // A 303 continues as a GET.
    assert_eq!(result["body"], json!({"at": "/new", "method": "GET"}));
    assert_eq!(result["url"], server.url("/new"));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn http_request_caps_the_response_size() {
    let server =
        TestServer::start(|_, _| (StatusCode::OK, "z".repeat(100_000)).into_response()).await;
    let tool = HttpRequestTool::new(HttpRequestConfig {
        allow_hosts: vec!["127.0.0.1".into()],
        max_response_bytes: 1000,
        timeout_secs: 10,
        ..HttpRequestConfig::default()
    })
    .unwrap();
    let err = run(
        &tool,
        ctx("c", &["http_request"], 1),
        json!({"method": "GET", "url": server.url("/")}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        error_text(&err),
        "http_request: answer exceeded the maximum size of 1000 bytes"
    );
}

// ---- a full agent turn --------------------------------------------------------

#[tokio::test]
async fn an_agent_calls_an_http_tool_after_approval_and_answers_with_its_json() {
    let server = TestServer::start(|_, seen| {
        let title = seen.json()["arguments"]["title"].clone();
        json_reply(StatusCode::OK, json!({"ticket": "T-77", "title": title}))
    })
    .await;
    let tool = http_tool(cfg("create_ticket", server.url("/tickets")));
    let registry = ToolRegistry::new(vec![Arc::new(tool)]).unwrap();
    let scenario = Scenario::from_json(
        &json!({"agents": {"ops": [
            {"text": "Filing it.", "tool_calls": [{"name": "create_ticket", "arguments": {"title": "disk full"}}]},
            {"text": "Filed: {{tool_result}}"}
        ]}})
        .to_string(),
    )
    .unwrap();
    let ov = Overseer::start(
        vec![AgentConfig::new("ops", &["create_ticket"])],
        Arc::new(MemStore::new()),
        Arc::new(ScriptedProvider::new(scenario)),
        registry,
        RuntimeConfig::default(),
    )
    .await
    .unwrap();
    let id = SessionId::generate();
    let mut rx = ov.subscribe(id);
    ov.create_session(CreateSession {
        agent: "ops".into(),
        tenant: "acme".into(),
        created_by: Some("bob".into()),
        prompt: Some("the disk is full".into()),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();

    let wait = async {
        // requires_approval defaults to true for a declared tool.
        loop {
            let e = match rx.recv().await {
                Ok(Notification::Event(e)) => e,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(e) => panic!("event stream ended: {e}"),
            };
            {
                if matches!(
                    e.kind,
                    EventKind::StatusChanged {
                        status: SessionStatus::AwaitingApproval
                    }
                ) {
                    break;
                }
            }
        }
        assert_eq!(
            server.requests().len(),
            0,
            "nothing is sent before approval"
        );
        let state = ov.state(id).await.unwrap();
        let call = state
            .header
            .open_calls
            .iter()
            .find(|c| c.state == CallState::AwaitingApproval)
            .unwrap()
            .id
            .clone();
        ov.submit(id, Submission::one(call.clone(), Decision::approve()))
            .await
            .unwrap();
        loop {
            let e = match rx.recv().await {
                Ok(Notification::Event(e)) => e,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(e) => panic!("event stream ended: {e}"),
            };
            {
                if let EventKind::TurnEnded { stop_reason, .. } = e.kind {
                    assert_eq!(stop_reason, StopReason::EndTurn);
                    break call;
                }
            }
        }
    };
    let call = tokio::time::timeout(PATIENCE, wait).await.unwrap();

    let state = ov.state(id).await.unwrap();
    let text = state
        .transcript
        .iter()
        .rev()
        .find_map(|e| match e.as_ref() {
            TranscriptEntry::Assistant { text, .. } => Some(text.clone()),
            _ => None,
        })
        .unwrap();
    assert!(text.starts_with("Filed: "), "{text}");
    let answer: Value = serde_json::from_str(text.trim_start_matches("Filed: ")).unwrap();
    assert_eq!(answer, json!({"ticket": "T-77", "title": "disk full"}));

    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("idempotency-key"), Some(call.as_str()));
    let token = seen[0]
        .header("authorization")
        .unwrap()
        .trim_start_matches("Bearer ");
    let claims = tokens().authorize(token, "create_ticket").unwrap();
    assert_eq!(claims.session_id, id);
    assert_eq!(claims.sub, "bob");
    assert_eq!(claims.jti, format!("{}:1", call.as_str()));
    assert_eq!(
        seen[0].json(),
        json!({
            "tool": "create_ticket",
            "call_id": call.as_str(),
            "session_id": id,
            "arguments": {"title": "disk full"},
        })
    );
}
