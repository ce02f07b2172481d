//! Forks (§17) through the in-process API: a new root session from a point
//! of another's history — mid-turn with a pending approval, after a tool
//! result, at the end — each going on on its own while the source is left
//! untouched; a fork of a running source; calls pending or of unknown
//! outcome asked again, never run silently.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::*;
use futures::StreamExt;
use overseer_actors::model::{
    CallState, Decision, SessionId, SessionStatus, StopReason, Submission, TranscriptEntry,
};
use overseer_actors::provider::{
    Provider, ProviderError, ProviderEvent, ProviderRequest, ProviderStream,
};
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::RuntimeConfig;
use overseer_actors::{ForkAt, ForkPointKind};
use serde_json::{json, Value};

fn echo(text: &str) -> Value {
    json!({"name": "echo", "arguments": {"text": text}})
}

fn steps() -> Value {
    json!([
        {"text": "first", "tool_calls": [echo("one")]},
        {"text": "second", "tool_calls": [echo("two")]},
        {"text": "end: {{tool_result}}"},
        {"text": "a later answer"},
        {"text": "and another"}
    ])
}

async fn pending_in(h: &Harness, id: SessionId) -> Vec<(String, Value, bool)> {
    let s = h.ov.state(id).await.unwrap();
    s.header
        .open_calls
        .iter()
        .filter(|c| c.state == CallState::AwaitingApproval)
        .map(|c| (c.name.clone(), c.arguments.clone(), c.outcome_unknown))
        .collect()
}

async fn approve_all(h: &Harness, id: SessionId) {
    for call in h.pending(id).await {
        h.approve(id, &call).await;
    }
}

/// Waits until `id` has a call awaiting approval, or its turn ended.
async fn settle(h: &Harness, id: SessionId) -> SessionStatus {
    poll(
        "the session to wait for someone",
        std::time::Duration::from_millis(2),
        || async {
            let s = h.ov.state(id).await.unwrap();
            matches!(
                s.header.status,
                SessionStatus::AwaitingApproval | SessionStatus::AwaitingInput
            )
            .then_some(s.header.status)
        },
    )
    .await
}

