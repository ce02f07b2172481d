//! Why `overseer acp` could not start or stopped. Errors of single requests
//! are JSON-RPC errors on the connection (see `agent.rs`), not these.

use overseer_actors::tool::ToolRegistryError;
use overseer_actors::SessionError;

use crate::config::ConfigError;
use crate::service::ServiceError;

/// Why the ACP agent failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    /// Configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Assembling the service (providers, store, tools).
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// Built-in tools.
    #[error("tools: {0}")]
    Tools(#[from] ToolRegistryError),
    /// `--agent` names no configured agent.
    #[error("unknown agent '{name}' (configured: {available})")]
    UnknownAgent {
        /// The name given.
        name: String,
        /// The configured names.
        available: String,
    },
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// The session API failed (recovery, shutdown).
    #[error(transparent)]
    Session(#[from] SessionError),
    /// `--server`: the server could not be used (unreachable, the token
    /// refused, the agent unknown there).
    #[error("--server {url}: {message}")]
    Server {
        /// The server's URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The connection to the client failed (transport or protocol).
    #[error("ACP connection: {0}")]
    Connection(String),
}
