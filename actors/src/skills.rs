//! Agent Skills: the skills a runtime knows, what a session's prompt
//! says of them, and the built-in tools that reach them.
//!
//! A skill is a folder in the open Agent Skills format: `SKILL.md` with YAML
//! front matter (`name`, `description`, optional `license`,
//! `allowed-tools`, `metadata`, `compatibility`, and anything else kept as
//! written) and a Markdown body, plus optional `scripts/`, `references/`
//! and `assets/`. Disclosure is progressive: a session's system prompt lists
//! the skills it may use by name and description only ([`SkillCatalog::listing`]);
//! `activate_skill` loads a body into the session (a `skill_activated`
//! transcript entry, see `machine::skills`); `read_skill_resource` reads one
//! of the skill's files.
//!
//! This module owns the catalog as data, the listing, the activation text
//! the model reads, and `activate_skill` (which answers from memory). It
//! deliberately reads no file: parsing `SKILL.md` and reading resources are
//! the edge's (`overseer::skills`, `overseer::tools::skills`), and nothing
//! here or there ever runs a skill's scripts: running them is a tool's
//! business, under approval.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::tool::{Tool, ToolContext, ToolError, ToolSpec};

pub use crate::model::{activation_text, ACTIVATE_SKILL, READ_SKILL_RESOURCE};

/// The `status` of an `activate_skill` result that loaded the body; the
/// session moves the body out of the result into a `skill_activated` entry.
pub const ACTIVATED: &str = "activated";

/// The `status` of an `activate_skill` result for a skill already active.
pub const ALREADY_ACTIVE: &str = "already active";

/// One skill, as parsed from its folder.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skill {
    /// Lower-case letters, digits and hyphens, at most 64; its folder's name.
    pub name: String,
    /// What it does and when to use it (at most 1,024 characters).
    pub description: String,
    /// The Markdown body of `SKILL.md`: the instructions activation loads.
    #[serde(skip)]
    pub body: String,
    /// The skill's folder (its resources are read under it, never outside).
    pub dir: PathBuf,
    /// Only a person may activate it (`metadata.requires-trust: true`, or a
    /// skills directory configured `trusted = false`).
    pub requires_trust: bool,
    /// The front matter as written, every field kept (unknown ones too).
    pub front_matter: Map<String, Value>,
}

/// Every skill of the runtime, by name.
#[derive(Debug, Clone, Default)]
pub struct SkillCatalog {
    skills: BTreeMap<String, Arc<Skill>>,
}

impl SkillCatalog {
    /// A catalog of `skills`; two skills of one name are refused, naming
    /// both folders.
    pub fn new(skills: Vec<Skill>) -> Result<Self, String> {
        let mut map: BTreeMap<String, Arc<Skill>> = BTreeMap::new();
        for skill in skills {
            if let Some(first) = map.get(&skill.name) {
                return Err(format!(
                    "skill '{}' is defined twice: in {} and in {}",
                    skill.name,
                    first.dir.display(),
                    skill.dir.display()
                ));
            }
            map.insert(skill.name.clone(), Arc::new(skill));
        }
        Ok(Self { skills: map })
    }

    /// The skill named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Skill>> {
        self.skills.get(name)
    }

    /// Every skill, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Skill>> {
        self.skills.values()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// What a session's system prompt says of the skills `names`: each by
    /// name and description only (its body is loaded on activation). `None`
    /// when none of them exists.
    pub fn listing(&self, names: &[String]) -> Option<String> {
        let lines: Vec<String> = names
            .iter()
            .filter_map(|n| self.get(n))
            .map(|s| {
                let trust = if s.requires_trust {
                    " (only a person can activate it: ask the user)"
                } else {
                    ""
                };
                format!("- {}: {}{trust}", s.name, one_line(&s.description))
            })
            .collect();
        if lines.is_empty() {
            return None;
        }
        Some(format!(
            "## Skills\nSkills hold instructions for particular jobs. When the job at hand matches \
a skill's description, call `{ACTIVATE_SKILL}` with its name: its instructions then join the \
conversation. Read a file an active skill points at with `{READ_SKILL_RESOURCE}`.\n{}",
            lines.join("\n")
        ))
    }
}

/// A description on one line (the listing is one line per skill).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `instructions` + `extra` as one system prompt (a blank line between).
pub fn with_section(instructions: &str, extra: &str) -> String {
    if instructions.trim().is_empty() {
        extra.to_owned()
    } else {
        format!("{instructions}\n\n{extra}")
    }
}

/// The answer to a model that tries to activate a skill only a person may.
pub fn trust_refusal(name: &str) -> Value {
    json!({"error": format!(
        "skill '{name}' needs a person's trust: only a person can activate it. Ask the user to \
    activate it (in the API: POST /v1/sessions/<id>/skills, on the command line: overseer run --skill \
    {name}, or the editor's /skill command), then wait for them; do not try to do its job without it."
    )})
}

/// The argument schema of `activate_skill`.
pub fn activate_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "Name of the skill to activate, as listed"}
        },
        "required": ["name"],
        "additionalProperties": false
    })
}

/// The argument schema of `read_skill_resource`.
pub fn read_resource_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "Name of an active skill"},
            "path": {"type": "string", "minLength": 1, "description": "Path of the file inside the skill's folder, e.g. references/forms.md"}
        },
        "required": ["name", "path"],
        "additionalProperties": false
    })
}

/// `activate_skill`: answers with the skill's body from the catalog (the
/// session records it as a `skill_activated` entry), or refuses a skill
/// that needs a person's trust. Whether the session may use the skill, and
/// whether it is already active, the session decides before the call runs.
pub struct ActivateSkill {
    spec: ToolSpec,
    catalog: Arc<SkillCatalog>,
}

impl ActivateSkill {
    /// The tool over `catalog`.
    pub fn new(catalog: Arc<SkillCatalog>) -> Self {
        Self {
            spec: ToolSpec::new(
                ACTIVATE_SKILL,
                "Activate one of the skills listed in your instructions: its instructions join the conversation.",
                activate_schema(),
            )
            .idempotent(true),
            catalog,
        }
    }
}

#[async_trait::async_trait]
impl Tool for ActivateSkill {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: ToolContext, arguments: Value) -> Result<Value, ToolError> {
        let name = arguments
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Some(skill) = self.catalog.get(name) else {
            return Err(ToolError::new(format!("no skill named '{name}'")));
        };
        if skill.requires_trust {
            let refusal = trust_refusal(name);
            let message = refusal
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("needs a person's trust")
                .to_owned();
            return Err(ToolError::new(message));
        }
        Ok(json!({"skill": skill.name, "status": ACTIVATED, "instructions": skill.body}))
    }
}
