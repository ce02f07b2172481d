//! The `[[mcp_servers]]` configuration of one MCP server, and its checks.
//!
//! Owns the shape of a server's entry (how to reach it, whether start-up
//! depends on it, per-tool approval overrides) and the validation that names
//! the offending key. It deliberately does not read files or the environment:
//! the config loader (`crate::config`) embeds [`McpServerConfig`] in its own
//! document and reports these errors with the rest.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Separator between a server's name and its tool's name in the name overseer
/// exposes (`server__tool`). Server names may not contain it, so the prefix is
/// unambiguous.
pub const SEPARATOR: &str = "__";

/// Default seconds a call may run.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;

/// Default seconds to spawn or reach a server, finish the MCP handshake and
/// list its tools.
pub const DEFAULT_STARTUP_TIMEOUT_SECS: u64 = 30;

/// Environment variables a stdio server inherits from overseer without being
/// named in `inherit_env`: what a program needs to find its interpreter, home
/// and locale. Everything else (provider keys, overseer's own secrets) stays
/// out of third-party processes unless the config asks for it.
pub const BASE_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR",
    "TZ",
];

/// One MCP server (`[[mcp_servers]]`).
///
/// Exactly one transport: `command` (+ `args`, `env`, `inherit_env`) starts a
/// stdio server as a child process; `url` reaches a streamable HTTP server.
///
/// ```toml
/// [[mcp_servers]]
/// name = "files"
/// command = "node"
/// args = ["/opt/mcp/server-filesystem/dist/index.js", "/srv/data"]
/// env = { LOG_LEVEL = "warn" }
/// inherit_env = ["GITHUB_TOKEN"]   # secrets come from overseer's environment
/// required = false
/// timeout_secs = 30
/// tools = { write_file = { requires_approval = true } }
///
/// [[mcp_servers]]
/// name = "search"
/// url = "https://mcp.example.com/mcp"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Prefix of its tools' names (`name__tool`): letters, digits, `_` and
    /// `-`, without `__`.
    pub name: String,
    /// Program of a stdio server. Point it at the server itself (e.g. `node
    /// …/dist/index.js`) rather than a launcher such as `npx`: overseer stops
    /// and restarts the process it started, not that process's children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Arguments of `command`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Variables set for `command` (not secrets: the config file is not the
    /// place for them; use `inherit_env`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Names of overseer's own environment variables passed on to `command`,
    /// on top of [`BASE_ENV`]; a variable that is not set is left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherit_env: Vec<String>,
    /// Endpoint of a streamable HTTP server (`http` or `https`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `true` (default): a server that cannot start fails overseer's start-up.
    /// `false`: it is marked unavailable, retried in the background, and its
    /// tools fail at once with a clear error meanwhile.
    #[serde(default = "default_true")]
    pub required: bool,
    /// Seconds one call may run (default 60).
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Seconds to start or reach the server and list its tools (default 30).
    #[serde(default = "default_startup_timeout_secs")]
    pub startup_timeout_secs: u64,
    /// Per-tool overrides, keyed by the tool's name on the server (without the
    /// `server__` prefix). Each named tool must exist on the server.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, McpToolOverride>,
}

/// What the config says about one tool of a server, over what the server says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolOverride {
    /// Whether the `per_tool` approval policy asks a human first. Without an
    /// override an MCP tool requires approval unless the server annotates it
    /// `readOnlyHint: true`.
    pub requires_approval: bool,
}

fn default_true() -> bool {
    true
}

fn default_timeout_secs() -> u64 {
    DEFAULT_TIMEOUT_SECS
}

fn default_startup_timeout_secs() -> u64 {
    DEFAULT_STARTUP_TIMEOUT_SECS
}

/// How a server is reached, once its config is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpTransportKind<'a> {
    /// A child process speaking MCP on its stdin/stdout.
    Stdio {
        /// Program.
        command: &'a str,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// Endpoint.
        url: &'a str,
    },
}

