//! Long conversations and months of service through the in-process API:
//! context compaction (proactive and after an overflow), interrupting a turn
//! in each of its phases, structured output, the finish reason `length`,
//! switching the model, input expiry and retention.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use overseer_actors::model::{
    AgentConfig, CallState, EventKind, Notification, SessionId, SessionStatus, StopReason,
    TranscriptEntry,
};
use overseer_actors::provider::{
    Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream, RequestPurpose,
};
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::store::CheckpointStore;
use overseer_actors::JanitorConfig;
use overseer_actors::{CreateSession, RuntimeConfig, SessionOverrides};
use serde_json::{json, Value};

// ---- a provider that records what it is asked --------------------------------

/// Plays a scenario like the scripted provider and keeps every request; a
/// request whose transcript ends with a user message containing `HANG`
/// streams `partial ` and then never finishes (a model still answering).
struct Recording {
    inner: ScriptedProvider,
    requests: Arc<Mutex<Vec<ProviderRequest>>>,
}

impl Recording {
    fn new(scenario: Value) -> (Arc<Self>, Arc<Mutex<Vec<ProviderRequest>>>) {
        let scenario = Scenario::from_json(&scenario.to_string()).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        (
            Arc::new(Self {
                inner: ScriptedProvider::new(scenario),
                requests: requests.clone(),
            }),
            requests,
        )
    }
}

fn last_user_text(request: &ProviderRequest) -> Option<&str> {
    request
        .transcript
        .iter()
        .rev()
        .find_map(|e| match e.as_ref() {
            TranscriptEntry::User { text, .. } => Some(text.as_str()),
            _ => None,
        })
}

#[async_trait::async_trait]
impl Provider for Recording {
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        self.requests.lock().unwrap().push(request.clone());
        let hang = request.purpose == RequestPurpose::Step
            && matches!(request.transcript.last().map(|e| e.as_ref()),
                Some(TranscriptEntry::User { text, .. }) if text.contains("HANG"));
        if hang {
            let start =
                futures::stream::iter(vec![Ok(ProviderEvent::TextDelta("partial ".to_owned()))]);
            return Ok(start.chain(futures::stream::pending()).boxed());
        }
        self.inner.stream(request).await
    }

    fn context_window(&self, model: &str) -> Option<u64> {
        self.inner.context_window(model)
    }
}

fn scenario(steps: Value, extra: Value) -> Value {
    let mut s = json!({"name": "long", "agents": steps});
    if let (Some(s), Some(extra)) = (s.as_object_mut(), extra.as_object()) {
        s.extend(extra.clone());
    }
    s
}

/// Every tool result a request carries comes after the assistant entry that
/// proposed its call, in the same request.
fn assert_no_orphan_results(request: &ProviderRequest) {
    let mut proposed = HashSet::new();
    for entry in &request.transcript {
        match entry.as_ref() {
            TranscriptEntry::Assistant { tool_calls, .. } => {
                proposed.extend(tool_calls.iter().map(|c| c.id.clone()));
            }
            TranscriptEntry::ToolResult { call } => assert!(
                proposed.contains(&call.id),
                "a request carries the result of call {} without the call",
                call.id
            ),
            _ => {}
        }
    }
}

fn compacted(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Compacted { .. })
}

// ---- context management ------------------------------------------------------

