//! Black-box tests of the HTTP API (§12) over a real loopback socket: the
//! whole service with a sled store in a temp dir, the scripted provider and a
//! tool that needs approval, driven with reqwest.
//!
//! No test sleeps to synchronise: each waits for the event it needs on the
//! session's event stream (bounded by a generous timeout that only turns a
//! hang into a failure), and nothing is timed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use anyhow::Context;
use common::{b64url, expect_error, ids, send, token, Server, Sse, ALL, SECRET};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use overseer::auth::AuthConfig;
use overseer::http::{self, HttpOptions};
use serde_json::{json, Value};

type Result = anyhow::Result<()>;

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

// ---- the quick start ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quick_start_flow_create_watch_approve_result() -> Result {
    let s = Server::start().await?;
    let alice = token("acme", "alice", ALL);

    let (status, created) = send(s.post(
        "/v1/sessions",
        &alice,
        &json!({"agent": "ops", "prompt": "please write record 42", "title": "demo", "metadata": {"ticket": 7}}),
    ))
    .await?;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().context("id")?.to_owned();
    assert_eq!(created["agent"], "ops");
    assert_eq!(created["tenant"], "acme");
    assert_eq!(created["title"], "demo");
    assert_eq!(created["metadata"], json!({"ticket": 7}));
    assert_eq!(created["transcript"][0]["role"], "user");

    let mut events = Sse::open(&s, &alice, &id, None).await?;
    let first = events.until_type("approval_requested").await?;
    assert_eq!(first[0].event, "session_created");
    let requested = first.last().context("event")?;
    assert_eq!(requested.data["name"], "write_record");
    assert_eq!(requested.data["arguments"], json!({"key": 42}));
    let call_id = requested.data["call_id"]
        .as_str()
        .context("call_id")?
        .to_owned();

    let (status, pending) = send(s.get(&format!("/v1/sessions/{id}/approvals"), &alice)).await?;
    assert_eq!(status, 200);
    assert_eq!(
        pending["pending"].as_array().map(Vec::len),
        Some(1),
        "{pending}"
    );
    let p = &pending["pending"][0];
    assert_eq!(p["call_id"], call_id.as_str());
    assert_eq!(p["name"], "write_record");
    assert_eq!(p["session_path"], json!([id]));
    // The whole shape of the answer, field by field.
    assert_eq!(pending["session_id"], json!(id));
    assert_eq!(pending["status"], "awaiting_approval");
    let mut fields: Vec<&str> = p
        .as_object()
        .context("a pending call is an object")?
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "approval_deadline_ms",
            "arguments",
            "call_id",
            "name",
            "outcome_unknown",
            "proposed_at_ms",
            "session_id",
            "session_path",
            "warnings"
        ],
        "{p}"
    );
    assert_eq!(p["session_id"], json!(id));
    assert_eq!(p["outcome_unknown"], false);
    assert!(p["arguments"].is_object(), "{p}");
    assert_eq!(p["warnings"], json!([]), "clean arguments have no warnings");
    let (proposed, deadline) = (
        p["proposed_at_ms"].as_i64().context("proposed_at_ms")?,
        p["approval_deadline_ms"]
            .as_i64()
            .context("approval_deadline_ms")?,
    );
    assert!(proposed > 0 && deadline > proposed, "{p}");

    let (status, after) = send(s.post(
        &format!("/v1/sessions/{id}/approvals"),
        &alice,
        &json!({"decisions": {&call_id: {"decision": "approve"}}, "metadata": {&call_id: {"reason": "looks fine"}}}),
    ))
    .await?;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["pending"], json!([]));

    let rest = events.until_status("awaiting_input").await?;
    let decision = rest
        .iter()
        .find(|m| m.event == "decision_recorded")
        .context("decision_recorded")?;
    assert_eq!(
        decision.data["record"]["by"], "alice",
        "approved_by comes from the token"
    );
    assert_eq!(
        decision.data["record"]["metadata"],
        json!({"reason": "looks fine"})
    );
    let finished = rest
        .iter()
        .find(|m| m.event == "tool_call_finished")
        .context("tool_call_finished")?;
    assert_eq!(finished.data["state"], "completed");
    assert_eq!(finished.data["result"], json!({"written": 42}));
    let ended = rest
        .iter()
        .find(|m| m.event == "turn_ended")
        .context("turn_ended")?;
    assert_eq!(ended.data["stop_reason"], "end_turn");
    assert!(
        rest.iter()
            .any(|m| m.event == "text_delta" && m.id.is_none()),
        "live text deltas are streamed without ids"
    );

    // Every stored event exactly once, in order, from 1.
    let all: Vec<_> = first.iter().chain(&rest).cloned().collect();
    let seqs = ids(&all);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    for m in all.iter().filter(|m| m.id.is_some()) {
        assert_eq!(m.data["seq"].as_u64(), m.id);
        assert_eq!(m.data["type"], m.event.as_str());
        assert_eq!(m.data["session_id"], id.as_str());
    }

    let (status, state) = send(s.get(&format!("/v1/sessions/{id}"), &alice)).await?;
    assert_eq!(status, 200);
    assert_eq!(state["status"], "awaiting_input");
    assert_eq!(state["last_stop_reason"], "end_turn");
    let last = state["transcript"]
        .as_array()
        .and_then(|t| t.last())
        .context("transcript")?;
    assert_eq!(last["role"], "assistant");
    assert!(last["text"]
        .as_str()
        .unwrap_or_default()
        .contains("written"));

    // A follow-up message (202) starts the next turn; done completes it.
    let (status, accepted) = send(s.post(
        &format!("/v1/sessions/{id}/messages"),
        &alice,
        &json!({"text": "thanks"}),
    ))
    .await?;
    assert_eq!(status, 202, "{accepted}");
    let _ = events.until_status("awaiting_input").await?;
    let (status, done) =
        send(s.post(&format!("/v1/sessions/{id}/done"), &alice, &json!({}))).await?;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "completed");

    let (status, tree) = send(s.get(&format!("/v1/sessions/{id}/tree"), &alice)).await?;
    assert_eq!(status, 200);
    assert_eq!(tree["session_id"], id.as_str());
    assert_eq!(tree["status"], "completed");
    assert_eq!(tree["children"], json!([]));
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_ready_and_agents() -> Result {
    let s = Server::start().await?;
    let (status, v) = send(s.client.get(s.url("/healthz"))).await?;
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")));
    let (status, v) = send(s.client.get(s.url("/readyz"))).await?;
    assert_eq!((status, v["status"].as_str()), (200, Some("ready")));
    let (status, v) = send(s.get("/v1/agents", &token("acme", "a", &["sessions:read"]))).await?;
    assert_eq!(status, 200);
    let names: Vec<_> = v["agents"]
        .as_array()
        .context("agents")?
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert_eq!(names, ["chat", "chatty", "lead", "ops"]);
    // Each agent lists the declarations of the tools in its scope.
    let ops = v["agents"]
        .as_array()
        .context("agents")?
        .iter()
        .find(|a| a["name"] == "ops")
        .context("ops")?;
    let spec = &ops["tool_specs"][0];
    assert_eq!(spec["name"], "write_record");
    assert_eq!(spec["requires_approval"], true);
    assert_eq!(spec["parameters"]["required"], json!(["key"]));
    // An agent with subagents has delegate_task in scope.
    let lead = v["agents"]
        .as_array()
        .context("agents")?
        .iter()
        .find(|a| a["name"] == "lead")
        .context("lead")?;
    assert!(lead["tool_specs"]
        .as_array()
        .context("specs")?
        .iter()
        .any(|t| t["name"] == "delegate_task"));
    s.stop().await
}