/// An invalid `[[mcp_servers]]` entry, naming the key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpConfigError {
    /// One key of one server is wrong.
    #[error("mcp_servers: server '{server}': `{key}` {message}")]
    Invalid {
        /// The server's `name`.
        server: String,
        /// The key at fault.
        key: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// Two servers share a name (their tools would collide).
    #[error("mcp_servers: the server name '{0}' is used twice")]
    Duplicate(String),
}

impl McpServerConfig {
    /// A stdio server running `command args…`, with the defaults.
    pub fn stdio(name: impl Into<String>, command: impl Into<String>, args: &[&str]) -> Self {
        Self {
            command: Some(command.into()),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Self::empty(name.into())
        }
    }

    /// A streamable HTTP server at `url`, with the defaults.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            ..Self::empty(name.into())
        }
    }

    fn empty(name: String) -> Self {
        Self {
            name,
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            inherit_env: Vec::new(),
            url: None,
            required: true,
            timeout_secs: DEFAULT_TIMEOUT_SECS,
            startup_timeout_secs: DEFAULT_STARTUP_TIMEOUT_SECS,
            tools: BTreeMap::new(),
        }
    }

    /// The transport, after checking every key.
    pub fn transport(&self) -> Result<McpTransportKind<'_>, McpConfigError> {
        self.validate()?;
        match (&self.command, &self.url) {
            (Some(command), None) => Ok(McpTransportKind::Stdio { command }),
            (None, Some(url)) => Ok(McpTransportKind::Http { url }),
            // validate() refuses both and neither.
            _ => Err(self.invalid("command", "and `url` are exclusive")),
        }
    }

    /// Checks every key of this entry.
    pub fn validate(&self) -> Result<(), McpConfigError> {
        let name = &self.name;
        if name.is_empty() {
            return Err(self.invalid("name", "must not be empty"));
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(self.invalid(
                "name",
                "may contain only ASCII letters, digits, '_' and '-' (it prefixes tool names)",
            ));
        }
        if name.contains(SEPARATOR) {
            return Err(self.invalid(
                "name",
                "must not contain '__' (it separates the server from the tool in `server__tool`)",
            ));
        }
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return Err(self.invalid(
                    "url",
                    "cannot be set together with `command`: a server is either stdio or streamable HTTP",
                ))
            }
            (None, None) => {
                return Err(self.invalid(
                    "command",
                    "or `url` is required (stdio or streamable HTTP server)",
                ))
            }
            (Some(command), None) => {
                if command.trim().is_empty() {
                    return Err(self.invalid("command", "must not be empty"));
                }
            }
            (None, Some(url)) => {
                for (key, set) in [
                    ("args", !self.args.is_empty()),
                    ("env", !self.env.is_empty()),
                    ("inherit_env", !self.inherit_env.is_empty()),
                ] {
                    if set {
                        return Err(self.invalid(key, "applies only to a stdio server (`command`)"));
                    }
                }
                match reqwest::Url::parse(url) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                    Ok(u) => {
                        return Err(self.invalid(
                            "url",
                            format!("must be http or https, not '{}'", u.scheme()),
                        ))
                    }
                    Err(e) => return Err(self.invalid("url", format!("is not a URL: {e}"))),
                }
            }
        }
        for key in self.env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(self.invalid("env", format!("has an invalid variable name '{key}'")));
            }
        }
        for key in &self.inherit_env {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(self.invalid(
                    "inherit_env",
                    format!("has an invalid variable name '{key}'"),
                ));
            }
        }
        if self.timeout_secs == 0 {
            return Err(self.invalid("timeout_secs", "must be at least 1"));
        }
        if self.startup_timeout_secs == 0 {
            return Err(self.invalid("startup_timeout_secs", "must be at least 1"));
        }
        Ok(())
    }

    fn invalid(&self, key: &'static str, message: impl Into<String>) -> McpConfigError {
        McpConfigError::Invalid {
            server: self.name.clone(),
            key,
            message: message.into(),
        }
    }
}

