//! Shared helpers of the black-box HTTP tests: a whole service (sled store in
//! a temp dir, scripted provider, a tool that needs approval) on a real
//! loopback socket, tokens, an event-stream reader (`eventsource-stream`
//! underneath), hang guards, and `overseer serve` as a process ([`served`]).
//!
//! It deliberately reaches into nothing private: everything goes through the
//! public API of `overseer` and `overseer-actors`, as a user's program would.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod chromium;
pub mod cluster;
pub mod contract;
pub mod npm;
pub mod pg;
pub mod served;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use overseer::auth::{self, AuthConfig};
use overseer::http::{self, HttpOptions};
use overseer::store::{Durability, SledStore};
use overseer_actors::model::AgentConfig;
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::store::CheckpointStore;
use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};
use overseer_actors::{Overseer, RuntimeConfig};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// HS256 secret of the test servers.
pub const SECRET: &str = "test-secret-0123456789-abcdefghijklmnopqrstuvwxyz";

/// The longest any single wait in a test may take before it fails. It only
/// turns a hang into a failure; nothing is timed against it.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Every scope.
pub const ALL: &[&str] = &["sessions:read", "sessions:write", "approvals:write"];

/// A tool with side effects: it needs approval, and its argument schema is
/// strict so that an override can fail it.
struct WriteRecord {
    spec: ToolSpec,
}

impl WriteRecord {
    fn new() -> Self {
        Self {
            spec: ToolSpec::new(
                "write_record",
                "Writes a record.",
                json!({
                    "type": "object",
                    "properties": {"key": {"type": "integer"}},
                    "required": ["key"],
                    "additionalProperties": false
                }),
            )
            .with_approval(true),
        }
    }
}

#[async_trait::async_trait]
impl Tool for WriteRecord {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        Ok(json!({ "written": arguments.get("key").cloned().unwrap_or(Value::Null) }))
    }
}

/// Words of the `chatty` agent's reply, and the size of each: together far
/// more than socket buffers and the live event buffer hold, so a client that
/// does not read falls behind.
pub const CHATTY_WORDS: usize = 6_000;
pub const CHATTY_WORD_BYTES: usize = 2_000;

/// Tokens (input, output) the `ops` agent's first two steps report.
pub const OPS_USAGE: [(u64, u64); 2] = [(120, 17), (160, 9)];

fn scenario() -> Scenario {
    let word = "x".repeat(CHATTY_WORD_BYTES - 1);
    let chatty = vec![format!("{word} "); CHATTY_WORDS].concat();
    let doc = json!({
        "name": "http-tests",
        "agents": {
            "ops": [
                {"text": "I will write record {{user_number}}.",
                 "tool_calls": [{"name": "write_record", "arguments": {"key": "{{user_number}}"}}],
                 "usage": {"input_tokens": OPS_USAGE[0].0, "output_tokens": OPS_USAGE[0].1}},
                {"text": "Wrote it: {{tool_result}}",
                 "usage": {"input_tokens": OPS_USAGE[1].0, "output_tokens": OPS_USAGE[1].1}},
                {"text": "Anything else?"}
            ],
            "chat": [
                {"text": "hello there"},
                {"text": "hello again"},
                {"text": "third time"}
            ],
            "chatty": [
                {"text": chatty}
            ],
            "lead": [
                {"tool_calls": [{"name": "delegate_task", "arguments": {"agent": "ops", "goal": "write record 5"}}]},
                {"text": "lead: {{tool_result}}"}
            ]
        }
    });
    Scenario::from_json(&doc.to_string()).expect("scenario")
}

fn agents() -> Vec<AgentConfig> {
    // `lead` delegates to `ops`; the child's approvals propagate to the root.
    let mut lead = AgentConfig::new("lead", &["write_record"]);
    lead.subagents = vec!["ops".into()];
    vec![
        AgentConfig::new("ops", &["write_record"]),
        AgentConfig::new("chat", &[]),
        AgentConfig::new("chatty", &[]),
        lead,
    ]
}

/// The HS256 auth of the test servers.
pub fn hs256() -> AuthConfig {
    AuthConfig::hs256(SECRET.as_bytes()).expect("auth")
}

/// A token of `tenant`/`sub` with `scopes`, valid for an hour.
pub fn token(tenant: &str, sub: &str, scopes: &[&str]) -> String {
    let scopes: Vec<String> = scopes.iter().map(|s| (*s).to_owned()).collect();
    auth::mint(
        SECRET.as_bytes(),
        tenant,
        sub,
        &scopes,
        Duration::from_secs(3600),
    )
    .expect("mint")
}

