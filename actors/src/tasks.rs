//! Stored tasks: repeatable jobs kept as configuration (`[[tasks]]`,
//! `tasks_dir`), each with its instructions, the agent that runs it, the
//! skills it needs, an optional JSON Schema of its `context` and of its
//! answer.
//!
//! A task runs either as a child of a session whose agent lists it (the
//! built-in `run_task`, under delegation's rules) or as a root session
//! a person starts (`Overseer::run_task`; the API's `POST
//! /v1/tasks/{id}/runs`, `overseer run --task`, an editor's command).
//!
//! This module owns the task's data, the checks of a context against its
//! schema (errors name the field), the first message a run gets, and
//! `run_task`'s declaration. It deliberately runs nothing: the session actor
//! starts the child (`session::task`), the machine decides which calls are
//! allowed.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::tool::{Tool, ToolContext, ToolError, ToolSpec};

pub use crate::model::RUN_TASK;

/// One stored task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskDef {
    /// Unique id (what `run_task` and the API name it by).
    pub id: String,
    /// What it does (shown to models that may run it, and in the API).
    pub description: String,
    /// The prompt a run starts with (its context follows).
    pub instructions: String,
    /// The agent that runs it.
    pub agent: String,
    /// Skills activated in a run before its first message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
    /// JSON Schema the run's answer must match (in place of the agent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// JSON Schema of the `context` a run is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
}

/// A context that does not match its task's `input_schema`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ContextError {
    /// The field, as `context` or `context.a.b` (`context.items[2]`).
    pub field: String,
    /// What is wrong with it (every problem, joined).
    pub message: String,
}

struct Entry {
    task: Arc<TaskDef>,
    input: Option<jsonschema::Validator>,
}

/// Every task of the runtime, by id, with compiled context schemas.
#[derive(Clone, Default)]
pub struct TaskCatalog {
    tasks: Arc<BTreeMap<String, Entry>>,
}

impl std::fmt::Debug for TaskCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tasks.keys()).finish()
    }
}

impl TaskCatalog {
    /// A catalog of `tasks`: ids unique, schemas valid (the error names the
    /// task and the key).
    pub fn new(tasks: Vec<TaskDef>) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for task in tasks {
            if let Some(schema) = &task.output_schema {
                crate::model::check_output_schema(schema)
                    .map_err(|e| format!("task '{}': output_schema: {e}", task.id))?;
            }
            let input = match &task.input_schema {
                Some(schema) => Some(
                    // Bounded like every user schema (depth, size, patterns).
                    crate::schema::compile(schema)
                        .map_err(|e| format!("task '{}': input_schema: {e}", task.id))?,
                ),
                None => None,
            };
            let id = task.id.clone();
            let entry = Entry {
                task: Arc::new(task),
                input,
            };
            if map.insert(id.clone(), entry).is_some() {
                return Err(format!("task '{id}' is defined twice"));
            }
        }
        Ok(Self {
            tasks: Arc::new(map),
        })
    }

    /// The task `id`.
    pub fn get(&self, id: &str) -> Option<&Arc<TaskDef>> {
        self.tasks.get(id).map(|e| &e.task)
    }

    /// Every task, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<TaskDef>> {
        self.tasks.values().map(|e| &e.task)
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Checks a run's `context` against the task's `input_schema` (no schema:
    /// anything, or nothing, goes). The error names the first failing field.
    pub fn check_context(&self, id: &str, context: Option<&Value>) -> Result<(), ContextError> {
        let Some(validator) = self.tasks.get(id).and_then(|e| e.input.as_ref()) else {
            return Ok(());
        };
        let value = context.cloned().unwrap_or(Value::Null);
        let mut errors = validator.iter_errors(&value).peekable();
        let Some(first) = errors.peek() else {
            return Ok(());
        };
        let field = field_name(&first.instance_path().to_string());
        let message = if context.is_none() {
            "required by the task's input_schema, and missing".to_owned()
        } else {
            errors.map(|e| e.to_string()).collect::<Vec<_>>().join("; ")
        };
        Err(ContextError { field, message })
    }

    /// What a session's system prompt says of the tasks `ids` it may run:
    /// each by id and description. `None` when none of them exists.
    pub fn listing(&self, ids: &[String]) -> Option<String> {
        let lines: Vec<String> = ids
            .iter()
            .filter_map(|id| self.tasks.get(id))
            .map(|e| {
                let t = &e.task;
                let description = t.description.split_whitespace().collect::<Vec<_>>();
                let context = match &t.input_schema {
                    Some(schema) => format!(" (context: JSON matching {schema})"),
                    None => String::new(),
                };
                format!("- {}: {}{context}", t.id, description.join(" "))
            })
            .collect();
        if lines.is_empty() {
            return None;
        }
        Some(format!(
            "## Tasks\nStored tasks you can run with `{RUN_TASK}`; each runs as a subagent and \
returns its answer.\n{}",
            lines.join("\n")
        ))
    }
}

