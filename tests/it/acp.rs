//! `overseer acp` as an editor sees it: a real ACP client (the
//! `agent-client-protocol` crate's client side) drives the built binary as
//! a child process over its stdin/stdout, on a fresh data directory, with a
//! scripted provider (or, to cancel mid-stream, an OpenAI-compatible
//! loopback server whose first answer never ends). The `with_server_*`
//! tests run `overseer acp --server URL` against an `overseer serve` process
//! on loopback, with a token minted by `overseer token`.
//!
//! Every line the agent writes to stdout must be a JSON-RPC 2.0 message: the
//! transport checks each one, and every test ends by asserting none failed
//! (the agent runs with `RUST_LOG=debug`, so a log line on stdout would show).
//! Every wait is bounded and fails naming what did not come; nothing sleeps
//! and nothing is timed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, FileSystemCapabilities, Implementation,
    InitializeRequest, LoadSessionRequest, McpServer, McpServerStdio, NewSessionRequest,
    PermissionOptionKind, PromptRequest, ReadTextFileRequest, ReadTextFileResponse,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionNotification, SessionUpdate, StopReason, TextContent,
    ToolCallStatus, ToolKind, Usage, WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client, Lines};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_stream::wrappers::LinesStream;

use crate::common;

use overseer::store::{Durability, SledStore};
use overseer_actors::model::{EventKind, SessionId, ToolRule, TranscriptEntry};
use overseer_actors::store::CheckpointStore;

/// Longest any one expected message may take; only turns a hang into a
/// failure.
const WAIT: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// The scripted model: each prompt's turn reads the clock (with approval:
/// the agent's policy is `always`) and then answers with the tool's result.
fn scripted_config(dir: &Path) -> PathBuf {
    let step = |text: &str| {
        serde_json::json!({"text": text, "tool_calls": [{"name": "current_time", "arguments": {}}],
            "usage": {"input_tokens": 48, "output_tokens": 12}})
    };
    let answer = |text: &str| serde_json::json!({"text": text, "usage": {"input_tokens": 96, "output_tokens": 20}});
    let scenario = dir.join("acp.json");
    std::fs::write(
        &scenario,
        serde_json::json!({"agents": {"assistant": [
            step("Let me check the clock."),
            answer("The clock says: {{tool_result}}"),
            step("Checking again."),
            answer("Second look: {{tool_result}}"),
            step("Once more."),
            answer("Third look: {{tool_result}}"),
            step("And again."),
            answer("Fourth look: {{tool_result}}"),
        ]}})
        .to_string(),
    )
    .unwrap();
    let config = dir.join("acp.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "scripted"
scenario = "{}"

[[agents]]
name = "assistant"
tools = ["current_time"]
approval = "always"
"#,
            scenario.display()
        ),
    )
    .unwrap();
    config
}

/// The agent as a child process, and the lines it wrote to stdout that were
/// not JSON-RPC 2.0 messages.
struct Spawned {
    child: Child,
    not_protocol: Arc<Mutex<Vec<String>>>,
}

type Transport = Lines<
    std::pin::Pin<Box<dyn futures::Sink<String, Error = std::io::Error> + Send>>,
    std::pin::Pin<Box<dyn futures::Stream<Item = std::io::Result<String>> + Send>>,
>;

fn spawn_agent(dir: &Path, config: &Path, env: &[(&str, &str)]) -> (Spawned, Transport) {
    spawn(dir, config, "assistant", env)
}

fn spawn_agent_as(dir: &Path, config: &Path, agent: &str) -> (Spawned, Transport) {
    spawn(dir, config, agent, &[])
}

fn spawn(dir: &Path, config: &Path, agent: &str, env: &[(&str, &str)]) -> (Spawned, Transport) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args(["acp", "--agent", agent, "--config"])
        .arg(config)
        .arg("--data")
        .arg(dir.join("data"))
        .current_dir(dir);
    attach(cmd, env)
}

/// `overseer acp --server URL` with `OVERSEER_TOKEN` set to `token`.
fn spawn_remote(dir: &Path, url: &str, token: &str) -> (Spawned, Transport) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args(["acp", "--server", url]).current_dir(dir);
    attach(cmd, &[("OVERSEER_TOKEN", token)])
}

/// Starts `cmd` (an `overseer acp`) with `env` and a transport on its stdio.
fn attach(mut cmd: Command, env: &[(&str, &str)]) -> (Spawned, Transport) {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .env("RUST_LOG", "debug")
        .kill_on_drop(true);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OVERSEER_") {
            cmd.env_remove(key);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn overseer acp");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let not_protocol = Arc::new(Mutex::new(Vec::new()));
    let seen = not_protocol.clone();
    let incoming = LinesStream::new(BufReader::new(stdout).lines()).inspect(move |line| {
        if let Ok(line) = line {
            let ok = serde_json::from_str::<serde_json::Value>(line)
                .is_ok_and(|v| v.get("jsonrpc").and_then(|j| j.as_str()) == Some("2.0"));
            if !ok {
                seen.lock().unwrap().push(line.clone());
            }
        }
    });
    let outgoing = futures::sink::unfold(stdin, |mut w, line: String| async move {
        w.write_all(format!("{line}\n").as_bytes()).await?;
        w.flush().await?;
        Ok::<_, std::io::Error>(w)
    });
    let transport = Lines::new(
        Box::pin(outgoing) as std::pin::Pin<Box<dyn futures::Sink<_, Error = _> + Send>>,
        Box::pin(incoming) as std::pin::Pin<Box<dyn futures::Stream<Item = _> + Send>>,
    );
    (
        Spawned {
            child,
            not_protocol,
        },
        transport,
    )
}

impl Spawned {
    /// Waits for the agent to exit (its stdin closed) and checks that it
    /// wrote nothing but protocol to stdout.
    async fn exits_having_spoken_only_protocol(mut self) {
        within("the agent to exit", self.child.wait())
            .await
            .unwrap();
        self.assert_only_protocol();
    }

    fn assert_only_protocol(&self) {
        let bad = self.not_protocol.lock().unwrap();
        assert!(bad.is_empty(), "non-protocol lines on stdout: {bad:?}");
    }
}

/// What the client receives from the agent outside answers.
struct Inbox {
    /// File requests the client served (it answers them itself).
    files: mpsc::UnboundedReceiver<FileRequest>,
    updates: mpsc::UnboundedReceiver<SessionNotification>,
    asks: mpsc::UnboundedReceiver<(
        RequestPermissionRequest,
        Responder<RequestPermissionResponse>,
    )>,
}

impl Inbox {
    async fn update(&mut self, what: &str) -> SessionUpdate {
        within(what, self.updates.recv())
            .await
            .unwrap_or_else(|| panic!("connection closed waiting for {what}"))
            .update
    }

    /// Updates up to and including the first that `until` accepts.
    async fn updates_until(
        &mut self,
        what: &str,
        until: impl Fn(&SessionUpdate) -> bool,
    ) -> Vec<SessionUpdate> {
        let mut got = Vec::new();
        loop {
            let u = self.update(what).await;
            let stop = until(&u);
            got.push(u);
            if stop {
                return got;
            }
        }
    }

    /// Every update already received.
    fn drain(&mut self) -> Vec<SessionUpdate> {
        std::iter::from_fn(|| self.updates.try_recv().ok().map(|n| n.update)).collect()
    }

    async fn ask(
        &mut self,
        what: &str,
    ) -> (
        RequestPermissionRequest,
        Responder<RequestPermissionResponse>,
    ) {
        within(what, self.asks.recv())
            .await
            .unwrap_or_else(|| panic!("connection closed waiting for {what}"))
    }
}

/// An `fs/*` request the client served.
#[derive(Debug)]
enum FileRequest {
    Read(ReadTextFileRequest),
    Write(WriteTextFileRequest),
}

/// Runs `body` as an ACP client connected to `transport`.
async fn client<R>(
    transport: Transport,
    body: impl AsyncFnOnce(ConnectionTo<Agent>, Inbox) -> R,
) -> R {
    connect(transport, body)
        .await
        .expect("the ACP connection failed")
}

