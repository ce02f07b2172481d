//! The configuration of stored tasks and skills: `[[tasks]]`,
//! `tasks_dir` (one task per TOML file), `skills_dirs`, and an agent's
//! `tasks` and `skills` (names or `*` patterns).
//!
//! Owns their shapes, the checks that need no disk beyond the task files
//! (part of [`Config::validate`]), and [`Config::resolve_agent_skills`],
//! run once the skills are read: after it an agent's `skills` and `tasks`
//! hold exact names only. It deliberately parses no `SKILL.md` (that is
//! `crate::skills`'s) and runs nothing.

use std::path::PathBuf;

use serde::Deserialize;
use toml::{Table, Value};

use overseer_actors::skills::SkillCatalog;
use overseer_actors::tasks::TaskDef;

use super::agent_tools::{is_pattern, matches};
use super::{problem_for, read, syntax_error, Config, ConfigError, Problem};
use crate::skills::{check_name, SkillsDir};

/// One `[[tasks]]` table (or one file of `tasks_dir`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSection {
    /// Unique id (in a `tasks_dir` file: defaults to the file's name).
    #[serde(default)]
    pub id: Option<String>,
    /// What it does (shown to models that may run it, and in the API).
    pub description: String,
    /// The prompt a run starts with (its context follows).
    pub instructions: String,
    /// The agent that runs it.
    pub agent: String,
    /// Skills activated in a run before its first message.
    #[serde(default)]
    pub skills: Vec<String>,
    /// JSON Schema the answer must match (in place of the agent's).
    #[serde(default)]
    pub output_schema: Option<serde_json::Value>,
    /// JSON Schema of the `context` a run is given.
    #[serde(default)]
    pub input_schema: Option<serde_json::Value>,
}

/// One entry of `skills_dirs`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum SkillsDirEntry {
    /// A directory whose skills the model may activate.
    Path(PathBuf),
    /// A directory with its trust.
    Table(SkillsDirTable),
}

/// `{ path = "...", trusted = false }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillsDirTable {
    /// The directory.
    pub path: PathBuf,
    /// `false`: only a person may activate its skills. Default `true`.
    #[serde(default = "yes")]
    pub trusted: bool,
}

fn yes() -> bool {
    true
}

impl Config {
    /// The configured skill directories.
    pub fn skills_dirs(&self) -> Vec<SkillsDir> {
        self.skills_dirs
            .iter()
            .map(|e| match e {
                SkillsDirEntry::Path(path) => SkillsDir {
                    path: path.clone(),
                    trusted: true,
                },
                SkillsDirEntry::Table(t) => SkillsDir {
                    path: t.path.clone(),
                    trusted: t.trusted,
                },
            })
            .collect()
    }

    /// Every stored task as the runtime takes it.
    pub fn task_defs(&self) -> Vec<TaskDef> {
        self.tasks
            .iter()
            .map(|t| TaskDef {
                id: t.id.clone().unwrap_or_default(),
                description: t.description.clone(),
                instructions: t.instructions.clone(),
                agent: t.agent.clone(),
                skills: t.skills.clone(),
                output_schema: t.output_schema.clone(),
                input_schema: t.input_schema.clone(),
            })
            .collect()
    }

