//! What a runtime offers sessions besides agents and tools: stored tasks
//! and skills, and how they enter a session's configuration.
//!
//! Owns the checks across them made at start (an agent's skills and tasks
//! exist, a task's agent and skills exist) and the system prompt's sections
//! listing what a session may use (skills by name and description only).
//! It deliberately reads no file: the edge parses the skill folders and task
//! files and hands in the result.

use std::sync::Arc;

use crate::model::{AgentConfig, EffectiveConfig};
use crate::skills::{with_section, SkillCatalog};
use crate::tasks::TaskCatalog;

/// Tasks and skills.
#[derive(Debug, Clone, Default)]
pub struct Library {
    /// Stored tasks.
    pub tasks: TaskCatalog,
    /// Skills.
    pub skills: Arc<SkillCatalog>,
}

impl Library {
    /// Tasks and skills together.
    pub fn new(tasks: TaskCatalog, skills: SkillCatalog) -> Self {
        Self {
            tasks,
            skills: Arc::new(skills),
        }
    }

    /// Every reference between agents, tasks and skills resolves; the
    /// error names the agent or task and what it names.
    pub fn check(&self, agents: &[AgentConfig]) -> Result<(), String> {
        for a in agents {
            for s in &a.skills {
                if self.skills.get(s).is_none() {
                    return Err(format!("agent '{}': skills: no skill named '{s}'", a.name));
                }
            }
            for t in &a.tasks {
                if self.tasks.get(t).is_none() {
                    return Err(format!("agent '{}': tasks: no task named '{t}'", a.name));
                }
            }
        }
        for t in self.tasks.iter() {
            if !agents.iter().any(|a| a.name == t.agent) {
                return Err(format!(
                    "task '{}': agent: no agent named '{}'",
                    t.id, t.agent
                ));
            }
            for s in &t.skills {
                if self.skills.get(s).is_none() {
                    return Err(format!("task '{}': skills: no skill named '{s}'", t.id));
                }
            }
        }
        Ok(())
    }

    /// Adds to `config`'s system prompt what it may use: its skills by name
    /// and description, its tasks by id and description. Called once, when
    /// a session's configuration is made (a root's, a child's, a task
    /// run's); the session keeps it as its instructions.
    pub fn describe(&self, config: &mut EffectiveConfig) {
        if let Some(tasks) = self.tasks.listing(&config.tasks) {
            config.instructions = with_section(&config.instructions, &tasks);
        }
        if let Some(skills) = self.skills.listing(&config.skills) {
            config.instructions = with_section(&config.instructions, &skills);
        }
    }
}
