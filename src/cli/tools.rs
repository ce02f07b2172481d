//! `overseer tools`: lists every tool the configuration provides (built-ins,
//! `http_request`, `[[tools]]`, the tools MCP servers list) and which agents
//! have each in scope.
//!
//! Owns the listing only; building the tools is `crate::service`.

use std::path::PathBuf;

use crate::config::{Config, LoadOptions, Overrides};
use crate::service;
use crate::tools::builtin_registry;

use super::{terminal, CliError};

/// `overseer tools` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ToolsArgs {
    /// Configuration file (default: config/overseer.toml, else the built-in defaults).
    #[arg(long, value_name = "FILE", env = "OVERSEER_CONFIG")]
    pub config: Option<PathBuf>,
}

/// Prints one line per tool: name, whether `per_tool` asks for approval,
/// timeout, the agents that have it, and its description.
pub fn list(args: ToolsArgs) -> Result<(), CliError> {
    let options = LoadOptions {
        path: args.config,
        overrides: Overrides::default(),
    };
    let mut config = Config::load(&options, &builtin_registry()?)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    let tools = rt.block_on(service::build_tools(&mut config))?;
    let agents = config.agent_configs();
    let mut names: Vec<&str> = tools.registry.names().collect();
    names.push(overseer_actors::model::DELEGATE_TASK);
    for name in names {
        let users: Vec<&str> = agents
            .iter()
            .filter(|a| a.effective().tools.iter().any(|t| t == name))
            .map(|a| a.name.as_str())
            .collect();
        let (approval, timeout, description) = match tools.registry.spec(name) {
            Some(s) => (
                if s.requires_approval {
                    "approval"
                } else {
                    "no-approval"
                },
                format!("{}s", s.timeout_secs),
                s.description.clone(),
            ),
            None => (
                "no-approval",
                "-".to_owned(),
                "Delegate a task to a subagent (agents with subagents)".to_owned(),
            ),
        };
        // Names and descriptions may come from an MCP server: escaped.
        let line = format!(
            "{}\t{approval}\t{timeout}\tagents: {}\t{}",
            terminal::inline(name),
            if users.is_empty() {
                "-".to_owned()
            } else {
                terminal::inline(&users.join(",")).into_owned()
            },
            terminal::inline(&description)
        );
        terminal::print_line(&line).map_err(CliError::Stdout)?;
    }
    Ok(())
}
