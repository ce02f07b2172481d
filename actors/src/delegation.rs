//! Delegation: the built-in `delegate_task` tool's declaration and
//! arguments, and the shape of a child's result as its parent sees it.
//!
//! Owns the contract only. Running a delegation is the session actor's job: a
//! `delegate_task` call never reaches a tool-call actor; it spawns a child
//! session actor supervised by the parent's (see [`crate::session`]).

use serde::Deserialize;
use serde_json::{json, Value};

use crate::model::{SessionId, StopReason, Usage};
use crate::tool::{Tool, ToolContext, ToolError, ToolSpec};

pub(crate) use crate::model::DELEGATE_TASK;

/// Whether a call of the tool `name` runs as a child session rather than in
/// a tool-call actor: `delegate_task`, and `run_task` (a stored task,
/// run under the same rules).
pub(crate) fn spawns_child(name: &str) -> bool {
    name == DELEGATE_TASK || name == crate::tasks::RUN_TASK
}

/// Arguments of `delegate_task` (validated against [`schema`] first).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct DelegateArgs {
    /// Subagent to run.
    pub agent: String,
    /// The child's first message.
    pub goal: String,
    /// Extra context appended to the goal.
    #[serde(default)]
    pub context: Option<String>,
    /// A lower step limit for the child's turn.
    #[serde(default)]
    pub max_steps: Option<u32>,
}

impl DelegateArgs {
    /// The child's first user message: the goal, then the context.
    pub(crate) fn first_message(&self) -> String {
        match &self.context {
            Some(c) if !c.trim().is_empty() => format!("{}\n\nContext:\n{c}", self.goal),
            _ => self.goal.clone(),
        }
    }
}

/// The argument schema of `delegate_task`.
pub(crate) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "agent": {"type": "string", "description": "Name of the subagent to delegate to"},
            "goal": {"type": "string", "minLength": 1, "description": "What the subagent must achieve"},
            "context": {"type": "string", "description": "Background the subagent needs"},
            "max_steps": {"type": "integer", "minimum": 1, "description": "Step limit for the subagent's turn"}
        },
        "required": ["agent", "goal"],
        "additionalProperties": false
    })
}

/// The declaration registered in every runtime. Its `call` is never used.
pub(crate) struct DelegateTask {
    spec: ToolSpec,
}

impl Default for DelegateTask {
    fn default() -> Self {
        Self {
            spec: ToolSpec::new(
                DELEGATE_TASK,
                "Delegate a task to a subagent. It runs one turn with its own tools and returns its final answer.",
                schema(),
            )
            .with_timeout(86_400),
        }
    }
}

#[async_trait::async_trait]
impl Tool for DelegateTask {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: ToolContext, _arguments: Value) -> Result<Value, ToolError> {
        Err(ToolError::new(
            "delegate_task is run by the session runtime, not as a tool",
        ))
    }
}

/// What a parent's `delegate_task` call gets back from its child: the child's
/// final text, its structured output (when its agent has an output schema),
/// usage (of its whole subtree), session id and stop reason. A child that did
/// not end its turn normally is an error result.
pub(crate) fn child_result(
    child: SessionId,
    agent: &str,
    final_text: &str,
    output: Option<&Value>,
    stop: Option<StopReason>,
    usage: Usage,
    failure: Option<&str>,
) -> Result<Value, Value> {
    let mut body = json!({
        "session_id": child,
        "agent": agent,
        "final_text": final_text,
        "stop_reason": stop.map(|s| s.as_str()),
        "usage": usage,
    });
    if let (Some(output), Value::Object(m)) = (output, &mut body) {
        m.insert("output".into(), output.clone());
    }
    let ok = failure.is_none() && matches!(stop, Some(StopReason::EndTurn | StopReason::MaxSteps));
    if ok {
        return Ok(body);
    }
    let why = match (failure, stop) {
        (Some(f), _) => f.to_owned(),
        (None, Some(s)) => format!("stopped with {s}"),
        (None, None) => "stopped".to_owned(),
    };
    if let Value::Object(m) = &mut body {
        m.insert(
            "error".into(),
            Value::String(format!("subagent '{agent}' failed: {why}")),
        );
    }
    Err(body)
}