#[tokio::test]
async fn forks_at_a_pending_approval_after_a_tool_result_and_at_the_end_go_on_on_their_own() {
    let h = harness(agent(&["echo"]), steps()).await;
    let (src, _rx) = h.start("go").await;
    assert_eq!(settle(&h, src).await, SessionStatus::AwaitingApproval);

    // 1. Mid-turn, while the source's call waits for a decision: the fork
    //    asks again; nothing runs until someone decides in the fork.
    let mid =
        h.ov.fork(src, ForkAt::Latest, Some("bob".into()))
            .await
            .unwrap();
    assert_eq!(settle(&h, mid).await, SessionStatus::AwaitingApproval);
    let asked = pending_in(&h, mid).await;
    assert_eq!(
        asked,
        vec![("echo".to_owned(), json!({"text": "one"}), false)]
    );
    assert_eq!(
        h.echo_runs.load(Ordering::SeqCst),
        0,
        "nothing ran silently"
    );
    let m = h.ov.state(mid).await.unwrap();
    let origin = m.header.forked_from.unwrap();
    assert_eq!(origin.session, src);
    assert_eq!(m.header.created_by.as_deref(), Some("bob"));
    assert!(m.header.parent.is_none() && m.header.root_id == mid);
    assert_eq!(
        h.pending(src).await.len(),
        1,
        "the source still waits, untouched"
    );

    // The source goes on: its first call runs, then its second one waits.
    approve_all(&h, src).await;
    poll(
        "the source's second call",
        std::time::Duration::from_millis(2),
        || async {
            let p = pending_in(&h, src).await;
            (p.len() == 1 && p[0].1 == json!({"text": "two"})).then_some(())
        },
    )
    .await;

    // 2. After the first tool result (a point of the source's history):
    //    the fork keeps the result and goes on to the next step.
    let history = h.ov.history(src).await.unwrap();
    let after_one = history
        .iter()
        .find(|p| {
            matches!(&p.kind, ForkPointKind::ToolResult { name, state, .. }
            if name == "echo" && *state == CallState::Completed)
        })
        .expect("the first result is a fork point");
    let at_result =
        h.ov.fork(src, ForkAt::Seq(after_one.seq), None)
            .await
            .unwrap();
    assert_eq!(settle(&h, at_result).await, SessionStatus::AwaitingApproval);
    assert_eq!(
        pending_in(&h, at_result).await,
        vec![("echo".to_owned(), json!({"text": "two"}), false)],
        "the fork reached the second step by itself"
    );
    let t = transcript_of(&h.ov, at_result).await;
    let kept = tool_results(&t);
    assert_eq!(kept.len(), 1, "{t:#?}");
    assert_eq!(
        kept[0].1,
        CallState::Completed,
        "the finished call keeps its result"
    );
    assert_eq!(
        h.echo_runs.load(Ordering::SeqCst),
        1,
        "only the source ran it"
    );

    // The source finishes its turn.
    approve_all(&h, src).await;
    poll(
        "the source's turn to end",
        std::time::Duration::from_millis(2),
        || async {
            let s = h.ov.state(src).await.unwrap();
            (s.header.status == SessionStatus::AwaitingInput).then_some(())
        },
    )
    .await;
    let source_transcript = transcript_of(&h.ov, src).await;

    // 3. At the end: the fork waits for input and answers on its own.
    let end = h.ov.fork(src, ForkAt::Latest, None).await.unwrap();
    let e = h.ov.state(end).await.unwrap();
    assert_eq!(e.header.status, SessionStatus::AwaitingInput);
    assert_eq!(e.transcript.len(), source_transcript.len());
    assert_eq!(e.header.last_stop_reason, Some(StopReason::EndTurn));
    let mut rx = h.ov.subscribe(end);
    h.ov.send_message(end, "more").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        final_text(&transcript_of(&h.ov, end).await),
        "a later answer"
    );

    // The other forks go on too: each decides its own calls.
    let mut rx = h.ov.subscribe(mid);
    approve_all(&h, mid).await;
    assert_eq!(settle(&h, mid).await, SessionStatus::AwaitingApproval);
    approve_all(&h, mid).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let mut rx = h.ov.subscribe(at_result);
    approve_all(&h, at_result).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(
        final_text(&transcript_of(&h.ov, at_result).await),
        "end: {\"echo\":{\"text\":\"two\"}}"
    );

    // None of it touched the source.
    assert_eq!(transcript_of(&h.ov, src).await, source_transcript);
    let s = h.ov.state(src).await.unwrap();
    assert!(s.header.forked_from.is_none());
    // Its history lists both turns' results and its turn's end.
    let kinds: Vec<&str> =
        h.ov.history(src)
            .await
            .unwrap()
            .iter()
            .map(|p| match p.kind {
                ForkPointKind::TurnEnded { .. } => "turn",
                ForkPointKind::ToolResult { .. } => "result",
            })
            .collect();
    assert_eq!(kinds, ["result", "result", "turn"]);
    assert_all_terminal(&h, mid).await;
    assert_all_terminal(&h, end).await;
}

#[tokio::test]
async fn a_fork_by_transcript_index_reopens_the_step_and_asks_again() {
    let h = harness(agent(&["echo"]), steps()).await;
    let (src, mut rx) = h.start("go").await;
    settle(&h, src).await;
    approve_all(&h, src).await;
    poll(
        "the second call",
        std::time::Duration::from_millis(2),
        || async { (pending_in(&h, src).await.len() == 1).then_some(()) },
    )
    .await;
    approve_all(&h, src).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    // [user, assistant(echo one), result, assistant(echo two), result, answer]:
    // index 4 keeps the second step's call but not its result.
    let fork = h.ov.fork(src, ForkAt::Index(4), None).await.unwrap();
    assert_eq!(settle(&h, fork).await, SessionStatus::AwaitingApproval);
    let asked = pending_in(&h, fork).await;
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].1, json!({"text": "two"}));
    let f = h.ov.state(fork).await.unwrap();
    assert_eq!(f.transcript.len(), 4);
    assert_eq!(f.header.forked_from.unwrap().index, 4);
    let runs = h.echo_runs.load(Ordering::SeqCst);
    let mut frx = h.ov.subscribe(fork);
    // Denied in the fork: the model is told, the tool does not run.
    h.ov.submit(
        fork,
        Submission::one(h.pending(fork).await[0].clone(), Decision::deny("not here")),
    )
    .await
    .unwrap();
    assert_eq!(turn_end(&mut frx).await, StopReason::EndTurn);
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), runs);
}

