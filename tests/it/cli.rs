//! Black-box tests of `overseer run`: the built binary as a process, on a
//! fresh data directory, its stores inspected afterwards with `SledStore`.
//!
//! Each test runs in a temporary working directory, so the binary finds no
//! `config/overseer.toml` and no scenario file there: these tests also prove
//! that the compiled-in defaults make it work from anywhere. The `--resume`
//! tests play the earlier process in-process (the library on the same data
//! directory, stopped mid-turn), so they need no fault injection; the
//! process-level crash loop is `tests/crash.rs`. Asking on a terminal runs
//! the binary with a pseudo-terminal as its stdin (`Tty`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use overseer::store::{Durability, SledStore};
use overseer_actors::model::SessionStatus;
use overseer_actors::store::CheckpointStore;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn session_id(&self) -> String {
        self.stderr
            .lines()
            .find_map(|l| l.strip_prefix("session: "))
            .unwrap_or_else(|| panic!("no session line in stderr:\n{}", self.stderr))
            .trim()
            .to_owned()
    }

    fn last_stderr_line(&self) -> &str {
        self.stderr.lines().last().unwrap_or("")
    }
}

/// Runs the binary in `cwd` with a clean `OVERSEER_*` environment and stdin
/// that is not a terminal.
fn overseer(cwd: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .env_remove("RUST_LOG");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OVERSEER_") {
            cmd.env_remove(key);
        }
    }
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run overseer");
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

fn data_arg(dir: &Path) -> String {
    dir.join("data").display().to_string()
}

fn workdir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    (tmp, data)
}

#[test]
fn approve_auto_runs_the_demo_end_to_end() {
    let (tmp, _) = workdir();
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--approve",
            "auto",
            "--data",
            &data_arg(tmp.path()),
            "What time is it?",
        ],
    );
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    assert!(
        run.stdout.contains("Let me check the clock."),
        "{}",
        run.stdout
    );
    // The answer carries the tool's result.
    assert!(run.stdout.contains("\"utc\":\""), "{}", run.stdout);
    assert!(run.stdout.contains("\"unix_ms\":"), "{}", run.stdout);
    assert!(run.stderr.contains("session: "), "{}", run.stderr);
    assert!(
        run.stderr.contains("approval requested: current_time"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("turn ended: end_turn"),
        "{}",
        run.stderr
    );
    // Progress stays off stdout.
    assert!(!run.stdout.contains("session: "));
}

#[test]
fn approve_deny_lets_the_model_see_the_denial() {
    let (tmp, _) = workdir();
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--approve",
            "deny",
            "--data",
            &data_arg(tmp.path()),
            "What time is it?",
        ],
    );
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    assert!(
        run.stdout
            .contains("Tool denied by user: denied by --approve deny"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("unix_ms"));
}

#[test]
fn approve_ask_without_a_terminal_refuses_before_creating_anything() {
    let (tmp, data) = workdir();
    let run = overseer(
        tmp.path(),
        &["run", "--data", &data_arg(tmp.path()), "What time is it?"],
    );
    assert_ne!(run.code, Some(0));
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr
            .starts_with("error: --approve ask needs a terminal"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("session: "));
    assert!(!data.exists(), "the store was created");
}

#[test]
fn two_runs_on_one_data_dir_keep_both_sessions() {
    let (tmp, data) = workdir();
    let args = [
        "run",
        "--agent",
        "auto",
        "--approve",
        "deny",
        "--data",
        &data_arg(tmp.path()),
        "time?",
    ];
    let first = overseer(tmp.path(), &args);
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    let second = overseer(tmp.path(), &args);
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    // The `auto` agent never asks, so --approve deny has nothing to deny.
    assert!(second.stdout.contains("unix_ms"), "{}", second.stdout);
    let (a, b) = (first.session_id(), second.session_id());
    assert_ne!(a, b);

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sessions = rt.block_on(async {
        let store = SledStore::open(&data, Durability::Fsync).expect("open store");
        store.list_tenant("local", None, 100).await.expect("list")
    });
    let mut ids: Vec<String> = sessions.iter().map(|h| h.id.to_string()).collect();
    ids.sort();
    let mut expected = vec![a, b];
    expected.sort();
    assert_eq!(ids, expected);
    // `run` completes its session when the turn ends.
    assert!(sessions
        .iter()
        .all(|h| h.status == SessionStatus::Completed && h.agent == "auto"));
}