/// The "model" really has 1,000 tokens (4,000 characters) and advertises no
/// window, so the session only learns of it from the overflow: it compacts,
/// retries and answers, and a later turn still works.
#[tokio::test]
async fn a_context_overflow_compacts_once_retries_and_later_turns_work() {
    let steps = json!({"a": [
        {"text": "Let me echo.", "tool_calls": [{"name": "free_echo", "arguments": {"text": "y".repeat(1000)}}]},
        {"text": "answer one"},
        {"text": "answer two"},
        {"text": "answer three"}
    ]});
    let (provider, requests) = Recording::new(scenario(steps, json!({"context_limit": 1000})));
    let h = harness_with(agent(&["free_echo"]), provider).await;
    let (id, mut rx) = h.start(&"x".repeat(1000)).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(final_text(&h.transcript(id).await), "answer one");

    // Turn two outgrows the context: one overflow, one compaction, one retry.
    h.ov.send_message(id, "z".repeat(1200)).await.unwrap();
    until(&mut rx, compacted).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    assert_eq!(final_text(&t), "answer two");

    // Turn three starts from the summary and still gets its own step.
    h.ov.send_message(id, "and now?").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    assert_eq!(final_text(&t), "answer three");

    // The full history stays stored: both long messages, the tool call and
    // its result are in the transcript, beside the one summary.
    let summaries = t
        .iter()
        .filter(|e| matches!(e, TranscriptEntry::Compaction { .. }))
        .count();
    assert_eq!(summaries, 1, "{t:#?}");
    assert_eq!(tool_results(&t).len(), 1);
    assert!(t
        .iter()
        .any(|e| matches!(e, TranscriptEntry::User { text, .. } if text.len() == 1000)));

    let requests = requests.lock().unwrap().clone();
    let purposes: Vec<RequestPurpose> = requests.iter().map(|r| r.purpose).collect();
    assert_eq!(
        purposes,
        vec![
            RequestPurpose::Step,       // step 1: the tool call
            RequestPurpose::Step,       // step 2: answer one
            RequestPurpose::Step,       // turn two: overflows
            RequestPurpose::Compaction, // the summary
            RequestPurpose::Step,       // the retry: answer two
            RequestPurpose::Step,       // turn three
        ],
        "the requests made"
    );
    for r in &requests {
        assert_no_orphan_results(r);
    }
    // After the compaction, requests open with the summary, fit the real
    // context and still carry the current question.
    for r in &requests[4..] {
        assert!(
            matches!(r.transcript.first().map(|e| e.as_ref()),
                Some(TranscriptEntry::Compaction { summary, .. }) if summary.contains("thing(s)")),
            "a request after compaction does not start with the summary: {:?}",
            r.transcript.first()
        );
        assert!(
            r.approx_chars() / 4 <= 1000 + 100,
            "the retry still overflows"
        );
    }
    assert_eq!(last_user_text(&requests[4]).map(str::len), Some(1200));
    assert_eq!(last_user_text(&requests[5]), Some("and now?"));
    assert_all_terminal(&h, id).await;
}

/// With the window advertised, the session compacts before the request that
/// would pass the threshold, so the model never overflows; the compaction is
/// an event, and a request under critical pressure is warned about.
#[tokio::test]
async fn a_session_compacts_before_it_outgrows_the_advertised_window() {
    let steps = json!({"a": [
        {"text": "first answer"},
        {"text": "second answer"},
        {"text": "third answer"}
    ]});
    // 1,000 tokens advertised, and really so: an overflow would fail the test.
    let (provider, requests) = Recording::new(scenario(
        steps,
        json!({"context_window": 1000, "context_limit": 1000}),
    ));
    let h = harness_with(agent(&[]), provider).await;
    let (id, mut rx) = h.start(&"a".repeat(1600)).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    // 1,600 + 1,800 characters ≈ 850 tokens: past 80 % of the window.
    h.ov.send_message(id, "b".repeat(1800)).await.unwrap();
    let kind = until(&mut rx, |k| {
        compacted(k) || matches!(k, EventKind::Error { .. })
    })
    .await;
    assert!(compacted(&kind), "expected a compaction, got {kind:?}");
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(final_text(&h.transcript(id).await), "second answer");
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3, "no request failed and none was repeated");
    assert_eq!(requests[1].purpose, RequestPurpose::Compaction);
    // The summary stands for the first exchange; the question is kept whole.
    assert!(matches!(
        requests[2].transcript.first().map(|e| e.as_ref()),
        Some(TranscriptEntry::Compaction { .. })
    ));
    assert_eq!(last_user_text(&requests[2]).map(str::len), Some(1800));

    // A single question near the whole window cannot be compacted away: the
    // session warns that the context is under critical pressure.
    h.ov.send_message(id, "c".repeat(3850)).await.unwrap();
    let kind = until(&mut rx, |k| {
        matches!(
            k,
            EventKind::ContextPressure { .. } | EventKind::TurnEnded { .. }
        )
    })
    .await;
    assert!(
        matches!(
            kind,
            EventKind::ContextPressure {
                context_window: 1000,
                ..
            }
        ),
        "expected a pressure warning, got {kind:?}"
    );
}

