//! Backups, restores and the layout-upgrade gate, as an operator runs them:
//! `overseer serve` as a process on a real sled directory, `overseer store
//! backup|restore` as processes, the HTTP API over loopback.
//!
//! The backup under load: sessions are created and approved on the server
//! while `store backup --url` streams (the client is stopped mid-stream
//! while writes are acknowledged, so writes provably go on during the
//! backup); the backup is restored into a new directory and a server
//! started there: every session acknowledged before the backup began is
//! there at a checkpoint at least as new, and a parked one is approved and
//! finishes. Then the refusals: a non-empty target, a directory that is not
//! a backup, a token without `admin`; and the upgrade gate on a store
//! written by the binary of an older layout (the layout-4 fixture).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::served::{self, Served};

const BIN: &str = env!("CARGO_BIN_EXE_overseer");
const SECRET: &str = "backup-test-secret-backup-test-secret!";
/// How long a process may take to start listening before the test fails.
const PATIENCE: Duration = Duration::from_secs(120);

/// SIGTERM, and a graceful exit.
trait Stop {
    fn stop(self);
}

impl Stop for Served {
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "graceful shutdown exits 0: {status:?}");
    }
}

/// Starts `overseer serve` on `data` (with `extra` arguments) and waits for
/// its "listening on" line; its stderr is kept in `log`.
fn serve(data: &Path, extra: &[&str]) -> Served {
    let mut cmd = served::command();
    cmd.arg("--data")
        .arg(data)
        .args(extra)
        .env("OVERSEER_JWT_SECRET", SECRET)
        .env("RUST_LOG", "info");
    Served::start_with(cmd, "http", PATIENCE).unwrap()
}

