//! The turn loop and approval semantics through the in-process API
//! (`Overseer`), with real actors, the scripted provider and the in-memory
//! store. Timing-dependent rules (approval and tool timeouts) run on paused
//! tokio time; synchronisation is by subscribed events, never by sleeping.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use overseer_actors::model::{
    ApprovalPolicy, CallState, Decision, EventKind, Notification, SessionStatus, StopReason,
    Submission, ToolCallId, TranscriptEntry,
};
use overseer_actors::provider::{
    Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream,
};
use overseer_actors::store::CheckpointStore;
use overseer_actors::{CreateSession, SessionError};
use serde_json::{json, Value};

use crate::common;
use common::*;

// ---- approvals ----------------------------------------------------------------

#[tokio::test]
async fn approve_runs_the_tool_and_the_model_answers_with_its_result() {
    let h = harness(agent(&["echo"]), echo_then_answer()).await;
    let (id, mut rx) = h.start("please echo").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let pending = h.pending(id).await;
    assert_eq!(pending.len(), 1);
    assert_eq!(
        h.echo_runs.load(Ordering::SeqCst),
        0,
        "nothing runs before approval"
    );
    h.ov.submit(
        id,
        Submission {
            decisions: BTreeMap::from([(pending[0].clone(), Decision::approve())]),
            metadata: BTreeMap::from([(pending[0].clone(), json!({"ticket": 7}))]),
            approved_by: Some("alice".into()),
        },
    )
    .await
    .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    assert_eq!(final_text(&t), r#"Result: {"echo":{"text":"hi"}}"#);
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 1);
    let s = h.ov.state(id).await.unwrap();
    assert_eq!(s.header.status, SessionStatus::AwaitingInput);
    let call = match t
        .iter()
        .find(|e| matches!(e, TranscriptEntry::ToolResult { .. }))
    {
        Some(TranscriptEntry::ToolResult { call }) => call.clone(),
        _ => panic!("no tool result"),
    };
    let d = call.decision.unwrap();
    assert_eq!(d.by.as_deref(), Some("alice"));
    assert_eq!(d.metadata, Some(json!({"ticket": 7})));
    assert_eq!(s.header.usage.tool_calls, 1);
    assert_eq!(s.header.usage.provider_requests, 2);
}

