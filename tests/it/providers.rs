//! The real providers against real HTTP servers on loopback (§11).
//!
//! Each test starts an axum server that speaks the provider's wire format as
//! its public API reference documents it, byte for byte in the SSE framing
//! (`data: {...}\n\n` for OpenAI chat completions, `event: ...\ndata: ...\n\n`
//! for Anthropic Messages), records every request it receives, and answers
//! from a per-test script. The tests assert on the events the provider
//! yields and on the request bodies the server received. Connections that
//! break mid-stream come from a hand-written HTTP/1.1 server that closes the
//! socket after writing every part, so no byte is lost to buffering; those
//! tests run whole turns through `Overseer` with the real provider.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::until_event as until;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use futures::StreamExt;
use overseer::provider::{
    build_provider, AnthropicProvider, Endpoint, KeySource, OpenAiProvider, ProviderKind,
    RetryPolicy, RetryingProvider, RouteConfig,
};
use overseer_actors::model::{
    AgentConfig, CallState, Decision, EventKind, Notification, ProposedCall, SessionId, StopReason,
    Submission, ToolCallId, ToolCallRecord, TranscriptEntry, Usage,
};
use overseer_actors::provider::{
    FinishReason, Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream,
    ToolDefinition,
};
use overseer_actors::store::MemStore;
use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};
use overseer_actors::{CreateSession, Overseer, RuntimeConfig};
use serde_json::{json, Value};
use tokio::sync::Notify;

#[path = "providers/failures.rs"]
mod failures;
#[path = "providers/resume.rs"]
mod resume;

// ---- the test server ----------------------------------------------------------

/// One piece of a streamed response.
enum Part {
    /// Bytes sent as they are.
    Bytes(String),
    /// Waits until the test says go (to prove earlier parts arrived alone).
    Wait(Arc<Notify>),
}

/// How a streamed response ends after its parts.
enum End {
    /// The body completes normally.
    Close,
    /// The connection is dropped mid-body.
    Abort,
    /// Nothing more is ever sent.
    Stall,
}

/// The server's answer to one request.
enum Reply {
    Sse(Vec<Part>, End),
    Status(u16, Vec<(&'static str, &'static str)>, String),
}

fn sse(parts: Vec<String>) -> Reply {
    Reply::Sse(parts.into_iter().map(Part::Bytes).collect(), End::Close)
}

/// What the server received.
#[derive(Clone)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Value,
    /// When it arrived.
    at: std::time::Instant,
}

type Script = Arc<dyn Fn(usize, &HeaderMap) -> Reply + Send + Sync>;

#[derive(Clone)]
struct ServerState {
    script: Script,
    received: Arc<Mutex<Vec<Received>>>,
}

struct TestServer {
    base: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl TestServer {
    /// Starts a server answering request `n` (from 0) with `script(n, headers)`.
    async fn start(script: impl Fn(usize, &HeaderMap) -> Reply + Send + Sync + 'static) -> Self {
        let received = Arc::new(Mutex::new(Vec::new()));
        let state = ServerState {
            script: Arc::new(script),
            received: received.clone(),
        };
        let app = Router::new().fallback(handle).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base: format!("http://{addr}"),
            received,
        }
    }

    fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    fn request(&self, n: usize) -> Received {
        self.received.lock().unwrap()[n].clone()
    }
}

async fn handle(
    State(state): State<ServerState>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = {
        let mut received = state.received.lock().unwrap();
        received.push(Received {
            path: uri.path().to_owned(),
            headers: headers.clone(),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            at: std::time::Instant::now(),
        });
        received.len() - 1
    };
    match (state.script)(n, &headers) {
        Reply::Status(status, extra, body) => {
            let mut response = Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json");
            for (name, value) in extra {
                response = response.header(name, value);
            }
            response.body(Body::from(body)).unwrap()
        }
        Reply::Sse(parts, end) => {
            let stream = async_stream::stream! {
                for part in parts {
                    match part {
                        Part::Bytes(text) => yield Ok::<_, std::io::Error>(Bytes::from(text)),
                        Part::Wait(go) => go.notified().await,
                    }
                }
                match end {
                    End::Close => {}
                    End::Abort => yield Err(std::io::Error::other("test server drops the connection")),
                    End::Stall => futures::future::pending::<()>().await,
                }
            };
            Response::builder()
                .status(200)
                .header("content-type", "text/event-stream; charset=utf-8")
                .header("cache-control", "no-cache")
                .body(Body::from_stream(stream))
                .unwrap()
        }
    }
}

// ---- a server whose connections break -----------------------------------------

/// A hand-written HTTP/1.1 server for broken connections: it writes each
/// response as a chunked event stream, part by part, and then either ends
/// the body or, to break the connection, closes it without the final chunk
/// once every part has been written (axum would discard bytes still
/// buffered when a body fails). One request per connection.
struct BreakingServer {
    base: String,
    count: Arc<Mutex<usize>>,
    /// The request bodies, in order of arrival.
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl BreakingServer {
    /// Answers request `n` (from 0) with `script(n)`: the parts, and whether
    /// the connection then breaks.
    async fn start(script: impl Fn(usize) -> (Vec<String>, bool) + Send + Sync + 'static) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(Mutex::new(0));
        let counter = count.clone();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let recorded = bodies.clone();
        let script = Arc::new(script);
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let n = {
                    let mut c = counter.lock().unwrap();
                    *c += 1;
                    *c - 1
                };
                let (parts, breaks) = script(n);
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let mut socket = BufReader::new(socket);
                    // Read the whole request, so closing sends a FIN and
                    // not a reset that would discard what was written.
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        socket.read_line(&mut line).await.unwrap();
                        let line = line.trim_end().to_ascii_lowercase();
                        if line.is_empty() {
                            break;
                        }
                        if let Some(v) = line.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0u8; length];
                    socket.read_exact(&mut body).await.unwrap();
                    recorded
                        .lock()
                        .unwrap()
                        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                    let mut out = String::from(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                         transfer-encoding: chunked\r\nconnection: close\r\n\r\n",
                    );
                    for part in parts {
                        out.push_str(&format!("{:x}\r\n{part}\r\n", part.len()));
                    }
                    if !breaks {
                        out.push_str("0\r\n\r\n");
                    }
                    let socket = socket.get_mut();
                    socket.write_all(out.as_bytes()).await.unwrap();
                    socket.flush().await.unwrap();
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self {
            base,
            count,
            bodies,
        }
    }

    fn count(&self) -> usize {
        *self.count.lock().unwrap()
    }

    fn route(&self, kind: ProviderKind) -> RouteConfig {
        let mut route = RouteConfig::new(kind, "test-model");
        route.base_url = Some(match kind {
            ProviderKind::Openai => format!("{}/v1", self.base),
            _ => self.base.clone(),
        });
        route
    }
}

// ---- wire builders --------------------------------------------------------------

/// One `chat.completion.chunk` event, as OpenAI frames it.
fn oa_chunk(delta: Value, finish: Option<&str>) -> String {
    let chunk = json!({
        "id": "chatcmpl-7QyqpwdfhqwajicIEznoc6Q47XAyW",
        "object": "chat.completion.chunk",
        "created": 1_694_268_190,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        "usage": null
    });
    format!("data: {chunk}\n\n")
}

fn oa_text(text: &str) -> String {
    oa_chunk(json!({"content": text}), None)
}

fn oa_role() -> String {
    oa_chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        None,
    )
}

fn oa_finish(reason: &str) -> String {
    oa_chunk(json!({}), Some(reason))
}

/// The trailing usage chunk of `stream_options.include_usage`: no choices.
fn oa_usage(prompt: u64, completion: u64) -> String {
    let chunk = json!({
        "id": "chatcmpl-7QyqpwdfhqwajicIEznoc6Q47XAyW",
        "object": "chat.completion.chunk",
        "created": 1_694_268_190,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0}
        }
    });
    format!("data: {chunk}\n\n")
}

const OA_DONE: &str = "data: [DONE]\n\n";

/// The first fragment of a streamed tool call: index, id, name, no arguments.
fn oa_call_start(index: u32, id: &str, name: &str) -> String {
    oa_chunk(
        json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
        None,
    )
}

