//! Delegation trees (§7) through the in-process API: subagents as child
//! session actors, scopes, limits, approvals decided at the root, budgets,
//! cancel cascades and recovery of a tree.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::*;
use overseer_actors::model::{
    AgentConfig, Budget, CallState, ChildApproval, Decision, EventKind, SessionStatus, StopReason,
    Submission, TranscriptEntry,
};
use overseer_actors::{Overseer, RuntimeConfig, TreeNode};
use serde_json::{json, Value};

fn root(subagents: &[&str]) -> AgentConfig {
    let mut a = AgentConfig::new("root", &[]);
    a.subagents = subagents.iter().map(|s| (*s).to_owned()).collect();
    a
}

fn named(name: &str, tools: &[&str]) -> AgentConfig {
    let mut a = AgentConfig::new(name, tools);
    a.name = name.into();
    a
}

fn delegate(agent: &str, goal: &str) -> Value {
    json!({"name": "delegate_task", "arguments": {"agent": agent, "goal": goal}})
}

fn results(t: &[TranscriptEntry]) -> Vec<(CallState, Value)> {
    t.iter()
        .filter_map(|e| match e {
            TranscriptEntry::ToolResult { call } => {
                Some((call.state, call.result.clone().unwrap()))
            }
            _ => None,
        })
        .collect()
}

/// Waits until the tree rooted at `id` satisfies `pred` (polling the tree;
/// each poll is a real query, so no sleep decides the outcome).
async fn until_tree(
    ov: &Overseer,
    id: overseer_actors::model::SessionId,
    pred: impl Fn(&TreeNode) -> bool,
) -> TreeNode {
    poll(
        "the tree to reach the expected state",
        std::time::Duration::from_millis(2),
        || async {
            let t = ov.tree(id).await.unwrap();
            pred(&t).then_some(t)
        },
    )
    .await
}

fn all_terminal(t: &TreeNode) -> bool {
    t.nodes()
        .iter()
        .all(|n| n.status.is_terminal() || n.status == SessionStatus::AwaitingInput)
}

