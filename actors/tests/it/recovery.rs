//! Supervision, restart from checkpoints and hibernation through the
//! in-process API. Fault-point tests need the `fault-injection` feature
//! (`cargo test --workspace --all-features`); hibernation tests run always.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use overseer_actors::model::{SessionStatus, StopReason};
use overseer_actors::RuntimeConfig;

fn hibernating(secs: u64) -> RuntimeConfig {
    RuntimeConfig {
        idle_hibernate: Some(Duration::from_secs(secs)),
        ..RuntimeConfig::default()
    }
}

/// Waits (in paused time) until the session has no live actor.
async fn until_hibernated(h: &Harness, id: overseer_actors::model::SessionId) {
    poll(
        "the session to hibernate",
        Duration::from_secs(1),
        || async { (!h.ov.is_live(id)).then_some(()) },
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn a_hibernated_session_is_activated_by_a_message() {
    let steps = serde_json::json!([{"text": "one"}, {"text": "two: {{user}}"}]);
    let h = harness_cfg(agent(&[]), scripted(steps), hibernating(10)).await;
    let (id, mut rx) = h.start("first").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    until_hibernated(&h, id).await;
    assert_eq!(h.ov.metrics().hibernations.load(Ordering::Relaxed), 1);
    h.ov.send_message(id, "second").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(final_text(&h.transcript(id).await), "two: second");
    assert!(h.ov.metrics().activations.load(Ordering::Relaxed) >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_hibernated_session_is_activated_by_an_approval() {
    let h = harness_cfg(
        agent(&["echo"]),
        scripted(echo_then_answer()),
        hibernating(10),
    )
    .await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    until_hibernated(&h, id).await;
    // Still listable and decidable while only on disk.
    let call = h.pending(id).await.remove(0);
    h.approve(id, &call).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_approval_timeout_fires_while_hibernated() {
    let mut a = agent(&["echo"]);
    a.approval_timeout_secs = 120;
    let h = harness_cfg(a, scripted(echo_then_answer()), hibernating(10)).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    until_hibernated(&h, id).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        final_text(&h.transcript(id).await),
        "Result: Tool not run: the approval request timed out (No approval decision received within 120 s)"
    );
}

/// Stops the first runtime (as a crashed process would, its in-memory
/// journal is gone) and recovers the same store in a fresh one, whose echo
/// tool counts its runs in `runs`.
async fn restart(
    h: &Harness,
    agent: overseer_actors::model::AgentConfig,
    steps: serde_json::Value,
    runs: std::sync::Arc<std::sync::atomic::AtomicU32>,
) -> overseer_actors::Overseer {
    h.ov.shutdown().await.unwrap();
    let ov = overseer_actors::Overseer::start(
        vec![agent],
        std::sync::Arc::new(h.store.clone()),
        scripted(steps),
        tools(runs, Default::default()),
        RuntimeConfig::default(),
    )
    .await
    .unwrap();
    assert_eq!(ov.recover().await.unwrap(), 1);
    ov
}

async fn crash_and_recover(
    h: &Harness,
    agent: overseer_actors::model::AgentConfig,
    steps: serde_json::Value,
) -> overseer_actors::Overseer {
    restart(h, agent, steps, Default::default()).await
}

/// A session that only waits for a person costs nothing to recover: it is
/// not loaded and gets no actor (as if hibernated), its approval timer is
/// armed, and its decision activates it.
#[tokio::test]
async fn a_session_parked_at_a_restart_stays_on_disk_until_its_decision() {
    let h = harness(agent(&["echo"]), echo_then_answer()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let ov = restart(&h, agent(&["echo"]), echo_then_answer(), runs.clone()).await;
    assert!(
        !ov.is_live(id),
        "recovery spawned an actor for a session that waits for a decision"
    );
    assert_eq!(ov.bookkeeping().timers, 1, "its approval timer is armed");
    assert_eq!(approve_the_pending_call(&ov, id).await, StopReason::EndTurn);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        final_text(&transcript_of(&ov, id).await),
        r#"Result: {"echo":{"text":"hi"}}"#
    );
    assert_eq!(ov.bookkeeping().timers, 0, "the decision disarmed it");
}

/// Its timer, armed by recovery from the recorded deadline, activates it.
#[tokio::test(start_paused = true)]
async fn a_session_parked_at_a_restart_times_out_at_its_recorded_deadline() {
    let mut a = agent(&["echo"]);
    a.approval_timeout_secs = 120;
    let h = harness(a.clone(), echo_then_answer()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let ov = crash_and_recover(&h, a, echo_then_answer()).await;
    assert!(!ov.is_live(id));
    let mut rx = ov.subscribe(id);
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        final_text(&transcript_of(&ov, id).await),
        "Result: Tool not run: the approval request timed out (No approval decision received within 120 s)"
    );
}

#[tokio::test]
async fn after_a_process_crash_a_running_call_with_unknown_outcome_is_asked_again() {
    use overseer_actors::model::{CallState, Decision, EventKind, Submission};
    let steps = serde_json::json!([
        {"tool_calls": [{"name": "stuck", "arguments": {}}]},
        {"text": "{{tool_result}}"}
    ]);
    let h = harness(agent(&["stuck"]), steps.clone()).await;
    let (id, mut rx) = h.start("go").await;
    until(&mut rx, |k| matches!(k, EventKind::ToolCallStarted { .. })).await;
    let ov = crash_and_recover(&h, agent(&["stuck"]), steps).await;
    let s = ov.state(id).await.unwrap();
    assert_eq!(s.header.status, SessionStatus::AwaitingApproval);
    let call = &s.header.open_calls[0];
    assert_eq!(call.state, CallState::AwaitingApproval);
    assert!(call.outcome_unknown);
    // Refusing the re-run fails the call with the interrupted error.
    let mut rx = ov.subscribe(id);
    ov.submit(
        id,
        Submission::one(call.id.clone(), Decision::deny("do not re-run")),
    )
    .await
    .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = ov.state(id).await.unwrap();
    let text = final_text(
        &t.transcript
            .iter()
            .map(|e| (**e).clone())
            .collect::<Vec<_>>(),
    );
    assert!(
        text.contains("interrupted: the process stopped while this tool was running"),
        "{text}"
    );
}

#[tokio::test]
async fn after_a_process_crash_an_idempotent_call_is_retried_with_the_same_key() {
    use overseer_actors::model::EventKind;
    let steps = serde_json::json!([{"tool_calls": [{"name": "stuck_idem", "arguments": {}}]}]);
    let h = harness(agent(&["stuck_idem"]), steps.clone()).await;
    let (id, mut rx) = h.start("go").await;
    until(&mut rx, |k| matches!(k, EventKind::ToolCallStarted { .. })).await;
    let first = h.ov.state(id).await.unwrap().header.open_calls[0].clone();
    let ov = crash_and_recover(&h, agent(&["stuck_idem"]), steps).await;
    let s = ov.state(id).await.unwrap();
    let call = &s.header.open_calls[0];
    assert_eq!(call.attempt, 2, "dispatched again");
    assert_eq!(
        call.idempotency_key, first.idempotency_key,
        "with the same key"
    );
    assert_eq!(call.idempotency_key.as_deref(), Some(first.id.as_str()));
    assert!(!call.outcome_unknown);
    ov.cancel(id).await.unwrap();
}

#[cfg(feature = "fault-injection")]
mod faults {
    use super::*;
    use overseer_actors::model::{CallState, Decision, EventKind, Submission, TranscriptEntry};
    use overseer_actors::SessionError;
    use serde_json::Value;

    /// The comparable shape of a transcript: roles, texts, tool names, states and
    /// results (ids differ between runs).
    fn shape(t: &[TranscriptEntry]) -> Vec<String> {
        t.iter()
            .map(|e| match e {
                TranscriptEntry::User { text, .. } => format!("user: {text}"),
                TranscriptEntry::Assistant {
                    text, tool_calls, ..
                } => {
                    let names: Vec<&str> = tool_calls.iter().map(|c| c.name.as_str()).collect();
                    format!("assistant: {text} {names:?}")
                }
                TranscriptEntry::ToolResult { call } => format!(
                    "tool {}: {:?} {}",
                    call.name,
                    call.state,
                    call.result.clone().unwrap_or(Value::Null)
                ),
                TranscriptEntry::Compaction { summary, .. } => format!("summary: {summary}"),
                TranscriptEntry::ModelChanged { from, to, .. } => format!("model: {from} -> {to}"),
                TranscriptEntry::Error { message, .. } => format!("error: {message}"),
                TranscriptEntry::ToolRuleSet { tool, rule, .. } => {
                    format!("rule: {tool} {}", rule.as_str())
                }
                TranscriptEntry::SkillActivated { name, .. } => format!("skill: {name}"),
            })
            .collect()
    }

    use overseer_actors::fault::{arm, FaultAction, FaultPlan, FaultPoint};

    async fn baseline() -> Vec<String> {
        let h = harness(agent(&["echo"]), echo_then_answer()).await;
        let (id, mut rx) = h.start("go").await;
        until_status(&mut rx, SessionStatus::AwaitingApproval).await;
        let call = h.pending(id).await.remove(0);
        h.approve(id, &call).await;
        turn_end(&mut rx).await;
        shape(&h.transcript(id).await)
    }

    /// Runs the approve-and-execute scenario with one panic planned at
    /// `point` on hit `nth`, and checks the §10 promise.
    async fn survives(point: FaultPoint, nth: u64) {
        let expected = baseline().await;
        let h = harness(agent(&["echo"]), echo_then_answer()).await;
        let id = overseer_actors::model::SessionId::generate();
        arm(FaultPlan {
            point,
            nth,
            action: FaultAction::Panic,
            session: Some(id),
            agent: None,
            repeat: false,
        });
        let mut rx = h.start_agent_as(id, "a", "go").await;
        until_status(&mut rx, SessionStatus::AwaitingApproval).await;
        // A fault before the approval may restart the session; the pending
        // call survives it.
        let call = poll("the pending call", Duration::from_millis(5), || async {
            h.pending(id).await.into_iter().next()
        })
        .await;
        // If the actor dies between the decision's checkpoint and the reply,
        // the caller is told to check: a retry then finds it already decided.
        poll(
            "the decision to be accepted",
            Duration::from_millis(5),
            || {
                let call = call.clone();
                let h = &h;
                async move {
                    match h
                        .ov
                        .submit(id, Submission::one(call, Decision::approve()))
                        .await
                    {
                        Ok(()) | Err(SessionError::AlreadyDecided(_)) => Some(()),
                        Err(SessionError::Unavailable { .. }) => None,
                        Err(e) => panic!("{e:?}"),
                    }
                }
            },
        )
        .await;
        poll("the turn to end", Duration::from_millis(5), || async {
            let s = h.ov.state(id).await.unwrap();
            assert!(!s.header.status.is_terminal(), "{:?}", s.header);
            (s.header.status == SessionStatus::AwaitingInput).then_some(())
        })
        .await;
        let t = h.transcript(id).await;
        assert_eq!(shape(&t), expected, "same transcript as without the fault");
        assert_eq!(
            h.echo_runs.load(Ordering::SeqCst),
            1,
            "the tool ran exactly once"
        );
        let asked =
            h.ov.events_after(id, 0, 10_000)
                .await
                .unwrap()
                .into_iter()
                .filter(|e| matches!(e.kind, EventKind::ApprovalRequested { .. }))
                .count();
        assert_eq!(asked, 1, "the decided approval is not asked again");
        assert!(
            h.ov.metrics().restarts.load(Ordering::Relaxed) >= 1,
            "a restart happened"
        );
        assert!(t.iter().all(|e| match e {
            TranscriptEntry::ToolResult { call } => call.state == CallState::Completed,
            _ => true,
        }));
    }

    #[tokio::test]
    async fn after_checkpoint() {
        survives(FaultPoint::AfterCheckpoint, 2).await;
    }

    /// The checkpoint that parks the session is durable but the actor dies
    /// before publishing its events: the restart publishes what subscribers
    /// missed (the helper waits for the `awaiting_approval` event).
    #[tokio::test]
    async fn after_checkpoint_before_publication() {
        let run = survives(FaultPoint::AfterCheckpoint, 1);
        tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the missed events were never published");
    }

    #[tokio::test]
    async fn before_tool_dispatch() {
        survives(FaultPoint::BeforeToolDispatch, 1).await;
    }

    #[tokio::test]
    async fn during_tool() {
        survives(FaultPoint::DuringTool, 1).await;
    }

    #[tokio::test]
    async fn mid_stream() {
        survives(FaultPoint::MidStream, 1).await;
    }

    #[tokio::test]
    async fn after_decision_ack() {
        survives(FaultPoint::AfterDecisionAck, 1).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_loop_fails_the_session_after_max_restarts_with_backoff() {
        let steps = serde_json::json!([{"text": "hello there"}]);
        let h = harness(agent(&[]), steps).await;
        let id = overseer_actors::model::SessionId::generate();
        arm(FaultPlan {
            point: FaultPoint::MidStream,
            nth: 1,
            action: FaultAction::Panic,
            session: Some(id),
            agent: None,
            repeat: true,
        });
        let mut rx = h.ov.subscribe(id);
        let started = tokio::time::Instant::now();
        h.ov.create_session(overseer_actors::CreateSession {
            agent: "a".into(),
            tenant: "t".into(),
            prompt: Some("go".into()),
            id: Some(id),
            ..Default::default()
        })
        .await
        .unwrap();
        // A neighbour session is unaffected.
        let (other, mut other_rx) = h.start("hi").await;
        assert_eq!(turn_end(&mut other_rx).await, StopReason::EndTurn);
        until_status(&mut rx, SessionStatus::Failed).await;
        // Backoff 100 + 200 + 400 ms of (paused, deterministic) tokio time.
        assert!(
            started.elapsed() >= Duration::from_millis(700),
            "{:?}",
            started.elapsed()
        );
        let s = h.ov.state(id).await.unwrap();
        let err = s.header.error.unwrap();
        assert!(err.starts_with("restart limit exceeded: "), "{err}");
        assert!(err.contains("injected fault"), "{err}");
        assert_eq!(h.ov.metrics().restarts.load(Ordering::Relaxed), 3);
        assert_eq!(
            h.ov.state(other).await.unwrap().header.status,
            SessionStatus::AwaitingInput
        );
        // The orchestrator still serves new sessions.
        let (_, mut rx3) = h.start("again").await;
        assert_eq!(turn_end(&mut rx3).await, StopReason::EndTurn);
    }
}
