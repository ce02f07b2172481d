//! Issue 32, local models first-class: `overseer run --resume` (the binary,
//! as a process) continues a session on the provider route it was made with,
//! against a fake OpenAI-compatible server, and refuses, in one line, a
//! session whose route is no longer configured, rather than moving it to the
//! scripted demo provider. Also: log lines carry no colour codes when stderr
//! is not a terminal, and an interrupted request is counted.

use std::path::Path;
use std::process::{Command, Stdio};

use overseer::store::{Durability, SledStore};
use overseer_actors::model::{SessionHeader, SessionStatus};
use overseer_actors::store::CheckpointStore;

use super::*;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn session_id(&self) -> SessionId {
        self.stderr
            .lines()
            .find_map(|l| l.strip_prefix("session: "))
            .unwrap_or_else(|| panic!("no session line in stderr:\n{}", self.stderr))
            .trim()
            .parse()
            .unwrap()
    }
}

/// `overseer ARGS` in `cwd` (no config file there: the built-in defaults),
/// with a clean `OVERSEER_*` environment plus `env`, stdin not a terminal.
fn overseer(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OVERSEER_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().copied());
    cmd
}

fn finished(out: std::process::Output) -> Run {
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `cmd` to its end.
async fn run(mut cmd: Command) -> Run {
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    finished(out)
}

/// Runs `cmd`, presses Ctrl-C once its model request is streaming
/// (`started` says the server answered it, and the answer's first text has
/// reached stdout), and waits for it to end.
async fn interrupted(
    mut cmd: Command,
    started: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
) -> Run {
    use std::io::Read;
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().to_string();
    // stdout is read as it comes, on a thread of its own.
    let mut stdout = child.stdout.take().unwrap();
    let (shown_tx, mut shown) = tokio::sync::mpsc::unbounded_channel();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 1024];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            let _ = shown_tx.send(String::from_utf8_lossy(&all).into_owned());
        }
        all
    });
    let streaming = tokio::time::timeout(Duration::from_secs(60), async {
        started.recv().await?;
        while let Some(text) = shown.recv().await {
            if text.contains("Thinking about") {
                return Some(());
            }
        }
        None
    })
    .await;
    if !matches!(streaming, Ok(Some(()))) {
        let _ = Command::new("kill").args(["-9", &pid]).status();
        panic!("the run never streamed: {:?}", child.wait_with_output());
    }
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let mut run = finished(out);
    run.stdout = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    run
}

/// The stored header of session `id`.
async fn stored(data: &Path, id: SessionId) -> SessionHeader {
    let store = SledStore::open(data, Durability::Fsync).unwrap();
    store
        .load_header(id)
        .await
        .unwrap()
        .expect("the session is stored")
}