#[test]
fn an_exhausted_scenario_fails_with_a_one_line_reason() {
    let (tmp, _) = workdir();
    let scenario = tmp.path().join("short.json");
    std::fs::write(
        &scenario,
        r#"{"name": "short", "agents": {"assistant": [
            {"text": "Checking.", "tool_calls": [{"name": "current_time", "arguments": {}}]}
        ]}}"#,
    )
    .expect("write scenario");
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--approve",
            "auto",
            "--scenario",
            &scenario.display().to_string(),
            "--data",
            &data_arg(tmp.path()),
            "What time is it?",
        ],
    );
    assert_ne!(run.code, Some(0), "{}", run.stderr);
    let last = run.last_stderr_line();
    assert!(
        last.starts_with("error: turn ended with error"),
        "{}",
        run.stderr
    );
    assert!(last.contains("scenario exhausted"), "{}", run.stderr);
    assert!(last.contains("short"), "{}", run.stderr);
}

#[test]
fn an_unknown_agent_is_a_clear_error() {
    let (tmp, data) = workdir();
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--agent",
            "nobody",
            "--approve",
            "auto",
            "--data",
            &data_arg(tmp.path()),
            "hi",
        ],
    );
    assert_ne!(run.code, Some(0));
    // One line naming the configured agents (the default config's list grows
    // with the examples; its first two are the demo's).
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr
            .starts_with("error: unknown agent 'nobody' (configured: assistant, auto"),
        "{}",
        run.stderr
    );
    assert!(!data.exists());
}

#[test]
fn a_config_with_an_unknown_key_names_it() {
    let (tmp, _) = workdir();
    let config = tmp.path().join("overseer.toml");
    std::fs::write(
        &config,
        "[store]\ndata_dir = \"data\"\nflush_every = 3\n\n[[agents]]\nname = \"assistant\"\n",
    )
    .expect("write config");
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--config",
            &config.display().to_string(),
            "--approve",
            "auto",
            "hi",
        ],
    );
    assert_ne!(run.code, Some(0));
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("store.flush_every: unknown key"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("overseer.toml"), "{}", run.stderr);
}

#[test]
fn an_invalid_value_names_its_key() {
    let (tmp, _) = workdir();
    let config = tmp.path().join("overseer.toml");
    std::fs::write(
        &config,
        "[[agents]]\nname = \"assistant\"\n[[agents]]\nname = \"b\"\napproval = \"sometimes\"\n",
    )
    .expect("write config");
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--config",
            &config.display().to_string(),
            "--approve",
            "auto",
            "hi",
        ],
    );
    assert_ne!(run.code, Some(0));
    assert!(
        run.stderr.contains(
            "agents[1].approval: unknown variant 'sometimes', expected auto|per_tool|always"
        ),
        "{}",
        run.stderr
    );
}