#[tokio::test]
async fn delegate_task_appears_only_for_agents_with_subagents() {
    let steps = json!({
        "root": [{"tool_calls": [delegate("child", "say hi")]}, {"text": "child said: {{tool_result}}"}],
        "child": [{"text": "hi from child"}],
        "plain": [{"tool_calls": [delegate("child", "x")]}, {"text": "{{tool_result}}"}]
    });
    let h = harness_agents(
        vec![root(&["child"]), named("child", &[]), named("plain", &[])],
        steps,
        RuntimeConfig::default(),
    )
    .await;
    let (id, mut rx) = h.start_agent("root", "go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let t = h.transcript(id).await;
    let (state, result) = results(&t).remove(0);
    assert_eq!(state, CallState::Completed);
    assert_eq!(result["final_text"], "hi from child");
    assert_eq!(result["stop_reason"], "end_turn");
    let child: overseer_actors::model::SessionId =
        serde_json::from_value(result["session_id"].clone()).unwrap();
    let cs = h.ov.state(child).await.unwrap();
    assert_eq!(
        cs.header.status,
        SessionStatus::Completed,
        "a child runs one turn"
    );
    let link = cs.header.parent.unwrap();
    assert_eq!(link.session_id, id);
    assert_eq!(cs.header.root_id, id);
    // An agent without subagents has no delegate_task in scope.
    let (pid, mut prx) = h.start_agent("plain", "go").await;
    assert_eq!(turn_end(&mut prx).await, StopReason::EndTurn);
    let r = results(&h.transcript(pid).await);
    assert_eq!(
        r[0].1,
        json!({"error": "tool 'delegate_task' is not available in this session"})
    );
}

#[tokio::test]
async fn depth_limit_fails_the_call_naming_the_limit() {
    let mut r = root(&["mid"]);
    r.max_delegation_depth = 1;
    let mut mid = named("mid", &[]);
    mid.subagents = vec!["leaf".into()];
    let steps = json!({
        "root": [{"tool_calls": [delegate("mid", "go deeper")]}, {"text": "root: {{tool_result}}"}],
        "mid": [{"tool_calls": [delegate("leaf", "deepest")]}, {"text": "mid got {{tool_result}}"}],
        "leaf": [{"text": "never"}]
    });
    let h = harness_agents(
        vec![r, mid, named("leaf", &[])],
        steps,
        RuntimeConfig::default(),
    )
    .await;
    let (id, mut rx) = h.start_agent("root", "go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let tree = h.ov.tree(id).await.unwrap();
    assert_eq!(tree.children.len(), 1);
    assert!(
        tree.children[0].children.is_empty(),
        "no grandchild was created"
    );
    let text = final_text(&h.transcript(id).await);
    assert!(text.contains("delegation depth limit reached"), "{text}");
    assert!(text.contains("max_delegation_depth = 1"), "{text}");
}

#[tokio::test]
async fn fan_out_limit_fails_the_extra_call_naming_the_limit() {
    let mut r = root(&["child"]);
    r.max_children = 1;
    let steps = json!({
        "root": [{"tool_calls": [delegate("child", "one"), delegate("child", "two")]}, {"text": "done"}],
        "child": [{"text": "ok"}, {"text": "ok"}]
    });
    let h = harness_agents(
        vec![r, named("child", &[])],
        steps,
        RuntimeConfig::default(),
    )
    .await;
    let (id, mut rx) = h.start_agent("root", "go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let r = results(&h.transcript(id).await);
    assert_eq!(r[0].0, CallState::Completed);
    assert_eq!(r[1].0, CallState::Failed);
    let msg = r[1].1["error"].as_str().unwrap();
    assert!(msg.contains("max_children = 1"), "{msg}");
}

#[tokio::test]
async fn a_child_cannot_call_a_tool_its_parent_lacks() {
    // The child's agent lists free_echo; the root's scope does not include it.
    let steps = json!({
        "root": [{"tool_calls": [delegate("child", "use free_echo")]}, {"text": "{{tool_result}}"}],
        "child": [{"tool_calls": [{"name": "free_echo", "arguments": {}}]}, {"text": "child: {{tool_result}}"}]
    });
    let h = harness_agents(
        vec![root(&["child"]), named("child", &["free_echo"])],
        steps,
        RuntimeConfig::default(),
    )
    .await;
    let (id, mut rx) = h.start_agent("root", "go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let tree = h.ov.tree(id).await.unwrap();
    let child = tree.children[0].session_id;
    let cs = h.ov.state(child).await.unwrap();
    assert!(
        cs.header.config.tools.is_empty(),
        "{:?}",
        cs.header.config.tools
    );
    let r = results(
        &cs.transcript
            .iter()
            .map(|e| (**e).clone())
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        r[0].1,
        json!({"error": "tool 'free_echo' is not available in this session"})
    );
}

fn approval_tree(child_approval: ChildApproval) -> (Vec<AgentConfig>, Value) {
    let mut r = root(&["child"]);
    r.tools = vec!["echo".into()];
    r.child_approval = child_approval;
    let steps = json!({
        "root": [{"tool_calls": [delegate("child", "echo something")]}, {"text": "root: {{tool_result}}"}],
        "child": [{"tool_calls": [{"name": "echo", "arguments": {"text": "from child"}}]}, {"text": "child: {{tool_result}}"}]
    });
    (vec![r, named("child", &["echo"])], steps)
}

#[tokio::test]
async fn a_propagated_approval_is_listed_and_decided_at_the_root() {
    for decision in ["approve", "edit", "deny"] {
        let (agents, steps) = approval_tree(ChildApproval::Propagate);
        let h = harness_agents(agents, steps, RuntimeConfig::default()).await;
        let (id, mut rx) = h.start_agent("root", "go").await;
        until_status(&mut rx, SessionStatus::AwaitingApproval).await;
        let pending = h.ov.pending_approvals(id).await.unwrap();
        assert_eq!(pending.len(), 1, "{pending:?}");
        let p = &pending[0];
        assert_eq!(p.path.len(), 2);
        assert_eq!(p.path[0], id);
        assert_eq!(p.path[1], p.session_id);
        assert_ne!(p.session_id, id);
        let d = match decision {
            "approve" => Decision::approve(),
            "edit" => Decision::Approve {
                override_args: json!({"text": "edited"}).as_object().cloned(),
                remove_args: Vec::new(),
            },
            _ => Decision::deny("not from the child"),
        };
        h.ov.submit(id, Submission::one(p.call.id.clone(), d))
            .await
            .unwrap();
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
        let text = final_text(&h.transcript(id).await);
        match decision {
            "approve" => assert!(
                text.contains(r#"child: {\"echo\":{\"text\":\"from child\"}}"#),
                "{text}"
            ),
            "edit" => assert!(
                text.contains(r#"child: {\"echo\":{\"text\":\"edited\"}}"#),
                "{text}"
            ),
            _ => assert!(
                text.contains("child: Tool denied by user: not from the child"),
                "{text}"
            ),
        }
        // A second decision for the same call at the root is a conflict.
        let err =
            h.ov.submit(id, Submission::one(p.call.id.clone(), Decision::approve()))
                .await
                .unwrap_err();
        assert!(
            matches!(err, overseer_actors::SessionError::AlreadyDecided(_)),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn an_auto_approve_child_never_asks() {
    let (agents, steps) = approval_tree(ChildApproval::AutoApprove);
    let h = harness_agents(agents, steps, RuntimeConfig::default()).await;
    let (id, mut rx) = h.start_agent("root", "go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 1);
    let events = h.ov.events_after(id, 0, 1000).await.unwrap();
    assert!(!events.iter().any(|e| matches!(
        e.kind,
        EventKind::StatusChanged {
            status: SessionStatus::AwaitingApproval
        }
    )));
}

#[tokio::test]
async fn parallel_children_overlap() {
    let mut r = root(&["child"]);
    r.tools = vec!["echo".into()];
    let steps = json!({
        "root": [{"tool_calls": [delegate("child", "a"), delegate("child", "b")]}, {"text": "both: {{tool_result}}"}],
        "child": [{"tool_calls": [{"name": "echo", "arguments": {"text": "{{user}}"}}]}, {"text": "did {{user}}"}]
    });
    let h = harness_agents(
        vec![r, named("child", &["echo"])],
        steps,
        RuntimeConfig::default(),
    )
    .await;
    let (id, mut rx) = h.start_agent("root", "go").await;
    // Both children wait for a decision at the same time: neither waits for
    // the other to finish.
    let tree = until_tree(&h.ov, id, |t| {
        t.children.len() == 2 && t.children.iter().all(|c| c.pending.len() == 1)
    })
    .await;
    assert_eq!(tree.status, SessionStatus::AwaitingApproval);
    let pending = h.ov.pending_approvals(id).await.unwrap();
    assert_eq!(pending.len(), 2);
    let mut sub = Submission::default();
    for p in &pending {
        sub.decisions.insert(p.call.id.clone(), Decision::approve());
    }
    h.ov.submit(id, sub).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 2);
    let r = results(&h.transcript(id).await);
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|(s, _)| *s == CallState::Completed));
}

#[tokio::test]
async fn budget_exhaustion_in_a_grandchild_stops_it_and_shows_in_every_ancestor() {
    let mut r = root(&["mid"]);
    r.budget = Budget {
        max_steps: Some(20),
        ..Budget::default()
    };
    let mut mid = named("mid", &[]);
    mid.subagents = vec!["leaf".into()];
    let mut leaf = named("leaf", &["free_echo"]);
    leaf.budget = Budget {
        max_steps: Some(1),
        ..Budget::default()
    };
    let mut r2 = r.clone();
    r2.tools = vec!["free_echo".into()];
    let mut mid2 = mid.clone();
    mid2.tools = vec!["free_echo".into()];
    let steps = json!({
        "root": [{"tool_calls": [delegate("mid", "delegate further")]}, {"text": "root: {{tool_result}}"}],
        "mid": [{"tool_calls": [delegate("leaf", "work")]}, {"text": "mid: {{tool_result}}"}],
        "leaf": [
            {"tool_calls": [{"name": "free_echo", "arguments": {}}], "usage": {"input_tokens": 7, "output_tokens": 3}},
            {"text": "never reached"}
        ]
    });
    let h = harness_agents(vec![r2, mid2, leaf], steps, RuntimeConfig::default()).await;
    let (id, mut rx) = h.start_agent("root", "go").await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let tree = h.ov.tree(id).await.unwrap();
    let mid = &tree.children[0];
    let leaf = &mid.children[0];
    assert_eq!(leaf.stop_reason, Some(StopReason::BudgetExceeded));
    // The grant never exceeds what the parent had left.
    let leaf_state = h.ov.state(leaf.session_id).await.unwrap();
    assert_eq!(leaf_state.header.config.budget.max_steps, Some(1));
    let mid_state = h.ov.state(mid.session_id).await.unwrap();
    assert_eq!(
        mid_state.header.config.budget.max_steps,
        Some(19),
        "root had 19 steps left"
    );
    // The leaf's spending is visible in every ancestor.
    assert_eq!(leaf.usage.input_tokens, 7);
    assert_eq!(mid_state.header.children_usage.input_tokens, 7);
    let root_state = h.ov.state(id).await.unwrap();
    assert_eq!(root_state.header.children_usage.input_tokens, 7);
    assert_eq!(tree.subtree_usage.input_tokens, 7);
    assert!(tree.subtree_usage.provider_requests >= 5);
    // The leaf's failure is an error result for mid, which went on.
    let mt: Vec<TranscriptEntry> = mid_state.transcript.iter().map(|e| (**e).clone()).collect();
    let (state, result) = results(&mt).remove(0);
    assert_eq!(state, CallState::Failed);
    assert_eq!(result["stop_reason"], "budget_exceeded");
    assert_eq!(mid.stop_reason, Some(StopReason::EndTurn));
}

#[tokio::test]
async fn cancelling_the_root_leaves_nothing_non_terminal_in_the_tree() {
    let (agents, steps) = approval_tree(ChildApproval::Propagate);
    let h = harness_agents(agents, steps, RuntimeConfig::default()).await;
    let (id, mut rx) = h.start_agent("root", "go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    h.ov.cancel(id).await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::Cancelled);
    let tree = until_tree(&h.ov, id, all_terminal).await;
    for node in tree.nodes() {
        assert_eq!(node.status, SessionStatus::Cancelled, "{node:?}");
        let s = h.ov.state(node.session_id).await.unwrap();
        assert!(s.header.open_calls.iter().all(|c| c.state.is_terminal()));
        for e in &s.transcript {
            if let TranscriptEntry::ToolResult { call } = e.as_ref() {
                assert!(call.state.is_terminal());
            }
        }
    }
    assert_eq!(h.echo_runs.load(Ordering::SeqCst), 0);
}

/// A new process on `store`: the same agents and scenario, nothing recovered yet.
async fn restart(
    agents: Vec<AgentConfig>,
    steps: &Value,
    store: &overseer_actors::store::MemStore,
) -> Overseer {
    let scenario =
        overseer_actors::scripted::Scenario::from_json(&json!({"agents": steps}).to_string())
            .unwrap();
    Overseer::start(
        agents,
        Arc::new(store.clone()),
        Arc::new(overseer_actors::scripted::ScriptedProvider::new(scenario)),
        tools(Default::default(), Default::default()),
        RuntimeConfig::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_tree_killed_mid_delegation_recovers_and_finishes() {
    let (agents, steps) = approval_tree(ChildApproval::Propagate);
    let h = harness_agents(agents.clone(), steps.clone(), RuntimeConfig::default()).await;
    let (id, mut rx) = h.start_agent("root", "go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    h.ov.shutdown().await.unwrap();

    // A new process on the same store: recovery resumes the root, which
    // resumes its child under its own supervision.
    let ov = restart(agents, &steps, &h.store).await;
    assert_eq!(
        ov.recover().await.unwrap(),
        1,
        "only the root is recovered directly"
    );
    assert_eq!(approve_the_pending_call(&ov, id).await, StopReason::EndTurn);
    assert!(final_text(
        &ov.state(id)
            .await
            .unwrap()
            .transcript
            .iter()
            .map(|e| (**e).clone())
            .collect::<Vec<_>>()
    )
    .starts_with("root: "));
}

#[tokio::test]
async fn recovery_reads_the_store_page_by_page_and_finds_a_parent_on_a_later_page() {
    let (agents, steps) = approval_tree(ChildApproval::Propagate);
    let h = harness_agents(agents.clone(), steps.clone(), RuntimeConfig::default()).await;
    // The root's id sorts after every generated one, so its child (waiting
    // for the approval) comes on an earlier page than the root itself.
    let id: overseer_actors::model::SessionId =
        serde_json::from_value(json!("ffffffff-ffff-7fff-bfff-ffffffffffff")).unwrap();
    let mut rx = h.start_agent_as(id, "root", "go").await;
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let child = h.ov.tree(id).await.unwrap().children[0].session_id;
    assert!(child < id);
    h.ov.shutdown().await.unwrap();

    // One header per page: recovery must still see the whole tree, and not
    // cancel the child as an orphan before the page with its parent.
    h.store.cap_pages(1);
    let ov = restart(agents, &steps, &h.store).await;
    assert_eq!(ov.recover().await.unwrap(), 1);
    assert_eq!(
        ov.state(child).await.unwrap().header.status,
        SessionStatus::AwaitingApproval
    );
    assert_eq!(approve_the_pending_call(&ov, id).await, StopReason::EndTurn);
    assert_eq!(
        ov.state(child).await.unwrap().header.status,
        SessionStatus::Completed
    );
}

#[cfg(feature = "fault-injection")]
mod faults {
    use super::*;
    use overseer_actors::fault::{arm, FaultAction, FaultPlan, FaultPoint};

    fn crash_tree(child: &str) -> (Vec<AgentConfig>, Value) {
        let r = root(&[child]);
        let steps = json!({
            "root": [{"tool_calls": [delegate(child, "work")]}, {"text": "root: {{tool_result}}"}],
            child: [{"text": "child finished its work"}]
        });
        (vec![r, named(child, &[])], steps)
    }

    fn panic_in(agent: &str, repeat: bool) {
        arm(FaultPlan {
            point: FaultPoint::MidStream,
            nth: 1,
            action: FaultAction::Panic,
            session: None,
            agent: Some(agent.into()),
            repeat,
        });
    }

    #[tokio::test]
    async fn a_crashed_child_restarts_from_its_checkpoint_while_the_parent_waits() {
        let (agents, steps) = crash_tree("crashy_once");
        let h = harness_agents(agents, steps, RuntimeConfig::default()).await;
        panic_in("crashy_once", false);
        let (id, mut rx) = h.start_agent("root", "go").await;
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
        let text = final_text(&h.transcript(id).await);
        assert!(text.contains("child finished its work"), "{text}");
        assert!(h.ov.metrics().restarts.load(Ordering::Relaxed) >= 1);
        let tree = h.ov.tree(id).await.unwrap();
        assert_eq!(tree.children[0].status, SessionStatus::Completed);
    }

    #[tokio::test]
    async fn a_child_past_its_restart_limit_is_an_error_result_and_the_parent_completes() {
        let (agents, steps) = crash_tree("crashy_always");
        let h = harness_agents(agents, steps, RuntimeConfig::default()).await;
        panic_in("crashy_always", true);
        let (id, mut rx) = h.start_agent("root", "go").await;
        assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
        let t = h.transcript(id).await;
        let (state, result) = results(&t).remove(0);
        assert_eq!(state, CallState::Failed);
        let msg = result["error"].as_str().unwrap();
        assert!(msg.contains("restart limit exceeded"), "{msg}");
        let tree = h.ov.tree(id).await.unwrap();
        assert_eq!(tree.children[0].status, SessionStatus::Failed);
        assert_eq!(tree.status, SessionStatus::AwaitingInput);
    }
}