// ---- error statuses ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_wrong_typed_unknown_and_huge_bodies_are_refused_as_json() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let raw = |body: String| {
        s.client
            .post(s.url("/v1/sessions"))
            .bearer_auth(&t)
            .header("content-type", "application/json")
            .body(body)
    };

    expect_error(raw("{\"agent\": ".into()), 400, "malformed_json").await?;
    expect_error(raw("not json".into()), 400, "malformed_json").await?;
    let v = expect_error(raw(r#"{"agent": 5}"#.into()), 400, "invalid_body").await?;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("agent"),
        "{v}"
    );
    let v = expect_error(
        raw(r#"{"agent": "ops", "bogus": 1}"#.into()),
        400,
        "invalid_body",
    )
    .await?;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("bogus"),
        "{v}"
    );
    let v = expect_error(
        raw(r#"{"agent": "ops", "metadata": [1]}"#.into()),
        400,
        "invalid_body",
    )
    .await?;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("metadata"),
        "{v}"
    );
    let v = expect_error(
        raw(r#"{"agent": "ops", "id": "nope"}"#.into()),
        400,
        "invalid_body",
    )
    .await?;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("id"),
        "{v}"
    );
    expect_error(raw(r#"{"prompt": "x"}"#.into()), 400, "invalid_body").await?;

    // Over 1 MiB: 413, still in the JSON error shape. The server answers
    // as soon as the body passes the limit and closes the connection, so on
    // a loaded machine the client's upload can meet the closed socket (a
    // broken pipe) before the client reads the answer: such an attempt
    // shows nothing and is made again, while every answer must be the 413.
    let huge = json!({"agent": "ops", "prompt": "x".repeat(2 * 1024 * 1024)}).to_string();
    let mut cut = 0;
    loop {
        match expect_error(raw(huge.clone()), 413, "payload_too_large").await {
            Ok(_) => break,
            Err(e) if cut < 4 && e.downcast_ref::<reqwest::Error>().is_some() => cut += 1,
            Err(e) => return Err(e),
        }
    }
    // Just under the limit is accepted as far as size goes.
    let big = json!({"agent": "chat", "prompt": "y".repeat(1024 * 1024 - 100)}).to_string();
    let (status, v) = send(raw(big)).await?;
    assert_eq!(status, 201, "{v}");

    // No content type.
    expect_error(
        s.client
            .post(s.url("/v1/sessions"))
            .bearer_auth(&t)
            .body(r#"{"agent":"ops"}"#),
        415,
        "unsupported_media_type",
    )
    .await?;

    // Invalid UUID in the path, on every route shape.
    for path in [
        "/v1/sessions/not-a-uuid",
        "/v1/sessions/123/tree",
        "/v1/sessions/xyz/approvals",
        "/v1/sessions/xyz/events",
    ] {
        let v = expect_error(s.get(path, &t), 400, "invalid_id").await?;
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("id"),
            "{v}"
        );
    }
    expect_error(
        s.post("/v1/sessions/nope/messages", &t, &json!({"text": "hi"})),
        400,
        "invalid_id",
    )
    .await?;

    // Bad query strings.
    expect_error(s.get("/v1/sessions?limit=abc", &t), 400, "invalid_query").await?;
    expect_error(s.get("/v1/sessions?limit=0", &t), 400, "invalid_query").await?;
    expect_error(
        s.get("/v1/sessions?status=sleeping", &t),
        400,
        "invalid_query",
    )
    .await?;
    expect_error(s.get("/v1/sessions?cursor=zzz", &t), 400, "invalid_query").await?;
    expect_error(s.get("/v1/sessions?colour=red", &t), 400, "invalid_query").await?;

    // Unknown routes and methods answer JSON too.
    expect_error(s.get("/v1/nothing", &t), 404, "not_found").await?;
    expect_error(
        s.client.delete(s.url("/v1/sessions")).bearer_auth(&t),
        405,
        "method_not_allowed",
    )
    .await?;
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_errors_map_to_one_status_and_code_each() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);

    expect_error(
        s.post("/v1/sessions", &t, &json!({"agent": "nobody"})),
        400,
        "unknown_agent",
    )
    .await?;
    expect_error(
        s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "chat", "prompt": "   "}),
        ),
        400,
        "invalid_request",
    )
    .await?;
    let missing = uuid::Uuid::now_v7();
    expect_error(
        s.get(&format!("/v1/sessions/{missing}"), &t),
        404,
        "not_found",
    )
    .await?;
    expect_error(
        s.post(&format!("/v1/sessions/{missing}/cancel"), &t, &json!({})),
        404,
        "not_found",
    )
    .await?;

    let (id, call) = s.create_pending(&t).await?;
    let approvals = format!("/v1/sessions/{id}/approvals");
    let v = expect_error(
        s.post(
            &approvals,
            &t,
            &json!({"decisions": {"call_nope": {"decision": "approve"}}}),
        ),
        400,
        "unknown_calls",
    )
    .await?;
    assert_eq!(v["error"]["details"]["call_ids"], json!(["call_nope"]));
    assert!(v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("call_nope"));
    expect_error(
        s.post(&approvals, &t, &json!({"decisions": {}})),
        400,
        "empty_submission",
    )
    .await?;
    expect_error(
        s.post(
            &approvals,
            &t,
            &json!({"decisions": {&call: {"decision": "approve"}}, "metadata": {"call_other": {}}}),
        ),
        400,
        "stray_metadata",
    )
    .await?;
    expect_error(
        s.post(
            &approvals,
            &t,
            &json!({"decisions": {&call: {"decision": "maybe"}}}),
        ),
        400,
        "invalid_body",
    )
    .await?;
    let v = expect_error(
        s.post(
            &approvals,
            &t,
            &json!({"decisions": {&call: {"decision": "approve", "override_args": {"key": "forty-two"}}}}),
        ),
        400,
        "invalid_override",
    )
    .await?;
    assert_eq!(v["error"]["details"]["call_id"], call.as_str());
    expect_error(
        s.post(
            &approvals,
            &t,
            &json!({"decisions": {&call: {"decision": "approve"}}, "approved_by": "mallory"}),
        ),
        400,
        "invalid_body",
    )
    .await?;
    // `done` while a call waits for a decision: the session is busy.
    expect_error(
        s.post(&format!("/v1/sessions/{id}/done"), &t, &json!({})),
        409,
        "session_busy",
    )
    .await?;

    // Nothing above was applied: the call is still pending. Deny it, then
    // deciding it again is a conflict.
    let (status, v) = send(s.post(
        &approvals,
        &t,
        &json!({"decisions": {&call: {"decision": "deny", "message": "not today"}}}),
    ))
    .await?;
    assert_eq!(status, 200, "{v}");
    let v = expect_error(
        s.post(
            &approvals,
            &t,
            &json!({"decisions": {&call: {"decision": "approve"}}}),
        ),
        409,
        "already_decided",
    )
    .await?;
    assert_eq!(v["error"]["details"]["call_ids"], json!([call]));

    // Cancelled sessions refuse everything that needs a live session.
    let (status, v) = send(s.post(&format!("/v1/sessions/{id}/cancel"), &t, &json!({}))).await?;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "cancelled");
    expect_error(
        s.post(
            &format!("/v1/sessions/{id}/messages"),
            &t,
            &json!({"text": "hello?"}),
        ),
        409,
        "session_terminal",
    )
    .await?;
    expect_error(
        s.post(&format!("/v1/sessions/{id}/cancel"), &t, &json!({})),
        409,
        "session_terminal",
    )
    .await?;

    // A used idempotency key with a different request.
    let keyed = json!({"agent": "chat", "idempotency_key": "k-1"});
    let (status, _) = send(s.post("/v1/sessions", &t, &keyed)).await?;
    assert_eq!(status, 201);
    expect_error(
        s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "ops", "idempotency_key": "k-1"}),
        ),
        409,
        "already_exists",
    )
    .await?;

    expect_error(
        s.get(&format!("/v1/sessions/{id}/events"), &t)
            .header("Last-Event-ID", "abc"),
        400,
        "invalid_last_event_id",
    )
    .await?;
    s.stop().await
}

// ---- authentication and scopes --------------------------------------------------------

fn claims(tenant: &str, exp: u64) -> Value {
    json!({"sub": "eve", "tenant": tenant, "scopes": ["admin"], "exp": exp, "iat": now()})
}