fn oa_call_args(index: u32, fragment: &str) -> String {
    oa_chunk(
        json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}),
        None,
    )
}

fn oa_text_reply(parts: &[&str]) -> Reply {
    let mut events = vec![oa_role()];
    events.extend(parts.iter().map(|p| oa_text(p)));
    events.extend([oa_finish("stop"), oa_usage(9, 4), OA_DONE.to_owned()]);
    sse(events)
}

/// One Anthropic event: `event: NAME\ndata: JSON\n\n`.
fn an(event: &str, data: Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn an_start(input_tokens: u64) -> String {
    an(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_014p7gG3wDgGV9EUtLvnow3U", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
            "content": [], "stop_reason": null
        }}),
    )
}

fn an_text_start(index: u32) -> String {
    an(
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
    )
}

fn an_text(index: u32, text: &str) -> String {
    an(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
    )
}

fn an_tool_start(index: u32, id: &str, name: &str) -> String {
    an(
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
    )
}

fn an_json(index: u32, partial: &str) -> String {
    an(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": partial}}),
    )
}

fn an_stop(index: u32) -> String {
    an(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    )
}

fn an_ping() -> String {
    an("ping", json!({"type": "ping"}))
}

fn an_delta(stop_reason: &str, output_tokens: u64) -> String {
    an(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output_tokens}}),
    )
}

fn an_message_stop() -> String {
    an("message_stop", json!({"type": "message_stop"}))
}

fn an_text_reply(parts: &[&str]) -> Reply {
    let mut events = vec![an_start(9), an_text_start(0), an_ping()];
    events.extend(parts.iter().map(|p| an_text(0, p)));
    events.extend([an_stop(0), an_delta("end_turn", 4), an_message_stop()]);
    sse(events)
}

// ---- helpers ---------------------------------------------------------------------

fn crypto() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn route(kind: ProviderKind, server: &TestServer) -> RouteConfig {
    let mut route = RouteConfig::new(kind, "test-model");
    route.base_url = Some(match kind {
        ProviderKind::Openai => format!("{}/v1", server.base),
        _ => server.base.clone(),
    });
    route
}

/// The provider of `route` as the service builds it (default §11 policy).
fn built(route: &RouteConfig) -> Arc<dyn Provider> {
    crypto();
    build_provider(route).unwrap()
}

/// Variables for key lookups, kept out of the process environment (tests
/// run in parallel and must not change it).
#[derive(Clone, Default)]
struct FakeEnv(Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>);

impl FakeEnv {
    fn set(&self, var: &str, value: &str) {
        self.0.lock().unwrap().insert(var.into(), value.into());
    }

    fn env(&self) -> overseer::provider::Env {
        let vars = self.0.clone();
        Arc::new(move |var: &str| vars.lock().unwrap().get(var).cloned())
    }
}

/// [`built`], with key variables read from `env`.
fn built_with(route: &RouteConfig, env: &FakeEnv) -> Arc<dyn Provider> {
    crypto();
    overseer::provider::build_provider_with_env(route, env.env()).unwrap()
}

fn endpoint(kind: ProviderKind, server: &TestServer) -> Endpoint {
    endpoint_at(kind, &server.base)
}

/// The endpoint of a server at `base` (OpenAI's lives under `/v1`).
fn endpoint_at(kind: ProviderKind, base: &str) -> Endpoint {
    crypto();
    let base = match kind {
        ProviderKind::Openai => format!("{base}/v1"),
        _ => base.to_owned(),
    };
    Endpoint::new(base, "test-model")
}

fn raw(kind: ProviderKind, endpoint: Endpoint) -> Arc<dyn Provider> {
    match kind {
        ProviderKind::Openai => Arc::new(OpenAiProvider::new(endpoint).unwrap()),
        _ => Arc::new(AnthropicProvider::new(endpoint).unwrap()),
    }
}

/// The §11 policy with millisecond waits, for tests that must not sleep
/// whole seconds on a real clock.
fn fast_policy() -> RetryPolicy {
    RetryPolicy {
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        ..RetryPolicy::default()
    }
}

fn request(transcript: Vec<TranscriptEntry>, tools: Vec<ToolDefinition>) -> ProviderRequest {
    ProviderRequest {
        session_id: SessionId::generate(),
        agent: "a".into(),
        model: "route".into(),
        instructions: "You are terse.".into(),
        transcript: transcript.into_iter().map(Arc::new).collect(),
        tools: tools.into_iter().map(Arc::new).collect(),
        output_schema: None,
        purpose: Default::default(),
    }
}

fn hello() -> ProviderRequest {
    request(
        vec![TranscriptEntry::User {
            text: "Say hello".into(),
            at_ms: 0,
        }],
        vec![],
    )
}

type Item = Result<ProviderEvent, ProviderError>;

/// Every item of one request; a failure of `stream()` itself is the last item.
async fn collect(provider: &dyn Provider, request: ProviderRequest) -> Vec<Item> {
    let run = async {
        match provider.stream(request).await {
            Ok(stream) => stream.collect::<Vec<_>>().await,
            Err(e) => vec![Err(e)],
        }
    };
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the provider stream did not end")
}

