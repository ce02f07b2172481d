//! `[[agents]]`: one agent's model, prompt, tools, approvals and budgets.
//! Its MCP servers and tool patterns are `agent_tools`'s.

use serde::Deserialize;

use super::providers::default_model;
use super::AgentMcpServer;
use overseer_actors::model::{AgentConfig, ApprovalPolicy, Budget, ChildApproval};

/// One `[[agents]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// Unique name.
    pub name: String,
    /// Model route.
    #[serde(default = "default_model")]
    pub model: String,
    /// System instructions.
    #[serde(default)]
    pub instructions: String,
    /// Tools the agent may call: names, or patterns where `*` stands for
    /// any run of characters (`"fs__*"`), expanded at start-up.
    #[serde(default)]
    pub tools: Vec<String>,
    /// MCP servers whose every tool this agent may call: `[[mcp_servers]]`
    /// names, or inline tables (servers of this agent only).
    #[serde(default)]
    pub mcp_servers: Vec<AgentMcpServer>,
    /// Approval policy.
    #[serde(default)]
    pub approval: ApprovalPolicy,
    /// Most steps in one turn.
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    /// Run a step's approved calls concurrently.
    #[serde(default)]
    pub parallel_tool_calls: bool,
    /// Seconds before an undecided call is denied.
    #[serde(default = "default_approval_timeout_secs")]
    pub approval_timeout_secs: u64,
    /// Agents this one may delegate to with the built-in `delegate_task`.
    #[serde(default)]
    pub subagents: Vec<String>,
    /// Children's approvals: "propagate" (decided at the root) or "auto_approve".
    #[serde(default)]
    pub child_approval: ChildApproval,
    /// Deepest allowed delegation (root = 0).
    #[serde(default = "default_max_delegation_depth")]
    pub max_delegation_depth: u32,
    /// Most live children per session.
    #[serde(default = "default_max_children")]
    pub max_children: u32,
    /// Spending limits: `{ max_tokens, max_tool_calls, max_steps, max_wall_clock_secs }`.
    #[serde(default)]
    pub budget: Budget,
    /// JSON Schema the final answer of each turn must match.
    #[serde(default)]
    pub output_schema: Option<serde_json::Value>,
    /// Complete a session idle in awaiting_input this long.
    #[serde(default)]
    pub input_timeout_secs: Option<u64>,
    /// Per-tool approval rules overriding the tools' defaults (keys are
    /// names or patterns of the agent's tools; a name wins over a pattern).
    #[serde(default)]
    pub tool_approvals: std::collections::BTreeMap<String, bool>,
    /// Skills its sessions may use: names, or patterns where `*` stands
    /// for any run of characters, expanded at start-up.
    #[serde(default)]
    pub skills: Vec<String>,
    /// Stored tasks it may run with `run_task`: ids or patterns.
    #[serde(default)]
    pub tasks: Vec<String>,
}

fn default_max_delegation_depth() -> u32 {
    3
}

fn default_max_children() -> u32 {
    8
}

impl AgentSection {
    /// The agent as the runtime takes it.
    pub fn to_agent_config(&self) -> AgentConfig {
        AgentConfig {
            name: self.name.clone(),
            model: self.model.clone(),
            instructions: self.instructions.clone(),
            tools: self.tools.clone(),
            approval: self.approval,
            max_steps: self.max_steps,
            parallel_tool_calls: self.parallel_tool_calls,
            approval_timeout_secs: self.approval_timeout_secs,
            subagents: self.subagents.clone(),
            child_approval: self.child_approval,
            max_delegation_depth: self.max_delegation_depth,
            max_children: self.max_children,
            budget: self.budget,
            output_schema: self.output_schema.clone(),
            input_timeout_secs: self.input_timeout_secs,
            tool_approvals: self.tool_approvals.clone(),
            skills: self.skills.clone(),
            tasks: self.tasks.clone(),
        }
    }
}

fn default_max_steps() -> u32 {
    10
}
fn default_approval_timeout_secs() -> u64 {
    86_400
}
