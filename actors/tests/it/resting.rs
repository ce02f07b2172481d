//! Sessions at rest (issue 28, smaller live sessions): a session parked on
//! an approval or awaiting input lets go of its transcript and metadata,
//! and takes them back from the store on the next input that needs them,
//! then goes on exactly as a session that kept them.
//!
//! Observed through the shared [`TestStore`]: whole-session reads count
//! each restore (a session that kept its transcript, see
//! [`testing::keep_at_rest`], answers from memory and reads nothing), and
//! each checkpoint's entry indexes and event numbers are recorded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use overseer_actors::model::{
    AgentConfig, Decision, SessionId, SessionStatus, StopReason, Submission, TranscriptEntry,
};
use overseer_actors::store::CheckpointStore;
use overseer_actors::testing::{self, store::TestStore};
use overseer_actors::{CreateSession, Overseer, RuntimeConfig, SessionError};
use serde_json::{json, Value};

/// [`start_with`] a runtime that releases a session as soon as it is at
/// rest, so each test sees a release after every message.
async fn start(store: &TestStore) -> Overseer {
    start_with(
        store,
        RuntimeConfig {
            rest_after: Duration::ZERO,
            ..RuntimeConfig::default()
        },
    )
    .await
}

/// Agent `a` asks to run `echo` and quotes its result; agent `chat`
/// answers two messages in turn.
async fn start_with(store: &TestStore, config: RuntimeConfig) -> Overseer {
    let scenario = json!({
        "a": echo_then_answer(),
        "chat": [{"text": "first answer"}, {"text": "second answer"}]
    });
    let provider = Arc::new(overseer_actors::scripted::ScriptedProvider::new(
        overseer_actors::scripted::Scenario::from_json(&json!({ "agents": scenario }).to_string())
            .unwrap(),
    ));
    // A deadline paused time reaches at once (see the last test).
    let mut a = agent(&["echo"]);
    a.approval_timeout_secs = 30;
    Overseer::start(
        vec![a, AgentConfig::new("chat", &[])],
        Arc::new(store.clone()),
        provider,
        tools(Default::default(), Default::default()),
        config,
    )
    .await
    .unwrap()
}

