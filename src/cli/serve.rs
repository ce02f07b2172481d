//! `overseer serve` and `overseer token`: the long-running service and the
//! development token minter.
//!
//! Owns process-level concerns of the service: reading the auth key, binding
//! the listener, recovering before serving, and the graceful shutdown on
//! SIGTERM/SIGINT (stop accepting, give open connections
//! `http.shutdown_grace_secs` to finish and drop the rest, stop the actors,
//! flush sled, exit 0). The API itself is `crate::http`.
//!
//! `token` validates everything before minting (a token with no scope, one
//! that never expires, a tenant with a newline, a guessable secret are all
//! refused with exit status 2 and one line naming the flag), and reports a
//! closed stdout instead of panicking.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::auth::{self, AuthConfig};
use crate::config::{AuthMode, Config, LoadOptions, Overrides};
use crate::http::{self, HttpOptions};
use crate::service;
use crate::tools::builtin_registry;

use super::{terminal, CliError};

/// `overseer serve` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Configuration file (default: config/overseer.toml, else the built-in defaults).
    #[arg(long, value_name = "FILE", env = "OVERSEER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on (default: http.listen of the configuration).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Data directory (default: store.data_dir of the configuration).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
}

/// `overseer token` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// Tenant the token acts for.
    #[arg(long)]
    pub tenant: String,
    /// Subject (who): recorded as `approved_by` on decisions.
    #[arg(long)]
    pub sub: String,
    /// Comma-separated scopes (at least one): sessions:read, sessions:write,
    /// approvals:write, admin.
    #[arg(long, value_delimiter = ',', required = true)]
    pub scopes: Vec<String>,
    /// Lifetime in seconds (1 to 31622400, a year and a day).
    #[arg(long, default_value_t = 3600)]
    pub ttl: u64,
}

/// Why the service could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The auth key could not be read or used.
    #[error("auth: {0}")]
    Auth(#[from] auth::AuthError),
    /// The public key file could not be read.
    #[error("http.public_key_pem: cannot read {path}: {source}")]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The listener or options were refused.
    #[error(transparent)]
    Http(#[from] http::HttpError),
    /// Binding or serving failed.
    #[error("cannot serve on {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The configured address is not an address.
    #[error("http.listen: '{0}' is not an address like 127.0.0.1:8080")]
    Listen(String),
}

/// Runs the service until SIGTERM or SIGINT.
pub fn serve(args: ServeArgs) -> Result<(), CliError> {
    let tools = builtin_registry()?;
    let options = LoadOptions {
        path: args.config.clone(),
        overrides: Overrides {
            data_dir: args.data.clone(),
            durability: None,
            scenario: None,
        },
    };
    let config = Config::load(&options, &tools)?;
    let addr = match args.listen {
        Some(a) => a,
        None => config
            .http
            .listen
            .parse()
            .map_err(|_| ServeError::Listen(config.http.listen.clone()))?,
    };
    let auth = auth_config(&config)?.with_leeway(config.http.jwt_leeway());
    // Refuse `auth = "none"` off loopback before anything is opened.
    http::check_listener(addr, &auth).map_err(ServeError::from)?;
    let mut http_options: HttpOptions = config.http.options();
    http_options.model_routes = config.route_names();
    http_options.validate().map_err(ServeError::from)?;
    let provider = service::build_providers(&config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    rt.block_on(async move {
        if let Err(e) = crate::metrics::install_recorder() {
            tracing::warn!("metrics disabled: {e}");
        }
        // Built-ins validated the config; now the full set (http tools,
        // http_request, MCP servers connected here).
        let all_tools = service::build_tools(&config).await?;
        let _ = &tools;
        let (overseer, _store) =
            service::start(&config, all_tools.registry.clone(), provider).await?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Io {
                addr: addr.to_string(),
                source,
            })?;
        let bound = listener.local_addr().map_err(|source| ServeError::Io {
            addr: addr.to_string(),
            source,
        })?;
        // Scripts and tests read the bound address (the port may be 0).
        // Not eprintln!: a closed stderr must not panic a running service.
        let _ = writeln!(std::io::stderr(), "listening on {bound}");
        http::serve_with(
            overseer.clone(),
            listener,
            auth,
            http_options,
            shutdown_signal(),
        )
        .await
        .map_err(|source| ServeError::Io {
            addr: bound.to_string(),
            source,
        })?;
        let _ = writeln!(
            std::io::stderr(),
            "shutting down: stopping sessions and flushing the store"
        );
        overseer
            .shutdown()
            .await
            .map_err(crate::service::ServiceError::from)?;
        Ok::<(), CliError>(())
    })?;
    rt.shutdown_timeout(Duration::from_secs(5));
    Ok(())
}

fn auth_config(config: &Config) -> Result<AuthConfig, ServeError> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|source| ServeError::KeyFile {
            path: path.clone(),
            source,
        })
    };
    Ok(match config.http.auth {
        AuthMode::None => AuthConfig::None,
        AuthMode::Hs256 => AuthConfig::hs256_from_env()?,
        AuthMode::Rs256 | AuthMode::Es256 => {
            let Some(path) = &config.http.public_key_pem else {
                return Err(ServeError::Auth(auth::AuthError::InvalidKey(
                    "http.public_key_pem is required for rs256/es256".into(),
                )));
            };
            let pem = read(path)?;
            if config.http.auth == AuthMode::Rs256 {
                AuthConfig::rs256_pem(&pem)?
            } else {
                AuthConfig::es256_pem(&pem)?
            }
        }
    })
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// Prints a token minted from `OVERSEER_JWT_SECRET`, and nothing else, on stdout.
pub fn token(args: TokenArgs) -> Result<(), CliError> {
    let secret = std::env::var(auth::SECRET_ENV).map_err(|_| {
        CliError::Usage(format!(
            "{}: not set; export the server's HS256 secret to mint a token for it",
            auth::SECRET_ENV
        ))
    })?;
    let scopes: Vec<String> = args
        .scopes
        .iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let token = auth::mint(
        secret.as_bytes(),
        &args.tenant,
        &args.sub,
        &scopes,
        Duration::from_secs(args.ttl),
    )
    .map_err(|e| {
        use auth::AuthError as E;
        let flag = match &e {
            E::EmptyClaim("tenant") | E::InvalidClaim("tenant") => "--tenant",
            E::EmptyClaim(_) | E::InvalidClaim(_) => "--sub",
            E::NoScopes | E::UnknownScope(_) => "--scopes",
            E::InvalidTtl { .. } => "--ttl",
            _ => auth::SECRET_ENV,
        };
        CliError::Usage(format!("{flag}: {e}"))
    })?;
    terminal::print_line(&token).map_err(CliError::Stdout)
}
