//! The in-process API of stored tasks and skills: the catalog, a
//! person's run of a task (a root session), and a person's activation of a
//! skill in a session.
//!
//! A person may do what the model may not: activate a skill that needs
//! trust, and run a task whose skills do. The model's side (`run_task`,
//! `activate_skill`) is the session's.

use std::sync::Arc;

use serde_json::Value;

use super::{Extras, Overseer};
use crate::error::SessionError;
use crate::messages::SessionMsg;
use crate::model::SessionId;
use crate::skills::SkillCatalog;
use crate::tasks::{first_message, TaskDef};
use crate::CreateSession;

/// A person's run of a stored task.
#[derive(Debug, Clone, Default)]
pub struct TaskRun {
    /// The task's id.
    pub task: String,
    /// What this run is about (checked against the task's `input_schema`).
    pub context: Option<Value>,
    /// Owning tenant.
    pub tenant: String,
    /// Who runs it (a token's `sub`): recorded, and as who its skills were
    /// activated.
    pub created_by: Option<String>,
    /// Title (default: `task <id>`).
    pub title: Option<String>,
    /// Client-chosen session id.
    pub id: Option<SessionId>,
    /// Skills to activate besides the task's own (they become available to
    /// the session too).
    pub skills: Vec<String>,
    /// Complete the session when its turn ends.
    pub auto_complete: bool,
}

impl Overseer {
    /// Every stored task, by id.
    pub fn tasks(&self) -> impl Iterator<Item = &Arc<TaskDef>> {
        self.runtime.library.tasks.iter()
    }

    /// Every skill, by name.
    pub fn skills(&self) -> &SkillCatalog {
        &self.runtime.library.skills
    }

    /// Runs a stored task as a root session of its agent: the task's
    /// instructions and the context are its first message, the task's
    /// output schema its answer's, and the task's skills (and `run.skills`)
    /// are active from the start, activated by the person who runs it.
    pub async fn run_task(&self, run: TaskRun) -> Result<SessionId, SessionError> {
        let tasks = &self.runtime.library.tasks;
        let task = tasks
            .get(&run.task)
            .ok_or_else(|| SessionError::UnknownTask(run.task.clone()))?
            .clone();
        tasks
            .check_context(&task.id, run.context.as_ref())
            .map_err(|e| SessionError::InvalidContext {
                field: e.field,
                message: e.message,
            })?;
        let mut skills = task.skills.clone();
        for s in run.skills {
            if !skills.contains(&s) {
                skills.push(s);
            }
        }
        for s in &skills {
            if self.runtime.library.skills.get(s).is_none() {
                return Err(SessionError::Invalid(format!(
                    "skills: no skill named '{s}'"
                )));
            }
        }
        let req = CreateSession {
            agent: task.agent.clone(),
            tenant: run.tenant,
            created_by: run.created_by,
            prompt: Some(first_message(&task, run.context.as_ref())),
            title: Some(run.title.unwrap_or_else(|| format!("task {}", task.id))),
            id: run.id,
            auto_complete: run.auto_complete,
            ..CreateSession::default()
        };
        let extras = Extras {
            task: Some(task.id.clone()),
            output_schema: task.output_schema.clone(),
            skills,
        };
        self.create_session_with(req, extras).await
    }

    /// Creates a session like [`Overseer::create_session`] with `skills`
    /// activated (by its creator, a person) before its first message; they
    /// become available to it even where its agent does not list them.
    pub async fn create_session_with_skills(
        &self,
        req: CreateSession,
        skills: Vec<String>,
    ) -> Result<SessionId, SessionError> {
        for s in &skills {
            if self.runtime.library.skills.get(s).is_none() {
                return Err(SessionError::Invalid(format!(
                    "skills: no skill named '{s}'"
                )));
            }
        }
        let extras = Extras {
            skills,
            ..Extras::default()
        };
        self.create_session_with(req, extras).await
    }

    /// A person activates skill `name` in session `id`: its body joins the
    /// conversation, trust or not. The skill must be one the session may
    /// use; a second activation is a conflict ("already active").
    pub async fn activate_skill(
        &self,
        id: SessionId,
        name: &str,
        by: Option<String>,
    ) -> Result<(), SessionError> {
        let skill = self
            .runtime
            .library
            .skills
            .get(name)
            .ok_or_else(|| SessionError::Invalid(format!("name: no skill named '{name}'")))?;
        let args = (skill.name.clone(), skill.body.clone(), by);
        self.runtime
            .route(id, move |reply| {
                SessionMsg::ActivateSkill(args.clone(), reply)
            })
            .await
    }
}
