//! Stored tasks, Agent Skills and forks (§17) over HTTP on a real loopback
//! socket and sled directory, with the real skill folders of
//! `examples/skills` read by the real parser; and the CLI as a process for
//! a start-up refused by a malformed `SKILL.md` and for `run --task`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::*;
use overseer::skills::SkillsDir;
use overseer::tools::skills::ReadSkillResource;
use overseer_actors::model::AgentConfig;
use overseer_actors::scripted::{Scenario, ScriptedProvider};
use overseer_actors::tasks::{TaskCatalog, TaskDef};
use overseer_actors::tool::Tool;
use overseer_actors::Library;
use serde_json::{json, Value};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/skills")
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

/// A skills directory of the examples plus a folder of the test's own with
/// a link that points out of it.
fn skill_dirs(tmp: &Path) -> Vec<SkillsDir> {
    let leaky = tmp.join("more/leaky");
    std::fs::create_dir_all(leaky.join("references")).unwrap();
    std::fs::write(
        leaky.join("SKILL.md"),
        "---\nname: leaky\ndescription: A skill with a link out of its folder.\n---\nRead references/ok.md.\n",
    )
    .unwrap();
    std::fs::write(leaky.join("references/ok.md"), "fine").unwrap();
    std::fs::write(tmp.join("secret.txt"), "the secret").unwrap();
    std::os::unix::fs::symlink(tmp.join("secret.txt"), leaky.join("references/link.md")).unwrap();
    vec![
        SkillsDir {
            path: examples(),
            trusted: true,
        },
        SkillsDir {
            path: tmp.join("more"),
            trusted: true,
        },
    ]
}

struct Rig {
    server: Server,
    _tmp: tempfile::TempDir,
}

