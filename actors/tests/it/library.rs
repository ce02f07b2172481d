//! Stored tasks and Agent Skills (§17) through the in-process API: a task
//! run by the model (its child's approval decided at the root, its
//! structured output returned) and by a person, the errors of unknown tasks
//! and bad contexts, and skills listed by description only, activated once,
//! kept across a restart and a compaction, refused to the model when they
//! need trust and allowed to a person.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::*;
use futures::StreamExt;
use overseer_actors::model::{
    AgentConfig, CallState, EventKind, SessionId, SessionStatus, StopReason, TranscriptEntry,
};
use overseer_actors::provider::{
    Provider, ProviderError, ProviderRequest, ProviderStream, RequestPurpose,
};
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::skills::{Skill, SkillCatalog};
use overseer_actors::store::{CheckpointStore, MemStore};
use overseer_actors::tasks::{TaskCatalog, TaskDef};
use overseer_actors::tool::{Tool, ToolContext, ToolError, ToolSpec};
use overseer_actors::{CreateSession, Library, Overseer, RuntimeConfig, SessionError, TaskRun};
use serde_json::{json, Value};

const NOTES_BODY: &str = "NOTES-BODY: write every finding as one line.";
const VAULT_BODY: &str = "VAULT-BODY: the vault's combination is in references/.";

/// A provider that records every request and plays a scenario.
struct Recording {
    inner: ScriptedProvider,
    requests: Arc<Mutex<Vec<ProviderRequest>>>,
}

#[async_trait::async_trait]
impl Provider for Recording {
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        self.requests.lock().unwrap().push(request.clone());
        let events = self.inner.stream(request).await?;
        Ok(events.boxed())
    }

    fn context_window(&self, model: &str) -> Option<u64> {
        self.inner.context_window(model)
    }
}

struct ReadStub(ToolSpec);

#[async_trait::async_trait]
impl Tool for ReadStub {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _ctx: ToolContext, args: Value) -> Result<Value, ToolError> {
        Ok(json!({"content": format!("read {}", args["path"])}))
    }
}

fn skill(name: &str, description: &str, body: &str, requires_trust: bool) -> Skill {
    Skill {
        name: name.into(),
        description: description.into(),
        body: body.into(),
        dir: PathBuf::from(format!("/skills/{name}")),
        requires_trust,
        front_matter: Default::default(),
    }
}