/// The stored transcript of session `id`.
async fn transcript(data: &Path, id: SessionId) -> Vec<TranscriptEntry> {
    let store = SledStore::open(data, Durability::Fsync).unwrap();
    let session = store
        .load(id)
        .await
        .unwrap()
        .expect("the session is stored");
    session.transcript.iter().map(|e| (**e).clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_resume_continues_a_session_on_the_provider_it_was_made_with() {
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let server = TestServer::start(move |n, _| match n {
        // A busy server first: the retry is logged (a warning on stderr).
        0 => Reply::Status(
            503,
            vec![("retry-after", "0")],
            json!({"error": {"message": "loading model", "type": "unavailable_error"}}).to_string(),
        ),
        // The answer starts, then hangs until the user presses Ctrl-C.
        1 | 3 => {
            let _ = started_tx.send(());
            Reply::Sse(
                vec![
                    Part::Bytes(oa_role()),
                    Part::Bytes(oa_text("Thinking about ")),
                ],
                End::Stall,
            )
        }
        _ => oa_text_reply(&["Resumed ", "on smollm2."]),
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let data_arg = data.display().to_string();
    let base = format!("{}/v1", server.base);
    // A key in the environment is not sent to a route with a base_url.
    let env = [
        ("RUST_LOG", "warn"),
        ("OPENAI_API_KEY", "sk-must-not-be-sent"),
    ];

    // A session on a local model, interrupted mid-answer.
    let first = interrupted(
        overseer(
            tmp.path(),
            &[
                "run",
                "--provider",
                "openai",
                "--base-url",
                &base,
                "--model",
                "smollm2",
                "--agent",
                "auto",
                "--approve",
                "auto",
                "--data",
                &data_arg,
                "What",
                "is",
                "up?",
            ],
            &env,
        ),
        &mut started,
    )
    .await;
    assert_eq!(first.code, Some(130), "{}", first.stderr);
    assert!(
        first.stderr.contains("retrying"),
        "no log line: {}",
        first.stderr
    );
    assert!(
        !first.stderr.contains('\u{1b}'),
        "colour codes in a log that is not a terminal: {:?}",
        first.stderr
    );
    let id = first.session_id();
    let header = stored(&data, id).await;
    // The configuration names the real route and model...
    let route = format!("openai:smollm2@{base}");
    assert_eq!(header.config.model, route);
    let recorded = header.config.route.clone().expect("the route is recorded");
    assert_eq!(recorded["provider"], "openai");
    assert_eq!(recorded["model"], "smollm2");
    assert_eq!(recorded["base_url"], json!(base));
    assert_eq!(recorded["max_tokens"], 4096);
    assert!(
        !recorded.to_string().contains("sk-"),
        "no secret: {recorded}"
    );
    // ...and both requests made are counted: the 503 and the interrupted one.
    assert_eq!(header.last_stop_reason, Some(StopReason::Interrupted));
    assert_eq!(header.usage.provider_requests, 2, "{:?}", header.usage);
    assert!(header.usage.output_tokens > 0, "{:?}", header.usage);

    // `--model` alone means a model id on a resume as on a new run, applied
    // to the session's own route: same server, another model. No PROMPT:
    // only the switch, recorded.
    let q8 = format!("openai:smollm2-q8@{base}");
    let switch = run(overseer(
        tmp.path(),
        &[
            "run",
            "--resume",
            &id.to_string(),
            "--model",
            "smollm2-q8",
            "--approve",
            "auto",
            "--data",
            &data_arg,
        ],
        &env,
    ))
    .await;
    assert_eq!(switch.code, Some(0), "{}", switch.stderr);
    assert!(
        switch
            .stderr
            .contains(&format!("model route: {route} -> {q8}")),
        "{}",
        switch.stderr
    );
    assert_eq!(server.count(), 2, "a switch sends nothing");

    // Resumed with the printed hint alone: on the recorded route, not the demo.
    let next = run(overseer(
        tmp.path(),
        &[
            "run",
            "--resume",
            &id.to_string(),
            "--approve",
            "auto",
            "--data",
            &data_arg,
            "Carry",
            "on",
        ],
        &env,
    ))
    .await;
    assert_eq!(next.code, Some(0), "{}", next.stderr);
    assert_eq!(next.stdout.trim(), "Resumed on smollm2.");
    assert_eq!(server.count(), 3);
    let request = server.request(2);
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.body["model"], "smollm2-q8");
    assert!(request.headers.get("authorization").is_none());
    let sent: Vec<(String, String)> = request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .filter(|(role, _)| role != "system")
        .collect();
    let pair = |r: &str, c: &str| (r.to_owned(), c.to_owned());
    assert_eq!(
        sent,
        vec![
            pair("user", "What is up?"),
            pair("assistant", "Thinking about "),
            pair("user", "Carry on"),
        ]
    );
    let header = stored(&data, id).await;
    assert_eq!(header.status, SessionStatus::Completed);
    assert_eq!(header.config.model, q8, "no silent switch");
    assert_eq!(header.config.route.as_ref().unwrap()["model"], "smollm2-q8");
    assert_eq!(header.usage.provider_requests, 3);

    // A session on a configured route that the configuration then loses is
    // refused in one line, and nothing is sent anywhere.
    let with_route = tmp.path().join("with.toml");
    std::fs::write(
        &with_route,
        format!(
            "[[models]]\nname = \"local\"\nprovider = \"openai\"\nbase_url = \"{base}\"\nmodel = \"smollm2\"\n\n[[agents]]\nname = \"auto\"\napproval = \"auto\"\n"
        ),
    )
    .unwrap();
    let without = tmp.path().join("without.toml");
    std::fs::write(
        &without,
        "[[agents]]\nname = \"auto\"\napproval = \"auto\"\n",
    )
    .unwrap();
    let on_local = interrupted(
        overseer(
            tmp.path(),
            &[
                "run",
                "--config",
                &with_route.display().to_string(),
                "--model",
                "local",
                "--agent",
                "auto",
                "--approve",
                "auto",
                "--data",
                &data_arg,
                "Hi",
            ],
            &[],
        ),
        &mut started,
    )
    .await;
    assert_eq!(on_local.code, Some(130), "{}", on_local.stderr);
    let lost = on_local.session_id();
    assert_eq!(stored(&data, lost).await.config.model, "local");
    let refused = run(overseer(
        tmp.path(),
        &[
            "run",
            "--config",
            &without.display().to_string(),
            "--resume",
            &lost.to_string(),
            "--approve",
            "auto",
            "--data",
            &data_arg,
            "Again",
        ],
        &[],
    ))
    .await;
    assert_eq!(refused.code, Some(1), "{}", refused.stderr);
    assert_eq!(
        refused.stderr.lines().last().unwrap_or_default(),
        format!(
            "error: session {lost} runs on model route 'local', which is not configured \
             (configured: scripted): add it as a [[models]] route, or continue the session on \
             another with --model ROUTE or --provider/--base-url/--model"
        )
    );
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    assert_eq!(server.count(), 4);
    let last = transcript(&data, lost).await;
    assert!(
        matches!(last.last(), Some(TranscriptEntry::Assistant { text, .. }) if text == "Thinking about "),
        "{last:?}"
    );

    // `--model` means the same with --resume as on a new run: the route
    // (here the flags' route again) the session continues on.
    let switched = run(overseer(
        tmp.path(),
        &[
            "run",
            "--resume",
            &lost.to_string(),
            "--provider",
            "openai",
            "--base-url",
            &base,
            "--model",
            "smollm2",
            "--approve",
            "auto",
            "--data",
            &data_arg,
            "Again",
        ],
        &[],
    ))
    .await;
    assert_eq!(switched.code, Some(0), "{}", switched.stderr);
    assert!(
        switched
            .stderr
            .contains(&format!("model route: local -> {route}")),
        "{}",
        switched.stderr
    );
    assert_eq!(switched.stdout.trim(), "Resumed on smollm2.");
    assert_eq!(server.count(), 5);
}