async fn rig(steps: Value) -> Rig {
    let tmp = tempfile::tempdir().unwrap();
    let skills = overseer::skills::load(&skill_dirs(tmp.path())).unwrap();
    let tasks = TaskCatalog::new(vec![TaskDef {
        id: "triage".into(),
        description: "Triage a ticket".into(),
        instructions: "Triage the ticket.".into(),
        agent: "ops".into(),
        skills: vec!["incident-triage".into()],
        output_schema: Some(json!({
            "type": "object", "properties": {"severity": {"type": "string"}}, "required": ["severity"]
        })),
        input_schema: Some(json!({
            "type": "object",
            "properties": {"ticket": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
            "required": ["ticket"]
        })),
    }])
    .unwrap();
    let library = Library::new(tasks, skills);
    let mut lead = AgentConfig::new("lead", &["write_record"]);
    lead.tasks = vec!["triage".into()];
    lead.skills = vec!["incident-triage".into()];
    let mut ops = AgentConfig::new("ops", &["write_record"]);
    ops.skills = vec!["incident-triage".into()];
    let mut writer = AgentConfig::new("writer", &[]);
    writer.skills = vec![
        "release-notes".into(),
        "production-deploy".into(),
        "leaky".into(),
    ];
    let scenario =
        Scenario::from_json(&json!({"name": "library", "agents": steps}).to_string()).unwrap();
    let read: Arc<dyn Tool> = Arc::new(ReadSkillResource::new(library.skills.clone()));
    let server = Server::start_library(
        tempfile::tempdir().unwrap(),
        vec![lead, ops, writer],
        library,
        Arc::new(ScriptedProvider::new(scenario)),
        vec![read],
    )
    .await
    .unwrap();
    Rig { server, _tmp: tmp }
}

fn results(session: &Value) -> Vec<Value> {
    session["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["role"] == "tool_result")
        .map(|e| e["call"].clone())
        .collect()
}

async fn session(s: &Server, token: &str, id: &str) -> Value {
    let (status, v) = send(s.get(&format!("/v1/sessions/{id}"), token))
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test]
async fn a_task_runs_for_the_model_and_for_a_person_over_http() {
    let r = rig(json!({
        "lead": [
            {"tool_calls": [call("run_task", json!({"task": "triage", "context": {"ticket": {"id": 9}}}))]},
            {"text": "lead: {{tool_result}}"}
        ],
        "ops": [
            {"tool_calls": [call("write_record", json!({"key": 9}))]},
            {"text": "{\"severity\": \"sev2\"}"}
        ]
    }))
    .await;
    let s = &r.server;
    let t = token("acme", "alice", ALL);
    let (status, tasks) = send(s.get("/v1/tasks", &t)).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(tasks["tasks"][0]["id"], "triage");
    assert_eq!(tasks["tasks"][0]["agent"], "ops");
    assert!(tasks["tasks"][0]["input_schema"].is_object());

    // The model runs it: the child's call is decided at the root.
    let root = s.create(&t, "lead", Some("triage ticket 9")).await.unwrap();
    let mut events = Sse::open(s, &t, &root, None).await.unwrap();
    events.until_status("awaiting_approval").await.unwrap();
    let (_, pending) = send(s.get(&format!("/v1/sessions/{root}/approvals"), &t))
        .await
        .unwrap();
    let p = &pending["pending"][0];
    assert_eq!(p["name"], "write_record", "{pending}");
    assert_eq!(
        p["session_path"].as_array().unwrap().len(),
        2,
        "a child's call, decided at the root"
    );
    let call_id = p["call_id"].as_str().unwrap();
    let (status, v) = send(s.post(
        &format!("/v1/sessions/{root}/approvals"),
        &t,
        &json!({"decisions": {call_id: {"decision": "approve"}}}),
    ))
    .await
    .unwrap();
    assert_eq!(status, 200, "{v}");
    events.until_type("turn_ended").await.unwrap();
    let v = session(s, &t, &root).await;
    let res = results(&v);
    assert_eq!(res[0]["name"], "run_task");
    assert_eq!(res[0]["state"], "completed", "{}", res[0]);
    assert_eq!(res[0]["result"]["output"], json!({"severity": "sev2"}));
    assert_eq!(res[0]["result"]["task"], "triage");

    // A person runs it: a root session of the caller's tenant.
    let (status, run) = send(s.post(
        "/v1/tasks/triage/runs",
        &t,
        &json!({"context": {"ticket": {"id": 3}}}),
    ))
    .await
    .unwrap();
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["task"], "triage");
    assert_eq!(run["tenant"], "acme");
    assert_eq!(run["agent"], "ops");
    assert_eq!(run["transcript"][0]["role"], "skill_activated");
    assert_eq!(run["transcript"][0]["by"], "alice");
    assert!(run["transcript"][1]["text"]
        .as_str()
        .unwrap()
        .contains("\"id\": 3"));

    // Unknown task: 404 naming it; bad context: 400 naming the field.
    let e = expect_error(
        s.post("/v1/tasks/nope/runs", &t, &json!({})),
        404,
        "unknown_task",
    )
    .await
    .unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("nope"));
    let e = expect_error(
        s.post(
            "/v1/tasks/triage/runs",
            &t,
            &json!({"context": {"ticket": {"id": "three"}}}),
        ),
        400,
        "invalid_context",
    )
    .await
    .unwrap();
    assert_eq!(e["error"]["details"]["field"], "context.ticket.id", "{e}");
    let e = expect_error(
        s.client
            .post(s.url("/v1/tasks/triage/runs"))
            .bearer_auth(&t),
        400,
        "invalid_context",
    )
    .await
    .unwrap();
    assert_eq!(e["error"]["details"]["field"], "context", "{e}");
    let e = expect_error(
        s.post("/v1/tasks/triage/runs", &t, &json!({"contxt": {}})),
        400,
        "invalid_body",
    )
    .await
    .unwrap();
    assert!(
        e["error"]["message"].as_str().unwrap().contains("contxt"),
        "{e}"
    );
}

