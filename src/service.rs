//! Assembling the runtime from the configuration: the sled store, the
//! providers (one per model route), and the `Overseer` with its sessions
//! recovered. Shared by `overseer run` and `overseer serve` so both run the
//! same service.
//!
//! Owns the wiring only. It deliberately makes no policy of its own: what a
//! route, a tool or an agent is comes from `config`, `provider` and `tools`.

use std::sync::Arc;

pub(crate) mod descendants;

use overseer_actors::provider::Provider;
use overseer_actors::store::StoreError;
use overseer_actors::tasks::TaskCatalog;
use overseer_actors::tool::ToolRegistry;
use overseer_actors::{Library, Overseer, SessionError};

use overseer_actors::tool::Tool;

use crate::config::Config;
pub use crate::provider::RoutedProvider;
use crate::provider::{process_env, ProviderConfigError};
use crate::scope_token::ScopeTokens;
use crate::store::postgres::{PgOptions, PgStore, DATABASE_URL_ENV};
use crate::store::{SledStore, StoreOptions};
use crate::tools::builtin_tools;
use crate::tools::http_request::HttpRequestTool;
use crate::tools::http_tool::http_tools;
use crate::tools::mcp::McpHub;
use crate::tools::skills::ReadSkillResource;
use crate::webhooks::{Subscriptions, SystemClock, WebhookStore, Webhooks};

/// The tenant of sessions a person starts on this machine without a token
/// (`overseer run`, `overseer acp`): one fixed name keeps local runs
/// listable together.
pub const CLI_TENANT: &str = "local";

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A model route is unusable (bad value, missing key variable, …).
    #[error("model route '{route}': {source}")]
    Provider {
        /// Route name (`[provider]` for the default).
        route: String,
        /// Why.
        source: ProviderConfigError,
    },
    /// The data directory could not be opened.
    /// (The store's own errors at open already name the directory.)
    #[error("{}", store_open_message(dir, source))]
    Store {
        /// The directory.
        dir: String,
        /// Why.
        source: StoreError,
    },
    /// `store.kind = "postgres"` without a database URL.
    #[error("store.kind = \"postgres\" needs the database URL in {var} (e.g. postgres://overseer:PASSWORD@db.internal:5432/overseer)")]
    NoDatabaseUrl {
        /// The variable.
        var: &'static str,
    },
    /// The PostgreSQL store could not be opened.
    #[error(transparent)]
    Postgres(#[from] crate::store::postgres::PgOpenError),
    /// The runtime refused to start or to recover.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A tool could not be set up (http tool, http_request, MCP server).
    #[error("tools: {0}")]
    Tools(String),
    /// The scope-token key is unusable.
    #[error("scope_tokens: {0}")]
    ScopeTokens(String),
    /// A skill folder is malformed, or a task or agent names what does not
    /// exist.
    #[error("{0}")]
    Library(String),
    /// The webhook endpoints could not be read at start.
    #[error("webhooks: cannot read the registered endpoints: {0}")]
    Webhooks(StoreError),
}

fn store_open_message(dir: &str, source: &StoreError) -> String {
    match source {
        StoreError::Io(text) if text.contains(dir) => text.clone(),
        StoreError::Backend { context, source } if context.contains(dir) => {
            format!("{context}: {source}")
        }
        other => format!("cannot open the data directory {dir}: {other}"),
    }
}

/// The tools of a configuration, with the MCP connections they use (keep it
/// alive as long as the runtime), and its stored tasks and skills.
pub struct Tools {
    /// Every tool, with compiled schemas.
    pub registry: ToolRegistry,
    /// MCP connections, if any server is configured.
    pub mcp: Option<McpHub>,
    /// Stored tasks and the skills of `skills_dirs`.
    pub library: Library,
}

