//! The one rendering rule for untrusted text (`src/render.rs`, and the
//! page's `src/http/ui/render.js`) on every surface, through the public
//! surface: the page's rule against the shared fixture in Node.js; the
//! approvals API's `warnings` and the exact bytes a real HTTP tool receives
//! (an `overseer serve` process); `sessions list|show|approve` as processes;
//! `overseer run`'s prompt and edit on a pseudo-terminal; `overseer acp`'s
//! permission request and tool-call updates over raw JSON-RPC.
//!
//! The model's call is the issue's example plus an isolate and a word with a
//! Cyrillic `а`; the session title holds an isolate, a zero-width space and
//! the same word. Every wait is bounded (a hang guard); nothing is timed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::served::{self, Served};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::Router;
use serde_json::{json, Value};
use unicode_security::mixed_script::AugmentedScriptSet;

const BIN: &str = env!("CARGO_BIN_EXE_overseer");
const SECRET: &str = "render-test-secret-render-test-secret!";

/// Only turns a hang into a failure; nothing is timed against it.
const PATIENCE: Duration = Duration::from_secs(60);

/// What the scripted model asks to run: the issue's example, an isolate,
/// and a word that mixes scripts.
fn arguments() -> Value {
    json!({
        "attachment": "invoice_\u{202e}fdp.exe",
        "command": "ls\u{200b}; rm -rf ~",
        "note": "\u{2066}see inside\u{2069}",
        "vendor": "p\u{430}ypal"
    })
}

/// A session title with an isolate, a zero-width space and a mixed word.
const TITLE: &str = "Q3 \u{2066}invoice\u{2069} for p\u{430}ypal\u{200b}";

/// The warnings of the API about [`arguments`], under `/arguments`.
fn argument_warnings() -> Value {
    let hidden = |field: &str, chars: &[&str]| {
        json!({"code": "hidden_characters", "field": field, "chars": chars,
            "message": format!("contains hidden or direction-changing characters: {}", chars.join(", "))})
    };
    json!([
        hidden("/arguments/attachment", &["U+202E"]),
        hidden("/arguments/command", &["U+200B"]),
        hidden("/arguments/note", &["U+2066", "U+2069"]),
        {"code": "mixed_script", "field": "/arguments/vendor", "words": ["p\u{430}ypal"],
            "message": "mixes scripts within a word: p\u{430}ypal"}
    ])
}

/// Whether `text` holds a character the rule shows escaped (a newline and
/// a tab excepted).
fn has_raw_hidden(text: &str) -> bool {
    text.chars()
        .any(|c| c != '\n' && c != '\t' && overseer::render::is_hidden(c))
}

// ---- the page's rule in Node.js ----------------------------------------------

#[test]
fn the_pages_rule_passes_the_shared_fixture_and_knows_every_script() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("node")
        .arg(root.join("tests/render/check.mjs"))
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run node ({e}): install Node.js 20 or later (e.g. `apt-get install nodejs`)")
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("check.mjs printed no report ({e}): {stdout}\n{stderr}"));
    assert!(
        out.status.success(),
        "render.js fails the fixture: {}",
        serde_json::to_string_pretty(&report["failures"]).unwrap()
    );
    assert!(report["cases"].as_u64().unwrap() >= 20, "{report}");
    assert!(report["known_scripts"].as_u64().unwrap() > 150, "{report}");
    // render.js names every script the Rust rule's crate knows (so a newer
    // engine that knows them too checks them all).
    let listed: BTreeSet<&str> = report["scripts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let mut crate_scripts = BTreeSet::new();
    for c in (0..=0x10_FFFF_u32).filter_map(char::from_u32) {
        let set = AugmentedScriptSet::for_char(c);
        if !set.is_all() {
            crate_scripts.extend(set.base.iter().map(|s| s.short_name()));
        }
    }
    let missing: Vec<_> = crate_scripts.difference(&listed).collect();
    assert!(missing.is_empty(), "render.js's SCRIPTS lacks {missing:?}");
}

// ---- a real HTTP tool ----------------------------------------------------------