#[test]
fn the_checkout_config_file_is_used_from_the_repository() {
    // From the repository root, config/overseer.toml and the scenario file on
    // disk are the ones read.
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = overseer(
        root,
        &[
            "run",
            "--approve",
            "auto",
            "--data",
            &data_arg(tmp.path()),
            "What time is it?",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("unix_ms"), "{}", run.stdout);
}

#[test]
fn the_delegation_demo_runs_two_subagents_and_settles_the_childs_approval() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = overseer(
        root,
        &[
            "run",
            "--agent",
            "lead",
            "--scenario",
            "examples/scenarios/delegation.json",
            "--approve",
            "auto",
            "--data",
            &data_arg(tmp.path()),
            "Plan the launch",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // The reviewer's approval surfaced at the root and was decided there.
    assert!(
        run.stderr
            .contains("approval requested by subagent session"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("decision acknowledged: "),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("Both subagents reported back"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("Confirmed:"), "{}", run.stdout);
}

// ---- overseer run --resume ------------------------------------------------

/// Plays "an earlier process" in-process: starts the runtime on `data` with
/// the built-in config and scenario, creates a session of `agent`, waits until
/// it reaches `until`, and stops, leaving the session on disk as a killed
/// process would (its checkpoints are all that remains).
fn leave_session(data: &Path, agent: &str, until: SessionStatus) -> String {
    use overseer_actors::model::{EventKind, Notification, SessionId};
    use overseer_actors::scripted::ScriptedProvider;
    use overseer_actors::{CreateSession, Overseer};
    use std::sync::Arc;

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let id = rt.block_on(async {
        let config = overseer::config::Config::builtin().expect("built-in config");
        let store = SledStore::open(data, Durability::Fsync).expect("open store");
        let overseer = Overseer::start(
            config.agent_configs(),
            Arc::new(store),
            Arc::new(ScriptedProvider::new(
                overseer::scenario::builtin().expect("built-in scenario"),
            )),
            overseer::tools::builtin_registry().expect("tools"),
            config.runtime_config(),
        )
        .await
        .expect("start");
        let id = SessionId::generate();
        let mut rx = overseer.subscribe(id);
        overseer
            .create_session(CreateSession {
                agent: agent.into(),
                tenant: overseer::cli::CLI_TENANT.into(),
                prompt: Some("What time is it?".into()),
                id: Some(id),
                ..CreateSession::default()
            })
            .await
            .expect("create");
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            loop {
                match rx.recv().await {
                    Ok(Notification::Event(e)) => {
                        if matches!(e.kind, EventKind::StatusChanged { status } if status == until)
                        {
                            return;
                        }
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(e) => panic!("event stream ended: {e}"),
                }
            }
        })
        .await
        .expect("the session never reached the awaited status");
        overseer.shutdown().await.expect("shutdown");
        id
    });
    // Dropping the runtime drops the store, which releases the directory.
    drop(rt);
    id.to_string()
}

fn stored_status(data: &Path, id: &str) -> (SessionStatus, Option<String>) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store = SledStore::open(data, Durability::Fsync).expect("open store");
        let h = store
            .load_header(id.parse().expect("session id"))
            .await
            .expect("load")
            .expect("the session exists");
        (h.status, h.last_stop_reason.map(|r| r.to_string()))
    })
}

#[test]
fn resume_settles_the_approval_a_killed_process_left_pending() {
    let (tmp, data) = workdir();
    let id = leave_session(&data, "assistant", SessionStatus::AwaitingApproval);
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--resume",
            &id,
            "--approve",
            "auto",
            "--data",
            &data_arg(tmp.path()),
        ],
    );
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    assert_eq!(run.session_id(), id);
    assert!(
        run.stderr.contains(
            "resuming: awaiting_approval (turn 1, step 1): 1 call(s) wait for a decision"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("approval pending: current_time"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("decision acknowledged: call_"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("turn ended: end_turn"),
        "{}",
        run.stderr
    );
    // The agent's answer carries the tool's result, as in a fresh run.
    assert!(run.stdout.contains("unix_ms"), "{}", run.stdout);
    assert_eq!(
        stored_status(&data, &id),
        (SessionStatus::Completed, Some("end_turn".into()))
    );
}

#[test]
fn resume_denies_per_approve_deny() {
    let (tmp, data) = workdir();
    let id = leave_session(&data, "assistant", SessionStatus::AwaitingApproval);
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--resume",
            &id,
            "--approve",
            "deny",
            "--data",
            &data_arg(tmp.path()),
        ],
    );
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    assert!(
        run.stdout
            .contains("Tool denied by user: denied by --approve deny"),
        "{}",
        run.stdout
    );
    assert!(run.stderr.contains(" deny\n"), "{}", run.stderr);
}

#[test]
fn resume_completes_a_session_whose_turn_had_ended() {
    let (tmp, data) = workdir();
    // The `auto` agent never asks: the turn ends and the process "dies"
    // before `run` could complete the session.
    let id = leave_session(&data, "auto", SessionStatus::AwaitingInput);
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--resume",
            &id,
            "--approve",
            "deny",
            "--data",
            &data_arg(tmp.path()),
        ],
    );
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    assert!(
        run.stderr
            .contains("resuming: awaiting_input: its last turn ended with end_turn"),
        "{}",
        run.stderr
    );
    assert_eq!(stored_status(&data, &id).0, SessionStatus::Completed);
}

