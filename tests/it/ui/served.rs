//! `overseer serve` as a process on a free loopback port, configured for
//! the browser tests: the scripted provider playing this file's scenario
//! (agents that ask once, twice in a turn, two calls in a step, with a
//! short deadline, or delegate),
//! two `http` tools that need approval served by a loopback server in the
//! test (recording every call), and agents for each test. Plus tokens and a
//! small API client for acting "elsewhere" (another client than the page).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_overseer");
/// HS256 secret of the served process.
pub const SECRET: &str = "ui-test-secret-0123456789-abcdefghijklmnop";
pub const ALL: &str = "sessions:read,sessions:write,approvals:write";

/// The description of `write_record`: markup in it must show as text.
pub const WRITE_DESCRIPTION: &str = "Writes a record <b>to the ledger</b>.";

fn scenario() -> Value {
    json!({
        "name": "ui",
        "agents": {
            "ops": [
                {"text": "I will write record {{user_number}}.",
                 "tool_calls": [{"name": "write_record", "arguments": {"key": "{{user_number}}"}}],
                 "usage": {"input_tokens": 40, "output_tokens": 8}},
                {"text": "Result: {{tool_result}}", "usage": {"input_tokens": 60, "output_tokens": 6}},
                {"text": "Anything else?"}
            ],
            "hasty": [
                {"text": "Quick: record {{user_number}}.",
                 "tool_calls": [{"name": "write_record", "arguments": {"key": "{{user_number}}"}}]},
                {"text": "Result: {{tool_result}}"}
            ],
            "lead": [
                {"text": "Delegating.",
                 "tool_calls": [{"name": "delegate_task", "arguments": {"agent": "ops", "goal": "write record 5"}}],
                 "usage": {"input_tokens": 30, "output_tokens": 5}},
                {"text": "lead: {{tool_result}}"}
            ],
            "echo": [
                {"text": "You said: {{user}}",
                 "tool_calls": [{"name": "annotate", "arguments": {"text": "{{user}}", "note": "optional"}}]},
                {"text": "Noted: {{tool_result}}"}
            ],
            "twice": [
                {"text": "First: record {{user_number}}.",
                 "tool_calls": [{"name": "write_record", "arguments": {"key": "{{user_number}}"}}]},
                {"text": "Again.",
                 "tool_calls": [{"name": "write_record", "arguments": {"key": 99}}]},
                {"text": "Both written."}
            ],
            "pair": [
                {"text": "Two records.",
                 "tool_calls": [
                     {"name": "write_record", "arguments": {"key": "{{user_number}}"}},
                     {"name": "write_record", "arguments": {"key": 8}}
                 ]},
                {"text": "Both: {{tool_result}}"}
            ],
            "urgent": [
                {"text": "Urgent: record {{user_number}}.",
                 "tool_calls": [{"name": "write_record", "arguments": {"key": "{{user_number}}"}}]},
                {"text": "Result: {{tool_result}}"}
            ]
        }
    })
}

fn config(tool_url: &str, data: &std::path::Path, scenario: &std::path::Path) -> String {
    format!(
        r#"
[store]
data_dir = "{data}"
durability = "os"

[provider]
kind = "scripted"
scenario = "{scenario}"

[http]
auth = "hs256"
jwt_leeway_secs = 0

[[tools]]
name = "write_record"
description = "{WRITE_DESCRIPTION}"
url = "{tool_url}"
parameters = {{ type = "object", properties = {{ key = {{ type = "integer", minimum = 1 }} }}, required = ["key"], additionalProperties = false }}
requires_approval = true

[[tools]]
name = "annotate"
description = "Adds a note."
url = "{tool_url}"
parameters = {{ type = "object", properties = {{ text = {{ type = "string" }}, note = {{ type = "string" }} }}, required = ["text"] }}
requires_approval = true

[[agents]]
name = "ops"
tools = ["write_record"]

[[agents]]
name = "hasty"
tools = ["write_record"]
approval_timeout_secs = 2

[[agents]]
name = "lead"
tools = ["write_record"]
subagents = ["ops"]

[[agents]]
name = "echo"
tools = ["annotate"]

[[agents]]
name = "twice"
tools = ["write_record"]

[[agents]]
name = "pair"
tools = ["write_record"]

[[agents]]
name = "urgent"
tools = ["write_record"]
approval_timeout_secs = 45
"#,
        data = data.display(),
        scenario = scenario.display(),
    )
}

/// What the tool server received: `(tool, arguments)`.
pub type Calls = Arc<Mutex<Vec<(String, Value)>>>;

async fn tool(State(calls): State<Calls>, Json(body): Json<Value>) -> Json<Value> {
    let name = body["tool"].as_str().unwrap_or("").to_owned();
    let args = body["arguments"].clone();
    calls.lock().unwrap().push((name.clone(), args.clone()));
    Json(match name.as_str() {
        "write_record" => json!({ "written": args["key"] }),
        _ => json!({ "annotated": args["text"] }),
    })
}

/// A served `overseer` and its tool server.
pub struct Served {
    child: Child,
    pub url: String,
    pub calls: Calls,
    pub http: reqwest::Client,
    tools: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.tools.abort();
    }
}