fn sign(alg: Algorithm, secret: &[u8], claims: &Value) -> String {
    jsonwebtoken::encode(
        &Header::new(alg),
        claims,
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_tokens_are_401_and_missing_scopes_403() -> Result {
    let s = Server::start().await?;
    let list = |t: &str| s.get("/v1/sessions", t);

    // Missing or malformed header.
    let resp = common::answer(s.client.get(s.url("/v1/sessions"))).await?;
    assert_eq!(resp.status, 401);
    assert_eq!(resp.header("www-authenticate"), Some("Bearer"));
    let v = resp.body;
    assert_eq!(v["error"]["code"], "unauthorized");
    expect_error(
        s.client
            .get(s.url("/v1/sessions"))
            .header("authorization", "Basic YTpi"),
        401,
        "unauthorized",
    )
    .await?;
    expect_error(list("garbage"), 401, "unauthorized").await?;

    // Expired (well past the verifier's leeway).
    let expired = sign(
        Algorithm::HS256,
        SECRET.as_bytes(),
        &claims("acme", now() - 3600),
    );
    let v = expect_error(list(&expired), 401, "unauthorized").await?;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("expired"),
        "{v}"
    );

    // Forged: right shape, wrong key.
    let forged = sign(
        Algorithm::HS256,
        b"another-secret-that-is-long-enough-0123456789",
        &claims("acme", now() + 3600),
    );
    expect_error(list(&forged), 401, "unauthorized").await?;

    // `alg: none`, unsigned.
    let none = format!(
        "{}.{}.",
        b64url(br#"{"alg":"none","typ":"JWT"}"#),
        b64url(claims("acme", now() + 3600).to_string().as_bytes())
    );
    expect_error(list(&none), 401, "unauthorized").await?;

    // Right key, wrong algorithm: HS384 when HS256 is pinned.
    let hs384 = sign(
        Algorithm::HS384,
        SECRET.as_bytes(),
        &claims("acme", now() + 3600),
    );
    expect_error(list(&hs384), 401, "unauthorized").await?;

    // No `exp` at all.
    let no_exp = sign(
        Algorithm::HS256,
        SECRET.as_bytes(),
        &json!({"sub": "eve", "tenant": "acme", "scopes": ["admin"]}),
    );
    expect_error(list(&no_exp), 401, "unauthorized").await?;

    // Tampered payload with the original signature.
    let good = sign(
        Algorithm::HS256,
        SECRET.as_bytes(),
        &claims("acme", now() + 3600),
    );
    let parts: Vec<&str> = good.split('.').collect();
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        b64url(claims("other", now() + 3600).to_string().as_bytes()),
        parts[2]
    );
    expect_error(list(&tampered), 401, "unauthorized").await?;
    let (status, _) = send(list(&good)).await?;
    assert_eq!(status, 200, "the untampered token works");

    // Scopes.
    let writer = token("acme", "w", &["sessions:write"]);
    let reader = token("acme", "r", &["sessions:read"]);
    let approver = token("acme", "a", &["approvals:write"]);
    let admin = token("acme", "root", &["admin"]);
    let (id, call) = s.create_pending(&admin).await?;

    expect_error(list(&writer), 403, "forbidden").await?;
    expect_error(
        s.get(&format!("/v1/sessions/{id}"), &approver),
        403,
        "forbidden",
    )
    .await?;
    expect_error(s.get("/v1/agents", &writer), 403, "forbidden").await?;
    expect_error(
        s.get(&format!("/v1/sessions/{id}/events"), &writer),
        403,
        "forbidden",
    )
    .await?;
    expect_error(
        s.post("/v1/sessions", &reader, &json!({"agent": "chat"})),
        403,
        "forbidden",
    )
    .await?;
    expect_error(
        s.post(
            &format!("/v1/sessions/{id}/messages"),
            &reader,
            &json!({"text": "x"}),
        ),
        403,
        "forbidden",
    )
    .await?;
    expect_error(
        s.post(&format!("/v1/sessions/{id}/cancel"), &approver, &json!({})),
        403,
        "forbidden",
    )
    .await?;
    expect_error(
        s.post(&format!("/v1/sessions/{id}/done"), &reader, &json!({})),
        403,
        "forbidden",
    )
    .await?;
    let decide = json!({"decisions": {&call: {"decision": "approve"}}});
    let approvals = format!("/v1/sessions/{id}/approvals");
    expect_error(s.post(&approvals, &writer, &decide), 403, "forbidden").await?;
    expect_error(s.post(&approvals, &reader, &decide), 403, "forbidden").await?;

    // Authentication, then the scope, are decided before the path or the
    // body is looked at.
    expect_error(
        s.client.get(s.url("/v1/sessions/not-a-uuid")),
        401,
        "unauthorized",
    )
    .await?;
    expect_error(
        s.client
            .post(s.url("/v1/sessions"))
            .bearer_auth(&reader)
            .header("content-type", "application/json")
            .body("{not json"),
        403,
        "forbidden",
    )
    .await?;
    expect_error(
        s.post("/v1/sessions/not-a-uuid/cancel", &reader, &json!({})),
        403,
        "forbidden",
    )
    .await?;

    // The right scope works; `admin` implies every scope.
    let (status, v) = send(s.get(&approvals, &reader)).await?;
    assert_eq!(status, 200, "{v}");
    let (status, v) = send(s.post(&approvals, &approver, &decide)).await?;
    assert_eq!(status, 200, "{v}");
    let (status, _) = send(s.get(&format!("/v1/sessions/{id}"), &admin)).await?;
    assert_eq!(status, 200);
    s.stop().await
}

const EC_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQggB8C5slAMkXlTBtn
KFDPtIRF8LTEg8cmZMTahgf+izehRANCAAQ1CAR/DkrJlerdCme/Jcho8uEcOUWl
crc7ZOTEVIofroo2rGubGMThpqeT7P3wyiQmr30ryYQGXpMJiZoATXVq
-----END PRIVATE KEY-----
";
const EC_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAENQgEfw5KyZXq3QpnvyXIaPLhHDlF
pXK3O2TkxFSKH66KNqxrmxjE4aank+z98MokJq99K8mEBl6TCYmaAE11ag==
-----END PUBLIC KEY-----
";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn es256_public_key_verifies_and_pins_its_algorithm() -> Result {
    let s = Server::start_with(
        AuthConfig::es256_pem(EC_PUBLIC.as_bytes())?,
        HttpOptions::default(),
    )
    .await?;
    let key = EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes())?;
    let good = jsonwebtoken::encode(
        &Header::new(Algorithm::ES256),
        &claims("acme", now() + 3600),
        &key,
    )?;
    let (status, v) = send(s.get("/v1/sessions", &good)).await?;
    assert_eq!(status, 200, "{v}");
    // An HS256 token whose "secret" is the public key (key confusion).
    let confused = sign(
        Algorithm::HS256,
        EC_PUBLIC.as_bytes(),
        &claims("acme", now() + 3600),
    );
    expect_error(s.get("/v1/sessions", &confused), 401, "unauthorized").await?;
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auth_none_is_the_local_tenant_and_refused_off_loopback() -> Result {
    let s = Server::start_with(AuthConfig::None, HttpOptions::default()).await?;
    let (status, v) = send(
        s.client
            .post(s.url("/v1/sessions"))
            .json(&json!({"agent": "chat", "prompt": "hi"})),
    )
    .await?;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["tenant"], "local");
    s.stop().await?;

    let open = tokio::net::TcpListener::bind("0.0.0.0:0").await?;
    let overseer = Server::start().await?;
    let err = http::serve(overseer.overseer.clone(), open, AuthConfig::None, async {})
        .await
        .expect_err("auth none on 0.0.0.0 must be refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("loopback"), "{err}");
    assert!(http::check_listener("[::1]:80".parse()?, &AuthConfig::None).is_ok());
    assert!(http::check_listener("10.0.0.1:80".parse()?, &AuthConfig::None).is_err());
    assert!(http::check_listener("10.0.0.1:80".parse()?, &common::hs256()).is_ok());
    overseer.stop().await
}

