//! An agent's own tool sources and rules: MCP servers of its own
//! (`mcp_servers`, by name or inline), tool patterns such as `"fs__*"` in
//! `tools` and in `tool_approvals`, and their resolution into the plain tool
//! names the runtime takes.
//!
//! Owns the pattern syntax (`*` stands for any run of characters, nothing
//! else is special), the checks that can be made before any MCP server is
//! reached (part of [`Config::validate`]), and [`Config::resolve_agent_tools`],
//! run once every source has listed its tools. After it an agent's `tools`
//! and `tool_approvals` hold exact names only, so the runtime, the scope
//! token's `allowed_tools` and a session's overrides (which may only narrow)
//! work on names as they always did.
//!
//! A server defined inline in an agent is that agent's alone: its tools are
//! in no other agent's scope, whatever that agent's patterns. A server named
//! from `[[mcp_servers]]` stays shared: naming it gives the agent every tool
//! the server lists, as listing them one by one would.
//!
//! It deliberately starts nothing (`crate::service` connects the servers)
//! and decides no approval at call time (the session, in `overseer_actors`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use overseer_actors::model::DELEGATE_TASK;
use overseer_actors::tool::ToolRegistry;

use super::{AgentSection, Config, Problem};
use crate::tools::mcp::{McpServerConfig, SEPARATOR};

/// One entry of an agent's `mcp_servers`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum AgentMcpServer {
    /// The `name` of a `[[mcp_servers]]` entry.
    Named(String),
    /// A server of this agent only, with the keys of `[[mcp_servers]]`.
    Inline(McpServerConfig),
}

impl AgentMcpServer {
    /// The server's name (the prefix of its tools' names).
    pub fn name(&self) -> &str {
        match self {
            Self::Named(name) => name,
            Self::Inline(config) => &config.name,
        }
    }
}