/// A loopback tool server: records each request's body and answers with the
/// arguments it received.
struct ToolServer {
    url: String,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ToolServer {
    async fn start() -> Self {
        async fn record(
            State(bodies): State<Arc<Mutex<Vec<Bytes>>>>,
            body: Bytes,
        ) -> axum::Json<Value> {
            bodies.lock().unwrap().push(body.clone());
            let envelope: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            axum::Json(json!({"received": envelope["arguments"]}))
        }
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new().fallback(record).with_state(bodies.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/tools", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { url, bodies, task }
    }

    /// The one request the tool got: its raw body and its `arguments`.
    fn only_call(&self) -> (Bytes, Value) {
        let bodies = self.bodies.lock().unwrap();
        assert_eq!(bodies.len(), 1, "the tool ran once");
        let envelope: Value = serde_json::from_slice(&bodies[0]).unwrap();
        (bodies[0].clone(), envelope["arguments"].clone())
    }
}

impl Drop for ToolServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Asserts that `body` holds each string value of `args` as its exact UTF-8
/// bytes (JSON would also allow `\u202e`: the tool must get the characters).
fn assert_exact_bytes(body: &[u8], args: &Value) {
    for value in args.as_object().unwrap().values() {
        let raw = value.as_str().unwrap().as_bytes();
        assert!(
            body.windows(raw.len()).any(|w| w == raw),
            "the tool's body lacks the bytes of {value}: {}",
            String::from_utf8_lossy(body)
        );
    }
}

/// A config with the scripted model of [`arguments`] and the `file_report`
/// tool at `tool_url`, asked about on every call.
fn config(dir: &Path, tool_url: &str) -> PathBuf {
    let scenario = dir.join("render.json");
    std::fs::write(
        &scenario,
        json!({"agents": {"clerk": [
            {"text": "Filing the report.", "tool_calls": [{"name": "file_report", "arguments": arguments()}]},
            {"text": "Filed: {{tool_result}}"}
        ]}})
        .to_string(),
    )
    .unwrap();
    let config = dir.join("render.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "scripted"
scenario = "{}"

[[tools]]
name = "file_report"
description = "Files a report."
url = "{tool_url}"

[[agents]]
name = "clerk"
tools = ["file_report"]
approval = "always"
"#,
            scenario.display()
        ),
    )
    .unwrap();
    config
}

// ---- the API and `sessions` over a served process --------------------------------

fn serve(data: &Path, config: &Path) -> Served {
    let mut cmd = served::command();
    cmd.arg("--data")
        .arg(data)
        .arg("--config")
        .arg(config)
        .env("OVERSEER_JWT_SECRET", SECRET);
    Served::start(cmd).unwrap()
}

fn token() -> String {
    overseer::auth::mint(
        SECRET.as_bytes(),
        "acme",
        "alice",
        &[
            "sessions:read".to_owned(),
            "sessions:write".to_owned(),
            "approvals:write".to_owned(),
        ],
        Duration::from_secs(3600),
    )
    .unwrap()
}

/// Reads the session's event stream until an event of type `ty`.
async fn until_event(http: &reqwest::Client, url: &str, token: &str, id: &str, ty: &str) {
    let mut events = crate::common::Sse::from_request(
        http.get(format!("{url}/v1/sessions/{id}/events"))
            .bearer_auth(token),
    )
    .await
    .unwrap();
    events.until_type(ty).await.unwrap();
}

/// `overseer sessions --url URL ARGS…`: (success, stdout, stderr).
fn sessions(url: &str, token: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .arg("sessions")
        .args(["--url", url])
        .args(args)
        .env("OVERSEER_TOKEN", token)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_carry_warnings_the_cli_shows_escapes_and_the_tool_gets_the_exact_bytes() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let tool = ToolServer::start().await;
    let served = serve(&dir.path().join("data"), &config(dir.path(), &tool.url));
    let (url, token) = (served.url.clone(), token());
    let http = reqwest::Client::new();

    let created: Value = crate::common::send(
        http.post(format!("{url}/v1/sessions"))
            .bearer_auth(&token)
            .json(&json!({"agent": "clerk", "title": TITLE, "prompt": "file the Q3 report"})),
    )
    .await
    .unwrap()
    .1;
    let id = created["id"].as_str().expect("created").to_owned();
    until_event(&http, &url, &token, &id, "approval_requested").await;

    // The inbox card: raw data, and the warnings beside it.
    let inbox: Value =
        crate::common::send(http.get(format!("{url}/v1/approvals")).bearer_auth(&token))
            .await
            .unwrap()
            .1;
    let card = &inbox["approvals"][0];
    assert_eq!(card["arguments"], arguments(), "the API keeps raw data raw");
    assert_eq!(card["title"], TITLE);
    let mut want = vec![
        json!({"code": "hidden_characters", "field": "/title", "chars": ["U+2066", "U+2069", "U+200B"],
            "message": "contains hidden or direction-changing characters: U+2066, U+2069, U+200B"}),
        json!({"code": "mixed_script", "field": "/title", "words": ["p\u{430}ypal"],
            "message": "mixes scripts within a word: p\u{430}ypal"}),
    ];
    want.extend(argument_warnings().as_array().unwrap().iter().cloned());
    assert_eq!(card["warnings"], Value::Array(want), "{card}");

    // The session's own list of pending calls.
    let pending: Value = crate::common::send(
        http.get(format!("{url}/v1/sessions/{id}/approvals"))
            .bearer_auth(&token),
    )
    .await
    .unwrap()
    .1;
    assert_eq!(pending["pending"][0]["arguments"], arguments());
    assert_eq!(pending["pending"][0]["warnings"], argument_warnings());

    // `sessions list`: the title's cell escaped, the warnings on stderr.
    let (ok, out, err) = sessions(&url, &token, &["list"]);
    assert!(ok, "{err}");
    assert!(
        !has_raw_hidden(&out) && !has_raw_hidden(&err),
        "{out:?} {err:?}"
    );
    assert_eq!(
        out.trim_end().split('\t').nth(3),
        Some("Q3 ⟨U+2066⟩invoice⟨U+2069⟩ for p\u{430}ypal⟨U+200B⟩"),
        "{out}"
    );
    assert!(err.contains(&format!("warning: session {id}: /title: contains hidden or direction-changing characters: U+2066, U+2069, U+200B")), "{err}");
    assert!(
        err.contains(&format!(
            "warning: session {id}: /title: mixes scripts within a word: p\u{430}ypal"
        )),
        "{err}"
    );

    // `sessions show`: JSON that parses back to the exact text, warnings on stderr.
    let (ok, out, err) = sessions(&url, &token, &["show", &id]);
    assert!(ok, "{err}");
    assert!(
        !has_raw_hidden(&out) && !has_raw_hidden(&err),
        "{out:?} {err:?}"
    );
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["title"], TITLE);
    assert!(out.contains("invoice_\\u202efdp.exe"), "{out}");
    assert!(err.contains("warning: /title: contains hidden or direction-changing characters: U+2066, U+2069, U+200B"), "{err}");
    assert!(
        err.contains(
            "/arguments/attachment: contains hidden or direction-changing characters: U+202E"
        ),
        "{err}"
    );