#[tokio::test]
async fn skills_from_real_folders_are_listed_activated_read_and_kept_inside_their_folders() {
    let r = rig(json!({
        "writer": [
            {"tool_calls": [
                call("activate_skill", json!({"name": "release-notes"})),
                call("activate_skill", json!({"name": "leaky"})),
                call("activate_skill", json!({"name": "production-deploy"}))
            ]},
            {"tool_calls": [
                call("read_skill_resource", json!({"name": "release-notes", "path": "references/style.md"})),
                call("read_skill_resource", json!({"name": "release-notes", "path": "../incident-triage/SKILL.md"})),
                call("read_skill_resource", json!({"name": "release-notes", "path": "/etc/passwd"})),
                call("read_skill_resource", json!({"name": "leaky", "path": "references/link.md"})),
                call("read_skill_resource", json!({"name": "leaky", "path": "references/ok.md"})),
                call("read_skill_resource", json!({"name": "production-deploy", "path": "scripts/deploy.sh"}))
            ]},
            {"text": "Please activate production-deploy for me."},
            {"text": "deploying"}
        ]
    }))
    .await;
    let s = &r.server;
    let t = token("acme", "alice", ALL);

    // The agents list shows each agent's skills by name and description.
    let (_, agents) = send(s.get("/v1/agents", &t)).await.unwrap();
    let writer = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "writer")
        .unwrap();
    let specs = writer["skill_specs"].as_array().unwrap();
    assert_eq!(specs.len(), 3);
    let deploy = specs
        .iter()
        .find(|s| s["name"] == "production-deploy")
        .unwrap();
    assert_eq!(deploy["requires_trust"], true);
    assert!(deploy["description"]
        .as_str()
        .unwrap()
        .starts_with("Deploy a release"));

    let id = s.create(&t, "writer", Some("notes for 2.0")).await.unwrap();
    let mut events = Sse::open(s, &t, &id, None).await.unwrap();
    events.until_type("turn_ended").await.unwrap();
    let v = session(s, &t, &id).await;
    // Listed by description only: no body in the instructions.
    let instructions = v["config"]["instructions"].as_str().unwrap();
    assert!(instructions.contains("- release-notes: Write release notes"));
    assert!(
        !instructions.contains("Group the changes"),
        "a body is in the prompt"
    );
    let res = results(&v);
    let by = |i: usize| (res[i]["state"].as_str().unwrap(), res[i]["result"].clone());
    assert_eq!(by(0).0, "completed");
    assert_eq!(by(1).0, "completed");
    assert_eq!(by(2).0, "failed");
    assert!(by(2).1["error"].as_str().unwrap().contains("Ask the user"));
    // The resource under the folder is read; every way out is refused.
    assert_eq!(by(3).0, "completed", "{}", res[3]);
    assert!(by(3).1["content"].as_str().unwrap().contains("house style"));
    for (i, why) in [(4, "'..'"), (5, "relative"), (6, "outside")] {
        assert_eq!(by(i).0, "failed", "{}", res[i]);
        let e = by(i).1["error"].as_str().unwrap().to_owned();
        assert!(e.contains(why), "{i}: {e}");
        assert!(!e.contains("the secret"));
    }
    assert_eq!(by(7).1["content"], "fine");
    // The untrusted skill is not active, so its files are not readable yet.
    assert!(by(8).1["error"].as_str().unwrap().contains("not active"));
    let bodies: Vec<&Value> = v["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["role"] == "skill_activated")
        .collect();
    assert_eq!(bodies.len(), 2);
    assert!(bodies[0]["body"]
        .as_str()
        .unwrap()
        .contains("Group the changes"));

    // A person activates the skill that needs trust; twice is a 409.
    let (status, h) = send(s.post(
        &format!("/v1/sessions/{id}/skills"),
        &t,
        &json!({"name": "production-deploy"}),
    ))
    .await
    .unwrap();
    assert_eq!(status, 200, "{h}");
    expect_error(
        s.post(
            &format!("/v1/sessions/{id}/skills"),
            &t,
            &json!({"name": "production-deploy"}),
        ),
        409,
        "conflict",
    )
    .await
    .unwrap();
    expect_error(
        s.post(
            &format!("/v1/sessions/{id}/skills"),
            &t,
            &json!({"name": "incident-triage"}),
        ),
        400,
        "invalid_request",
    )
    .await
    .unwrap();
    let other = token("globex", "mallory", ALL);
    expect_error(
        s.post(
            &format!("/v1/sessions/{id}/skills"),
            &other,
            &json!({"name": "release-notes"}),
        ),
        404,
        "not_found",
    )
    .await
    .unwrap();
    let v = session(s, &t, &id).await;
    let last = v["transcript"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "skill_activated");
    assert_eq!(last["name"], "production-deploy");
    assert_eq!(last["by"], "alice");
}