    /// Adds the tasks of `tasks_dir` (every `*.toml` file, in name order) to
    /// `tasks`. A file that is not a task is an error naming the file and
    /// the key.
    pub(super) fn load_tasks_dir(&mut self) -> Result<(), ConfigError> {
        let Some(dir) = self.tasks_dir.clone() else {
            return Ok(());
        };
        let entries = std::fs::read_dir(&dir).map_err(|source| ConfigError::Read {
            path: dir.clone(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        files.sort();
        for file in files {
            let origin = file.display().to_string();
            let text = read(&file)?;
            let table: Table =
                toml::from_str(&text).map_err(|e| syntax_error(&origin, &text, &e))?;
            let mut task = Value::Table(table.clone())
                .try_into::<TaskSection>()
                .map_err(|e| ConfigError::Invalid {
                    origin: origin.clone(),
                    problems: explain_task(&table, e.message()),
                })?;
            if task.id.is_none() {
                task.id = file.file_stem().map(|s| s.to_string_lossy().into_owned());
            }
            self.tasks.push(task);
        }
        Ok(())
    }

    /// The rules of `[[tasks]]`: ids present and unique, the agent
    /// configured, schemas usable, skill names well-formed.
    pub(super) fn task_problems(&self, out: &mut Vec<Problem>) {
        for (i, task) in self.tasks.iter().enumerate() {
            let at = |key: &str| format!("tasks[{i}].{key}");
            match task.id.as_deref() {
                None => out.push(Problem::new(at("id"), "required")),
                Some(id) if id.trim().is_empty() => {
                    out.push(Problem::new(at("id"), "must not be empty"))
                }
                Some(id) => {
                    if let Some(first) = self.tasks[..i]
                        .iter()
                        .position(|t| t.id.as_deref() == Some(id))
                    {
                        out.push(Problem::new(
                            at("id"),
                            format!("duplicate task id '{id}' (also tasks[{first}])"),
                        ));
                    }
                }
            }
            if task.instructions.trim().is_empty() {
                out.push(Problem::new(at("instructions"), "must not be empty"));
            }
            if task.description.trim().is_empty() {
                out.push(Problem::new(at("description"), "must not be empty"));
            }
            if !self.agents.iter().any(|a| a.name == task.agent) {
                out.push(Problem::new(
                    at("agent"),
                    format!("no agent named '{}'", task.agent),
                ));
            }
            for skill in &task.skills {
                if let Err(e) = check_name(skill) {
                    out.push(Problem::new(at("skills"), e));
                }
            }
            if let Some(schema) = &task.output_schema {
                if let Err(e) = overseer_actors::model::check_output_schema(schema) {
                    out.push(Problem::new(at("output_schema"), e));
                }
            }
            if let Some(schema) = &task.input_schema {
                if !(schema.is_object() || schema.is_boolean()) {
                    out.push(Problem::new(
                        at("input_schema"),
                        "must be a JSON Schema (an object)",
                    ));
                } else if let Err(e) = overseer_actors::schema::check(schema) {
                    out.push(Problem::new(at("input_schema"), e.to_string()));
                }
            }
        }
    }

    /// An agent's `tasks`: each id names a task, each pattern matches one.
    pub(super) fn agent_task_problems(&self, i: usize, out: &mut Vec<Problem>) {
        let Some(agent) = self.agents.get(i) else {
            return;
        };
        let ids: Vec<&str> = self.tasks.iter().filter_map(|t| t.id.as_deref()).collect();
        for entry in &agent.tasks {
            let found = if is_pattern(entry) {
                ids.iter().any(|id| matches(entry, id))
            } else {
                ids.contains(&entry.as_str())
            };
            if !found {
                out.push(Problem::new(
                    format!("agents[{i}].tasks"),
                    format!(
                        "agent '{}' lists '{entry}', which names no task (tasks: {})",
                        agent.name,
                        if ids.is_empty() {
                            "none".to_owned()
                        } else {
                            ids.join(", ")
                        }
                    ),
                ));
            }
        }
        for entry in &agent.skills {
            if !is_pattern(entry) {
                if let Err(e) = check_name(entry) {
                    out.push(Problem::new(format!("agents[{i}].skills"), e));
                }
            }
        }
    }

    /// Expands every agent's `skills` and `tasks` into exact names, now that
    /// the skills are read. A name of no skill, or a pattern matching none,
    /// is an error naming the agent.
    pub fn resolve_agent_skills(&mut self, skills: &SkillCatalog) -> Result<(), String> {
        let ids: Vec<String> = self.tasks.iter().filter_map(|t| t.id.clone()).collect();
        for agent in &mut self.agents {
            let mut names = Vec::new();
            for entry in &agent.skills {
                let found: Vec<String> = skills
                    .iter()
                    .filter(|s| {
                        if is_pattern(entry) {
                            matches(entry, &s.name)
                        } else {
                            &s.name == entry
                        }
                    })
                    .map(|s| s.name.clone())
                    .collect();
                if found.is_empty() {
                    return Err(format!(
                        "agent '{}': skills: '{entry}' names no skill of skills_dirs",
                        agent.name
                    ));
                }
                for n in found {
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
            agent.skills = names;
            let mut tasks = Vec::new();
            for entry in &agent.tasks {
                for id in ids.iter().filter(|id| {
                    if is_pattern(entry) {
                        matches(entry, id)
                    } else {
                        *id == entry
                    }
                }) {
                    if !tasks.contains(id) {
                        tasks.push(id.clone());
                    }
                }
            }
            agent.tasks = tasks;
        }
        Ok(())
    }
}

/// Which keys of a task file are wrong (each tried alone, like the main
/// file's tables).
fn explain_task(table: &Table, whole: &str) -> Vec<Problem> {
    let mut base = Table::new();
    for (k, v) in [("description", "_"), ("instructions", "_"), ("agent", "_")] {
        base.insert(k.into(), Value::String(v.into()));
    }
    let mut problems: Vec<Problem> = table
        .iter()
        .filter_map(|(k, v)| {
            let mut alone = base.clone();
            alone.insert(k.clone(), v.clone());
            Value::Table(alone)
                .try_into::<TaskSection>()
                .err()
                .map(|e| problem_for(k, e.message()))
        })
        .collect();
    for required in ["description", "instructions", "agent"] {
        if !table.contains_key(required) {
            problems.push(Problem::new(required, "required"));
        }
    }
    if problems.is_empty() {
        problems.push(problem_for("(document)", whole));
    }
    problems
}