fn text_of(items: &[Item]) -> String {
    items
        .iter()
        .filter_map(|i| match i {
            Ok(ProviderEvent::TextDelta(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn usage(input: u64, output: u64) -> ProviderEvent {
    ProviderEvent::Usage(Usage {
        provider_requests: 0,
        input_tokens: input,
        output_tokens: output,
        tool_calls: 0,
    })
}

/// The items with the usage events left out, and what those add up to
/// (a provider may report usage in parts: Anthropic's input side comes
/// with `message_start`, the rest at the end).
fn split_usage(items: Vec<Item>) -> (Vec<Item>, Usage) {
    let mut total = Usage::default();
    let rest = items
        .into_iter()
        .filter(|i| match i {
            Ok(ProviderEvent::Usage(u)) => {
                total.add(u);
                false
            }
            _ => true,
        })
        .collect();
    (rest, total)
}

async fn next_event(stream: &mut ProviderStream) -> ProviderEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("no event in time")
        .expect("stream ended")
        .expect("stream failed")
}

// ---- text streaming and usage -------------------------------------------------------

#[tokio::test]
async fn openai_streams_text_deltas_as_they_arrive_with_usage() {
    let go = Arc::new(Notify::new());
    let gate = go.clone();
    let server = TestServer::start(move |_, _| {
        Reply::Sse(
            vec![
                Part::Bytes(oa_role()),
                Part::Bytes(oa_text("Hel")),
                // The rest is held back until the test has seen "Hel": the
                // delta must reach the caller before the response completes.
                Part::Wait(gate.clone()),
                Part::Bytes(oa_text("lo")),
                Part::Bytes(oa_text(" world")),
                Part::Bytes(oa_finish("stop")),
                Part::Bytes(oa_usage(12, 5)),
                Part::Bytes(OA_DONE.to_owned()),
            ],
            End::Close,
        )
    })
    .await;
    let provider = built(&route(ProviderKind::Openai, &server));
    let mut stream = provider.stream(hello()).await.unwrap();
    assert_eq!(
        next_event(&mut stream).await,
        ProviderEvent::TextDelta("Hel".into())
    );
    go.notify_one();
    let rest: Vec<_> = stream.collect().await;
    assert_eq!(
        rest,
        vec![
            Ok(ProviderEvent::TextDelta("lo".into())),
            Ok(ProviderEvent::TextDelta(" world".into())),
            Ok(usage(12, 5)),
            Ok(ProviderEvent::Done(FinishReason::Stop)),
        ]
    );

    let got = server.request(0);
    assert_eq!(got.path, "/v1/chat/completions");
    assert_eq!(got.body["model"], "test-model");
    assert_eq!(got.body["stream"], true);
    assert_eq!(got.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(
        got.body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello"}
        ])
    );
    // No tools in scope: no `tools` key (some servers reject an empty list).
    assert!(got.body.get("tools").is_none());
    // No key variable configured: no credentials sent.
    assert!(got.headers.get("authorization").is_none());
}

#[tokio::test]
async fn anthropic_streams_text_deltas_as_they_arrive_with_usage() {
    let var = "OVERSEER_TEST_ANTHROPIC_TEXT_KEY";
    let env = FakeEnv::default();
    env.set(var, "sk-ant-text");
    let go = Arc::new(Notify::new());
    let gate = go.clone();
    let server = TestServer::start(move |_, _| {
        Reply::Sse(
            vec![
                Part::Bytes(an_start(25)),
                Part::Bytes(an_text_start(0)),
                Part::Bytes(an_ping()),
                Part::Bytes(an_text(0, "Hel")),
                Part::Wait(gate.clone()),
                Part::Bytes(an_text(0, "lo")),
                Part::Bytes(an_stop(0)),
                Part::Bytes(an_delta("end_turn", 15)),
                Part::Bytes(an_message_stop()),
            ],
            End::Close,
        )
    })
    .await;
    let mut route = route(ProviderKind::Anthropic, &server);
    route.api_key_env = Some(var.into());
    route.max_tokens = Some(1024);
    let provider = built_with(&route, &env);
    let mut stream = provider.stream(hello()).await.unwrap();
    // The prompt's tokens are handed on at once (an interrupted stream
    // still has them counted), the rest at the end.
    assert_eq!(next_event(&mut stream).await, usage(25, 0));
    assert_eq!(
        next_event(&mut stream).await,
        ProviderEvent::TextDelta("Hel".into())
    );
    go.notify_one();
    let rest: Vec<_> = stream.collect().await;
    assert_eq!(
        rest,
        vec![
            Ok(ProviderEvent::TextDelta("lo".into())),
            Ok(usage(0, 15)),
            Ok(ProviderEvent::Done(FinishReason::Stop)),
        ]
    );

    let got = server.request(0);
    assert_eq!(got.path, "/v1/messages");
    assert_eq!(got.headers["x-api-key"], "sk-ant-text");
    assert_eq!(got.headers["anthropic-version"], "2023-06-01");
    assert!(got.headers.get("authorization").is_none());
    assert_eq!(
        got.body,
        json!({
            "model": "test-model",
            "max_tokens": 1024,
            "system": "You are terse.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}],
            "stream": true
        })
    );
}

// ---- tool calls -----------------------------------------------------------------------

#[tokio::test]
async fn openai_assembles_several_tool_calls_from_fragments() {
    let server = TestServer::start(|_, _| {
        sse(vec![
            oa_role(),
            oa_text("Checking."),
            oa_call_start(0, "call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather"),
            oa_call_args(0, "{\"lo"),
            oa_call_args(0, "cation\": \"Pa"),
            oa_call_args(0, "ris\", \"unit\""),
            oa_call_start(1, "call_ABCdef", "get_time"),
            oa_call_args(0, ": \"c\"}"),
            oa_call_args(1, "{\"tz\":"),
            oa_call_args(1, "\"Europe/Paris\"}"),
            oa_finish("tool_calls"),
            oa_usage(80, 40),
            OA_DONE.to_owned(),
        ])
    })
    .await;
    let provider = built(&route(ProviderKind::Openai, &server));
    let items = collect(provider.as_ref(), hello()).await;
    assert_eq!(
        items,
        vec![
            Ok(ProviderEvent::TextDelta("Checking.".into())),
            Ok(ProviderEvent::ToolCall {
                name: "get_weather".into(),
                arguments: json!({"location": "Paris", "unit": "c"})
            }),
            Ok(ProviderEvent::ToolCall {
                name: "get_time".into(),
                arguments: json!({"tz": "Europe/Paris"})
            }),
            Ok(usage(80, 40)),
            Ok(ProviderEvent::Done(FinishReason::ToolCalls)),
        ]
    );
}

#[tokio::test]
async fn openai_assembles_one_tool_call() {
    let server = TestServer::start(|_, _| {
        sse(vec![
            oa_role(),
            oa_call_start(0, "call_1", "now"),
            oa_call_args(0, "{}"),
            oa_finish("tool_calls"),
            oa_usage(3, 2),
            OA_DONE.to_owned(),
        ])
    })
    .await;
    let provider = built(&route(ProviderKind::Openai, &server));
    let items = collect(provider.as_ref(), hello()).await;
    assert_eq!(
        items,
        vec![
            Ok(ProviderEvent::ToolCall {
                name: "now".into(),
                arguments: json!({})
            }),
            Ok(usage(3, 2)),
            Ok(ProviderEvent::Done(FinishReason::ToolCalls)),
        ]
    );
}

#[tokio::test]
async fn anthropic_assembles_tool_use_blocks_from_partial_json() {
    let server = TestServer::start(|_, _| {
        sse(vec![
            an_start(472),
            an_text_start(0),
            an_text(0, "Okay, let me check."),
            an_stop(0),
            an_tool_start(1, "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather"),
            an_json(1, ""),
            an_json(1, "{\"location\":"),
            an_json(1, " \"San Fra"),
            an_ping(),
            an_json(1, "ncisco, CA\", \"unit\": \"fahrenheit\"}"),
            an_stop(1),
            an_tool_start(2, "toolu_02", "get_time"),
            an_stop(2),
            an_delta("tool_use", 89),
            an_message_stop(),
        ])
    })
    .await;
    let provider = built(&route(ProviderKind::Anthropic, &server));
    let (items, spent) = split_usage(collect(provider.as_ref(), hello()).await);
    assert_eq!(
        spent,
        Usage {
            input_tokens: 472,
            output_tokens: 89,
            ..Usage::default()
        }
    );
    assert_eq!(
        items,
        vec![
            Ok(ProviderEvent::TextDelta("Okay, let me check.".into())),
            Ok(ProviderEvent::ToolCall {
                name: "get_weather".into(),
                arguments: json!({"location": "San Francisco, CA", "unit": "fahrenheit"})
            }),
            // A tool_use block with no input deltas has an empty input.
            Ok(ProviderEvent::ToolCall {
                name: "get_time".into(),
                arguments: json!({})
            }),
            Ok(ProviderEvent::Done(FinishReason::ToolCalls)),
        ]
    );
}

#[tokio::test]
async fn arguments_that_never_parse_are_a_bad_response_naming_the_tool() {
    let oa = TestServer::start(|_, _| {
        sse(vec![
            oa_call_start(0, "call_1", "get_weather"),
            oa_call_args(0, "{\"location\": \"Par"),
            oa_finish("tool_calls"),
            OA_DONE.to_owned(),
        ])
    })
    .await;
    let items = collect(built(&route(ProviderKind::Openai, &oa)).as_ref(), hello()).await;
    assert!(
        matches!(items.last(), Some(Err(ProviderError::BadResponse(m))) if m.contains("get_weather")),
        "{items:?}"
    );
    assert_eq!(oa.count(), 1, "a bad response is not retried");

    let an_server = TestServer::start(|_, _| {
        sse(vec![
            an_start(1),
            an_tool_start(0, "toolu_1", "get_weather"),
            an_json(0, "{\"location\": "),
            an_stop(0),
            an_delta("tool_use", 1),
            an_message_stop(),
        ])
    })
    .await;
    let items = collect(
        built(&route(ProviderKind::Anthropic, &an_server)).as_ref(),
        hello(),
    )
    .await;
    assert!(
        matches!(items.last(), Some(Err(ProviderError::BadResponse(m))) if m.contains("get_weather")),
        "{items:?}"
    );
}

// ---- request shape ------------------------------------------------------------------------

fn weather_tool() -> ToolDefinition {
    ToolDefinition::new(
        "get_weather",
        "Current weather of a city",
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    )
}

/// A transcript with a step that called two tools (one failed) and a
/// follow-up message.
fn tool_transcript() -> Vec<TranscriptEntry> {
    let weather = ToolCallId::from("call_weather");
    let time = ToolCallId::from("call_time");
    let mut ok = ToolCallRecord::proposed(
        weather.clone(),
        "get_weather".into(),
        json!({"city": "Paris"}),
        0,
    );
    ok.state = CallState::Completed;
    ok.result = Some(json!("sunny, 21 °C"));
    let mut failed = ToolCallRecord::proposed(time.clone(), "get_time".into(), json!({}), 0);
    failed.state = CallState::Failed;
    failed.result = Some(json!({"error": "tool timed out after 60 s"}));
    vec![
        TranscriptEntry::User {
            text: "Weather and time in Paris?".into(),
            at_ms: 0,
        },
        TranscriptEntry::Assistant {
            text: "Let me check.".into(),
            tool_calls: vec![
                ProposedCall {
                    id: weather,
                    name: "get_weather".into(),
                    arguments: json!({"city": "Paris"}),
                },
                ProposedCall {
                    id: time,
                    name: "get_time".into(),
                    arguments: json!({}),
                },
            ],
            at_ms: 0,
            finish_reason: None,
        },
        TranscriptEntry::ToolResult { call: ok },
        TranscriptEntry::ToolResult { call: failed },
        TranscriptEntry::User {
            text: "Thanks!".into(),
            at_ms: 0,
        },
    ]
}

#[tokio::test]
async fn openai_request_maps_tool_calls_and_results_faithfully() {
    let server = TestServer::start(|_, _| oa_text_reply(&["ok"])).await;
    let provider = built(&route(ProviderKind::Openai, &server));
    let items = collect(
        provider.as_ref(),
        request(tool_transcript(), vec![weather_tool()]),
    )
    .await;
    assert_eq!(text_of(&items), "ok");
    let body = server.request(0).body;
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "call_weather", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_time", "type": "function",
                 "function": {"name": "get_time", "arguments": "{}"}}
            ]},
            // A string result goes verbatim; anything else as compact JSON.
            {"role": "tool", "tool_call_id": "call_weather", "content": "sunny, 21 °C"},
            {"role": "tool", "tool_call_id": "call_time",
             "content": "{\"error\":\"tool timed out after 60 s\"}"},
            {"role": "user", "content": "Thanks!"}
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }}])
    );
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn anthropic_request_maps_tool_use_and_results_faithfully() {
    let server = TestServer::start(|_, _| an_text_reply(&["ok"])).await;
    let provider = built(&route(ProviderKind::Anthropic, &server));
    let items = collect(
        provider.as_ref(),
        request(tool_transcript(), vec![weather_tool()]),
    )
    .await;
    assert_eq!(text_of(&items), "ok");
    let body = server.request(0).body;
    assert_eq!(body["system"], "You are terse.");
    assert_eq!(body["max_tokens"], 4096);
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Weather and time in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "call_weather", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_time", "name": "get_time", "input": {}}
            ]},
            // The step's results share one user message; the follow-up
            // message joins it after them, keeping the roles alternating.
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_weather", "content": "sunny, 21 °C"},
                {"type": "tool_result", "tool_use_id": "call_time",
                 "content": "{\"error\":\"tool timed out after 60 s\"}", "is_error": true},
                {"type": "text", "text": "Thanks!"}
            ]}
        ])
    );
    assert_eq!(
        body["tools"],
        json!([{
            "name": "get_weather",
            "description": "Current weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }])
    );
}

// ---- retries ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_429_with_retry_after_is_retried_then_succeeds() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = TestServer::start(move |n, _| {
            if n == 0 {
                Reply::Status(
                    429,
                    vec![("retry-after", "0")],
                    json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error"}})
                        .to_string(),
                )
            } else if kind == ProviderKind::Openai {
                oa_text_reply(&["after ", "the wait"])
            } else {
                an_text_reply(&["after ", "the wait"])
            }
        })
        .await;
        let provider = built(&route(kind, &server));
        let items = collect(provider.as_ref(), hello()).await;
        assert_eq!(text_of(&items), "after the wait", "{kind}: {items:?}");
        assert!(matches!(
            items.last(),
            Some(Ok(ProviderEvent::Done(FinishReason::Stop)))
        ));
        assert_eq!(server.count(), 2, "{kind}");
    }
}