/// The `error.message` of a refused request to `/v1/sessions` with `token`.
async fn refusal(s: &Server, token: &str) -> anyhow::Result<String> {
    let v = expect_error(s.get("/v1/sessions", token), 401, "unauthorized").await?;
    Ok(v["error"]["message"]
        .as_str()
        .context("message")?
        .to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn time_claims_are_checked_with_a_short_configurable_leeway() -> Result {
    let s = Server::start().await?;
    let admin = |extra: Value| {
        let mut c =
            json!({"sub": "eve", "tenant": "acme", "scopes": ["admin"], "exp": now() + 3600});
        if let (Some(c), Value::Object(extra)) = (c.as_object_mut(), extra) {
            c.extend(extra);
        }
        sign(Algorithm::HS256, SECRET.as_bytes(), &c)
    };
    // Expired half a minute ago: well past the default 5 s leeway (the
    // library's own default, 60 s, would have let it through).
    let expired = admin(json!({"exp": now() - 30}));
    assert_eq!(refusal(&s, &expired).await?, "invalid token: expired");
    // Not valid for another hour.
    let early = admin(json!({"nbf": now() + 3600}));
    assert_eq!(refusal(&s, &early).await?, "invalid token: not yet valid");
    // nbf in the past is fine.
    let (status, v) = send(s.get("/v1/sessions", &admin(json!({"nbf": now() - 10})))).await?;
    assert_eq!(status, 200, "{v}");
    s.stop().await?;

    // The leeway is configurable: with two minutes, the same token passes.
    let lenient = common::hs256().with_leeway(Duration::from_secs(120));
    let s = Server::start_with(lenient, HttpOptions::default()).await?;
    let expired = admin(json!({"exp": now() - 30}));
    let (status, v) = send(s.get("/v1/sessions", &expired)).await?;
    assert_eq!(status, 200, "{v}");
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_tokens_are_explained_in_stable_words_without_library_text() -> Result {
    let s = Server::start().await?;
    let good = claims("acme", now() + 3600);
    let cases: Vec<(String, &str)> = vec![
        (
            sign(
                Algorithm::HS256,
                b"another-secret-that-is-long-enough-0123456789",
                &good,
            ),
            "invalid token: signature",
        ),
        (
            sign(Algorithm::HS384, SECRET.as_bytes(), &good),
            "invalid token: algorithm (expected HS256)",
        ),
        ("garbage".to_owned(), "invalid token: malformed"),
        ("a.b.c".to_owned(), "invalid token: malformed"),
        (
            sign(
                Algorithm::HS256,
                SECRET.as_bytes(),
                &json!({"sub": "eve", "tenant": "acme"}),
            ),
            "invalid token: missing 'exp' claim",
        ),
        (
            sign(
                Algorithm::HS256,
                SECRET.as_bytes(),
                &json!({"sub": "eve", "tenant": "acme", "exp": "tomorrow"}),
            ),
            "invalid token: wrong 'exp' claim",
        ),
        (
            sign(
                Algorithm::HS256,
                SECRET.as_bytes(),
                &json!({"sub": "eve", "tenant": "", "exp": now() + 60}),
            ),
            "invalid token: empty 'tenant' claim",
        ),
        (
            sign(
                Algorithm::HS256,
                SECRET.as_bytes(),
                &json!({"sub": "eve", "tenant": "acme\nother", "exp": now() + 60}),
            ),
            "invalid token: control characters in the 'tenant' claim",
        ),
    ];
    for (token, expected) in cases {
        let message = refusal(&s, &token).await?;
        assert_eq!(message, expected, "for {token}");
        for internal in ["Error", "Json", "Base64", "Invalid", "Signature", "`"] {
            assert!(!message.contains(internal), "library text: {message}");
        }
    }
    s.stop().await
}

// ---- tenant isolation ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_tenants_idempotency_key_neither_collides_nor_reveals_it() -> Result {
    let s = Server::start().await?;
    let a = token("tenant-a", "alice", ALL);
    let b = token("tenant-b", "bob", ALL);
    let body = |key: &str| json!({"agent": "chat", "idempotency_key": key, "title": "t"});

    let (status, mine) = send(s.post("/v1/sessions", &a, &body("shared-key"))).await?;
    assert_eq!(status, 201, "{mine}");
    // Tenant B with the same key: exactly what a key nobody used gives, a
    // new session of B's own, not a 409 that would reveal A's.
    let (status, theirs) = send(s.post("/v1/sessions", &b, &body("shared-key"))).await?;
    assert_eq!(status, 201, "{theirs}");
    let (fresh_status, fresh) = send(s.post("/v1/sessions", &b, &body("never-used"))).await?;
    assert_eq!(fresh_status, 201, "{fresh}");
    assert_ne!(theirs["id"], mine["id"]);
    assert_eq!(theirs["tenant"], "tenant-b");
    let shape = |v: &Value| {
        let mut keys: Vec<String> = v
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    };
    assert_eq!(shape(&theirs), shape(&fresh));
    // Same tenant, same key: the same session again.
    let (status, again) = send(s.post("/v1/sessions", &b, &body("shared-key"))).await?;
    assert_eq!(status, 201);
    assert_eq!(again["id"], theirs["id"]);
    // And A's session stays A's.
    let mine_id = mine["id"].as_str().context("id")?;
    expect_error(
        s.get(&format!("/v1/sessions/{mine_id}"), &b),
        404,
        "not_found",
    )
    .await?;
    let (status, _) = send(s.get(&format!("/v1/sessions/{mine_id}"), &a)).await?;
    assert_eq!(status, 200);
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_tenants_session_is_404_everywhere_and_absent_from_lists() -> Result {
    let s = Server::start().await?;
    let a = token("tenant-a", "alice", ALL);
    let b = token("tenant-b", "bob", &["admin"]);
    let (id, call) = s.create_pending(&a).await?;
    let missing = uuid::Uuid::now_v7().to_string();

    for sid in [id.as_str(), missing.as_str()] {
        let not_found = |v: Value| {
            assert_eq!(
                v["error"]["message"],
                format!("session {sid} not found"),
                "{v}"
            );
        };
        not_found(expect_error(s.get(&format!("/v1/sessions/{sid}"), &b), 404, "not_found").await?);
        not_found(
            expect_error(
                s.get(&format!("/v1/sessions/{sid}/tree"), &b),
                404,
                "not_found",
            )
            .await?,
        );
        not_found(
            expect_error(
                s.get(&format!("/v1/sessions/{sid}/approvals"), &b),
                404,
                "not_found",
            )
            .await?,
        );
        not_found(
            expect_error(
                s.get(&format!("/v1/sessions/{sid}/events"), &b),
                404,
                "not_found",
            )
            .await?,
        );
        not_found(
            expect_error(
                s.post(
                    &format!("/v1/sessions/{sid}/approvals"),
                    &b,
                    &json!({"decisions": {&call: {"decision": "approve"}}}),
                ),
                404,
                "not_found",
            )
            .await?,
        );
        not_found(
            expect_error(
                s.post(
                    &format!("/v1/sessions/{sid}/messages"),
                    &b,
                    &json!({"text": "hi"}),
                ),
                404,
                "not_found",
            )
            .await?,
        );
        not_found(
            expect_error(
                s.post(&format!("/v1/sessions/{sid}/cancel"), &b, &json!({})),
                404,
                "not_found",
            )
            .await?,
        );
        not_found(
            expect_error(
                s.post(&format!("/v1/sessions/{sid}/done"), &b, &json!({})),
                404,
                "not_found",
            )
            .await?,
        );
    }

    let (status, v) = send(s.get("/v1/sessions", &b)).await?;
    assert_eq!(status, 200);
    assert_eq!(v["sessions"], json!([]), "tenant B sees nothing");
    assert_eq!(v["next_cursor"], Value::Null);

    // Tenant A's session is untouched and still decidable by A.
    let (status, v) = send(s.get(&format!("/v1/sessions/{id}/approvals"), &a)).await?;
    assert_eq!(status, 200);
    assert_eq!(v["pending"][0]["call_id"], call.as_str());
    let (status, v) = send(s.get("/v1/sessions", &a)).await?;
    assert_eq!(status, 200);
    assert_eq!(v["sessions"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["sessions"][0]["id"], id.as_str());
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_childs_approval_is_listed_and_decided_at_the_root() -> Result {
    let s = Server::start().await?;
    let a = token("tenant-a", "alice", ALL);
    let b = token("tenant-b", "bob", &["admin"]);
    let root = s.create(&a, "lead", Some("go")).await?;
    let mut events = Sse::open(&s, &a, &root, None).await?;
    events.until_status("awaiting_approval").await?;

    let (status, v) = send(s.get(&format!("/v1/sessions/{root}/approvals"), &a)).await?;
    assert_eq!(status, 200, "{v}");
    let pending = v["pending"].as_array().context("pending")?;
    assert_eq!(pending.len(), 1, "{v}");
    let child = pending[0]["session_id"]
        .as_str()
        .context("child")?
        .to_owned();
    let call = pending[0]["call_id"].as_str().context("call")?.to_owned();
    assert_ne!(child, root);
    assert_eq!(pending[0]["session_path"], json!([root, child]));
    assert_eq!(pending[0]["arguments"], json!({"key": 5}));

    let (status, tree) = send(s.get(&format!("/v1/sessions/{root}/tree"), &a)).await?;
    assert_eq!(status, 200, "{tree}");
    assert_eq!(tree["children"][0]["session_id"], child.as_str());
    assert_eq!(tree["children"][0]["agent"], "ops");

    // The child is the same tenant's: readable by A, invisible to B.
    let (status, _) = send(s.get(&format!("/v1/sessions/{child}"), &a)).await?;
    assert_eq!(status, 200);
    expect_error(
        s.get(&format!("/v1/sessions/{child}"), &b),
        404,
        "not_found",
    )
    .await?;
    expect_error(
        s.post(
            &format!("/v1/sessions/{child}/approvals"),
            &b,
            &json!({"decisions": {&call: {"decision": "approve"}}}),
        ),
        404,
        "not_found",
    )
    .await?;

    let (status, v) = send(s.post(
        &format!("/v1/sessions/{root}/approvals"),
        &a,
        &json!({"decisions": {&call: {"decision": "approve"}}}),
    ))
    .await?;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["pending"], json!([]));
    let rest = events.until_status("awaiting_input").await?;
    let ended = rest
        .iter()
        .find(|m| m.event == "turn_ended")
        .context("turn_ended")?;
    assert_eq!(ended.data["stop_reason"], "end_turn");
    let (_, state) = send(s.get(&format!("/v1/sessions/{root}"), &a)).await?;
    let last = state["transcript"]
        .as_array()
        .and_then(|t| t.last())
        .context("last")?;
    assert!(
        last["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("lead: "),
        "{last}"
    );
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_filters_and_paginates_by_cursor() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let other = token("globex", "gina", ALL);
    let mut chats = Vec::new();
    for _ in 0..5 {
        chats.push(s.create(&t, "chat", None).await?);
    }
    let (ops, _) = s.create_pending(&t).await?;
    s.create(&other, "chat", None).await?;

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let path = match &cursor {
            Some(c) => format!("/v1/sessions?limit=2&cursor={c}"),
            None => "/v1/sessions?limit=2".to_owned(),
        };
        let (status, page) = send(s.get(&path, &t)).await?;
        assert_eq!(status, 200, "{page}");
        let rows = page["sessions"].as_array().context("sessions")?;
        assert!(rows.len() <= 2);
        seen.extend(
            rows.iter()
                .filter_map(|r| r["id"].as_str().map(str::to_owned)),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let mut expected = chats.clone();
    expected.push(ops.clone());
    expected.sort();
    assert_eq!(
        seen, expected,
        "every session of the tenant once, ascending by id"
    );

    let (_, v) = send(s.get("/v1/sessions?agent=ops", &t)).await?;
    let rows: Vec<_> = v["sessions"]
        .as_array()
        .context("rows")?
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(rows, [json!(ops)]);
    let (_, v) = send(s.get("/v1/sessions?status=pending", &t)).await?;
    assert_eq!(v["sessions"].as_array().map(Vec::len), Some(5));
    let (_, v) = send(s.get("/v1/sessions?status=awaiting_approval&agent=ops", &t)).await?;
    assert_eq!(v["sessions"].as_array().map(Vec::len), Some(1));
    s.stop().await
}

// ---- idempotency ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retried_create_and_message_have_one_effect() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let body = json!({"agent": "chat", "idempotency_key": "order-4711", "title": "once", "metadata": {"k": 1}});

    // Concurrent and sequential retries all answer 201 with the same session.
    let (r1, r2) = tokio::join!(
        send(s.post("/v1/sessions", &t, &body)),
        send(s.post("/v1/sessions", &t, &body))
    );
    let r3 = send(s.post("/v1/sessions", &t, &body)).await?;
    let id = r3.1["id"].as_str().context("id")?.to_owned();
    for (status, v) in [r1?, r2?, r3] {
        assert_eq!(status, 201, "{v}");
        assert_eq!(v["id"], id.as_str());
        assert_eq!(v["status"], "pending");
    }
    let (_, list) = send(s.get("/v1/sessions", &t)).await?;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(1));
    // Same key, different request: conflict.
    expect_error(
        s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "ops", "idempotency_key": "order-4711"}),
        ),
        409,
        "already_exists",
    )
    .await?;
    // The server chooses ids; a client-chosen one is refused with a pointer.
    let v = expect_error(
        s.post("/v1/sessions", &t, &json!({"agent": "chat", "id": id})),
        400,
        "invalid_body",
    )
    .await?;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("idempotency_key"),
        "{v}"
    );
    for bad in [json!(""), json!("x".repeat(201)), json!("a\u{1b}b")] {
        expect_error(
            s.post(
                "/v1/sessions",
                &t,
                &json!({"agent": "chat", "idempotency_key": bad}),
            ),
            400,
            "invalid_body",
        )
        .await?;
    }

    // A prompt given at creation is part of the request.
    let with_prompt = json!({"agent": "chat", "idempotency_key": "k2", "prompt": "hi"});
    let (status, _) = send(s.post("/v1/sessions", &t, &with_prompt)).await?;
    assert_eq!(status, 201);
    let (status, _) = send(s.post("/v1/sessions", &t, &with_prompt)).await?;
    assert_eq!(status, 201);
    expect_error(
        s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "chat", "idempotency_key": "k2", "prompt": "bye"}),
        ),
        409,
        "already_exists",
    )
    .await?;

    // Messages with a message_id.
    let mut events = Sse::open(&s, &t, &id, None).await?;
    let msg = json!({"text": "hello", "message_id": "m-1"});
    let path = format!("/v1/sessions/{id}/messages");
    let (a, b) = tokio::join!(send(s.post(&path, &t, &msg)), send(s.post(&path, &t, &msg)));
    let c = send(s.post(&path, &t, &msg)).await?;
    for (status, v) in [a?, b?, c] {
        assert_eq!(status, 202, "{v}");
        assert_eq!(v, json!({"session_id": id, "message_id": "m-1"}));
    }
    expect_error(
        s.post(&path, &t, &json!({"text": "other", "message_id": "m-1"})),
        409,
        "message_id_reused",
    )
    .await?;
    let turn = events.until_status("awaiting_input").await?;
    // A second, distinct message proves the first was accepted only once:
    // the stream holds one acceptance per distinct message.
    let (status, _) =
        send(s.post(&path, &t, &json!({"text": "again", "message_id": "m-2"}))).await?;
    assert_eq!(status, 202);
    let next = events.until_status("awaiting_input").await?;
    let accepted: Vec<_> = turn
        .iter()
        .chain(&next)
        .filter(|m| m.event == "message_accepted")
        .map(|m| m.data["text"].clone())
        .collect();
    assert_eq!(accepted, [json!("hello"), json!("again")]);
    let (_, state) = send(s.get(&format!("/v1/sessions/{id}"), &t)).await?;
    assert_eq!(state["turn"], 2);
    s.stop().await
}

