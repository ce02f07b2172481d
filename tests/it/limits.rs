//! Every resource one authenticated writer can grow is bounded, over HTTP:
//! titles and metadata (413, naming the field), the queue of messages behind
//! a running turn (429 queue_full, 413 for one message over the byte bound),
//! and list pages, whose rows carry neither transcript, queue nor metadata.
//! Each limit comes from `[limits]`; nothing accepted before a refusal is
//! lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use overseer_actors::{Limits, RuntimeConfig};
use serde_json::{json, Value};

type Result = anyhow::Result<()>;

async fn server(limits: Limits) -> anyhow::Result<Server> {
    Server::start_with_runtime(RuntimeConfig {
        limits,
        ..RuntimeConfig::default()
    })
    .await
}

#[tokio::test]
async fn titles_and_metadata_past_their_limits_are_413_naming_the_field() -> Result {
    let s = server(Limits {
        max_title_bytes: 16,
        max_metadata_bytes: 1024,
        ..Limits::default()
    })
    .await?;
    let t = token("acme", "alice", ALL);
    let v = expect_error(
        s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "chat", "title": "x".repeat(17)}),
        ),
        413,
        "too_large",
    )
    .await?;
    assert_eq!(v["error"]["details"]["field"], "title");
    assert!(v["error"]["message"].as_str().unwrap().contains("title"));
    let v = expect_error(
        s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "chat", "metadata": {"blob": "y".repeat(2000)}}),
        ),
        413,
        "too_large",
    )
    .await?;
    assert_eq!(v["error"]["details"]["field"], "metadata");
    assert_eq!(v["error"]["details"]["limit"], 1024);
    // Nothing was created by the refusals.
    let (_, list) = send(s.get("/v1/sessions", &t)).await?;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0));
    s.stop().await
}

#[tokio::test]
async fn the_queue_behind_a_waiting_turn_is_bounded_and_kept() -> Result {
    let s = server(Limits {
        max_queued_messages: 3,
        max_queued_bytes: 64 * 1024,
        ..Limits::default()
    })
    .await?;
    let t = token("acme", "alice", ALL);
    let (id, _call) = s.create_pending(&t).await?;
    let path = format!("/v1/sessions/{id}/messages");
    for i in 0..3 {
        let (status, v) = send(s.post(&path, &t, &json!({"text": format!("queued {i}")}))).await?;
        assert_eq!(status, 202, "{v}");
    }
    let v = expect_error(
        s.post(&path, &t, &json!({"text": "one too many"})),
        429,
        "queue_full",
    )
    .await?;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_queued_messages = 3"),
        "{v}"
    );
    // One message alone over the byte bound is too large, not "full".
    expect_error(
        s.post(&path, &t, &json!({"text": "z".repeat(64 * 1024 + 1)})),
        413,
        "too_large",
    )
    .await?;
    // The queue is shown with the session, and kept.
    let (_, session) = send(s.get(&format!("/v1/sessions/{id}"), &t)).await?;
    let texts: Vec<&str> = session["inbox"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["queued 0", "queued 1", "queued 2"]);
    s.stop().await
}

#[tokio::test]
async fn list_rows_carry_no_transcript_queue_or_metadata() -> Result {
    let s = server(Limits::default()).await?;
    let t = token("acme", "alice", ALL);
    let metadata = json!({"blob": "m".repeat(60 * 1024)});
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (status, v) = send(s.post(
            "/v1/sessions",
            &t,
            &json!({"agent": "ops", "prompt": "please write record 7", "metadata": metadata}),
        ))
        .await?;
        assert_eq!(status, 201, "{v}");
        ids.push(v["id"].as_str().unwrap().to_owned());
    }
    // Park each at its approval and queue a large message behind it.
    for id in &ids {
        let mut events = Sse::open(&s, &t, id, None).await?;
        events.until_type("approval_requested").await?;
        let (status, _) = send(s.post(
            &format!("/v1/sessions/{id}/messages"),
            &t,
            &json!({"text": "q".repeat(100 * 1024)}),
        ))
        .await?;
        assert_eq!(status, 202);
    }
    let resp = common::answer(s.get("/v1/sessions?limit=50", &t)).await?;
    assert_eq!(resp.status, 200, "{}", resp.text);
    let (list, body) = (resp.body, resp.text);
    let rows = list["sessions"].as_array().unwrap();
    assert_eq!(rows.len(), 5);
    for row in rows {
        for absent in ["transcript", "inbox", "metadata"] {
            assert!(row.get(absent).is_none(), "{absent} in a list row: {row}");
        }
        assert_eq!(row["queue"]["next"], 1);
    }
    // A page of 5 rows stays small although each session holds 160 KB.
    assert!(
        body.len() < 5 * 4096,
        "a list page of 5 is {} bytes",
        body.len()
    );
    // The session itself still shows everything.
    let (_, one) = send(s.get(&format!("/v1/sessions/{}", ids[0]), &t)).await?;
    assert_eq!(one["metadata"], metadata);
    assert_eq!(one["inbox"].as_array().map(Vec::len), Some(1));
    s.stop().await
}

#[tokio::test]
async fn past_the_live_session_limit_a_create_is_503_with_retry_after() -> Result {
    let s = Server::start_with_runtime(RuntimeConfig {
        limits: Limits {
            max_live_sessions: 1,
            ..Limits::default()
        },
        // Only the limit makes room.
        idle_hibernate: None,
        ..RuntimeConfig::default()
    })
    .await?;
    let t = token("acme", "alice", ALL);
    let (id, _) = s.create_pending(&t).await?;
    let resp = s
        .post("/v1/sessions", &t, &json!({"agent": "chat"}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let v: Value = resp.json().await?;
    assert_eq!(v["error"]["code"], "overloaded");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_live_sessions"),
        "{v}"
    );
    // The parked session is untouched and still decidable.
    let (status, pending) = send(s.get(&format!("/v1/sessions/{id}/approvals"), &t)).await?;
    assert_eq!(status, 200);
    assert_eq!(pending["pending"].as_array().map(Vec::len), Some(1));
    s.stop().await
}

#[tokio::test]
async fn past_a_tenants_quota_a_create_is_429_naming_the_quota() -> Result {
    let s = server(Limits {
        max_sessions_per_tenant_per_day: Some(1),
        ..Limits::default()
    })
    .await?;
    let acme = token("acme", "alice", ALL);
    let (id, _) = s.create_pending(&acme).await?;
    let v = expect_error(
        s.post("/v1/sessions", &acme, &json!({"agent": "chat"})),
        429,
        "quota_exceeded",
    )
    .await?;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_sessions_per_tenant_per_day"),
        "{v}"
    );
    // Another tenant is not refused, and the first session is untouched.
    let globex = token("globex", "bob", ALL);
    let (status, _) = send(s.post("/v1/sessions", &globex, &json!({"agent": "chat"}))).await?;
    assert_eq!(status, 201);
    let (status, pending) = send(s.get(&format!("/v1/sessions/{id}/approvals"), &acme)).await?;
    assert_eq!(status, 200);
    assert_eq!(pending["pending"].as_array().map(Vec::len), Some(1));
    s.stop().await
}