/// A running service.
pub struct Server {
    pub base: String,
    pub client: reqwest::Client,
    pub overseer: Overseer,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts a service with HS256 auth.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(hs256(), HttpOptions::default()).await
    }

    /// Starts a service with the given auth and options.
    pub async fn start_with(auth: AuthConfig, options: HttpOptions) -> anyhow::Result<Self> {
        Self::start_in(tempfile::tempdir()?, auth, options).await
    }

    /// Starts a service on an existing data directory (a restart).
    pub async fn start_in(
        dir: tempfile::TempDir,
        auth: AuthConfig,
        options: HttpOptions,
    ) -> anyhow::Result<Self> {
        let store = SledStore::open(dir.path(), Durability::Os)?;
        Self::start_on_store(dir, Arc::new(store), auth, options).await
    }

    /// Starts a service on any store (e.g. one that fails on demand);
    /// `dir` is kept for the server's lifetime.
    pub async fn start_on_store(
        dir: tempfile::TempDir,
        store: Arc<dyn CheckpointStore>,
        auth: AuthConfig,
        options: HttpOptions,
    ) -> anyhow::Result<Self> {
        Self::start_configured(dir, store, auth, options, RuntimeConfig::default()).await
    }

    /// Starts a service with HS256 auth and these runtime tunables.
    pub async fn start_with_runtime(config: RuntimeConfig) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let store = SledStore::open(dir.path(), Durability::Os)?;
        Self::start_configured(
            dir,
            Arc::new(store),
            hs256(),
            HttpOptions::default(),
            config,
        )
        .await
    }

    /// The most general start: any store, auth, options and runtime tunables.
    pub async fn start_configured(
        dir: tempfile::TempDir,
        store: Arc<dyn CheckpointStore>,
        auth: AuthConfig,
        options: HttpOptions,
        config: RuntimeConfig,
    ) -> anyhow::Result<Self> {
        // reqwest is built without a default TLS provider; plain HTTP still
        // builds a TLS config, so install one (once per process).
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let tools = ToolRegistry::new(vec![Arc::new(WriteRecord::new()) as Arc<dyn Tool>])?;
        let overseer = Overseer::start(
            agents(),
            store,
            Arc::new(ScriptedProvider::new(scenario())),
            tools,
            config,
        )
        .await?;
        overseer.recover().await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(http::serve_with(
            overseer.clone(),
            listener,
            auth,
            options,
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Self {
            base,
            client: reqwest::Client::new(),
            overseer,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        })
    }

    /// A service with agents, stored tasks and skills (§17) and a provider
    /// of the caller's, on a sled store in `dir`; the tools are the test
    /// tool `write_record` plus `extra`.
    pub async fn start_library(
        dir: tempfile::TempDir,
        agents: Vec<AgentConfig>,
        library: overseer_actors::Library,
        provider: Arc<dyn overseer_actors::provider::Provider>,
        extra: Vec<Arc<dyn Tool>>,
    ) -> anyhow::Result<Self> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let store = SledStore::open(dir.path(), Durability::Os)?;
        let mut tools: Vec<Arc<dyn Tool>> = vec![Arc::new(WriteRecord::new())];
        tools.extend(extra);
        let overseer = Overseer::start_with(
            agents,
            library,
            Arc::new(store),
            provider,
            ToolRegistry::new(tools)?,
            RuntimeConfig::default(),
        )
        .await?;
        overseer.recover().await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(http::serve_with(
            overseer.clone(),
            listener,
            hs256(),
            HttpOptions::default(),
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Self {
            base,
            client: reqwest::Client::new(),
            overseer,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        })
    }

    /// The directory the store lives in.
    pub fn data_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn get(&self, path: &str, token: &str) -> reqwest::RequestBuilder {
        self.client.get(self.url(path)).bearer_auth(token)
    }

    pub fn post(&self, path: &str, token: &str, body: &Value) -> reqwest::RequestBuilder {
        self.client
            .post(self.url(path))
            .bearer_auth(token)
            .json(body)
    }

    /// Creates a session of `agent` with `prompt`; returns its id.
    pub async fn create(
        &self,
        token: &str,
        agent: &str,
        prompt: Option<&str>,
    ) -> anyhow::Result<String> {
        let mut body = json!({ "agent": agent });
        if let Some(p) = prompt {
            body["prompt"] = json!(p);
        }
        let (status, v) = send(self.post("/v1/sessions", token, &body)).await?;
        if status != 201 {
            bail!("create answered {status}: {v}");
        }
        v["id"]
            .as_str()
            .map(str::to_owned)
            .context("id in the create answer")
    }

    /// Creates an `ops` session and waits until its call awaits approval;
    /// returns (session id, call id).
    pub async fn create_pending(&self, token: &str) -> anyhow::Result<(String, String)> {
        let id = self
            .create(token, "ops", Some("please write record 42"))
            .await?;
        let mut events = Sse::open(self, token, &id, None).await?;
        let msgs = events.until_type("approval_requested").await?;
        let call = msgs
            .last()
            .and_then(|m| m.data["call_id"].as_str())
            .context("call_id")?
            .to_owned();
        Ok((id, call))
    }

    /// Stops the HTTP server gracefully, then the actor tree.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop_keep_data().await.map(drop)
    }

    /// Stops like [`Server::stop`] and hands back the data directory, so a
    /// new server can start on it.
    pub async fn stop_keep_data(mut self) -> anyhow::Result<tempfile::TempDir> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(PATIENCE, task)
                .await
                .context("graceful shutdown did not finish")???;
        }
        self.overseer.shutdown().await?;
        let Server { overseer, _dir, .. } = self;
        // The store (and its directory lock) goes with the last handle.
        drop(overseer);
        Ok(_dir)
    }
}

