//! Size and admission limits through the in-process API: titles and
//! metadata are bounded at creation, and past the live-session limit new
//! work is refused with `Overloaded` while idle sessions hibernate early to
//! make room. Nothing accepted before is lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::*;
use overseer_actors::model::{SessionStatus, StopReason};
use overseer_actors::store::CheckpointStore;
use overseer_actors::{CreateSession, IdlePressure, Limits, RuntimeConfig, SessionError};
use serde_json::json;

fn limited(limits: Limits) -> RuntimeConfig {
    RuntimeConfig {
        // Nothing hibernates by itself: only the limit makes room.
        idle_hibernate: None,
        limits,
        ..RuntimeConfig::default()
    }
}

fn chat() -> serde_json::Value {
    json!([{"text": "one"}, {"text": "two"}, {"text": "three"}])
}

#[tokio::test]
async fn titles_and_metadata_over_their_limits_are_refused_naming_the_field() {
    let limits = Limits {
        max_title_bytes: 8,
        max_metadata_bytes: 32,
        ..Limits::default()
    };
    let h = harness_cfg(agent(&[]), scripted(chat()), limited(limits)).await;
    let base = CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        ..CreateSession::default()
    };
    let err =
        h.ov.create_session(CreateSession {
            title: Some("a title that is too long".into()),
            ..base.clone()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SessionError::TooLarge { what, limit: 8, .. } if what == "title"),
        "{err:?}"
    );
    let err =
        h.ov.create_session(CreateSession {
            metadata: json!({"blob": "x".repeat(100)}),
            ..base.clone()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SessionError::TooLarge { what, limit: 32, .. } if what == "metadata"),
        "{err:?}"
    );
    // At the limits exactly: accepted.
    h.ov.create_session(CreateSession {
        title: Some("12345678".into()),
        metadata: json!({"k": "v"}),
        ..base
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn past_the_live_session_limit_work_is_refused_then_admitted_once_idle_sessions_hibernate() {
    let limits = Limits {
        max_live_sessions: 2,
        ..Limits::default()
    };
    let h = harness_cfg(agent(&[]), scripted(chat()), limited(limits)).await;
    let (a, mut rx_a) = h.start("hi").await;
    let (_b, mut rx_b) = h.start("hi").await;
    assert_eq!(turn_end(&mut rx_a).await, StopReason::EndTurn);
    assert_eq!(turn_end(&mut rx_b).await, StopReason::EndTurn);
    assert_eq!(h.ov.live_sessions(), 2);
    let c = overseer_actors::model::SessionId::generate();
    let mut rx_c = h.ov.subscribe(c);
    let req = CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("third".into()),
        id: Some(c),
        ..CreateSession::default()
    };
    let err = h.ov.create_session(req.clone()).await.unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::Overloaded {
                retry_after_secs: 1,
                ..
            }
        ),
        "{err:?}"
    );
    // The refusal asked the idle sessions to hibernate: room is made, and
    // the retry is admitted.
    poll(
        "the create to be admitted",
        Duration::from_millis(10),
        || {
            let (ov, req) = (h.ov.clone(), req.clone());
            async move {
                match ov.create_session(req).await {
                    Ok(_) => Some(()),
                    Err(SessionError::Overloaded { .. }) => None,
                    Err(e) => panic!("{e:?}"),
                }
            }
        },
    )
    .await;
    // Nothing accepted before was lost: the hibernated session still takes a
    // message once there is room (waiting for it if needed).
    assert_eq!(turn_end(&mut rx_c).await, StopReason::EndTurn);
    poll(
        "the message to be admitted",
        Duration::from_millis(10),
        || {
            let ov = h.ov.clone();
            async move {
                match ov.send_message(a, "again").await {
                    Ok(()) => Some(()),
                    Err(SessionError::Overloaded { .. }) => None,
                    Err(e) => panic!("{e:?}"),
                }
            }
        },
    )
    .await;
    assert_eq!(turn_end(&mut rx_a).await, StopReason::EndTurn);
    assert_eq!(
        h.ov.state(a).await.unwrap().header.status,
        SessionStatus::AwaitingInput
    );
}

