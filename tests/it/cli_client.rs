//! `overseer token` and `overseer sessions` as processes: refused token
//! requests (exit status 2, one line naming the flag), a closed stdout, and
//! stored text with control characters shown escaped, never raw, against a
//! real server on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::{Command, Output, Stdio};

use common::{send, token, Server, ALL};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_overseer");

/// A secret that passes every check.
const GOOD_SECRET: &str = "token-test-secret-0123456789abcdefghijkl";

fn token_cmd(secret: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("token")
        .args(args)
        .env("OVERSEER_JWT_SECRET", secret)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Asserts a refusal: exit status 2, nothing on stdout, one `error:` line on
/// stderr that contains `needle`.
fn assert_refused(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(out.stdout.is_empty(), "no token may be printed");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains(needle), "expected '{needle}' in: {stderr}");
}

#[test]
fn token_refuses_what_would_make_a_useless_or_dangerous_token() {
    let base = ["--tenant", "acme", "--sub", "alice", "--scopes", "admin"];
    let ok = token_cmd(GOOD_SECRET, &base);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    // No scope at all.
    let out = token_cmd(
        GOOD_SECRET,
        &["--tenant", "acme", "--sub", "alice", "--scopes", ""],
    );
    assert_refused(&out, "--scopes: at least one scope is required");
    let out = token_cmd(
        GOOD_SECRET,
        &["--tenant", "acme", "--sub", "alice", "--scopes", " , "],
    );
    assert_refused(&out, "--scopes");
    // A lifetime that would overflow (and so never expire), and zero.
    let mut args = base.to_vec();
    args.extend(["--ttl", "18446744073709551615"]);
    assert_refused(
        &token_cmd(GOOD_SECRET, &args),
        "--ttl: the TTL must be between 1 and",
    );
    let mut args = base.to_vec();
    args.extend(["--ttl", "0"]);
    assert_refused(&token_cmd(GOOD_SECRET, &args), "--ttl");
    // Control characters in the claims.
    let out = token_cmd(
        GOOD_SECRET,
        &["--tenant", "acme\nx", "--sub", "alice", "--scopes", "admin"],
    );
    assert_refused(
        &out,
        "--tenant: the 'tenant' claim must not contain control characters",
    );
    let out = token_cmd(
        GOOD_SECRET,
        &[
            "--tenant",
            "acme",
            "--sub",
            "al\u{1b}[2Jice",
            "--scopes",
            "admin",
        ],
    );
    assert_refused(&out, "--sub");
    let out = token_cmd(
        GOOD_SECRET,
        &["--tenant", "", "--sub", "alice", "--scopes", "admin"],
    );
    assert_refused(&out, "--tenant");
    // A long but guessable secret, and a short one.
    assert_refused(&token_cmd(&" ".repeat(32), &base), "distinct byte");
    assert_refused(&token_cmd(&"a".repeat(64), &base), "distinct byte");
    assert_refused(&token_cmd("short", &base), "at least 32 bytes");
    // No secret.
    let out = Command::new(BIN)
        .arg("token")
        .args(base)
        .env_remove("OVERSEER_JWT_SECRET")
        .output()
        .unwrap();
    assert_refused(&out, "OVERSEER_JWT_SECRET");
}

#[test]
fn token_into_a_closed_pipe_is_an_error_not_a_panic() {
    // The read end is closed before the process starts, so its write fails
    // for certain (EPIPE; Rust ignores SIGPIPE).
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(BIN)
        .args([
            "token", "--tenant", "acme", "--sub", "alice", "--scopes", "admin",
        ])
        .env("OVERSEER_JWT_SECRET", GOOD_SECRET)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.starts_with("error: cannot write to stdout"),
        "{stderr}"
    );
}