#[tokio::test]
async fn approve_with_valid_override_runs_merged_arguments_and_records_the_diff() {
    let h = harness(agent(&["echo"]), echo_then_answer()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = h.pending(id).await.remove(0);
    let over = json!({"count": 3}).as_object().cloned();
    h.ov.submit(
        id,
        Submission::one(
            call.clone(),
            Decision::Approve {
                override_args: over,
                remove_args: Vec::new(),
            },
        ),
    )
    .await
    .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        h.echo_seen.lock().unwrap().clone(),
        vec![json!({"text": "hi", "count": 3})]
    );
    let t = h.transcript(id).await;
    let rec = t
        .iter()
        .find_map(|e| match e {
            TranscriptEntry::ToolResult { call } => Some(call.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(rec.arguments, json!({"text": "hi"}), "the proposal is kept");
    assert_eq!(
        rec.effective_arguments,
        Some(json!({"text": "hi", "count": 3}))
    );
    assert_eq!(
        rec.decision.unwrap().args_diff,
        Some(json!({"count": {"from": null, "to": 3}}))
    );
}

#[tokio::test]
async fn schema_invalid_override_is_refused_and_the_call_stays_decidable() {
    let h = harness(agent(&["echo"]), echo_then_answer()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = h.pending(id).await.remove(0);
    let over = json!({"count": "three"}).as_object().cloned();
    let err =
        h.ov.submit(
            id,
            Submission::one(
                call.clone(),
                Decision::Approve {
                    override_args: over,
                    remove_args: Vec::new(),
                },
            ),
        )
        .await
        .unwrap_err();
    match err {
        SessionError::InvalidOverride { call_id, error } => {
            assert_eq!(call_id, call);
            assert!(error["error"]
                .as_str()
                .unwrap()
                .starts_with("schema validation failed"));
            assert!(!error["validation_errors"].as_array().unwrap().is_empty());
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(h.pending(id).await, vec![call.clone()], "still pending");
    h.approve(id, &call).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        h.echo_seen.lock().unwrap().clone(),
        vec![json!({"text": "hi"})]
    );
}

#[tokio::test]
async fn an_approval_can_remove_an_optional_argument_and_only_a_proposed_one() {
    let steps = json!([
        {"text": "Echo twice?", "tool_calls": [{"name": "echo", "arguments": {"text": "hi", "count": 2}}]},
        {"text": "Result: {{tool_result}}"}
    ]);
    let h = harness(agent(&["echo"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = h.pending(id).await.remove(0);
    let removing = |keys: &[&str]| Decision::Approve {
        override_args: None,
        remove_args: keys.iter().map(|k| (*k).to_owned()).collect(),
    };
    // A required argument cannot go (the schema says so), nor one that was
    // never proposed; nothing is applied.
    for (keys, says) in [
        (&["text"][..], "schema validation failed"),
        (&["zzz"][..], "'zzz' is not among the proposed arguments"),
    ] {
        match h
            .ov
            .submit(id, Submission::one(call.clone(), removing(keys)))
            .await
        {
            Err(SessionError::InvalidOverride { error, .. }) => {
                assert!(error["error"].as_str().unwrap().contains(says), "{error}");
            }
            other => panic!("removing {keys:?}: unexpected {other:?}"),
        }
    }
    assert_eq!(h.pending(id).await, vec![call.clone()], "still pending");
    h.ov.submit(id, Submission::one(call.clone(), removing(&["count"])))
        .await
        .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        h.echo_seen.lock().unwrap().clone(),
        vec![json!({"text": "hi"})]
    );
    let rec = h
        .transcript(id)
        .await
        .iter()
        .find_map(|e| match e {
            TranscriptEntry::ToolResult { call } => Some(call.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(rec.effective_arguments, Some(json!({"text": "hi"})));
    assert_eq!(
        rec.decision.unwrap().args_diff,
        Some(json!({"count": {"from": 2, "removed": true}}))
    );
}

#[tokio::test]
async fn deny_with_message_reaches_the_model() {
    let h = harness(agent(&["echo"]), echo_then_answer()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = h.pending(id).await.remove(0);
    h.ov.submit(id, Submission::one(call, Decision::deny("not today")))
        .await
        .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    assert_eq!(final_text(&t), "Result: Tool denied by user: not today");
    assert_eq!(tool_results(&t)[0].1, CallState::Denied);
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn partial_submission_waits_for_the_rest() {
    let steps = json!([
        {"tool_calls": [
            {"name": "echo", "arguments": {"text": "one"}},
            {"name": "echo", "arguments": {"text": "two"}}
        ]},
        {"text": "both done"}
    ]);
    let h = harness(agent(&["echo"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let pending = h.pending(id).await;
    assert_eq!(pending.len(), 2);
    h.approve(id, &pending[1]).await;
    let s = h.ov.state(id).await.unwrap();
    assert_eq!(s.header.status, SessionStatus::AwaitingApproval);
    assert_eq!(h.pending(id).await, vec![pending[0].clone()]);
    assert_eq!(
        h.echo_runs.load(Ordering::SeqCst),
        0,
        "the step waits for every decision"
    );
    h.approve(id, &pending[0]).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    // Results join the transcript in proposal order.
    assert_eq!(
        h.echo_seen.lock().unwrap().clone(),
        vec![json!({"text": "one"}), json!({"text": "two"})]
    );
    let t = h.transcript(id).await;
    let results: Vec<Value> = tool_results(&t).into_iter().map(|r| r.2).collect();
    assert_eq!(
        results,
        vec![
            json!({"echo": {"text": "one"}}),
            json!({"echo": {"text": "two"}})
        ]
    );
}

#[tokio::test]
async fn submission_errors_name_the_ids_and_change_nothing() {
    let steps = json!([
        {"tool_calls": [
            {"name": "echo", "arguments": {"text": "one"}},
            {"name": "echo", "arguments": {"text": "two"}}
        ]},
        {"text": "ok"}
    ]);
    let h = harness(agent(&["echo"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let p = h.pending(id).await;
    let ghost = ToolCallId::from("call_ghost");

    // Unknown ids (even mixed with a valid one): nothing applied.
    let mut sub = Submission::one(ghost.clone(), Decision::approve());
    sub.decisions.insert(p[0].clone(), Decision::approve());
    assert_eq!(
        h.ov.submit(id, sub).await.unwrap_err(),
        SessionError::UnknownCalls(vec![ghost.clone()])
    );
    assert_eq!(h.pending(id).await.len(), 2);

    // Already decided.
    h.approve(id, &p[0]).await;
    assert_eq!(
        h.ov.submit(id, Submission::one(p[0].clone(), Decision::deny("late")))
            .await
            .unwrap_err(),
        SessionError::AlreadyDecided(vec![p[0].clone()])
    );

    // Metadata for an id not decided in the same submission.
    let mut sub = Submission::one(p[1].clone(), Decision::approve());
    sub.metadata.insert(p[0].clone(), json!({"x": 1}));
    assert_eq!(
        h.ov.submit(id, sub).await.unwrap_err(),
        SessionError::StrayMetadata(vec![p[0].clone()])
    );
    assert_eq!(
        h.pending(id).await,
        vec![p[1].clone()],
        "the stray submission applied nothing"
    );

    // An empty submission.
    assert_eq!(
        h.ov.submit(id, Submission::default()).await.unwrap_err(),
        SessionError::EmptySubmission
    );
    let msg = SessionError::UnknownCalls(vec![ghost]).to_string();
    assert!(msg.contains("call_ghost"), "{msg}");
}

#[tokio::test(start_paused = true)]
async fn undecided_call_is_denied_after_the_approval_timeout() {
    let mut a = agent(&["echo"]);
    a.approval_timeout_secs = 30;
    let h = harness(a, echo_then_answer()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    // Paused time auto-advances to the timer once everything is idle.
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    // The model is told the request timed out, not that a user said no.
    assert_eq!(
        final_text(&t),
        "Result: Tool not run: the approval request timed out (No approval decision received within 30 s)"
    );
    let results = tool_results(&t);
    assert_eq!(results[0].1, CallState::Denied);
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 0);
}

// ---- the tool contract ----------------------------------------------------------

#[tokio::test]
async fn tool_outside_the_scope_fails_with_the_exact_error() {
    // `free_echo` exists in the runtime but not in this agent's tools.
    let steps = json!([
        {"tool_calls": [{"name": "free_echo", "arguments": {}}, {"name": "nope", "arguments": {}}]},
        {"text": "{{tool_result}}"}
    ]);
    let h = harness(agent(&["echo"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    let r = tool_results(&t);
    assert_eq!(
        r[0].2,
        json!({"error": "tool 'free_echo' is not available in this session"})
    );
    assert_eq!(
        r[1].2,
        json!({"error": "tool 'nope' is not available in this session"})
    );
    assert!(r.iter().all(|x| x.1 == CallState::Failed));
}

#[tokio::test]
async fn schema_invalid_arguments_fail_before_approval() {
    let steps = json!([
        {"tool_calls": [{"name": "echo", "arguments": {"txt": 1}}]},
        {"text": "{{tool_result}}"}
    ]);
    let h = harness(agent(&["echo"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    let (_, state, result) = tool_results(&t).remove(0);
    assert_eq!(state, CallState::Failed);
    assert!(result["error"]
        .as_str()
        .unwrap()
        .starts_with("schema validation failed: "));
    assert!(result["validation_errors"].as_array().unwrap().len() >= 2);
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn tool_timeout_fails_the_call_with_its_duration() {
    let steps = json!([
        {"tool_calls": [{"name": "stuck", "arguments": {}}]},
        {"text": "{{tool_result}}"}
    ]);
    let h = harness(agent(&["stuck"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    assert_eq!(
        tool_results(&t)[0].2,
        json!({"error": "tool timed out after 5 s"})
    );
    assert_eq!(tool_results(&t)[0].1, CallState::Failed);
}

#[tokio::test]
async fn oversized_result_is_replaced_by_the_exact_error_object() {
    let steps = json!([
        {"tool_calls": [{"name": "huge", "arguments": {}}]},
        {"text": "ok"}
    ]);
    let h = harness(agent(&["huge"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    let size = 11 * 1024 * 1024 + 2; // the JSON string's quotes
    assert_eq!(
        tool_results(&t)[0].2,
        json!({"error": "Tool result exceeded maximum size of 10485760 bytes", "actual_size": size, "truncated": true})
    );
}

#[tokio::test]
async fn a_panicking_tool_fails_only_its_call() {
    let steps = json!([
        {"tool_calls": [{"name": "boom", "arguments": {}}]},
        {"text": "survived: {{tool_result}}"}
    ]);
    let h = harness(agent(&["boom"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    let (_, state, result) = tool_results(&t).remove(0);
    assert_eq!(state, CallState::Failed);
    let msg = result["error"].as_str().unwrap();
    assert!(msg.starts_with("tool crashed: "), "{msg}");
    assert!(msg.contains("boom went the tool"), "{msg}");
    assert!(final_text(&t).starts_with("survived: "));
    // The session actor is still the same live session and takes more work.
    assert_eq!(
        h.ov.state(id).await.unwrap().header.status,
        SessionStatus::AwaitingInput
    );
}

// ---- cancel -------------------------------------------------------------------

/// Streams one delta, then hangs: a model that is "still thinking".
struct Hanging;

#[async_trait::async_trait]
impl Provider for Hanging {
    async fn stream(&self, _r: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        use futures::StreamExt;
        let first = futures::stream::iter(vec![Ok(ProviderEvent::TextDelta("thinking".into()))]);
        Ok(first.chain(futures::stream::pending()).boxed())
    }
}

#[tokio::test]
async fn cancel_while_streaming() {
    let h = harness_with(agent(&["echo"]), Arc::new(Hanging)).await;
    let (id, mut rx) = h.start("go").await;
    bounded("the first text delta", async {
        loop {
            match rx.recv().await {
                Ok(Notification::TextDelta { .. }) => break,
                Ok(_) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    })
    .await;
    h.ov.cancel(id).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::Cancelled);
    let s = h.ov.state(id).await.unwrap();
    assert_eq!(s.header.status, SessionStatus::Cancelled);
    // The partial text is kept.
    assert_eq!(final_text(&h.transcript(id).await), "thinking");
    assert_all_terminal(&h, id).await;
}

#[tokio::test]
async fn cancel_while_a_tool_runs() {
    let steps = json!([{"tool_calls": [{"name": "stuck", "arguments": {}}]}]);
    let h = harness(agent(&["stuck"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    until(&mut rx, |k| matches!(k, EventKind::ToolCallStarted { .. })).await;
    h.ov.cancel(id).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::Cancelled);
    let t = h.transcript(id).await;
    assert_eq!(tool_results(&t)[0].1, CallState::Cancelled);
    assert_all_terminal(&h, id).await;
}

#[tokio::test]
async fn cancel_while_awaiting_approval() {
    let h = harness(agent(&["echo"]), echo_then_answer()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = h.pending(id).await.remove(0);
    h.ov.cancel(id).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::Cancelled);
    assert_all_terminal(&h, id).await;
    // A decision after the cancel is refused and nothing runs.
    let err =
        h.ov.submit(id, Submission::one(call, Decision::approve()))
            .await
            .unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::Terminal {
                status: SessionStatus::Cancelled,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 0);
}

// ---- turns --------------------------------------------------------------------

#[tokio::test]
async fn max_steps_stops_the_turn() {
    let call = json!({"tool_calls": [{"name": "free_echo", "arguments": {}}]});
    let steps = json!([call, call, call, call]);
    let mut a = agent(&["free_echo"]);
    a.max_steps = 3;
    let h = harness(a, steps).await;
    let (id, mut rx) = h.start("loop forever").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::MaxSteps);
    let s = h.ov.state(id).await.unwrap();
    assert_eq!(s.header.step, 3);
    assert_eq!(s.header.usage.provider_requests, 3);
    assert_eq!(s.header.last_stop_reason, Some(StopReason::MaxSteps));
}

#[tokio::test]
async fn messages_sent_while_running_start_the_next_turns_in_order() {
    let steps = json!([
        {"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]},
        {"text": "first: {{user}}"},
        {"text": "second: {{user}}"},
        {"text": "third: {{user}}"}
    ]);
    let h = harness(agent(&["echo"]), steps).await;
    let (id, mut rx) = h.start("one").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    h.ov.send_message(id, "two").await.unwrap();
    h.ov.send_message(id, "three").await.unwrap();
    assert_eq!(h.ov.state(id).await.unwrap().inbox.len(), 2);
    let call = h.pending(id).await.remove(0);
    h.approve(id, &call).await;
    for _ in 0..3 {
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    }
    let t = h.transcript(id).await;
    let texts: Vec<String> = t
        .iter()
        .filter_map(|e| match e {
            TranscriptEntry::Assistant { text, .. } if !text.is_empty() => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, vec!["first: one", "second: two", "third: three"]);
    let s = h.ov.state(id).await.unwrap();
    assert_eq!(s.header.turn, 3);
    assert!(s.inbox.is_empty());
    assert!(s.header.queue.is_empty());
}

#[tokio::test]
async fn a_terminal_session_refuses_messages() {
    let h = harness(agent(&[]), json!([{"text": "hello"}])).await;
    let (id, mut rx) = h.start("hi").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    h.ov.done(id).await.unwrap();
    // A terminal session's actor is released; it lives on disk only.
    for _ in 0..1000 {
        if !h.ov.is_live(id) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(!h.ov.is_live(id), "actor released");
    let err = h.ov.send_message(id, "more").await.unwrap_err();
    assert_eq!(
        err,
        SessionError::Terminal {
            id,
            status: SessionStatus::Completed
        }
    );
    assert!(err.to_string().contains("completed"));
    assert!(matches!(
        h.ov.cancel(id).await.unwrap_err(),
        SessionError::Terminal { .. }
    ));
}

#[tokio::test]
async fn an_exhausted_scenario_ends_the_turn_with_a_loud_error() {
    let steps = json!([{"tool_calls": [{"name": "free_echo", "arguments": {}}]}]);
    let h = harness(agent(&["free_echo"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::Error);
    // The failure is an error entry of its own, never the assistant's text.
    let transcript = h.transcript(id).await;
    match transcript.last() {
        Some(TranscriptEntry::Error { message, kind, .. }) => {
            assert!(message.contains("scenario exhausted"), "{message}");
            assert_eq!(kind.as_deref(), Some("scenario_exhausted"));
        }
        other => panic!("{other:?}"),
    }
    assert!(!transcript.iter().any(|e| matches!(
        e,
        TranscriptEntry::Assistant { text, .. } if text.contains("scenario exhausted")
    )));
}

#[tokio::test]
async fn auto_policy_never_asks_and_always_policy_asks_for_everything() {
    let mut a = agent(&["echo"]);
    a.approval = ApprovalPolicy::Auto;
    let h = harness(a, echo_then_answer()).await;
    let (_, mut rx) = h.start("go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 1);

    let mut a = agent(&["free_echo"]);
    a.approval = ApprovalPolicy::Always;
    let steps = json!([{"tool_calls": [{"name": "free_echo", "arguments": {}}]}, {"text": "ok"}]);
    let h = harness(a, steps).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    assert_eq!(h.pending(id).await.len(), 1);
}

#[tokio::test]
async fn every_transition_is_checkpointed_before_it_is_observable() {
    let h = harness(agent(&["echo"]), echo_then_answer()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    // What a subscriber saw is already in the store.
    let stored = h.store.load(id).await.unwrap().unwrap();
    assert_eq!(stored.header.status, SessionStatus::AwaitingApproval);
    let events = h.ov.events_after(id, 0, 1000).await.unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "dense, ordered"
    );
}

// ---- idempotency and overrides ------------------------------------------------

#[tokio::test]
async fn a_retried_message_id_has_one_effect_and_a_reused_one_conflicts() {
    let steps = json!([{"text": "one"}, {"text": "two"}]);
    let h = harness(agent(&[]), steps).await;
    let (id, mut rx) = h.start("first").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    h.ov.send_message_with_id(id, "again", Some("m-1".into()))
        .await
        .unwrap();
    // The retry answers like the first time and changes nothing.
    h.ov.send_message_with_id(id, "again", Some("m-1".into()))
        .await
        .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let users = h
        .transcript(id)
        .await
        .iter()
        .filter(|e| matches!(e, TranscriptEntry::User { .. }))
        .count();
    assert_eq!(users, 2, "the retry added no message");
    let err =
        h.ov.send_message_with_id(id, "something else", Some("m-1".into()))
            .await
            .unwrap_err();
    assert!(
        matches!(err, SessionError::Conflict(ref m) if m.contains("m-1")),
        "{err:?}"
    );
}

#[tokio::test]
async fn overrides_narrow_the_preset_and_are_recorded() {
    let mut a = agent(&["echo", "free_echo"]);
    a.instructions = "Be brief.".into();
    let h = harness(a, json!([{"text": "ok"}])).await;
    let create = |overrides: overseer_actors::SessionOverrides| CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        overrides,
        ..CreateSession::default()
    };
    let wide = overseer_actors::SessionOverrides {
        tools: Some(vec!["echo".into(), "rm_rf".into(), "sudo".into()]),
        ..Default::default()
    };
    let err = h.ov.create_session(create(wide)).await.unwrap_err();
    assert_eq!(
        err,
        SessionError::Invalid("tools: not available to agent 'a': rm_rf, sudo".into())
    );
    let higher = overseer_actors::SessionOverrides {
        max_steps: Some(50),
        ..Default::default()
    };
    let err = h.ov.create_session(create(higher)).await.unwrap_err();
    assert!(err.to_string().contains("max_steps"), "{err}");
    let ok = overseer_actors::SessionOverrides {
        instructions: Some("Answer in French.".into()),
        tools: Some(vec!["echo".into()]),
        max_steps: Some(2),
        ..Default::default()
    };
    let id = h.ov.create_session(create(ok)).await.unwrap();
    let cfg = h.ov.state(id).await.unwrap().header.config;
    assert_eq!(cfg.instructions, "Be brief.\nAnswer in French.");
    assert_eq!(cfg.tools, vec!["echo"]);
    assert_eq!(cfg.max_steps, 2);
}

#[tokio::test]
async fn concurrent_creates_of_one_id_create_it_once() {
    let h = harness(agent(&[]), json!([{"text": "ok"}, {"text": "ok"}])).await;
    let id = overseer_actors::model::SessionId::generate();
    let make = || CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        id: Some(id),
        ..CreateSession::default()
    };
    let (a, b) = tokio::join!(h.ov.create_session(make()), h.ov.create_session(make()));
    let oks = [&a, &b].iter().filter(|r| r.is_ok()).count();
    assert_eq!(oks, 1, "{a:?} {b:?}");
    assert!([a, b]
        .into_iter()
        .any(|r| r == Err(SessionError::AlreadyExists(id))));
}

// ---- a session's own tools ---------------------------------------------------

/// A tool only some sessions have (as an edge's per-session MCP server's).
struct Own(overseer_actors::tool::ToolSpec);

#[async_trait::async_trait]
impl overseer_actors::tool::Tool for Own {
    fn spec(&self) -> &overseer_actors::tool::ToolSpec {
        &self.0
    }
    async fn call(
        &self,
        ctx: overseer_actors::tool::ToolContext,
        _arguments: Value,
    ) -> Result<Value, overseer_actors::tool::ToolError> {
        Ok(json!({"mine_for": ctx.session_id.to_string()}))
    }
}

fn own_tool() -> Arc<dyn overseer_actors::tool::Tool> {
    Arc::new(Own(overseer_actors::tool::ToolSpec::new(
        "mine__say",
        "A session's own tool",
        object_schema(),
    )))
}

/// A session's own tools are in its scope and run; another session of the
/// same agent does not have them, a create naming tools it was not given is
/// refused, and once they are taken away their calls fail as not available.
#[tokio::test]
async fn a_sessions_own_tools_are_its_alone() {
    let call_then_answer = json!([
        {"tool_calls": [{"name": "mine__say", "arguments": {}}]},
        {"text": "said {{tool_result}}"},
        {"tool_calls": [{"name": "mine__say", "arguments": {}}]},
        {"text": "then {{tool_result}}"}
    ]);
    let h = harness(agent(&[]), call_then_answer).await;
    let create = |id, session_tools: Vec<String>| CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("say it".into()),
        id: Some(id),
        session_tools,
        ..CreateSession::default()
    };

    let mine = overseer_actors::model::SessionId::generate();
    let refused =
        h.ov.create_session(create(mine, vec!["mine__say".into()]))
            .await;
    assert!(
        matches!(&refused, Err(SessionError::Invalid(m)) if m.contains("mine__say")),
        "{refused:?}"
    );
    h.ov.set_session_tools(mine, vec![own_tool()]).unwrap();
    let mut rx = h.ov.subscribe(mine);
    h.ov.create_session(create(mine, vec!["mine__say".into()]))
        .await
        .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let s = h.ov.state(mine).await.unwrap();
    assert!(s.header.config.tools.contains(&"mine__say".to_owned()));
    let results = tool_results(&h.transcript(mine).await);
    assert_eq!(results[0].1, CallState::Completed, "{results:?}");
    assert_eq!(results[0].2, json!({"mine_for": mine.to_string()}));

    let other = overseer_actors::model::SessionId::generate();
    let mut rx2 = h.ov.subscribe(other);
    h.ov.create_session(create(other, vec![])).await.unwrap();
    assert_eq!(turn_end(&mut rx2).await, StopReason::EndTurn);
    let results = tool_results(&h.transcript(other).await);
    assert_eq!(
        results[0].1,
        CallState::Failed,
        "another session ran it: {results:?}"
    );

    h.ov.clear_session_tools(mine);
    h.ov.send_message(mine, "again").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let results = tool_results(&h.transcript(mine).await);
    assert_eq!(results.len(), 2);
    assert_eq!(results[1].1, CallState::Failed, "{results:?}");
    assert!(
        results[1].2.to_string().contains("not available"),
        "{results:?}"
    );
}
