//! Assembling the runtime from the configuration: the sled store, the
//! providers (one per model route), and the `Overseer` with its sessions
//! recovered. Shared by `overseer run` and `overseer serve` so both run the
//! same service.
//!
//! Owns the wiring only. It deliberately makes no policy of its own: what a
//! route, a tool or an agent is comes from `config`, `provider` and `tools`.

use std::collections::BTreeMap;
use std::sync::Arc;

use overseer_actors::provider::{Provider, ProviderError, ProviderRequest, ProviderStream};
use overseer_actors::store::StoreError;
use overseer_actors::tool::ToolRegistry;
use overseer_actors::{Overseer, SessionError};

use crate::config::Config;
use crate::provider::{build_provider, ProviderConfigError};
use crate::store::SledStore;

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
    #[error("cannot open the data directory {dir}: {source}")]
    Store {
        /// The directory.
        dir: String,
        /// Why.
        source: StoreError,
    },
    /// The runtime refused to start or to recover.
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// Routes each request to the provider of its agent's model route, or to the
/// default route.
pub struct RoutedProvider {
    routes: BTreeMap<String, Arc<dyn Provider>>,
    default: Arc<dyn Provider>,
}

#[async_trait::async_trait]
impl Provider for RoutedProvider {
    async fn stream(&self, request: ProviderRequest) -> Result<ProviderStream, ProviderError> {
        let provider = self.routes.get(&request.model).unwrap_or(&self.default);
        provider.stream(request).await
    }
}

/// Builds every configured route now, so a missing key or a bad URL is a
/// start-up error naming the route, not a failed request later.
pub fn build_providers(config: &Config) -> Result<Arc<dyn Provider>, ServiceError> {
    let default = build_provider(&config.provider.route()).map_err(|source| {
        ServiceError::Provider {
            route: "[provider]".into(),
            source,
        }
    })?;
    let mut routes = BTreeMap::new();
    for route in &config.models {
        let name = route.name.clone().unwrap_or_default();
        let provider = build_provider(route).map_err(|source| ServiceError::Provider {
            route: name.clone(),
            source,
        })?;
        routes.insert(name, provider);
    }
    if routes.is_empty() {
        return Ok(default);
    }
    Ok(Arc::new(RoutedProvider { routes, default }))
}

/// Opens the store, starts the runtime and recovers every session that was
/// mid-turn, before anything is served.
pub async fn start(
    config: &Config,
    tools: ToolRegistry,
    provider: Arc<dyn Provider>,
) -> Result<(Overseer, SledStore), ServiceError> {
    let dir = config.store.data_dir.clone();
    let durability = config.store.durability;
    // Opening sled reads and replays its log: blocking work.
    let opened = tokio::task::spawn_blocking(move || SledStore::open(&dir, durability))
        .await
        .map_err(|e| ServiceError::Store {
            dir: config.store.data_dir.display().to_string(),
            source: StoreError::Io(e.to_string()),
        })?;
    let store = opened.map_err(|source| ServiceError::Store {
        dir: config.store.data_dir.display().to_string(),
        source,
    })?;
    let overseer = Overseer::start(
        config.agent_configs(),
        Arc::new(store.clone()),
        provider,
        tools,
        config.runtime_config(),
    )
    .await?;
    overseer.recover().await?;
    Ok((overseer, store))
}