#[test]
fn resume_of_a_finished_session_reports_how_it_ended() {
    let (tmp, _) = workdir();
    let ok = overseer(
        tmp.path(),
        &[
            "run",
            "--agent",
            "auto",
            "--approve",
            "deny",
            "--data",
            &data_arg(tmp.path()),
            "time?",
        ],
    );
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    let id = ok.session_id();
    let again = overseer(
        tmp.path(),
        &[
            "run",
            "--resume",
            &id,
            "--approve",
            "auto",
            "--data",
            &data_arg(tmp.path()),
        ],
    );
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert!(
        again
            .stderr
            .contains("resuming: completed: its last turn ended with end_turn"),
        "{}",
        again.stderr
    );
    assert!(again.stdout.is_empty(), "{}", again.stdout);

    // A session whose turn failed (scenario exhausted) resumes to the same
    // failure and exit status.
    let scenario = tmp.path().join("short.json");
    std::fs::write(
        &scenario,
        r#"{"name": "short", "agents": {"auto": [
            {"text": "Checking.", "tool_calls": [{"name": "current_time", "arguments": {}}]}
        ]}}"#,
    )
    .expect("write scenario");
    let failed = overseer(
        tmp.path(),
        &[
            "run",
            "--agent",
            "auto",
            "--approve",
            "auto",
            "--scenario",
            &scenario.display().to_string(),
            "--data",
            &data_arg(tmp.path()),
            "time?",
        ],
    );
    assert_eq!(failed.code, Some(1), "{}", failed.stderr);
    let id = failed.session_id();
    let again = overseer(
        tmp.path(),
        &[
            "run",
            "--resume",
            &id,
            "--approve",
            "auto",
            "--data",
            &data_arg(tmp.path()),
        ],
    );
    assert_eq!(again.code, Some(1), "{}", again.stderr);
    assert_eq!(
        again.last_stderr_line(),
        format!("error: session {id} is completed; its last turn ended with error")
    );
}

#[test]
fn resume_of_an_unknown_session_is_a_clear_error() {
    let (tmp, data) = workdir();
    let id = "0190f5b2-6f3a-7cc1-9a39-3f1e8e0f4a11";
    let args = [
        "run",
        "--resume",
        id,
        "--approve",
        "auto",
        "--data",
        &data_arg(tmp.path()),
    ];
    // No data directory: refused before anything is created.
    let run = overseer(tmp.path(), &args);
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.stderr.trim(),
        format!("error: no session {id} in {}", data.display())
    );
    assert!(!data.exists(), "the store was created");
    // A store that does not hold it.
    let first = overseer(
        tmp.path(),
        &[
            "run",
            "--agent",
            "auto",
            "--approve",
            "deny",
            "--data",
            &data_arg(tmp.path()),
            "time?",
        ],
    );
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    let run = overseer(tmp.path(), &args);
    assert_eq!(run.code, Some(1));
    assert_eq!(
        run.last_stderr_line(),
        format!("error: no session {id} in {}", data.display())
    );
    // Not an id at all: the usage error names the value.
    let run = overseer(tmp.path(), &["run", "--resume", "nope"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("'nope'"), "{}", run.stderr);
}

/// `run --provider openai --base-url … --model …` drives an OpenAI-compatible
/// server (here a loopback server in the test speaking the streaming format).
#[test]
fn run_drives_an_openai_compatible_server_from_flags() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        // Read headers and the JSON body (Content-Length bytes).
        loop {
            let n = conn.read(&mut buf).expect("read");
            request.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&request).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if request.len() >= end + 4 + len {
                    break;
                }
            }
        }
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello from \"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"the local model.\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5}}\n\n",
            "data: [DONE]\n\n"
        );
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(response.as_bytes()).expect("write");
        String::from_utf8_lossy(&request).into_owned()
    });
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = format!("http://{addr}/v1");
    let run = overseer(
        tmp.path(),
        &[
            "run",
            "--provider",
            "openai",
            "--base-url",
            &base,
            "--model",
            "local-model",
            "--agent",
            "auto",
            "--approve",
            "auto",
            "--data",
            &data_arg(tmp.path()),
            "Say hello",
        ],
    );
    let request = server.join().expect("server");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.trim(), "Hello from the local model.");
    assert!(
        request.starts_with("POST /v1/chat/completions"),
        "{request}"
    );
    assert!(request.contains("\"model\":\"local-model\""), "{request}");
    assert!(request.contains("\"stream\":true"), "{request}");
}