/// `/a/0/b` → `context.a[0].b`.
fn field_name(pointer: &str) -> String {
    let mut out = String::from("context");
    for part in pointer.split('/').skip(1) {
        let part = part.replace("~1", "/").replace("~0", "~");
        if part.parse::<usize>().is_ok() {
            out.push_str(&format!("[{part}]"));
        } else {
            out.push('.');
            out.push_str(&part);
        }
    }
    out
}

/// The first message of a run of `task` with `context`: the task's
/// instructions, then the context (text as it is, anything else as JSON).
pub fn first_message(task: &TaskDef, context: Option<&Value>) -> String {
    let context = match context {
        None | Some(Value::Null) => return task.instructions.clone(),
        Some(Value::String(s)) if s.trim().is_empty() => return task.instructions.clone(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => serde_json::to_string_pretty(other).unwrap_or_else(|_| other.to_string()),
    };
    format!("{}\n\nContext:\n{context}", task.instructions)
}

/// Arguments of `run_task`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RunTaskArgs {
    /// The task's id.
    pub task: String,
    /// Its context (checked against the task's `input_schema`).
    #[serde(default)]
    pub context: Option<Value>,
}

/// The argument schema of `run_task`.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "task": {"type": "string", "minLength": 1, "description": "Id of the stored task to run, as listed"},
            "context": {"description": "What this run is about: JSON matching the task's context schema, or text"}
        },
        "required": ["task"],
        "additionalProperties": false
    })
}

/// The declaration registered in every runtime. Its `call` is never used:
/// the session runs a task as a child session.
pub struct RunTask {
    spec: ToolSpec,
}

impl Default for RunTask {
    fn default() -> Self {
        Self {
            spec: ToolSpec::new(
                RUN_TASK,
                "Run one of the stored tasks listed in your instructions as a subagent; returns its answer.",
                schema(),
            )
            .with_timeout(86_400),
        }
    }
}

#[async_trait::async_trait]
impl Tool for RunTask {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: ToolContext, _arguments: Value) -> Result<Value, ToolError> {
        Err(ToolError::new(
            "run_task is run by the session runtime, not as a tool",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(input: Option<Value>) -> TaskDef {
        TaskDef {
            id: "triage".into(),
            description: "Triage a ticket".into(),
            instructions: "Triage it.".into(),
            agent: "ops".into(),
            skills: vec![],
            output_schema: None,
            input_schema: input,
        }
    }

    #[test]
    fn a_context_is_checked_and_the_error_names_the_field() {
        let schema = json!({"type": "object", "properties": {"ticket": {"type": "object",
            "properties": {"id": {"type": "integer"}}, "required": ["id"]}}, "required": ["ticket"]});
        let tasks = TaskCatalog::new(vec![task(Some(schema))]).unwrap();
        assert!(tasks
            .check_context("triage", Some(&json!({"ticket": {"id": 4}})))
            .is_ok());
        let e = tasks
            .check_context("triage", Some(&json!({"ticket": {"id": "four"}})))
            .unwrap_err();
        assert_eq!(e.field, "context.ticket.id", "{e}");
        let e = tasks.check_context("triage", None).unwrap_err();
        assert_eq!(e.field, "context");
        let e = tasks
            .check_context("triage", Some(&json!({"other": 1})))
            .unwrap_err();
        assert!(e.to_string().contains("ticket"), "{e}");
    }

    #[test]
    fn the_first_message_carries_the_context() {
        let t = task(None);
        assert_eq!(first_message(&t, None), "Triage it.");
        assert_eq!(
            first_message(&t, Some(&json!("the printer"))),
            "Triage it.\n\nContext:\nthe printer"
        );
        assert!(first_message(&t, Some(&json!({"a": 1}))).contains("\"a\": 1"));
    }
}
