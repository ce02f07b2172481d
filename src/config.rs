//! Configuration: `config/overseer.toml`, then `OVERSEER_*` environment
//! variables, then command-line flags.
//!
//! This module owns the typed shape of the file, the layering, and the
//! reporting: unknown keys are errors and every invalid value is reported with
//! its key (`agents[1].approval: unknown variant 'sometimes', expected
//! auto|per_tool|always`), all problems of a file at once. It converts the
//! result into the types the runtime takes ([`AgentConfig`], [`RuntimeConfig`]).
//! It deliberately does not build what the configuration describes (store,
//! provider, tools): the binaries do, so a library user can configure the
//! runtime without this file. Secrets are never read from here. An
//! agent's own MCP servers, tool patterns and approval rules, and their
//! resolution once the servers have listed their tools, are `agent_tools`'s.
//!
//! This file holds the whole [`Config`], its errors and loading. Each
//! section's type lives in its own child (`http`, `store`, `cluster`,
//! `runtime`, `providers`, `agents`, `webhooks`, `library`); `env` layers the
//! environment and the flags over the file, `validate` checks the rules
//! across values, and `explain` turns serde's refusals into problems named
//! by key. `[telemetry]` and `[log]` are `crate::telemetry`'s own sections.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::{Table, Value};

use overseer_actors::model::AgentConfig;
use overseer_actors::supervision::RestartPolicy;
use overseer_actors::tool::ToolRegistry;
use overseer_actors::RuntimeConfig;

use crate::provider::RouteConfig;
use crate::store::Durability;
use crate::tools::http_request::HttpRequestConfig;
use crate::tools::http_tool::HttpToolConfig;
use crate::tools::mcp::McpServerConfig;

mod agent_tools;
mod agents;
mod cluster;
mod env;
mod explain;
mod http;
mod library;
mod providers;
mod runtime;
mod store;
mod validate;
mod webhooks;

use agent_tools::is_pattern;
pub use agent_tools::AgentMcpServer;
pub use agents::AgentSection;
pub use cluster::ClusterSection;
pub use env::ENV_OVERRIDES;
use explain::{explain, problem_for, syntax_error};
pub use http::{
    check_jwks_url, AuthMode, HttpSection, ScopeTokenSection, MAX_JWT_LEEWAY_SECS,
    MIN_JWKS_REFRESH_SECS,
};
pub use library::{SkillsDirEntry, TaskSection};
pub use providers::{ProviderKind, ProviderSection};
pub use runtime::{LimitsSection, RuntimeSection};
pub use store::{StoreKind, StoreSection, MAX_POOL_SIZE};
pub use webhooks::WebhooksSection;

/// Where the configuration is looked for when no path is given.
pub const DEFAULT_CONFIG_PATH: &str = "config/overseer.toml";

/// The default configuration, compiled in: used when no path is given and
/// [`DEFAULT_CONFIG_PATH`] does not exist, so the binary runs from anywhere
/// with exactly the defaults a checkout has.
pub const DEFAULT_CONFIG: &str = include_str!("../config/overseer.toml");

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[store]`.
    #[serde(default)]
    pub store: StoreSection,
    /// `[cluster]`: membership and failover when `store.kind = "postgres"`.
    #[serde(default)]
    pub cluster: ClusterSection,
    /// `[runtime]`.
    #[serde(default)]
    pub runtime: RuntimeSection,
    /// `[limits]`: what one caller can make a session or the node hold.
    #[serde(default)]
    pub limits: LimitsSection,
    /// `[provider]`.
    #[serde(default)]
    pub provider: ProviderSection,
    /// `[[models]]`: named model routes; an agent whose `model` names one is
    /// served by it, every other agent by `[provider]`.
    #[serde(default)]
    pub models: Vec<RouteConfig>,
    /// `[http]`: the API server of `overseer serve`.
    #[serde(default)]
    pub http: HttpSection,
    /// `[[tools]]`: `http` tools.
    #[serde(default)]
    pub tools: Vec<HttpToolConfig>,
    /// `[http_request]`: enables the built-in `http_request` for these hosts.
    #[serde(default)]
    pub http_request: Option<HttpRequestConfig>,
    /// `[[mcp_servers]]`: MCP servers whose tools are `server__tool`.
    #[serde(default)]
    pub mcp_servers: Vec<McpServerConfig>,
    /// `[scope_tokens]`: the JWTs sent to http tools and MCP servers.
    #[serde(default)]
    pub scope_tokens: ScopeTokenSection,
    /// `[webhooks]`: notifications to the tenants' endpoints.
    #[serde(default)]
    pub webhooks: WebhooksSection,
    /// `[[agents]]`.
    #[serde(default)]
    pub agents: Vec<AgentSection>,
    /// `[[tasks]]`: stored tasks. Those of `tasks_dir` are added
    /// when the file is loaded.
    #[serde(default)]
    pub tasks: Vec<TaskSection>,
    /// A directory of `*.toml` files, one stored task each (the keys of
    /// `[[tasks]]`; `id` defaults to the file's name without `.toml`).
    #[serde(default)]
    pub tasks_dir: Option<PathBuf>,
    /// Directories of skills in the Agent Skills format: a path, or
    /// `{ path = "...", trusted = false }` for skills only a person may
    /// activate.
    #[serde(default)]
    pub skills_dirs: Vec<SkillsDirEntry>,
    /// `[telemetry]`: traces over OTLP (off without an endpoint).
    #[serde(default)]
    pub telemetry: crate::telemetry::TelemetrySection,
    /// `[log]`: the format of log lines.
    #[serde(default)]
    pub log: crate::telemetry::LogSection,
}

fn yes() -> bool {
    true
}

/// One invalid value (or unknown key), named by its key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Key path (`agents[1].approval`), or `VAR (key)` for the environment.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl Problem {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Why the configuration could not be loaded. Every message is one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{origin}:{line}:{column}: invalid TOML: {message}")]
    Syntax {
        /// The file (or `built-in defaults`).
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// Unknown keys or invalid values, all of them.
    #[error("{origin}: {}", join_problems(problems))]
    Invalid {
        /// The file, `built-in defaults` or `environment`.
        origin: String,
        /// Every problem found.
        problems: Vec<Problem>,
    },
}

fn join_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Values given as command-line flags; they win over file and environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--data`.
    pub data_dir: Option<PathBuf>,
    /// Durability (no `run` flag sets it; for the server's flags).
    pub durability: Option<Durability>,
    /// `--scenario`.
    pub scenario: Option<PathBuf>,
}