/// Sends a request; returns the status and the JSON body (`Null` if none).
/// The answer is held to the OpenAPI document ([`contract::check`]): an
/// undocumented status or field fails the test.
pub async fn send(req: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
    let answer = answer(req).await?;
    if !answer.is_json() && !answer.text.is_empty() {
        bail!("non-JSON body ({}): {}", answer.status, answer.text);
    }
    Ok((answer.status, answer.body))
}

/// One answer of the server, whole: what [`send`] returns plus the headers
/// (`Retry-After`, `Location`, …) and the raw text of a non-JSON body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub version: reqwest::Version,
    pub headers: reqwest::header::HeaderMap,
    /// The JSON body; `Null` when there is none or it is not JSON.
    pub body: Value,
    /// The body as received.
    pub text: String,
}

impl Answer {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `Retry-After` in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after")?.parse().ok()
    }

    /// The media type of the body, without parameters.
    pub fn media_type(&self) -> &str {
        self.header("content-type")
            .and_then(|ct| ct.split(';').next())
            .unwrap_or_default()
            .trim()
    }

    fn is_json(&self) -> bool {
        self.media_type() == "application/json"
    }
}

/// Sends a request and returns the whole [`Answer`]; it fails (`Err`) only
/// when no answer came. An answer of this server the OpenAPI document does
/// not describe ([`contract::check`]: an undocumented status, field or
/// media type) panics, so that no caller can take it for a transport error
/// and retry it away.
pub async fn answer(req: reqwest::RequestBuilder) -> anyhow::Result<Answer> {
    let (client, request) = req.build_split();
    let request = request?;
    let method = request.method().as_str().to_owned();
    let path = request.url().path().to_owned();
    let resp = client.execute(request).await?;
    read_answer(&method, &path, resp).await
}

/// The whole answer `resp` to `method` `path`, held to the document.
async fn read_answer(method: &str, path: &str, resp: reqwest::Response) -> anyhow::Result<Answer> {
    let status = resp.status().as_u16();
    let version = resp.version();
    let headers = resp.headers().clone();
    let text = resp.text().await?;
    let mut answer = Answer {
        status,
        version,
        headers,
        body: Value::Null,
        text,
    };
    if answer.is_json() && !answer.text.is_empty() {
        answer.body = serde_json::from_str(&answer.text).with_context(|| {
            format!(
                "a JSON body that does not parse ({status}): {}",
                answer.text
            )
        })?;
    }
    // Only answers of this server: a test may send through these helpers
    // to a stand-in server of its own.
    if contract::template(path).is_some() {
        let checked = if answer.text.is_empty() || answer.is_json() {
            contract::check(method, path, status, &answer.body)
        } else {
            contract::check_media(method, path, status, answer.media_type())
        };
        if let Err(e) = checked {
            panic!("contract: {e}");
        }
    }
    Ok(answer)
}