/// A provider whose streams for one session never end (the source is
/// mid-stream) and play the scenario for every other.
struct HangFor {
    inner: ScriptedProvider,
    hang: SessionId,
}

#[async_trait::async_trait]
impl Provider for HangFor {
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        if request.session_id == self.hang {
            let start =
                futures::stream::iter(vec![Ok(ProviderEvent::TextDelta("thinking".to_owned()))]);
            return Ok(start.chain(futures::stream::pending()).boxed());
        }
        self.inner.stream(request).await
    }
}

#[tokio::test]
async fn a_running_source_is_forked_from_its_latest_checkpoint_and_keeps_running() {
    let src = SessionId::generate();
    let scenario = Scenario::from_json(
        &json!({"name": "fork", "agents": {"a": [{"text": "the fork answers"}]}}).to_string(),
    )
    .unwrap();
    let provider = Arc::new(HangFor {
        inner: ScriptedProvider::new(scenario),
        hang: src,
    });
    let h = harness_cfg(agent(&[]), provider, RuntimeConfig::default()).await;
    let mut src_rx = h.start_agent_as(src, "a", "think hard").await;
    until(&mut src_rx, |_| true).await;
    let fork = h.ov.fork(src, ForkAt::Latest, None).await.unwrap();
    let mut rx = h.ov.subscribe(fork);
    let f = h.ov.state(fork).await.unwrap();
    if f.header.status == SessionStatus::Running {
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    }
    assert_eq!(
        final_text(&transcript_of(&h.ov, fork).await),
        "the fork answers"
    );
    let s = h.ov.state(src).await.unwrap();
    assert_eq!(
        s.header.status,
        SessionStatus::Running,
        "the source still streams"
    );
    assert!(s
        .transcript
        .iter()
        .all(|e| !matches!(e.as_ref(), TranscriptEntry::Assistant { .. })));
    h.ov.cancel(src).await.unwrap();
}

/// A tool running in the source at the fork point may or may not have taken
/// effect: the fork asks again, marked outcome unknown, and never runs it on
/// its own.
#[tokio::test]
async fn a_call_running_at_the_fork_point_is_asked_again_as_of_unknown_outcome() {
    let h = harness(
        agent(&["stuck"]),
        json!([
            {"tool_calls": [{"name": "stuck", "arguments": {}}]},
            {"text": "after"}
        ]),
    )
    .await;
    let (src, mut rx) = h.start("go").await;
    until(&mut rx, |k| {
        matches!(k, overseer_actors::model::EventKind::ToolCallStarted { .. })
    })
    .await;
    let fork = h.ov.fork(src, ForkAt::Latest, None).await.unwrap();
    assert_eq!(settle(&h, fork).await, SessionStatus::AwaitingApproval);
    let asked = pending_in(&h, fork).await;
    assert_eq!(asked.len(), 1);
    assert!(asked[0].2, "marked outcome_unknown: {asked:?}");
    let f = h.ov.state(fork).await.unwrap();
    let call = &f.header.open_calls[0];
    assert!(call.child.is_none() && call.attempt == 0 && call.result.is_none());
    assert_ne!(
        call.idempotency_key.as_deref(),
        Some(call.id.as_str()),
        "a run the fork approves is an effect of its own"
    );
    h.ov.cancel(src).await.unwrap();
    h.ov.cancel(fork).await.unwrap();
}