#[tokio::test]
async fn a_500_three_times_is_retried_three_times_then_fails_clearly() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = TestServer::start(|_, _| {
            Reply::Status(
                500,
                vec![],
                json!({"error": {"message": "The server had an error", "type": "server_error"}})
                    .to_string(),
            )
        })
        .await;
        let ep = endpoint(kind, &server);
        let provider = RetryingProvider::new(raw(kind, ep), None, fast_policy());
        let (items, spent) = split_usage(collect(&provider, hello()).await);
        assert_eq!(server.count(), 4, "{kind}: 1 attempt + 3 retries");
        match items.as_slice() {
            [Err(ProviderError::Server {
                status: 500,
                message,
                ..
            })] => {
                // The three failed attempts are counted as requests made.
                assert_eq!(spent.provider_requests, 3, "{kind}");
                assert!(message.contains("The server had an error"), "{message}");
                assert!(message.contains("after 4 attempts"), "{message}");
            }
            other => panic!("{kind}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn anthropic_overloaded_event_before_output_is_retried() {
    let server = TestServer::start(|n, _| {
        if n == 0 {
            sse(vec![
                an_start(5),
                an(
                    "error",
                    json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                ),
            ])
        } else {
            an_text_reply(&["fine"])
        }
    })
    .await;
    let ep = endpoint(ProviderKind::Anthropic, &server);
    let provider = RetryingProvider::new(raw(ProviderKind::Anthropic, ep), None, fast_policy());
    let items = collect(&provider, hello()).await;
    assert_eq!(text_of(&items), "fine");
    assert_eq!(server.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_default_policy_waits_one_two_four_seconds_plus_jitter() {
    // No network here: the paused clock only measures the waits.
    struct AlwaysDown(Arc<Mutex<Vec<tokio::time::Instant>>>);
    #[async_trait::async_trait]
    impl Provider for AlwaysDown {
        async fn stream(&self, _: ProviderRequest) -> Result<ProviderStream, ProviderError> {
            self.0.lock().unwrap().push(tokio::time::Instant::now());
            Err(ProviderError::Transport("connection refused".into()))
        }
    }
    let at = Arc::new(Mutex::new(Vec::new()));
    let provider = RetryingProvider::new(
        Arc::new(AlwaysDown(at.clone())),
        None,
        RetryPolicy::default(),
    );
    let (items, spent) = split_usage(collect(&provider, hello()).await);
    assert!(
        matches!(items.as_slice(), [Err(e)] if e.to_string().contains("gave up after 4 attempts")),
        "{items:?}"
    );
    assert_eq!(spent.provider_requests, 3);
    let at = at.lock().unwrap();
    let gaps: Vec<_> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps.len(), 3, "{gaps:?}");
    // Each wait doubles, plus up to as much again of jitter (so that
    // sessions failing together do not retry in lockstep).
    for (gap, base) in gaps.iter().zip([1, 2, 4]) {
        let base = Duration::from_secs(base);
        assert!(*gap >= base && *gap <= base * 2, "{gaps:?}");
    }
}

#[tokio::test]
async fn a_401_rereads_the_key_from_the_environment_once() {
    for (kind, var) in [
        (ProviderKind::Openai, "OVERSEER_TEST_OPENAI_ROTATED_KEY"),
        (
            ProviderKind::Anthropic,
            "OVERSEER_TEST_ANTHROPIC_ROTATED_KEY",
        ),
    ] {
        let env = FakeEnv::default();
        env.set(var, "old-key");
        let server = TestServer::start(move |_, headers| {
            let key = match kind {
                ProviderKind::Openai => headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned()),
                _ => headers
                    .get("x-api-key")
                    .map(|v| format!("Bearer {}", v.to_str().unwrap())),
            };
            if key.as_deref() == Some("Bearer new-key") {
                match kind {
                    ProviderKind::Openai => oa_text_reply(&["welcome back"]),
                    _ => an_text_reply(&["welcome back"]),
                }
            } else {
                Reply::Status(
                    401,
                    vec![],
                    json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}})
                        .to_string(),
                )
            }
        })
        .await;
        let mut route = route(kind, &server);
        route.api_key_env = Some(var.into());
        // The key is read at start-up...
        let provider = built_with(&route, &env);
        // ...and rotated afterwards: the first request still uses the old one.
        env.set(var, "new-key");
        let items = collect(provider.as_ref(), hello()).await;
        assert_eq!(text_of(&items), "welcome back", "{kind}: {items:?}");
        assert_eq!(server.count(), 2, "{kind}");

        // A key that stays wrong is re-read once only, then reported.
        env.set(var, "still-wrong");
        let provider = built_with(&route, &env);
        let items = collect(provider.as_ref(), hello()).await;
        assert!(
            matches!(items.as_slice(), [Ok(ProviderEvent::Usage(u)), Err(ProviderError::Auth(m))]
                if m.contains("invalid x-api-key") && u.provider_requests == 1),
            "{kind}: {items:?}"
        );
        assert_eq!(server.count(), 4, "{kind}");
    }
}