/// How to load the configuration.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// An explicit file (`--config`): it must exist. Without it,
    /// [`DEFAULT_CONFIG_PATH`] is used if present, else [`DEFAULT_CONFIG`].
    pub path: Option<PathBuf>,
    /// Flag values.
    pub overrides: Overrides,
}

impl Config {
    /// Loads file, environment and flags, then validates against `tools`.
    /// Blocking (reads a file): call it before the async runtime starts or
    /// from a blocking thread.
    pub fn load(opts: &LoadOptions, tools: &ToolRegistry) -> Result<Self, ConfigError> {
        Self::load_with_env(opts, tools, |var| std::env::var_os(var))
    }

    /// [`Config::load`] with the environment supplied by the caller (tests).
    pub fn load_with_env(
        opts: &LoadOptions,
        tools: &ToolRegistry,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        let (origin, text) = match &opts.path {
            Some(path) => (path.display().to_string(), read(path)?),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                let path = Path::new(DEFAULT_CONFIG_PATH);
                (path.display().to_string(), read(path)?)
            }
            None => ("built-in defaults".to_owned(), DEFAULT_CONFIG.to_owned()),
        };
        let mut config = Self::parse(&text, &origin)?;
        config.apply_env(env)?;
        config.apply_overrides(&opts.overrides);
        config.load_tasks_dir()?;
        let problems = config.problems(tools);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid { origin, problems })
        }
    }

    /// The telemetry settings in force: `[telemetry]` overridden by the
    /// standard `OTEL_*` variables of `env`; `None` when traces are off.
    pub fn telemetry_settings(
        &self,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Option<crate::telemetry::Settings>, ConfigError> {
        self.telemetry
            .resolve(env)
            .map_err(|problem| ConfigError::Invalid {
                origin: "environment".into(),
                problems: vec![Problem::new("telemetry", problem)],
            })
    }

    /// The compiled-in defaults, unvalidated against any tool registry.
    pub fn builtin() -> Result<Self, ConfigError> {
        Self::parse(DEFAULT_CONFIG, "built-in defaults")
    }

    /// Parses TOML text. `origin` names it in errors. Checks shape only (keys
    /// and types); see [`Config::validate`] for the rules across values.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let table: Table = toml::from_str(text).map_err(|e| syntax_error(origin, text, &e))?;
        Value::Table(table.clone())
            .try_into::<Config>()
            .map_err(|e| ConfigError::Invalid {
                origin: origin.to_owned(),
                problems: explain(&table, &e),
            })
    }

    /// Checks the rules across values: unique agent names, existing tools,
    /// limits within range.
    pub fn validate(&self, tools: &ToolRegistry, origin: &str) -> Result<(), ConfigError> {
        let problems = self.problems(tools);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: origin.to_owned(),
                problems,
            })
        }
    }

    /// Whether `name` is a tool this configuration provides: a built-in, a
    /// `[[tools]]` entry, `http_request` when configured, or `server__tool`
    /// of a configured MCP server (checked again once the server listed its
    /// tools).
    pub fn declares_tool(&self, builtins: &ToolRegistry, name: &str) -> bool {
        builtins.spec(name).is_some()
            || self.tools.iter().any(|t| t.name == name)
            || (name == "http_request" && self.http_request.is_some())
            || name
                .split_once("__")
                .is_some_and(|(server, _)| self.mcp_servers.iter().any(|m| m.name == server))
    }

    /// Applies `overseer run`'s provider flags on top of the file and env.
    pub fn apply_provider_flags(
        &mut self,
        kind: Option<&str>,
        base_url: Option<String>,
        model: Option<String>,
        api_key_env: Option<String>,
    ) {
        match kind {
            Some("openai") => self.provider.kind = ProviderKind::Openai,
            Some("anthropic") => self.provider.kind = ProviderKind::Anthropic,
            Some("scripted") => self.provider.kind = ProviderKind::Scripted,
            _ => {}
        }
        if base_url.is_some() {
            self.provider.base_url = base_url;
        }
        if model.is_some() {
            self.provider.model = model;
        }
        if api_key_env.is_some() {
            self.provider.api_key_env = api_key_env;
        }
    }

    /// The agent named `name`.
    pub fn agent(&self, name: &str) -> Option<&AgentSection> {
        self.agents.iter().find(|a| a.name == name)
    }

    /// Names of the configured agents, in file order.
    pub fn agent_names(&self) -> Vec<&str> {
        self.agents.iter().map(|a| a.name.as_str()).collect()
    }

    /// The name of the default route (`[provider]`, with any flags
    /// applied): see `RouteConfig::label`.
    pub fn default_route_name(&self) -> String {
        self.provider.route().label()
    }

    /// Whether `name` is a `[[models]]` route.
    fn is_model_table(&self, name: &str) -> bool {
        self.models.iter().any(|m| m.name.as_deref() == Some(name))
    }

    /// The names agents give the default route: their `model` when no
    /// `[[models]]` table has it (`"scripted"`, the default). Sessions
    /// stored before routes had names of their own carry these.
    pub fn default_route_aliases(&self) -> Vec<String> {
        let default = self.default_route_name();
        let mut names: Vec<String> = self
            .agents
            .iter()
            .map(|a| a.model.clone())
            .filter(|m| !self.is_model_table(m) && *m != default)
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Every model route a session may use: the `[[models]]` names and the
    /// default route's, sorted.
    pub fn route_names(&self) -> Vec<String> {
        let mut routes: Vec<String> = self
            .models
            .iter()
            .filter_map(|m| m.name.clone())
            .chain(std::iter::once(self.default_route_name()))
            .collect();
        routes.sort_unstable();
        routes.dedup();
        routes
    }

    /// Every agent as the runtime takes it, its `model` naming the route
    /// that really serves it: a `[[models]]` name, or the default route's
    /// (so a session's configuration says `openai:llama3.2@…`, not
    /// `scripted`, when `[provider]` serves it).
    pub fn agent_configs(&self) -> Vec<AgentConfig> {
        let default = self.default_route_name();
        self.agents
            .iter()
            .map(|a| {
                let mut agent = a.to_agent_config();
                if !self.is_model_table(&agent.model) {
                    agent.model.clone_from(&default);
                }
                agent
            })
            .collect()
    }

    /// The runtime tunables. Backoff figures are the design's and not
    /// configurable.
    pub fn runtime_config(&self) -> RuntimeConfig {
        let defaults = RestartPolicy::default();
        RuntimeConfig {
            restart: RestartPolicy {
                max_restarts: self.runtime.max_restarts,
                restart_window_secs: self.runtime.restart_window_secs,
                backoff_base_ms: defaults.backoff_base_ms,
                backoff_max_ms: defaults.backoff_max_ms,
            },
            call_timeout: Duration::from_secs(self.runtime.call_timeout_secs),
            idle_hibernate: self.idle_hibernate(),
            idle_pressure: overseer_actors::IdlePressure {
                share_pct: self.runtime.idle_pressure_share_pct,
                floor: Duration::from_secs(self.runtime.idle_hibernate_floor_secs),
            },
            rest_after: Duration::from_secs(self.runtime.rest_after_secs),
            limits: self.limits.to_limits(),
            compaction_threshold_pct: self.runtime.compaction_threshold_pct,
            janitor: Some(overseer_actors::JanitorConfig {
                retention: self
                    .store
                    .retention_days
                    .map(|d| Duration::from_secs(d.saturating_mul(86_400))),
                ..Default::default()
            }),
        }
    }

    /// Idle time before a session hibernates; `None` (configured as 0)
    /// never hibernates.
    pub fn idle_hibernate(&self) -> Option<Duration> {
        match self.runtime.idle_hibernate_secs {
            0 => None,
            secs => Some(Duration::from_secs(secs)),
        }
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests;