    // `sessions approve`: what was approved, through the rule.
    let (ok, out, err) = sessions(&url, &token, &["approve", &id]);
    assert!(ok, "{err}");
    assert!(!has_raw_hidden(&out), "{out:?}");
    assert!(
        out.starts_with("approved call_") && out.lines().next().unwrap().ends_with(": file_report"),
        "{out}"
    );
    for line in [
        "    \"attachment\": \"invoice_⟨U+202E⟩fdp.exe\",",
        "    \"command\": \"ls⟨U+200B⟩; rm -rf ~\",",
        "    \"note\": \"⟨U+2066⟩see inside⟨U+2069⟩\",",
        "  warning: /arguments/attachment: contains hidden or direction-changing characters: U+202E",
        "  warning: /arguments/vendor: mixes scripts within a word: p\u{430}ypal",
    ] {
        assert!(out.lines().any(|l| l == line), "no line {line:?} in:\n{out}");
    }

    // The tool ran with exactly what the model proposed.
    until_event(&http, &url, &token, &id, "turn_ended").await;
    let (body, received) = tool.only_call();
    assert_eq!(received, arguments());
    assert_exact_bytes(&body, &arguments());
}

// ---- `overseer run` on a pseudo-terminal ---------------------------------------

/// A pseudo-terminal: the child's stdin is its terminal side.
struct Pty {
    master: std::fs::File,
    slave: std::os::fd::OwnedFd,
}