/// Asserts an error answer: status, JSON shape and code.
pub async fn expect_error(
    req: reqwest::RequestBuilder,
    status: u16,
    code: &str,
) -> anyhow::Result<Value> {
    let (got, v) = send(req).await?;
    if got != status || v["error"]["code"] != code || !v["error"]["message"].is_string() {
        bail!("expected {status} {code}, got {got}: {v}");
    }
    Ok(v)
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq)]
pub struct SseMsg {
    /// The id of a stored event of a session stream; `None` for a live
    /// `text_delta`, which carries none, and for the tenant stream's ids.
    pub id: Option<u64>,
    /// The event's own id as sent (`<stream>-<seq>` on the tenant stream).
    pub last_id: Option<String>,
    pub event: String,
    pub data: Value,
}

type Events = Pin<
    Box<
        dyn Stream<
                Item = Result<
                    eventsource_stream::Event,
                    eventsource_stream::EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

/// An event-stream reader over a reqwest response. `eventsource-stream`
/// parses the stream (a character split across chunks included); this turns
/// each event's data into JSON and tells an event's own id from the one the
/// format carries over from the event before (a session stream's live
/// `text_delta` has none of its own, every other event must).
pub struct Sse {
    events: Events,
    last_id: String,
}

impl Sse {
    /// Opens the event stream of session `id`, resuming after `last_event_id`.
    pub async fn open(
        server: &Server,
        token: &str,
        id: &str,
        last_event_id: Option<u64>,
    ) -> anyhow::Result<Self> {
        let mut req = server.get(&format!("/v1/sessions/{id}/events"), token);
        if let Some(last) = last_event_id {
            req = req.header("Last-Event-ID", last.to_string());
        }
        Self::from_request(req).await
    }

    /// Opens the tenant stream (`GET /v1/events`), resuming after `last`.
    pub async fn open_tenant(
        server: &Server,
        token: &str,
        last: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut req = server.get("/v1/events", token);
        if let Some(last) = last {
            req = req.header("Last-Event-ID", last);
        }
        Self::from_request(req).await
    }

    /// Opens a stream from an arbitrary request.
    pub async fn from_request(req: reqwest::RequestBuilder) -> anyhow::Result<Self> {
        Self::from_request_in_chunks(req, None).await
    }

    /// [`Sse::from_request`], the body handed to the parser in pieces of at
    /// most `piece` bytes (a multi-byte character then spans pieces).
    pub async fn from_request_in_chunks(
        req: reqwest::RequestBuilder,
        piece: Option<usize>,
    ) -> anyhow::Result<Self> {
        let (client, request) = req.build_split();
        let request = request?;
        let (method, path) = (
            request.method().to_string(),
            request.url().path().to_owned(),
        );
        let resp = client.execute(request).await?;
        let status = resp.status();
        if status != 200 {
            // Not a stream: the whole answer, held to the document.
            let answer = read_answer(&method, &path, resp).await?;
            bail!("event stream answered {status}: {}", answer.text);
        }
        let ct = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if !ct.starts_with("text/event-stream") {
            bail!("event stream has content-type {ct}");
        }
        if contract::template(&path).is_some() {
            if let Err(e) = contract::check_media(&method, &path, 200, "text/event-stream") {
                panic!("contract: {e}");
            }
        }
        let bytes = resp.bytes_stream();
        let events: Events = match piece {
            None => Box::pin(bytes.eventsource()),
            Some(n) => Box::pin(
                bytes
                    .flat_map(move |chunk| {
                        let pieces: Vec<reqwest::Result<axum::body::Bytes>> = match chunk {
                            Ok(b) => (0..b.len())
                                .step_by(n.max(1))
                                .map(|i| Ok(b.slice(i..(i + n.max(1)).min(b.len()))))
                                .collect(),
                            Err(e) => vec![Err(e)],
                        };
                        futures::stream::iter(pieces)
                    })
                    .eventsource(),
            ),
        };
        Ok(Self {
            events,
            last_id: String::new(),
        })
    }

    /// The next event, or `None` when the server ended the stream.
    pub async fn next(&mut self) -> anyhow::Result<Option<SseMsg>> {
        let Some(event) = tokio::time::timeout(PATIENCE, self.events.next())
            .await
            .map_err(|_| anyhow!("no event within {PATIENCE:?}"))?
        else {
            return Ok(None);
        };
        let event = event.map_err(|e| anyhow!("the event stream broke: {e}"))?;
        let own = !event.id.is_empty() && event.id != self.last_id;
        if !own && event.event != "text_delta" {
            bail!(
                "a {} event without an id of its own (the last was {:?})",
                event.event,
                self.last_id
            );
        }
        self.last_id = event.id.clone();
        let data = serde_json::from_str(&event.data)
            .with_context(|| format!("{} data that is not JSON: {}", event.event, event.data))?;
        Ok(Some(SseMsg {
            id: if own { event.id.parse().ok() } else { None },
            last_id: own.then_some(event.id),
            event: event.event,
            data,
        }))
    }