#[tokio::test]
async fn a_context_overflow_is_reported_as_such_and_not_retried() {
    let server = TestServer::start(|_, _| {
        Reply::Status(
            400,
            vec![],
            json!({"error": {
                "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"
            }})
            .to_string(),
        )
    })
    .await;
    let provider = built(&route(ProviderKind::Openai, &server));
    let items = collect(provider.as_ref(), hello()).await;
    assert!(
        matches!(items.as_slice(), [Err(ProviderError::ContextOverflow { message, tokens: Some(9000), limit: Some(8192) })] if message.contains("8192")),
        "{items:?}"
    );
    assert_eq!(server.count(), 1);
}

// ---- broken streams -------------------------------------------------------------------------

#[tokio::test]
async fn a_disconnect_after_output_is_not_retried_and_keeps_the_deltas() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let go = Arc::new(Notify::new());
        let gate = go.clone();
        let server = TestServer::start(move |_, _| {
            let parts = match kind {
                ProviderKind::Openai => vec![oa_role(), oa_text("Partial "), oa_text("answer")],
                _ => vec![
                    an_start(3),
                    an_text_start(0),
                    an_text(0, "Partial "),
                    an_text(0, "answer"),
                ],
            };
            let mut parts: Vec<Part> = parts.into_iter().map(Part::Bytes).collect();
            // The connection drops only once the deltas have been received,
            // so they are surely output that has started.
            parts.push(Part::Wait(gate.clone()));
            Reply::Sse(parts, End::Abort)
        })
        .await;
        let provider = built(&route(kind, &server));
        let mut stream = provider.stream(hello()).await.unwrap();
        let mut items = vec![Ok(next_event(&mut stream).await)];
        items.push(Ok(next_event(&mut stream).await));
        go.notify_one();
        items.extend(stream.collect::<Vec<_>>().await);
        assert_eq!(text_of(&items), "Partial answer", "{kind}: {items:?}");
        assert_eq!(split_usage(items.clone()).0.len(), 3, "{kind}: {items:?}");
        assert!(
            matches!(items.last(), Some(Err(ProviderError::Transport(m))) if m.contains("stream broke")),
            "{kind}: {items:?}"
        );
        assert_eq!(server.count(), 1, "{kind}: no retry after output");
    }
}

#[tokio::test]
async fn a_malformed_json_chunk_is_a_bad_response() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = TestServer::start(move |_, _| match kind {
            ProviderKind::Openai => sse(vec![
                oa_role(),
                oa_text("Hi"),
                "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"content\":\"x\"\n\n".into(),
                oa_finish("stop"),
                OA_DONE.into(),
            ]),
            _ => sse(vec![
                an_start(3),
                an_text_start(0),
                an_text(0, "Hi"),
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\n\n"
                    .into(),
                an_message_stop(),
            ]),
        })
        .await;
        let provider = built(&route(kind, &server));
        let items = collect(provider.as_ref(), hello()).await;
        assert_eq!(text_of(&items), "Hi", "{kind}: {items:?}");
        assert!(
            matches!(items.last(), Some(Err(ProviderError::BadResponse(m))) if m.contains("malformed")),
            "{kind}: {items:?}"
        );
        assert_eq!(
            split_usage(items.clone()).0.len(),
            2,
            "{kind}: nothing after the error: {items:?}"
        );
    }
}

#[tokio::test]
async fn a_json_answer_to_a_streaming_request_is_a_bad_response() {
    let server = TestServer::start(|_, _| {
        Reply::Status(
            200,
            vec![],
            json!({"error": {"message": "streaming is not supported"}}).to_string(),
        )
    })
    .await;
    let provider = built(&route(ProviderKind::Openai, &server));
    let items = collect(provider.as_ref(), hello()).await;
    assert!(
        matches!(items.as_slice(), [Err(ProviderError::BadResponse(m))] if m.contains("streaming is not supported")),
        "{items:?}"
    );
}

#[tokio::test]
async fn a_stream_that_ends_without_a_finish_after_output_is_a_transport_error() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = TestServer::start(move |_, _| match kind {
            ProviderKind::Openai => sse(vec![oa_role(), oa_text("Hi")]),
            _ => sse(vec![an_start(3), an_text_start(0), an_text(0, "Hi")]),
        })
        .await;
        let provider = built(&route(kind, &server));
        let (items, _) = split_usage(collect(provider.as_ref(), hello()).await);
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("Hi".into())),
                Err(ProviderError::Transport(
                    "the stream ended without a finish".into()
                )),
            ],
            "{kind}"
        );
        assert_eq!(server.count(), 1, "{kind}: no retry after output");
    }
}

#[tokio::test]
async fn a_stalled_stream_is_cut_by_the_idle_timeout() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = TestServer::start(move |_, _| {
            let parts = match kind {
                ProviderKind::Openai => vec![oa_role(), oa_text("Thinking")],
                _ => vec![an_start(3), an_text_start(0), an_text(0, "Thinking")],
            };
            Reply::Sse(parts.into_iter().map(Part::Bytes).collect(), End::Stall)
        })
        .await;
        let mut ep = endpoint(kind, &server);
        ep.idle_timeout = Duration::from_millis(300);
        let provider = RetryingProvider::new(raw(kind, ep), None, fast_policy());
        let (items, _) = split_usage(collect(&provider, hello()).await);
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("Thinking".into())),
                Err(ProviderError::Transport("stream stalled for 0.3 s".into())),
            ],
            "{kind}"
        );
        assert_eq!(server.count(), 1, "{kind}");
    }
}

#[tokio::test]
async fn a_refused_connection_is_a_transport_error() {
    // Bind and drop a listener to get a port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    crypto();
    let provider = RetryingProvider::new(
        raw(
            ProviderKind::Openai,
            Endpoint::new(format!("http://127.0.0.1:{port}/v1"), "m"),
        ),
        Some(Arc::new(KeySource::none())),
        fast_policy(),
    );
    let (items, spent) = split_usage(collect(&provider, hello()).await);
    assert!(
        matches!(items.as_slice(), [Err(ProviderError::Transport(m))]
            if m.contains("gave up after 4 attempts")),
        "{items:?}"
    );
    assert_eq!(spent.provider_requests, 3);
}

// ---- dropped streams through a session -------------------------------------------------------

/// A tool that runs without approval and says what it got.
struct Launcher(ToolSpec);

#[async_trait::async_trait]
impl Tool for Launcher {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        Ok(json!({"launched": arguments["count"]}))
    }
}

/// An overseer whose agent `a` streams from `provider` and may call
/// `launch` (no approval needed).
async fn launcher_overseer(provider: Arc<dyn Provider>) -> Overseer {
    let schema = json!({"type": "object", "properties": {"count": {"type": "integer"}}});
    let tools = ToolRegistry::new(vec![Arc::new(Launcher(ToolSpec::new(
        "launch",
        "Launches things",
        schema,
    )))])
    .unwrap();
    Overseer::start(
        vec![AgentConfig::new("a", &["launch"])],
        Arc::new(MemStore::new()),
        provider,
        tools,
        RuntimeConfig::default(),
    )
    .await
    .unwrap()
}