/// Checks every entry and that no two share a name.
pub fn validate_servers(servers: &[McpServerConfig]) -> Result<(), McpConfigError> {
    let mut seen = std::collections::BTreeSet::new();
    for server in servers {
        server.validate()?;
        if !seen.insert(server.name.as_str()) {
            return Err(McpConfigError::Duplicate(server.name.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<McpServerConfig, String> {
        toml::from_str::<McpServerConfig>(toml_text).map_err(|e| e.to_string())
    }

    #[test]
    fn stdio_and_http_entries_parse_with_defaults() {
        let s = parse(
            r#"
            name = "files"
            command = "node"
            args = ["server.js", "/data"]
            env = { LOG = "1" }
            tools = { write_file = { requires_approval = false } }
            "#,
        )
        .unwrap();
        assert!(s.required);
        assert_eq!(s.timeout_secs, 60);
        assert_eq!(s.startup_timeout_secs, 30);
        assert_eq!(
            s.transport().unwrap(),
            McpTransportKind::Stdio { command: "node" }
        );
        assert!(!s.tools["write_file"].requires_approval);

        let h = parse("name = \"web\"\nurl = \"http://127.0.0.1:3001/mcp\"\nrequired = false\ntimeout_secs = 5").unwrap();
        assert!(!h.required);
        assert_eq!(
            h.transport().unwrap(),
            McpTransportKind::Http {
                url: "http://127.0.0.1:3001/mcp"
            }
        );
        // Round trip through TOML keeps the entry.
        let again = parse(&toml::to_string(&h).unwrap()).unwrap();
        assert_eq!(again, h);
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = parse("name = \"x\"\ncommand = \"a\"\ncomand = \"b\"").unwrap_err();
        assert!(e.contains("comand"), "{e}");
        let e = parse("name = \"x\"\ncommand = \"a\"\ntools = { t = { requires_aproval = true } }")
            .unwrap_err();
        assert!(e.contains("requires_aproval"), "{e}");
    }

    #[test]
    fn invalid_values_name_their_key() {
        let cases: Vec<(McpServerConfig, &str)> = vec![
            (McpServerConfig::stdio("a__b", "node", &[]), "`name`"),
            (McpServerConfig::stdio("a b", "node", &[]), "`name`"),
            (McpServerConfig::stdio("", "node", &[]), "`name`"),
            (McpServerConfig::stdio("a", " ", &[]), "`command`"),
            (McpServerConfig::http("a", "ftp://x/"), "`url`"),
            (McpServerConfig::http("a", "not a url"), "`url`"),
            (
                McpServerConfig {
                    command: Some("node".into()),
                    ..McpServerConfig::http("a", "http://x/")
                },
                "`url`",
            ),
            (
                McpServerConfig {
                    url: None,
                    ..McpServerConfig::http("a", "http://x/")
                },
                "`command`",
            ),
            (
                McpServerConfig {
                    args: vec!["x".into()],
                    ..McpServerConfig::http("a", "http://x/")
                },
                "`args`",
            ),
            (
                McpServerConfig {
                    timeout_secs: 0,
                    ..McpServerConfig::stdio("a", "node", &[])
                },
                "`timeout_secs`",
            ),
            (
                McpServerConfig {
                    inherit_env: vec!["A=B".into()],
                    ..McpServerConfig::stdio("a", "node", &[])
                },
                "`inherit_env`",
            ),
        ];
        for (config, key) in cases {
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains(key), "{e} should name {key}");
        }
        let dup = vec![
            McpServerConfig::stdio("a", "node", &[]),
            McpServerConfig::http("a", "http://x/"),
        ];
        assert_eq!(
            validate_servers(&dup).unwrap_err(),
            McpConfigError::Duplicate("a".into())
        );
    }
}
