//! The architecture invariants of ARCHITECTURE.md that are about the actor
//! tree, each guarded through the in-process API: children stay under their
//! parents (even across hibernation and a restart limit), no child report is
//! lost, a dropped create leaves nothing behind, approval timers are owned,
//! cancelling a tree never waits on a child, nothing is left in the runtime's
//! bookkeeping once sessions end, and the model sees the arguments that ran.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use overseer_actors::model::{
    AgentConfig, ChildApproval, Decision, EventKind, SessionId, SessionStatus, StopReason,
    Submission, TranscriptEntry,
};
use overseer_actors::provider::{Provider, ProviderError, ProviderRequest, ProviderStream};
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::store::{CheckpointStore, MemStore};
use overseer_actors::testing::store::TestStore;
use overseer_actors::{CreateSession, Overseer, RuntimeConfig, SessionError};
use serde_json::{json, Value};

fn named(name: &str, tools: &[&str]) -> AgentConfig {
    AgentConfig::new(name, tools)
}

fn lead(name: &str, child: &str) -> AgentConfig {
    let mut a = AgentConfig::new(name, &["echo"]);
    a.subagents = vec![child.into()];
    a.child_approval = ChildApproval::Propagate;
    a
}

fn delegate(agent: &str, goal: &str) -> Value {
    json!({"name": "delegate_task", "arguments": {"agent": agent, "goal": goal}})
}

/// A lead that delegates once and quotes the result; a child that asks to
/// run `echo` and quotes its result.
fn tree_steps(lead: &str, child: &str) -> Value {
    json!({
        lead: [{"tool_calls": [delegate(child, "echo something")]}, {"text": "lead: {{tool_result}}"}],
        child: [{"tool_calls": [{"name": "echo", "arguments": {"text": "from child"}}]}, {"text": "child: {{tool_result}}"}]
    })
}

fn hibernating(secs: u64) -> RuntimeConfig {
    RuntimeConfig {
        idle_hibernate: Some(Duration::from_secs(secs)),
        ..RuntimeConfig::default()
    }
}

fn provider(steps: Value) -> Arc<dyn Provider> {
    let scenario = Scenario::from_json(&json!({"agents": steps}).to_string()).unwrap();
    Arc::new(ScriptedProvider::new(scenario))
}

async fn start_with(
    agents: Vec<AgentConfig>,
    store: Arc<dyn CheckpointStore>,
    provider: Arc<dyn Provider>,
    config: RuntimeConfig,
) -> Overseer {
    Overseer::start(
        agents,
        store,
        provider,
        tools(Default::default(), Default::default()),
        config,
    )
    .await
    .unwrap()
}

async fn create(ov: &Overseer, agent: &str, prompt: &str) -> SessionId {
    ov.create_session(CreateSession {
        agent: agent.into(),
        tenant: "t".into(),
        prompt: Some(prompt.into()),
        ..CreateSession::default()
    })
    .await
    .unwrap()
}

async fn transcript(ov: &Overseer, id: SessionId) -> Vec<TranscriptEntry> {
    let s = ov.state(id).await.unwrap();
    s.transcript.iter().map(|e| (**e).clone()).collect()
}

/// Waits until nothing is left in the runtime's per-session bookkeeping
/// (journal entries, timers, ids being created, restart histories) and no
/// ended session keeps an actor.
async fn until_nothing_held(ov: &Overseer) {
    poll(
        "the runtime to hold nothing for ended sessions",
        Duration::from_millis(5),
        || async {
            let b = ov.bookkeeping();
            let mut live_ended = 0;
            let ids: Vec<SessionId> = ov.live_ids();
            for id in ids {
                if ov.state(id).await.unwrap().header.status.is_terminal() {
                    live_ended += 1;
                }
            }
            // An idle timer is held only for a live idle actor: none once
            // every session has ended or hibernated.
            let idle_of_ended = if b.live == 0 { b.idle } else { 0 };
            let held = (b.journal, b.timers, b.creating, live_ended, idle_of_ended);
            (held == (0, 0, 0, 0, 0)).then_some(())
        },
    )
    .await;
    assert_eq!(ov.restart_histories().await.unwrap(), 0);
}

