//! Webhooks (§18) end to end: `overseer serve` as a process (sled, or a
//! cluster over PostgreSQL), a real HTTP receiver started here that checks
//! every delivery with the Standard Webhooks project's own verifier
//! (`standardwebhooks`, not the code that signed it), and the API.
//!
//! - every event is delivered, signed, with the inbox card and links;
//! - a receiver that is down gets the same `webhook-id` once it is back;
//! - `kill -9` between the event and its delivery: delivered after restart;
//! - a cluster's owner killed: a survivor delivers;
//! - an endpoint on a refused address is refused at registration;
//! - a day of failures (an injected clock, no waiting) gives up and disables
//!   the endpoint with the reason recorded;
//! - a disabled endpoint is enabled again and hears new events;
//! - a rotated secret signs beside the old one for the grace period (the
//!   verifier accepts either), and alone once the grace is over;
//! - an endpoint id that is not a UUID is a 400;
//! - deliveries are counted in the Prometheus metrics;
//! - a session purged before delivery: its deliveries dropped and counted;
//! - a backlog of deliveries waiting for the delivery task is sent, each
//!   webhook once, each logged once;
//! - the delivery task runs at the lowest CPU priority.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};
use tokio::sync::watch;

use common::served::{self, Served};
use common::{send, token, PATIENCE, SECRET};

/// Every scope a webhook test uses.
const SCOPES: &[&str] = &[
    "sessions:read",
    "sessions:write",
    "approvals:write",
    "webhooks:write",
];

// ---------------------------------------------------------------------------
// The receiver

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Got {
    id: String,
    /// Whether `standardwebhooks` accepted its signature (and timestamp).
    verified: Result<(), String>,
    body: Value,
    /// What the receiver answered.
    answered: u16,
}

struct RxState {
    /// The status to answer with (200: up; 503: down; 0: never answer).
    answer: AtomicU16,
    /// The endpoint's secret, once registered.
    secret: Mutex<Option<String>>,
    got: watch::Sender<Vec<Got>>,
}

/// A webhook receiver on a loopback port.
struct Receiver {
    url: String,
    state: Arc<RxState>,
    task: tokio::task::JoinHandle<()>,
}