/// The scope-token minter, if its secret variable is set.
pub fn scope_tokens(config: &Config) -> Result<Option<ScopeTokens>, ServiceError> {
    let section = &config.scope_tokens;
    match std::env::var(&section.secret_env) {
        Ok(secret) if !secret.is_empty() => ScopeTokens::hs256(
            secret.as_bytes(),
            std::time::Duration::from_secs(section.ttl_secs),
        )
        .map(Some)
        .map_err(|e| ServiceError::ScopeTokens(format!("{}: {e}", section.secret_env))),
        _ => Ok(None),
    }
}

/// Builds every tool of the configuration: built-ins, `http_request` when
/// configured, `[[tools]]` http tools, and the tools MCP servers list (the
/// shared ones and each agent's own; they are connected now). Then resolves
/// each agent's tools in `config` (patterns, its servers' tools, approval
/// rules; see [`Config::resolve_agent_tools`]), since MCP tool names are
/// only known once a server has listed them.
pub async fn build_tools(config: &mut Config) -> Result<Tools, ServiceError> {
    build_tools_with(config, Vec::new()).await
}

/// [`build_tools`] plus tools an edge brings of its own (`overseer acp`'s
/// editor file tools), which agents may then list.
pub async fn build_tools_with(
    config: &mut Config,
    extra: Vec<Arc<dyn Tool>>,
) -> Result<Tools, ServiceError> {
    let tokens = scope_tokens(config)?;
    let library = build_library(config).await?;
    let mut tools: Vec<Arc<dyn Tool>> = builtin_tools();
    tools.extend(extra);
    // Reading a skill's files is the edge's; `activate_skill` answers from
    // memory in the runtime.
    tools.push(Arc::new(ReadSkillResource::new(library.skills.clone())));
    if let Some(cfg) = &config.http_request {
        let tool = HttpRequestTool::new(cfg.clone())
            .map_err(|e| ServiceError::Tools(format!("http_request: {e}")))?;
        tools.push(Arc::new(tool));
    }
    tools.extend(
        http_tools(&config.tools, tokens.as_ref())
            .map_err(|e| ServiceError::Tools(e.to_string()))?,
    );
    let servers = config.all_mcp_servers();
    let mcp = if servers.is_empty() {
        None
    } else {
        let hub = McpHub::start(&servers, tokens.clone())
            .await
            .map_err(|e| ServiceError::Tools(e.to_string()))?;
        tools.extend(hub.tools());
        Some(hub)
    };
    let registry = ToolRegistry::new(tools).map_err(|e| ServiceError::Tools(e.to_string()))?;
    config
        .resolve_agent_tools(&registry)
        .map_err(ServiceError::Tools)?;
    Ok(Tools {
        registry,
        mcp,
        library,
    })
}

/// Reads every skill of `skills_dirs` (a malformed `SKILL.md` is an error
/// naming the file and the field), expands the agents' skill and task
/// patterns, and checks the tasks.
pub async fn build_library(config: &mut Config) -> Result<Library, ServiceError> {
    let dirs = config.skills_dirs();
    let skills = tokio::task::spawn_blocking(move || crate::skills::load(&dirs))
        .await
        .map_err(|e| ServiceError::Library(format!("skills: {e}")))?
        .map_err(|e| ServiceError::Library(e.to_string()))?;
    config
        .resolve_agent_skills(&skills)
        .map_err(ServiceError::Library)?;
    let tasks = TaskCatalog::new(config.task_defs()).map_err(ServiceError::Library)?;
    let library = Library::new(tasks, skills);
    library
        .check(&config.agent_configs())
        .map_err(ServiceError::Library)?;
    Ok(library)
}

/// Builds every configured route now, so a missing key or a bad URL is a
/// start-up error naming the route, not a failed request later: the
/// `[[models]]` tables under their names, and `[provider]` as the default
/// route, under its own name and the names agents give it.
pub fn build_providers(config: &Config) -> Result<Arc<RoutedProvider>, ServiceError> {
    let routes = Arc::new(RoutedProvider::new());
    let default = config.provider.route();
    let env = process_env();
    let name = routes
        .add(&default, env.clone())
        .map_err(|source| ServiceError::Provider {
            route: "[provider]".into(),
            source,
        })?;
    for route in &config.models {
        routes
            .add(route, env.clone())
            .map_err(|source| ServiceError::Provider {
                route: route.label(),
                source,
            })?;
    }
    routes.set_default(&name, config.default_route_aliases());
    Ok(routes)
}

