//! The OpenAPI 3.1 document of the HTTP API (`src/http/openapi.rs`): it is
//! valid (checked by a maintained validator, `@readme/openapi-parser`, run
//! with Node.js from `tests/node_modules`), `overseer openapi` prints what
//! `GET /openapi.json` serves, every route of the router is in it, and
//! every route answers as it says (one request per route and reachable
//! status, each checked by `common::contract`, which also checks every
//! answer the other HTTP tests receive through `common::send`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{contract, npm, send, token, Server, ALL};
use serde_json::{json, Value};

type Result = anyhow::Result<()>;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn the_document_is_valid_openapi_3_1() -> Result {
    let modules = npm::installed().await;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, overseer::http::openapi::document_json())?;
    let script = r#"
const { validate } = require(process.argv[2]);
const fs = require("fs");
(async () => {
  const doc = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
  const result = await validate(doc);
  if (!result.valid) {
    console.error(JSON.stringify(result.errors, null, 1));
    process.exit(1);
  }
  console.log("valid " + doc.openapi);
})();
"#;
    let out = Command::new("node")
        .arg("-e")
        .arg(script)
        .arg(&file)
        .arg(modules.join("@readme/openapi-parser"))
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the validator refused the document: {}{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "valid 3.1.0");
    // And it refuses a broken one (the check can fail).
    let mut broken: Value = serde_json::from_str(overseer::http::openapi::document_json())?;
    broken["paths"]["/healthz"]["get"]["responses"]["200"] = json!({"content": 3});
    std::fs::write(&file, broken.to_string())?;
    let out = Command::new("node")
        .arg("-e")
        .arg(script)
        .arg(&file)
        .arg(modules.join("@readme/openapi-parser"))
        .output()?;
    assert!(!out.status.success(), "a broken document passed");
    Ok(())
}

#[tokio::test]
async fn overseer_openapi_prints_what_the_server_serves() -> Result {
    let s = Server::start().await?;
    // Unauthenticated, like /healthz.
    let resp = common::answer(s.client.get(s.url("/openapi.json"))).await?;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let served = resp.text;
    let exe = env!("CARGO_BIN_EXE_overseer");
    let out = Command::new(exe).arg("openapi").output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout)?, format!("{served}\n"));
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("api.json");
    let out = Command::new(exe)
        .arg("openapi")
        .arg("--out")
        .arg(&file)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&file)?, format!("{served}\n"));
    let doc: Value = serde_json::from_str(&served)?;
    assert_eq!(doc["openapi"], "3.1.0");
    // A file that cannot be written is an error naming it.
    let bad = dir.path().join("missing/dir/api.json");
    let out = Command::new(exe)
        .arg("openapi")
        .arg("--out")
        .arg(&bad)
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing/dir/api.json"));
    s.stop().await
}

/// The methods of a path item that have an operation.
fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_some() {
                ops.push((method.to_owned(), path.clone()));
            }
        }
    }
    ops
}

