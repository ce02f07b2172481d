//! Slash commands of the ACP agent: the editor learns them from an
//! `available_commands_update` when a session opens, and the person types
//! them as a prompt.
//!
//! - `/skill NAME` activates one of the session's skills, as a person
//!   (a skill that needs trust is allowed), and answers at once: no model
//!   turn.
//! - `/TASK [CONTEXT]`, for each stored task of the session's agent, runs
//!   the task in the session: its skills are activated (as a person), its
//!   context is checked against its input schema, and its instructions
//!   with the context are the turn's message. (A task of another agent
//!   cannot run in this session: it is not offered.)
//!
//! This module owns the commands' names and parsing and what each becomes;
//! where the skills and tasks come from (this process or a server) is
//! [`Sessions`]'s.

use agent_client_protocol::v1::schema::{
    AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate, SessionUpdate,
    UnstructuredCommandInput,
};
use serde_json::Value;

use overseer_actors::tasks::{first_message, TaskCatalog, TaskDef};

/// The command that activates a skill.
pub(crate) const SKILL: &str = "skill";

/// What the session's agent may use: its tasks and its skills (name,
/// description).
#[derive(Debug, Clone, Default)]
pub(crate) struct Offer {
    pub(crate) tasks: Vec<TaskDef>,
    pub(crate) skills: Vec<(String, String)>,
}

/// A prompt that is a command.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Command {
    /// `/skill NAME`.
    Skill(String),
    /// `/TASK CONTEXT`: the turn's message, and the task's skills.
    Task {
        /// The message.
        message: String,
        /// Skills to activate first.
        skills: Vec<String>,
    },
}

impl Offer {
    /// The `available_commands_update` of a session with this offer.
    pub(crate) fn update(&self) -> SessionUpdate {
        let mut commands: Vec<AvailableCommand> = self
            .tasks
            .iter()
            .map(|t| {
                AvailableCommand::new(t.id.clone(), format!("Run the task: {}", t.description))
                    .input(AvailableCommandInput::Unstructured(
                        UnstructuredCommandInput::new(match &t.input_schema {
                            Some(_) => "context as JSON",
                            None => "context (text)",
                        }),
                    ))
            })
            .collect();
        if !self.skills.is_empty() {
            let names: Vec<&str> = self.skills.iter().map(|(n, _)| n.as_str()).collect();
            commands.push(
                AvailableCommand::new(SKILL, format!("Activate a skill: {}", names.join(", ")))
                    .input(AvailableCommandInput::Unstructured(
                        UnstructuredCommandInput::new("skill name"),
                    )),
            );
        }
        SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(commands))
    }

    /// What `text` asks for, if it is one of the offered commands; an
    /// error names what is wrong with a command's input.
    pub(crate) fn parse(&self, text: &str) -> Result<Option<Command>, String> {
        let Some(rest) = text.trim_start().strip_prefix('/') else {
            return Ok(None);
        };
        let (name, input) = rest
            .split_once(char::is_whitespace)
            .map_or((rest, ""), |(n, i)| (n, i.trim()));
        if name == SKILL && !self.skills.is_empty() {
            if input.is_empty() {
                return Err("/skill: name the skill to activate".to_owned());
            }
            return Ok(Some(Command::Skill(input.to_owned())));
        }
        let Some(task) = self.tasks.iter().find(|t| t.id == name) else {
            return Ok(None);
        };
        let context = (!input.is_empty()).then(|| {
            serde_json::from_str::<Value>(input).unwrap_or_else(|_| Value::String(input.to_owned()))
        });
        let catalog = TaskCatalog::new(vec![task.clone()]).map_err(|e| format!("/{name}: {e}"))?;
        catalog
            .check_context(&task.id, context.as_ref())
            .map_err(|e| format!("/{name}: {e}"))?;
        Ok(Some(Command::Task {
            message: first_message(task, context.as_ref()),
            skills: task.skills.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn offer() -> Offer {
        Offer {
            tasks: vec![TaskDef {
                id: "triage".into(),
                description: "Triage".into(),
                instructions: "Triage it.".into(),
                agent: "a".into(),
                skills: vec!["notes".into()],
                output_schema: None,
                input_schema: Some(json!({"type": "object", "required": ["ticket"]})),
            }],
            skills: vec![("notes".into(), "Notes".into())],
        }
    }

    #[test]
    fn commands_parse_and_check_their_input() {
        let o = offer();
        assert_eq!(o.parse("hello").unwrap(), None);
        assert_eq!(o.parse("/unknown x").unwrap(), None);
        assert_eq!(
            o.parse("/skill notes").unwrap(),
            Some(Command::Skill("notes".into()))
        );
        assert!(o.parse("/skill").is_err());
        match o.parse("/triage {\"ticket\": 3}").unwrap() {
            Some(Command::Task { message, skills }) => {
                assert!(message.starts_with("Triage it.") && message.contains("\"ticket\": 3"));
                assert_eq!(skills, ["notes"]);
            }
            other => panic!("{other:?}"),
        }
        let e = o.parse("/triage {}").unwrap_err();
        assert!(e.contains("context"), "{e}");
    }
}