/// Whether a `tools` or `tool_approvals` entry is a pattern.
pub fn is_pattern(entry: &str) -> bool {
    entry.contains('*')
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (possibly none).
pub fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return pattern == name;
    };
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*` at all.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = rest.get(at + part.len()..).unwrap_or_default(),
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// What is wrong with a pattern's spelling, if anything.
fn pattern_problem(pattern: &str) -> Option<&'static str> {
    let ok = pattern
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*'));
    (!ok).then_some("may contain only letters, digits, '_', '-' and '*'")
}

/// The server a tool name belongs to, if it is an MCP tool's name.
fn server_of(tool: &str) -> Option<&str> {
    tool.split_once(SEPARATOR).map(|(server, _)| server)
}

impl AgentSection {
    /// Servers this agent defines inline.
    pub fn inline_servers(&self) -> impl Iterator<Item = &McpServerConfig> {
        self.mcp_servers.iter().filter_map(|s| match s {
            AgentMcpServer::Inline(config) => Some(config),
            AgentMcpServer::Named(_) => None,
        })
    }

    /// Whether `tool` can be one of this agent's tools as far as the
    /// configuration alone tells (a server's tools are known once listed).
    fn may_have(&self, tool: &str) -> bool {
        self.tools
            .iter()
            .any(|t| t == tool || (is_pattern(t) && matches(t, tool)))
            || server_of(tool).is_some_and(|s| self.mcp_servers.iter().any(|m| m.name() == s))
            || (tool == DELEGATE_TASK && !self.subagents.is_empty())
    }
}

impl Config {
    /// Every MCP server to connect: `[[mcp_servers]]` and each agent's
    /// inline ones.
    pub fn all_mcp_servers(&self) -> Vec<McpServerConfig> {
        self.mcp_servers
            .iter()
            .cloned()
            .chain(self.agents.iter().flat_map(|a| a.inline_servers().cloned()))
            .collect()
    }

    /// Whether `name` is a tool agent `agent` may list: one of the
    /// configuration's shared tools, or a tool of a server it defines.
    pub(super) fn declares_tool_for(
        &self,
        builtins: &ToolRegistry,
        agent: &AgentSection,
        name: &str,
    ) -> bool {
        self.declares_tool(builtins, name)
            || server_of(name).is_some_and(|s| agent.inline_servers().any(|m| m.name == s))
    }

    /// The checks of agent `i`'s own servers, patterns and approval rules
    /// that need no server to have answered.
    pub(super) fn agent_tool_problems(&self, i: usize, out: &mut Vec<Problem>) {
        let Some(agent) = self.agents.get(i) else {
            return;
        };
        let at = |key: &str| format!("agents[{i}].{key}");
        let name = &agent.name;
        for (j, server) in agent.mcp_servers.iter().enumerate() {
            let key = at(&format!("mcp_servers[{j}]"));
            let server_name = server.name();
            if agent.mcp_servers[..j]
                .iter()
                .any(|s| s.name() == server_name)
            {
                out.push(Problem::new(
                    key,
                    format!("agent '{name}' lists MCP server '{server_name}' twice"),
                ));
                continue;
            }
            match server {
                AgentMcpServer::Named(_) => {
                    if !self.mcp_servers.iter().any(|m| m.name == server_name) {
                        out.push(Problem::new(
                            key,
                            format!(
                                "agent '{name}' names MCP server '{server_name}', which no [[mcp_servers]] entry defines (define one there, or give a table with its keys here)"
                            ),
                        ));
                    }
                }
                AgentMcpServer::Inline(config) => {
                    if let Err(e) = config.validate() {
                        out.push(Problem::new(key, format!("agent '{name}': {e}")));
                    } else if self.mcp_servers.iter().any(|m| m.name == server_name) {
                        out.push(Problem::new(
                            key,
                            format!(
                                "agent '{name}' defines MCP server '{server_name}', a name [[mcp_servers]] already uses (tool names would collide)"
                            ),
                        ));
                    } else if let Some(other) = self.agents[..i]
                        .iter()
                        .find(|a| a.inline_servers().any(|m| m.name == server_name))
                    {
                        out.push(Problem::new(
                            key,
                            format!(
                                "agent '{name}' defines MCP server '{server_name}', which agent '{}' defines too (to share a server, define it once in [[mcp_servers]] and name it)",
                                other.name
                            ),
                        ));
                    }
                }
            }
        }
        for tool in agent.tools.iter().filter(|t| is_pattern(t)) {
            if let Some(message) = pattern_problem(tool) {
                out.push(Problem::new(
                    at("tools"),
                    format!("agent '{name}' lists tool pattern '{tool}', which {message}"),
                ));
            }
        }
        for tool in agent.tool_approvals.keys() {
            if is_pattern(tool) {
                if let Some(message) = pattern_problem(tool) {
                    out.push(Problem::new(
                        at("tool_approvals"),
                        format!("agent '{name}' has the pattern '{tool}', which {message}"),
                    ));
                }
            } else if !agent.may_have(tool) {
                out.push(Problem::new(
                    at("tool_approvals"),
                    format!(
                        "agent '{name}' sets an approval rule for '{tool}', which is not one of its tools (see its tools and mcp_servers)"
                    ),
                ));
            }
        }
    }

    /// Rewrites each agent's `tools` and `tool_approvals` into exact names
    /// from `registry` (every tool of every source, MCP servers listed):
    /// patterns expanded (in the registry's order), the tools of the
    /// agent's `mcp_servers` added, other agents' inline servers left out.
    /// Refused, in one line naming the agent: a pattern that matches
    /// nothing, a tool no source provides, an approval rule for a tool the
    /// agent does not have.
    pub fn resolve_agent_tools(&mut self, registry: &ToolRegistry) -> Result<(), String> {
        let owners: BTreeMap<&str, &str> = self
            .agents
            .iter()
            .flat_map(|a| {
                a.inline_servers()
                    .map(|m| (m.name.as_str(), a.name.as_str()))
            })
            .collect();
        let mut resolved = Vec::with_capacity(self.agents.len());
        for agent in &self.agents {
            let visible: Vec<&str> = registry
                .names()
                .filter(|tool| {
                    server_of(tool)
                        .and_then(|s| owners.get(s))
                        .is_none_or(|owner| *owner == agent.name)
                })
                .collect();
            let mut tools: Vec<String> = Vec::new();
            let mut seen = BTreeSet::new();
            let mut add = |tool: &str, tools: &mut Vec<String>| {
                if seen.insert(tool.to_owned()) {
                    tools.push(tool.to_owned());
                }
            };
            for entry in &agent.tools {
                if is_pattern(entry) {
                    let found: Vec<&&str> = visible.iter().filter(|t| matches(entry, t)).collect();
                    if found.is_empty() {
                        return Err(format!(
                            "agent '{}': the tool pattern '{entry}' matches no tool (its tools can be: {})",
                            agent.name,
                            visible.join(", ")
                        ));
                    }
                    for tool in found {
                        add(tool, &mut tools);
                    }
                } else if visible.contains(&entry.as_str()) {
                    add(entry, &mut tools);
                } else {
                    return Err(format!(
                        "agent '{}' lists tool '{entry}', which no configured source provides",
                        agent.name
                    ));
                }
            }
            for server in &agent.mcp_servers {
                let prefix = format!("{}{SEPARATOR}", server.name());
                for tool in visible.iter().filter(|t| t.starts_with(&prefix)) {
                    add(tool, &mut tools);
                }
            }
            let has = |tool: &str| {
                tools.iter().any(|t| t == tool)
                    || (tool == DELEGATE_TASK && !agent.subagents.is_empty())
            };
            let mut approvals = BTreeMap::new();
            // Patterns first, so an exact name's rule wins over a pattern's.
            for (pattern, ask) in agent.tool_approvals.iter().filter(|(k, _)| is_pattern(k)) {
                let mut any = false;
                for tool in tools.iter().filter(|t| matches(pattern, t)) {
                    approvals.insert(tool.clone(), *ask);
                    any = true;
                }
                if !any {
                    return Err(format!(
                        "agent '{}': the tool_approvals pattern '{pattern}' matches none of its tools ({})",
                        agent.name,
                        tools.join(", ")
                    ));
                }
            }
            for (tool, ask) in agent.tool_approvals.iter().filter(|(k, _)| !is_pattern(k)) {
                if !has(tool) {
                    return Err(format!(
                        "agent '{}' sets an approval rule for '{tool}', which is not one of its tools ({})",
                        agent.name,
                        tools.join(", ")
                    ));
                }
                approvals.insert(tool.clone(), *ask);
            }
            resolved.push((tools, approvals));
        }
        for (agent, (tools, approvals)) in self.agents.iter_mut().zip(resolved) {
            agent.tools = tools;
            agent.tool_approvals = approvals;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_matches_any_run_of_characters() {
        let cases = [
            ("fs__*", "fs__read_file", true),
            ("fs__*", "fs__", true),
            ("fs__*", "fsx__read", false),
            ("*", "current_time", true),
            ("*__echo", "ev__echo", true),
            ("*__echo", "ev__echo2", false),
            ("ev__*_file", "ev__read_file", true),
            ("ev__*_file", "ev__read_files", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(matches(pattern, name), expected, "{pattern} vs {name}");
        }
    }

    #[test]
    fn a_pattern_is_spelled_with_tool_name_characters_and_stars() {
        assert!(pattern_problem("fs__*").is_none());
        assert!(pattern_problem("fs.*").is_some());
        assert!(pattern_problem("fs__?").is_some());
    }
}