/// Creates session `id` of `agent` with metadata, and waits until its
/// first turn comes to rest with `status`.
async fn create_until(ov: &Overseer, id: SessionId, agent: &str, status: SessionStatus) {
    let mut rx = ov.subscribe(id);
    ov.create_session(CreateSession {
        id: Some(id),
        agent: agent.into(),
        tenant: "t".into(),
        prompt: Some("go".into()),
        metadata: json!({"ticket": 7}),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    until_status(&mut rx, status).await;
}

/// The one pending call of `id`, approved.
async fn approval(ov: &Overseer, id: SessionId) -> Submission {
    let pending = ov.pending_approvals(id).await.unwrap();
    assert_eq!(pending.len(), 1);
    Submission::one(pending[0].call.id.clone(), Decision::approve())
}

/// Submits `sub` to `id` and waits for the turn it resumes to end.
async fn decide_to_the_end(ov: &Overseer, id: SessionId, sub: Submission) -> StopReason {
    let mut rx = ov.subscribe(id);
    ov.submit(id, sub).await.unwrap();
    turn_end(&mut rx).await
}

/// A transcript with what differs between two runs of one scenario made
/// alike: ids (a UUID or 32 hex digits, after an optional `name_` prefix,
/// numbered by first appearance) and times.
fn alike(transcript: &[Arc<TranscriptEntry>]) -> Value {
    fn is_id(s: &str) -> bool {
        let tail = s.rsplit('_').next().unwrap_or(s);
        uuid::Uuid::parse_str(tail).is_ok()
    }
    fn walk(v: &mut Value, ids: &mut HashMap<String, usize>) {
        match v {
            Value::String(s) if is_id(s) => {
                let n = ids.len();
                *s = format!("id#{}", ids.entry(s.clone()).or_insert(n));
            }
            Value::Array(items) => items.iter_mut().for_each(|i| walk(i, ids)),
            Value::Object(fields) => {
                for (k, field) in fields.iter_mut() {
                    if k.ends_with("_ms") {
                        *field = Value::Null;
                    } else {
                        walk(field, ids);
                    }
                }
            }
            _ => {}
        }
    }
    let entries: Vec<&TranscriptEntry> = transcript.iter().map(|e| e.as_ref()).collect();
    let mut v = serde_json::to_value(entries).unwrap();
    walk(&mut v, &mut HashMap::new());
    v
}

/// The store's copy of `id` (read past the probes).
async fn stored(store: &TestStore, id: SessionId) -> overseer_actors::store::StoredSession {
    store.inner().load(id).await.unwrap().unwrap()
}

/// A session parked on an approval keeps nothing it can read back: asking
/// for its state reads the store, every time (one that keeps its
/// transcript reads nothing). Its decision reads it back once more and the
/// session ends with the transcript and metadata a session that never let
/// go of them ends with.
#[tokio::test]
async fn a_parked_session_releases_its_transcript_and_a_decision_brings_it_back() {
    let store = TestStore::new();
    let ov = start(&store).await;
    let (kept, released) = (SessionId::generate(), SessionId::generate());
    testing::keep_at_rest(kept);
    for id in [kept, released] {
        create_until(&ov, id, "a", SessionStatus::AwaitingApproval).await;
    }
    let loads = |id| store.loads(id);
    let (kept_before, released_before) = (loads(kept), loads(released));

    // The state API answers alike; only the released session reads for it.
    for round in 1..=2 {
        let (k, r) = (
            ov.state(kept).await.unwrap(),
            ov.state(released).await.unwrap(),
        );
        assert_eq!(alike(&k.transcript), alike(&r.transcript));
        assert_eq!(r.transcript.len(), 2, "the prompt and the proposal");
        assert_eq!(r.metadata, json!({"ticket": 7}));
        assert_eq!(loads(kept), kept_before, "a kept transcript is not read");
        assert_eq!(
            loads(released),
            released_before + round,
            "released at rest again after each read"
        );
    }

    for id in [kept, released] {
        let sub = approval(&ov, id).await;
        assert_eq!(decide_to_the_end(&ov, id, sub).await, StopReason::EndTurn);
    }
    assert_eq!(
        loads(released),
        released_before + 3,
        "the decision read it back"
    );
    let (k, r) = (stored(&store, kept).await, stored(&store, released).await);
    assert_eq!(r.header.status, SessionStatus::AwaitingInput);
    assert_eq!(alike(&k.transcript), alike(&r.transcript));
    assert_eq!(r.transcript.len(), 4);
    assert!(final_text(&transcript_of(&ov, released).await).starts_with("Result: "));
    assert_eq!(r.metadata, k.metadata);
}

/// With a rest delay (the default), a session keeps what it holds until
/// it has stayed at rest that long: a decision or a read within the delay
/// reads nothing back. Past it, the session lets go, and the next input
/// reads it back once; each input restarts the delay. Both end alike.
#[tokio::test(start_paused = true)]
async fn a_session_rests_only_once_idle_for_the_rest_delay() {
    let store = TestStore::new();
    let ov = start_with(&store, RuntimeConfig::default()).await;
    let delay = RuntimeConfig::default().rest_after;
    assert!(delay > Duration::ZERO, "the default waits");
    let (quick, slow) = (SessionId::generate(), SessionId::generate());
    for id in [quick, slow] {
        create_until(&ov, id, "a", SessionStatus::AwaitingApproval).await;
    }
    let (quick_before, slow_before) = (store.loads(quick), store.loads(slow));

    let sub = approval(&ov, quick).await;
    assert_eq!(
        decide_to_the_end(&ov, quick, sub).await,
        StopReason::EndTurn
    );
    assert_eq!(
        store.loads(quick),
        quick_before,
        "decided within the delay: nothing read back"
    );
    tokio::time::sleep(delay / 2).await;
    assert_eq!(ov.state(slow).await.unwrap().transcript.len(), 2);
    assert_eq!(store.loads(slow), slow_before, "kept within the delay");
    // The read was an input: the delay counts again from it.
    tokio::time::sleep(delay * 3 / 4).await;
    assert_eq!(ov.state(slow).await.unwrap().transcript.len(), 2);
    assert_eq!(store.loads(slow), slow_before, "the delay restarted");
    tokio::time::sleep(delay + Duration::from_secs(1)).await;
    assert_eq!(ov.state(slow).await.unwrap().transcript.len(), 2);
    assert_eq!(
        store.loads(slow),
        slow_before + 1,
        "idle past the delay: released, then read back"
    );
    let sub = approval(&ov, slow).await;
    assert_eq!(decide_to_the_end(&ov, slow, sub).await, StopReason::EndTurn);
    assert_eq!(
        store.loads(slow),
        slow_before + 1,
        "decided right after the read: nothing read again"
    );
    let (q, s) = (stored(&store, quick).await, stored(&store, slow).await);
    assert_eq!(alike(&q.transcript), alike(&s.transcript));
    assert_eq!(q.metadata, s.metadata);
}

/// On a store whose reads go over the network (PostgreSQL), a parked
/// session keeps what it holds: neither its state nor its decision reads
/// the store, so a decision costs no round trip.
#[tokio::test]
async fn a_session_of_a_remote_store_keeps_its_transcript_at_rest() {
    let store = TestStore::new();
    store.remote_reads();
    let ov = start(&store).await;
    let id = SessionId::generate();
    create_until(&ov, id, "a", SessionStatus::AwaitingApproval).await;
    let before = store.loads(id);
    let state = ov.state(id).await.unwrap();
    assert_eq!(state.transcript.len(), 2, "the prompt and the proposal");
    let sub = approval(&ov, id).await;
    assert_eq!(decide_to_the_end(&ov, id, sub).await, StopReason::EndTurn);
    assert_eq!(store.loads(id), before, "nothing was read back");
    assert!(final_text(&transcript_of(&ov, id).await).starts_with("Result: "));
}

/// A message to a session awaiting input reads its transcript back first:
/// the scripted model picks its step by the assistant entries it is sent,
/// so an answer other than the second would show a request built without
/// them.
#[tokio::test]
async fn a_message_to_a_session_awaiting_input_restores_it_and_it_continues() {
    let store = TestStore::new();
    let ov = start(&store).await;
    let (kept, released) = (SessionId::generate(), SessionId::generate());
    testing::keep_at_rest(kept);
    for id in [kept, released] {
        create_until(&ov, id, "chat", SessionStatus::AwaitingInput).await;
    }
    let before = store.loads(released);
    for id in [kept, released] {
        let mut rx = ov.subscribe(id);
        ov.send_message(id, "and then?").await.unwrap();
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    }
    assert_eq!(store.loads(released), before + 1, "read back once");
    let (k, r) = (stored(&store, kept).await, stored(&store, released).await);
    assert_eq!(alike(&k.transcript), alike(&r.transcript));
    let texts: Vec<_> = r
        .transcript
        .iter()
        .filter_map(|e| match e.as_ref() {
            TranscriptEntry::Assistant { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["first answer", "second answer"]);
}

/// A store that cannot be read when a decision needs the transcript back:
/// the decision is refused as the store's failure, nothing is written, the
/// session stays live and parked on the same call, and the same decision
/// sent again goes through.
#[tokio::test]
async fn a_failed_read_back_refuses_the_request_and_a_retry_works() {
    let store = TestStore::new();
    let ov = start(&store).await;
    let id = SessionId::generate();
    create_until(&ov, id, "a", SessionStatus::AwaitingApproval).await;
    let sub = approval(&ov, id).await;
    let checkpoints = store.written(id).len();
    let (restarts, activations) = (
        ov.metrics().restarts.load(Ordering::SeqCst),
        ov.metrics().activations.load(Ordering::SeqCst),
    );

    store.fail_loads(1);
    match ov.submit(id, sub.clone()).await {
        Err(SessionError::Store(e)) => assert!(e.is_unavailable(), "{e}"),
        other => panic!("expected the store's failure, got {other:?}"),
    }
    assert!(ov.is_live(id), "the actor is still there");
    assert_eq!(store.written(id).len(), checkpoints, "nothing was written");
    let header = ov.header(id).await.unwrap();
    assert_eq!(header.status, SessionStatus::AwaitingApproval);
    assert_eq!(approval(&ov, id).await, sub, "the same call waits");

    assert_eq!(decide_to_the_end(&ov, id, sub).await, StopReason::EndTurn);
    let r = stored(&store, id).await;
    assert_eq!(r.transcript.len(), 4);
    assert_eq!(r.metadata, json!({"ticket": 7}));
    // The same actor all along: never restarted, never woken from the store.
    assert_eq!(ov.metrics().restarts.load(Ordering::SeqCst), restarts);
    assert_eq!(ov.metrics().activations.load(Ordering::SeqCst), activations);
}

/// Each checkpoint after a read-back writes only what is new: transcript
/// indexes and event numbers continue from the last ones written, with no
/// index written twice and none skipped.
#[tokio::test]
async fn checkpoints_after_a_read_back_continue_the_sequence_numbers() {
    let store = TestStore::new();
    let ov = start(&store).await;
    let id = SessionId::generate();
    create_until(&ov, id, "a", SessionStatus::AwaitingApproval).await;
    let parked = store.written(id).len();
    // Read back twice before the decision (each state read releases again),
    // and once more after it, for the `done`.
    ov.state(id).await.unwrap();
    ov.state(id).await.unwrap();
    let sub = approval(&ov, id).await;
    decide_to_the_end(&ov, id, sub).await;
    ov.done(id).await.unwrap();

    let written = store.written(id);
    assert!(
        written.len() > parked + 1,
        "checkpoints after the read-back"
    );
    let entries: Vec<u64> = written.iter().flat_map(|w| w.entries.clone()).collect();
    let events: Vec<u64> = written.iter().flat_map(|w| w.events.clone()).collect();
    let s = stored(&store, id).await;
    assert_eq!(entries, (0..s.header.transcript_len).collect::<Vec<_>>());
    assert_eq!(events, (1..=s.header.last_event_seq).collect::<Vec<_>>());
    assert_eq!(s.transcript.len() as u64, s.header.transcript_len);
}

/// A decision that arrives while the read-back for an earlier request is
/// still on its way waits behind it (the session handles nothing on a
/// released transcript), and the read holds up no other session.
#[tokio::test]
async fn a_decision_during_a_read_back_waits_for_it_and_other_sessions_go_on() {
    let store = TestStore::new();
    let ov = start(&store).await;
    let id = SessionId::generate();
    create_until(&ov, id, "a", SessionStatus::AwaitingApproval).await;
    let sub = approval(&ov, id).await;

    store.hold_loads(id);
    let state = tokio::spawn({
        let ov = ov.clone();
        async move { ov.state(id).await }
    });
    bounded("the read-back to start", store.load_entered()).await;
    let mut rx = ov.subscribe(id);
    let decision = tokio::spawn({
        let ov = ov.clone();
        let sub = sub.clone();
        async move { ov.submit(id, sub).await }
    });

    // Another session runs a whole turn meanwhile.
    let other = SessionId::generate();
    bounded(
        "another session while one reads the store",
        create_until(&ov, other, "chat", SessionStatus::AwaitingInput),
    )
    .await;
    assert!(!state.is_finished() && !decision.is_finished());
    assert_eq!(
        stored(&store, id).await.header.status,
        SessionStatus::AwaitingApproval,
        "the decision is not handled before the read returns"
    );

    store.release_loads(id);
    let s = bounded("the state", state).await.unwrap().unwrap();
    assert_eq!(s.transcript.len(), 2, "read back whole");
    bounded("the decision", decision).await.unwrap().unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(stored(&store, id).await.transcript.len(), 4);
}

/// A store that cannot be read when an input nobody waits for needs the
/// transcript (here an approval deadline): the input is not dropped. The
/// actor fails, its supervisor brings the session back from its checkpoint
/// once the store reads again, and the deadline is applied.
#[tokio::test(start_paused = true)]
async fn an_approval_deadline_during_a_failed_read_back_is_not_lost() {
    let store = TestStore::new();
    let ov = start(&store).await;
    let id = SessionId::generate();
    create_until(&ov, id, "a", SessionStatus::AwaitingApproval).await;
    let mut rx = ov.subscribe(id);
    store.fail_loads(1);
    // The agent's approval timeout passes (paused time runs ahead).
    let stop = turn_end(&mut rx).await;
    assert_eq!(stop, StopReason::EndTurn);
    let s = stored(&store, id).await;
    assert_eq!(s.header.status, SessionStatus::AwaitingInput);
    assert!(
        tool_results(
            &s.transcript
                .iter()
                .map(|e| (**e).clone())
                .collect::<Vec<_>>()
        )
        .iter()
        .any(|(_, _, v)| v.to_string().contains("No approval decision received")),
        "the call timed out"
    );
    assert!(store.loads(id) >= 2, "the failed read, then the restart's");
    poll("the session back", Duration::from_millis(10), || async {
        ov.is_live(id).then_some(())
    })
    .await;
}