/// A session waiting for an approval takes messages up to its queue's
/// bound, refuses the next one clearly, and runs the queued ones in order
/// once the turn moves on; a reload from the store sees the same queue.
#[tokio::test]
async fn the_queue_behind_a_running_turn_is_bounded_and_survives_a_reload() {
    let limits = Limits {
        max_queued_messages: 3,
        ..Limits::default()
    };
    let steps = json!([
        {"text": "Let me echo.", "tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]},
        {"text": "Result: {{tool_result}}"},
        {"text": "one"}, {"text": "two"}, {"text": "three"}
    ]);
    let h = harness_cfg(agent(&["echo"]), scripted(steps), limited(limits)).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    for i in 0..3 {
        h.ov.send_message(id, format!("queued {i}")).await.unwrap();
    }
    let err = h.ov.send_message(id, "one too many").await.unwrap_err();
    assert!(matches!(err, SessionError::QueueFull { .. }), "{err:?}");
    assert!(err.to_string().contains("max_queued_messages = 3"), "{err}");
    // The store holds the queue beside the header, not in it.
    let stored = h.store.load(id).await.unwrap().unwrap();
    let texts: Vec<&str> = stored.inbox.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["queued 0", "queued 1", "queued 2"]);
    assert_eq!(stored.header.queue.len(), 3);
    let header_json = serde_json::to_string(&stored.header).unwrap();
    assert!(!header_json.contains("queued 0"), "{header_json}");

    let call = h.pending(id).await.remove(0);
    h.approve(id, &call).await;
    for _ in 0..4 {
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    }
    let users: Vec<String> = h
        .transcript(id)
        .await
        .into_iter()
        .filter_map(|e| match e {
            overseer_actors::model::TranscriptEntry::User { text, .. } => Some(text),
            _ => None,
        })
        .collect();
    assert_eq!(users, ["go", "queued 0", "queued 1", "queued 2"]);
    let stored = h.store.load(id).await.unwrap().unwrap();
    assert!(stored.inbox.is_empty());
    assert!(stored.header.queue.is_empty());
}

fn create(tenant: &str) -> CreateSession {
    CreateSession {
        agent: "a".into(),
        tenant: tenant.into(),
        ..CreateSession::default()
    }
}

/// A tenant's daily quota refuses its next create with a message naming
/// the setting, leaves other tenants alone, and renews at the next UTC day.
#[tokio::test(start_paused = true)]
async fn a_tenants_daily_quota_refuses_then_renews_the_next_day() {
    let limits = Limits {
        max_sessions_per_tenant_per_day: Some(2),
        ..Limits::default()
    };
    let h = harness_cfg(agent(&[]), scripted(chat()), limited(limits)).await;
    let first = h.ov.create_session(create("acme")).await.unwrap();
    h.ov.create_session(create("acme")).await.unwrap();
    let err = h.ov.create_session(create("acme")).await.unwrap_err();
    assert!(
        matches!(&err, SessionError::QuotaExceeded { tenant, detail }
            if tenant == "acme" && detail.contains("max_sessions_per_tenant_per_day = 2")),
        "{err:?}"
    );
    // Another tenant has its own quota; what was accepted is untouched.
    h.ov.create_session(create("globex")).await.unwrap();
    assert!(h.store.load(first).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
    h.ov.create_session(create("acme")).await.unwrap();
}

/// A tenant at its live-session quota is refused (not the node: others
/// still create) until one of its sessions ends.
#[tokio::test]
async fn a_tenants_live_quota_refuses_until_one_of_its_sessions_ends() {
    let limits = Limits {
        max_live_sessions_per_tenant: Some(1),
        ..Limits::default()
    };
    let h = harness_cfg(agent(&[]), scripted(chat()), limited(limits)).await;
    let first = h.ov.create_session(create("acme")).await.unwrap();
    let err = h.ov.create_session(create("acme")).await.unwrap_err();
    assert!(
        matches!(&err, SessionError::QuotaExceeded { detail, .. }
            if detail.contains("max_live_sessions_per_tenant = 1")),
        "{err:?}"
    );
    h.ov.create_session(create("globex")).await.unwrap();
    h.ov.cancel(first).await.unwrap();
    poll(
        "the tenant's quota to free up",
        Duration::from_millis(2),
        || async { h.ov.create_session(create("acme")).await.ok() },
    )
    .await;
}

/// Idle for 300 s without pressure; pressure begins past half of a limit
/// of 10 live sessions and the idle time falls to 10 s at the limit.
fn pressured() -> RuntimeConfig {
    RuntimeConfig {
        idle_hibernate: Some(Duration::from_secs(300)),
        idle_pressure: IdlePressure {
            share_pct: 50,
            floor: Duration::from_secs(10),
        },
        limits: Limits {
            max_live_sessions: 10,
            ..Limits::default()
        },
        ..RuntimeConfig::default()
    }
}

/// Starts `n` sessions that answer and wait for input, at the same instant.
async fn idle_sessions(h: &Harness, n: usize) -> Vec<overseer_actors::model::SessionId> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let (id, mut rx) = h.start("hi").await;
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
        ids.push(id);
    }
    ids
}

