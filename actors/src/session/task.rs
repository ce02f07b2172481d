//! The session actor's side of `run_task`: a stored task runs as a
//! child session under the rules of a delegation, so everything
//! `delegate.rs` does for a child (resume, restart, reports, cancel) holds
//! for it. This module only makes the child: the task's agent, its
//! instructions and context as the first message, its output schema, and
//! its skills activated first.
//!
//! It refuses, with an error result the model reads, a task that does not
//! exist, a context its `input_schema` refuses (naming the field), and a
//! task needing a skill the parent may not use or one only a person may
//! activate.

use ractor::ActorRef;

use super::delegate::{build_child, ChildPlan, RunningCall};
use super::{SessionMsg, SessionState};
use crate::error::SessionError;
use crate::machine::Session;
use crate::model::{Budget, SessionHeader, SessionId, ToolCallId};
use crate::runtime::Runtime;
use crate::tasks::{first_message, RunTaskArgs};

/// A new child session running `args.task`.
fn new_task_child(
    runtime: &Runtime,
    parent: &SessionHeader,
    call: &RunningCall,
    child: SessionId,
    args: &RunTaskArgs,
    grant: Budget,
) -> Result<Session, SessionError> {
    let tasks = &runtime.library.tasks;
    let task = tasks
        .get(&args.task)
        .ok_or_else(|| SessionError::UnknownTask(args.task.clone()))?;
    tasks
        .check_context(&task.id, args.context.as_ref())
        .map_err(|e| SessionError::InvalidContext {
            field: e.field,
            message: e.message,
        })?;
    for name in &task.skills {
        if !parent.config.skills.iter().any(|s| s == name) {
            return Err(SessionError::Invalid(format!(
                "it needs skill '{name}', which this session may not use"
            )));
        }
        if runtime
            .library
            .skills
            .get(name)
            .is_some_and(|s| s.requires_trust)
        {
            return Err(SessionError::Invalid(format!(
                "it needs skill '{name}', which only a person can activate: ask the user to run \
the task themselves (POST /v1/tasks/{id}/runs, or overseer run --task {id})",
                id = task.id
            )));
        }
    }
    let plan = ChildPlan {
        agent: task.agent.clone(),
        message: first_message(task, args.context.as_ref()),
        max_steps: None,
        output_schema: task.output_schema.clone(),
        task: Some(task.id.clone()),
        skills: task.skills.clone(),
    };
    build_child(
        runtime,
        parent,
        &call.call_id,
        call.attempt,
        child,
        plan,
        grant,
    )
}

impl SessionState {
    /// Starts the child of a `run_task` call, or resumes it from its
    /// checkpoint, or (if it already finished) reports its result at once.
    pub(super) async fn run_task(
        &mut self,
        myself: &ActorRef<SessionMsg>,
        call_id: ToolCallId,
        attempt: u32,
        child: SessionId,
        args: RunTaskArgs,
        grant: Budget,
    ) {
        if self.live_child(child).is_some() {
            return;
        }
        let agent = self
            .runtime
            .library
            .tasks
            .get(&args.task)
            .map_or_else(|| "subagent".to_owned(), |t| t.agent.clone());
        let call = RunningCall {
            call_id,
            attempt,
            agent,
            task: Some(args.task.clone()),
        };
        self.start_child(myself, call, child, |runtime, parent, call| {
            new_task_child(runtime, parent, call, child, &args, grant)
        })
        .await
    }
}