/// Runs the first turn of a new session of `a`; returns how it ended and
/// the transcript.
async fn first_turn(ov: &Overseer, prompt: &str) -> (StopReason, Vec<TranscriptEntry>) {
    let id = SessionId::generate();
    let mut rx = ov.subscribe(id);
    ov.create_session(CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some(prompt.into()),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    let EventKind::TurnEnded { stop_reason, .. } =
        until(&mut rx, |k| matches!(k, EventKind::TurnEnded { .. })).await
    else {
        unreachable!()
    };
    let state = ov.state(id).await.unwrap();
    let transcript = state.transcript.iter().map(|e| (**e).clone()).collect();
    (stop_reason, transcript)
}

/// A complete `launch` call with `{"count": 3}` and the finish that says
/// the model wants it run, then nothing: no usage, no `[DONE]` (OpenAI), no
/// `message_stop` (Anthropic).
fn finished_call_then_nothing(kind: ProviderKind) -> Vec<String> {
    match kind {
        ProviderKind::Openai => vec![
            oa_role(),
            oa_call_start(0, "call_1", "launch"),
            oa_call_args(0, "{\"cou"),
            oa_call_args(0, "nt\": 3}"),
            oa_finish("tool_calls"),
        ],
        _ => vec![
            an_start(7),
            an_tool_start(0, "toolu_1", "launch"),
            an_json(0, "{\"count\""),
            an_json(0, ": 3}"),
            an_stop(0),
            an_delta("tool_use", 12),
        ],
    }
}

/// The events of a complete text answer made of `texts`.
fn text_answer(kind: ProviderKind, texts: &[&str]) -> Vec<String> {
    match kind {
        ProviderKind::Openai => {
            let mut events = vec![oa_role()];
            events.extend(texts.iter().map(|t| oa_text(t)));
            events.extend([oa_finish("stop"), oa_usage(9, 4), OA_DONE.to_owned()]);
            events
        }
        _ => {
            let mut events = vec![an_start(9), an_text_start(0), an_ping()];
            events.extend(texts.iter().map(|t| an_text(0, t)));
            events.extend([an_stop(0), an_delta("end_turn", 4), an_message_stop()]);
            events
        }
    }
}

#[tokio::test]
async fn a_tool_call_that_finished_survives_a_dropped_connection() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = BreakingServer::start(move |n| match n {
            0 => (finished_call_then_nothing(kind), true),
            _ => (text_answer(kind, &["Launched ", "3."]), false),
        })
        .await;
        let ov = launcher_overseer(built(&server.route(kind))).await;
        let (stop, transcript) = first_turn(&ov, "Launch 3").await;
        assert_eq!(stop, StopReason::EndTurn, "{kind}: {transcript:#?}");
        let calls: Vec<(String, Value)> = transcript
            .iter()
            .filter_map(|e| match e {
                TranscriptEntry::Assistant { tool_calls, .. } => Some(tool_calls),
                _ => None,
            })
            .flatten()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect();
        assert_eq!(
            calls,
            vec![("launch".into(), json!({"count": 3}))],
            "{kind}"
        );
        let results: Vec<(CallState, Option<Value>)> = transcript
            .iter()
            .filter_map(|e| match e {
                TranscriptEntry::ToolResult { call } => Some((call.state, call.result.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            results,
            vec![(CallState::Completed, Some(json!({"launched": 3})))],
            "{kind}"
        );
        assert!(
            matches!(transcript.last(), Some(TranscriptEntry::Assistant { text, .. }) if text == "Launched 3."),
            "{kind}: {transcript:#?}"
        );
        // The broken request was not sent again; the next step was.
        assert_eq!(server.count(), 2, "{kind}");
        ov.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_stream_cut_or_stalled_after_its_finish_is_complete() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let call = Ok(ProviderEvent::ToolCall {
            name: "launch".into(),
            arguments: json!({"count": 3}),
        });
        let done = Ok(ProviderEvent::Done(FinishReason::ToolCalls));
        let expected = vec![call, done];
        let spent = match kind {
            // The usage chunk was the part that never came.
            ProviderKind::Openai => Usage::default(),
            _ => Usage {
                input_tokens: 7,
                output_tokens: 12,
                ..Usage::default()
            },
        };

        // The connection breaks.
        let server = BreakingServer::start(move |_| (finished_call_then_nothing(kind), true)).await;
        let provider = raw(kind, endpoint_at(kind, &server.base));
        let items = collect(provider.as_ref(), hello()).await;
        assert_eq!(split_usage(items), (expected.clone(), spent), "{kind}: cut");

        // Nothing more ever comes: the idle timeout ends it, as complete.
        let server = TestServer::start(move |_, _| {
            Reply::Sse(
                finished_call_then_nothing(kind)
                    .into_iter()
                    .map(Part::Bytes)
                    .collect(),
                End::Stall,
            )
        })
        .await;
        let mut ep = endpoint(kind, &server);
        ep.idle_timeout = Duration::from_millis(300);
        let items = collect(raw(kind, ep).as_ref(), hello()).await;
        assert_eq!(
            split_usage(items),
            (expected.clone(), spent),
            "{kind}: stalled"
        );
    }
}

#[tokio::test]
async fn a_stream_that_breaks_before_visible_output_is_retried() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        // Everything a stream may send before its first text or call: a
        // role-only chunk, an empty delta, running usage (OpenAI); the
        // message start with its usage, a ping, an empty text block
        // (Anthropic).
        let before_output = match kind {
            ProviderKind::Openai => {
                let with_usage = oa_chunk(json!({}), None).replace(
                    "\"usage\":null",
                    "\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":0}",
                );
                assert!(with_usage.contains("prompt_tokens"));
                vec![oa_role(), oa_text(""), with_usage]
            }
            _ => vec![an_start(9), an_ping(), an_text_start(0)],
        };
        let server = BreakingServer::start(move |n| match n {
            0 => (before_output.clone(), true),
            _ => (text_answer(kind, &["Hello"]), false),
        })
        .await;
        let ep = endpoint_at(kind, &server.base);
        let provider = RetryingProvider::new(raw(kind, ep), None, fast_policy());
        let items = collect(&provider, hello()).await;
        assert_eq!(text_of(&items), "Hello", "{kind}: {items:?}");
        assert_eq!(
            items.last(),
            Some(&Ok(ProviderEvent::Done(FinishReason::Stop))),
            "{kind}: {items:?}"
        );
        assert_eq!(server.count(), 2, "{kind}: one retry");
    }
}

#[tokio::test]
async fn a_drop_after_visible_text_keeps_the_partial_and_ends_the_turn_in_error() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let server = BreakingServer::start(move |_| {
            let parts = match kind {
                ProviderKind::Openai => vec![oa_role(), oa_text("Partial "), oa_text("answer")],
                _ => vec![
                    an_start(3),
                    an_text_start(0),
                    an_text(0, "Partial "),
                    an_text(0, "answer"),
                ],
            };
            (parts, true)
        })
        .await;
        let ov = launcher_overseer(built(&server.route(kind))).await;
        let (stop, transcript) = first_turn(&ov, "Say something").await;
        assert_eq!(stop, StopReason::Error, "{kind}");
        // The partial text is what the assistant said; the failure is an
        // error entry beside it, not part of the text.
        let [.., TranscriptEntry::Assistant {
            text, tool_calls, ..
        }, TranscriptEntry::Error {
            message,
            kind: error_kind,
            ..
        }] = transcript.as_slice()
        else {
            panic!("{kind}: {transcript:#?}")
        };
        assert_eq!(text, "Partial answer", "{kind}");
        assert!(
            message.starts_with("provider error: transport error: the stream broke"),
            "{kind}: {message}"
        );
        assert_eq!(error_kind.as_deref(), Some("transport"));
        assert!(tool_calls.is_empty());
        assert_eq!(server.count(), 1, "{kind}: no retry after output");
        ov.shutdown().await.unwrap();
    }
}

// ---- a full turn through the actor tree ---------------------------------------------------------

/// A tool that needs a human's approval and reports what it ran with.
struct Launch(ToolSpec);

#[async_trait::async_trait]
impl Tool for Launch {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        Ok(json!({"launched": true, "count": arguments["count"]}))
    }
}