/// Compaction never separates a tool call from its result, even when the
/// boundary would fall inside a step with many calls.
#[tokio::test]
async fn compaction_keeps_every_call_with_its_result() {
    let calls: Vec<Value> = (0..4)
        .map(|i| json!({"name": "free_echo", "arguments": {"text": format!("{i}{}", "q".repeat(300))}}))
        .collect();
    let steps = json!({"a": [
        {"text": "calling", "tool_calls": calls},
        {"text": "calling again", "tool_calls": calls},
        {"text": "done one"},
        {"text": "done two"}
    ]});
    let (provider, requests) = Recording::new(scenario(
        steps,
        json!({"context_window": 1500, "context_limit": 1500}),
    ));
    let mut a = agent(&["free_echo"]);
    a.max_steps = 10;
    let h = harness_with(a, provider).await;
    let (id, mut rx) = h.start("go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    h.ov.send_message(id, "r".repeat(2000)).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(final_text(&h.transcript(id).await), "done two");
    let requests = requests.lock().unwrap().clone();
    assert!(
        requests
            .iter()
            .any(|r| r.purpose == RequestPurpose::Compaction),
        "the conversation never compacted"
    );
    for r in &requests {
        assert_no_orphan_results(r);
    }
}

// ---- interrupt -------------------------------------------------------------------

/// Interrupting while the model streams keeps the partial text, ends the
/// turn as `interrupted`, keeps the session, and the next message works.
#[tokio::test]
async fn interrupt_while_streaming_keeps_the_text_and_the_session() {
    // The interrupted answer is the first step (the recorder plays it).
    let steps = json!({"a": [{"text": "never played"}, {"text": "after the interrupt"}]});
    let (provider, _) = Recording::new(scenario(steps, json!({})));
    let h = harness_with(agent(&[]), provider).await;
    let (id, mut rx) = h.start("HANG please").await;
    // Interrupt once the model has streamed part of its answer.
    bounded("the partial text", async {
        loop {
            match rx.recv().await {
                Ok(Notification::TextDelta { text, .. }) if text.contains("partial") => return,
                Ok(_) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    })
    .await;
    h.ov.interrupt(id).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::Interrupted);
    let s = h.ov.state(id).await.unwrap();
    assert_eq!(s.header.status, SessionStatus::AwaitingInput);
    assert_eq!(final_text(&h.transcript(id).await).trim(), "partial");
    h.ov.send_message(id, "go on").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(final_text(&h.transcript(id).await), "after the interrupt");
    assert_all_terminal(&h, id).await;
}

/// Interrupting while a tool runs cancels the call (a terminal record with
/// the reason) and keeps the session.
#[tokio::test]
async fn interrupt_while_a_tool_runs_cancels_the_call_and_keeps_the_session() {
    let steps = json!([
        {"tool_calls": [{"name": "stuck_idem", "arguments": {}}]},
        {"text": "next turn works"}
    ]);
    let h = harness(agent(&["stuck_idem"]), steps).await;
    let (id, mut rx) = h.start("run it").await;
    until(&mut rx, |k| matches!(k, EventKind::ToolCallStarted { .. })).await;
    h.ov.interrupt(id).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::Interrupted);
    assert_eq!(
        h.ov.state(id).await.unwrap().header.status,
        SessionStatus::AwaitingInput
    );
    let results = tool_results(&h.transcript(id).await);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].1, CallState::Cancelled);
    assert!(
        results[0].2.to_string().contains("interrupted"),
        "{:?}",
        results[0].2
    );
    assert_all_terminal(&h, id).await;
    h.ov.send_message(id, "again").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(final_text(&h.transcript(id).await), "next turn works");
}