#[test]
fn tools_lists_every_configured_tool_with_its_agents() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = tmp.path().join("c.toml");
    std::fs::write(
        &config,
        r#"
[http_request]
allow_hosts = ["api.example.com"]

[[tools]]
name = "create_ticket"
description = "Opens a ticket"
url = "http://127.0.0.1:9/tools"

[[agents]]
name = "ops"
tools = ["create_ticket", "http_request", "current_time"]
"#,
    )
    .expect("write config");
    let run = overseer(
        tmp.path(),
        &["tools", "--config", &config.display().to_string()],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let line = |name: &str| {
        run.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name}\t")))
            .unwrap_or_else(|| panic!("no {name} in {}", run.stdout))
            .to_owned()
    };
    assert!(
        line("create_ticket").contains("\tapproval\t"),
        "{}",
        run.stdout
    );
    assert!(
        line("create_ticket").contains("agents: ops"),
        "{}",
        run.stdout
    );
    assert!(
        line("http_request").contains("\tapproval\t"),
        "{}",
        run.stdout
    );
    assert!(
        line("current_time").contains("\tno-approval\t"),
        "{}",
        run.stdout
    );
}

// ---- Ctrl-C and model switch (issue 15) ---------------------------------------

/// A tool endpoint that takes every request and never answers: a tool call
/// that stays running until something stops it. Each request is announced
/// on the returned channel.
fn never_answering_tool() -> (String, std::sync::mpsc::Receiver<()>) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/slow", listener.local_addr().expect("addr"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            held.push(conn);
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    (url, rx)
}

/// A config whose `worker` agent calls `slow` (no approval needed) and then
/// answers with the user's words; `fast` is a second route with the same
/// script.
fn worker_config(dir: &Path, tool_url: &str) -> PathBuf {
    let scenario = dir.join("worker.json");
    std::fs::write(
        &scenario,
        serde_json::json!({"agents": {"worker": [
            {"text": "Working on it.", "tool_calls": [{"name": "slow", "arguments": {}}]},
            {"text": "Picked up again: {{user}}"}
        ]}})
        .to_string(),
    )
    .expect("write scenario");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[provider]
kind = "scripted"
scenario = "{scenario}"

[[models]]
name = "fast"
provider = "scripted"
scenario = "{scenario}"

[[tools]]
name = "slow"
description = "Takes its time"
url = "{tool_url}"
requires_approval = false
timeout_secs = 600

[[agents]]
name = "worker"
tools = ["slow"]
approval = "auto"
"#,
            scenario = scenario.display()
        ),
    )
    .expect("write config");
    config
}

