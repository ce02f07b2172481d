//! `overseer serve`, `overseer token` and `overseer sessions` as processes:
//! the quick start of the README, a graceful SIGTERM that keeps a pending
//! approval decidable after a restart, and the start-up refusals.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::served::{self, Served};

const BIN: &str = env!("CARGO_BIN_EXE_overseer");
const SECRET: &str = "serve-test-secret-serve-test-secret!";

/// Starts `overseer serve` on a free loopback port and waits for its
/// "listening on" line.
fn serve(data: &Path) -> Served {
    serve_with(data, &[])
}

/// [`serve`] with extra arguments (e.g. `--config FILE`).
fn serve_with(data: &Path, extra: &[&std::ffi::OsStr]) -> Served {
    let mut cmd = served::command();
    cmd.arg("--data")
        .arg(data)
        .args(extra)
        .env("OVERSEER_JWT_SECRET", SECRET);
    Served::start(cmd).unwrap()
}

fn token() -> String {
    let out = Command::new(BIN)
        .args([
            "token",
            "--tenant",
            "acme",
            "--sub",
            "alice",
            "--scopes",
            "sessions:read,sessions:write,approvals:write",
        ])
        .env("OVERSEER_JWT_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let token = stdout.trim().to_owned();
    assert_eq!(stdout.lines().count(), 1, "only the token on stdout");
    assert_eq!(token.split('.').count(), 3, "a JWT");
    token
}

fn client(url: &str, token: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .arg("sessions")
        .args(["--url", url])
        .args(args)
        .env("OVERSEER_TOKEN", token)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls the client's list until `id` has `status` (a bounded number of real
/// queries; what decides the outcome is the server's answer).
fn until_status(url: &str, token: &str, id: &str, status: &str) {
    for _ in 0..500 {
        let (ok, out, err) = client(url, token, &["list"]);
        assert!(ok, "{err}");
        if out
            .lines()
            .any(|l| l.starts_with(id) && l.split('\t').nth(1) == Some(status))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("session {id} never reached {status}");
}

fn sigterm(mut served: Served) {
    let pid = served.child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let status = served.child.wait().unwrap();
    assert!(
        status.success(),
        "graceful shutdown exits 0, got {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_then_sigterm_and_restart_keep_the_approval_decidable() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path());
    let token = token();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let http = reqwest::Client::new();
    let created: Value = crate::common::send(
        http.post(format!("{}/v1/sessions", served.url))
            .bearer_auth(&token)
            .json(&json!({"agent": "assistant", "prompt": "What time is it?"})),
    )
    .await
    .unwrap()
    .1;
    let id = created["id"].as_str().unwrap().to_owned();
    until_status(&served.url, &token, &id, "awaiting_approval");

    // SIGTERM: the server stops gracefully; the pending approval is on disk.
    sigterm(served);
    let served = serve(dir.path());
    let (ok, out, err) = client(&served.url, &token, &["approve", &id]);
    assert!(ok, "{err}");
    assert!(out.starts_with("approved call_"), "{out}");
    until_status(&served.url, &token, &id, "awaiting_input");
    let (ok, shown, err) = client(&served.url, &token, &["show", &id]);
    assert!(ok, "{err}");
    assert!(shown.contains("Here is what the clock says"), "{shown}");
    // The approver is the token's subject.
    assert!(shown.contains("\"by\": \"alice\""), "{shown}");

    // A decided call cannot be decided again: the server's 409 comes through.
    let (ok, _, err) = client(&served.url, &token, &["approve", &id]);
    assert!(!ok);
    assert!(err.contains("no pending approvals"), "{err}");
    let (ok, out, _) = client(&served.url, &token, &["cancel", &id]);
    assert!(ok);
    assert!(out.starts_with("cancelled"));
    sigterm(served);
}

#[test]
fn serve_refuses_auth_none_off_loopback_and_a_missing_secret() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "[http]\nauth = \"none\"\n[[agents]]\nname = \"a\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--config"])
        .arg(&config)
        .arg("--data")
        .arg(dir.path().join("d"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loopback"), "{err}");
    assert!(!dir.path().join("d").exists(), "nothing was opened");

    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("d2"))
        .env_remove("OVERSEER_JWT_SECRET")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("OVERSEER_JWT_SECRET"), "{err}");
}

/// Waits for the process to exit, at most `PATIENCE`, polling its status.
fn wait_bounded(child: &mut Child) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("overseer serve did not exit within {PATIENCE:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The longest any wait here may take; it only turns a hang into a failure.
const PATIENCE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_stalled_connection_open_still_exits_and_keeps_the_approval() {
    let dir = tempfile::tempdir().unwrap();
    // The checked-in configuration, with a short shutdown grace and a header
    // timeout far longer than the test, so only the grace can end the stall.
    let config =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/overseer.toml"))
            .unwrap();
    assert!(config.contains("shutdown_grace_secs = 10\n"));
    let config = config
        .replace("shutdown_grace_secs = 10\n", "shutdown_grace_secs = 1\n")
        .replace(
            "header_read_timeout_secs = 10\n",
            "header_read_timeout_secs = 3600\n",
        );
    let config_path = dir.path().join("overseer.toml");
    std::fs::write(&config_path, config).unwrap();
    let data = dir.path().join("data");
    let config_arg = [std::ffi::OsStr::new("--config"), config_path.as_os_str()];
    let served = serve_with(&data, &config_arg);
    let token = token();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let created: Value = crate::common::send(
        reqwest::Client::new()
            .post(format!("{}/v1/sessions", served.url))
            .bearer_auth(&token)
            .json(&json!({"agent": "assistant", "prompt": "What time is it?"})),
    )
    .await
    .unwrap()
    .1;
    let id = created["id"].as_str().unwrap().to_owned();
    until_status(&served.url, &token, &id, "awaiting_approval");

    // A client that never finishes its request.
    let mut stalled =
        std::net::TcpStream::connect(served.url.trim_start_matches("http://")).unwrap();
    std::io::Write::write_all(&mut stalled, b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n").unwrap();
    // A finished request on another connection proves the stalled one was
    // accepted before it (connections are accepted in order).
    until_status(&served.url, &token, &id, "awaiting_approval");

    let mut served = served;
    let pid = served.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = wait_bounded(&mut served.child);
    assert!(
        status.success(),
        "graceful shutdown exits 0, got {status:?}"
    );
    drop(stalled);

    // The approval asked before the shutdown is still pending after it.
    let served = serve_with(&data, &config_arg);
    let (ok, out, err) = client(&served.url, &token, &["approve", &id]);
    assert!(ok, "{err}");
    assert!(out.starts_with("approved call_"), "{out}");
    sigterm(served);
}