/// Interrupting at an approval closes the pending call as interrupted: a
/// later approval of it is refused and the tool never runs.
#[tokio::test]
async fn interrupt_at_an_approval_closes_it_and_the_tool_never_runs() {
    let steps = json!([
        {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]},
        {"text": "fresh start"}
    ]);
    let h = harness(agent(&["echo"]), steps).await;
    let (id, mut rx) = h.start("echo it").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = h.pending(id).await.remove(0);
    h.ov.interrupt(id).await.unwrap();
    // Whoever shows the pending call (an inbox, an editor) sees it end.
    let finished = until(&mut rx, |k| matches!(k, EventKind::ToolCallFinished { .. })).await;
    assert!(
        matches!(&finished, EventKind::ToolCallFinished { call_id, state: CallState::Cancelled, .. } if *call_id == call),
        "{finished:?}"
    );
    assert_eq!(turn_end(&mut rx).await, StopReason::Interrupted);
    assert!(h.pending(id).await.is_empty());
    let refused =
        h.ov.submit(
            id,
            overseer_actors::model::Submission::one(
                call.clone(),
                overseer_actors::model::Decision::approve(),
            ),
        )
        .await;
    assert!(refused.is_err(), "an interrupted call was approved");
    assert_all_terminal(&h, id).await;
    h.ov.send_message(id, "start over").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(final_text(&h.transcript(id).await), "fresh start");
    assert_eq!(h.echo_runs.load(std::sync::atomic::Ordering::SeqCst), 0);
}

fn delegating_agents() -> Vec<AgentConfig> {
    // A child's tools are within its parent's.
    let mut root = AgentConfig::new("root", &["stuck_idem"]);
    root.subagents = vec!["child".into()];
    let child = AgentConfig::new("child", &["stuck_idem"]);
    vec![root, child]
}

async fn child_of(h: &Harness, id: SessionId) -> SessionId {
    poll("a child to start", Duration::from_millis(2), || async {
        let tree = h.ov.tree(id).await.unwrap();
        tree.children.first().map(|c| c.session_id)
    })
    .await
}

/// Interrupting a parent whose child is working stops the subtree: the
/// child ends, the delegation is closed, nothing is left running, and the
/// parent takes the next message.
#[tokio::test]
async fn interrupting_a_parent_stops_its_subtree() {
    let steps = json!({
        "root": [
            {"tool_calls": [{"name": "delegate_task", "arguments": {"agent": "child", "goal": "work"}}]},
            {"text": "parent carries on"}
        ],
        "child": [{"tool_calls": [{"name": "stuck_idem", "arguments": {}}]}]
    });
    let h = harness_agents(delegating_agents(), steps, RuntimeConfig::default()).await;
    let (id, mut rx) = h.start_agent("root", "delegate").await;
    let child = child_of(&h, id).await;
    let mut child_rx = h.ov.subscribe(child);
    poll(
        "the child's tool to run",
        Duration::from_millis(2),
        || async {
            let s = h.ov.state(child).await.unwrap();
            s.header
                .open_calls
                .iter()
                .any(|c| c.state == CallState::Running)
                .then_some(())
        },
    )
    .await;
    h.ov.interrupt(id).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::Interrupted);
    let _ = bounded("the child to stop", async {
        loop {
            let s = h.ov.state(child).await.unwrap();
            if s.header.status.is_terminal() {
                return;
            }
            let _ = child_rx.recv().await;
        }
    })
    .await;
    assert_all_terminal(&h, id).await;
    assert_all_terminal(&h, child).await;
    h.ov.send_message(id, "what now?").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(final_text(&h.transcript(id).await), "parent carries on");
}

