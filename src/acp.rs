//! `overseer acp`: an Agent Client Protocol (v1) agent on stdin/stdout, so
//! editors (Zed, JetBrains, Neovim plugins, CLI clients) drive overseer
//! sessions: prompts become turns, the turn's text and tool calls stream back
//! as `session/update` notifications, calls that need approval become
//! `session/request_permission`, and `session/cancel` interrupts the turn.
//! Agents may list the editor's file tools (`fs.rs`), which the client runs.
//! The client's MCP servers become the session's own (`mcp.rs`).
//!
//! The runtime is the one `overseer run` builds (`service::open`: the
//! configured store, providers and tools), in-process; with `--server URL`
//! it is a running `overseer serve` (or cluster) instead, reached over its
//! HTTP API and event stream with `OVERSEER_TOKEN` (`sessions.rs`), so an
//! editor attaches to shared, durable sessions. There the editor's file
//! tools and MCP servers are not offered (the server cannot reach them). This module owns only
//! the mapping between ACP and the [`Overseer`](overseer_actors::Overseer)
//! API; it deliberately holds no session logic (every action goes through
//! that API, exactly as an HTTP client's would) and no JSON-RPC codec (the
//! official `agent-client-protocol` crate frames, parses and dispatches the
//! messages, and answers malformed input and unknown methods). stdout
//! carries nothing but protocol: logs and progress go to stderr.

mod agent;
mod commands;
mod error;
mod follow;
mod fs;
mod mcp;
mod permission;
mod sessions;
mod transport;
mod updates;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use overseer_actors::provider::Provider;

pub use error::AcpError;

use crate::config::{Config, LoadOptions, Overrides};
use crate::tools::builtin_registry;

/// Arguments of `overseer acp`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Speaks the Agent Client Protocol (v1) on stdin/stdout; an editor starts it as \
an agent server. Logs go to stderr. Sessions live in the store under --data, so a later process \
can load them (session/load) and continue where they stopped, pending approvals included. With \
--server URL the sessions live in that running overseer serve instead (token from OVERSEER_TOKEN)."
)]
pub struct AcpArgs {
    /// Config file (default: ./config/overseer.toml if present, else the
    /// built-in defaults).
    #[arg(long, value_name = "FILE", env = "OVERSEER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Agent that new sessions run.
    #[arg(long, value_name = "NAME", default_value = "assistant")]
    pub agent: String,
    /// Data directory of the store (overrides store.data_dir).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Keep sessions in the running `overseer serve` (or cluster) at this
    /// URL, over its HTTP API, with the token in `OVERSEER_TOKEN`, instead of
    /// a local store. The editor's file tools and MCP servers are not
    /// offered then: the server cannot reach them, and no config is read.
    #[arg(long, value_name = "URL", conflicts_with = "data")]
    pub server: Option<String>,
}

/// `overseer acp`: checks the config and the agent, then serves one ACP
/// connection on stdin/stdout until the client closes it.
pub fn run(args: AcpArgs) -> Result<(), AcpError> {
    if let Some(url) = args.server.clone() {
        crate::telemetry::init_tracing();
        return run_remote(url, args.agent);
    }
    // The editor's file tools exist here only: agents may list them.
    let client: fs::ClientSlot = Arc::default();
    let tools = builtin_registry()?.extended(fs::tools(&client))?;
    let options = LoadOptions {
        path: args.config.clone(),
        overrides: Overrides {
            data_dir: args.data.clone(),
            durability: None,
            scenario: None,
        },
    };
    let config = Config::load(&options, &tools)?;
    // Logs go to stderr (stdout is the protocol); telemetry as configured.
    let settings = config.telemetry_settings(|var| std::env::var_os(var))?;
    let _telemetry = match crate::telemetry::init(&config.log, settings.as_ref()) {
        Ok(telemetry) => Some(telemetry),
        Err(e) => {
            crate::telemetry::init_tracing();
            tracing::warn!("{e}; traces are off");
            None
        }
    };
    if config.agent(&args.agent).is_none() {
        return Err(AcpError::UnknownAgent {
            name: args.agent,
            available: config.agent_names().join(", "),
        });
    }
    let provider: Arc<dyn Provider> = crate::service::build_providers(&config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(AcpError::Runtime)?;
    let result = rt.block_on(serve(config, provider, args.agent, client));
    // stdin is read on a blocking thread that may still wait for a line.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    result
}

async fn serve(
    mut config: Config,
    provider: Arc<dyn Provider>,
    agent: String,
    client: fs::ClientSlot,
) -> Result<(), AcpError> {
    // MCP connections live as long as this value.
    let tools = crate::service::build_tools_with(&mut config, fs::tools(&client)).await?;
    let (overseer, _store) = crate::service::open(&config, &tools, provider).await?;
    // Sessions an earlier process left mid-turn go on (their approvals are
    // asked once a client loads them).
    let recovered = overseer.recover().await;
    let served = match recovered {
        Ok(n) => {
            if n > 0 {
                tracing::info!(sessions = n, "recovered interrupted sessions");
            }
            agent::serve(
                sessions::Sessions::Local(overseer.clone()),
                agent,
                client,
                transport::stdio(),
            )
            .await
        }
        Err(e) => Err(AcpError::Session(e)),
    };
    // Shut down whatever happened, so the store is flushed.
    let shutdown = overseer.shutdown().await;
    served?;
    shutdown?;
    Ok(())
}

/// `overseer acp --server URL`: checks that the server answers this token
/// and has the agent (so a wrong token or URL is one line at start, not an
/// error on every request), then serves the connection.
fn run_remote(url: String, agent: String) -> Result<(), AcpError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(AcpError::Runtime)?;
    let client = crate::cli::client::Client::from_env(&url);
    let result = rt.block_on(async move {
        let server = |message: String| AcpError::Server {
            url: client.base().to_owned(),
            message,
        };
        let listed = client
            .call(reqwest::Method::GET, "/v1/agents", None)
            .await
            .map_err(|e| server(e.to_string()))?;
        let names: Vec<&str> = listed["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["name"].as_str())
            .collect();
        if !names.contains(&agent.as_str()) {
            return Err(server(format!(
                "unknown agent '{agent}' (the server has: {})",
                names.join(", ")
            )));
        }
        let sessions = sessions::Sessions::Remote(client.clone());
        agent::serve(sessions, agent, Arc::default(), transport::stdio()).await
    });
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    result
}
