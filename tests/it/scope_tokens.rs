//! Scope tokens through a real delegation: the token minted for a child's
//! tool call carries the tree's ids and an `allowed_tools` that is a subset
//! of its parent's (§7, §8).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use overseer::scope_token::ScopeTokens;
use overseer_actors::model::{
    AgentConfig, ApprovalPolicy, EventKind, Notification, SessionId, StopReason, TranscriptEntry,
};
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::store::MemStore;
use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};
use overseer_actors::{CreateSession, Overseer, RuntimeConfig};
use serde_json::{json, Value};

const SECRET: &[u8] = b"scope-token-test-secret-32-bytes!";

/// Mints a scope token for each call and records it, as an http tool would
/// before sending the request.
struct WhoAmI {
    spec: ToolSpec,
    tokens: ScopeTokens,
    seen: Arc<Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl Tool for WhoAmI {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, ctx: ToolContext, _arguments: Value) -> Result<Value, ToolError> {
        let token = self
            .tokens
            .mint(&ctx)
            .map_err(|e| ToolError::new(e.to_string()))?;
        self.seen.lock().unwrap().push(token);
        Ok(json!("ok"))
    }
}

struct Noop(ToolSpec);

#[async_trait::async_trait]
impl Tool for Noop {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _ctx: ToolContext, _arguments: Value) -> Result<Value, ToolError> {
        Ok(json!("noop"))
    }
}

#[tokio::test]
async fn a_childs_token_names_its_tree_and_allows_a_subset_of_its_parents_tools() {
    let tokens = ScopeTokens::hs256(SECRET, Duration::from_secs(120)).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let registry = ToolRegistry::new(vec![
        Arc::new(WhoAmI {
            spec: ToolSpec::new("whoami", "mints a token", json!({"type": "object"})),
            tokens: tokens.clone(),
            seen: seen.clone(),
        }),
        Arc::new(Noop(ToolSpec::new(
            "root_only",
            "x",
            json!({"type": "object"}),
        ))),
        Arc::new(Noop(ToolSpec::new(
            "child_only",
            "x",
            json!({"type": "object"}),
        ))),
    ])
    .unwrap();
    let mut root = AgentConfig::new("root", &["whoami", "root_only"]);
    root.subagents = vec!["child".into()];
    root.approval = ApprovalPolicy::Auto;
    let child = AgentConfig::new("child", &["whoami", "child_only"]);
    let scenario = Scenario::from_json(
        &json!({"agents": {
            "root": [
                {"tool_calls": [{"name": "whoami", "arguments": {}}]},
                {"tool_calls": [{"name": "delegate_task", "arguments": {"agent": "child", "goal": "who are you"}}]},
                {"text": "done"}
            ],
            "child": [
                {"tool_calls": [{"name": "whoami", "arguments": {}}, {"name": "child_only", "arguments": {}}]},
                {"text": "child: {{tool_result}}"}
            ]
        }})
        .to_string(),
    )
    .unwrap();
    let ov = Overseer::start(
        vec![root, child],
        Arc::new(MemStore::new()),
        Arc::new(ScriptedProvider::new(scenario)),
        registry,
        RuntimeConfig::default(),
    )
    .await
    .unwrap();
    let id = SessionId::generate();
    let mut rx = ov.subscribe(id);
    ov.create_session(CreateSession {
        agent: "root".into(),
        tenant: "acme".into(),
        created_by: Some("alice".into()),
        prompt: Some("go".into()),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    let turn_end = async {
        loop {
            match rx.recv().await {
                Ok(Notification::Event(e)) => {
                    if let EventKind::TurnEnded { stop_reason, .. } = e.kind {
                        assert_eq!(stop_reason, StopReason::EndTurn);
                        break;
                    }
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), turn_end)
        .await
        .expect("the turn never ended");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "root and child each minted one token");
    let parent = tokens.verify(&seen[0]).unwrap();
    let child = tokens.verify(&seen[1]).unwrap();
    assert_eq!(parent.session_id, id);
    assert_eq!(parent.root_session_id, id);
    assert_eq!(parent.parent_session_id, None);
    assert_eq!(parent.sub, "alice");
    assert_eq!(parent.tenant, "acme");
    assert_eq!(child.root_session_id, id);
    assert_eq!(child.parent_session_id, Some(id));
    assert_ne!(child.session_id, id);
    assert_eq!(child.sub, "alice");
    assert_eq!(child.agent, "child");
    // The subset rule: the child's agent lists child_only, its parent's scope
    // does not, so the child may not call it.
    assert!(child
        .allowed_tools
        .iter()
        .all(|t| parent.allowed_tools.contains(t)));
    assert_eq!(child.allowed_tools, vec!["whoami"]);
    assert!(tokens.authorize(&seen[1], "child_only").is_err());
    assert!(tokens.authorize(&seen[1], "whoami").is_ok());
    let tree = ov.tree(id).await.unwrap();
    let child_state = ov.state(tree.children[0].session_id).await.unwrap();
    let refused = child_state.transcript.iter().any(|e| match e.as_ref() {
        TranscriptEntry::ToolResult { call } => {
            call.name == "child_only"
                && call.result
                    == Some(json!({"error": "tool 'child_only' is not available in this session"}))
        }
        _ => false,
    });
    assert!(refused, "the out-of-scope call was refused before dispatch");
}