/// The guard of "every route is in the OpenAPI document": the router is
/// built only from `routes!` (whose paths and methods are the handlers'
/// `#[utoipa::path]` attributes, so a handler without one does not
/// compile), never with a bare `.route(...)` that would serve a path the
/// document lacks; and every documented operation is served (none falls
/// through to the router's `no such route`).
#[tokio::test]
async fn every_route_is_in_the_openapi_document() -> Result {
    let mut bare = Vec::new();
    let mut files = vec![root().join("src/http.rs")];
    let mut dirs = vec![root().join("src/http")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    for file in &files {
        let text = std::fs::read_to_string(file)?;
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for bypass in [
                ".route(",
                ".route_service(",
                ".nest(",
                ".nest_service(",
                ".merge(",
            ] {
                if code.contains(bypass) {
                    bare.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        bare.is_empty(),
        "routes added outside `routes!` are served without being in the OpenAPI document; \
         give the handler a #[utoipa::path] and add it with .routes(routes!(handler)): {bare:#?}"
    );
    let doc = contract::document();
    let ops = operations(doc);
    assert!(ops.len() >= 35, "only {} operations documented", ops.len());
    let s = Server::start().await?;
    for (method, path) in &ops {
        let concrete = path
            .replace("{id}", "00000000-0000-7000-8000-000000000000")
            .replace("{file}", "nothing.js");
        let req = s
            .client
            .request(method.to_uppercase().parse()?, s.url(&concrete));
        let resp = common::answer(req).await?;
        let (status, body) = (resp.status, resp.body);
        assert!(
            !(status == 404 && body["error"]["message"] == "no such route") && status != 405,
            "{method} {path} is documented but not served ({status})"
        );
    }
    s.stop().await
}

/// Sends and checks against the document (as `send` does), asserting the
/// status too.
async fn expect(req: reqwest::RequestBuilder, status: u16) -> anyhow::Result<Value> {
    let (got, body) = send(req).await?;
    assert_eq!(got, status, "expected {status}, got {got}: {body}");
    Ok(body)
}

#[tokio::test]
async fn every_route_answers_as_the_document_says() -> Result {
    let s = Server::start().await?;
    let all = token("acme", "alice", ALL);
    let read = token("acme", "reader", &["sessions:read"]);
    let hooks = token("acme", "hooks", &["webhooks:write"]);
    let admin = token("acme", "root", &["admin"]);
    let missing = "00000000-0000-7000-8000-000000000000";

    // Operations and the page (no token).
    expect(s.client.get(s.url("/healthz")), 200).await?;
    expect(s.client.get(s.url("/readyz")), 200).await?;
    expect(s.client.get(s.url("/openapi.json")), 200).await?;
    expect(s.client.get(s.url("/metrics")), 401).await?;
    expect(s.get("/metrics", &read), 403).await?;
    let (status, _) = send(s.get("/metrics", &admin))
        .await
        .unwrap_or((0, Value::Null));
    assert!(status == 200 || status == 503, "metrics answered {status}");
    for page in ["/", "/ui/nothing.js"] {
        // Held to the document by status and media type.
        common::answer(s.client.get(s.url(page))).await?;
    }

    // Sessions.
    expect(s.client.get(s.url("/v1/sessions")), 401).await?;
    expect(s.get("/v1/sessions", &hooks), 403).await?;
    expect(s.get("/v1/sessions?limit=0", &all), 400).await?;
    expect(s.get("/v1/agents", &all), 200).await?;
    let (id, call) = s.create_pending(&all).await?;
    expect(
        s.post("/v1/sessions", &all, &json!({"agent": "nobody"})),
        400,
    )
    .await?;
    expect(s.post("/v1/sessions", &read, &json!({"agent": "ops"})), 403).await?;
    let keyed = json!({"agent": "chat", "idempotency_key": "k1"});
    expect(s.post("/v1/sessions", &all, &keyed), 201).await?;
    expect(
        s.post(
            "/v1/sessions",
            &all,
            &json!({"agent": "chat", "idempotency_key": "k1", "title": "x"}),
        ),
        409,
    )
    .await?;
    expect(s.get("/v1/sessions", &all), 200).await?;
    expect(s.get(&format!("/v1/sessions/{id}"), &all), 200).await?;
    // Nested fields are held to the document too.
    let shown = expect(s.get(&format!("/v1/sessions/{id}"), &all), 200).await?;
    let path = format!("/v1/sessions/{id}");
    contract::assert("GET", &path, 200, &shown);
    let mut extra = shown.clone();
    extra["usage"]["bogus"] = json!(1);
    assert!(contract::check("GET", &path, 200, &extra).is_err());
    let mut extra = shown.clone();
    extra["transcript"][0]["bogus"] = json!(1);
    assert!(contract::check("GET", &path, 200, &extra).is_err());
    let mut wrong = shown;
    wrong["status"] = json!("sleeping");
    assert!(contract::check("GET", &path, 200, &wrong).is_err());
    expect(s.get(&format!("/v1/sessions/{missing}"), &all), 404).await?;
    expect(s.get("/v1/sessions/not-a-uuid", &all), 400).await?;
    expect(s.get(&format!("/v1/sessions/{id}/tree"), &all), 200).await?;
    expect(s.get(&format!("/v1/sessions/{id}/history"), &all), 200).await?;

    // Approvals.
    expect(s.get("/v1/approvals", &all), 200).await?;
    expect(s.get("/v1/approvals?cursor=nope", &all), 400).await?;
    let approvals = format!("/v1/sessions/{id}/approvals");
    expect(s.post(&approvals, &read, &json!({"decisions": {}})), 403).await?;
    expect(
        s.post(
            &approvals,
            &all,
            &json!({"decisions": {"no-such-call": {"decision": "approve"}}}),
        ),
        400,
    )
    .await?;
    expect(
        s.post(
            &approvals,
            &all,
            &json!({"decisions": {call.clone(): {"decision": "approve"}}}),
        ),
        200,
    )
    .await?;
    expect(
        s.post(
            &approvals,
            &all,
            &json!({"decisions": {call: {"decision": "approve"}}}),
        ),
        409,
    )
    .await?;
    expect(s.get("/v1/decisions", &all), 200).await?;
    expect(s.get("/v1/decisions?limit=0", &all), 400).await?;

    // Messages, rules, model, controls.
    let messages = format!("/v1/sessions/{id}/messages");
    expect(
        s.post(&messages, &all, &json!({"text": "hi", "message_id": "m1"})),
        202,
    )
    .await?;
    expect(
        s.post(
            &messages,
            &all,
            &json!({"text": "other", "message_id": "m1"}),
        ),
        409,
    )
    .await?;
    expect(s.post(&messages, &all, &json!({"txt": "hi"})), 400).await?;
    expect(
        s.client
            .post(s.url(&messages))
            .bearer_auth(&all)
            .body("{\"text\": \"hi\"}"),
        415,
    )
    .await?;
    expect(
        s.post(
            &format!("/v1/sessions/{missing}/messages"),
            &all,
            &json!({"text": "x"}),
        ),
        404,
    )
    .await?;
    let rules = format!("/v1/sessions/{id}/rules");
    expect(
        s.post(
            &rules,
            &all,
            &json!({"tool": "write_record", "rule": "allow"}),
        ),
        200,
    )
    .await?;
    expect(
        s.post(&rules, &all, &json!({"tool": "nothing", "rule": "allow"})),
        400,
    )
    .await?;
    let model = format!("/v1/sessions/{id}/model");
    expect(
        s.post(&model, &all, &json!({"model": "no-such-route"})),
        400,
    )
    .await?;
    expect(
        s.post(&format!("/v1/sessions/{id}/interrupt"), &all, &json!({})),
        200,
    )
    .await?;
    expect(
        s.post(
            &format!("/v1/sessions/{id}/skills"),
            &all,
            &json!({"name": "none"}),
        ),
        400,
    )
    .await?;
    expect(
        s.post(
            &format!("/v1/sessions/{id}/fork"),
            &all,
            &json!({"at": {"seq": 1, "index": 1}}),
        ),
        400,
    )
    .await?;
    expect(
        s.post(&format!("/v1/sessions/{id}/fork"), &all, &json!({})),
        201,
    )
    .await?;
    expect(
        s.post(&format!("/v1/sessions/{id}/cancel"), &all, &json!({"x": 1})),
        400,
    )
    .await?;
    expect(
        s.post(&format!("/v1/sessions/{id}/cancel"), &all, &json!({})),
        200,
    )
    .await?;
    expect(
        s.post(&format!("/v1/sessions/{id}/done"), &all, &json!({})),
        409,
    )
    .await?;
    expect(s.post(&messages, &all, &json!({"text": "again"})), 409).await?;

    // Events: the stream's status and type (the body is a stream).
    let resp = s
        .get(&format!("/v1/sessions/{id}/events?after=x"), &all)
        .send()
        .await?;
    let status = resp.status().as_u16();
    contract::assert(
        "GET",
        &format!("/v1/sessions/{id}/events"),
        status,
        &resp.json().await?,
    );
    assert_eq!(status, 400);
    let resp = s
        .get(&format!("/v1/sessions/{id}/events"), &all)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    contract::assert(
        "GET",
        &format!("/v1/sessions/{id}/events"),
        200,
        &Value::Null,
    );
    drop(resp);
    let resp = s
        .get("/v1/events", &all)
        .header("Last-Event-ID", "nope")
        .send()
        .await?;
    let status = resp.status().as_u16();
    contract::assert("GET", "/v1/events", status, &resp.json().await?);
    assert_eq!(status, 400);

    // Tasks, the caller, webhooks (disabled on this server: 404).
    expect(s.get("/v1/tasks", &all), 200).await?;
    expect(s.post("/v1/tasks/none/runs", &all, &json!({})), 404).await?;
    expect(s.get("/v1/me", &read), 200).await?;
    expect(s.client.get(s.url("/v1/me")), 401).await?;
    expect(s.get("/v1/webhooks", &all), 403).await?;
    expect(s.get("/v1/webhooks", &hooks), 404).await?;
    expect(
        s.post(
            "/v1/webhooks",
            &hooks,
            &json!({"url": "http://127.0.0.1:9/h"}),
        ),
        404,
    )
    .await?;

    // A status the document does not list for a route fails the check, and
    // so does a field it does not describe.
    assert!(contract::check("GET", "/healthz", 418, &json!({"status": "ok"})).is_err());
    assert!(contract::check("GET", "/healthz", 200, &json!({"status": "ok", "extra": 1})).is_err());
    assert!(contract::check("GET", "/v1/me", 200, &json!({"sub": "a"})).is_err());
    s.stop().await
}

#[tokio::test]
async fn the_webhook_routes_answer_as_the_document_says() -> Result {
    use overseer::webhooks::{Subscriptions, SystemClock, TargetRules, WebhookOptions, Webhooks};
    use std::sync::Arc;
    let dir = tempfile::tempdir()?;
    let store = overseer::store::SledStore::open(dir.path(), overseer::store::Durability::Os)?;
    let view = Arc::new(Subscriptions::new());
    store.set_webhooks(view.clone());
    let options = WebhookOptions {
        targets: TargetRules {
            allow_loopback: true,
            allow_private: false,
        },
        ..Default::default()
    };
    let hooks = Webhooks::open(
        Arc::new(store.clone()),
        view,
        options,
        Arc::new(SystemClock),
    )
    .await?;
    let s = Server::start_configured(
        dir,
        Arc::new(store),
        common::hs256(),
        overseer::http::HttpOptions {
            webhooks: Some(hooks),
            ..Default::default()
        },
        overseer_actors::RuntimeConfig::default(),
    )
    .await?;
    let t = token("acme", "hooks", &["webhooks:write"]);
    let created = expect(
        s.post(
            "/v1/webhooks",
            &t,
            &json!({"url": "http://127.0.0.1:9/hook", "events": ["session.finished"], "description": "d"}),
        ),
        201,
    )
    .await?;
    let id = created["id"].as_str().unwrap().to_owned();
    expect(s.post("/v1/webhooks", &t, &json!({"url": "ftp://x"})), 400).await?;
    expect(s.get("/v1/webhooks", &t), 200).await?;
    expect(s.get(&format!("/v1/webhooks/{id}"), &t), 200).await?;
    expect(s.get("/v1/webhooks/not-a-uuid", &t), 400).await?;
    expect(
        s.get("/v1/webhooks/00000000-0000-4000-8000-000000000000", &t),
        404,
    )
    .await?;
    expect(s.get(&format!("/v1/webhooks/{id}/deliveries"), &t), 200).await?;
    expect(
        s.get(&format!("/v1/webhooks/{id}/deliveries?cursor=x"), &t),
        400,
    )
    .await?;
    expect(
        s.post(&format!("/v1/webhooks/{id}/enable"), &t, &json!({})),
        200,
    )
    .await?;
    expect(
        s.post(
            &format!("/v1/webhooks/{id}/rotate"),
            &t,
            &json!({"grace_secs": 60}),
        ),
        200,
    )
    .await?;
    expect(
        s.client
            .delete(s.url(&format!("/v1/webhooks/{id}")))
            .bearer_auth(&t),
        204,
    )
    .await?;
    s.stop().await
}