/// Options for a burst of concurrent creates: room for all of them in
/// flight at once.
fn burst_options() -> HttpOptions {
    let mut options = HttpOptions::default();
    options.limits.max_in_flight_requests = 1024;
    options
}

/// Issue 32 item 4, as probed: 100 creates, 16 at a time, each under a
/// fresh key, then 64 callers sending the same keyed create at once, for 50
/// keys (4 keys at a time, so that creates of different keys race too).
/// Every answer is 201 naming the key's one session; the tenant has exactly
/// one session per key; the same request later answers the same; only a
/// different request under a used key is 409.
async fn concurrent_keyed_creates(s: Server) -> Result {
    use futures::StreamExt;
    let t = token("acme", "alice", ALL);
    let body = |key: &str, n: usize| {
        json!({
            "agent": "chat",
            "idempotency_key": key,
            "prompt": format!("hello {n}"),
            "title": format!("order {n}"),
            "metadata": {"b": {"y": 1, "x": [1, 2.5]}, "a": n},
        })
    };
    let fresh: Vec<(u16, Value)> = futures::stream::iter(0..100)
        .map(|n| send(s.post("/v1/sessions", &t, &body(&format!("fresh-{n}"), n))))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    for (status, v) in &fresh {
        assert_eq!(*status, 201, "a create under a fresh key: {v}");
    }

    let mut ids = std::collections::BTreeSet::new();
    for keys in (0..50).collect::<Vec<_>>().chunks(4) {
        let answers = futures::future::join_all(
            keys.iter()
                .flat_map(|&k| (0..64).map(move |_| (k, body(&format!("key-{k}"), k))))
                .map(|(k, b)| {
                    let request = s.post("/v1/sessions", &t, &b);
                    async move { (k, send(request).await) }
                }),
        )
        .await;
        let mut named = std::collections::BTreeMap::new();
        for (k, answer) in answers {
            let (status, v) = answer?;
            assert_eq!(status, 201, "key-{k}: {v}");
            let id = v["id"].as_str().context("id")?.to_owned();
            assert_eq!(v["transcript"][0]["text"], format!("hello {k}"), "{v}");
            let first = named.entry(k).or_insert_with(|| id.clone());
            assert_eq!(*first, id, "key-{k} named two sessions");
        }
        ids.extend(named.into_values());
    }
    assert_eq!(ids.len(), 50, "one session per key");

    // The tenant holds exactly those, plus the fresh ones.
    let mut listed = 0;
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/sessions?limit=200&cursor={c}"),
            None => "/v1/sessions?limit=200".to_owned(),
        };
        let (status, page) = send(s.get(&path, &t)).await?;
        assert_eq!(status, 200, "{page}");
        listed += page["sessions"].as_array().map_or(0, Vec::len);
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(listed, 150);

    // Later: the same request answers the same session; another is a 409,
    // and so is the same request with its metadata keys in another order
    // but another value.
    let (status, v) = send(s.post("/v1/sessions", &t, &body("key-7", 7))).await?;
    assert_eq!(status, 201, "{v}");
    assert!(ids.contains(v["id"].as_str().context("id")?));
    let reordered = json!({
        "metadata": {"a": 7, "b": {"x": [1, 2.5], "y": 1}},
        "title": "order 7",
        "prompt": "hello 7",
        "idempotency_key": "key-7",
        "agent": "chat",
    });
    let (status, v) = send(s.post("/v1/sessions", &t, &reordered)).await?;
    assert_eq!(status, 201, "the same request, keys in another order: {v}");
    for different in [
        body("key-7", 8),
        json!({"agent": "chat", "idempotency_key": "key-7", "prompt": "hello 7"}),
        {
            let mut b = body("key-7", 7);
            b["max_steps"] = json!(2);
            b
        },
    ] {
        expect_error(
            s.post("/v1/sessions", &t, &different),
            409,
            "already_exists",
        )
        .await?;
    }
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_keyed_creates_name_one_session_per_key_on_sled() -> Result {
    let s = Server::start_with(common::hs256(), burst_options()).await?;
    concurrent_keyed_creates(s).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_keyed_creates_name_one_session_per_key_on_postgres() -> Result {
    use overseer::store::postgres::{PgOptions, PgStore};
    let url = common::pg::shared().database().await?;
    let store = PgStore::open(
        &url,
        PgOptions {
            lease: Duration::from_secs(600),
            ..PgOptions::default()
        },
    )
    .await?;
    store
        .heartbeat("http://127.0.0.1:1", Duration::from_secs(10))
        .await?;
    let s = Server::start_on_store(
        tempfile::tempdir()?,
        std::sync::Arc::new(store),
        common::hs256(),
        burst_options(),
    )
    .await?;
    concurrent_keyed_creates(s).await
}

/// The digest is what tells a retry from another request, not the
/// session's state: a prompt stamped a millisecond after the session's
/// creation (as a clock read twice could stamp it, which made 0.3-1 % of
/// keyed creates a 409 for ever, issue 32) still answers its retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keyed_create_is_recognised_by_its_digest_whatever_its_stamps() -> Result {
    use overseer::store::{Durability, SledStore};
    use overseer_actors::store::{Checkpoint, CheckpointStore};
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let body = json!({"agent": "chat", "idempotency_key": "k-stamp", "prompt": "hi", "title": "x"});
    let (status, v) = send(s.post("/v1/sessions", &t, &body)).await?;
    assert_eq!(status, 201, "{v}");
    let id: overseer_actors::model::SessionId = v["id"].as_str().context("id")?.parse()?;
    let dir = s.stop_keep_data().await?;

    // The stored session as the race left it: its creation a millisecond
    // before the prompt's stamp.
    {
        let store = SledStore::open(dir.path(), Durability::Fsync)?;
        let mut header = store.load(id).await?.context("stored")?.header;
        assert!(header.create_digest.is_some(), "no digest recorded");
        header.created_at_ms -= 1;
        store
            .checkpoint(Checkpoint {
                header,
                entries: Vec::new(),
                events: std::sync::Arc::new(Vec::new()),
                metadata: None,
                queued: Vec::new(),
                dequeued: 0..0,
            })
            .await?;
    }

    let s = Server::start_in(dir, common::hs256(), HttpOptions::default()).await?;
    let (status, v) = send(s.post("/v1/sessions", &t, &body)).await?;
    assert_eq!(status, 201, "a retry refused: {v}");
    assert_eq!(v["id"], id.to_string());
    let mut other = body.clone();
    other["prompt"] = json!("bye");
    expect_error(s.post("/v1/sessions", &t, &other), 409, "already_exists").await?;
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_id_whose_message_failed_is_free_again() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "chat", None).await?;
    let path = format!("/v1/sessions/{id}/messages");
    // Refused (blank text): the id is not taken by the refusal...
    expect_error(
        s.post(&path, &t, &json!({"text": "   ", "message_id": "m-1"})),
        400,
        "invalid_request",
    )
    .await?;
    // ...so the corrected message goes through under it.
    let (status, v) =
        send(s.post(&path, &t, &json!({"text": "hello", "message_id": "m-1"}))).await?;
    assert_eq!(status, 202, "{v}");

    // Many large messages refused by a cancelled session (each with a fresh
    // id) are all refused as such, and none is remembered: reusing one id
    // with another text is refused for the session's state again, not as a
    // reused id.
    let (status, _) = send(s.post(&format!("/v1/sessions/{id}/cancel"), &t, &json!({}))).await?;
    assert_eq!(status, 200);
    let big = "x".repeat(900 * 1024);
    for i in 0..20 {
        expect_error(
            s.post(
                &path,
                &t,
                &json!({"text": big, "message_id": format!("big-{i}")}),
            ),
            409,
            "session_terminal",
        )
        .await?;
    }
    expect_error(
        s.post(&path, &t, &json!({"text": "other", "message_id": "big-3"})),
        409,
        "session_terminal",
    )
    .await?;
    s.stop().await
}