#[test]
fn ctrl_c_interrupts_the_turn_and_keeps_the_session_for_the_next_message() {
    let (tmp, data) = workdir();
    let (tool_url, called) = never_answering_tool();
    let config = worker_config(tmp.path(), &tool_url);
    let config = config.display().to_string();
    let data_dir = data_arg(tmp.path());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args([
        "run",
        "--config",
        &config,
        "--agent",
        "worker",
        "--approve",
        "auto",
        "--data",
        &data_dir,
        "start",
    ])
    .current_dir(tmp.path())
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .env_remove("RUST_LOG");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OVERSEER_") {
            cmd.env_remove(key);
        }
    }
    let child = cmd.spawn().expect("spawn overseer run");
    let pid = child.id();
    // Bounded: a run that never reaches the tool or never exits is killed.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if flag.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    });
    called
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the run never called the tool");
    let sent = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("kill -INT");
    assert!(sent.success());
    let out = child.wait_with_output().expect("wait");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    let id = run.session_id();
    assert_eq!(run.code, Some(130), "stderr:\n{}", run.stderr);
    assert!(
        run.stderr.contains(
            "interrupted: stopping the turn; the session is kept (Ctrl-C again cancels it)"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("turn ended: interrupted"),
        "{}",
        run.stderr
    );
    assert_eq!(
        run.last_stderr_line(),
        format!("error: interrupted: session {id} is kept and waits for input; continue it with `overseer run --resume {id} PROMPT`")
    );
    assert!(run.stdout.contains("Working on it."), "{}", run.stdout);
    assert_eq!(
        stored_status(&data, &id),
        (SessionStatus::AwaitingInput, Some("interrupted".into()))
    );

    // Resuming without a message keeps it waiting, and says how to go on.
    let resume = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--config",
            &config,
            "--resume",
            &id,
            "--approve",
            "auto",
            "--data",
            &data_dir,
        ];
        args.extend_from_slice(extra);
        overseer(tmp.path(), &args)
    };
    let again = resume(&[]);
    assert_eq!(again.code, Some(1), "{}", again.stderr);
    assert!(
        again
            .last_stderr_line()
            .contains("waits for input (its last turn was interrupted)"),
        "{}",
        again.stderr
    );
    assert_eq!(stored_status(&data, &id).0, SessionStatus::AwaitingInput);
    // A route that is not configured is refused before anything runs.
    let bad = resume(&["--model", "nope", "go"]);
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(
        bad.stderr.contains(
            "--model: 'nope' is not a configured model route (configured: fast, scripted)"
        ),
        "{}",
        bad.stderr
    );

    // The next message continues the conversation, on another route.
    let next = resume(&["--model", "fast", "carry", "on"]);
    assert_eq!(next.code, Some(0), "{}", next.stderr);
    assert!(
        next.stderr.contains("model route: scripted -> fast"),
        "{}",
        next.stderr
    );
    assert_eq!(next.stdout.trim(), "Picked up again: carry on");
    assert_eq!(
        stored_status(&data, &id),
        (SessionStatus::Completed, Some("end_turn".into()))
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let transcript = rt.block_on(async {
        let store = SledStore::open(&data, Durability::Fsync).expect("open store");
        store
            .load(id.parse().expect("id"))
            .await
            .expect("load")
            .expect("session")
            .transcript
    });
    use overseer_actors::model::{CallState, TranscriptEntry};
    let states: Vec<CallState> = transcript
        .iter()
        .filter_map(|e| match &**e {
            TranscriptEntry::ToolResult { call } => Some(call.state),
            _ => None,
        })
        .collect();
    assert_eq!(
        states,
        [CallState::Cancelled],
        "the running call was stopped, not left running"
    );
    assert!(
        transcript
            .iter()
            .any(|e| matches!(&**e, TranscriptEntry::ModelChanged { to, .. } if to == "fast")),
        "{transcript:#?}"
    );
}

// ---- A question closed elsewhere (issue 26) ----------------------------------

/// `overseer run --approve ask` on a pseudo-terminal: stdin is its slave
/// side (so the run sees a terminal), stderr a pipe read as it comes.
struct Tty {
    child: std::process::Child,
    master: std::fs::File,
    stderr: std::sync::mpsc::Receiver<Vec<u8>>,
    seen: String,
}

impl Tty {
    fn run(cwd: &Path, args: &[&str]) -> Self {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
        cmd.args(args)
            .current_dir(cwd)
            .stdin(Stdio::from(pty.slave))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("RUST_LOG");
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("OVERSEER_") {
                cmd.env_remove(key);
            }
        }
        let mut child = cmd.spawn().expect("spawn overseer run");
        let mut err = child.stderr.take().expect("stderr");
        let (tx, stderr) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            master: std::fs::File::from(pty.master),
            stderr,
            seen: String::new(),
        }
    }

    /// Reads stderr until it holds `needle` after what earlier waits
    /// consumed; returns the text up to and including it. Bounded.
    fn wait_for(&mut self, what: &str, needle: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(at) = self.seen.find(needle) {
                let upto: String = self.seen.drain(..at + needle.len()).collect();
                return upto;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(bytes) => self.seen.push_str(&String::from_utf8_lossy(&bytes)),
                Err(_) => {
                    // A failed test leaves no process behind.
                    let _ = self.child.kill();
                    panic!("no {what} ({needle:?}) on stderr; so far:\n{}", self.seen)
                }
            }
        }
    }

    fn type_line(&mut self, line: &str) {
        use std::io::Write;
        self.master
            .write_all(format!("{line}\n").as_bytes())
            .expect("type on the terminal");
    }

    fn finish(self) -> Run {
        // Bounded: a run that never exits is killed, and fails below.
        let pid = self.child.id();
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if done
                .recv_timeout(std::time::Duration::from_secs(60))
                .is_err()
            {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        });
        let out = self.child.wait_with_output().expect("wait");
        let _ = done_tx.send(());
        let mut rest = self.seen;
        while let Ok(bytes) = self.stderr.recv() {
            rest.push_str(&String::from_utf8_lossy(&bytes));
        }
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: rest,
        }
    }
}