/// Interrupting the child itself ends the child's turn; its parent gets the
/// result (it does not wait for ever) and finishes its own turn.
#[tokio::test]
async fn interrupting_a_child_resolves_the_parents_call() {
    let steps = json!({
        "root": [
            {"tool_calls": [{"name": "delegate_task", "arguments": {"agent": "child", "goal": "work"}}]},
            {"text": "child said {{tool_result}}"}
        ],
        "child": [{"tool_calls": [{"name": "stuck_idem", "arguments": {}}]}]
    });
    let h = harness_agents(delegating_agents(), steps, RuntimeConfig::default()).await;
    let (id, mut rx) = h.start_agent("root", "delegate").await;
    let child = child_of(&h, id).await;
    poll(
        "the child's tool to run",
        Duration::from_millis(2),
        || async {
            let s = h.ov.state(child).await.unwrap();
            s.header
                .open_calls
                .iter()
                .any(|c| c.state == CallState::Running)
                .then_some(())
        },
    )
    .await;
    h.ov.interrupt(child).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    let results = tool_results(&t);
    assert_eq!(results.len(), 1);
    assert!(
        results[0].2.to_string().contains("interrupted"),
        "the parent's call does not say the child was interrupted: {}",
        results[0].2
    );
    assert_all_terminal(&h, id).await;
    assert_all_terminal(&h, child).await;
}

// ---- structured output ---------------------------------------------------------

fn answer_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"verdict": {"type": "string"}, "score": {"type": "integer"}},
        "required": ["verdict", "score"],
        "additionalProperties": false
    })
}

fn with_schema(mut a: AgentConfig) -> AgentConfig {
    a.output_schema = Some(answer_schema());
    a
}

#[tokio::test]
async fn a_valid_answer_becomes_the_sessions_output() {
    let steps = json!({"a": [{"text": "```json\n{\"verdict\": \"ok\", \"score\": 3}\n```"}]});
    let (provider, requests) = Recording::new(scenario(steps, json!({})));
    let h = harness_with(with_schema(agent(&[])), provider).await;
    let (id, mut rx) = h.start("judge").await;
    let ended = until(&mut rx, |k| matches!(k, EventKind::TurnEnded { .. })).await;
    let expected = json!({"verdict": "ok", "score": 3});
    assert!(
        matches!(&ended, EventKind::TurnEnded { stop_reason: StopReason::EndTurn, output: Some(o), .. } if *o == expected),
        "{ended:?}"
    );
    assert_eq!(h.ov.state(id).await.unwrap().header.output, Some(expected));
    // The schema went to the provider (native structured output).
    assert_eq!(
        requests.lock().unwrap()[0].output_schema,
        Some(answer_schema())
    );
}

#[tokio::test]
async fn an_invalid_answer_gets_one_repair_step_with_the_error() {
    let steps = json!({"a": [
        {"text": "{\"verdict\": \"ok\", \"score\": \"three\"}"},
        {"text": "{\"verdict\": \"ok\", \"score\": 3}"}
    ]});
    let (provider, requests) = Recording::new(scenario(steps, json!({})));
    let h = harness_with(with_schema(agent(&[])), provider).await;
    let (id, mut rx) = h.start("judge").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        h.ov.state(id).await.unwrap().header.output,
        Some(json!({"verdict": "ok", "score": 3}))
    );
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    let repair = last_user_text(&requests[1]).unwrap();
    assert!(
        repair.contains("/score") && repair.contains("JSON Schema"),
        "the repair request does not say what was wrong: {repair}"
    );
}

#[tokio::test]
async fn an_answer_invalid_twice_ends_the_turn_with_an_error() {
    let steps = json!([
        {"text": "not json at all"},
        {"text": "{\"verdict\": 1}"},
        {"text": "{\"verdict\": \"ok\", \"score\": 1}"}
    ]);
    let h = harness(with_schema(agent(&[])), steps).await;
    let (id, mut rx) = h.start("judge").await;
    let error = until(
        &mut rx,
        |k| matches!(k, EventKind::Error { message } if message.contains("after one repair")),
    )
    .await;
    assert!(matches!(error, EventKind::Error { .. }));
    assert_eq!(turn_end(&mut rx).await, StopReason::Error);
    let s = h.ov.state(id).await.unwrap();
    assert_eq!(s.header.output, None);
    assert_eq!(s.header.status, SessionStatus::AwaitingInput);
    // The repair allowance is per turn: the next turn is checked afresh.
    h.ov.send_message(id, "again").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        h.ov.state(id).await.unwrap().header.output,
        Some(json!({"verdict": "ok", "score": 1}))
    );
}