// ---- event streams -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resume_with_last_event_id_delivers_every_event_once_in_order() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "ops", Some("write record 7")).await?;

    // First connection: read up to the approval request, then drop it.
    let mut first = Sse::open(&s, &t, &id, None).await?;
    let part1 = first.until_type("approval_requested").await?;
    let call = part1
        .last()
        .and_then(|m| m.data["call_id"].as_str())
        .context("call")?
        .to_owned();
    // Resume from the middle of what was seen, so the replay overlaps the
    // live tail of the old connection.
    let resume_at = part1[part1.len() / 2].id.context("id")?;
    drop(first);

    // Progress while nobody listens.
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{id}/approvals"),
        &t,
        &json!({"decisions": {&call: {"decision": "approve"}}}),
    ))
    .await?;
    assert_eq!(status, 200);

    let mut second = Sse::open(&s, &t, &id, Some(resume_at)).await?;
    let part2 = second.until_status("awaiting_input").await?;
    let seen: Vec<u64> = ids(&part1)
        .into_iter()
        .filter(|&i| i <= resume_at)
        .chain(ids(&part2))
        .collect();
    assert_eq!(
        seen,
        (1..=seen.len() as u64).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    assert_eq!(ids(&part2).first(), Some(&(resume_at + 1)));

    // The same via `?after=`, and the header wins over the query.
    let mut by_query =
        Sse::from_request(s.get(&format!("/v1/sessions/{id}/events?after={resume_at}"), &t))
            .await?;
    let q = by_query.until_status("awaiting_input").await?;
    assert_eq!(ids(&q), ids(&part2));
    let mut both = Sse::from_request(
        s.get(&format!("/v1/sessions/{id}/events?after=1"), &t)
            .header("Last-Event-ID", resume_at.to_string()),
    )
    .await?;
    let h = both.until_status("awaiting_input").await?;
    assert_eq!(ids(&h), ids(&part2));

    // A full replay equals what the two connections saw, event for event.
    let mut full = Sse::open(&s, &t, &id, None).await?;
    let all = full.until_status("awaiting_input").await?;
    let stitched: Vec<_> = part1
        .iter()
        .filter(|m| m.id.is_some_and(|i| i <= resume_at))
        .chain(part2.iter().filter(|m| m.id.is_some()))
        .cloned()
        .collect();
    assert_eq!(all, stitched);

    // Live events continue on a resumed stream.
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{id}/messages"),
        &t,
        &json!({"text": "more"}),
    ))
    .await?;
    assert_eq!(status, 202);
    let more = second.until_status("awaiting_input").await?;
    let last_before = *ids(&part2).last().context("ids")?;
    assert_eq!(ids(&more).first(), Some(&(last_before + 1)));
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_stops_reading_does_not_stall_the_session() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "chatty", None).await?;

    // Opened, never read while the session runs.
    let mut stalled = Sse::open(&s, &t, &id, None).await?;

    let (status, _) = send(s.post(
        &format!("/v1/sessions/{id}/messages"),
        &t,
        &json!({"text": "talk"}),
    ))
    .await?;
    assert_eq!(status, 202);
    // The session streams megabytes of deltas and ends its turn while
    // `stalled` sits unread. A reading client that cannot keep up with that
    // burst is disconnected too, and follows by resuming with its last id.
    let (seen, _connections) = common::follow(&s, &t, &id, |m| {
        m.event == "status_changed" && m.data["status"] == "awaiting_input"
    })
    .await?;
    let seqs = ids(&seen);
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "resuming loses and repeats nothing"
    );
    let (status, v) = send(s.get(&format!("/v1/sessions/{id}/tree"), &t)).await?;
    assert_eq!(status, 200);
    assert_eq!(v["status"], "awaiting_input");
    let (status, v) = send(s.post(&format!("/v1/sessions/{id}/done"), &t, &json!({}))).await?;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "completed");

    // The stalled client fell behind the bounded buffer, so the server ended
    // its stream (had it not, this loop would wait for ever and fail on the
    // read timeout); what it did get is a gap-free prefix, and it resumes by id.
    let mut got = Vec::new();
    while let Some(m) = stalled.next().await? {
        got.push(m);
    }

    let seqs = ids(&got);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let last = seqs.last().copied().unwrap_or(0);
    let mut resumed = Sse::open(&s, &t, &id, Some(last)).await?;
    let rest = resumed.until_status("completed").await?;
    assert_eq!(ids(&rest).first(), Some(&(last + 1)));
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pending_approval_survives_a_graceful_restart() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let (id, call) = s.create_pending(&t).await?;
    let dir = s.stop_keep_data().await?;

    let s = Server::start_in(dir, common::hs256(), HttpOptions::default()).await?;
    let (status, v) = send(s.get(&format!("/v1/sessions/{id}/approvals"), &t)).await?;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["pending"][0]["call_id"], call.as_str());
    let mut events = Sse::open(&s, &t, &id, None).await?;
    let (status, v) = send(s.post(
        &format!("/v1/sessions/{id}/approvals"),
        &t,
        &json!({"decisions": {&call: {"decision": "approve"}}}),
    ))
    .await?;
    assert_eq!(status, 200, "{v}");
    let rest = events.until_status("awaiting_input").await?;
    let finished = rest
        .iter()
        .find(|m| m.event == "tool_call_finished")
        .context("tool_call_finished")?;
    assert_eq!(finished.data["result"], json!({"written": 42}));
    let seqs = ids(&rest);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_ends_open_event_streams() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "chat", Some("hi")).await?;
    let mut events = Sse::open(&s, &t, &id, None).await?;
    events.until_status("awaiting_input").await?;
    // `stop` fails if the server waits on the open stream.
    s.stop().await?;
    assert_eq!(
        events.next().await?,
        None,
        "the stream ended with the server"
    );
    Ok(())
}