/// A store that is down is nobody's fault: the caller is told so
/// (`Store(Unavailable)`, HTTP 503 `store_unavailable`), and a session's
/// failures while it lasts do not count against its restarts (§10): more of
/// them than `max_restarts` within the window never fail the session for
/// good, and once the store takes writes again it goes on.
#[tokio::test(start_paused = true)]
async fn failures_while_the_store_is_down_never_fail_a_session() {
    let store = TestStore::new();
    let ov = start_with(
        vec![named("a", &[])],
        Arc::new(store.clone()),
        provider(json!({"a": [{"text": "back"}]})),
        RuntimeConfig::default(),
    )
    .await;
    let id = ov
        .create_session(CreateSession {
            agent: "a".into(),
            tenant: "t".into(),
            ..CreateSession::default()
        })
        .await
        .unwrap();
    let limit = RuntimeConfig::default().restart.max_restarts;
    store.fail_checkpoints(limit + 1);
    for _ in 0..=limit {
        let err = bounded(
            "a message while the store is down",
            ov.send_message(id, "hi"),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, SessionError::Store(e) if e.is_unavailable()),
            "{err}"
        );
    }
    // Supervision events come before messages: the orchestrator has dealt
    // with every failure once it answers this.
    ov.restart_histories().await.unwrap();
    bounded(
        "a message once the store is back",
        ov.send_message(id, "hi"),
    )
    .await
    .unwrap();
    poll("the turn to end", Duration::from_millis(10), || async {
        match ov.header(id).await.map(|h| h.status) {
            Ok(SessionStatus::AwaitingInput) => Some(()),
            _ => None,
        }
    })
    .await;
}

// ---- cancel-safe create ----------------------------------------------------

/// A create whose future is dropped half-way (the client went away while
/// its checkpoint was being written) leaves nothing behind: the id is free
/// again, not `AlreadyExists` for ever.
#[tokio::test]
async fn a_dropped_create_releases_its_id() {
    let store = TestStore::new();
    let ov = start_with(
        vec![named("a", &[])],
        Arc::new(store.clone()),
        provider(json!({"a": [{"text": "hi"}]})),
        RuntimeConfig::default(),
    )
    .await;
    let id = SessionId::generate();
    let req = CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("hello".into()),
        id: Some(id),
        ..CreateSession::default()
    };
    store.hold_checkpoints(id);
    bounded("the create to reach its checkpoint", async {
        tokio::select! {
            r = ov.create_session(req.clone()) => panic!("the create finished while held: {r:?}"),
            () = store.checkpoint_entered() => {}
        }
    })
    .await;
    // The create future is dropped here, mid-checkpoint.
    assert_eq!(ov.bookkeeping().creating, 0);
    store.release_checkpoints(id);
    let created = bounded("the second create", ov.create_session(req)).await;
    assert_eq!(created.unwrap(), id);
}

// ---- children stay under their parents --------------------------------------

/// A child that waits for an approval hibernates like any session (and its
/// parent after it); the decision, routed to the child, activates the tree
/// from the root down, so the child runs under its parent again and never
/// under the orchestrator.
#[tokio::test(start_paused = true)]
async fn a_hibernated_child_is_activated_under_its_parent() {
    let agents = vec![lead("hib_lead", "hib_child"), named("hib_child", &["echo"])];
    let ov = start_with(
        agents,
        Arc::new(MemStore::new()),
        provider(tree_steps("hib_lead", "hib_child")),
        hibernating(10),
    )
    .await;
    let id = create(&ov, "hib_lead", "go").await;
    let mut rx = ov.subscribe(id);
    let pending = poll(
        "the child's approval",
        Duration::from_millis(50),
        || async { ov.pending_approvals(id).await.unwrap().into_iter().next() },
    )
    .await;
    let child = pending.session_id;
    poll("the tree to hibernate", Duration::from_secs(1), || async {
        (!ov.is_live(id) && !ov.is_live(child)).then_some(())
    })
    .await;
    ov.submit(child, Submission::one(pending.call.id, Decision::approve()))
        .await
        .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let text = final_text(&transcript(&ov, id).await);
    assert!(text.contains("child: "), "{text}");
    // Nothing is left running: the whole tree ends or hibernates.
    until_nothing_held(&ov).await;
}