/// [`client`], for a connection that may break (its agent is killed).
async fn connect<R>(
    transport: Transport,
    body: impl AsyncFnOnce(ConnectionTo<Agent>, Inbox) -> R,
) -> Result<R, agent_client_protocol::Error> {
    let (update_tx, updates) = mpsc::unbounded_channel();
    let (ask_tx, asks) = mpsc::unbounded_channel();
    let (file_tx, files) = mpsc::unbounded_channel();
    let write_tx = file_tx.clone();
    Client
        .v1()
        .name("acp-test")
        .on_receive_request(
            async move |req: ReadTextFileRequest, responder, _cx| {
                let content = format!("contents of {}", req.path.display());
                let _ = file_tx.send(FileRequest::Read(req));
                responder.respond(ReadTextFileResponse::new(content))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |req: WriteTextFileRequest, responder, _cx| {
                let _ = write_tx.send(FileRequest::Write(req));
                responder.respond(WriteTextFileResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                let _ = update_tx.send(n);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |req: RequestPermissionRequest, responder, _cx| {
                let _ = ask_tx.send((req, responder));
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async |cx| {
            Ok(body(
                cx,
                Inbox {
                    files,
                    updates,
                    asks,
                },
            )
            .await)
        })
        .await
}

async fn initialize(cx: &ConnectionTo<Agent>) {
    initialize_with(cx, ClientCapabilities::new()).await;
}

async fn initialize_with(cx: &ConnectionTo<Agent>, caps: ClientCapabilities) {
    let init = within(
        "initialize",
        cx.send_request(
            InitializeRequest::new(ProtocolVersion::V1)
                .client_capabilities(caps)
                .client_info(Implementation::new("acp-test", "1.0")),
        )
        .block_task(),
    )
    .await
    .expect("initialize");
    assert_eq!(init.protocol_version, ProtocolVersion::V1);
    assert!(init.agent_capabilities.load_session);
    assert_eq!(
        init.agent_info.as_ref().map(|i| i.name.as_str()),
        Some("overseer")
    );
}

async fn new_session(cx: &ConnectionTo<Agent>, cwd: &Path) -> String {
    let s = within(
        "session/new",
        cx.send_request(NewSessionRequest::new(cwd)).block_task(),
    )
    .await
    .expect("session/new");
    s.session_id.0.to_string()
}

fn prompt(session: &str, text: &str) -> PromptRequest {
    PromptRequest::new(
        session.to_owned(),
        vec![ContentBlock::Text(TextContent::new(text.to_owned()))],
    )
}

fn choose(kind: PermissionOptionKind, req: &RequestPermissionRequest) -> RequestPermissionResponse {
    let option = req
        .options
        .iter()
        .find(|o| o.kind == kind)
        .unwrap_or_else(|| panic!("no {kind:?} option in {:?}", req.options));
    RequestPermissionResponse::new(RequestPermissionOutcome::Selected(
        SelectedPermissionOutcome::new(option.option_id.clone()),
    ))
}

fn agent_text(updates: &[SessionUpdate]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            SessionUpdate::AgentMessageChunk(c) => match &c.content {
                ContentBlock::Text(t) => Some(t.text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn is_final_update(u: &SessionUpdate, id: &str, status: ToolCallStatus) -> bool {
    matches!(u, SessionUpdate::ToolCallUpdate(t)
        if t.tool_call_id.0.as_ref() == id && t.fields.status == Some(status))
}

fn store(dir: &Path) -> SledStore {
    SledStore::open(&dir.join("data"), Durability::Os).expect("open the agent's store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_streams_asks_and_follows_the_editors_choices() {
    let tmp = tempfile::tempdir().unwrap();
    let config = scripted_config(tmp.path());
    let (agent, transport) = spawn_agent(tmp.path(), &config, &[]);
    let cwd = tmp.path().to_path_buf();
    let session = client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;

        // allow-once: the call is asked, runs, and the turn ends.
        let turn = cx.send_request(prompt(&session, "what time is it?"));
        let (req, responder) = inbox.ask("the first permission request").await;
        assert_eq!(req.session_id.0.as_ref(), session);
        let kinds: Vec<_> = req.options.iter().map(|o| o.kind).collect();
        assert_eq!(
            kinds,
            [
                PermissionOptionKind::AllowOnce,
                PermissionOptionKind::AllowAlways,
                PermissionOptionKind::RejectOnce,
                PermissionOptionKind::RejectAlways
            ]
        );
        assert_eq!(req.tool_call.fields.title.as_deref(), Some("current_time"));
        let call = req.tool_call.tool_call_id.0.to_string();
        responder
            .respond(choose(PermissionOptionKind::AllowOnce, &req))
            .unwrap();
        let answer = within("the first prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        // The turn's own usage: both of its steps.
        assert_eq!(answer.usage, Some(Usage::new(176, 144, 32)));
        let updates = inbox.drain();
        assert!(
            agent_text(&updates).starts_with("Let me check the clock."),
            "{updates:?}"
        );
        assert!(
            agent_text(&updates).contains("The clock says: "),
            "{updates:?}"
        );
        assert!(
            updates
                .iter()
                .any(|u| matches!(u, SessionUpdate::ToolCall(t)
                if t.tool_call_id.0.as_ref() == call && t.status == ToolCallStatus::Pending
                    && t.title == "current_time")),
            "a tool_call for the call: {updates:?}"
        );
        let done = updates
            .iter()
            .position(|u| is_final_update(u, &call, ToolCallStatus::Completed))
            .unwrap_or_else(|| panic!("no completed update for {call}: {updates:?}"));
        match &updates[done] {
            SessionUpdate::ToolCallUpdate(t) => {
                assert!(t.fields.content.as_ref().is_some_and(|c| !c.is_empty()));
                assert!(t.fields.raw_output.is_some());
            }
            _ => unreachable!(),
        }

        // reject-once: the model is told the call was denied.
        let turn = cx.send_request(prompt(&session, "again"));
        let (req, responder) = inbox.ask("the second permission request").await;
        let call = req.tool_call.tool_call_id.0.to_string();
        responder
            .respond(choose(PermissionOptionKind::RejectOnce, &req))
            .unwrap();
        let answer = within("the second prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        let updates = inbox.drain();
        assert!(
            updates
                .iter()
                .any(|u| is_final_update(u, &call, ToolCallStatus::Failed)),
            "{updates:?}"
        );
        let text = agent_text(&updates);
        assert!(
            text.contains(
                "Second look: Tool denied by user: rejected in the editor (acp:acp-test)"
            ),
            "{text}"
        );

        // allow-always: asked once, and the next call of the tool is not.
        let turn = cx.send_request(prompt(&session, "once more"));
        let (req, responder) = inbox.ask("the third permission request").await;
        responder
            .respond(choose(PermissionOptionKind::AllowAlways, &req))
            .unwrap();
        let answer = within("the third prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        inbox.drain();
        let answer = within(
            "the fourth prompt's answer (not asked)",
            cx.send_request(prompt(&session, "and again")).block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        assert!(
            inbox.asks.try_recv().is_err(),
            "the allowed tool was asked again"
        );
        let updates = inbox.drain();
        assert!(
            agent_text(&updates).contains("Fourth look: "),
            "{updates:?}"
        );
        assert!(
            updates
                .iter()
                .any(|u| matches!(u, SessionUpdate::ToolCallUpdate(t)
                if t.fields.status == Some(ToolCallStatus::Completed))),
            "{updates:?}"
        );
        session
    })
    .await;
    let mut agent = agent;
    // Closing stdin ends the agent cleanly.
    let status = within("the agent to exit", agent.child.wait())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    agent.assert_only_protocol();

    // The store tells who decided, and keeps the rule and the cwd.
    let store = store(tmp.path());
    let id: SessionId = session.parse().unwrap();
    let stored = store
        .load(id)
        .await
        .unwrap()
        .expect("the session is stored");
    assert_eq!(
        stored.header.tool_rules.get("current_time"),
        Some(&ToolRule::Allow)
    );
    assert_eq!(
        stored.metadata["acp"]["cwd"].as_str(),
        Some(tmp.path().display().to_string().as_str())
    );
    assert!(stored.transcript.iter().any(|e| matches!(&**e,
        TranscriptEntry::ToolRuleSet { tool, rule: ToolRule::Allow, by, .. }
            if tool == "current_time" && by.as_deref() == Some("acp:acp-test"))));
    let events = store.events_after(id, 0, usize::MAX).await.unwrap();
    let deciders: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::DecisionRecorded { record, .. } => record.by.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(
        deciders,
        ["acp:acp-test", "acp:acp-test", "acp:acp-test", "rule:allow"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_lines_and_unknown_methods_get_errors_and_the_agent_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let config = scripted_config(tmp.path());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args(["acp", "--config"])
        .arg(&config)
        .arg("--data")
        .arg(tmp.path().join("data"))
        .current_dir(tmp.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .env("RUST_LOG", "debug")
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut exchange = async |line: &str| -> serde_json::Value {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
        let out = within(&format!("an answer to {line}"), lines.next_line())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("stdout closed after {line}"));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON on stdout ({e}): {out}"))
    };
    let parse = exchange("{this is not json").await;
    assert_eq!(parse["jsonrpc"], "2.0");
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    // Before initialize, methods are refused (the SDK's rule).
    let early = exchange(
        r#"{"jsonrpc":"2.0","id":5,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}"#,
    )
    .await;
    assert_eq!(early["error"]["code"], -32600, "{early}");
    let init = exchange(
        r#"{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"protocolVersion":1}}"#,
    )
    .await;
    assert_eq!(init["id"], 6);
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let unknown =
        exchange(r#"{"jsonrpc":"2.0","id":7,"method":"no/such_method","params":{}}"#).await;
    assert_eq!(unknown["id"], 7);
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    let bad = exchange(r#"{"jsonrpc":"2.0","id":8,"method":"session/prompt","params":{"sessionId":"nope","prompt":[{"type":"text","text":"hi"}]}}"#).await;
    assert_eq!(bad["id"], 8);
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert!(
        bad["error"]["data"].as_str().unwrap().contains("sessionId"),
        "{bad}"
    );
    let cwd = tmp.path().display().to_string();
    let new = exchange(
        &serde_json::json!({"jsonrpc": "2.0", "id": 9, "method": "session/new",
        "params": {"cwd": cwd, "mcpServers": []}})
        .to_string(),
    )
    .await;
    assert_eq!(new["id"], 9);
    assert!(new["result"]["sessionId"].is_string(), "{new}");
    drop(stdin);
    assert_eq!(
        within("stdout to close", lines.next_line()).await.unwrap(),
        None,
        "nothing more on stdout"
    );
    let status = within("the agent to exit", child.wait()).await.unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_killed_mid_approval_is_loaded_replayed_and_resumed() {
    let tmp = tempfile::tempdir().unwrap();
    let config = scripted_config(tmp.path());
    let cwd = tmp.path().to_path_buf();

    // The first agent is killed while the editor is being asked.
    let (mut first, transport) = spawn_agent(tmp.path(), &config, &[]);
    let mut asked = None;
    // The connection breaks with the agent (a broken pipe): that is the point.
    let _ = connect(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let turn = cx.send_request(prompt(&session, "what time is it?"));
        let (req, responder) = inbox.ask("the permission request").await;
        first.child.kill().await.unwrap();
        asked = Some((session, req.tool_call.tool_call_id.0.to_string()));
        turn.detach();
        // Never answered: the agent is gone, and a dropped responder would
        // write its error to the dead pipe.
        std::mem::forget(responder);
    })
    .await;
    let (session, call) = asked.expect("the first agent asked");
    first.assert_only_protocol();

    let (second, transport) = spawn_agent(tmp.path(), &config, &[]);
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        within(
            "session/load",
            cx.send_request(LoadSessionRequest::new(session.clone(), cwd.clone()))
                .block_task(),
        )
        .await
        .expect("session/load");
        // The history came first, before the answer.
        let replay = inbox.drain();
        assert!(
            matches!(&replay[0], SessionUpdate::UserMessageChunk(c)
                if matches!(&c.content, ContentBlock::Text(t) if t.text == "what time is it?")),
            "{replay:?}"
        );
        assert_eq!(agent_text(&replay), "Let me check the clock.");
        assert!(
            replay.iter().any(
                |u| matches!(u, SessionUpdate::ToolCall(t) if t.tool_call_id.0.as_ref() == call)
            ),
            "{replay:?}"
        );
        // The pending call is asked again; allowed, the turn goes on.
        let (req, responder) = inbox.ask("the pending call asked again").await;
        assert_eq!(req.tool_call.tool_call_id.0.as_ref(), call);
        responder
            .respond(choose(PermissionOptionKind::AllowOnce, &req))
            .unwrap();
        let rest = inbox
            .updates_until("the resumed turn's answer", |u| {
                matches!(u, SessionUpdate::AgentMessageChunk(_))
            })
            .await;
        assert!(
            rest.iter()
                .any(|u| is_final_update(u, &call, ToolCallStatus::Completed)),
            "{rest:?}"
        );
        // And the session takes the next prompt.
        let turn = cx.send_request(prompt(&session, "again"));
        let (req, responder) = inbox.ask("the next prompt's permission request").await;
        responder
            .respond(choose(PermissionOptionKind::AllowOnce, &req))
            .unwrap();
        let answer = within("the next prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        assert!(agent_text(&inbox.drain()).contains("Second look: "));
    })
    .await;
    let mut second = second;
    within("the agent to exit", second.child.wait())
        .await
        .unwrap();
    second.assert_only_protocol();
}

/// An OpenAI-compatible server: the first request streams one word and
/// then never ends; later ones answer `Again.` in full.
async fn stalling_provider() -> (String, mpsc::UnboundedReceiver<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        let mut n = 0;
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            n += 1;
            read_request(&mut conn).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
            let chunk = |content: &str, finish: Option<&str>| {
                format!(
                    "data: {}\n\n",
                    serde_json::json!({"id": "c", "object": "chat.completion.chunk", "choices": [
                        {"index": 0, "delta": {"content": content}, "finish_reason": finish}]})
                )
            };
            if n == 1 {
                let body = format!("{head}{}", chunk("Hel", None));
                conn.write_all(body.as_bytes()).await.unwrap();
                conn.flush().await.unwrap();
                held.push(conn);
                let _ = tx.send(());
            } else {
                let body = format!("{head}{}data: [DONE]\n\n", chunk("Again.", Some("stop")));
                let _ = conn.write_all(body.as_bytes()).await;
                let _ = conn.shutdown().await;
            }
        }
    });
    (url, rx)
}

async fn read_request(conn: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let n = conn.read(&mut tmp).await.unwrap();
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_a_stream_stops_the_turn_and_keeps_the_session() {
    let tmp = tempfile::tempdir().unwrap();
    let (url, mut requested) = stalling_provider().await;
    let config = tmp.path().join("openai.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "openai"
base_url = "{url}"
model = "stub"
api_key_env = "ACP_TEST_KEY"

[[agents]]
name = "assistant"
tools = []
"#
        ),
    )
    .unwrap();
    let (agent, transport) = spawn_agent(tmp.path(), &config, &[("ACP_TEST_KEY", "k")]);
    let cwd = tmp.path().to_path_buf();
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let turn = cx.send_request(prompt(&session, "talk"));
        within("the provider request", requested.recv())
            .await
            .unwrap();
        let first = inbox.update("the first streamed chunk").await;
        assert_eq!(agent_text(&[first]), "Hel");
        cx.send_notification(CancelNotification::new(session.clone()))
            .unwrap();
        let answer = within("the cancelled prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::Cancelled);

        let answer = within(
            "the next prompt's answer",
            cx.send_request(prompt(&session, "again")).block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        assert_eq!(agent_text(&inbox.drain()), "Again.");
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
}

/// A lead agent delegating to a reviewer whose call needs approval, which
/// propagates to the lead; `reviewer`: more of the reviewer's settings.
fn tree_config(dir: &Path, reviewer: &str) -> PathBuf {
    let scenario = dir.join("tree.json");
    std::fs::write(
        &scenario,
        serde_json::json!({"agents": {
            "lead": [
                {"text": "Asking the reviewer.", "tool_calls": [{"name": "delegate_task",
                    "arguments": {"agent": "reviewer", "goal": "Read the clock."}}]},
                {"text": "The reviewer said: {{tool_result}}"}
            ],
            "reviewer": [
                {"text": "Reading.", "tool_calls": [{"name": "current_time", "arguments": {}}]},
                {"text": "It is {{tool_result}}"}
            ]
        }})
        .to_string(),
    )
    .unwrap();
    let config = dir.join("tree.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "scripted"
scenario = "{}"

[[agents]]
name = "lead"
tools = ["current_time"]
approval = "per_tool"
subagents = ["reviewer"]
child_approval = "propagate"

[[agents]]
name = "reviewer"
tools = ["current_time"]
approval = "always"
{reviewer}
"#,
            scenario.display()
        ),
    )
    .unwrap();
    config
}

/// A lead agent delegating to a reviewer that needs approval: the
/// reviewer's request reaches the editor from the root, titled with the path
/// of sessions, and the editor's answer lets the tree finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagents_approval_reaches_the_editor_with_its_session_path() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tree_config(tmp.path(), "");
    let (agent, transport) = spawn_agent_as(tmp.path(), &config, "lead");
    let cwd = tmp.path().to_path_buf();
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let turn = cx.send_request(prompt(&session, "check"));
        let (req, responder) = inbox.ask("the subagent's permission request").await;
        assert_eq!(req.session_id.0.as_ref(), session, "asked at the root");
        let title = req.tool_call.fields.title.clone().unwrap_or_default();
        assert!(
            title.starts_with(&format!("current_time (subagent session {session} > ")),
            "{title}"
        );
        responder
            .respond(choose(PermissionOptionKind::AllowOnce, &req))
            .unwrap();
        let answer = within("the lead's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        let text = agent_text(&inbox.drain());
        assert!(text.contains("The reviewer said: "), "{text}");
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
}

/// A subagent's call that times out while the editor is asked: the request
/// (asked at the root) is withdrawn, and the tree finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagents_request_is_withdrawn_when_its_call_times_out() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tree_config(tmp.path(), "approval_timeout_secs = 1");
    let (agent, transport) = spawn_agent_as(tmp.path(), &config, "lead");
    let cwd = tmp.path().to_path_buf();
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let turn = cx.send_request(prompt(&session, "check"));
        let ask = inbox.ask("the subagent's permission request").await;
        withdrawn("the timed-out subagent request's withdrawal", &ask).await;
        let answer = within("the lead's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        let text = text_until(&mut inbox, "the lead's text", "The reviewer said: ").await;
        assert!(agent_text(&text).contains("The reviewer said: "));
        drop(ask);
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
}

/// An agent that reads a file and writes another through the editor.
fn editor_config(dir: &Path) -> PathBuf {
    let scenario = dir.join("editor.json");
    let notes = dir.join("notes.txt").display().to_string();
    let out = dir.join("out.txt").display().to_string();
    std::fs::write(
        &scenario,
        serde_json::json!({"agents": {"editor": [
            {"text": "Reading.", "tool_calls": [{"name": "read_text_file", "arguments": {"path": notes}}]},
            {"text": "Writing.", "tool_calls": [{"name": "write_text_file",
                "arguments": {"path": out, "content": "hello"}}]},
            {"text": "Done: {{tool_result}}"}
        ]}})
        .to_string(),
    )
    .unwrap();
    let config = dir.join("editor.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "scripted"
scenario = "{}"

[[agents]]
name = "editor"
tools = ["read_text_file", "write_text_file"]
approval = "per_tool"
"#,
            scenario.display()
        ),
    )
    .unwrap();
    config
}

/// With `fs` advertised, the file tools run in the editor: reading as is,
/// writing after the editor's permission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_editors_file_tools_run_in_the_editor_under_approval() {
    let tmp = tempfile::tempdir().unwrap();
    let config = editor_config(tmp.path());
    let (agent, transport) = spawn_agent_as(tmp.path(), &config, "editor");
    let cwd = tmp.path().to_path_buf();
    client(transport, async |cx, mut inbox| {
        let fs = FileSystemCapabilities::new()
            .read_text_file(true)
            .write_text_file(true);
        initialize_with(&cx, ClientCapabilities::new().fs(fs)).await;
        let session = new_session(&cx, &cwd).await;
        let turn = cx.send_request(prompt(&session, "edit"));
        // Reading is not asked; writing is.
        let (req, responder) = inbox.ask("the write's permission request").await;
        assert_eq!(req.tool_call.fields.kind, Some(ToolKind::Edit));
        match inbox.files.try_recv() {
            Ok(FileRequest::Read(r)) => {
                assert_eq!(r.session_id.0.as_ref(), session);
                assert_eq!(r.path, cwd.join("notes.txt"));
            }
            other => panic!("the read did not reach the editor first: {other:?}"),
        }
        assert!(
            inbox.files.try_recv().is_err(),
            "nothing written before approval"
        );
        responder
            .respond(choose(PermissionOptionKind::AllowOnce, &req))
            .unwrap();
        let answer = within("the prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        match inbox.files.try_recv() {
            Ok(FileRequest::Write(w)) => {
                assert_eq!(w.path, cwd.join("out.txt"));
                assert_eq!(w.content, "hello");
            }
            other => panic!("no write reached the editor: {other:?}"),
        }
        let updates = inbox.drain();
        let read_result = format!("contents of {}", cwd.join("notes.txt").display());
        assert!(
            updates
                .iter()
                .any(|u| matches!(u, SessionUpdate::ToolCallUpdate(t)
                if t.fields.status == Some(ToolCallStatus::Completed)
                    && t.fields.raw_output == Some(serde_json::json!({"content": read_result})))),
            "{updates:?}"
        );
        assert!(agent_text(&updates).contains("\"written\""), "{updates:?}");
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
}

/// Without `fs`, the session does not have the file tools: the model's
/// calls fail as unavailable and nothing reaches the editor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fs_capabilities_the_file_tools_are_out_of_scope() {
    let tmp = tempfile::tempdir().unwrap();
    let config = editor_config(tmp.path());
    let (agent, transport) = spawn_agent_as(tmp.path(), &config, "editor");
    let cwd = tmp.path().to_path_buf();
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let answer = within(
            "the prompt's answer",
            cx.send_request(prompt(&session, "edit")).block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        assert!(inbox.asks.try_recv().is_err(), "nothing asked");
        assert!(
            inbox.files.try_recv().is_err(),
            "nothing reached the editor"
        );
        let failed = inbox
            .drain()
            .into_iter()
            .filter(|u| {
                matches!(u, SessionUpdate::ToolCallUpdate(t)
                if t.fields.status == Some(ToolCallStatus::Failed))
            })
            .count();
        assert_eq!(failed, 2);
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
}

/// Cancelling while the editor is being asked: the editor answers the
/// request `cancelled`, the call is settled by the interrupt, the prompt
/// answers `cancelled`, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_a_permission_request_keeps_the_session() {
    let tmp = tempfile::tempdir().unwrap();
    let config = scripted_config(tmp.path());
    let (agent, transport) = spawn_agent(tmp.path(), &config, &[]);
    let cwd = tmp.path().to_path_buf();
    let session = client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let turn = cx.send_request(prompt(&session, "what time is it?"));
        let (req, responder) = inbox.ask("the permission request").await;
        let call = req.tool_call.tool_call_id.0.to_string();
        cx.send_notification(CancelNotification::new(session.clone()))
            .unwrap();
        responder
            .respond(RequestPermissionResponse::new(
                RequestPermissionOutcome::Cancelled,
            ))
            .unwrap();
        let answer = within("the cancelled prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::Cancelled);
        assert!(
            inbox
                .drain()
                .iter()
                .any(|u| is_final_update(u, &call, ToolCallStatus::Failed)),
            "the call ended"
        );
        // The script goes on with its answer, which sees the call's end.
        let answer = within(
            "the next prompt's answer",
            cx.send_request(prompt(&session, "again")).block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        assert!(agent_text(&inbox.drain()).starts_with("The clock says: "));
        session
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
    // Nothing was decided for the cancelled call: no decision on record.
    let store = store(tmp.path());
    let id: SessionId = session.parse().unwrap();
    let events = store.events_after(id, 0, usize::MAX).await.unwrap();
    let decided = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::DecisionRecorded { .. }))
        .count();
    assert_eq!(decided, 0, "a cancelled request decides nothing");
}

/// A model that refuses the first prompt (proposing a call it then
/// withdraws) and answers the second.
fn refusing_config(dir: &Path) -> PathBuf {
    let scenario = dir.join("refusing.json");
    std::fs::write(
        &scenario,
        serde_json::json!({"agents": {"assistant": [
            {"text": "I can't help with that.", "finish": "refusal",
                "tool_calls": [{"name": "current_time", "arguments": {}}]},
            {"text": "Happy to help with this one."}
        ]}})
        .to_string(),
    )
    .unwrap();
    let config = dir.join("refusing.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "scripted"
scenario = "{}"

[[agents]]
name = "assistant"
tools = ["current_time"]
approval = "always"
"#,
            scenario.display()
        ),
    )
    .unwrap();
    config
}

/// A refusal is the prompt's stop reason, nothing of it runs, and the
/// session takes the next prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_stops_the_prompt_with_refusal() {
    let tmp = tempfile::tempdir().unwrap();
    let config = refusing_config(tmp.path());
    let (agent, transport) = spawn_agent(tmp.path(), &config, &[]);
    let cwd = tmp.path().to_path_buf();
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let answer = within(
            "the refused prompt's answer",
            cx.send_request(prompt(&session, "something forbidden"))
                .block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::Refusal);
        let updates = inbox.drain();
        assert!(
            agent_text(&updates).contains("I can't help with that."),
            "{updates:?}"
        );
        assert!(
            !updates
                .iter()
                .any(|u| matches!(u, SessionUpdate::ToolCall(_))),
            "a refused answer's call was shown: {updates:?}"
        );
        assert!(inbox.asks.try_recv().is_err(), "a refused call was asked");
        let answer = within(
            "the next prompt's answer",
            cx.send_request(prompt(&session, "something fine"))
                .block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        assert!(agent_text(&inbox.drain()).contains("Happy to help"));
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
}

/// An agent whose own tools are none: it writes and reads a note with the
/// tools of the editor's filesystem server, then (after a reload) reads it
/// again.
fn mcp_config(dir: &Path, notes: &Path) -> PathBuf {
    let scenario = dir.join("mcp.json");
    let path = notes.display().to_string();
    std::fs::write(
        &scenario,
        serde_json::json!({"agents": {"assistant": [
            {"text": "Writing.", "tool_calls": [{"name": "files__write_file",
                "arguments": {"path": path, "content": "from the editor's server"}}]},
            {"text": "Reading.", "tool_calls": [{"name": "files__read_text_file",
                "arguments": {"path": path}}]},
            {"text": "It says: {{tool_result}}"},
            {"tool_calls": [{"name": "files__read_text_file", "arguments": {"path": path}}]},
            {"text": "Still: {{tool_result}}"}
        ]}})
        .to_string(),
    )
    .unwrap();
    let config = dir.join("mcp.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "scripted"
scenario = "{}"

[[agents]]
name = "assistant"
tools = []
approval = "per_tool"
"#,
            scenario.display()
        ),
    )
    .unwrap();
    config
}

/// The editor's `@modelcontextprotocol/server-filesystem`, serving `root`.
async fn filesystem_server(root: &Path) -> McpServer {
    common::npm::installed().await;
    let js = common::npm::tests_dir()
        .join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    assert!(js.is_file(), "{} is missing", js.display());
    McpServer::Stdio(
        McpServerStdio::new("files", "node")
            .args(vec![js.display().to_string(), root.display().to_string()]),
    )
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(cmdline);
            }
        }
    }
    found
}

/// The editor's MCP servers are the session's own: their tools are in its
/// scope under the usual approval rules, their results reach the model and
/// the editor follows the calls; a server that cannot start is a JSON-RPC
/// error naming it (and the agent goes on); the servers stop with the
/// connection, and a `session/load` that passes them again connects them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_editors_mcp_servers_are_the_sessions_own() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("shared");
    std::fs::create_dir(&root).unwrap();
    let notes = root.join("notes.txt");
    let config = mcp_config(tmp.path(), &notes);
    let server = filesystem_server(&root).await;
    let cwd = tmp.path().to_path_buf();

    let (agent, transport) = spawn_agent(tmp.path(), &config, &[]);
    let session = client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        // A server whose command does not exist: refused, naming it.
        let broken = McpServer::Stdio(McpServerStdio::new("broken", "/nonexistent/mcp-server"));
        let refused = within(
            "session/new with a broken server",
            cx.send_request(NewSessionRequest::new(&cwd).mcp_servers(vec![broken]))
                .block_task(),
        )
        .await
        .expect_err("a session with a server that cannot start");
        let said = format!(
            "{} {}",
            refused.message,
            refused.data.clone().unwrap_or_default()
        );
        assert!(said.contains("'broken'"), "{said}");
        assert!(said.contains("failed to start"), "{said}");

        let session = within(
            "session/new with the filesystem server",
            cx.send_request(NewSessionRequest::new(&cwd).mcp_servers(vec![server.clone()]))
                .block_task(),
        )
        .await
        .expect("session/new")
        .session_id
        .0
        .to_string();
        let turn = cx.send_request(prompt(&session, "keep a note"));
        // Writing is asked (the server does not say it is read-only).
        let (req, responder) = inbox.ask("the write's permission request").await;
        assert_eq!(
            req.tool_call.fields.title.as_deref(),
            Some("files__write_file")
        );
        responder
            .respond(choose(PermissionOptionKind::AllowOnce, &req))
            .unwrap();
        let answer = within("the prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        assert!(inbox.asks.try_recv().is_err(), "reading was asked");
        let updates = inbox.drain();
        assert!(
            agent_text(&updates).contains("It says: from the editor's server"),
            "the read's result did not reach the model: {updates:?}"
        );
        let read = updates
            .iter()
            .find_map(|u| match u {
                SessionUpdate::ToolCall(t) if t.title == "files__read_text_file" => {
                    Some(t.tool_call_id.0.to_string())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("no tool_call for the read: {updates:?}"));
        assert!(
            updates
                .iter()
                .any(|u| is_final_update(u, &read, ToolCallStatus::Completed)),
            "{updates:?}"
        );
        session
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
    assert_eq!(
        std::fs::read_to_string(&notes).unwrap(),
        "from the editor's server"
    );
    // The server's process ended with the connection.
    let needle = root.display().to_string();
    common::eventually(
        "the editor's server to end with the agent",
        Duration::from_millis(100),
        || async {
            let left = processes_mentioning(&needle);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("still running: {left:?}"))
            }
        },
    )
    .await;

    // A later agent reconnects the server the client passes again.
    let (agent, transport) = spawn_agent(tmp.path(), &config, &[]);
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        within(
            "session/load",
            cx.send_request(
                LoadSessionRequest::new(session.clone(), &cwd).mcp_servers(vec![server.clone()]),
            )
            .block_task(),
        )
        .await
        .expect("session/load");
        let answer = within(
            "the prompt after the load",
            cx.send_request(prompt(&session, "read it again"))
                .block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        let updates = inbox.drain();
        assert!(
            agent_text(&updates).contains("Still: from the editor's server"),
            "{updates:?}"
        );
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
}

// ---- overseer acp --server ------------------------------------------------

/// Updates until the text streamed since the call contains `needle`.
async fn text_until(inbox: &mut Inbox, what: &str, needle: &str) -> Vec<SessionUpdate> {
    let mut got = Vec::new();
    while !agent_text(&got).contains(needle) {
        got.push(inbox.update(what).await);
    }
    got
}

/// The HS256 secret of the servers these tests start.
const SERVE_SECRET: &str = "acp-remote-secret-acp-remote-secret!";

/// A running `overseer serve`: its process (killed on drop) and base URL.
struct Served {
    _child: Child,
    url: String,
}

/// Starts `overseer serve --config config` on a free loopback port (data in
/// `dir/served`) and waits for its "listening on" line.
async fn serve(dir: &Path, config: &Path, env: &[(&str, &str)]) -> Served {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .arg("--data")
        .arg(dir.join("served"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OVERSEER_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("OVERSEER_JWT_SECRET", SERVE_SECRET);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn overseer serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = within("the server to listen", async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("serve exited before listening");
            if let Some(addr) = line.strip_prefix("listening on ") {
                break format!("http://{addr}");
            }
        }
    })
    .await;
    // Keep draining stderr so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Served { _child: child, url }
}

/// A token of tenant `acme` for `sub`, minted by `overseer token`.
fn serve_token(sub: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_overseer"))
        .args(["token", "--tenant", "acme", "--sub", sub, "--scopes"])
        .arg("sessions:read,sessions:write,approvals:write")
        .env("OVERSEER_JWT_SECRET", SERVE_SECRET)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// `GET path` on the server as `token`.
async fn served_get(url: &str, path: &str, token: &str) -> serde_json::Value {
    // reqwest is built without a default TLS provider (as in main.rs).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let (status, v) = crate::common::send(
        reqwest::Client::new()
            .get(format!("{url}{path}"))
            .bearer_auth(token),
    )
    .await
    .unwrap();
    assert!((200..300).contains(&status), "GET {path}: {status} {v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_server_sessions_live_in_the_server_and_another_agent_loads_them() {
    let tmp = tempfile::tempdir().unwrap();
    let config = scripted_config(tmp.path());
    let served = serve(tmp.path(), &config, &[]).await;
    let token = serve_token("alice");
    let cwd = tmp.path().to_path_buf();

    let (agent, transport) = spawn_remote(tmp.path(), &served.url, &token);
    let session = client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        // The editor's MCP servers cannot run in the server: refused, named.
        let refused = within(
            "session/new with mcpServers",
            cx.send_request(
                NewSessionRequest::new(&cwd).mcp_servers(vec![McpServer::Stdio(
                    McpServerStdio::new("notes", "/bin/true"),
                )]),
            )
            .block_task(),
        )
        .await
        .expect_err("mcpServers refused in remote mode");
        let data = refused
            .data
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(
            data.contains("--server") && data.contains("notes"),
            "{refused:?}"
        );
        let session = new_session(&cx, &cwd).await;

        // allow-once: asked, the tool runs, the turn ends.
        let turn = cx.send_request(prompt(&session, "what time is it?"));
        let (req, responder) = inbox.ask("the first permission request").await;
        assert_eq!(req.tool_call.fields.title.as_deref(), Some("current_time"));
        let call = req.tool_call.tool_call_id.0.to_string();
        responder
            .respond(choose(PermissionOptionKind::AllowOnce, &req))
            .unwrap();
        let answer = within("the first prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        let updates = text_until(&mut inbox, "the first answer's text", "The clock says").await;
        assert!(
            updates
                .iter()
                .any(|u| is_final_update(u, &call, ToolCallStatus::Completed)),
            "{updates:?}"
        );

        // allow-always: asked once; the next call is not.
        let turn = cx.send_request(prompt(&session, "again"));
        let (req, responder) = inbox.ask("the second permission request").await;
        responder
            .respond(choose(PermissionOptionKind::AllowAlways, &req))
            .unwrap();
        let answer = within("the second prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        let answer = within(
            "the third prompt's answer (not asked)",
            cx.send_request(prompt(&session, "once more")).block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        text_until(&mut inbox, "the third answer's text", "Third look").await;
        assert!(
            inbox.asks.try_recv().is_err(),
            "the allowed tool was asked again"
        );
        session
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;

    // A second editor attaches to the same session in the server.
    let (second, transport) = spawn_remote(tmp.path(), &served.url, &token);
    let loaded = session.clone();
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        within(
            "session/load",
            cx.send_request(LoadSessionRequest::new(loaded.clone(), &cwd))
                .block_task(),
        )
        .await
        .expect("session/load");
        let replay = inbox.drain();
        let text = agent_text(&replay);
        assert!(
            text.contains("The clock says") && text.contains("Third look"),
            "the replay: {replay:?}"
        );
        let answer = within(
            "the loaded session's prompt",
            cx.send_request(prompt(&loaded, "and again")).block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        text_until(&mut inbox, "the fourth answer's text", "Fourth look").await;
        assert!(
            inbox.asks.try_recv().is_err(),
            "the rule holds in the server"
        );
    })
    .await;
    second.exits_having_spoken_only_protocol().await;

    // The server holds the session, the rule and who decided: the token's
    // subject.
    let state = served_get(&served.url, &format!("/v1/sessions/{session}"), &token).await;
    assert_eq!(
        state["tool_rules"],
        serde_json::json!({"current_time": "allow"})
    );
    assert_eq!(state["metadata"]["acp"]["cwd"], cwd.display().to_string());
    let rule = state["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["role"] == "tool_rule_set")
        .expect("a tool_rule_set entry");
    assert_eq!(rule["by"], "alice", "{rule}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_server_cancel_during_a_stream_stops_the_turn_and_keeps_the_session() {
    let tmp = tempfile::tempdir().unwrap();
    let (url, mut requested) = stalling_provider().await;
    let config = tmp.path().join("openai.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "openai"
base_url = "{url}"
model = "stub"
api_key_env = "ACP_TEST_KEY"

[[agents]]
name = "assistant"
tools = []
"#
        ),
    )
    .unwrap();
    let served = serve(tmp.path(), &config, &[("ACP_TEST_KEY", "k")]).await;
    let (agent, transport) = spawn_remote(tmp.path(), &served.url, &serve_token("alice"));
    let cwd = tmp.path().to_path_buf();
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let turn = cx.send_request(prompt(&session, "talk"));
        within("the provider request", requested.recv())
            .await
            .unwrap();
        let first = inbox.update("the first streamed chunk").await;
        assert_eq!(agent_text(&[first]), "Hel");
        cx.send_notification(CancelNotification::new(session.clone()))
            .unwrap();
        let answer = within("the cancelled prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::Cancelled);

        let answer = within(
            "the next prompt's answer",
            cx.send_request(prompt(&session, "again")).block_task(),
        )
        .await
        .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        let updates = text_until(&mut inbox, "the next answer's text", "Again.").await;
        assert_eq!(agent_text(&updates), "Again.");
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
}

/// Runs `overseer acp --server url` with `token` and no client: it must
/// stop at once with one clear line on stderr and nothing on stdout.
async fn refused_at_start(dir: &Path, url: &str, token: &str) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args(["acp", "--server", url])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .kill_on_drop(true);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OVERSEER_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("OVERSEER_TOKEN", token);
    let out = within("the refused agent to exit", cmd.output())
        .await
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    String::from_utf8(out.stderr).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_server_a_wrong_token_or_an_unreachable_server_is_one_line_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let config = scripted_config(tmp.path());
    let served = serve(tmp.path(), &config, &[]).await;

    let stderr = refused_at_start(tmp.path(), &served.url, "not-a-token").await;
    assert!(
        stderr.starts_with(&format!(
            "error: --server {}: server answered 401",
            served.url
        )),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");

    // A port nothing listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let url = format!("http://{addr}");
    let stderr = refused_at_start(tmp.path(), &url, &serve_token("alice")).await;
    assert!(
        stderr.starts_with(&format!(
            "error: --server {url}: cannot reach {url}/v1/agents"
        )),
        "{stderr}"
    );
}

// --- A decision anywhere closes the editor's request --------------------

/// Agents whose every call needs approval: `assistant` (turns of one call
/// each, some interrupted or cancelled), `hasty` (a one-second approval
/// timeout) and `pair` (steps of two calls at once).
fn withdrawal_config(dir: &Path) -> PathBuf {
    let call = |text: &str| serde_json::json!({"text": text, "tool_calls": [{"name": "current_time", "arguments": {}}]});
    let two = |text: &str| {
        serde_json::json!({"text": text, "tool_calls": [
            {"name": "current_time", "arguments": {}},
            {"name": "current_time", "arguments": {"timezone": "UTC"}}
        ]})
    };
    let answer = |text: &str| serde_json::json!({ "text": text });
    let scenario = dir.join("withdrawal.json");
    std::fs::write(
        &scenario,
        serde_json::json!({"agents": {
            "assistant": [
                call("First look."), answer("Approved elsewhere: {{tool_result}}"),
                call("Second look."), answer("Denied elsewhere: {{tool_result}}"),
                call("Third look."),
                call("Fourth look."),
                call("Fifth look."), answer("Answered here: {{tool_result}}"),
            ],
            "hasty": [
                call("A look."), answer("Timed out: {{tool_result}}"),
                call("Another look."), answer("Again: {{tool_result}}"),
            ],
            "pair": [
                two("Two looks."), answer("Both: {{tool_result}}"),
                call("One look."),
                two("Two more."), answer("Done: {{tool_result}}"),
            ],
        }})
        .to_string(),
    )
    .unwrap();
    let config = dir.join("withdrawal.toml");
    let agent = |name: &str, extra: &str| {
        format!(
            "[[agents]]\nname = \"{name}\"\ntools = [\"current_time\"]\napproval = \"always\"\n{extra}\n"
        )
    };
    std::fs::write(
        &config,
        format!(
            "[provider]\nkind = \"scripted\"\nscenario = \"{}\"\n\n{}{}{}",
            scenario.display(),
            agent("assistant", ""),
            agent("hasty", "approval_timeout_secs = 1"),
            agent("pair", ""),
        ),
    )
    .unwrap();
    config
}

/// `overseer acp --server URL --agent agent` with `OVERSEER_TOKEN` set.
fn spawn_remote_as(dir: &Path, url: &str, token: &str, agent: &str) -> (Spawned, Transport) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args(["acp", "--server", url, "--agent", agent])
        .current_dir(dir);
    attach(cmd, &[("OVERSEER_TOKEN", token)])
}

type Ask = (
    RequestPermissionRequest,
    Responder<RequestPermissionResponse>,
);

fn call_of(ask: &Ask) -> String {
    ask.0.tool_call.tool_call_id.0.to_string()
}

/// Waits for the agent's `$/cancel_request` of this request.
async fn withdrawn(what: &str, ask: &Ask) {
    within(what, ask.1.cancellation().cancelled()).await;
}

/// `POST path` on the server as `token`, expecting success.
async fn served_post(url: &str, path: &str, token: &str, body: serde_json::Value) {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let (status, v) = crate::common::send(
        reqwest::Client::new()
            .post(format!("{url}{path}"))
            .bearer_auth(token)
            .json(&body),
    )
    .await
    .unwrap();
    assert!((200..300).contains(&status), "POST {path}: {status} {v}");
}

/// Each call of a transcript (as JSON), in order: its final state, and who
/// decided it and how ("" when nobody did).
fn calls(transcript: &serde_json::Value) -> Vec<(String, String)> {
    calls_by_id(transcript)
        .into_iter()
        .map(|(_, c)| c)
        .collect()
}

/// [`calls`], with each call's id.
fn calls_by_id(transcript: &serde_json::Value) -> Vec<(String, (String, String))> {
    transcript
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["role"] == "tool_result")
        .map(|e| {
            let call = &e["call"];
            let decided = match call["decision"]["by"].as_str() {
                Some(by) => format!(
                    "{} by {by}",
                    call["decision"]["decision"]["decision"].as_str().unwrap()
                ),
                None => String::new(),
            };
            let id = call["id"].as_str().unwrap().to_owned();
            (id, (call["state"].as_str().unwrap().to_owned(), decided))
        })
        .collect()
}

/// [`calls_by_id`] of a session in the agent's local store.
async fn stored_calls(dir: &Path, session: &str) -> Vec<(String, (String, String))> {
    let stored = store(dir)
        .load(session.parse().unwrap())
        .await
        .unwrap()
        .expect("the session is stored");
    let entries: Vec<serde_json::Value> = stored
        .transcript
        .iter()
        .map(|e| serde_json::to_value(&**e).unwrap())
        .collect();
    calls_by_id(&serde_json::Value::Array(entries))
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// Remote: a call the editor is asked about and that is approved through
/// the HTTP API, denied with the CLI, interrupted through the API, or whose
/// prompt the editor cancels, has its request withdrawn with
/// `$/cancel_request`; requests left unanswered (one even after the
/// withdrawal, one after cancelling) hold up none of the next, and a late
/// answer to a withdrawn request decides nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_server_a_call_decided_elsewhere_withdraws_the_editors_request() {
    let tmp = tempfile::tempdir().unwrap();
    let config = withdrawal_config(tmp.path());
    let served = serve(tmp.path(), &config, &[]).await;
    let token = serve_token("alice");
    let url = served.url.clone();
    let cwd = tmp.path().to_path_buf();
    let (agent, transport) = spawn_remote(tmp.path(), &url, &token);
    let session = client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let approvals = format!("/v1/sessions/{session}/approvals");
        // Requests never answered, kept open to the end.
        let mut unanswered = Vec::new();

        // Approved through the API: withdrawn; left unanswered.
        let turn = cx.send_request(prompt(&session, "look"));
        let first = inbox.ask("the first request").await;
        let call = call_of(&first);
        served_post(
            &url,
            &approvals,
            &token,
            serde_json::json!({"decisions": {&call: {"decision": "approve"}}}),
        )
        .await;
        withdrawn("the API-approved request's withdrawal", &first).await;
        let answer = within("the first prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        unanswered.push(first);

        // Denied with the CLI: the next call's request arrives although the
        // first was never answered; the editor answers -32800, as the
        // protocol asks of a withdrawn request.
        let turn = cx.send_request(prompt(&session, "again"));
        let second = inbox.ask("the second request").await;
        let denied = within(
            "overseer sessions approve --deny",
            Command::new(env!("CARGO_BIN_EXE_overseer"))
                .args(["sessions", "--url", &url, "approve", &session])
                .args(["--call", &call_of(&second), "--deny", "not now"])
                .env("OVERSEER_TOKEN", &token)
                .output(),
        )
        .await
        .unwrap();
        assert!(denied.status.success(), "{denied:?}");
        withdrawn("the CLI-denied request's withdrawal", &second).await;
        let (_, responder) = second;
        responder
            .respond_with_error(agent_client_protocol::Error::request_cancelled())
            .unwrap();
        let answer = within("the second prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        text_until(&mut inbox, "the denial's text", "Denied elsewhere: ").await;

        // Interrupted through the API: withdrawn; a late answer is dropped.
        let turn = cx.send_request(prompt(&session, "a third"));
        let third = inbox.ask("the third request").await;
        served_post(
            &url,
            &format!("/v1/sessions/{session}/interrupt"),
            &token,
            serde_json::json!({}),
        )
        .await;
        withdrawn("the interrupted request's withdrawal", &third).await;
        let answer = within("the interrupted prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::Cancelled);
        let (req, responder) = third;
        responder
            .respond(choose(PermissionOptionKind::AllowAlways, &req))
            .unwrap();

        // Cancelled by the editor, which then never answers its request.
        let turn = cx.send_request(prompt(&session, "a fourth"));
        let fourth = inbox.ask("the fourth request").await;
        cx.send_notification(CancelNotification::new(session.clone()))
            .unwrap();
        withdrawn("the cancelled prompt's request's withdrawal", &fourth).await;
        let answer = within("the cancelled prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::Cancelled);
        unanswered.push(fourth);

        // Two requests are still open at the editor; the next one arrives,
        // and the editor's answer decides it.
        let turn = cx.send_request(prompt(&session, "a fifth"));
        let (req, responder) = inbox.ask("the fifth request").await;
        responder
            .respond(choose(PermissionOptionKind::AllowOnce, &req))
            .unwrap();
        let answer = within("the fifth prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        text_until(&mut inbox, "the answered text", "Answered here: ").await;
        drop(unanswered);
        session
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;

    // What the server recorded: the API's approval, the CLI's denial and
    // the editor's approval, each as the token's subject; the interrupted
    // and the cancelled calls undecided; the late always-allow set no rule.
    let state = served_get(&served.url, &format!("/v1/sessions/{session}"), &token).await;
    assert!(state.get("tool_rules").is_none(), "{state}");
    assert_eq!(
        calls(&state["transcript"]),
        pairs(&[
            ("completed", "approve by alice"),
            ("denied", "deny by alice"),
            ("cancelled", ""),
            ("cancelled", ""),
            ("completed", "approve by alice"),
        ])
    );
}

/// The approval timeout closes the editor's request: the request the editor
/// never answers is withdrawn, the prompt ends, and the next call's request
/// reaches the editor.
async fn a_timeout_withdraws_the_request(transport: Transport, cwd: &Path) -> String {
    client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, cwd).await;
        let turn = cx.send_request(prompt(&session, "look"));
        let first = inbox.ask("the request that times out").await;
        withdrawn("the timed-out request's withdrawal", &first).await;
        let answer = within("the timed-out prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        text_until(&mut inbox, "the timeout's text", "Timed out: ").await;

        let turn = cx.send_request(prompt(&session, "again"));
        let (req, responder) = inbox.ask("the next request").await;
        assert_ne!(
            req.tool_call.tool_call_id.0.as_ref(),
            call_of(&first),
            "a new call"
        );
        // On a slow machine it may time out before the answer: either way
        // the prompt ends.
        responder
            .respond(choose(PermissionOptionKind::AllowOnce, &req))
            .unwrap();
        let answer = within("the next prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        drop(first);
        session
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_request_is_withdrawn_and_the_next_reaches_the_editor() {
    let tmp = tempfile::tempdir().unwrap();
    let config = withdrawal_config(tmp.path());
    let (agent, transport) = spawn_agent_as(tmp.path(), &config, "hasty");
    let session = a_timeout_withdraws_the_request(transport, tmp.path()).await;
    agent.exits_having_spoken_only_protocol().await;
    let calls = stored_calls(tmp.path(), &session).await;
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0].1, pairs(&[("denied", "deny by system")])[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_server_a_timed_out_request_is_withdrawn_and_the_next_reaches_the_editor() {
    let tmp = tempfile::tempdir().unwrap();
    let config = withdrawal_config(tmp.path());
    let served = serve(tmp.path(), &config, &[]).await;
    let token = serve_token("alice");
    let (agent, transport) = spawn_remote_as(tmp.path(), &served.url, &token, "hasty");
    let session = a_timeout_withdraws_the_request(transport, tmp.path()).await;
    agent.exits_having_spoken_only_protocol().await;
    let state = served_get(&served.url, &format!("/v1/sessions/{session}"), &token).await;
    let calls = calls(&state["transcript"]);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0], pairs(&[("denied", "deny by system")])[0]);
}

/// Locally: requests for different calls are independent (two at once, the
/// later answered first); a request the editor leaves unanswered after
/// cancelling its prompt is withdrawn and holds up nothing; an always-choice
/// settles the other request of that tool, which is withdrawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_independent_and_one_never_answered_blocks_no_other() {
    let tmp = tempfile::tempdir().unwrap();
    let config = withdrawal_config(tmp.path());
    let (agent, transport) = spawn_agent_as(tmp.path(), &config, "pair");
    let cwd = tmp.path().to_path_buf();
    let (session, expected) = client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, &cwd).await;
        let by = "acp:acp-test";
        let mut expected = Vec::new();

        // Both requests are open at once; the later is answered first.
        let turn = cx.send_request(prompt(&session, "two"));
        let (a_req, a) = inbox.ask("one of two requests").await;
        let (b_req, b) = inbox
            .ask("the other request, the first still unanswered")
            .await;
        b.respond(choose(PermissionOptionKind::AllowOnce, &b_req))
            .unwrap();
        a.respond(choose(PermissionOptionKind::RejectOnce, &a_req))
            .unwrap();
        let answer = within("the two calls' prompt", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        let id = |r: &RequestPermissionRequest| r.tool_call.tool_call_id.0.to_string();
        expected.push((id(&a_req), ("denied".into(), format!("deny by {by}"))));
        expected.push((id(&b_req), ("completed".into(), format!("approve by {by}"))));

        // Cancelled, and never answered.
        let turn = cx.send_request(prompt(&session, "one"));
        let one = inbox.ask("the request left unanswered").await;
        cx.send_notification(CancelNotification::new(session.clone()))
            .unwrap();
        withdrawn("the cancelled prompt's request's withdrawal", &one).await;
        let answer = within("the cancelled prompt's answer", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::Cancelled);
        expected.push((call_of(&one), ("cancelled".into(), String::new())));

        // The next requests arrive; always-allow on one settles the other.
        let turn = cx.send_request(prompt(&session, "two more"));
        let (d_req, d) = inbox.ask("a request after the unanswered one").await;
        let other = inbox.ask("its sibling's request").await;
        d.respond(choose(PermissionOptionKind::AllowAlways, &d_req))
            .unwrap();
        withdrawn("the sibling's withdrawal, settled by the rule", &other).await;
        let answer = within("the always-allowed prompt", turn.block_task())
            .await
            .expect("prompt");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        expected.push((id(&d_req), ("completed".into(), format!("approve by {by}"))));
        expected.push((
            call_of(&other),
            ("completed".into(), format!("approve by {by}")),
        ));
        drop((one, other));
        (session, expected)
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
    let mut stored = stored_calls(tmp.path(), &session).await;
    let mut expected = expected;
    stored.sort();
    expected.sort();
    assert_eq!(stored, expected);
}

/// A configuration with a stored task and skills (§17) for the
/// `assistant` agent: the examples' skill folders, one task.
fn library_config(dir: &Path) -> PathBuf {
    let scenario = dir.join("library.json");
    std::fs::write(
        &scenario,
        serde_json::json!({"agents": {"assistant": [
            {"text": "triaged: sev3"},
        ]}})
        .to_string(),
    )
    .unwrap();
    let skills = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/skills");
    let config = dir.join("library.toml");
    std::fs::write(
        &config,
        format!(
            r#"skills_dirs = ["{}"]

[provider]
kind = "scripted"
scenario = "{}"

[[agents]]
name = "assistant"
skills = ["incident-triage", "production-deploy"]

[[tasks]]
id = "triage"
description = "Triage a ticket"
instructions = "Triage the ticket."
agent = "assistant"
skills = ["incident-triage"]
input_schema = {{ type = "object", required = ["ticket"] }}
"#,
            skills.display(),
            scenario.display()
        ),
    )
    .unwrap();
    config
}

/// The editor is offered the session's tasks and a `skill` command; `/skill`
/// activates a skill as a person (one that needs trust included) without a
/// model turn, and `/triage CONTEXT` runs the task as the session's turn,
/// its context checked against the task's schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_commands_activate_skills_and_run_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let config = library_config(dir.path());
    let (agent, transport) = spawn_agent(dir.path(), &config, &[]);
    let session = client(transport, async |cx, mut inbox| {
        initialize(&cx).await;
        let session = new_session(&cx, dir.path()).await;
        let offered = inbox
            .updates_until("the available commands", |u| {
                matches!(u, SessionUpdate::AvailableCommandsUpdate(_))
            })
            .await;
        let Some(SessionUpdate::AvailableCommandsUpdate(update)) = offered.last() else {
            unreachable!()
        };
        let names: Vec<&str> = update
            .available_commands
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["triage", "skill"]);

        // A skill only a person may activate: the editor's user is one.
        let answer = within(
            "/skill",
            cx.send_request(prompt(&session, "/skill production-deploy"))
                .block_task(),
        )
        .await
        .expect("/skill answers");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);

        // A context the task's schema refuses names the field.
        let refused = within(
            "/triage {}",
            cx.send_request(prompt(&session, "/triage {}")).block_task(),
        )
        .await
        .expect_err("a bad context is refused");
        assert!(format!("{refused:?}").contains("context"), "{refused:?}");

        let answer = within(
            "/triage",
            cx.send_request(prompt(&session, r#"/triage {"ticket": "printer on fire"}"#))
                .block_task(),
        )
        .await
        .expect("/triage answers");
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
        let text = agent_text(&inbox.drain());
        assert!(text.contains("triaged: sev3"), "{text}");
        session
    })
    .await;
    agent.exits_having_spoken_only_protocol().await;
    let id: SessionId = session.parse().unwrap();
    let stored = store(dir.path()).load(id).await.unwrap().unwrap();
    let kinds: Vec<String> = stored
        .transcript
        .iter()
        .map(|e| match e.as_ref() {
            TranscriptEntry::SkillActivated { name, by, .. } => {
                format!("skill {name} by {}", by.as_deref().unwrap_or("model"))
            }
            TranscriptEntry::User { text, .. } => format!("user {}", &text[..18]),
            TranscriptEntry::Assistant { text, .. } => format!("assistant {text}"),
            _ => "other".to_owned(),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "skill production-deploy by acp:acp-test",
            "skill incident-triage by acp:acp-test",
            "user Triage the ticket.",
            "assistant triaged: sev3"
        ]
    );
}