/// Runs `overseer sessions --url URL ARGS…` with `token`.
fn sessions(url: &str, token: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("sessions")
        .args(["--url", url])
        .args(args)
        .env("OVERSEER_TOKEN", token)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Whether `bytes` hold a character no terminal should receive raw.
fn has_raw_controls(text: &str) -> bool {
    text.chars().any(|c| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stored_text_with_control_characters_reaches_the_terminal_escaped() -> anyhow::Result<()> {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let title = "evil\u{1b}[2J\u{1b}]0;pwned\u{7}\u{9b}31m\u{202e}txt.exe\ttab\nline";
    let (status, created) = send(s.post(
        "/v1/sessions",
        &t,
        &json!({"agent": "chat", "title": title, "prompt": "say \u{1b}[31mred"}),
    ))
    .await?;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();

    // list: one line per session, every cell escaped.
    let out = sessions(&s.base, &t, &["list"]);
    let stdout = String::from_utf8(out.stdout)?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !has_raw_controls(&stdout),
        "raw control characters: {stdout:?}"
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout:?}");
    let cells: Vec<&str> = stdout.trim_end_matches('\n').split('\t').collect();
    assert_eq!(
        cells.len(),
        4,
        "a tab in the title must not add a column: {cells:?}"
    );
    assert_eq!(
        cells[3],
        "evil⟨U+001B⟩[2J⟨U+001B⟩]0;pwned⟨U+0007⟩⟨U+009B⟩31m⟨U+202E⟩txt.exe⟨U+0009⟩tab⟨U+000A⟩line"
    );

    // show: JSON, still parseable, with the title intact once decoded.
    let out = sessions(&s.base, &t, &["show", &id]);
    let stdout = String::from_utf8(out.stdout)?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !has_raw_controls(&stdout),
        "raw control characters: {stdout:?}"
    );
    let shown: Value = serde_json::from_str(&stdout)?;
    assert_eq!(shown["title"], title);
    assert_eq!(shown["transcript"][0]["text"], "say \u{1b}[31mred");

    // An error echoed from the server (it quotes the bad id back).
    let out = sessions(&s.base, &t, &["show", "\u{1b}[2Jnot-an-id"]);
    let stderr = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    assert!(
        !has_raw_controls(&stderr),
        "raw control characters: {stderr:?}"
    );
    assert!(stderr.contains("⟨U+001B⟩[2Jnot-an-id"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_interrupt_and_model_act_on_a_running_server() -> anyhow::Result<()> {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let (id, _) = s.create_pending(&t).await?;

    let out = sessions(&s.base, &t, &["interrupt", &id]);
    let stdout = String::from_utf8(out.stdout)?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, format!("interrupted {id}: awaiting_input\n"));
    let (_, state) = send(s.get(&format!("/v1/sessions/{id}"), &t)).await?;
    assert_eq!(state["last_stop_reason"], "interrupted");

    let out = sessions(&s.base, &t, &["model", &id, "nope"]);
    let stderr = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    assert!(
        stderr.starts_with(
            "error: server answered 400: model: 'nope' is not a configured model route"
        ),
        "{stderr}"
    );
    let out = sessions(&s.base, &t, &["model", &id, "scripted"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout)?,
        format!("{id} now uses model route scripted\n")
    );
    // A reader's token cannot interrupt.
    let reader = token("acme", "rita", &["sessions:read"]);
    let out = sessions(&s.base, &reader, &["interrupt", &id]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("server answered 403"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.stop().await
}

/// Runs `overseer sessions ARGS…` with no server and no token.
fn offline(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("sessions")
        .args(args)
        .env_remove("OVERSEER_TOKEN")
        .env_remove("OVERSEER_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_list_and_show_read_a_store_with_no_server() -> anyhow::Result<()> {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let chat = s.create(&t, "chat", Some("hello")).await?;
    let mut events = common::Sse::open(&s, &t, &chat, None).await?;
    events.until_type("turn_ended").await?;
    let (pending, _) = s.create_pending(&t).await?;
    let other = s.create(&token("globex", "gus", ALL), "chat", None).await?;
    let online_list = sessions(&s.base, &t, &["list"]);
    assert!(online_list.status.success());
    let online_show = sessions(&s.base, &t, &["show", &chat]);
    assert!(online_show.status.success());
    let online_pending = sessions(&s.base, &t, &["show", &pending]);

    // While the server holds the directory: one clear line, non-zero.
    let dir_of = |s: &Server| s.data_dir().display().to_string();
    let dir = dir_of(&s);
    let out = offline(&["list", "--data", &dir]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: the store in {dir} is in use by another process, e.g. a running overseer serve: ask that server instead")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let kept = s.stop_keep_data().await?;
    let dir = kept.path().display().to_string();
    // The same rows and the same JSON as the server's answers.
    let out = offline(&["list", "--data", &dir, "--tenant", "acme"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout)?,
        String::from_utf8(online_list.stdout)?
    );
    let out = offline(&["show", &chat, "--data", &dir]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout)?,
        String::from_utf8(online_show.stdout)?
    );
    let out = offline(&["show", &pending, "--data", &dir]);
    assert_eq!(
        String::from_utf8(out.stdout)?,
        String::from_utf8(online_pending.stdout)?
    );
    // Every tenant without --tenant, and the filters of the server's list.
    let out = offline(&["list", "--data", &dir]);
    let all = String::from_utf8(out.stdout)?;
    assert_eq!(all.lines().count(), 3, "{all}");
    assert!(all.contains(&other), "{all}");
    let out = offline(&["list", "--data", &dir, "--status", "awaiting_approval"]);
    let waiting = String::from_utf8(out.stdout)?;
    assert_eq!(waiting.lines().count(), 1, "{waiting}");
    assert!(
        waiting.starts_with(&format!("{pending}\tawaiting_approval\tops\t")),
        "{waiting}"
    );

    // Clear one-line errors for what cannot be shown.
    let missing = "0190f5b2-6f3a-7cc1-9a39-3f1e8e0f4a11";
    let out = offline(&["show", missing, "--data", &dir]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("error: session {missing} not found in {dir}\n")
    );
    let out = offline(&["list", "--data", &dir, "--status", "sleeping"]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--status: 'sleeping' is not a session status"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let empty = tempfile::tempdir()?;
    let out = offline(&["list", "--data", &empty.path().display().to_string()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a store directory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!empty.path().join("db").exists(), "reading created nothing");
    Ok(())
}