fn token(scopes: &str) -> String {
    let out = Command::new(BIN)
        .args([
            "token", "--tenant", "acme", "--sub", "ops", "--scopes", scopes,
        ])
        .env("OVERSEER_JWT_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `overseer store ARGS` with `OVERSEER_TOKEN`.
fn store_cmd(args: &[&str], token: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("store")
        .args(args)
        .env("OVERSEER_TOKEN", token)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn store(args: &[&str], token: &str) -> Output {
    store_cmd(args, token).output().unwrap()
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn get(client: &reqwest::Client, url: &str, token: &str) -> (u16, Value) {
    crate::common::send(client.get(url).bearer_auth(token))
        .await
        .unwrap()
}

async fn post(client: &reqwest::Client, url: &str, token: &str, body: &Value) -> (u16, Value) {
    crate::common::send(client.post(url).bearer_auth(token).json(body))
        .await
        .unwrap()
}

/// Creates a session that asks for the time: it parks awaiting approval.
async fn create(client: &reqwest::Client, base: &str, token: &str) -> String {
    let (status, v) = post(
        client,
        &format!("{base}/v1/sessions"),
        token,
        &json!({"agent": "assistant", "prompt": "What time is it?"}),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

/// Polls until session `id` has `status` (a bounded number of real reads);
/// returns the session.
async fn until_status(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    id: &str,
    status: &str,
) -> Value {
    for _ in 0..2000 {
        let (code, v) = get(client, &format!("{base}/v1/sessions/{id}"), token).await;
        assert_eq!(code, 200, "{v}");
        if v["status"] == status {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("session {id} never reached {status}");
}

/// Approves every pending call of `id`; the answer comes once the decision
/// is checkpointed.
async fn approve(client: &reqwest::Client, base: &str, token: &str, id: &str) {
    let (code, v) = get(client, &format!("{base}/v1/sessions/{id}/approvals"), token).await;
    assert_eq!(code, 200, "{v}");
    let mut decisions = serde_json::Map::new();
    for call in v["pending"].as_array().unwrap() {
        decisions.insert(
            call["call_id"].as_str().unwrap().to_owned(),
            json!({"decision": "approve"}),
        );
    }
    assert!(!decisions.is_empty(), "{id} has nothing pending: {v}");
    let (code, v) = post(
        client,
        &format!("{base}/v1/sessions/{id}/approvals"),
        token,
        &json!({ "decisions": decisions }),
    )
    .await;
    assert_eq!(code, 200, "{v}");
}

/// What a session looked like when it was acknowledged.
struct Acked {
    id: String,
    status: String,
    last_event_seq: u64,
}

async fn acked(client: &reqwest::Client, base: &str, token: &str, id: &str, status: &str) -> Acked {
    let v = until_status(client, base, token, id, status).await;
    Acked {
        id: id.to_owned(),
        status: status.to_owned(),
        last_event_seq: v["last_event_seq"].as_u64().unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_every_acknowledged_session_runnable() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let served = serve(&data, &[]);
    let base = served.url.clone();
    let user = token("sessions:read,sessions:write,approvals:write");
    let admin = token("admin");
    let client = http();

    // Acknowledged before the backup: parked ones, and finished ones.
    let mut before = Vec::new();
    for i in 0..12 {
        let id = create(&client, &base, &user).await;
        let parked = acked(&client, &base, &user, &id, "awaiting_approval").await;
        if i % 2 == 0 {
            approve(&client, &base, &user, &id).await;
            before.push(acked(&client, &base, &user, &id, "awaiting_input").await);
        } else {
            before.push(parked);
        }
    }

    // Load: sessions created and approved for as long as the backup runs.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let load = {
        let (client, base, user, stop, done) = (
            client.clone(),
            base.clone(),
            user.clone(),
            stop.clone(),
            done.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let id = create(&client, &base, &user).await;
                until_status(&client, &base, &user, &id, "awaiting_approval").await;
                approve(&client, &base, &user, &id).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    while done.load(Ordering::Relaxed) < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The backup starts; once it has its directory (the server has begun
    // streaming) the client is stopped, and writes are acknowledged while
    // the backup is under way: a parked session of `before` is approved
    // (its checkpoint moves past the acknowledged one) and new ones made.
    let backup = root.path().join("backup");
    let mut running = store_cmd(
        &["backup", "--url", &base, "--to", backup.to_str().unwrap()],
        &admin,
    )
    .spawn()
    .unwrap();
    let pid = running.id().to_string();
    for _ in 0..6000 {
        if backup.join("store").exists() || running.try_wait().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let paused = Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    assert!(paused.success());
    let moved = before
        .iter()
        .find(|a| a.status == "awaiting_approval")
        .unwrap();
    approve(&client, &base, &user, &moved.id).await;
    let during = done.load(Ordering::Relaxed);
    for _ in 0..3 {
        create(&client, &base, &user).await;
    }
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    let out = running.wait_with_output().unwrap();
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.starts_with("backed up "), "{stdout}");
    eprintln!(
        "{stdout}(load: {} sessions approved before the pause, {} in all)",
        during,
        done.load(Ordering::Relaxed)
    );
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(backup.join("overseer-backup.json")).unwrap())
            .unwrap();
    assert!(manifest["sessions"].as_u64().unwrap() >= before.len() as u64);
    served.stop();

    // Restored into a new directory, served from there.
    let restored = root.path().join("restored");
    let out = store(
        &[
            "restore",
            "--from",
            backup.to_str().unwrap(),
            "--to",
            restored.to_str().unwrap(),
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("restored "),
        "{}",
        text(&out.stdout)
    );
    let served = serve(&restored, &[]);
    let base = served.url.clone();
    let mut parked = Vec::new();
    for a in &before {
        let (code, v) = get(&client, &format!("{base}/v1/sessions/{}", a.id), &user).await;
        assert_eq!(code, 200, "{} is in the backup: {v}", a.id);
        let seq = v["last_event_seq"].as_u64().unwrap();
        assert!(
            seq >= a.last_event_seq,
            "{} at event {seq}, older than the acknowledged {}",
            a.id,
            a.last_event_seq
        );
        let status = v["status"].as_str().unwrap();
        if seq == a.last_event_seq {
            assert_eq!(status, a.status, "{} at the acknowledged checkpoint", a.id);
        }
        if status == "awaiting_approval" {
            parked.push(a.id.clone());
        }
    }
    assert!(!parked.is_empty(), "the backup holds parked sessions");
    for id in &parked {
        approve(&client, &base, &user, id).await;
        let v = until_status(&client, &base, &user, id, "awaiting_input").await;
        assert!(
            v.to_string().contains("Here is what the clock says"),
            "{id} finished its turn: {v}"
        );
    }
    served.stop();
    let out = Command::new(BIN)
        .args(["store", "check"])
        .arg(&restored)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_backups_and_restores_are_refused_naming_what_is_wrong() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let served = serve(&data, &[]);
    let user = token("sessions:read,sessions:write,approvals:write");
    let admin = token("admin");
    let client = http();
    let id = create(&client, &served.url, &user).await;
    until_status(&client, &served.url, &user, &id, "awaiting_approval").await;

    // A token without `admin`: 403, from the API and through the client,
    // and no directory is left behind.
    let (status, body) = crate::common::send(
        client
            .post(format!("{}/v1/admin/backup", served.url))
            .bearer_auth(&user),
    )
    .await
    .unwrap();
    assert_eq!(status, 403);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("admin"),
        "{body}"
    );
    let target = root.path().join("b1");
    let out = store(
        &[
            "backup",
            "--url",
            &served.url,
            "--to",
            target.to_str().unwrap(),
        ],
        &user,
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("403"), "{err}");
    assert!(!target.exists(), "nothing was kept");

    // The target exists and is not empty: refused, naming it, untouched.
    let full = root.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("keep.txt"), "mine").unwrap();
    let out = store(
        &[
            "backup",
            "--url",
            &served.url,
            "--to",
            full.to_str().unwrap(),
        ],
        &admin,
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{}: exists and is not empty", full.display())),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 1);

    // A store a running server holds cannot be backed up offline.
    let out = store(
        &[
            "backup",
            "--data",
            data.to_str().unwrap(),
            "--to",
            root.path().join("b2").to_str().unwrap(),
        ],
        "",
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("in use"),
        "{}",
        text(&out.stderr)
    );
    served.stop();

    // Offline, once stopped: a backup that restores.
    let offline = root.path().join("offline");
    let out = store(
        &[
            "backup",
            "--data",
            data.to_str().unwrap(),
            "--to",
            offline.to_str().unwrap(),
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("backed up 1 session(s)"),
        "{}",
        text(&out.stdout)
    );

    // Restoring from a directory that is not a backup: a store directory
    // (no manifest), and a backup whose store is gone.
    let into = root.path().join("into");
    let out = store(
        &[
            "restore",
            "--from",
            data.to_str().unwrap(),
            "--to",
            into.to_str().unwrap(),
        ],
        "",
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{}: not an overseer backup", data.display()))
            && err.contains("no overseer-backup.json"),
        "{err}"
    );
    assert!(!into.exists());
    let hollow = root.path().join("hollow");
    std::fs::create_dir(&hollow).unwrap();
    std::fs::copy(
        offline.join("overseer-backup.json"),
        hollow.join("overseer-backup.json"),
    )
    .unwrap();
    let out = store(
        &[
            "restore",
            "--from",
            hollow.to_str().unwrap(),
            "--to",
            into.to_str().unwrap(),
        ],
        "",
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("store/db is missing"),
        "{}",
        text(&out.stderr)
    );

    // Into a non-empty store: refused without --force; with it, moved aside.
    let out = store(
        &[
            "restore",
            "--from",
            offline.to_str().unwrap(),
            "--to",
            full.to_str().unwrap(),
        ],
        "",
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{}: exists and is not empty", full.display()))
            && err.contains("--force"),
        "{err}"
    );
    let out = store(
        &[
            "restore",
            "--from",
            offline.to_str().unwrap(),
            "--to",
            full.to_str().unwrap(),
            "--force",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let moved = text(&out.stdout);
    let aside = moved
        .lines()
        .find_map(|l| l.split(" to ").nth(1))
        .unwrap()
        .to_owned();
    assert_eq!(
        std::fs::read_to_string(Path::new(&aside).join("keep.txt")).unwrap(),
        "mine"
    );
    let served = serve(&full, &[]);
    until_status(&client, &served.url, &user, &id, "awaiting_approval").await;
    // Not even --force restores under a running server.
    let out = store(
        &[
            "restore",
            "--from",
            offline.to_str().unwrap(),
            "--to",
            full.to_str().unwrap(),
            "--force",
        ],
        "",
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{}: in use", full.display())),
        "{err}"
    );
    until_status(&client, &served.url, &user, &id, "awaiting_approval").await;
    served.stop();
}

/// A copy at `to` of `tests/fixtures/store-format-4/`: a directory the
/// binary of layout 4 wrote, with session [`FIXTURE_4_PARKED`] (tenant
/// `acme`) parked on an approval (see `tests/fixtures/README.md`).
fn layout_4_fixture(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-format-4");
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

const FIXTURE_4_PARKED: &str = "01a23ef0-4332-710c-8c08-36724ce68229";

fn layout_of(dir: &Path) -> u32 {
    let db = open_raw(dir);
    let raw = db
        .open_tree("meta")
        .unwrap()
        .get("format_version")
        .unwrap()
        .unwrap();
    u32::from_be_bytes(raw.as_ref().try_into().unwrap())
}

/// Opens a closed store directory with sled directly, waiting for the lock
/// a process that just exited may still hold.
fn open_raw(dir: &Path) -> sled::Db {
    for _ in 0..100 {
        match sled::Config::new().path(dir).open() {
            Ok(db) => return db,
            Err(e) if e.to_string().contains("could not acquire lock") => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the store's lock was never released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_layout_is_upgraded_only_with_upgrade_and_a_copy_is_kept() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let copy = root.path().join("data.pre-upgrade-format-4");
    let user = token("sessions:read,sessions:write,approvals:write");
    let client = http();
    layout_4_fixture(&data);
    let id = FIXTURE_4_PARKED.to_owned();

    // Without --upgrade: refused in one line saying what would change and
    // where the copy would go; nothing written.
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .env("OVERSEER_JWT_SECRET", SECRET)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    let refusal: Vec<&str> = err.lines().filter(|l| l.contains("--upgrade")).collect();
    assert_eq!(refusal.len(), 1, "{err}");
    assert!(
        refusal[0].contains("layout version 4")
            && refusal[0].contains(&format!("to layout {}", overseer::store::sled_layout()))
            && refusal[0].contains(&copy.display().to_string()),
        "{err}"
    );
    assert_eq!(layout_of(&data), 4, "nothing was upgraded");
    assert!(!copy.exists());

    // With it: the copy first (the log says where), then the upgrade.
    let served = serve(&data, &["--upgrade"]);
    let log = served.log.lock().unwrap().join("\n");
    assert!(
        log.lines()
            .any(|l| l.contains("upgrading the store's layout")
                && l.contains(&copy.display().to_string())),
        "{log}"
    );
    until_status(&client, &served.url, &user, &id, "awaiting_approval").await;
    approve(&client, &served.url, &user, &id).await;
    until_status(&client, &served.url, &user, &id, "awaiting_input").await;
    served.stop();
    assert_eq!(layout_of(&data), overseer::store::sled_layout());
    // The copy is the store as it was: layout 4, the session parked.
    assert_eq!(layout_of(&copy), 4);
    let out = Command::new(BIN)
        .args(["sessions", "show", &id, "--data"])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("awaiting_approval"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn version_names_the_layouts_and_migrations_it_understands() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    let version = text(&out.stdout);
    assert_eq!(version.lines().count(), 1, "{version}");
    let expected = format!(
        "sled layout {} (reads {}–{}), PostgreSQL migrations {}–{}",
        overseer::store::sled_layout(),
        overseer::store::OLDEST_SLED_LAYOUT,
        overseer::store::sled_layout(),
        overseer::store::OLDEST_PG_MIGRATION,
        overseer::store::pg_migration(),
    );
    assert!(version.contains(&expected), "{version}");
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
}