/// A lead whose own `current_time` calls are asked (no timeout to speak
/// of), delegating to `hasty`, whose call is asked at the root and times
/// out after a second.
fn closing_config(dir: &Path) -> PathBuf {
    let scenario = dir.join("closing.json");
    std::fs::write(
        &scenario,
        serde_json::json!({"agents": {
            "lead": [
                {"text": "Asking.", "tool_calls": [{"name": "delegate_task",
                    "arguments": {"agent": "hasty", "goal": "Read the clock."}}]},
                {"text": "Looking myself.", "tool_calls": [{"name": "current_time", "arguments": {}}]},
                {"text": "Lead done: {{tool_result}}"}
            ],
            "hasty": [
                {"text": "Reading.", "tool_calls": [{"name": "current_time", "arguments": {}}]},
                {"text": "Hasty: {{tool_result}}"}
            ]
        }})
        .to_string(),
    )
    .expect("write scenario");
    let config = dir.join("closing.toml");
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
tool_approvals = {{ current_time = true }}
subagents = ["hasty"]
child_approval = "propagate"

[[agents]]
name = "hasty"
tools = ["current_time"]
approval = "always"
approval_timeout_secs = 1
"#,
            scenario.display()
        ),
    )
    .expect("write config");
    config
}

/// On a terminal, a question whose call is decided elsewhere (here the
/// approval timeout of a subagent's call) ends with a line saying who
/// decided and how, and the next call's question is asked and answered;
/// a question whose turn Ctrl-C interrupts ends the same way.
#[test]
fn a_terminal_question_decided_elsewhere_ends_saying_who_decided() {
    let (tmp, _) = workdir();
    let config = closing_config(tmp.path()).display().to_string();
    let data = data_arg(tmp.path());
    let args = [
        "run",
        "--config",
        &config,
        "--agent",
        "lead",
        "--approve",
        "ask",
        "--data",
        &data,
        "go",
    ];
    let mut tty = Tty::run(tmp.path(), &args);
    // The subagent's call is asked, and nobody answers.
    tty.wait_for("the subagent's question", "? [y]es/[n]o/[e]dit: ");
    let closed = tty.wait_for(
        "the timed-out question's end",
        "denied by system: No approval decision received\n",
    );
    let line = closed.lines().last().unwrap_or_default();
    assert!(
        line.starts_with("question closed: current_time (call_"),
        "{closed}"
    );
    // The lead's own call is asked next, and the answer decides it.
    let asked = tty.wait_for("the lead's question", "? [y]es/[n]o/[e]dit: ");
    // The call is shown as what the tool will receive, then asked about.
    assert!(asked.contains("current_time (call_"), "{asked}");
    assert!(asked.contains(" will receive:\n{}\n"), "{asked}");
    assert!(asked.contains("approve current_time (call_"), "{asked}");
    tty.type_line("y");
    tty.wait_for("the acknowledgement", " approve\n");
    let run = tty.finish();
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    assert!(run.stdout.contains("Lead done: "), "{}", run.stdout);

    // Ctrl-C while a question is open: the interrupt ends it.
    let (tmp, _) = workdir();
    let config = closing_config(tmp.path()).display().to_string();
    let data = data_arg(tmp.path());
    let args = [
        "run",
        "--config",
        &config,
        "--agent",
        "lead",
        "--approve",
        "ask",
        "--data",
        &data,
        "go",
    ];
    let mut tty = Tty::run(tmp.path(), &args);
    tty.wait_for("the subagent's question", "? [y]es/[n]o/[e]dit: ");
    let sent = Command::new("kill")
        .args(["-INT", &tty.child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(sent.success());
    tty.wait_for(
        "the interrupted question's end",
        "question closed: current_time (call_",
    );
    let why = tty.wait_for("its reason", "\n");
    // The interrupt cancels the subagent, and with it its call.
    assert!(
        why.ends_with(") ended undecided (cancelled): cancelled: the session was cancelled\n"),
        "{why}"
    );
    let run = tty.finish();
    assert_eq!(run.code, Some(130), "stderr:\n{}", run.stderr);
}
