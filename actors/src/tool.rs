//! The tool port: what a tool declares, how it is called, and the
//! registry that validates arguments against each tool's JSON Schema.
//!
//! This module owns the contract every tool kind shares. It deliberately
//! implements no tool that touches the network or disk: built-ins such as
//! `current_time`, `http` tools and MCP servers are implemented in the
//! `overseer` crate (`src/tools/`). Running a call (timeout, size cap, crash
//! isolation) is the job of [`crate::tool_call`].

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::model::{OnInterrupt, SessionId, ToolCallId};
use crate::provider::ToolDefinition;

/// Results larger than this are replaced by an error object.
pub const MAX_RESULT_BYTES: usize = 10 * 1024 * 1024;

/// What a tool declares about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Unique name.
    pub name: String,
    /// What it does (shown to the model).
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
    /// Whether the `per_tool` policy asks a human first.
    pub requires_approval: bool,
    /// Seconds before a running call fails with a timeout.
    pub timeout_secs: u64,
    /// Whether running it twice with the same arguments has one effect.
    pub idempotent: bool,
    /// What to do when the process stopped while it ran; `None` takes the
    /// default (`retry` if idempotent, else `ask`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_interrupt: Option<OnInterrupt>,
}

impl ToolSpec {
    /// A spec with the design's defaults (60 s, not idempotent, no approval).
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            requires_approval: false,
            timeout_secs: 60,
            idempotent: false,
            on_interrupt: None,
        }
    }

    /// Sets `requires_approval`.
    pub fn with_approval(mut self, requires: bool) -> Self {
        self.requires_approval = requires;
        self
    }

    /// Sets `timeout_secs`.
    pub fn with_timeout(mut self, secs: u64) -> Self {
        self.timeout_secs = secs;
        self
    }

    /// Sets `idempotent`.
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    /// The effective interrupt policy.
    pub fn interrupt_policy(&self) -> OnInterrupt {
        self.on_interrupt.unwrap_or(if self.idempotent {
            OnInterrupt::Retry
        } else {
            OnInterrupt::Ask
        })
    }
}

/// What a tool learns about the call it serves.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// Calling session.
    pub session_id: SessionId,
    /// Tenant of the session.
    pub tenant: String,
    /// Agent of the session.
    pub agent: String,
    /// Call id.
    pub call_id: ToolCallId,
    /// Stable across retries of the same call: send it to side-effecting systems.
    pub idempotency_key: String,
    /// Dispatch attempt, from 1.
    pub attempt: u32,
    /// Who and what the call acts for: the claims of its scope token.
    pub scope: CallScope,
}

/// The scope a call acts under: what a scope token says about it. The
/// edge mints the token from this; a child's `allowed_tools` is always a
/// subset of its parent's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallScope {
    /// Who started the root session (a token's `sub`), if known.
    pub sub: Option<String>,
    /// Root of the session tree.
    pub root_session_id: Option<SessionId>,
    /// Parent session, for a child.
    pub parent_session_id: Option<SessionId>,
    /// Tools the session may call.
    pub allowed_tools: Vec<String>,
}

/// A tool's own failure; becomes the call's error result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    /// Message for the model.
    pub message: String,
    /// Extra fields merged into the error object.
    pub details: Option<Value>,
}

impl ToolError {
    /// An error with a message only.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            details: None,
        }
    }

    /// The error object the model sees: `{"error": message, …details}`.
    pub fn to_value(&self) -> Value {
        let mut obj = serde_json::Map::new();
        if let Some(Value::Object(d)) = &self.details {
            obj.extend(d.clone());
        }
        obj.insert("error".into(), Value::String(self.message.clone()));
        Value::Object(obj)
    }
}

/// A tool implementation.
#[async_trait::async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Its declaration.
    fn spec(&self) -> &ToolSpec;
    /// Runs one call. Runs inside its own tool-call actor: it may take long, and
    /// a panic fails only this call.
    async fn call(&self, ctx: ToolContext, arguments: Value) -> Result<Value, ToolError>;
}

/// Why a tool set could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolRegistryError {
    /// Two tools share a name.
    #[error("tool '{0}' is declared twice")]
    Duplicate(String),
    /// A tool's schema is not a valid JSON Schema, or is past the bounds
    /// of [`crate::schema`].
    #[error("tool '{name}': parameters: {detail}")]
    InvalidSchema {
        /// Tool name.
        name: String,
        /// Why.
        detail: String,
    },
}

struct Registered {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
    /// What requests offering the tool share.
    definition: Arc<ToolDefinition>,
}

/// All tools known to the runtime, with compiled argument validators.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Arc<BTreeMap<String, Registered>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// Builds a registry, compiling each tool's schema once.
    pub fn new(tools: Vec<Arc<dyn Tool>>) -> Result<Self, ToolRegistryError> {
        let mut map = BTreeMap::new();
        for tool in tools {
            let spec = tool.spec();
            let validator = crate::schema::compile(&spec.parameters).map_err(|e| {
                ToolRegistryError::InvalidSchema {
                    name: spec.name.clone(),
                    detail: e.to_string(),
                }
            })?;
            let name = spec.name.clone();
            let definition = Arc::new(ToolDefinition::new(
                spec.name.clone(),
                spec.description.clone(),
                spec.parameters.clone(),
            ));
            let registered = Registered {
                tool,
                validator,
                definition,
            };
            if map.insert(name.clone(), registered).is_some() {
                return Err(ToolRegistryError::Duplicate(name));
            }
        }
        Ok(Self {
            tools: Arc::new(map),
        })
    }

    /// This registry plus `extra` tools.
    pub fn extended(&self, extra: Vec<Arc<dyn Tool>>) -> Result<Self, ToolRegistryError> {
        let mut tools: Vec<Arc<dyn Tool>> = self.tools.values().map(|r| r.tool.clone()).collect();
        tools.extend(extra);
        Self::new(tools)
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).map(|r| r.tool.clone())
    }

    /// The declaration of `name`.
    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name).map(|r| r.tool.spec())
    }

    /// Names of all tools.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// Definitions of the named tools that exist, in the given order
    /// (shared, not copied).
    pub fn definitions(&self, names: &[String]) -> Vec<Arc<ToolDefinition>> {
        names
            .iter()
            .filter_map(|n| self.tools.get(n))
            .map(|r| Arc::clone(&r.definition))
            .collect()
    }

    /// Validates arguments; on failure returns the schema error object:
    /// `{"error": "schema validation failed: …", "validation_errors": [...]}`.
    pub fn validate(&self, name: &str, arguments: &Value) -> Result<(), Value> {
        let Some(reg) = self.tools.get(name) else {
            return Err(not_available(name));
        };
        let errors: Vec<Value> = reg
            .validator
            .iter_errors(arguments)
            .map(|e| {
                json!({
                    "path": e.instance_path().to_string(),
                    "message": e.to_string(),
                })
            })
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        let summary = errors
            .iter()
            .filter_map(|e| e.get("message").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("; ");
        Err(json!({
            "error": format!("schema validation failed: {summary}"),
            "validation_errors": errors,
        }))
    }
}

/// The error object for a tool outside the session's scope.
pub fn not_available(name: &str) -> Value {
    json!({"error": format!("tool '{name}' is not available in this session")})
}