/// A child whose actor drains to hibernate with a decision already in its
/// mailbox handles the decision and stops with the work it started still
/// open (no report to its parent: the child has not finished). Its parent,
/// seeing the child stop, reads the child's checkpoint and brings it back,
/// and the tree finishes. A parent that ignored a child's normal stop
/// would wait forever here.
#[tokio::test]
async fn a_child_stopping_with_work_it_accepted_is_brought_back_by_its_parent() {
    let agents = vec![
        lead("drain_lead", "drain_child"),
        named("drain_child", &["echo"]),
    ];
    let ov = start_with(
        agents,
        Arc::new(MemStore::new()),
        provider(tree_steps("drain_lead", "drain_child")),
        RuntimeConfig::default(),
    )
    .await;
    let id = create(&ov, "drain_lead", "go").await;
    let mut rx = ov.subscribe(id);
    let pending = poll("the child's approval", Duration::from_millis(5), || async {
        ov.pending_approvals(id).await.unwrap().into_iter().next()
    })
    .await;
    let child = pending.session_id;
    let first = overseer_actors::testing::session_cell(&ov, child).unwrap();
    let answer = overseer_actors::testing::hibernate_then_decide(
        &ov,
        child,
        Submission::one(pending.call.id.clone(), Decision::approve()),
    )
    .await;
    assert!(matches!(answer, Some(Ok(()))), "{answer:?}");
    // The child's first actor is gone, its call still open.
    poll(
        "the child's actor to stop",
        Duration::from_millis(5),
        || {
            let first = first.clone();
            async move { (first.get_status() == ractor::ActorStatus::Stopped).then_some(()) }
        },
    )
    .await;
    // Whatever the resumed child asks again (a tool whose outcome its first
    // actor never recorded) is approved; the tree must finish.
    let ended = bounded("the tree to finish", async {
        loop {
            tokio::select! {
                stop = turn_end(&mut rx) => return stop,
                () = tokio::time::sleep(Duration::from_millis(5)) => {
                    for p in ov.pending_approvals(id).await.unwrap() {
                        let _ = ov
                            .submit(p.session_id, Submission::one(p.call.id, Decision::approve()))
                            .await;
                    }
                }
            }
        }
    })
    .await;
    assert_eq!(ended, StopReason::EndTurn);
    let text = final_text(&transcript(&ov, id).await);
    assert!(text.contains("child: "), "{text}");
    until_nothing_held(&ov).await;
}

#[cfg(feature = "fault-injection")]
mod faults {
    use super::*;
    use overseer_actors::fault::{arm, FaultAction, FaultPlan, FaultPoint};
    use overseer_actors::model::CallState;

    fn plan(point: FaultPoint, nth: u64, agent: &str, repeat: bool) {
        arm(FaultPlan {
            point,
            nth,
            action: FaultAction::Panic,
            session: None,
            agent: Some(agent.into()),
            repeat,
        });
    }