fn live(h: &Harness) -> usize {
    h.ov.live_sessions()
}

fn hibernations(h: &Harness) -> u64 {
    h.ov.metrics()
        .hibernations
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Waits, in paused time and without touching any session (a request would
/// count as activity), until `n` sessions are live.
async fn until_live(h: &Harness, n: usize) {
    poll(
        &format!("{n} live sessions"),
        Duration::from_millis(100),
        || async { (live(h) == n).then_some(()) },
    )
    .await
}

/// Below the pressure share, an idle session stays live for the configured
/// idle time, not a moment less, then hibernates.
#[tokio::test(start_paused = true)]
async fn without_pressure_idle_sessions_stay_for_the_configured_idle_time() {
    let h = harness_cfg(agent(&[]), scripted(chat()), pressured()).await;
    idle_sessions(&h, 5).await;
    tokio::time::sleep(Duration::from_secs(299)).await;
    assert_eq!(live(&h), 5, "5 of 10 is not past the share: 300 s");
    assert_eq!(hibernations(&h), 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    until_live(&h, 0).await;
    assert_eq!(hibernations(&h), 5);
    assert_eq!(h.ov.bookkeeping().idle, 0);
}

/// Past the pressure share, idle sessions hibernate sooner, oldest first,
/// until the live count is back at the share (the rest wait the configured
/// idle time); a hibernated session still answers, activated from its
/// checkpoint. Nothing else asked them to: no create was refused.
#[tokio::test(start_paused = true)]
async fn under_pressure_idle_sessions_hibernate_sooner_and_still_answer() {
    let h = harness_cfg(agent(&[]), scripted(chat()), pressured()).await;
    let ids = idle_sessions(&h, 8).await;
    assert_eq!(h.ov.bookkeeping().idle, 8);
    // 8 of 10 live: the idle time is 300 s × (10/300)^0.6 ≈ 39 s, then
    // ≈ 77 s at 7 and ≈ 152 s at 6, each counted from when a session
    // became idle: by 200 s three have gone, the first by 40 s.
    tokio::time::sleep(Duration::from_secs(40)).await;
    until_live(&h, 7).await;
    tokio::time::sleep(Duration::from_secs(160)).await;
    until_live(&h, 5).await;
    assert_eq!(hibernations(&h), 3);
    // At the share the configured idle time applies again.
    tokio::time::sleep(Duration::from_secs(99)).await;
    assert_eq!(live(&h), 5);
    // The oldest hibernated first, and answers as if it never had.
    let first = ids[0];
    assert!(!h.ov.is_live(first));
    let mut rx = h.ov.subscribe(first);
    h.ov.send_message(first, "again").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(final_text(&h.transcript(first).await), "two");
    assert!(
        h.ov.metrics()
            .activations
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
}