#[tokio::test]
async fn a_sessions_own_schema_replaces_the_agents_and_is_checked_at_create() {
    let steps = json!([{"text": "{\"n\": 2}"}]);
    let h = harness(with_schema(agent(&[])), steps).await;
    let bad =
        h.ov.create_session(CreateSession {
            agent: "a".into(),
            tenant: "t".into(),
            prompt: Some("x".into()),
            overrides: SessionOverrides {
                output_schema: Some(json!({"type": 12})),
                ..SessionOverrides::default()
            },
            ..CreateSession::default()
        })
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("output_schema"), "{bad}");
    let id = SessionId::generate();
    let mut rx = h.ov.subscribe(id);
    h.ov.create_session(CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("x".into()),
        id: Some(id),
        overrides: SessionOverrides {
            output_schema: Some(json!({"type": "object", "required": ["n"]})),
            ..SessionOverrides::default()
        },
        ..CreateSession::default()
    })
    .await
    .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        h.ov.state(id).await.unwrap().header.output,
        Some(json!({"n": 2}))
    );
}

/// A child's parsed output reaches its parent in the delegation's result.
#[tokio::test]
async fn a_childs_output_reaches_the_parent() {
    let mut root = AgentConfig::new("root", &[]);
    root.subagents = vec!["judge".into()];
    let mut judge = with_schema(AgentConfig::new("judge", &[]));
    judge.name = "judge".into();
    let steps = json!({
        "root": [
            {"tool_calls": [{"name": "delegate_task", "arguments": {"agent": "judge", "goal": "judge it"}}]},
            {"text": "done"}
        ],
        "judge": [{"text": "{\"verdict\": \"fine\", \"score\": 9}"}]
    });
    let h = harness_agents(vec![root, judge], steps, RuntimeConfig::default()).await;
    let (id, mut rx) = h.start_agent("root", "delegate").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let results = tool_results(&h.transcript(id).await);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].1, CallState::Completed);
    assert_eq!(
        results[0].2.get("output"),
        Some(&json!({"verdict": "fine", "score": 9})),
        "{}",
        results[0].2
    );
}

// ---- finish reason and model switch -------------------------------------------

#[tokio::test]
async fn a_refusal_ends_the_turn_with_refusal_and_runs_nothing() {
    let steps = json!([
        {"text": "I can't help with that.", "finish": "refusal",
            "tool_calls": [{"name": "echo", "arguments": {}}]},
        {"text": "fine"}
    ]);
    let h = harness(agent(&["echo"]), steps).await;
    let (id, mut rx) = h.start("something forbidden").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::Refusal);
    let s = h.ov.state(id).await.unwrap();
    assert_eq!(s.header.last_stop_reason, Some(StopReason::Refusal));
    assert_eq!(s.header.status, SessionStatus::AwaitingInput);
    let transcript = h.transcript(id).await;
    assert!(transcript.iter().any(|e| matches!(e,
        TranscriptEntry::Assistant { finish_reason: Some(f), tool_calls, .. }
            if *f == overseer_actors::provider::FinishReason::Refusal && tool_calls.is_empty())));
    assert!(tool_results(&transcript).is_empty(), "a refused call ran");
    h.ov.send_message(id, "something fine").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
}

#[tokio::test]
async fn an_answer_cut_at_the_length_limit_ends_the_turn_with_max_tokens() {
    let steps =
        json!([{"text": "a long answer that was cut", "finish": "length"}, {"text": "fine"}]);
    let h = harness(agent(&[]), steps).await;
    let (id, mut rx) = h.start("write a lot").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::MaxTokens);
    let s = h.ov.state(id).await.unwrap();
    assert_eq!(s.header.last_stop_reason, Some(StopReason::MaxTokens));
    assert!(h.transcript(id).await.iter().any(|e| matches!(e,
        TranscriptEntry::Assistant { finish_reason: Some(f), text, .. }
            if *f == overseer_actors::provider::FinishReason::Length && text.contains("cut"))));
    h.ov.send_message(id, "shorter").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
}