// ---- CORS ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cors_is_off_by_default_and_allows_configured_origins() -> Result {
    let preflight = |s: &Server, origin: &str| {
        s.client
            .request(reqwest::Method::OPTIONS, s.url("/v1/sessions"))
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "authorization,content-type",
            )
            .send()
    };
    let s = Server::start().await?;
    let resp = preflight(&s, "https://console.example.com").await?;
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    s.stop().await?;

    let options = HttpOptions {
        cors_allow_origins: vec!["https://console.example.com".into()],
        ..HttpOptions::default()
    };
    let s = Server::start_with(common::hs256(), options).await?;
    let resp = preflight(&s, "https://console.example.com").await?;
    assert_eq!(
        resp.headers()
            .get("access-control-allow-origin")
            .map(|v| v.as_bytes()),
        Some(&b"https://console.example.com"[..])
    );
    let resp = preflight(&s, "https://evil.example.com").await?;
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    s.stop().await?;

    let bad = HttpOptions {
        cors_allow_origins: vec!["console.example.com".into()],
        ..HttpOptions::default()
    };
    assert!(bad.validate().is_err());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_minting_produces_usable_tokens() -> Result {
    let s = Server::start().await?;
    let t = overseer::auth::mint(
        SECRET.as_bytes(),
        "acme",
        "cli",
        &["sessions:read".to_owned()],
        Duration::from_secs(60),
    )?;
    let (status, _) = send(s.get("/v1/sessions", &t)).await?;
    assert_eq!(status, 200);
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_overrides_narrow_the_preset_and_are_shown() -> Result {
    let server = Server::start().await?;
    let token = token("acme", "alice", &["sessions:read", "sessions:write"]);
    // A wider tool list names the extra tools.
    let v = expect_error(
        server.post(
            "/v1/sessions",
            &token,
            &json!({"agent": "lead", "tools": ["write_record", "rm_rf"]}),
        ),
        400,
        "invalid_request",
    )
    .await?;
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("rm_rf") && msg.contains("tools"), "{msg}");
    // Limits may only be lowered.
    expect_error(
        server.post(
            "/v1/sessions",
            &token,
            &json!({"agent": "lead", "max_steps": 1000}),
        ),
        400,
        "invalid_request",
    )
    .await?;
    // A model that is not a configured route.
    let v = expect_error(
        server.post(
            "/v1/sessions",
            &token,
            &json!({"agent": "lead", "model": "gpt-9"}),
        ),
        400,
        "invalid_body",
    )
    .await?;
    assert!(v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("model"));
    // A valid narrowing is recorded and shown.
    let (status, created) = send(server.post(
        "/v1/sessions",
        &token,
        &json!({"agent": "lead", "instructions": "Answer in French.", "tools": ["write_record"], "max_steps": 2}),
    ))
    .await?;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap_or_default().to_owned();
    let (status, shown) = send(server.get(&format!("/v1/sessions/{id}"), &token)).await?;
    assert_eq!(status, 200);
    let cfg = &shown["config"];
    // The test agent has no instructions of its own, so the override is all
    // of them (appending on a new line is covered in the actors tests).
    assert_eq!(cfg["instructions"], "Answer in French.", "{cfg}");
    assert_eq!(cfg["tools"], json!(["write_record"]));
    assert_eq!(cfg["max_steps"], 2);
    server.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_need_admin_and_a_recorder() -> Result {
    // This process never installs a recorder (tests/metrics.rs does, in its
    // own process): the route says so with a 503, after checking access.
    let s = Server::start().await?;
    expect_error(s.client.get(s.url("/metrics")), 401, "unauthorized").await?;
    let reader = token("acme", "a", ALL);
    expect_error(s.get("/metrics", &reader), 403, "forbidden").await?;
    let admin = token("acme", "ops", &["admin"]);
    expect_error(s.get("/metrics", &admin), 503, "metrics_unavailable").await?;
    s.stop().await
}

// ---- interrupt and model switch (issue 15) ------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interrupt_stops_the_turn_and_keeps_the_session() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let (id, call_id) = s.create_pending(&t).await?;
    let mut events = Sse::open(&s, &t, &id, None).await?;
    events.until_type("approval_requested").await?;

    let reader = token("acme", "rita", &["sessions:read"]);
    let path = format!("/v1/sessions/{id}/interrupt");
    expect_error(s.post(&path, &reader, &json!({})), 403, "forbidden").await?;
    let other = token("globex", "gus", ALL);
    expect_error(s.post(&path, &other, &json!({})), 404, "not_found").await?;

    let (status, header) = send(s.post(&path, &t, &json!({}))).await?;
    assert_eq!(status, 200, "{header}");
    assert_eq!(header["status"], "awaiting_input", "{header}");
    assert_eq!(header["last_stop_reason"], "interrupted", "{header}");
    assert!(header.get("transcript").is_none(), "the header alone");
    let ended = events.until_type("turn_ended").await?;
    assert_eq!(
        ended.last().context("turn_ended")?.data["stop_reason"],
        "interrupted"
    );

    // Nothing is left waiting: the call is closed, no approval pending.
    let (_, pending) = send(s.get(&format!("/v1/sessions/{id}/approvals"), &t)).await?;
    assert_eq!(pending["pending"], json!([]), "{pending}");
    let (_, state) = send(s.get(&format!("/v1/sessions/{id}"), &t)).await?;
    let call = state["transcript"]
        .as_array()
        .context("transcript")?
        .iter()
        .find(|e| e["call"]["id"] == call_id.as_str())
        .context("the call's record")?;
    assert_eq!(call["call"]["state"], "cancelled", "{call}");
    expect_error(
        s.post(
            &format!("/v1/sessions/{id}/approvals"),
            &t,
            &json!({"decisions": {&call_id: {"decision": "approve"}}}),
        ),
        409,
        "already_decided",
    )
    .await?;

    // Interrupting an idle session changes nothing; the next message works.
    let (status, again) = send(s.post(&path, &t, &json!({}))).await?;
    assert_eq!((status, &again["status"]), (200, &json!("awaiting_input")));
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{id}/messages"),
        &t,
        &json!({"text": "go on"}),
    ))
    .await?;
    assert_eq!(status, 202);
    let rest = events.until_type("turn_ended").await?;
    assert_eq!(
        rest.last().context("turn_ended")?.data["stop_reason"],
        "end_turn"
    );

    // A session that ended cannot be interrupted.
    let (status, _) = send(s.post(&format!("/v1/sessions/{id}/done"), &t, &json!({}))).await?;
    assert_eq!(status, 200);
    expect_error(s.post(&path, &t, &json!({})), 409, "session_terminal").await?;
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_model_route_is_switched_between_turns_only_to_a_configured_route() -> Result {
    let options = HttpOptions {
        model_routes: vec!["fast".into()],
        ..HttpOptions::default()
    };
    let s = Server::start_with(common::hs256(), options).await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "chat", Some("hello")).await?;
    let mut events = Sse::open(&s, &t, &id, None).await?;
    events.until_type("turn_ended").await?;
    let path = format!("/v1/sessions/{id}/model");

    let refused = expect_error(
        s.post(&path, &t, &json!({"model": "nope"})),
        400,
        "invalid_body",
    )
    .await?;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("'nope'") && message.contains("fast, scripted"),
        "{message}"
    );
    expect_error(
        s.post(&path, &t, &json!({"route": "fast"})),
        400,
        "invalid_body",
    )
    .await?;
    let reader = token("acme", "rita", &["sessions:read"]);
    expect_error(
        s.post(&path, &reader, &json!({"model": "fast"})),
        403,
        "forbidden",
    )
    .await?;

    let (status, header) = send(s.post(&path, &t, &json!({"model": "fast"}))).await?;
    assert_eq!(status, 200, "{header}");
    assert_eq!(header["config"]["model"], "fast", "{header}");
    let changed = events.until_type("model_changed").await?;
    let changed = &changed.last().context("model_changed")?.data;
    assert_eq!(
        (&changed["from"], &changed["to"]),
        (&json!("scripted"), &json!("fast"))
    );
    let (_, state) = send(s.get(&format!("/v1/sessions/{id}"), &t)).await?;
    let last = state["transcript"]
        .as_array()
        .and_then(|t| t.last())
        .context("transcript")?;
    assert_eq!(last["role"], "model_changed", "{last}");

    // The next turn runs on it; mid-turn a switch is refused.
    let (ops, _) = s.create_pending(&t).await?;
    expect_error(
        s.post(
            &format!("/v1/sessions/{ops}/model"),
            &t,
            &json!({"model": "fast"}),
        ),
        409,
        "session_busy",
    )
    .await?;
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{id}/messages"),
        &t,
        &json!({"text": "again"}),
    ))
    .await?;
    assert_eq!(status, 202);
    let rest = events.until_type("turn_ended").await?;
    assert_eq!(
        rest.last().context("turn_ended")?.data["stop_reason"],
        "end_turn"
    );
    // A create may name the extra route too.
    let (status, created) = send(s.post(
        "/v1/sessions",
        &t,
        &json!({"agent": "chat", "model": "fast"}),
    ))
    .await?;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["config"]["model"], "fast");
    s.stop().await
}

