//! The client's `mcpServers` (`session/new`, `session/load`) as the
//! session's own MCP servers: connected through the same [`McpHub`] as the
//! configuration's servers, their tools registered for that session alone
//! ([`Overseer::set_session_tools`]) and added to its scope, where the usual
//! approval rules apply (an MCP tool is asked unless the server says it is
//! read-only). Their processes live as long as the [`SessionServers`] value,
//! which the connection holds until it ends.
//!
//! A session records the names of its servers in its metadata
//! (`acp.mcp_servers`), and its scope is fixed when it is created: a
//! `session/load` connects those of the client's servers it had, and ignores
//! others (their tools would not be in its scope).
//!
//! It deliberately connects nothing itself (that is `tools::mcp`'s) and
//! sends no scope token to the client's servers: they are the editor's, not
//! the operator's, and get no credential of overseer's.

use std::collections::BTreeMap;

use agent_client_protocol::v1::schema::McpServer;
use agent_client_protocol::Error;
use serde_json::Value;

use overseer_actors::model::SessionId;
use overseer_actors::Overseer;

use crate::tools::mcp::{McpHub, McpServerConfig};

/// The key under `acp` in a session's metadata that lists its servers.
pub(crate) const METADATA_KEY: &str = "mcp_servers";

/// A session's own connected servers; dropping it takes their tools away
/// from the session and stops their processes.
pub(crate) struct SessionServers {
    overseer: Overseer,
    id: SessionId,
    /// The connections, kept alive while this value is.
    _hub: McpHub,
    /// Every tool they expose.
    pub(crate) tools: Vec<String>,
}

impl Drop for SessionServers {
    fn drop(&mut self) {
        self.overseer.clear_session_tools(self.id);
    }
}

fn invalid(message: String) -> Error {
    Error::invalid_params().data(Value::String(message))
}

/// A server name as a tool-name prefix: characters tool names may not hold
/// become `_`, and so does the separator `__`.
fn prefix(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    while out.contains("__") {
        out = out.replace("__", "_");
    }
    out
}

/// The client's servers as server configs, by their tool-name prefixes.
pub(crate) fn configs(servers: &[McpServer]) -> Result<Vec<McpServerConfig>, Error> {
    let mut out: BTreeMap<String, McpServerConfig> = BTreeMap::new();
    for server in servers {
        let config = match server {
            McpServer::Stdio(s) => {
                let mut c =
                    McpServerConfig::stdio(prefix(&s.name), s.command.display().to_string(), &[]);
                c.args.clone_from(&s.args);
                c.env = s
                    .env
                    .iter()
                    .map(|v| (v.name.clone(), v.value.clone()))
                    .collect();
                c
            }
            McpServer::Http(s) => {
                if !s.headers.is_empty() {
                    return Err(invalid(format!(
                        "mcpServers: server '{}': HTTP headers are not supported",
                        s.name
                    )));
                }
                McpServerConfig::http(prefix(&s.name), s.url.clone())
            }
            McpServer::Sse(s) => {
                let name = &s.name;
                return Err(invalid(format!(
                    "mcpServers: server '{name}': SSE is not supported (use stdio or http)"
                )));
            }
            _ => {
                return Err(invalid(
                    "mcpServers: a transport this agent does not support".to_owned(),
                ))
            }
        };
        if config.name.is_empty() {
            return Err(invalid("mcpServers: a server without a name".to_owned()));
        }
        if out.contains_key(&config.name) {
            return Err(invalid(format!(
                "mcpServers: two servers are named '{}'",
                config.name
            )));
        }
        out.insert(config.name.clone(), config);
    }
    Ok(out.into_values().collect())
}

/// Connects `configs` and gives their tools to session `id`; `None` when
/// there are none. The error names the server that failed.
pub(crate) async fn connect(
    overseer: &Overseer,
    id: SessionId,
    configs: &[McpServerConfig],
) -> Result<Option<SessionServers>, Error> {
    if configs.is_empty() {
        return Ok(None);
    }
    let hub = McpHub::start(configs, None)
        .await
        .map_err(|e| invalid(format!("mcpServers: {e}")))?;
    let tools: Vec<String> = hub.specs().into_iter().map(|s| s.name).collect();
    overseer
        .set_session_tools(id, hub.tools())
        .map_err(|e| invalid(format!("mcpServers: {e}")))?;
    tracing::info!(session = %id, servers = configs.len(), tools = tools.len(), "the client's MCP servers are connected");
    Ok(Some(SessionServers {
        overseer: overseer.clone(),
        id,
        _hub: hub,
        tools,
    }))
}

/// The names of the servers a session was created with (its metadata).
pub(crate) fn recorded(metadata: &Value) -> Vec<String> {
    metadata
        .pointer(&format!("/acp/{METADATA_KEY}"))
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{EnvVariable, McpServerHttp, McpServerStdio};
    use serde_json::json;

    #[test]
    fn the_clients_servers_become_server_configs() {
        let servers = vec![
            McpServer::Stdio(
                McpServerStdio::new("My files", "/usr/bin/node")
                    .args(vec!["server.js".into()])
                    .env(vec![EnvVariable::new("LOG", "warn")]),
            ),
            McpServer::Http(McpServerHttp::new("a__b", "http://127.0.0.1:9/mcp")),
        ];
        let got = configs(&servers).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].name, "My_files");
        assert_eq!(got[0].command.as_deref(), Some("/usr/bin/node"));
        assert_eq!(got[0].args, ["server.js"]);
        assert_eq!(got[0].env.get("LOG").map(String::as_str), Some("warn"));
        assert_eq!(got[1].name, "a_b");
        assert_eq!(got[1].url.as_deref(), Some("http://127.0.0.1:9/mcp"));
    }

    #[test]
    fn servers_that_cannot_be_told_apart_are_refused() {
        let servers = vec![
            McpServer::Stdio(McpServerStdio::new("a b", "x")),
            McpServer::Stdio(McpServerStdio::new("a_b", "y")),
        ];
        let e = configs(&servers).unwrap_err();
        assert!(
            format!("{e:?}").contains("two servers are named 'a_b'"),
            "{e:?}"
        );
    }

    #[test]
    fn a_sessions_servers_are_read_from_its_metadata() {
        let m = json!({"acp": {"cwd": "/", METADATA_KEY: ["files", "search"]}});
        assert_eq!(recorded(&m), ["files", "search"]);
        assert!(recorded(&json!(null)).is_empty());
    }
}