async fn receive(State(state): State<Arc<RxState>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let secret = state.secret.lock().unwrap().clone();
    let verified = match secret {
        None => Err("no secret yet".to_owned()),
        Some(s) => standardwebhooks::Webhook::new(&s)
            .map_err(|e| e.to_string())
            .and_then(|wh| wh.verify(&body, &headers).map_err(|e| e.to_string())),
    };
    let answered = state.answer.load(Ordering::SeqCst);
    let got = Got {
        id: headers
            .get("webhook-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        verified,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        answered,
    };
    state.got.send_modify(|all| all.push(got));
    if answered == 0 {
        // A receiver that takes the request and never answers.
        std::future::pending::<()>().await;
    }
    StatusCode::from_u16(answered).unwrap()
}

impl Receiver {
    async fn start() -> Self {
        let state = Arc::new(RxState {
            answer: AtomicU16::new(200),
            secret: Mutex::new(None),
            got: watch::channel(Vec::new()).0,
        });
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, state, task }
    }

    fn answer(&self, status: u16) {
        self.state.answer.store(status, Ordering::SeqCst);
    }

    fn set_secret(&self, secret: &str) {
        *self.state.secret.lock().unwrap() = Some(secret.to_owned());
    }

    /// Waits until a request satisfying `pred` arrived; returns every
    /// request so far.
    async fn until(&self, what: &str, pred: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let mut rx = self.state.got.subscribe();
        let waited = tokio::time::timeout(PATIENCE, rx.wait_for(|all| pred(all))).await;
        match waited {
            Ok(Ok(all)) => all.clone(),
            _ => panic!(
                "the receiver never got {what}; it got: {:#?}",
                self.state.got.borrow()
            ),
        }
    }

    /// The first delivery of `event` that the receiver answered 2xx.
    async fn delivered(&self, event: &str) -> Got {
        let all = self
            .until(&format!("a delivered {event}"), |all| {
                all.iter()
                    .any(|g| g.body["type"] == event && g.answered < 300)
            })
            .await;
        all.into_iter()
            .find(|g| g.body["type"] == event && g.answered < 300)
            .unwrap()
    }

    fn all(&self) -> Vec<Got> {
        self.state.got.borrow().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------
// `overseer serve` as a process

/// `overseer serve` on `config` with the test secret and `env` (see
/// [`Served`]).
fn serve(config: &Path, env: &[(&str, &str)]) -> Served {
    let mut cmd = served::command();
    cmd.arg("--config")
        .arg(config)
        .env("OVERSEER_JWT_SECRET", SECRET)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied());
    Served::start(cmd).unwrap()
}

/// A configuration for a single node on `data`, with short retries, the
/// receiver's loopback address allowed (unless `loopback` is false) and a
/// public address for links; `extra` is appended.
fn config(dir: &Path, loopback: bool, extra: &str) -> PathBuf {
    let path = dir.join("overseer.toml");
    std::fs::write(
        &path,
        format!(
            "[store]\ndata_dir = {data:?}\n\n\
             [webhooks]\nallow_loopback = {loopback}\npublic_url = \"http://inbox.example\"\n\
             retry_initial_ms = 100\nretry_max_secs = 1\nrequest_timeout_secs = 5\n\n\
             [[agents]]\nname = \"assistant\"\ntools = [\"current_time\"]\napproval = \"always\"\n\
             {extra}",
            data = dir.join("data").display().to_string(),
        ),
    )
    .unwrap();
    path
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    reqwest::Client::new()
}

async fn post(base: &str, path: &str, token: &str, body: &Value) -> (u16, Value) {
    send(
        client()
            .post(format!("{base}{path}"))
            .bearer_auth(token)
            .json(body),
    )
    .await
    .unwrap()
}

async fn get(base: &str, path: &str, token: &str) -> (u16, Value) {
    send(client().get(format!("{base}{path}")).bearer_auth(token))
        .await
        .unwrap()
}

/// Registers `url` for `events` (all when empty); returns (id, secret).
async fn register(base: &str, tok: &str, url: &str, events: &[&str]) -> (String, String) {
    let mut body = json!({"url": url, "description": "test receiver"});
    if !events.is_empty() {
        body["events"] = json!(events);
    }
    let (status, v) = post(base, "/v1/webhooks", tok, &body).await;
    assert_eq!(status, 201, "{v}");
    (
        v["id"].as_str().unwrap().to_owned(),
        v["secret"].as_str().unwrap().to_owned(),
    )
}

/// Creates an `assistant` session ("What time is it?"); returns its id.
async fn create(base: &str, tok: &str) -> String {
    let (status, v) = post(
        base,
        "/v1/sessions",
        tok,
        &json!({"agent": "assistant", "prompt": "What time is it?", "title": "clock"}),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

/// The endpoint's delivery log.
async fn log(base: &str, tok: &str, endpoint: &str) -> Vec<Value> {
    let (status, v) = get(base, &format!("/v1/webhooks/{endpoint}/deliveries"), tok).await;
    assert_eq!(status, 200, "{v}");
    v["deliveries"].as_array().unwrap().clone()
}

/// The endpoint's log once its `n` newest entries are over (delivered or
/// failed): the receiver sees a delivery before its outcome is recorded.
async fn logged(base: &str, tok: &str, endpoint: &str, n: usize) -> Vec<Value> {
    common::eventually(
        "the attempts' outcomes recorded",
        Duration::from_millis(10),
        || async {
            let entries = log(base, tok, endpoint).await;
            if entries.len() >= n && entries[..n].iter().all(|e| e["status"] != "pending") {
                Ok(entries)
            } else {
                Err(format!("{entries:?}"))
            }
        },
    )
    .await
}

fn assert_verified(got: &Got) {
    assert!(
        got.verified.is_ok(),
        "webhook {} failed verification: {:?}",
        got.id,
        got.verified
    );
    assert!(got.id.starts_with("msg_"), "{}", got.id);
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_is_delivered_signed_with_the_inbox_card_and_links() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start().await;
    let only_asks = Receiver::start().await;
    let server = serve(&config(dir.path(), true, ""), &[]);
    let base = server.url.as_str();
    let tok = token("acme", "alice", SCOPES);

    // Registration needs webhooks:write; reads too.
    let reader = token("acme", "bob", &["sessions:read", "sessions:write"]);
    let (status, v) = post(base, "/v1/webhooks", &reader, &json!({"url": rx.url})).await;
    assert_eq!(status, 403, "{v}");
    let (status, _) = get(base, "/v1/webhooks", &reader).await;
    assert_eq!(status, 403);
    let (status, v) = post(
        base,
        "/v1/webhooks",
        &tok,
        &json!({"url": rx.url, "events": ["approval.asked"]}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("events: unknown event 'approval.asked'"),
        "{v}"
    );

    let (endpoint, secret) = register(base, &tok, &rx.url, &[]).await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    rx.set_secret(&secret);
    let (narrow, narrow_secret) =
        register(base, &tok, &only_asks.url, &["approval.requested"]).await;
    only_asks.set_secret(&narrow_secret);
    // The secret is shown once: never in a listing or a read.
    let (_, listed) = get(base, "/v1/webhooks", &tok).await;
    assert_eq!(listed["webhooks"].as_array().unwrap().len(), 2);
    assert!(!listed.to_string().contains("whsec_"), "{listed}");
    let (status, shown) = get(base, &format!("/v1/webhooks/{endpoint}"), &tok).await;
    assert_eq!(status, 200);
    assert_eq!(shown["url"], json!(rx.url));
    assert_eq!(shown["enabled"], json!(true));
    assert!(shown.get("secret").is_none(), "{shown}");
    // Another tenant sees none of it.
    let globex = token("globex", "eve", SCOPES);
    let (status, _) = get(base, &format!("/v1/webhooks/{endpoint}"), &globex).await;
    assert_eq!(status, 404);

    // approval.requested: the inbox card, as GET /v1/approvals shows it.
    let session = create(base, &tok).await;
    let asked = rx.delivered("approval.requested").await;
    assert_verified(&asked);
    let (_, inbox) = get(base, "/v1/approvals", &tok).await;
    let card = &inbox["approvals"][0];
    assert_eq!(
        asked.body["data"]["approval"], *card,
        "the webhook's card is the inbox's"
    );
    assert_eq!(asked.body["data"]["session_id"], json!(session));
    assert_eq!(asked.body["data"]["approval"]["title"], json!("clock"));
    assert_eq!(
        asked.body["data"]["approval"]["name"],
        json!("current_time")
    );
    assert_eq!(
        asked.body["data"]["links"],
        json!({"inbox": "http://inbox.example/#/inbox", "session": format!("http://inbox.example/#/s/{session}")})
    );
    assert!(
        asked.body["timestamp"].as_str().unwrap().ends_with('Z'),
        "{}",
        asked.body
    );
    let narrow_got = only_asks.delivered("approval.requested").await;
    assert_verified(&narrow_got);
    assert_eq!(
        narrow_got.id, asked.id,
        "one webhook-id per event, whatever the endpoint"
    );

    // approval.decided: who decided, and the call.
    let call = card["call_id"].as_str().unwrap();
    let (status, v) = post(
        base,
        &format!("/v1/sessions/{session}/approvals"),
        &tok,
        &json!({"decisions": {call: {"decision": "approve"}}}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let decided = rx.delivered("approval.decided").await;
    assert_verified(&decided);
    assert_eq!(decided.body["data"]["decision"]["by"], json!("alice"));
    assert_eq!(decided.body["data"]["call_id"], json!(call));
    assert_eq!(decided.body["data"]["approval"]["call_id"], json!(call));

    // session.finished once the session is done.
    common::eventually("the turn to end", Duration::from_millis(50), || async {
        let (_, v) = get(base, &format!("/v1/sessions/{session}"), &tok).await;
        if v["status"] == "awaiting_input" {
            Ok(())
        } else {
            Err(v["status"].to_string())
        }
    })
    .await;
    let (status, v) = post(
        base,
        &format!("/v1/sessions/{session}/done"),
        &tok,
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let finished = rx.delivered("session.finished").await;
    assert_verified(&finished);
    assert_eq!(finished.body["data"]["status"], json!("completed"));
    assert_eq!(finished.body["data"]["root_session_id"], json!(session));

    // Each event once, each with its own id; the narrow endpoint got only
    // what it asked for.
    let all = rx.all();
    let mut ids: Vec<&str> = all.iter().map(|g| g.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{all:#?}");
    assert!(only_asks
        .all()
        .iter()
        .all(|g| g.body["type"] == "approval.requested"));

    // The log: three delivered, one attempt each, newest first.
    let entries = logged(base, &tok, &endpoint, 3).await;
    let kinds: Vec<&str> = entries
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["session.finished", "approval.decided", "approval.requested"]
    );
    for e in &entries {
        assert_eq!(e["status"], "delivered", "{e}");
        assert_eq!(e["attempts"], 1, "{e}");
        assert_eq!(e["last_status_code"], 200, "{e}");
    }
    assert_eq!(entries[2]["webhook_id"], json!(asked.id));
    let narrow_log = log(base, &tok, &narrow).await;
    assert_eq!(narrow_log.len(), 1);

    // Deleting an endpoint stops it.
    let (status, _) = send(
        client()
            .delete(format!("{base}/v1/webhooks/{narrow}"))
            .bearer_auth(&tok),
    )
    .await
    .unwrap();
    assert_eq!(status, 204);
    let (status, _) = get(base, &format!("/v1/webhooks/{narrow}"), &tok).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_was_down_gets_the_same_webhook_id_later() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start().await;
    rx.answer(503);
    let server = serve(&config(dir.path(), true, ""), &[]);
    let base = server.url.as_str();
    let tok = token("acme", "alice", SCOPES);
    let (endpoint, secret) = register(base, &tok, &rx.url, &["approval.requested"]).await;
    rx.set_secret(&secret);
    create(base, &tok).await;

    // Refused, and retried.
    let tried = rx.until("two refused attempts", |all| all.len() >= 2).await;
    let id = tried[0].id.clone();
    assert!(
        tried.iter().all(|g| g.id == id && g.answered == 503),
        "{tried:#?}"
    );
    common::eventually(
        "the log to show the failed attempts",
        Duration::from_millis(20),
        || async {
            let entries = log(base, &tok, &endpoint).await;
            match entries.first() {
                Some(e) if e["status"] == "pending" && e["attempts"].as_u64() >= Some(2) => {
                    assert_eq!(e["last_status_code"], 503, "{e}");
                    assert!(e["last_error"].as_str().unwrap().contains("503"), "{e}");
                    assert!(e["next_attempt_at_ms"].is_i64(), "{e}");
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // Back up: the same message, the same id.
    rx.answer(200);
    let got = rx.delivered("approval.requested").await;
    assert_eq!(got.id, id);
    assert_verified(&got);
    common::eventually(
        "the log to show it delivered",
        Duration::from_millis(20),
        || async {
            let entries = log(base, &tok, &endpoint).await;
            match entries.first() {
                Some(e) if e["status"] == "delivered" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_between_the_event_and_its_delivery_delivers_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), true, "");
    let rx = Receiver::start().await;
    rx.answer(503);
    let mut server = serve(&cfg, &[]);
    let tok = token("acme", "alice", SCOPES);
    let (_, secret) = register(&server.url, &tok, &rx.url, &[]).await;
    rx.set_secret(&secret);
    create(&server.url, &tok).await;
    // The event is committed and its delivery under way (refused so far).
    let tried = rx.until("an attempt", |all| !all.is_empty()).await;
    let id = tried[0].id.clone();

    server.kill9();
    rx.answer(200);
    let server = serve(&cfg, &[]);
    let got = rx.delivered("approval.requested").await;
    assert_eq!(got.id, id, "the same webhook-id after the restart");
    assert_verified(&got);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_on_a_refused_address_is_refused_at_registration() {
    let dir = tempfile::tempdir().unwrap();
    let strict = serve(&config(dir.path(), false, ""), &[]);
    let tok = token("acme", "alice", SCOPES);
    for (url, says) in [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.7/hook", "private"),
        ("http://[::1]:9/hook", "loopback"),
        ("http://127.0.0.1:9/hook", "allow_loopback"),
        ("http://localhost:9/hook", "loopback"),
        ("ftp://example.com/hook", "only http and https"),
        ("http://user:pw@93.184.215.14/", "credentials"),
        ("hook", "is not a URL"),
    ] {
        let (status, v) = post(&strict.url, "/v1/webhooks", &tok, &json!({"url": url})).await;
        assert_eq!(status, 400, "{url}: {v}");
        assert_eq!(v["error"]["code"], "invalid_webhook_url", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("url: "), "{message}");
        assert!(message.contains(says), "{url}: {message}");
    }
    let (_, listed) = get(&strict.url, "/v1/webhooks", &tok).await;
    assert_eq!(listed["webhooks"], json!([]), "nothing was registered");
}

#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_session_is_delivered_as_session_failed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), true, "\n[runtime]\nmax_restarts = 0\n");
    let rx = Receiver::start().await;
    let server = serve(&cfg, &[("OVERSEER_FAULT", "mid_stream:1:panic")]);
    let tok = token("acme", "alice", SCOPES);
    let (_, secret) = register(&server.url, &tok, &rx.url, &["session.failed"]).await;
    rx.set_secret(&secret);
    let session = create(&server.url, &tok).await;
    let failed = rx.delivered("session.failed").await;
    assert_verified(&failed);
    assert_eq!(failed.body["data"]["session_id"], json!(session));
    assert_eq!(failed.body["data"]["status"], json!("failed"));
    assert!(failed.body["data"]["error"].is_string(), "{}", failed.body);
}

/// An in-process service on a sled store whose webhooks run on `clock`
/// with `options`, their delivery task started.
async fn in_process(
    options: overseer::webhooks::WebhookOptions,
    clock: Arc<dyn overseer::webhooks::Clock>,
) -> (
    common::Server,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let (server, hooks) = in_process_idle(options, clock).await;
    let (stop, stopped) = watch::channel(false);
    let delivery = hooks.start(&server.overseer, stopped);
    (server, stop, delivery)
}

/// [`in_process`] with the delivery task not started yet.
async fn in_process_idle(
    options: overseer::webhooks::WebhookOptions,
    clock: Arc<dyn overseer::webhooks::Clock>,
) -> (common::Server, Arc<overseer::webhooks::Webhooks>) {
    use overseer::webhooks::{Subscriptions, Webhooks};
    let dir = tempfile::tempdir().unwrap();
    let store =
        overseer::store::SledStore::open(dir.path(), overseer::store::Durability::Os).unwrap();
    let view = Arc::new(Subscriptions::new());
    store.set_webhooks(view.clone());
    let hooks = Webhooks::open(Arc::new(store.clone()), view, options, clock)
        .await
        .unwrap();
    let server = common::Server::start_configured(
        dir,
        Arc::new(store),
        common::hs256(),
        overseer::http::HttpOptions {
            webhooks: Some(hooks.clone()),
            ..Default::default()
        },
        overseer_actors::RuntimeConfig::default(),
    )
    .await
    .unwrap();
    (server, hooks)
}

fn loopback() -> overseer::webhooks::TargetRules {
    overseer::webhooks::TargetRules {
        allow_loopback: true,
        allow_private: false,
    }
}

/// The invariant "deliveries never block a turn": with every delivery slot
/// taken by a receiver that never answers, sessions still ask, are
/// decided, run their tools and end their turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_answers_does_not_slow_a_turn() {
    let options = overseer::webhooks::WebhookOptions {
        targets: loopback(),
        request_timeout: Duration::from_secs(300),
        concurrency: 1,
        ..Default::default()
    };
    let (server, stop, delivery) =
        in_process(options, Arc::new(overseer::webhooks::SystemClock)).await;
    let rx = Receiver::start().await;
    rx.answer(0);
    let tok = token("acme", "alice", SCOPES);
    let (endpoint, secret) = register(&server.base, &tok, &rx.url, &[]).await;
    rx.set_secret(&secret);

    for _ in 0..3 {
        let (session, call) = server.create_pending(&tok).await.unwrap();
        let (status, v) = post(
            &server.base,
            &format!("/v1/sessions/{session}/approvals"),
            &tok,
            &json!({"decisions": {call: {"decision": "approve"}}}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        common::eventually("the turn to end", Duration::from_millis(10), || async {
            let (_, v) = get(&server.base, &format!("/v1/sessions/{session}"), &tok).await;
            match v["status"].as_str() {
                Some("awaiting_input") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    // Meanwhile the one delivery slot has been held by the first attempt:
    // no delivery has an outcome, so the log (which a delivery enters at
    // its first outcome) is empty, and the rest wait in the outbox.
    let held = rx.until("the first attempt", |all| !all.is_empty()).await;
    assert_eq!(held.len(), 1, "{held:#?}");
    let logged = log(&server.base, &tok, &endpoint).await;
    assert!(logged.is_empty(), "{logged:#?}");

    stop.send(true).unwrap();
    tokio::time::timeout(PATIENCE, delivery)
        .await
        .unwrap()
        .unwrap();
    server.stop().await.unwrap();
}

/// Attempts fail for a whole day (the receiver answers 500): the delivery is
/// retried with backoff under one `webhook-id`, its last attempt 24 h after
/// the event, then given up and the endpoint disabled with the reason; a
/// disabled endpoint is sent nothing more. The day passes on an injected
/// clock: nothing waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_of_failures_gives_up_and_disables_the_endpoint() {
    use overseer::webhooks::{Clock, ManualClock, WebhookOptions};

    const DAY_MS: i64 = 86_400_000;
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let clock = ManualClock::new(start);
    let options = WebhookOptions {
        targets: loopback(),
        retry_initial: Duration::from_secs(5),
        retry_max: Duration::from_secs(3600),
        max_age: Duration::from_millis(DAY_MS as u64),
        ..WebhookOptions::default()
    };
    let (server, stop, delivery) = in_process(options, clock.clone()).await;

    let rx = Receiver::start().await;
    rx.answer(500);
    let tok = token("acme", "alice", SCOPES);
    let (endpoint, secret) = register(&server.base, &tok, &rx.url, &["approval.requested"]).await;
    rx.set_secret(&secret);
    server.create_pending(&tok).await.unwrap();

    let mut seen = 0u64;
    let last = loop {
        let entry = common::eventually(
            "the next attempt's outcome",
            Duration::from_millis(10),
            || async {
                let entries = log(&server.base, &tok, &endpoint).await;
                match entries.first() {
                    Some(e) if e["attempts"].as_u64().unwrap_or(0) > seen => Ok(e.clone()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        seen = entry["attempts"].as_u64().unwrap();
        assert_eq!(entry["last_status_code"], 500, "{entry}");
        if entry["status"] == "failed" {
            break entry;
        }
        assert_eq!(entry["status"], "pending", "{entry}");
        let next = entry["next_attempt_at_ms"].as_i64().unwrap();
        let created = entry["created_at_ms"].as_i64().unwrap();
        assert!(next > clock.now_ms() && next <= created + DAY_MS, "{entry}");
        clock.set(next);
    };
    // Backoff, not a tight loop: a few dozen attempts over the day, the
    // last one at the 24 h mark.
    assert!((10..=60).contains(&seen), "{seen} attempts");
    let created = last["created_at_ms"].as_i64().unwrap();
    assert_eq!(
        last["last_attempt_at_ms"].as_i64().unwrap(),
        created + DAY_MS,
        "{last}"
    );
    let got = rx.all();
    assert_eq!(got.len() as u64, seen);
    assert!(
        got.iter().all(|g| g.id == got[0].id),
        "one webhook-id for every attempt"
    );
    assert_verified(&got[0]);

    let (_, shown) = get(&server.base, &format!("/v1/webhooks/{endpoint}"), &tok).await;
    assert_eq!(shown["enabled"], json!(false), "{shown}");
    let reason = shown["disabled"]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("failed {seen} attempts over 86400 s")),
        "{reason}"
    );
    assert!(reason.contains("500"), "{reason}");

    // Disabled: a new event is not even queued for it. (Another endpoint's
    // delivery of the same event shows the outbox was taken in by then.)
    let witness = Receiver::start().await;
    let (_, witness_secret) =
        register(&server.base, &tok, &witness.url, &["approval.requested"]).await;
    witness.set_secret(&witness_secret);
    server.create_pending(&tok).await.unwrap();
    clock.advance(Duration::from_secs(1));
    assert_verified(&witness.delivered("approval.requested").await);
    assert_eq!(log(&server.base, &tok, &endpoint).await.len(), 1);
    assert_eq!(rx.all().len() as u64, seen);

    stop.send(true).unwrap();
    tokio::time::timeout(PATIENCE, delivery)
        .await
        .unwrap()
        .unwrap();
    server.stop().await.unwrap();
}

/// Cluster mode: the deliveries are rows of the PostgreSQL outbox, written
/// by the owner's checkpoint; the owner is killed while the receiver is
/// down, and a surviving node delivers them (the same `webhook-id`) once it
/// is back.
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_survivor_delivers_what_the_killed_owner_left() {
    use common::cluster::{create, Settings, World};

    let world = World::new(
        common::pg::shared().database().await.unwrap(),
        &Settings::default(),
    )
    .unwrap();
    let mut cfg = std::fs::read_to_string(&world.config).unwrap();
    cfg.push_str(
        "\n[webhooks]\nallow_loopback = true\nretry_initial_ms = 100\nretry_max_secs = 1\n\
         request_timeout_secs = 2\n",
    );
    std::fs::write(&world.config, cfg).unwrap();
    let rx = Receiver::start().await;
    rx.answer(503);
    let mut owner = world.node().unwrap();
    let survivor = world.node().unwrap();
    let tok = token("acme", "alice", SCOPES);
    // Registered on one node, known to all: the database joins.
    let (endpoint, secret) = register(&survivor.url, &tok, &rx.url, &[]).await;
    rx.set_secret(&secret);

    let session = create(&world, &owner, 7).await.unwrap();
    let tried = rx
        .until("an attempt at the approval", |all| {
            all.iter().any(|g| g.body["type"] == "approval.requested")
        })
        .await;
    let asked = tried
        .iter()
        .find(|g| g.body["type"] == "approval.requested")
        .unwrap()
        .id
        .clone();
    owner.kill9();
    rx.answer(200);

    let got = rx.delivered("approval.requested").await;
    assert_eq!(got.id, asked, "the same webhook-id from the survivor");
    assert_verified(&got);
    assert_eq!(got.body["data"]["session_id"], json!(session));
    assert_eq!(got.body["data"]["approval"]["name"], json!("ledger_append"));
    common::eventually(
        "the survivor's log to show it delivered",
        Duration::from_millis(50),
        || async {
            let entries = log(&survivor.url, &tok, &endpoint).await;
            match entries.iter().find(|e| e["webhook_id"] == json!(asked)) {
                Some(e) if e["status"] == "delivered" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// Starts an in-process service on the system clock with short retries.
async fn quick() -> (
    common::Server,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let options = overseer::webhooks::WebhookOptions {
        targets: loopback(),
        retry_initial: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        request_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    in_process(options, Arc::new(overseer::webhooks::SystemClock)).await
}

async fn finish(
    server: common::Server,
    stop: watch::Sender<bool>,
    delivery: tokio::task::JoinHandle<()>,
) {
    stop.send(true).unwrap();
    tokio::time::timeout(PATIENCE, delivery)
        .await
        .unwrap()
        .unwrap();
    server.stop().await.unwrap();
}

/// An endpoint disabled (it answered 410 Gone) is taken back into service
/// with `POST /v1/webhooks/{id}/enable`: the next event reaches it. The
/// deliveries are counted in the metrics (delivered, failed, failed
/// attempts, the latency histogram, the gauges).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_endpoint_is_enabled_again_and_hears_new_events() {
    let metrics = overseer::metrics::install_recorder().unwrap();
    let (server, stop, delivery) = quick().await;
    let rx = Receiver::start().await;
    rx.answer(410);
    let tok = token("acme", "alice", SCOPES);
    let (endpoint, secret) = register(&server.base, &tok, &rx.url, &["approval.requested"]).await;
    rx.set_secret(&secret);
    server.create_pending(&tok).await.unwrap();
    rx.until("a first attempt", |all| !all.is_empty()).await;
    let shown = common::eventually(
        "the endpoint disabled",
        Duration::from_millis(10),
        || async {
            let (_, v) = get(&server.base, &format!("/v1/webhooks/{endpoint}"), &tok).await;
            if v["enabled"] == json!(false) {
                Ok(v)
            } else {
                Err(v.to_string())
            }
        },
    )
    .await;
    assert!(
        shown["disabled"]["reason"]
            .as_str()
            .unwrap()
            .contains("410 Gone"),
        "{shown}"
    );

    // Another tenant cannot enable it; a reader without the scope neither.
    let globex = token("globex", "eve", SCOPES);
    let (status, _) = post(
        &server.base,
        &format!("/v1/webhooks/{endpoint}/enable"),
        &globex,
        &json!({}),
    )
    .await;
    assert_eq!(status, 404);
    let reader = token("acme", "bob", &["sessions:read"]);
    let (status, _) = post(
        &server.base,
        &format!("/v1/webhooks/{endpoint}/enable"),
        &reader,
        &json!({}),
    )
    .await;
    assert_eq!(status, 403);

    rx.answer(200);
    let (status, v) = post(
        &server.base,
        &format!("/v1/webhooks/{endpoint}/enable"),
        &tok,
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["enabled"], json!(true), "{v}");
    assert!(v["disabled"].is_null(), "{v}");
    assert!(v.get("secret").is_none(), "{v}");

    let before = rx.all().len();
    server.create_pending(&tok).await.unwrap();
    let got = rx.delivered("approval.requested").await;
    assert_verified(&got);
    assert!(rx.all().len() > before);
    let entries = logged(&server.base, &tok, &endpoint, 2).await;
    assert_eq!(entries[0]["status"], "delivered", "{entries:?}");
    assert_eq!(entries[1]["status"], "failed", "{entries:?}");

    let text = metrics.render();
    for line in [
        "overseer_webhook_deliveries_total{outcome=\"delivered\"}",
        "overseer_webhook_deliveries_total{outcome=\"failed\"}",
        "overseer_webhook_failed_attempts_total",
        "overseer_webhook_delivery_seconds_bucket",
        "overseer_webhook_pending_deliveries",
        "overseer_webhook_disabled_endpoints",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(value("overseer_webhook_deliveries_total{outcome=\"delivered\"}") >= 1.0);
    assert!(value("overseer_webhook_deliveries_total{outcome=\"failed\"}") >= 1.0);
    assert!(value("overseer_webhook_failed_attempts_total") >= 1.0);
    assert!(value("overseer_webhook_delivery_seconds_count") >= 1.0);
    finish(server, stop, delivery).await;
}

/// `POST /v1/webhooks/{id}/rotate`: the answer shows the new secret once;
/// during the grace period a delivery carries two signatures, so a
/// receiver still holding the old secret and one holding the new both
/// verify it (the specification's verifier); rotated again without grace,
/// only the newest secret signs and the old one no longer verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_signs_beside_the_old_one_during_the_grace_period() {
    let (server, stop, delivery) = quick().await;
    let rx = Receiver::start().await;
    let tok = token("acme", "alice", SCOPES);
    let (endpoint, old) = register(&server.base, &tok, &rx.url, &["approval.requested"]).await;
    let rotate = |body: Value| {
        let base = server.base.clone();
        let tok = tok.clone();
        let endpoint = endpoint.clone();
        async move {
            post(
                &base,
                &format!("/v1/webhooks/{endpoint}/rotate"),
                &tok,
                &body,
            )
            .await
        }
    };
    let (status, v) = rotate(json!({"grace_secs": 8 * 24 * 3600})).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("grace_secs"),
        "{v}"
    );

    let (status, v) = rotate(json!({"grace_secs": 3600})).await;
    assert_eq!(status, 200, "{v}");
    let new = v["secret"].as_str().unwrap().to_owned();
    assert!(new.starts_with("whsec_") && new != old, "{v}");
    assert!(v["previous_secret_until_ms"].as_i64().is_some(), "{v}");
    let (_, shown) = get(&server.base, &format!("/v1/webhooks/{endpoint}"), &tok).await;
    assert!(!shown.to_string().contains("whsec_"), "{shown}");

    // The old secret still verifies...
    rx.set_secret(&old);
    server.create_pending(&tok).await.unwrap();
    let first = rx.delivered("approval.requested").await;
    assert_verified(&first);
    // ...and so does the new one.
    rx.set_secret(&new);
    server.create_pending(&tok).await.unwrap();
    let all = rx
        .until("a second delivery", |all| {
            all.iter().filter(|g| g.answered < 300).count() >= 2
        })
        .await;
    assert_verified(all.iter().rfind(|g| g.answered < 300).unwrap());

    // Rotated without grace: only the newest signs.
    let (status, v) = rotate(json!({"grace_secs": 0})).await;
    assert_eq!(status, 200, "{v}");
    let newest = v["secret"].as_str().unwrap().to_owned();
    assert!(v["previous_secret_until_ms"].is_null(), "{v}");
    rx.set_secret(&new);
    server.create_pending(&tok).await.unwrap();
    let all = rx
        .until("a third delivery", |all| {
            all.iter().filter(|g| g.answered < 300).count() >= 3
        })
        .await;
    let third = all.iter().rfind(|g| g.answered < 300).unwrap().clone();
    assert!(
        third.verified.is_err(),
        "the rotated-out secret no longer verifies"
    );
    rx.set_secret(&newest);
    server.create_pending(&tok).await.unwrap();
    let all = rx
        .until("a fourth delivery", |all| {
            all.iter().filter(|g| g.answered < 300).count() >= 4
        })
        .await;
    assert_verified(all.iter().rfind(|g| g.answered < 300).unwrap());
    finish(server, stop, delivery).await;
}

/// An `{id}` that is not a UUID is a 400 naming the path segment, like the
/// session routes; a well-formed unknown one a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_id_that_is_not_a_uuid_is_a_400() {
    let (server, stop, delivery) = quick().await;
    let tok = token("acme", "alice", SCOPES);
    for path in [
        "/v1/webhooks/not-a-uuid",
        "/v1/webhooks/not-a-uuid/deliveries",
    ] {
        let (status, v) = get(&server.base, path, &tok).await;
        assert_eq!(status, 400, "{path}: {v}");
        assert_eq!(v["error"]["code"], "invalid_id", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("'not-a-uuid' is not a valid webhook endpoint id"),
            "{v}"
        );
    }
    let (status, _) = post(&server.base, "/v1/webhooks/nope/enable", &tok, &json!({})).await;
    assert_eq!(status, 400);
    let (status, _) = post(&server.base, "/v1/webhooks/nope/rotate", &tok, &json!({})).await;
    assert_eq!(status, 400);
    let unknown = uuid::Uuid::now_v7();
    let (status, _) = get(&server.base, &format!("/v1/webhooks/{unknown}"), &tok).await;
    assert_eq!(status, 404);
    finish(server, stop, delivery).await;
}

/// A session purged before its webhooks were sent (the retention janitor's
/// purge, while the delivery task was not running): nothing is sent for
/// it, its deliveries are dropped and counted
/// (`overseer_webhook_dropped_total`, reason `purged`: no stored event
/// backs them any more), and another session's webhooks still go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_purged_before_delivery_is_dropped_and_counted() {
    let metrics = overseer::metrics::install_recorder().unwrap();
    let dropped = || -> f64 {
        metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("overseer_webhook_dropped_total{reason=\"purged\"}"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let options = overseer::webhooks::WebhookOptions {
        targets: loopback(),
        ..Default::default()
    };
    let (server, hooks) = in_process_idle(options, Arc::new(overseer::webhooks::SystemClock)).await;
    let rx = Receiver::start().await;
    let tok = token("acme", "alice", SCOPES);
    let (_, secret) = register(&server.base, &tok, &rx.url, &[]).await;
    rx.set_secret(&secret);

    // approval.requested, then session.finished (cancelled): two deliveries.
    let (purged, _) = server.create_pending(&tok).await.unwrap();
    let (status, v) = post(
        &server.base,
        &format!("/v1/sessions/{purged}/cancel"),
        &tok,
        &json!({}),
    )
    .await;
    assert!(status < 300, "{status} {v}");
    common::eventually(
        "the session cancelled",
        Duration::from_millis(10),
        || async {
            let (_, v) = get(&server.base, &format!("/v1/sessions/{purged}"), &tok).await;
            match v["status"].as_str() {
                Some("cancelled") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let before = dropped();
    server
        .overseer
        .store()
        .purge(purged.parse().unwrap())
        .await
        .unwrap();

    let (stop, stopped) = watch::channel(false);
    let delivery = hooks.start(&server.overseer, stopped);
    let (witness, _) = server.create_pending(&tok).await.unwrap();
    let got = rx.delivered("approval.requested").await;
    assert_verified(&got);
    assert_eq!(got.body["data"]["session_id"], json!(witness));
    assert!(
        rx.all()
            .iter()
            .all(|g| g.body["data"]["session_id"] != json!(purged)),
        "{:#?}",
        rx.all()
    );
    assert!(dropped() - before >= 2.0, "{} dropped", dropped() - before);
    finish(server, stop, delivery).await;
}

/// The invariant "deliveries yield to sessions": the delivery task runs on
/// threads of its own at the lowest CPU priority (nice 19), its store
/// calls' blocking threads included, so under load the scheduler gives the
/// cores to turns first.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_task_runs_at_the_lowest_cpu_priority() {
    let (server, stop, delivery) = quick().await;
    let rx = Receiver::start().await;
    let tok = token("acme", "alice", SCOPES);
    let (_, secret) = register(&server.base, &tok, &rx.url, &["approval.requested"]).await;
    rx.set_secret(&secret);
    server.create_pending(&tok).await.unwrap();
    assert_verified(&rx.delivered("approval.requested").await);

    // (comm, nice) of every thread of this process; a thread's name is
    // cut to 15 bytes.
    let mut threads = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = task.unwrap().path();
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("stat")),
        ) else {
            continue; // the thread ended meanwhile
        };
        // Fields after the parenthesised name: state is the 3rd, nice the 19th.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let nice: i32 = rest.split(' ').nth(16).unwrap().parse().unwrap();
        threads.push((comm.trim().to_owned(), nice));
    }
    let delivery_threads: Vec<_> = threads
        .iter()
        .filter(|(name, _)| name.starts_with("overseer-webhoo"))
        .collect();
    assert!(!delivery_threads.is_empty(), "{threads:?}");
    assert!(
        delivery_threads.iter().all(|(_, nice)| *nice == 19),
        "{delivery_threads:?}"
    );
    assert!(
        threads
            .iter()
            .any(|(name, nice)| !name.starts_with("overseer-webhoo") && *nice < 19),
        "the rest of the process keeps its priority: {threads:?}"
    );
    finish(server, stop, delivery).await;
}

/// The invariant "a fresh delivery is sent once": events checkpointed
/// while the delivery task is stopped wait in the store; once it runs, each reaches the receiver (verified with the
/// specification's algorithm) exactly once with its own `webhook-id`, even
/// while more events arrive and are taken in beside the ones in flight
/// (two slots only), and each has one log entry, delivered at its first
/// attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_delivered_once_each_and_logged_once_each() {
    let options = overseer::webhooks::WebhookOptions {
        targets: loopback(),
        concurrency: 2,
        ..Default::default()
    };
    let (server, hooks) = in_process_idle(options, Arc::new(overseer::webhooks::SystemClock)).await;
    let rx = Receiver::start().await;
    let tok = token("acme", "alice", SCOPES);
    let (endpoint, secret) = register(&server.base, &tok, &rx.url, &["approval.requested"]).await;
    rx.set_secret(&secret);

    let mut sessions = Vec::new();
    for _ in 0..6 {
        sessions.push(server.create_pending(&tok).await.unwrap().0);
    }
    assert!(
        log(&server.base, &tok, &endpoint).await.is_empty(),
        "nothing sent yet"
    );
    let (stop, stopped) = watch::channel(false);
    let delivery = hooks.start(&server.overseer, stopped);
    for _ in 0..6 {
        sessions.push(server.create_pending(&tok).await.unwrap().0);
    }
    let all = rx
        .until("twelve deliveries", |all| all.len() >= sessions.len())
        .await;
    let entries = logged(&server.base, &tok, &endpoint, sessions.len()).await;

    let mut ids: Vec<&str> = all.iter().map(|g| g.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), all.len(), "a webhook sent twice: {all:#?}");
    let mut seen: Vec<String> = all
        .iter()
        .map(|g| {
            assert_verified(g);
            assert_eq!(g.body["type"], "approval.requested");
            g.body["data"]["session_id"].as_str().unwrap().to_owned()
        })
        .collect();
    seen.sort();
    sessions.sort();
    assert_eq!(seen, sessions);
    assert_eq!(entries.len(), sessions.len(), "{entries:#?}");
    for e in &entries {
        assert_eq!(e["status"], "delivered", "{e}");
        assert_eq!(e["attempts"], 1, "{e}");
        assert!(ids.contains(&e["webhook_id"].as_str().unwrap()), "{e}");
    }
    finish(server, stop, delivery).await;
}