#[tokio::test]
async fn the_model_changes_between_turns_and_is_recorded() {
    let steps = json!({"a": [{"text": "one"}, {"text": "two"}]});
    let (provider, requests) = Recording::new(scenario(steps, json!({})));
    let h = harness_with(agent(&[]), provider).await;
    let (id, mut rx) = h.start("hi").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let before = h.ov.state(id).await.unwrap().header.config.model.clone();
    h.ov.set_model(id, "bigger").await.unwrap();
    let kind = until(&mut rx, |k| matches!(k, EventKind::ModelChanged { .. })).await;
    assert_eq!(
        kind,
        EventKind::ModelChanged {
            from: before.clone(),
            to: "bigger".into()
        }
    );
    h.ov.send_message(id, "again").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests[0].model, before);
    assert_eq!(requests[1].model, "bigger");
    assert!(h
        .transcript(id)
        .await
        .iter()
        .any(|e| matches!(e, TranscriptEntry::ModelChanged { to, .. } if to == "bigger")));
    // Not mid-turn, and not to nothing.
    assert!(h.ov.set_model(id, " ").await.is_err());
}

async fn stored_model(h: &Harness, id: SessionId) -> String {
    let header = h.store.load_header(id).await.unwrap().unwrap();
    header.config.model.clone()
}

/// Live sessions of one agent hold its configuration once (the runtime
/// shares it); a session that switches model gets a copy of its own, and the
/// others keep theirs.
#[tokio::test]
async fn sessions_of_one_agent_share_its_configuration_until_one_changes_it() {
    let h = harness(
        agent(&[]),
        json!([{"text": "1"}, {"text": "2"}, {"text": "3"}]),
    )
    .await;
    let (a, mut rx_a) = h.start("hi").await;
    assert_eq!(turn_end(&mut rx_a).await, StopReason::EndTurn);
    let (b, mut rx_b) = h.start("hi").await;
    assert_eq!(turn_end(&mut rx_b).await, StopReason::EndTurn);
    let config_a = h.ov.header(a).await.unwrap().config;
    let config_b = h.ov.header(b).await.unwrap().config;
    assert!(
        config_a.ptr_eq(&config_b),
        "two copies of one configuration"
    );

    h.ov.set_model(a, "bigger").await.unwrap();
    let switched = h.ov.header(a).await.unwrap().config;
    let config_b = h.ov.header(b).await.unwrap().config;
    assert_eq!(switched.model, "bigger");
    assert!(!switched.ptr_eq(&config_b));
    assert_eq!(config_b.model, agent(&[]).model);
    // What the store has is what each session runs under.
    assert_eq!(stored_model(&h, a).await, "bigger");
    assert_eq!(stored_model(&h, b).await, agent(&[]).model);

    // A new session of the agent shares the agent's, not the switched one.
    let (c, mut rx_c) = h.start("hi").await;
    assert_eq!(turn_end(&mut rx_c).await, StopReason::EndTurn);
    let config_c = h.ov.header(c).await.unwrap().config;
    assert!(config_c.ptr_eq(&config_b));
}

#[tokio::test]
async fn the_model_cannot_change_mid_turn() {
    let steps = json!([{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}]);
    let h = harness(agent(&["echo"]), steps).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let err = h.ov.set_model(id, "other").await.unwrap_err();
    assert!(err.to_string().contains("awaiting_approval"), "{err}");
}

// ---- expiry and retention ------------------------------------------------------

fn janitor_config(retention: Option<Duration>) -> RuntimeConfig {
    RuntimeConfig {
        janitor: Some(JanitorConfig {
            // Coarse, so paused time skips months in few sweeps.
            interval: Duration::from_secs(300),
            batch: 2,
            retention,
        }),
        ..RuntimeConfig::default()
    }
}