#[tokio::test]
async fn a_full_turn_with_approval_sends_the_tool_result_back_in_the_right_shape() {
    let server = TestServer::start(|n, _| {
        if n == 0 {
            sse(vec![
                oa_role(),
                oa_call_start(0, "call_provider_own_id", "launch"),
                oa_call_args(0, "{\"cou"),
                oa_call_args(0, "nt\": 3}"),
                oa_finish("tool_calls"),
                oa_usage(50, 10),
                OA_DONE.to_owned(),
            ])
        } else {
            oa_text_reply(&["Launched ", "3."])
        }
    })
    .await;
    let provider = built(&route(ProviderKind::Openai, &server));
    let schema = json!({
        "type": "object",
        "properties": {"count": {"type": "integer"}},
        "required": ["count"]
    });
    let tools = ToolRegistry::new(vec![Arc::new(Launch(
        ToolSpec::new("launch", "Launches things", schema.clone()).with_approval(true),
    ))])
    .unwrap();
    let mut agent = AgentConfig::new("a", &["launch"]);
    agent.instructions = "You launch things.".into();
    let ov = Overseer::start(
        vec![agent],
        Arc::new(MemStore::new()),
        provider,
        tools,
        RuntimeConfig::default(),
    )
    .await
    .unwrap();

    let id = SessionId::generate();
    let mut rx = ov.subscribe(id);
    ov.create_session(CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("Launch 3".into()),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    let EventKind::ApprovalRequested {
        call_id, arguments, ..
    } = until(&mut rx, |k| {
        matches!(k, EventKind::ApprovalRequested { .. })
    })
    .await
    else {
        unreachable!()
    };
    assert_eq!(arguments, json!({"count": 3}));
    assert_eq!(server.count(), 1, "nothing is sent before the approval");
    ov.submit(id, Submission::one(call_id.clone(), Decision::approve()))
        .await
        .unwrap();
    let EventKind::TurnEnded {
        stop_reason, usage, ..
    } = until(&mut rx, |k| matches!(k, EventKind::TurnEnded { .. })).await
    else {
        unreachable!()
    };
    assert_eq!(stop_reason, StopReason::EndTurn);
    assert_eq!(usage.input_tokens, 50 + 9);
    assert_eq!(usage.output_tokens, 10 + 4);
    assert_eq!(server.count(), 2);

    let mut second = server.request(1).body;
    let call_id = call_id.as_str();
    // The tool's object result travels as compact JSON text; compare it as
    // JSON so the check does not depend on key order.
    let content = second["messages"][3]["content"].take();
    let content: Value = serde_json::from_str(content.as_str().unwrap()).unwrap();
    assert_eq!(content, json!({"launched": true, "count": 3}));
    assert_eq!(
        second["messages"],
        json!([
            {"role": "system", "content": "You launch things."},
            {"role": "user", "content": "Launch 3"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "launch", "arguments": "{\"count\":3}"}}
            ]},
            {"role": "tool", "tool_call_id": call_id, "content": null}
        ])
    );
    assert_eq!(
        second["tools"],
        json!([{"type": "function", "function": {
            "name": "launch", "description": "Launches things", "parameters": schema
        }}])
    );
    let state = ov.state(id).await.unwrap();
    let last = state.transcript.last().map(|e| (**e).clone());
    assert!(
        matches!(&last, Some(TranscriptEntry::Assistant { text, .. }) if text == "Launched 3."),
        "{last:?}"
    );
    ov.shutdown().await.unwrap();
}

// ---- finish reason, structured output, context windows (issue 15) -----------------------------

/// An overseer with one agent, `agent`, served by `provider`, with the
/// `launch` tool (no approval needed).
async fn overseer_for(agent: AgentConfig, provider: Arc<dyn Provider>) -> Overseer {
    let schema = json!({"type": "object", "properties": {"count": {"type": "integer"}}});
    let tools = ToolRegistry::new(vec![Arc::new(Launcher(ToolSpec::new(
        "launch",
        "Launches things",
        schema,
    )))])
    .unwrap();
    Overseer::start(
        vec![agent],
        Arc::new(MemStore::new()),
        provider,
        tools,
        RuntimeConfig::default(),
    )
    .await
    .unwrap()
}

/// Runs a first turn of agent `a`; returns how it ended and the session.
async fn turn_of(
    ov: &Overseer,
    prompt: &str,
) -> (StopReason, overseer_actors::store::StoredSession) {
    let id = SessionId::generate();
    let mut rx = ov.subscribe(id);
    ov.create_session(CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some(prompt.into()),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    let EventKind::TurnEnded { stop_reason, .. } =
        until(&mut rx, |k| matches!(k, EventKind::TurnEnded { .. })).await
    else {
        unreachable!()
    };
    (stop_reason, ov.state(id).await.unwrap())
}

/// A text answer cut at the output limit, ending with each wire format's
/// own words for it; `cut_call` adds a tool call whose arguments were cut.
fn cut_at_the_limit(kind: ProviderKind, cut_call: bool) -> Vec<String> {
    match kind {
        ProviderKind::Openai => {
            let mut events = vec![oa_role(), oa_text("Once upon "), oa_text("a time")];
            if cut_call {
                events.extend([
                    oa_call_start(0, "call_1", "launch"),
                    oa_call_args(0, "{\"cou"),
                ]);
            }
            events.extend([oa_finish("length"), oa_usage(9, 64), OA_DONE.to_owned()]);
            events
        }
        _ => {
            let mut events = vec![
                an_start(9),
                an_text_start(0),
                an_text(0, "Once upon "),
                an_text(0, "a time"),
                an_stop(0),
            ];
            if cut_call {
                events.extend([
                    an_tool_start(1, "toolu_1", "launch"),
                    an_json(1, "{\"cou"),
                    an_stop(1),
                ]);
            }
            events.extend([an_delta("max_tokens", 64), an_message_stop()]);
            events
        }
    }
}

#[tokio::test]
async fn an_answer_cut_at_the_length_limit_ends_the_turn_with_max_tokens() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        for cut_call in [false, true] {
            let server = TestServer::start(move |_, _| sse(cut_at_the_limit(kind, cut_call))).await;
            let ov = launcher_overseer(built(&route(kind, &server))).await;
            let (stop, transcript) = first_turn(&ov, "Tell a long story").await;
            assert_eq!(
                stop,
                StopReason::MaxTokens,
                "{kind} {cut_call}: {transcript:#?}"
            );
            assert!(
                matches!(transcript.last(), Some(TranscriptEntry::Assistant {
                    text, tool_calls, finish_reason: Some(FinishReason::Length), ..
                }) if text == "Once upon a time" && tool_calls.is_empty()),
                "{kind} {cut_call}: the cut text is kept and no call is recorded: {transcript:#?}"
            );
            assert!(
                !transcript
                    .iter()
                    .any(|e| matches!(e, TranscriptEntry::ToolResult { .. })),
                "{kind}: nothing ran"
            );
            assert_eq!(server.count(), 1, "{kind}: the turn ended there");
            ov.shutdown().await.unwrap();
        }
    }
}

/// Each wire format's refusal ends the turn with `refusal`, the text kept
/// and nothing run.
#[tokio::test]
async fn a_refusal_ends_the_turn_with_refusal() {
    for kind in [ProviderKind::Openai, ProviderKind::Anthropic] {
        let events = match kind {
            ProviderKind::Openai => vec![
                oa_role(),
                oa_text("I can't help with that."),
                oa_finish("content_filter"),
                oa_usage(9, 6),
                OA_DONE.to_owned(),
            ],
            _ => vec![
                an_start(9),
                an_text_start(0),
                an_text(0, "I can't help with that."),
                an_stop(0),
                an_delta("refusal", 6),
                an_message_stop(),
            ],
        };
        let server = TestServer::start(move |_, _| sse(events.clone())).await;
        let ov = launcher_overseer(built(&route(kind, &server))).await;
        let (stop, transcript) = first_turn(&ov, "Something forbidden").await;
        assert_eq!(stop, StopReason::Refusal, "{kind}: {transcript:#?}");
        assert!(
            matches!(transcript.last(), Some(TranscriptEntry::Assistant {
                text, finish_reason: Some(FinishReason::Refusal), ..
            }) if text == "I can't help with that."),
            "{kind}: {transcript:#?}"
        );
        assert_eq!(server.count(), 1, "{kind}: the turn ended there");
        ov.shutdown().await.unwrap();
    }
}

fn city_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": false
    })
}