fn library() -> Library {
    let skills = SkillCatalog::new(vec![
        skill(
            "notes",
            "Use when writing findings down.",
            NOTES_BODY,
            false,
        ),
        skill("vault", "Use to open the vault.", VAULT_BODY, true),
    ])
    .unwrap();
    let tasks = TaskCatalog::new(vec![
        TaskDef {
            id: "triage".into(),
            description: "Triage a ticket and rate its severity".into(),
            instructions: "Triage the ticket.".into(),
            agent: "ops".into(),
            skills: vec!["notes".into()],
            output_schema: Some(json!({
                "type": "object",
                "properties": {"severity": {"type": "string"}},
                "required": ["severity"]
            })),
            input_schema: Some(json!({
                "type": "object",
                "properties": {"ticket": {"type": "object",
                    "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
                "required": ["ticket"]
            })),
        },
        TaskDef {
            id: "open-vault".into(),
            description: "Open the vault".into(),
            instructions: "Open it.".into(),
            agent: "ops".into(),
            skills: vec!["vault".into()],
            output_schema: None,
            input_schema: None,
        },
    ])
    .unwrap();
    Library::new(tasks, skills)
}

fn agents() -> Vec<AgentConfig> {
    // The lead has `echo` so its task's child may use it (a child's tools
    // are its agent's within its parent's).
    let mut lead = AgentConfig::new("lead", &["echo"]);
    lead.tasks = vec!["triage".into(), "open-vault".into()];
    lead.skills = vec!["notes".into(), "vault".into()];
    let mut ops = AgentConfig::new("ops", &["echo"]);
    ops.skills = vec!["notes".into()];
    let mut a = AgentConfig::new("a", &[]);
    a.skills = vec!["notes".into(), "vault".into()];
    vec![lead, ops, a]
}

struct Rig {
    ov: Overseer,
    store: MemStore,
    requests: Arc<Mutex<Vec<ProviderRequest>>>,
}

async fn rig_on(store: MemStore, steps: Value, extra: Value) -> Rig {
    let mut doc = json!({"name": "library", "agents": steps});
    if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
        d.extend(e.clone());
    }
    let requests = Arc::new(Mutex::new(Vec::new()));
    let provider = Recording {
        inner: ScriptedProvider::new(Scenario::from_json(&doc.to_string()).unwrap()),
        requests: requests.clone(),
    };
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    // `read_skill_resource` reads files, so the edge implements it; here a
    // stand-in answers, to show which calls reach it.
    let registry = tools(runs, seen)
        .extended(vec![Arc::new(ReadStub(ToolSpec::new(
            "read_skill_resource",
            "reads",
            overseer_actors::skills::read_resource_schema(),
        )))])
        .unwrap();
    let ov = Overseer::start_with(
        agents(),
        library(),
        Arc::new(store.clone()),
        Arc::new(provider),
        registry,
        RuntimeConfig::default(),
    )
    .await
    .unwrap();
    Rig {
        ov,
        store,
        requests,
    }
}

async fn rig(steps: Value) -> Rig {
    rig_on(MemStore::new(), steps, json!({})).await
}

async fn start(ov: &Overseer, agent: &str, prompt: &str) -> SessionId {
    let id = SessionId::generate();
    ov.create_session(CreateSession {
        agent: agent.into(),
        tenant: "t".into(),
        prompt: Some(prompt.into()),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    id
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

fn results(t: &[TranscriptEntry]) -> Vec<(String, CallState, Value)> {
    tool_results(t)
}

#[tokio::test]
async fn a_task_run_by_the_model_asks_at_the_root_and_returns_its_structured_output() {
    let r = rig(json!({
        "lead": [
            {"tool_calls": [call("run_task", json!({"task": "triage", "context": {"ticket": {"id": 7}}}))]},
            {"text": "lead: {{tool_result}}"}
        ],
        "ops": [
            {"text": "checking", "tool_calls": [call("echo", json!({"text": "look"}))]},
            {"text": "{\"severity\": \"high\"}"}
        ]
    }))
    .await;
    let root = SessionId::generate();
    let mut rx = r.ov.subscribe(root);
    r.ov.create_session(CreateSession {
        agent: "lead".into(),
        tenant: "t".into(),
        prompt: Some("triage ticket 7".into()),
        id: Some(root),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    // The child's call waits for a decision that surfaces at the root.
    until_status(&mut rx, SessionStatus::AwaitingApproval).await;
    let pending = r.ov.pending_approvals(root).await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].call.name, "echo");
    assert_eq!(
        pending[0].path.len(),
        2,
        "decided at the root, owned by the child"
    );
    let child = pending[0].session_id;
    assert_eq!(
        approve_the_pending_call(&r.ov, root).await,
        StopReason::EndTurn
    );

    let t = transcript_of(&r.ov, root).await;
    let res = results(&t);
    assert_eq!(res.len(), 1);
    let (name, state, value) = &res[0];
    assert_eq!((name.as_str(), *state), ("run_task", CallState::Completed));
    assert_eq!(value["output"], json!({"severity": "high"}), "{value}");
    assert_eq!(value["task"], "triage");
    assert_eq!(value["session_id"], json!(child));

    // The child ran the task: its agent, its first message with the context,
    // its skill activated first, its output schema.
    let c = r.ov.state(child).await.unwrap();
    assert_eq!(c.header.task.as_deref(), Some("triage"));
    assert_eq!(c.header.agent, "ops");
    assert!(c.header.config.output_schema.is_some());
    match c.transcript[0].as_ref() {
        TranscriptEntry::SkillActivated { name, by, .. } => {
            assert_eq!(name, "notes");
            assert_eq!(by.as_deref(), Some("task:triage"));
        }
        other => panic!("the child starts with {other:?}"),
    }
    match c.transcript[1].as_ref() {
        TranscriptEntry::User { text, .. } => {
            assert!(text.starts_with("Triage the ticket."), "{text}");
            assert!(text.contains("\"id\": 7"), "{text}");
        }
        other => panic!("then {other:?}"),
    }
    // The child's first request carried the skill's body after its prompt's
    // listing, and the lead's prompt listed the tasks by description.
    let requests = r.requests.lock().unwrap().clone();
    let lead_first = &requests[0];
    assert!(lead_first
        .instructions
        .contains("- triage: Triage a ticket"));
    assert!(lead_first.tools.iter().any(|t| t.name() == "run_task"));
}

#[tokio::test]
async fn an_unknown_task_a_bad_context_and_a_task_needing_trust_are_errors_the_model_sees() {
    let r = rig(json!({
        "lead": [
            {"tool_calls": [
                call("run_task", json!({"task": "nope"})),
                call("run_task", json!({"task": "triage", "context": {"ticket": {"id": "seven"}}})),
                call("run_task", json!({"task": "open-vault"}))
            ]},
            {"text": "noted"}
        ],
        "ops": [{"text": "never runs"}]
    }))
    .await;
    let root = start(&r.ov, "lead", "go").await;
    let mut rx = r.ov.subscribe(root);
    poll(
        "the lead's turn to end",
        std::time::Duration::from_millis(5),
        || async {
            let s = r.ov.state(root).await.unwrap();
            (s.header.status == SessionStatus::AwaitingInput).then_some(())
        },
    )
    .await;
    drop(rx.try_recv());
    let res = results(&transcript_of(&r.ov, root).await);
    assert_eq!(res.len(), 3, "{res:?}");
    assert!(
        res.iter().all(|(_, s, _)| *s == CallState::Failed),
        "{res:?}"
    );
    let error = |i: usize| res[i].2["error"].as_str().unwrap().to_owned();
    assert!(error(0).contains("unknown task 'nope'"), "{}", error(0));
    assert!(
        error(0).contains("triage"),
        "it lists the tasks: {}",
        error(0)
    );
    assert!(error(1).contains("context.ticket.id"), "{}", error(1));
    assert!(error(2).contains("only a person"), "{}", error(2));
    // None of them started a child.
    let tree = r.ov.tree(root).await.unwrap();
    assert!(tree.children.is_empty(), "{tree:?}");
}

#[tokio::test]
async fn a_person_runs_a_task_as_a_root_session_and_may_use_skills_that_need_trust() {
    let r = rig(json!({
        "ops": [{"text": "opened"}, {"text": "{\"severity\": \"low\"}"}]
    }))
    .await;
    let id =
        r.ov.run_task(TaskRun {
            task: "open-vault".into(),
            tenant: "t".into(),
            created_by: Some("alice".into()),
            ..TaskRun::default()
        })
        .await
        .unwrap();
    let mut rx = r.ov.subscribe(id);
    let s = r.ov.state(id).await.unwrap();
    assert_eq!(s.header.task.as_deref(), Some("open-vault"));
    assert!(
        s.header.parent.is_none(),
        "a person's run is a root session"
    );
    assert!(matches!(s.transcript[0].as_ref(),
        TranscriptEntry::SkillActivated { name, by: Some(by), .. } if name == "vault" && by == "alice"));
    if s.header.status != SessionStatus::AwaitingInput {
        turn_end(&mut rx).await;
    }
    let requests = r.requests.lock().unwrap().clone();
    assert!(
        requests[0].transcript.iter().any(|e| matches!(e.as_ref(),
            TranscriptEntry::SkillActivated { body, .. } if body == VAULT_BODY)),
        "the trusted skill's body is in the first request"
    );

    // Unknown task, bad context: errors naming what is wrong.
    let unknown =
        r.ov.run_task(TaskRun {
            task: "nope".into(),
            tenant: "t".into(),
            ..TaskRun::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(&unknown, SessionError::UnknownTask(t) if t == "nope"));
    for (context, field) in [
        (None, "context"),
        (Some(json!({"ticket": {"id": "x"}})), "context.ticket.id"),
    ] {
        let e =
            r.ov.run_task(TaskRun {
                task: "triage".into(),
                context,
                tenant: "t".into(),
                ..TaskRun::default()
            })
            .await
            .unwrap_err();
        match e {
            SessionError::InvalidContext { field: f, .. } => assert_eq!(f, field),
            other => panic!("{other:?}"),
        }
    }
}

/// The model sees skills by name and description; activating one loads its
/// body once (a second activation is "already active"); a skill that needs
/// trust is refused to the model, told to ask, and a person activates it.
#[tokio::test]
async fn skills_are_listed_by_description_activated_once_and_trust_is_a_persons() {
    let r = rig(json!({
        "a": [
            {"tool_calls": [call("activate_skill", json!({"name": "notes"}))]},
            {"tool_calls": [
                call("activate_skill", json!({"name": "notes"})),
                call("activate_skill", json!({"name": "vault"})),
                call("read_skill_resource", json!({"name": "vault", "path": "references/x.md"}))
            ]},
            {"text": "please activate the vault skill"},
            {"text": "done"}
        ]
    }))
    .await;
    let id = SessionId::generate();
    let mut rx = r.ov.subscribe(id);
    r.ov.create_session(CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("work".into()),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let requests = r.requests.lock().unwrap().clone();
    let first = &requests[0];
    assert!(first
        .instructions
        .contains("- notes: Use when writing findings down."));
    assert!(first
        .instructions
        .contains("- vault: Use to open the vault."));
    assert!(
        !first.instructions.contains("NOTES-BODY") && !first.instructions.contains("VAULT-BODY"),
        "bodies are not in the prompt before activation"
    );
    // After the activation, requests carry the body once, after its step.
    let second = &requests[1];
    let kinds: Vec<&str> = second
        .transcript
        .iter()
        .map(|e| match e.as_ref() {
            TranscriptEntry::User { .. } => "user",
            TranscriptEntry::Assistant { .. } => "assistant",
            TranscriptEntry::ToolResult { .. } => "result",
            TranscriptEntry::SkillActivated { .. } => "skill",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["user", "assistant", "result", "skill"]);
    let t = transcript_of(&r.ov, id).await;
    let res = results(&t);
    assert_eq!(res[0].2["status"], "activated");
    assert!(
        res[0].2.get("instructions").is_none(),
        "the body left the result"
    );
    assert_eq!(res[1].2["status"], "already active");
    assert_eq!(res[2].1, CallState::Failed);
    let refusal = res[2].2["error"].as_str().unwrap();
    assert!(
        refusal.contains("only a person") && refusal.contains("Ask the user"),
        "{refusal}"
    );
    assert!(res[3].2["error"].as_str().unwrap().contains("not active"));
    let activations = |t: &[TranscriptEntry]| {
        t.iter()
            .filter(|e| matches!(e, TranscriptEntry::SkillActivated { .. }))
            .count()
    };
    assert_eq!(activations(&t), 1);

    // A person activates the skill that needs trust; twice is a conflict.
    r.ov.activate_skill(id, "vault", Some("alice".into()))
        .await
        .unwrap();
    let again = r.ov.activate_skill(id, "vault", Some("alice".into())).await;
    assert!(matches!(again, Err(SessionError::Conflict(_))), "{again:?}");
    let unknown = r.ov.activate_skill(id, "nope", None).await;
    assert!(matches!(unknown, Err(SessionError::Invalid(m)) if m.contains("name")));
    r.ov.send_message(id, "now?").await.unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let requests = r.requests.lock().unwrap().clone();
    let last = requests.last().unwrap();
    assert!(last.transcript.iter().any(|e| matches!(e.as_ref(),
        TranscriptEntry::SkillActivated { name, by: Some(by), .. } if name == "vault" && by == "alice")));
}

/// An activated body is part of the session: it is read back after a
/// restart, and a compaction never summarises it away.
#[tokio::test]
async fn an_activated_skill_survives_a_restart_and_a_compaction() {
    let steps = json!({
        "a": [
            {"tool_calls": [call("activate_skill", json!({"name": "notes"}))]},
            {"text": "first answer"},
            {"text": "second answer"},
            {"text": "third answer"}
        ]
    });
    let extra = json!({"context_window": 1000});
    let store = MemStore::new();
    let r = rig_on(store.clone(), steps.clone(), extra.clone()).await;
    let id = SessionId::generate();
    let mut rx = r.ov.subscribe(id);
    r.ov.create_session(CreateSession {
        agent: "a".into(),
        tenant: "t".into(),
        prompt: Some("a".repeat(1600)),
        id: Some(id),
        ..CreateSession::default()
    })
    .await
    .unwrap();
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    r.ov.shutdown().await.unwrap();
    drop(r);

    // A new runtime on the same store: the activation is in the checkpoint.
    let r = rig_on(store.clone(), steps, extra).await;
    r.ov.recover().await.unwrap();
    let stored = r.store.load(id).await.unwrap().unwrap();
    assert!(stored.transcript.iter().any(|e| matches!(e.as_ref(),
        TranscriptEntry::SkillActivated { name, body, .. } if name == "notes" && body == NOTES_BODY)));
    let mut rx = r.ov.subscribe(id);
    // Past 80 % of the window: the older transcript is compacted first.
    r.ov.send_message(id, "b".repeat(1800)).await.unwrap();
    until(&mut rx, |k| matches!(k, EventKind::Compacted { .. })).await;
    assert_eq!(turn_end(&mut rx).await, StopReason::EndTurn);
    let requests = r.requests.lock().unwrap().clone();
    let summary_request = requests
        .iter()
        .find(|q| q.purpose == RequestPurpose::Compaction)
        .unwrap();
    assert!(
        !summary_request
            .transcript
            .iter()
            .any(|e| matches!(e.as_ref(), TranscriptEntry::SkillActivated { .. })),
        "a skill's body is never given to the summary"
    );
    let after = requests.last().unwrap();
    assert!(matches!(
        after.transcript.first().map(|e| e.as_ref()),
        Some(TranscriptEntry::Compaction { .. })
    ));
    assert!(
        matches!(after.transcript.get(1).map(|e| e.as_ref()),
            Some(TranscriptEntry::SkillActivated { body, .. }) if body == NOTES_BODY),
        "the body follows the summary whole: {:?}",
        after.transcript.get(1)
    );
}
