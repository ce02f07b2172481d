//! Per-agent tools and approvals through `overseer serve --config` as a
//! process: an agent's own MCP server (the real
//! `@modelcontextprotocol/server-everything` over stdio, from
//! `tests/node_modules`) whose tools only that agent gets, tool patterns,
//! and `tool_approvals` forcing and waiving a human decision, all observed
//! through the HTTP API; and the start-up refusals that name the agent.
//! Nothing is timed: every wait is bounded only to turn a hang into a
//! failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use anyhow::Context;
use common::{send, token, Sse, SseMsg, ALL, PATIENCE, SECRET};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_overseer");

/// `overseer serve` on a free loopback port with `config`; killed when
/// dropped.
struct Served {
    child: Child,
    url: String,
    client: reqwest::Client,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `overseer serve --config FILE` and collects its stderr lines.
fn spawn(dir: &Path, config: &str) -> (Child, mpsc::Receiver<String>) {
    let path = dir.join("overseer.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .arg("--data")
        .arg(dir.join("data"))
        .env("OVERSEER_JWT_SECRET", SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    // Reads to the end, so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// Waits for the "listening on" line.
fn serve(dir: &Path, config: &str) -> Served {
    let (child, lines) = spawn(dir, config);
    let mut seen = Vec::new();
    let url = loop {
        match lines.recv_timeout(PATIENCE) {
            Ok(line) => match line.strip_prefix("listening on ") {
                Some(addr) => break format!("http://{addr}"),
                None => seen.push(line),
            },
            Err(_) => panic!(
                "serve did not listen within {PATIENCE:?} (or exited); stderr: {}",
                seen.join("\n")
            ),
        }
    };
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    Served {
        child,
        url,
        client: reqwest::Client::new(),
    }
}

/// Runs serve expecting it to refuse to start: its exit status and stderr.
fn refused(dir: &Path, config: &str) -> (std::process::ExitStatus, String) {
    let (mut child, lines) = spawn(dir, config);
    let mut stderr = Vec::new();
    loop {
        match lines.recv_timeout(PATIENCE) {
            Ok(line) => {
                let listening = line.starts_with("listening on ");
                stderr.push(line);
                if listening {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("serve started: {}", stderr.join("\n"));
                }
            }
            // The pipe closed: the process is gone.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve neither started nor exited within {PATIENCE:?}");
            }
        }
    }
    (child.wait().unwrap(), stderr.join("\n"))
}

impl Served {
    async fn create(&self, t: &str, agent: &str) -> anyhow::Result<String> {
        let (status, v) = send(
            self.client
                .post(format!("{}/v1/sessions", self.url))
                .bearer_auth(t)
                .json(&json!({"agent": agent, "prompt": "go"})),
        )
        .await?;
        anyhow::ensure!(status == 201, "create answered {status}: {v}");
        v["id"].as_str().map(str::to_owned).context("id")
    }

    async fn events(&self, t: &str, id: &str) -> anyhow::Result<Sse> {
        Sse::from_request(
            self.client
                .get(format!("{}/v1/sessions/{id}/events", self.url))
                .bearer_auth(t),
        )
        .await
    }

    async fn get(&self, t: &str, path: &str) -> anyhow::Result<Value> {
        let (status, v) = send(
            self.client
                .get(format!("{}{path}", self.url))
                .bearer_auth(t),
        )
        .await?;
        anyhow::ensure!(status == 200, "GET {path} answered {status}: {v}");
        Ok(v)
    }
}

/// The tool name of each proposed call, by call id, and each finished
/// call's (state, result), in the order the events came.
fn calls(events: &[SseMsg]) -> Vec<(String, String, Value)> {
    let name = |id: &Value| {
        events
            .iter()
            .find(|m| m.event == "tool_call_proposed" && &m.data["call_id"] == id)
            .map(|m| m.data["name"].as_str().unwrap_or("?").to_owned())
            .unwrap_or_default()
    };
    events
        .iter()
        .filter(|m| m.event == "tool_call_finished")
        .map(|m| {
            (
                name(&m.data["call_id"]),
                m.data["state"].as_str().unwrap_or("?").to_owned(),
                m.data["result"].clone(),
            )
        })
        .collect()
}

fn everything_js() -> String {
    let js = common::npm::tests_dir()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(js.is_file(), "{} is missing", js.display());
    js.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_own_server_and_approval_rules_are_its_alone() -> anyhow::Result<()> {
    common::npm::installed().await;
    let dir = tempfile::tempdir()?;
    let scenario = json!({
        "name": "agent-tools",
        "agents": {
            "notes": [
                {"text": "", "tool_calls": [{"name": "ev__get-sum", "arguments": {"a": 2, "b": 3}}]},
                {"text": "", "tool_calls": [{"name": "ev__echo", "arguments": {"message": "hello"}}]},
                {"text": "notes: {{tool_result}}"}
            ],
            "others": [
                {"text": "", "tool_calls": [{"name": "ev__echo", "arguments": {"message": "sneaky"}}]},
                {"text": "", "tool_calls": [{"name": "current_time", "arguments": {}}]},
                {"text": "others: {{tool_result}}"}
            ]
        }
    });
    let scenario_path = dir.path().join("scenario.json");
    std::fs::write(&scenario_path, scenario.to_string())?;
    // `notes` has a server of its own; get-sum (which asks by default: not
    // read-only) is waived, echo (read-only: never asks by default) forced.
    // `others` takes every tool it may have with a pattern, and forces
    // current_time (which never asks by default).
    let config = format!(
        r#"
[provider]
kind = "scripted"
scenario = {scenario:?}

[[agents]]
name = "notes"
approval = "per_tool"
mcp_servers = [{{ name = "ev", command = "node", args = [{js:?}, "stdio"] }}]
tool_approvals = {{ "ev__*" = false, "ev__echo" = true }}

[[agents]]
name = "others"
approval = "per_tool"
tools = ["*"]
tool_approvals = {{ current_time = true }}
"#,
        scenario = scenario_path.display().to_string(),
        js = everything_js(),
    );
    let served = serve(dir.path(), &config);
    let t = token("acme", "alice", ALL);

    // What the API says each agent has, and which calls ask.
    let agents = served.get(&t, "/v1/agents").await?;
    let agent = |name: &str| {
        agents["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("agent {name} in {agents}"))
    };
    let asks = |a: &Value, tool: &str| {
        a["tool_specs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == tool)
            .map(|s| s["requires_approval"].clone())
    };
    let notes = agent("notes");
    let names: Vec<&str> = notes["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        names.contains(&"ev__echo") && names.contains(&"ev__get-sum"),
        "{notes}"
    );
    assert!(names.iter().all(|n| n.starts_with("ev__")), "{notes}");
    assert_eq!(asks(&notes, "ev__echo"), Some(json!(true)), "{notes}");
    assert_eq!(asks(&notes, "ev__get-sum"), Some(json!(false)), "{notes}");
    let others = agent("others");
    assert!(
        !others["tools"].to_string().contains("ev__"),
        "another agent's server is not in its scope, whatever its patterns: {others}"
    );
    assert_eq!(asks(&others, "current_time"), Some(json!(true)), "{others}");

    // notes: get-sum runs without a decision; echo waits for one.
    let id = served.create(&t, "notes").await?;
    let mut events = served.events(&t, &id).await?;
    let mut seen = events.until_type("approval_requested").await?;
    let asked = seen.last().context("approval_requested")?.data.clone();
    assert_eq!(asked["name"], "ev__echo", "{asked}");
    let done = calls(&seen);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(
        (done[0].0.as_str(), done[0].1.as_str()),
        ("ev__get-sum", "completed")
    );
    assert!(done[0].2.to_string().contains('5'), "{done:?}");
    assert!(
        !seen
            .iter()
            .any(|m| m.event == "approval_requested" && m.data["name"] == "ev__get-sum"),
        "get-sum's default was waived"
    );
    let call = asked["call_id"].as_str().context("call_id")?;
    let (status, v) = send(
        served
            .client
            .post(format!("{}/v1/sessions/{id}/approvals", served.url))
            .bearer_auth(&t)
            .json(&json!({"decisions": {call: {"decision": "approve"}}})),
    )
    .await?;
    assert_eq!(status, 200, "{v}");
    seen.extend(events.until_type("turn_ended").await?);
    let done = calls(&seen);
    assert_eq!(
        done.last().map(|c| (c.0.as_str(), c.1.as_str())),
        Some(("ev__echo", "completed")),
        "{done:?}"
    );
    let session = served.get(&t, &format!("/v1/sessions/{id}")).await?;
    assert_eq!(session["status"], "awaiting_input", "{session}");
    assert!(
        session["transcript"]
            .to_string()
            .contains("notes: Echo: hello"),
        "{session}"
    );

    // others: the call to notes' tool is refused as out of scope; the
    // forced rule makes current_time ask.
    let id = served.create(&t, "others").await?;
    let mut events = served.events(&t, &id).await?;
    let seen = events.until_type("approval_requested").await?;
    let asked = &seen.last().context("approval_requested")?.data;
    assert_eq!(asked["name"], "current_time", "{asked}");
    let done = calls(&seen);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(
        (done[0].0.as_str(), done[0].1.as_str()),
        ("ev__echo", "failed")
    );
    assert_eq!(
        done[0].2["error"], "tool 'ev__echo' is not available in this session",
        "{done:?}"
    );
    // A session's overrides only narrow: not even to another agent's tool.
    let (status, v) = send(
        served
            .client
            .post(format!("{}/v1/sessions", served.url))
            .bearer_auth(&t)
            .json(&json!({"agent": "others", "tools": ["current_time", "ev__echo"]})),
    )
    .await?;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("ev__echo")),
        "{v}"
    );
    Ok(())
}

#[test]
fn start_up_refuses_what_an_agents_tools_cannot_be_naming_the_agent() {
    let cases = [
        // Resolved once the sources are known (no server needed here).
        (
            "[[agents]]\nname = \"scout\"\ntools = [\"current_time\", \"web__*\"]\n",
            "agent 'scout': the tool pattern 'web__*' matches no tool",
        ),
        (
            "[[agents]]\nname = \"scout\"\ntools = [\"current_*\"]\ntool_approvals = { \"web__*\" = true }\n",
            "agent 'scout': the tool_approvals pattern 'web__*' matches none of its tools",
        ),
        // Known from the file alone.
        (
            "[[agents]]\nname = \"scout\"\ntools = [\"current_time\"]\ntool_approvals = { launch_rockets = true }\n",
            "agents[0].tool_approvals: agent 'scout' sets an approval rule for 'launch_rockets', which is not one of its tools",
        ),
        (
            "[[agents]]\nname = \"owner\"\nmcp_servers = [{ name = \"own\", command = \"node\" }]\n[[agents]]\nname = \"scout\"\ntools = [\"own__echo\"]\n",
            "agents[1].tools: agent 'scout' lists unknown tool 'own__echo'",
        ),
        (
            "[[agents]]\nname = \"scout\"\nmcp_servers = [\"nowhere\"]\n",
            "agents[0].mcp_servers[0]: agent 'scout' names MCP server 'nowhere', which no [[mcp_servers]] entry defines",
        ),
    ];
    for (config, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (status, stderr) = refused(dir.path(), config);
        assert!(!status.success(), "{config}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(expected), "«{expected}» not in: {stderr}");
    }
}