fn pty() -> Pty {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors into the given integers;
    // the name, termios and window size are optional and null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are new and owned by nothing else.
    unsafe {
        Pty {
            master: std::fs::File::from_raw_fd(master),
            slave: std::os::fd::OwnedFd::from_raw_fd(slave),
        }
    }
}

/// Everything a child wrote to one of its pipes so far, read on a thread.
struct Output {
    chunks: mpsc::Receiver<Vec<u8>>,
    seen: String,
}

impl Output {
    fn of(mut pipe: impl Read + Send + 'static) -> Self {
        let (tx, chunks) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        Self {
            chunks,
            seen: String::new(),
        }
    }

    /// Reads until the output holds `needle`; returns what came since the
    /// last call.
    fn until(&mut self, needle: &str) -> String {
        let from = self.seen.len();
        while !self.seen[from..].contains(needle) {
            match self.chunks.recv_timeout(PATIENCE) {
                Ok(chunk) => self.seen.push_str(&String::from_utf8_lossy(&chunk)),
                Err(_) => panic!("no {needle:?} in:\n{}", &self.seen[from..]),
            }
        }
        self.seen[from..].to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_shows_the_call_and_an_edits_diff_before_it_is_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let tool = ToolServer::start().await;
    let config = config(dir.path(), &tool.url);
    let Pty { mut master, slave } = pty();
    let mut child = Command::new(BIN)
        .args(["run", "--agent", "clerk", "--approve", "ask", "--config"])
        .arg(&config)
        .arg("--data")
        .arg(dir.path().join("data"))
        .arg("file the Q3 report")
        .env("USER", "render-test")
        .stdin(Stdio::from(slave))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _stdout = Output::of(child.stdout.take().unwrap());
    let mut stderr = Output::of(child.stderr.take().unwrap());

    // The call, as pretty JSON of exactly what the tool will receive.
    let asked = stderr.until("[y]es/[n]o/[e]dit: ");
    assert!(!has_raw_hidden(&asked), "{asked:?}");
    for line in [
        "file_report (call_",
        "  \"attachment\": \"invoice_⟨U+202E⟩fdp.exe\",\n  \"command\": \"ls⟨U+200B⟩; rm -rf ~\",\n  \"note\": \"⟨U+2066⟩see inside⟨U+2069⟩\",\n  \"vendor\": \"p\u{430}ypal\"\n}\n",
        "warning: /arguments/attachment: contains hidden or direction-changing characters: U+202E\n",
        "warning: /arguments/note: contains hidden or direction-changing characters: U+2066, U+2069\n",
        "warning: /arguments/vendor: mixes scripts within a word: p\u{430}ypal\n",
    ] {
        assert!(asked.contains(line), "no {line:?} in:\n{asked}");
    }

    // An edit shows what it changes and what will run, then asks again.
    master.write_all(b"e\n").unwrap();
    stderr.until("as a JSON object: ");
    master
        .write_all(b"{\"attachment\": \"invoice.pdf\"}\n")
        .unwrap();
    let confirm = stderr.until("approve with these arguments? [y]es/[n]o: ");
    assert!(!has_raw_hidden(&confirm), "{confirm:?}");
    for line in [
        "your edit changes:\n  attachment: \"invoice_⟨U+202E⟩fdp.exe\" → \"invoice.pdf\"\n",
        "will then receive:\n{\n  \"attachment\": \"invoice.pdf\",\n  \"command\": \"ls⟨U+200B⟩; rm -rf ~\",",
    ] {
        assert!(confirm.contains(line), "no {line:?} in:\n{confirm}");
    }
    assert!(!confirm.contains("/arguments/attachment"), "{confirm}");
    master.write_all(b"y\n").unwrap();

    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{}", stderr.seen);
    let mut ran = arguments();
    ran["attachment"] = json!("invoice.pdf");
    let (body, received) = tool.only_call();
    assert_eq!(received, ran);
    assert_exact_bytes(&body, &ran);
}

// ---- `overseer acp` over raw JSON-RPC ------------------------------------------

/// `overseer acp` spoken to line by line: notifications are kept, requests
/// from the agent collected.
struct Rpc {
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    updates: Vec<Value>,
    asks: Vec<Value>,
}

impl Rpc {
    async fn send(&mut self, msg: Value) {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{msg}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Reads one message; returns it when it is an answer.
    async fn read(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("the agent went quiet")
            .unwrap()
            .expect("the agent exited");
        let msg: Value = serde_json::from_str(&line).unwrap();
        match msg["method"].as_str() {
            Some("session/update") => self.updates.push(msg["params"]["update"].clone()),
            Some("session/request_permission") => self.asks.push(msg),
            Some(_) => {}
            None => return Some(msg),
        }
        None
    }

    /// Reads until the answer to request `id`.
    async fn answer(&mut self, id: u64) -> Value {
        loop {
            if let Some(msg) = self.read().await {
                if msg["id"] == id {
                    return msg;
                }
            }
        }
    }

    /// Reads until the agent asks for a permission.
    async fn ask(&mut self) -> Value {
        loop {
            if let Some(ask) = self.asks.pop() {
                return ask;
            }
            self.read().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_permission_and_tool_call_content_show_escapes_and_raw_input_stays_raw() {
    let dir = tempfile::tempdir().unwrap();
    let tool = ToolServer::start().await;
    let config = config(dir.path(), &tool.url);
    let mut child = tokio::process::Command::new(BIN)
        .args(["acp", "--agent", "clerk", "--config"])
        .arg(&config)
        .arg("--data")
        .arg(dir.path().join("data"))
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut rpc = Rpc {
        stdin: child.stdin.take().unwrap(),
        lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stdout.take().unwrap(),
        )),
        updates: Vec::new(),
        asks: Vec::new(),
    };
    rpc.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {}}}))
        .await;
    rpc.answer(1).await;
    rpc.send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
        "params": {"cwd": dir.path(), "mcpServers": []}}))
        .await;
    let created = rpc.answer(2).await;
    let session = created["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("no session: {created}"))
        .to_owned();
    rpc.send(json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
        "params": {"sessionId": session, "prompt": [{"type": "text", "text": "file the Q3 report"}]}}))
        .await;

    // The permission request: the arguments shown through the rule, with
    // the warnings; the raw input exact.
    let ask = rpc.ask().await;
    let call = &ask["params"]["toolCall"];
    assert_eq!(call["rawInput"], arguments(), "raw input stays raw");
    assert_eq!(call["title"], "file_report");
    let shown = call["content"][0]["content"]["text"].as_str().unwrap();
    assert!(!has_raw_hidden(shown), "{shown:?}");
    for line in [
        "\"attachment\": \"invoice_⟨U+202E⟩fdp.exe\"",
        "\"command\": \"ls⟨U+200B⟩; rm -rf ~\"",
        "warning: /arguments/note: contains hidden or direction-changing characters: U+2066, U+2069",
        "warning: /arguments/vendor: mixes scripts within a word: p\u{430}ypal",
    ] {
        assert!(shown.contains(line), "no {line:?} in:\n{shown}");
    }
    rpc.send(json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}}))
        .await;
    let answer = rpc.answer(3).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");

    // Every update an editor shows is escaped; raw fields stay raw.
    let updates = &rpc.updates;
    let proposed = updates
        .iter()
        .find(|u| u["sessionUpdate"] == "tool_call")
        .expect("the proposed call");
    assert_eq!(proposed["rawInput"], arguments());
    let text = proposed["content"][0]["content"]["text"].as_str().unwrap();
    assert!(
        text.contains("invoice_⟨U+202E⟩fdp.exe") && !has_raw_hidden(text),
        "{text:?}"
    );
    let finished = updates
        .iter()
        .find(|u| u["sessionUpdate"] == "tool_call_update" && u["status"] == "completed")
        .expect("the finished call");
    assert_eq!(finished["rawOutput"]["received"], arguments());
    let text = finished["content"][0]["content"]["text"].as_str().unwrap();
    assert!(
        text.contains("invoice_⟨U+202E⟩fdp.exe") && !has_raw_hidden(text),
        "{text:?}"
    );
    let said: String = updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .collect();
    assert!(
        said.contains("⟨U+202E⟩") && !has_raw_hidden(&said),
        "{said:?}"
    );

    let (body, received) = tool.only_call();
    assert_eq!(received, arguments());
    assert_exact_bytes(&body, &arguments());
    drop(rpc);
    let _ = tokio::time::timeout(PATIENCE, child.wait()).await;
}