#[tokio::test]
async fn openai_asks_for_json_schema_output_and_the_answer_is_the_output() {
    let server = TestServer::start(|_, _| {
        oa_text_reply(&["{\"city\": \"Pa", "ris\", \"population\": ", "2102650}"])
    })
    .await;
    let mut agent = AgentConfig::new("a", &[]);
    agent.output_schema = Some(city_schema());
    let ov = overseer_for(agent, built(&route(ProviderKind::Openai, &server))).await;
    let (stop, state) = turn_of(&ov, "Largest city of France?").await;
    assert_eq!(stop, StopReason::EndTurn, "{:#?}", state.transcript);
    assert_eq!(
        state.header.output,
        Some(json!({"city": "Paris", "population": 2102650}))
    );
    let body = server.request(0).body;
    assert_eq!(
        body["response_format"],
        json!({"type": "json_schema", "json_schema": {
            "name": "answer", "schema": city_schema(), "strict": true
        }})
    );
    ov.shutdown().await.unwrap();

    // A schema strict mode would refuse (an open object) is sent non-strict;
    // a request without a schema carries no response_format.
    let provider =
        OpenAiProvider::new(endpoint_at(ProviderKind::Openai, "http://127.0.0.1:1")).unwrap();
    let mut request = hello();
    request.output_schema =
        Some(json!({"type": "object", "properties": {"x": {"type": "string"}}}));
    assert_eq!(
        provider.request_body(&request)["response_format"]["json_schema"]["strict"],
        json!(false)
    );
    request.output_schema = None;
    assert!(provider
        .request_body(&request)
        .get("response_format")
        .is_none());
}

/// The events of a forced answer-tool call with `input` streamed in `parts`.
fn an_answer(name: &str, parts: &[&str]) -> Reply {
    let mut events = vec![an_start(30), an_tool_start(0, "toolu_answer", name)];
    events.extend(parts.iter().map(|p| an_json(0, p)));
    events.extend([an_stop(0), an_delta("tool_use", 20), an_message_stop()]);
    sse(events)
}

#[tokio::test]
async fn anthropic_forces_the_answer_tool_and_its_input_is_the_output() {
    let server = TestServer::start(|_, _| {
        an_answer(
            "final_answer",
            &["{\"city\": \"Pa", "ris\", \"population\": ", "2102650}"],
        )
    })
    .await;
    let mut agent = AgentConfig::new("a", &[]);
    agent.output_schema = Some(city_schema());
    let ov = overseer_for(agent, built(&route(ProviderKind::Anthropic, &server))).await;
    let (stop, state) = turn_of(&ov, "Largest city of France?").await;
    assert_eq!(stop, StopReason::EndTurn, "{:#?}", state.transcript);
    assert_eq!(
        state.header.output,
        Some(json!({"city": "Paris", "population": 2102650}))
    );
    // The answer is the assistant's text, not a tool call.
    assert!(
        matches!(state.transcript.last().map(|e| &**e), Some(TranscriptEntry::Assistant {
            text, tool_calls, finish_reason: Some(FinishReason::Stop), ..
        }) if tool_calls.is_empty() && serde_json::from_str::<Value>(text).unwrap()["city"] == "Paris"),
        "{:#?}",
        state.transcript
    );
    assert_eq!(server.count(), 1);
    let body = server.request(0).body;
    assert_eq!(
        body["tools"],
        json!([{"name": "final_answer", "description": body["tools"][0]["description"], "input_schema": city_schema()}])
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "final_answer"})
    );
    ov.shutdown().await.unwrap();

    // With tools of its own the model must use some tool (one of its own, or
    // the answer tool), and the answer tool keeps out of their names.
    let provider =
        AnthropicProvider::new(endpoint_at(ProviderKind::Anthropic, "http://127.0.0.1:1")).unwrap();
    let mut request = request(
        vec![TranscriptEntry::User {
            text: "hi".into(),
            at_ms: 0,
        }],
        vec![ToolDefinition::new(
            "final_answer",
            "a user's tool",
            json!({"type": "object"}),
        )],
    );
    request.output_schema = Some(city_schema());
    let body = provider.request_body(&request);
    assert_eq!(body["tool_choice"], json!({"type": "any"}));
    let names: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["final_answer", "final_answer_2"]);
}

#[tokio::test]
async fn anthropic_wraps_a_schema_that_is_not_an_object() {
    let server =
        TestServer::start(|_, _| an_answer("final_answer", &["{\"value\": [1, ", "2, 3]}"])).await;
    let provider = raw(
        ProviderKind::Anthropic,
        endpoint(ProviderKind::Anthropic, &server),
    );
    let mut request = hello();
    let schema = json!({"type": "array", "items": {"type": "integer"}});
    request.output_schema = Some(schema.clone());
    let items = collect(provider.as_ref(), request).await;
    assert_eq!(text_of(&items), "[1,2,3]");
    assert!(
        !items
            .iter()
            .any(|i| matches!(i, Ok(ProviderEvent::ToolCall { .. }))),
        "{items:?}"
    );
    assert_eq!(
        items.last(),
        Some(&Ok(ProviderEvent::Done(FinishReason::Stop)))
    );
    assert_eq!(
        server.request(0).body["tools"][0]["input_schema"],
        json!({"type": "object", "properties": {"value": schema}, "required": ["value"]})
    );
}

#[tokio::test]
async fn context_overflow_errors_of_both_providers_are_recognised() {
    let bodies: Vec<(ProviderKind, Value)> = vec![
        (
            ProviderKind::Openai,
            json!({"error": {
                "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"
            }}),
        ),
        (
            ProviderKind::Anthropic,
            json!({"type": "error", "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 208327 tokens > 200000 maximum"
            }}),
        ),
        (
            ProviderKind::Anthropic,
            json!({"type": "error", "error": {
                "type": "invalid_request_error",
                "message": "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again"
            }}),
        ),
    ];
    for (kind, body) in bodies {
        let text = body.to_string();
        let server = TestServer::start(move |_, _| Reply::Status(400, vec![], text.clone())).await;
        let items = collect(built(&route(kind, &server)).as_ref(), hello()).await;
        assert!(
            matches!(
                items.as_slice(),
                [Err(ProviderError::ContextOverflow { .. })]
            ),
            "{kind} {body}: {items:?}"
        );
        assert_eq!(server.count(), 1, "{kind}: not retried");
    }
}

#[tokio::test]
async fn routes_report_their_context_window() {
    crypto();
    let config = overseer::config::Config::parse(
        r#"
        [provider]
        kind = "openai"
        base_url = "http://127.0.0.1:1/v1"
        model = "gpt-4o-mini"

        [[models]]
        name = "big"
        provider = "anthropic"
        base_url = "http://127.0.0.1:1"
        model = "claude-sonnet-4-5"

        [[models]]
        name = "local"
        provider = "openai"
        base_url = "http://127.0.0.1:1/v1"
        model = "llama3.2"
        context_window = 8192

        [[models]]
        name = "unknown"
        provider = "openai"
        base_url = "http://127.0.0.1:1/v1"
        model = "llama3.2"

        [[agents]]
        name = "a"
        "#,
        "test",
    )
    .unwrap();
    let provider = overseer::service::build_providers(&config).unwrap();
    assert_eq!(provider.context_window("big"), Some(200_000));
    assert_eq!(provider.context_window("local"), Some(8192));
    assert_eq!(provider.context_window("unknown"), None);
    // [provider] is served under its own name, and under the name the
    // agent gives it (the default `scripted`, which older sessions carry)...
    let default = "openai:gpt-4o-mini@http://127.0.0.1:1/v1";
    assert_eq!(config.default_route_name(), default);
    assert_eq!(provider.context_window(default), Some(128_000));
    assert_eq!(provider.context_window("scripted"), Some(128_000));
    assert_eq!(config.agent_configs()[0].model, default);
    // ...and a name no route has is served by nothing.
    assert_eq!(provider.context_window("nope"), None);
    assert!(!provider.serves("nope"));

    let zero = overseer::config::Config::parse(
        "[[models]]\nname = \"z\"\nprovider = \"openai\"\nmodel = \"m\"\ncontext_window = 0\n[[agents]]\nname = \"a\"\n",
        "test",
    )
    .and_then(|c| {
        c.validate(&overseer::tools::builtin_registry().unwrap(), "test")
            .map(|_| c)
    })
    .unwrap_err()
    .to_string();
    assert!(
        zero.contains("models[0]") && zero.contains("context_window"),
        "{zero}"
    );
}
