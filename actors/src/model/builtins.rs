//! The names of the built-in tools an agent's configuration switches on
//! (`delegate_task` with subagents, `run_task` with tasks, the skill tools
//! with skills), and how an activated skill reads to the model. They are
//! model data: the configuration ([`super::AgentConfig::effective`]) and the
//! transcript need them, and the modules that implement the tools
//! (`crate::delegation`, `crate::tasks`, `crate::skills`) re-export them, so
//! the model imports none of those.

/// Name of the built-in that delegates to a subagent.
pub const DELEGATE_TASK: &str = "delegate_task";

/// Name of the built-in that runs a stored task.
pub const RUN_TASK: &str = "run_task";

/// Name of the built-in that loads a skill's body into the session.
pub const ACTIVATE_SKILL: &str = "activate_skill";

/// Name of the built-in that reads a file of an active skill.
pub const READ_SKILL_RESOURCE: &str = "read_skill_resource";

/// What the model reads of an activated skill: a message of its own, placed
/// after the step it was activated in.
pub fn activation_text(name: &str, body: &str) -> String {
    format!("[Skill \"{name}\" is active. Its instructions follow.]\n\n{body}")
}