impl Served {
    /// Starts the tool server and `overseer serve --listen 127.0.0.1:0`,
    /// and waits for its "listening on" line.
    pub async fn start() -> anyhow::Result<Self> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let calls: Calls = Arc::default();
        let app = Router::new()
            .route("/tools", post(tool))
            .with_state(calls.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let tool_url = format!("http://{}/tools", listener.local_addr()?);
        let tools = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let dir = tempfile::tempdir()?;
        let scenario_path = dir.path().join("scenario.json");
        std::fs::write(&scenario_path, scenario().to_string())?;
        let config_path = dir.path().join("overseer.toml");
        std::fs::write(
            &config_path,
            config(&tool_url, &dir.path().join("data"), &scenario_path),
        )?;
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config_path)
            .env("OVERSEER_JWT_SECRET", SECRET)
            .env_remove("OVERSEER_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().context("stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if !sent {
                    if let Some(addr) = line.strip_prefix("listening on ") {
                        let _ = tx.send(Ok(addr.to_owned()));
                        sent = true;
                        continue;
                    }
                    if line.starts_with("error:") {
                        let _ = tx.send(Err(line));
                        sent = true;
                    }
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(addr)) => addr,
            Ok(Err(line)) => bail!("overseer serve failed: {line}"),
            Err(_) => {
                let _ = child.kill();
                bail!("overseer serve did not listen within 60 s")
            }
        };
        Ok(Self {
            child,
            url: format!("http://{addr}"),
            calls,
            http: reqwest::Client::new(),
            tools,
            _dir: dir,
        })
    }

    /// The page's address plus `fragment` (e.g. `#/new`).
    pub fn page(&self, fragment: &str) -> String {
        format!("{}/{fragment}", self.url)
    }

    /// `overseer token --url`: the sign-in link, as a person would get it.
    pub fn link(&self, tenant: &str, sub: &str) -> anyhow::Result<String> {
        let out = Command::new(BIN)
            .args([
                "token", "--tenant", tenant, "--sub", sub, "--scopes", ALL, "--url",
            ])
            .arg(&self.url)
            .env("OVERSEER_JWT_SECRET", SECRET)
            .output()?;
        if !out.status.success() {
            bail!(
                "token --url failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?.trim().to_owned())
    }

    /// A token for `tenant`/`sub` with every scope, valid for an hour.
    pub fn token(&self, tenant: &str, sub: &str) -> String {
        token_until(tenant, sub, jsonwebtoken::get_current_timestamp() + 3600)
    }

    /// Sends a request with `token`; the JSON answer, or an error with it.
    pub async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("{method} {path} answered {status}: {text}");
        }
        Ok(if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)?
        })
    }

    /// Creates a session through the API; returns its id.
    pub async fn create(
        &self,
        token: &str,
        agent: &str,
        prompt: &str,
        title: Option<&str>,
    ) -> anyhow::Result<String> {
        let mut body = json!({"agent": agent, "prompt": prompt});
        if let Some(t) = title {
            body["title"] = json!(t);
        }
        let v = self
            .api(reqwest::Method::POST, "/v1/sessions", token, Some(body))
            .await?;
        Ok(v["id"].as_str().context("session id")?.to_owned())
    }

    /// Waits (on the session's own event stream) until `session` has a call
    /// waiting; returns the call id of the first pending one of its tree.
    pub async fn pending_call(&self, token: &str, session: &str) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut resp = self
            .http
            .get(format!("{}/v1/sessions/{session}/events", self.url))
            .bearer_auth(token)
            .send()
            .await?;
        let mut seen = String::new();
        loop {
            if seen.contains("\"status\":\"awaiting_approval\"") {
                break;
            }
            let chunk = tokio::time::timeout_at(deadline, resp.chunk())
                .await
                .context("no approval request within 30 s")??
                .context("the event stream ended")?;
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        let v = self
            .api(
                reqwest::Method::GET,
                &format!("/v1/sessions/{session}/approvals"),
                token,
                None,
            )
            .await?;
        Ok(v["pending"][0]["call_id"]
            .as_str()
            .context("a pending call")?
            .to_owned())
    }

    /// What the tools received so far.
    pub fn tool_calls(&self) -> Vec<(String, Value)> {
        self.calls.lock().unwrap().clone()
    }
}

/// A token expiring at `exp` (seconds since the epoch), signed for the
/// served process.
pub fn token_until(tenant: &str, sub: &str, exp: u64) -> String {
    token_with(
        tenant,
        sub,
        &["sessions:read", "sessions:write", "approvals:write"],
        exp,
    )
}

/// A token with only `scopes`, valid for an hour.
pub fn token_scoped(tenant: &str, sub: &str, scopes: &[&str]) -> String {
    token_with(
        tenant,
        sub,
        scopes,
        jsonwebtoken::get_current_timestamp() + 3600,
    )
}

fn token_with(tenant: &str, sub: &str, scopes: &[&str], exp: u64) -> String {
    let claims = json!({
        "sub": sub,
        "tenant": tenant,
        "scopes": scopes,
        "exp": exp,
        "iat": jsonwebtoken::get_current_timestamp().min(exp),
    });
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("token")
}