    /// The next event; an error if the stream ended.
    pub async fn next_event(&mut self) -> anyhow::Result<SseMsg> {
        self.next().await?.context("the event stream ended")
    }

    /// Events up to and including the first that satisfies `pred`.
    pub async fn until(&mut self, pred: impl Fn(&SseMsg) -> bool) -> anyhow::Result<Vec<SseMsg>> {
        let mut out = Vec::new();
        loop {
            let msg = self
                .next()
                .await?
                .context("stream ended before the awaited event")?;
            let done = pred(&msg);
            out.push(msg);
            if done {
                return Ok(out);
            }
        }
    }

    /// Events up to and including the first of type `ty`.
    pub async fn until_type(&mut self, ty: &str) -> anyhow::Result<Vec<SseMsg>> {
        self.until(|m| m.event == ty).await
    }

    /// Events up to and including the session's change to `status`.
    pub async fn until_status(&mut self, status: &str) -> anyhow::Result<Vec<SseMsg>> {
        self.until(|m| m.event == "status_changed" && m.data["status"] == status)
            .await
    }
}

/// The ids of the stored (id-carrying) events among `msgs`.
pub fn ids(msgs: &[SseMsg]) -> Vec<u64> {
    msgs.iter().filter_map(|m| m.id).collect()
}

/// Unpadded base64url, for hand-made tokens.
pub fn b64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// Follows a session's events like a well-behaved client: whenever the
/// server ends the stream (it disconnects clients that fall behind), it
/// reconnects with `Last-Event-ID`. Returns every event up to and including
/// the first that satisfies `pred`, plus how many connections it took.
pub async fn follow(
    server: &Server,
    token: &str,
    id: &str,
    pred: impl Fn(&SseMsg) -> bool,
) -> anyhow::Result<(Vec<SseMsg>, usize)> {
    let mut last = None;
    let mut out = Vec::new();
    for connections in 1..=1_000 {
        let mut sse = Sse::open(server, token, id, last).await?;
        while let Some(m) = sse.next().await? {
            if m.id.is_some() {
                last = m.id;
            }
            let done = pred(&m);
            out.push(m);
            if done {
                return Ok((out, connections));
            }
        }
    }
    bail!("the awaited event never came")
}

/// Polls `check` every `every` until it gives a value; fails naming `what`
/// and the last thing `check` saw once [`PATIENCE`] has passed. A hang
/// guard, not a timing assertion: nothing is measured against it.
pub async fn eventually<T, F, Fut>(what: &str, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) if std::time::Instant::now() >= deadline => {
                panic!("gave up after {PATIENCE:?} waiting for {what}: {seen}")
            }
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// Waits for the next event of a live session (its broadcast channel) that
/// satisfies `pred`; returns it. Fails naming the error if the channel
/// ends, and after [`PATIENCE`] (a hang guard, nothing is timed).
pub async fn until_event(
    rx: &mut tokio::sync::broadcast::Receiver<overseer_actors::model::Notification>,
    pred: impl Fn(&overseer_actors::model::EventKind) -> bool,
) -> overseer_actors::model::EventKind {
    use overseer_actors::model::Notification;
    tokio::time::timeout(PATIENCE, async {
        loop {
            match rx.recv().await {
                Ok(Notification::Event(e)) if pred(&e.kind) => return e.kind,
                Ok(_) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the awaited event never came within {PATIENCE:?}"))
}

/// The kinds of rows of the sled one tree (`data`, layouts 4 and 5), by the
/// first byte of their keys, named after the tree each had in layout 3
/// (`records`, layout 5's one record per checkpoint, and the interned
/// configurations `configs`/`config_refs` never had one): what
/// the tests that write an older layout by hand, or count rows per kind,
/// read.
pub const SLED_KINDS: [(u8, &str); 15] = [
    (b'C', "records"),
    (b'S', "sessions"),
    (b'T', "transcript"),
    (b'E', "events"),
    (b'Q', "queue"),
    (b'M', "metadata"),
    (b'N', "tenants"),
    (b'A', "active"),
    (b'B', "blobs"),
    (b'R', "blob_refs"),
    (b'D', "decisions"),
    (b'm', "meta"),
    (b'O', "webhook_outbox"),
    (b'G', "configs"),
    (b'g', "config_refs"),
];