#[tokio::test]
async fn forks_over_http_keep_the_source_and_another_tenant_gets_404() {
    let r = rig(json!({
        "ops": [
            {"text": "writing", "tool_calls": [call("write_record", json!({"key": 1}))]},
            {"text": "wrote it"},
            {"text": "the fork goes on"}
        ]
    }))
    .await;
    let s = &r.server;
    let t = token("acme", "alice", ALL);
    let src = s.create(&t, "ops", Some("write 1")).await.unwrap();
    let mut events = Sse::open(s, &t, &src, None).await.unwrap();
    events.until_status("awaiting_approval").await.unwrap();

    // Mid-turn: the fork asks again.
    let (status, fork) = send(s.post(&format!("/v1/sessions/{src}/fork"), &t, &json!({})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{fork}");
    assert_eq!(fork["forked_from"]["session"], src.as_str());
    assert_eq!(fork["tenant"], "acme");
    let fork_id = fork["id"].as_str().unwrap().to_owned();
    let (_, pending) = send(s.get(&format!("/v1/sessions/{fork_id}/approvals"), &t))
        .await
        .unwrap();
    assert_eq!(pending["pending"].as_array().unwrap().len(), 1, "{pending}");

    // Another tenant cannot fork it nor read its history.
    let other = token("globex", "mallory", ALL);
    expect_error(
        s.post(&format!("/v1/sessions/{src}/fork"), &other, &json!({})),
        404,
        "not_found",
    )
    .await
    .unwrap();
    expect_error(
        s.get(&format!("/v1/sessions/{src}/history"), &other),
        404,
        "not_found",
    )
    .await
    .unwrap();
    expect_error(
        s.post(
            &format!("/v1/sessions/{src}/fork"),
            &t,
            &json!({"at": {"seq": 1, "index": 1}}),
        ),
        400,
        "invalid_body",
    )
    .await
    .unwrap();

    // The source finishes; its history lists the result and the turn's end.
    s.client
        .post(s.url(&format!("/v1/sessions/{fork_id}/approvals")))
        .bearer_auth(&t)
        .json(&json!({"decisions": {pending["pending"][0]["call_id"].as_str().unwrap(): {"decision": "deny", "message": "not in the fork"}}}))
        .send()
        .await
        .unwrap();
    let (_, src_pending) = send(s.get(&format!("/v1/sessions/{src}/approvals"), &t))
        .await
        .unwrap();
    let src_call = src_pending["pending"][0]["call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = send(s.post(
        &format!("/v1/sessions/{src}/approvals"),
        &t,
        &json!({"decisions": {src_call: {"decision": "approve"}}}),
    ))
    .await
    .unwrap();
    assert_eq!(status, 200);
    events.until_type("turn_ended").await.unwrap();
    let (status, history) = send(s.get(&format!("/v1/sessions/{src}/history"), &t))
        .await
        .unwrap();
    assert_eq!(status, 200);
    let points = history["points"].as_array().unwrap();
    let kinds: Vec<&str> = points.iter().map(|p| p["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["tool_result", "turn_ended"], "{history}");

    // Forked at the result: the fork goes on to the next step by itself.
    let seq = points[0]["seq"].as_u64().unwrap();
    let (status, at_result) =
        send(s.post(&format!("/v1/sessions/{src}/fork"), &t, &json!({"at": seq})))
            .await
            .unwrap();
    assert_eq!(status, 201, "{at_result}");
    assert_eq!(at_result["forked_from"]["at"], seq);
    let fork2 = at_result["id"].as_str().unwrap().to_owned();
    let mut fe = Sse::open(s, &t, &fork2, None).await.unwrap();
    fe.until_type("turn_ended").await.unwrap();
    let f = session(s, &t, &fork2).await;
    let texts: Vec<&str> = f["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["role"] == "assistant")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["writing", "wrote it"]);
    let src_after = session(s, &t, &src).await;
    assert_eq!(
        src_after["transcript"].as_array().unwrap().len(),
        f["transcript"].as_array().unwrap().len(),
        "the source is as it was"
    );
    assert!(src_after.get("forked_from").is_none());
}

// ---- the CLI as a process ---------------------------------------------------------

fn overseer(cwd: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_overseer"));
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .env_remove("RUST_LOG");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OVERSEER_") {
            cmd.env_remove(key);
        }
    }
    let out = cmd.output().expect("run overseer");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn config(dir: &Path, skills: &Path) -> PathBuf {
    let scenario = dir.join("scenario.json");
    std::fs::write(
        &scenario,
        json!({"name": "cli", "agents": {"assistant": [
            {"text": "{\"severity\": \"sev3\", \"owner\": \"web\", \"next_step\": \"reproduce\"}"}
        ]}})
        .to_string(),
    )
    .unwrap();
    let file = dir.join("overseer.toml");
    let examples_tasks = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tasks");
    std::fs::write(
        &file,
        format!(
            "tasks_dir = {:?}\nskills_dirs = [{:?}]\n\n[store]\ndata_dir = {:?}\ndurability = \"os\"\n\n[provider]\nkind = \"scripted\"\nscenario = {:?}\n\n[[agents]]\nname = \"assistant\"\nskills = [\"*\"]\ntasks = [\"*\"]\n",
            examples_tasks.display().to_string(),
            skills.display().to_string(),
            dir.join("data").display().to_string(),
            scenario.display().to_string()
        ),
    )
    .unwrap();
    file
}

#[test]
fn a_malformed_skill_md_stops_start_up_naming_the_file_and_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let skills = tmp.path().join("skills");
    // The examples, plus one whose name is not its folder's.
    for entry in std::fs::read_dir(examples()).unwrap() {
        let from = entry.unwrap().path();
        let to = skills.join(from.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        std::fs::copy(from.join("SKILL.md"), to.join("SKILL.md")).unwrap();
    }
    let bad = skills.join("bad-skill");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("SKILL.md"),
        "---\nname: Bad_Skill\ndescription: broken\n---\nbody\n",
    )
    .unwrap();
    let file = config(tmp.path(), &skills);
    let (code, _, stderr) = overseer(
        tmp.path(),
        &[
            "run",
            "--config",
            file.to_str().unwrap(),
            "--approve",
            "auto",
            "hello",
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("bad-skill/SKILL.md"), "{stderr}");
    assert!(stderr.contains(": name: "), "{stderr}");
    assert!(
        stderr.lines().filter(|l| l.contains("error")).count() <= 1,
        "one line: {stderr}"
    );
    assert!(!tmp.path().join("data").exists(), "nothing was opened");
}

#[test]
fn run_task_runs_a_stored_task_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let file = config(tmp.path(), &examples());
    let (code, stdout, stderr) = overseer(
        tmp.path(),
        &[
            "run",
            "--config",
            file.to_str().unwrap(),
            "--approve",
            "auto",
            "--task",
            "triage",
            r#"{"ticket": {"title": "login fails"}}"#,
        ],
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("\"severity\": \"sev3\""), "{stdout}");
    // A context the task's schema refuses: the field is named.
    let (code, _, stderr) = overseer(
        tmp.path(),
        &[
            "run",
            "--config",
            file.to_str().unwrap(),
            "--approve",
            "auto",
            "--task",
            "triage",
            r#"{"ticket": {}}"#,
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("context.ticket"), "{stderr}");
    let (code, _, stderr) = overseer(
        tmp.path(),
        &["run", "--config", file.to_str().unwrap(), "--task", "nope"],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no task named 'nope'"), "{stderr}");
}