/// Opens the store, starts the runtime and recovers every session that was
/// mid-turn, before anything is served.
pub async fn start(
    config: &Config,
    tools: &Tools,
    provider: Arc<dyn Provider>,
) -> Result<(Overseer, SledStore), ServiceError> {
    let (overseer, store) = open(config, tools, provider).await?;
    overseer.recover().await?;
    Ok((overseer, store))
}

/// Opens the store and starts the runtime, recovering nothing yet: for a
/// caller that must subscribe to a session before recovery can touch it
/// (`overseer run --resume`).
pub async fn open(
    config: &Config,
    tools: &Tools,
    provider: Arc<dyn Provider>,
) -> Result<(Overseer, SledStore), ServiceError> {
    // A store of an older layout is upgraded by `overseer serve --upgrade`
    // only, which keeps a copy of it first.
    let store = open_sled(config, crate::store::Upgrade::Refuse).await?;
    let overseer = Overseer::start_with(
        config.agent_configs(),
        tools.library.clone(),
        Arc::new(store.clone()),
        provider,
        tools.registry.clone(),
        config.runtime_config(),
    )
    .await?;
    Ok((overseer, store))
}

/// Opens the sled store of the configuration (its data directory); a
/// directory of an older layout is upgraded, or not, as `upgrade` says.
pub async fn open_sled(
    config: &Config,
    upgrade: crate::store::Upgrade,
) -> Result<SledStore, ServiceError> {
    let dir = config.store.data_dir.clone();
    let options = StoreOptions {
        upgrade,
        ..config.store.options()
    };
    // Opening sled reads and replays its log: blocking work.
    let opened = tokio::task::spawn_blocking(move || SledStore::open_with(&dir, &options))
        .await
        .map_err(|e| ServiceError::Store {
            dir: config.store.data_dir.display().to_string(),
            source: StoreError::io("opening the store (its task failed)", e),
        })?;
    opened.map_err(|source| ServiceError::Store {
        dir: config.store.data_dir.display().to_string(),
        source,
    })
}

/// The webhooks of `overseer serve` over `store` when `[webhooks] enabled`:
/// `install` puts their outbox view on the store's write path, which must
/// happen before any session checkpoints (so before the runtime starts and
/// recovers).
pub async fn webhooks(
    config: &Config,
    store: Arc<dyn WebhookStore>,
    install: impl FnOnce(Arc<Subscriptions>),
) -> Result<Option<Arc<Webhooks>>, ServiceError> {
    if !config.webhooks.enabled {
        return Ok(None);
    }
    let subscriptions = Arc::new(Subscriptions::new());
    install(subscriptions.clone());
    let hooks = Webhooks::open(
        store,
        subscriptions,
        config.webhooks.options(),
        Arc::new(SystemClock),
    )
    .await
    .map_err(ServiceError::Webhooks)?;
    Ok(Some(hooks))
}

/// Opens the PostgreSQL store of cluster mode (`store.kind = "postgres"`)
/// at the URL in [`DATABASE_URL_ENV`]: a missing or malformed URL, or a
/// database that does not answer, is a start-up error naming what is wrong.
pub async fn open_postgres(config: &Config) -> Result<PgStore, ServiceError> {
    let url = std::env::var(DATABASE_URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or(ServiceError::NoDatabaseUrl {
            var: DATABASE_URL_ENV,
        })?;
    let options = PgOptions {
        durability: config.store.durability,
        pool_size: config.store.pool_size,
        lease: std::time::Duration::from_secs(config.cluster.lease_secs),
        ..PgOptions::default()
    };
    Ok(PgStore::open(&url, options).await?)
}