/// A session idle in `awaiting_input` past its agent's `input_timeout_secs`
/// is completed with a recorded reason; one that got a message in time, or
/// whose agent sets no timeout, is not.
#[tokio::test(start_paused = true)]
async fn idle_input_expires_with_a_recorded_reason() {
    let mut expiring = AgentConfig::new("a", &[]);
    expiring.input_timeout_secs = Some(3600);
    let mut forever = AgentConfig::new("forever", &[]);
    forever.name = "forever".into();
    let steps = json!({
        "a": [{"text": "one"}, {"text": "two"}, {"text": "three"}],
        "forever": [{"text": "one"}]
    });
    let h = harness_agents(vec![expiring, forever], steps, janitor_config(None)).await;
    let (idle, mut idle_rx) = h.start_agent("a", "hi").await;
    let (busy, mut busy_rx) = h.start_agent("a", "hi").await;
    let (kept, mut kept_rx) = h.start_agent("forever", "hi").await;
    for rx in [&mut idle_rx, &mut busy_rx, &mut kept_rx] {
        until_status(rx, SessionStatus::AwaitingInput).await;
    }
    tokio::time::sleep(Duration::from_secs(1800)).await;
    h.ov.send_message(busy, "still here").await.unwrap();
    until_status(&mut busy_rx, SessionStatus::AwaitingInput).await;
    tokio::time::sleep(Duration::from_secs(1900)).await;
    until_status(&mut idle_rx, SessionStatus::Completed).await;
    let s = h.ov.state(idle).await.unwrap();
    assert!(
        s.header
            .completion_reason
            .as_deref()
            .is_some_and(|r| r.contains("input_timeout_secs")),
        "{:?}",
        s.header.completion_reason
    );
    assert_eq!(
        h.ov.state(busy).await.unwrap().header.status,
        SessionStatus::AwaitingInput
    );
    tokio::time::sleep(Duration::from_secs(10 * 24 * 3600)).await;
    assert_eq!(
        h.ov.state(kept).await.unwrap().header.status,
        SessionStatus::AwaitingInput
    );
    // The busy one expires in its turn, an hour after its last message.
    until_status(&mut busy_rx, SessionStatus::Completed).await;
}

/// Terminal sessions older than the retention are purged with every row;
/// live ones and recent ones are untouched.
#[tokio::test(start_paused = true)]
async fn retention_purges_old_terminal_sessions_and_nothing_else() {
    let day = Duration::from_secs(24 * 3600);
    let steps = json!({"a": [{"text": "one"}, {"text": "two"}]});
    let mut a = agent(&[]);
    a.max_steps = 5;
    let h = harness_agents(vec![a], steps, janitor_config(Some(day * 30))).await;

    let mut old = Vec::new();
    for _ in 0..5 {
        let (id, mut rx) = h.start("old").await;
        until_status(&mut rx, SessionStatus::AwaitingInput).await;
        h.ov.done(id).await.unwrap();
        old.push(id);
    }
    let (live, mut live_rx) = h.start("live").await;
    until_status(&mut live_rx, SessionStatus::AwaitingInput).await;
    tokio::time::sleep(day * 20).await;
    let (recent, mut recent_rx) = h.start("recent").await;
    until_status(&mut recent_rx, SessionStatus::AwaitingInput).await;
    h.ov.done(recent).await.unwrap();
    assert!(h.store.events_after(old[0], 0, 1000).await.unwrap().len() > 2);

    tokio::time::sleep(day * 11).await;
    for id in &old {
        let id = *id;
        poll(
            "an old session to be purged",
            Duration::from_secs(300),
            || async { h.store.load(id).await.unwrap().is_none().then_some(()) },
        )
        .await;
        assert!(h.store.events_after(id, 0, 1000).await.unwrap().is_empty());
        assert!(
            h.ov.state(id).await.is_err(),
            "a purged session still answers"
        );
    }
    // A few more sweeps change nothing else.
    tokio::time::sleep(Duration::from_secs(3000)).await;
    for id in [live, recent] {
        let stored = h.store.load(id).await.unwrap().expect("kept");
        assert!(!stored.transcript.is_empty());
        assert!(!h.store.events_after(id, 0, 1000).await.unwrap().is_empty());
    }
    assert_eq!(
        h.ov.state(live).await.unwrap().header.status,
        SessionStatus::AwaitingInput
    );
}