/// `POST /v1/sessions/{id}/rules`: a standing rule for one of the session's
/// tools, set by the token's subject (an editor's allow-always over HTTP).
#[tokio::test]
async fn a_tool_rule_is_set_by_the_tokens_subject_and_checked() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let (id, _call) = s.create_pending(&t).await?;
    let path = format!("/v1/sessions/{id}/rules");

    let refused = expect_error(
        s.post(
            &path,
            &t,
            &json!({"tool": "launch_rockets", "rule": "allow"}),
        ),
        400,
        "invalid_request",
    )
    .await?;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("'launch_rockets'"), "{message}");
    expect_error(
        s.post(
            &path,
            &t,
            &json!({"tool": "write_record", "rule": "sometimes"}),
        ),
        400,
        "invalid_body",
    )
    .await?;
    let writer = token("acme", "wes", &["sessions:read", "sessions:write"]);
    expect_error(
        s.post(
            &path,
            &writer,
            &json!({"tool": "write_record", "rule": "allow"}),
        ),
        403,
        "forbidden",
    )
    .await?;
    expect_error(
        s.post(
            &path,
            &token("globex", "gus", ALL),
            &json!({"tool": "write_record", "rule": "allow"}),
        ),
        404,
        "not_found",
    )
    .await?;

    let (status, header) =
        send(s.post(&path, &t, &json!({"tool": "write_record", "rule": "allow"}))).await?;
    assert_eq!(status, 200, "{header}");
    assert_eq!(header["tool_rules"], json!({"write_record": "allow"}));
    let (_, state) = send(s.get(&format!("/v1/sessions/{id}"), &t)).await?;
    let set = state["transcript"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["role"] == "tool_rule_set")
        .context("a tool_rule_set entry")?;
    assert_eq!(
        (&set["tool"], &set["rule"], &set["by"]),
        (&json!("write_record"), &json!("allow"), &json!("alice")),
        "{set}"
    );
    s.stop().await
}

/// An event whose text has multi-byte characters, read through the shared
/// reader with the body cut into one-byte pieces, so that every such
/// character spans pieces (the server's own chunking cannot be steered from
/// a test; cutting what it sent is deterministic): the text arrives whole.
/// A reader decoding each piece as UTF-8 on its own fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_whose_characters_span_chunks_is_read_whole() -> Result {
    let s = Server::start().await?;
    let t = token("acme", "alice", ALL);
    let id = s.create(&t, "chat", None).await?;
    let mut events =
        Sse::from_request_in_chunks(s.get(&format!("/v1/sessions/{id}/events"), &t), Some(1))
            .await?;
    let text = "naïve café — ✓ 🦀 日本語";
    let (status, v) = send(s.post(
        &format!("/v1/sessions/{id}/messages"),
        &t,
        &json!({ "text": text }),
    ))
    .await?;
    assert_eq!(status, 202, "{v}");
    let msgs = events.until_type("message_accepted").await?;
    assert_eq!(msgs.last().context("an event")?.data["text"], text);
    let reply = events.until_status("awaiting_input").await?;
    assert!(reply.iter().any(|m| m.event == "turn_ended"), "{reply:?}");
    s.stop().await
}