    /// The scenario: a child waits for an approval longer than the
    /// idle timeout, is approved, crashes past its restart limit; its parent
    /// (not the orchestrator) gives up on it, and the parent finishes.
    #[tokio::test(start_paused = true)]
    async fn a_child_hibernated_then_crashing_past_its_limit_fails_the_parents_call() {
        let agents = vec![lead("lim_lead", "lim_child"), named("lim_child", &["echo"])];
        let ov = start_with(
            agents,
            Arc::new(MemStore::new()),
            provider(tree_steps("lim_lead", "lim_child")),
            hibernating(10),
        )
        .await;
        let id = create(&ov, "lim_lead", "go").await;
        let mut rx = ov.subscribe(id);
        let pending = poll(
            "the child's approval",
            Duration::from_millis(50),
            || async { ov.pending_approvals(id).await.unwrap().into_iter().next() },
        )
        .await;
        let child = pending.session_id;
        poll("the child to hibernate", Duration::from_secs(1), || async {
            (!ov.is_live(child)).then_some(())
        })
        .await;
        // From now on the child dies whenever it dispatches its tool.
        plan(FaultPoint::BeforeToolDispatch, 1, "lim_child", true);
        match ov
            .submit(id, Submission::one(pending.call.id, Decision::approve()))
            .await
        {
            // The child may die before answering; the decision is durable.
            Ok(()) | Err(SessionError::Unavailable { .. }) => {}
            Err(e) => panic!("{e:?}"),
        }
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
        let t = transcript(&ov, id).await;
        let failed = t
            .iter()
            .find_map(|e| match e {
                TranscriptEntry::ToolResult { call } => Some(call.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(failed.state, CallState::Failed);
        let msg = failed.result.unwrap()["error"].as_str().unwrap().to_owned();
        assert!(msg.contains("restart limit exceeded"), "{msg}");
        let tree = ov.tree(id).await.unwrap();
        assert_eq!(tree.children[0].status, SessionStatus::Failed);
        assert_eq!(tree.status, SessionStatus::AwaitingInput);
        until_nothing_held(&ov).await;
    }

    /// A child that dies between its final checkpoint and its report to the
    /// parent: the parent reads the child's checkpoint and goes on.
    #[tokio::test]
    async fn a_childs_lost_report_is_recovered_from_its_checkpoint() {
        let agents = vec![lead("lost_lead", "lost_child"), named("lost_child", &[])];
        let steps = json!({
            "lost_lead": [{"tool_calls": [delegate("lost_child", "work")]}, {"text": "lead: {{tool_result}}"}],
            "lost_child": [{"text": "the child's answer"}]
        });
        let ov = start_with(
            agents,
            Arc::new(MemStore::new()),
            provider(steps),
            RuntimeConfig::default(),
        )
        .await;
        // The child's first checkpoint is the one that completes it.
        plan(FaultPoint::AfterCheckpoint, 1, "lost_child", false);
        let id = create(&ov, "lost_lead", "go").await;
        let mut rx = ov.subscribe(id);
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
        let text = final_text(&transcript(&ov, id).await);
        assert!(text.contains("the child's answer"), "{text}");
        until_nothing_held(&ov).await;
    }

    /// A call asked again after an in-process restart (`on_interrupt =
    /// "ask"`) gets a timer for its new deadline; the timer of its first ask
    /// was disarmed by the approval and never denies it early.
    #[tokio::test(start_paused = true)]
    async fn a_call_asked_again_after_a_restart_times_out_at_its_new_deadline() {
        let mut a = named("reasked", &["slow_echo"]);
        a.approval_timeout_secs = 100;
        let steps = json!({"reasked": [
            {"tool_calls": [{"name": "slow_echo", "arguments": {}}]},
            {"text": "after: {{tool_result}}"},
            {"text": "and the queued message"}
        ]});
        let ov = Overseer::start(
            vec![a],
            Arc::new(MemStore::new()),
            provider(steps),
            slow_echo_registry(),
            RuntimeConfig::default(),
        )
        .await
        .unwrap();
        let started = tokio::time::Instant::now();
        let id = create(&ov, "reasked", "go").await;
        let mut rx = ov.subscribe(id);
        let call = poll("the approval", Duration::from_millis(50), || async {
            ov.pending_approvals(id).await.unwrap().into_iter().next()
        })
        .await
        .call
        .id;
        tokio::time::sleep(Duration::from_secs(50)).await;
        ov.submit(id, Submission::one(call.clone(), Decision::approve()))
            .await
            .unwrap();
        // Its next checkpoint (queueing this message while the tool runs)
        // kills the session: the restart finds the tool started, outcome
        // unknown, and asks again.
        plan(FaultPoint::AfterCheckpoint, 1, "reasked", false);
        let _ = ov.send_message(id, "another thing").await;
        until(&mut rx, |k| {
            matches!(
                k,
                EventKind::ApprovalRequested {
                    outcome_unknown: true,
                    ..
                }
            )
        })
        .await;
        assert_eq!(ov.bookkeeping().timers, 1, "one timer: the new one");
        // Past the first ask's deadline (t = 100 s): still waiting.
        tokio::time::sleep(Duration::from_secs(70)).await;
        let s = ov.state(id).await.unwrap();
        assert_eq!(s.header.open_calls[0].state, CallState::AwaitingApproval);
        // It times out at its own deadline, 100 s after it was asked again.
        let decided = until(&mut rx, |k| matches!(k, EventKind::DecisionRecorded { .. })).await;
        assert!(started.elapsed() >= Duration::from_secs(150));
        let EventKind::DecisionRecorded { record, .. } = decided else {
            unreachable!()
        };
        assert_eq!(record.by.as_deref(), Some("system"));
        until_nothing_held(&ov).await;
    }

    fn slow_echo_registry() -> overseer_actors::tool::ToolRegistry {
        use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};
        struct SlowEcho(ToolSpec);
        #[async_trait::async_trait]
        impl Tool for SlowEcho {
            fn spec(&self) -> &ToolSpec {
                &self.0
            }
            async fn call(&self, _ctx: ToolContext, args: Value) -> Result<Value, ToolError> {
                futures::future::pending::<()>().await;
                Ok(args)
            }
        }
        ToolRegistry::new(vec![Arc::new(SlowEcho(
            ToolSpec::new("slow_echo", "never returns", json!({"type": "object"}))
                .with_approval(true)
                .with_timeout(10_000),
        ))])
        .unwrap()
    }
}

// ---- no effect before its checkpoint is durable ------------------------------

/// While the checkpoint of a decision is being written, nothing that depends
/// on it has happened: the tool has not run, no event of it is published,
/// the caller has no answer. Once it is durable, all of it follows.
#[tokio::test(start_paused = true)]
async fn nothing_happens_before_the_checkpoint_that_records_it_is_durable() {
    let store = TestStore::new();
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let ov = Overseer::start(
        vec![named("a", &["echo"])],
        Arc::new(store.clone()),
        provider(json!({"a": echo_then_answer()})),
        tools(runs.clone(), Default::default()),
        RuntimeConfig::default(),
    )
    .await
    .unwrap();
    let id = create(&ov, "a", "go").await;
    let call = poll("the approval", Duration::from_millis(10), || async {
        ov.pending_approvals(id).await.unwrap().into_iter().next()
    })
    .await
    .call
    .id;
    let mut rx = ov.subscribe(id);
    store.hold_checkpoints(id);
    let decide = {
        let ov = ov.clone();
        tokio::spawn(async move {
            ov.submit(id, Submission::one(call, Decision::approve()))
                .await
        })
    };
    bounded("the decision's checkpoint", store.checkpoint_entered()).await;
    // Paused time moves only when every task is idle: whatever could run
    // before the checkpoint is durable has run by now (well within the
    // caller's timeout).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the tool ran before its intent was durable"
    );
    assert!(
        matches!(
            rx.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "an event was published before its checkpoint was durable"
    );
    assert!(
        !decide.is_finished(),
        "the caller was answered before the write"
    );

    store.release_checkpoints(id);
    bounded("the decision", decide).await.unwrap().unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// ---- handlers never wait on other actors -----------------------------------

/// Cancelling a tree does not wait for its children: a child whose mailbox is
/// stuck behind a slow checkpoint does not hold the root's cancel (the cancel
/// reaches it as a message, handled when it can).
#[tokio::test]
async fn cancelling_a_tree_does_not_wait_for_a_busy_child() {
    let store = TestStore::new();
    let agents = vec![
        lead("busy_lead", "busy_child"),
        named("busy_child", &["echo"]),
    ];
    let ov = start_with(
        agents,
        Arc::new(store.clone()),
        provider(tree_steps("busy_lead", "busy_child")),
        RuntimeConfig {
            // A call that waited for the child would wait this long.
            call_timeout: Duration::from_secs(3_600),
            ..RuntimeConfig::default()
        },
    )
    .await;
    let id = create(&ov, "busy_lead", "go").await;
    let pending = poll("the child's approval", Duration::from_millis(5), || async {
        ov.pending_approvals(id).await.unwrap().into_iter().next()
    })
    .await;
    let child = pending.session_id;
    // The child's next checkpoint (the decision) hangs: its mailbox is stuck.
    store.hold_checkpoints(child);
    let decide = {
        let ov = ov.clone();
        let call = pending.call.id.clone();
        tokio::spawn(async move {
            ov.submit(child, Submission::one(call, Decision::approve()))
                .await
        })
    };
    bounded("the child to be busy", store.checkpoint_entered()).await;
    bounded("the root's cancel", ov.cancel(id)).await.unwrap();
    assert_eq!(
        ov.state(id).await.unwrap().header.status,
        SessionStatus::Cancelled
    );
    store.release_checkpoints(child);
    let _ = bounded("the child's decision", decide).await.unwrap();
    let child_status = poll(
        "the child to be cancelled",
        Duration::from_millis(5),
        || async {
            let s = ov.state(child).await.unwrap().header.status;
            s.is_terminal().then_some(s)
        },
    )
    .await;
    assert_eq!(child_status, SessionStatus::Cancelled);
    until_nothing_held(&ov).await;
}

// ---- no leaked bookkeeping ----------------------------------------------------

/// Sessions that complete, get cancelled with a tool running, or fail past
/// their restart limit leave nothing behind in the runtime.
#[tokio::test]
async fn ended_sessions_leave_no_bookkeeping() {
    let h = harness(agent(&["echo", "stuck"]), echo_then_answer()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = h.pending(id).await.remove(0);
    h.approve(id, &call).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    h.ov.done(id).await.unwrap();

    let stuck = harness(
        agent(&["stuck"]),
        json!([{"tool_calls": [{"name": "stuck", "arguments": {}}]}]),
    )
    .await;
    let (id, mut rx) = stuck.start("go").await;
    until(&mut rx, |k| matches!(k, EventKind::ToolCallStarted { .. })).await;
    assert_eq!(stuck.ov.bookkeeping().journal, 1);
    stuck.ov.cancel(id).await.unwrap();
    until_nothing_held(&h.ov).await;
    until_nothing_held(&stuck.ov).await;
}

// ---- edits and decisions are what they claim ------------------------------------

/// Records every request, then plays the scripted steps.
struct Recording {
    inner: ScriptedProvider,
    requests: Mutex<Vec<ProviderRequest>>,
}

#[async_trait::async_trait]
impl Provider for Recording {
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        self.requests.lock().unwrap().push(request.clone());
        self.inner.stream(request).await
    }
}

/// After an approval with edited arguments, the transcript the model reads
/// carries the arguments that ran (the stored transcript keeps the proposal,
/// and the call record the diff).
#[tokio::test]
async fn the_model_sees_the_arguments_that_ran() {
    let scenario =
        Scenario::from_json(&json!({"agents": {"a": echo_then_answer()}}).to_string()).unwrap();
    let recording = Arc::new(Recording {
        inner: ScriptedProvider::new(scenario),
        requests: Mutex::new(Vec::new()),
    });
    let h = harness_with(agent(&["echo"]), recording.clone()).await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = h.pending(id).await.remove(0);
    let edit = Decision::Approve {
        override_args: json!({"text": "edited"}).as_object().cloned(),
        remove_args: Vec::new(),
    };
    h.ov.submit(id, Submission::one(call.clone(), edit))
        .await
        .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let requests = recording.requests.lock().unwrap().clone();
    let second = &requests[1];
    let seen: Vec<Value> = second
        .transcript
        .iter()
        .filter_map(|e| match e.as_ref() {
            TranscriptEntry::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
                Some(tool_calls[0].arguments.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(seen, vec![json!({"text": "edited"})]);
    // The stored transcript still shows what the model proposed.
    let stored = h.transcript(id).await;
    let proposed = stored
        .iter()
        .find_map(|e| match e {
            TranscriptEntry::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
                Some(tool_calls[0].arguments.clone())
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(proposed, json!({"text": "hi"}));
    assert_eq!(h.echo_seen.lock().unwrap()[0], json!({"text": "edited"}));
}

/// Deciding a call that was already decided is a conflict, also once its
/// step has closed and the session has hibernated.
#[tokio::test(start_paused = true)]
async fn deciding_a_decided_call_again_is_a_conflict() {
    let h = harness_cfg(
        agent(&["echo"]),
        scripted(echo_then_answer()),
        hibernating(10),
    )
    .await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let call = h.pending(id).await.remove(0);
    h.approve(id, &call).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    poll(
        "the session to hibernate",
        Duration::from_secs(1),
        || async { (!h.ov.is_live(id)).then_some(()) },
    )
    .await;
    let err =
        h.ov.submit(id, Submission::one(call.clone(), Decision::deny("late")))
            .await
            .unwrap_err();
    assert_eq!(err, SessionError::AlreadyDecided(vec![call]));
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 1);
}

// ---- one live actor per session ------------------------------------------------

/// The session actors a supervisor runs now (its live children), counted by
/// ractor itself: independent of the runtime's registry of live actors.
fn supervised_sessions(supervisor: &ractor::ActorCell) -> usize {
    supervisor
        .get_children()
        .into_iter()
        .filter(|c| c.get_status() == ractor::ActorStatus::Running)
        .filter(overseer_actors::testing::is_session_cell)
        .count()
}

/// Many requests racing to a session that lives only on disk activate it
/// once: one actor, every request answered by it. Counted twice: the
/// runtime's activations, and the actors the orchestrator really runs.
#[tokio::test(start_paused = true)]
async fn concurrent_requests_to_a_hibernated_session_activate_one_actor() {
    let h = harness_cfg(
        agent(&["echo"]),
        scripted(echo_then_answer()),
        hibernating(10),
    )
    .await;
    let (id, mut rx) = h.start("go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let orchestrator = overseer_actors::testing::session_cell(&h.ov, id).unwrap();
    let orchestrator = orchestrator.try_get_supervisor().unwrap();
    poll(
        "the session to hibernate",
        Duration::from_secs(1),
        || async { (!h.ov.is_live(id)).then_some(()) },
    )
    .await;
    poll("its actor to stop", Duration::from_millis(1), || async {
        (supervised_sessions(&orchestrator) == 0).then_some(())
    })
    .await;
    let before = h.ov.metrics().activations.load(Ordering::Relaxed);
    let reads = (0..32).map(|i| {
        let ov = h.ov.clone();
        async move {
            // Reads and writes alike: a queued message each.
            ov.send_message(id, format!("message {i}")).await
        }
    });
    for r in futures::future::join_all(reads).await {
        r.unwrap();
    }
    let after = h.ov.metrics().activations.load(Ordering::Relaxed);
    assert_eq!(after - before, 1, "one activation for 32 racing requests");
    assert_eq!(
        supervised_sessions(&orchestrator),
        1,
        "the orchestrator runs one actor for the session"
    );
}

/// The same for a child: requests racing to a hibernated child activate
/// the tree from the root down, and its parent runs one actor for it (the
/// orchestrator none).
#[tokio::test(start_paused = true)]
async fn concurrent_requests_to_a_hibernated_child_activate_one_actor_under_its_parent() {
    let agents = vec![lead("one_lead", "one_child"), named("one_child", &["echo"])];
    let ov = start_with(
        agents,
        Arc::new(MemStore::new()),
        provider(tree_steps("one_lead", "one_child")),
        hibernating(10),
    )
    .await;
    let id = create(&ov, "one_lead", "go").await;
    let pending = poll(
        "the child's approval",
        Duration::from_millis(50),
        || async { ov.pending_approvals(id).await.unwrap().into_iter().next() },
    )
    .await;
    let child = pending.session_id;
    poll("the tree to hibernate", Duration::from_secs(1), || async {
        (!ov.is_live(id) && !ov.is_live(child)).then_some(())
    })
    .await;
    let reads = (0..32).map(|i| {
        let ov = ov.clone();
        async move { ov.send_message(child, format!("message {i}")).await }
    });
    for r in futures::future::join_all(reads).await {
        // A child waiting for a decision queues them behind its turn.
        r.unwrap();
    }
    let parent = overseer_actors::testing::session_cell(&ov, id).unwrap();
    let child_actor = overseer_actors::testing::session_cell(&ov, child).unwrap();
    assert_eq!(
        child_actor.try_get_supervisor().map(|s| s.get_id()),
        Some(parent.get_id()),
        "the child runs under its parent"
    );
    assert_eq!(
        supervised_sessions(&parent),
        1,
        "its parent runs one actor for it"
    );
    let orchestrator = parent.try_get_supervisor().unwrap();
    assert_eq!(
        supervised_sessions(&orchestrator),
        1,
        "the orchestrator runs the root alone"
    );
}

// ---- the orchestrator's mailbox never waits on the store --------------------

/// A root restarting reads its checkpoint in a task of its own: while that
/// read waits on a slow store, the orchestrator starts other roots at once
/// (a create answers), and the restart completes when the read does.
#[tokio::test(start_paused = true)]
async fn a_restart_waiting_on_the_store_holds_up_no_other_root() {
    let store = TestStore::new();
    let steps = json!({
        "slow": [
            {"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]},
            {"text": "slow: {{tool_result}}"}
        ],
        "quick": [{"text": "quick answer"}]
    });
    let ov = start_with(
        vec![named("slow", &["echo"]), named("quick", &[])],
        Arc::new(store.clone()),
        provider(steps),
        RuntimeConfig::default(),
    )
    .await;
    // Kept at rest: its decision goes straight to the checkpoint that
    // fails, with no read of its transcript first (which this test holds).
    let slow = SessionId::generate();
    overseer_actors::testing::keep_at_rest(slow);
    ov.create_session(CreateSession {
        id: Some(slow),
        agent: "slow".into(),
        tenant: "t".into(),
        prompt: Some("go".into()),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    let mut slow_rx = ov.subscribe(slow);
    let call = poll("the approval", Duration::from_millis(10), || async {
        ov.pending_approvals(slow).await.unwrap().into_iter().next()
    })
    .await
    .call
    .id;

    // The approval's checkpoint fails: nothing is accepted, the actor
    // fails, and the orchestrator's restart reads the session, slowly.
    store.doom(slow);
    store.hold_loads(slow);
    let approve = || Submission::one(call.clone(), Decision::approve());
    assert!(ov.submit(slow, approve()).await.is_err());
    bounded("the restart to read the store", store.load_entered()).await;

    // Meanwhile another root starts and finishes its turn.
    let quick = bounded(
        "a create while a restart reads the store",
        ov.create_session(CreateSession {
            agent: "quick".into(),
            tenant: "t".into(),
            prompt: Some("hello".into()),
            ..CreateSession::default()
        }),
    )
    .await
    .expect("a create is not held up by another root's restart");
    poll(
        "the quick session's answer",
        Duration::from_millis(10),
        || async {
            let s = ov.state(quick).await.unwrap();
            (s.header.status == SessionStatus::AwaitingInput).then_some(())
        },
    )
    .await;
    assert!(!ov.is_live(slow), "the restart is still reading");

    // The read returns: the session is back, waiting for the same decision.
    store.release_loads(slow);
    poll("the restart", Duration::from_millis(10), || async {
        ov.is_live(slow).then_some(())
    })
    .await;
    ov.submit(slow, approve()).await.unwrap();
    assert_eq!(turn_end(&mut slow_rx).await, StopReason::EndTurn);
}
