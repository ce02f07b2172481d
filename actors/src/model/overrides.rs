//! Per-session overrides of an agent's preset (the `instructions`, `tools`,
//! `model`, `max_steps`, `approval_timeout_secs`, `budget` and `output_schema` of a create
//! request) and the one rule they obey: an override may only narrow what the
//! agent allows.
//!
//! Owns validation and the merge into an [`EffectiveConfig`]. It deliberately
//! does not check that a model route exists: routes are the edge's.

use super::{AgentConfig, Budget, EffectiveConfig};

/// An override that asks for more than the agent allows, or is malformed:
/// the message names the field. Nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OverrideError(pub String);

/// Per-session changes to an agent's preset. Each may only narrow what the
/// agent allows: tools a subset, limits lower.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionOverrides {
    /// Appended to the agent's instructions, on a new line.
    #[serde(default)]
    pub instructions: Option<String>,
    /// Tools in scope: a subset of the agent's.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Model route (the edge checks it names a configured route).
    #[serde(default)]
    pub model: Option<String>,
    /// A lower step limit per turn.
    #[serde(default)]
    pub max_steps: Option<u32>,
    /// A shorter approval timeout.
    #[serde(default)]
    pub approval_timeout_secs: Option<u64>,
    /// Tighter spending limits.
    #[serde(default)]
    pub budget: Option<Budget>,
    /// A JSON Schema the session's answers must match, in place of the
    /// agent's (a shape of the answer, not a permission, so it replaces
    /// rather than narrows).
    #[serde(default)]
    pub output_schema: Option<serde_json::Value>,
}

/// Whether `schema` is a JSON Schema answers can be checked against (an
/// object or a boolean the validator compiles, within the bounds of
/// [`crate::schema`]); the error says why not.
pub fn check_output_schema(schema: &serde_json::Value) -> Result<(), String> {
    crate::schema::check_output(schema).map_err(|e| e.to_string())
}

impl SessionOverrides {
    /// The effective configuration of a session of `agent` with these
    /// overrides, or an error naming the field that asks for more than the
    /// agent allows.
    pub fn apply(&self, agent: &AgentConfig) -> Result<EffectiveConfig, OverrideError> {
        let mut cfg = agent.effective();
        if let Some(extra) = &self.instructions {
            if cfg.instructions.is_empty() {
                cfg.instructions.clone_from(extra);
            } else {
                cfg.instructions = format!("{}\n{extra}", cfg.instructions);
            }
        }
        if let Some(tools) = &self.tools {
            let wider: Vec<&str> = tools
                .iter()
                .filter(|t| !cfg.tools.contains(t))
                .map(String::as_str)
                .collect();
            if !wider.is_empty() {
                return Err(OverrideError(format!(
                    "tools: not available to agent '{}': {}",
                    agent.name,
                    wider.join(", ")
                )));
            }
            cfg.tools.clone_from(tools);
        }
        if let Some(model) = &self.model {
            cfg.model.clone_from(model);
        }
        if let Some(n) = self.max_steps {
            if n == 0 || n > cfg.max_steps {
                return Err(OverrideError(format!(
                    "max_steps: must be between 1 and the agent's {}",
                    cfg.max_steps
                )));
            }
            cfg.max_steps = n;
        }
        if let Some(n) = self.approval_timeout_secs {
            if n == 0 || n > cfg.approval_timeout_secs {
                return Err(OverrideError(format!(
                    "approval_timeout_secs: must be between 1 and the agent's {}",
                    cfg.approval_timeout_secs
                )));
            }
            cfg.approval_timeout_secs = n;
        }
        if let Some(b) = self.budget {
            let check = |field: &str, asked: Option<u64>, limit: Option<u64>| match (asked, limit) {
                (Some(a), Some(l)) if a > l => Err(OverrideError(format!(
                    "budget.{field}: {a} exceeds the agent's limit {l}"
                ))),
                _ => Ok(()),
            };
            let a = cfg.budget;
            check("max_tokens", b.max_tokens, a.max_tokens)?;
            check("max_tool_calls", b.max_tool_calls, a.max_tool_calls)?;
            check("max_steps", b.max_steps, a.max_steps)?;
            check(
                "max_wall_clock_secs",
                b.max_wall_clock_secs,
                a.max_wall_clock_secs,
            )?;
            cfg.budget = a.min(b);
        }
        if let Some(schema) = &self.output_schema {
            check_output_schema(schema)
                .map_err(|e| OverrideError(format!("output_schema: {e}")))?;
            cfg.output_schema = Some(schema.clone());
        }
        Ok(cfg)
    }
}
